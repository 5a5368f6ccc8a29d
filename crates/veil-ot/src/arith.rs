//! Correlated OT with chosen correlations, in two groups on `bits`-bit words: the sender inputs
//! `δ_i` and gets a uniform `x_i`; the receiver with choice `c_i` gets `x_i ∘ c_i·δ_i`.
//! * Arithmetic (∘ = + in Z_{2^bits}): the building block of secret-shared multiplication
//!   (Gilboa).
//! * Binary (∘ = ⊕): XOR shares of `c_i ∧ δ_i`, the AND gates of Boolean circuits; one
//!   correction word instead of the two messages of a chosen-message OT.
//!
//! Receiver → sender: `d_i = c_i ⊕ r_i` (1 bit). Sender: `x_i = pad_{i,0}`, sends
//! `u_i = δ_i ∘ pad_{i,0} ∘ pad_{i,1}⁻¹` (bits bits). Receiver: `y_i = pad_{i,c_i} ∘ c_i·u_i`.
//! Two flights per call (plus refills). Security: semi-honest, 128-bit computational;
//! `x_i` is pseudo-random to the receiver because `pad_{i,0}` is when `c_i = 1`.

use veil_core::parallel::{joined, lanes};
use veil_core::Result;
use veil_net::Channel;

use crate::derand::{
    check_bits, check_values, for_receiver_pads, for_sender_pads, recv_corrections,
    send_corrections,
};
use crate::session::{ReceiverBatch, SenderBatch};
use crate::OtSession;
use veil_core::bitpack::{mask, BitReader, BitWriter};

/// COTs per lane of a call's hashing (`veil_core::parallel::lanes`): ≈ 0.1 ms of work, so a
/// call of a few lanes already spreads over the workers and scheduling stays negligible.
const COT_LANE: usize = 1 << 14;

/// The group a COT's correlation lives in.
#[derive(Clone, Copy)]
enum Group {
    /// Z_{2^bits}.
    Add,
    /// (Z_2)^bits.
    Xor,
}

impl Group {
    fn op(self, a: u64, b: u64) -> u64 {
        match self {
            Group::Add => a.wrapping_add(b),
            Group::Xor => a ^ b,
        }
    }

    fn inv(self, a: u64) -> u64 {
        match self {
            Group::Add => a.wrapping_neg(),
            Group::Xor => a,
        }
    }
}

impl OtSession {
    /// Arithmetic COT sender: correlations `δ_i < 2^bits`; returns `x_i`.
    pub fn send_arith_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        bits: u32,
    ) -> Result<Vec<u64>> {
        self.send_cot(ch, deltas, &[bits], Group::Add)
    }

    /// Arithmetic COT receiver: returns `y_i = x_i + c_i·δ_i mod 2^bits`.
    pub fn recv_arith_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        bits: u32,
    ) -> Result<Vec<u64>> {
        self.recv_cot(ch, choices, &[bits], Group::Add)
    }

    /// Arithmetic COTs of different widths in one call: COT i works in Z_(2^w) with
    /// w = `widths[i mod widths.len()]` (a product's bit positions need fewer bits the higher
    /// they are), so each costs its own width instead of the widest.
    pub fn send_arith_cot_widths<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        widths: &[u32],
    ) -> Result<Vec<u64>> {
        self.send_cot(ch, deltas, widths, Group::Add)
    }

    /// Receiver of [`OtSession::send_arith_cot_widths`] (the same `widths`).
    pub fn recv_arith_cot_widths<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        widths: &[u32],
    ) -> Result<Vec<u64>> {
        self.recv_cot(ch, choices, widths, Group::Add)
    }

    /// Binary COT sender: correlations `δ_i`, COT i `widths[i mod widths.len()]` bits wide (as
    /// [`OtSession::send_arith_cot_widths`]); returns `x_i`, the receiver getting
    /// `y_i = x_i ⊕ c_i·δ_i`.
    pub fn send_xor_cot_widths<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        widths: &[u32],
    ) -> Result<Vec<u64>> {
        self.send_cot(ch, deltas, widths, Group::Xor)
    }

    /// Receiver of [`OtSession::send_xor_cot_widths`] (the same `widths`).
    pub fn recv_xor_cot_widths<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        widths: &[u32],
    ) -> Result<Vec<u64>> {
        self.recv_cot(ch, choices, widths, Group::Xor)
    }

    fn send_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        widths: &[u32],
        group: Group,
    ) -> Result<Vec<u64>> {
        let total = total_bits(deltas.len(), widths)?;
        for (i, &d) in deltas.iter().enumerate() {
            check_values(&[d], widths[i % widths.len()], "COT correlations")?;
        }
        let batch = self.take_send(ch, deltas.len())?;
        let d = recv_corrections(ch, deltas.len())?;
        let (x, msg) = sender_lanes(&batch, &d, deltas, widths, group, COT_LANE);
        assert_eq!(msg.len(), total.div_ceil(8), "COT message length");
        ch.send_msg(&msg)?;
        ch.flush()?;
        Ok(x)
    }

    fn recv_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        widths: &[u32],
        group: Group,
    ) -> Result<Vec<u64>> {
        let n = choices.len();
        let total = total_bits(n, widths)?;
        let batch = self.take_recv(ch, n)?;
        send_corrections(ch, &batch, choices.iter().copied())?;
        // pad_{c_i} first (while the sender works), then ∘ c·u with c as a mask.
        let mut out = receiver_lanes(&batch, COT_LANE);
        let msg = ch.recv_msg_exact(total.div_ceil(8))?;
        let mut u = BitReader::with_total_bits(&msg, total, "COT corrections")?;
        for ((o, &c), &w) in out.iter_mut().zip(choices).zip(widths.iter().cycle()) {
            *o = group.op(*o, u.next_bits(w) & 0u64.wrapping_sub(c as u64)) & mask(w);
        }
        Ok(out)
    }
}

/// The sender's outputs x and its message u, computed in lanes of `lane` COTs (joined in order,
/// so the same whatever `lane` is).
fn sender_lanes(
    batch: &SenderBatch<'_>,
    d: &[u8],
    deltas: &[u64],
    widths: &[u32],
    group: Group,
    lane: usize,
) -> (Vec<u64>, Vec<u8>) {
    let parts = lanes(deltas.len(), lane, |at| {
        let mut x = Vec::with_capacity(at.len());
        let mut u = BitWriter::new(0, 1);
        let mut ws = widths.iter().cycle().skip(at.start % widths.len());
        let deltas = &deltas[at.clone()];
        for_sender_pads(&batch.part(at.clone()), &d[at], |first, p0, p1| {
            for ((&delta, a), b) in deltas[first..].iter().zip(p0).zip(p1) {
                let w = *ws.next().expect("cycle");
                let xi = *a as u64 & mask(w);
                x.push(xi);
                u.push_bits(group.op(group.op(xi, delta), group.inv(*b as u64)), w);
            }
        });
        (x, u)
    });
    let (xs, us): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
    (joined(xs), BitWriter::joined(us))
}

/// The receiver's pads of its choices, computed in lanes of `lane` COTs.
fn receiver_lanes(batch: &ReceiverBatch<'_>, lane: usize) -> Vec<u64> {
    joined(lanes(batch.t.len(), lane, |at| {
        let mut pads = Vec::with_capacity(at.len());
        for_receiver_pads(&batch.part(at), |_, p| {
            pads.extend(p.iter().map(|&p| p as u64))
        });
        pads
    }))
}

/// Payload bits of `count` COTs cycling through `widths` (each checked to be 1..=64).
fn total_bits(count: usize, widths: &[u32]) -> Result<usize> {
    veil_core::ensure!(!widths.is_empty(), InvalidArgument, "COT widths are empty");
    for &w in widths {
        check_bits(w)?;
    }
    let per: usize = widths.iter().map(|&w| w as usize).sum();
    let (full, rest) = (count / widths.len(), count % widths.len());
    Ok(full * per + widths[..rest].iter().map(|&w| w as usize).sum::<usize>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::one_of_n::tests::blocks;

    /// Lanes of any length give the one-lane outputs and message, for cycles of mixed widths
    /// (lane starts inside a cycle, messages not byte-aligned at lane ends) and counts 0 and 1.
    #[test]
    fn any_lane_length_gives_the_one_lane_result() {
        for widths in [&[1u32][..], &[41, 7], &[64, 3, 13]] {
            for count in [0usize, 1, 5, 300] {
                let q = blocks(count, 3);
                let d: Vec<u8> = (0..count).map(|k| (k % 3 == 1) as u8).collect();
                let deltas: Vec<u64> = (0..count)
                    .map(|i| (i as u64).wrapping_mul(0x9e37_79b9) & mask(widths[i % widths.len()]))
                    .collect();
                let batch = SenderBatch {
                    delta: 77 << 70 | 5,
                    q: &q,
                    index: 40,
                };
                let bits = vec![0u8; count];
                let recv = ReceiverBatch {
                    t: &q,
                    bits: &bits,
                    index: 40,
                };
                for group in [Group::Add, Group::Xor] {
                    let whole = sender_lanes(&batch, &d, &deltas, widths, group, usize::MAX);
                    for lane in [1usize, 2, 7, 64, 299] {
                        let parts = sender_lanes(&batch, &d, &deltas, widths, group, lane);
                        assert_eq!(parts, whole, "widths {widths:?}, {count} COTs, lane {lane}");
                    }
                }
                let whole = receiver_lanes(&recv, usize::MAX);
                assert_eq!(whole.len(), count);
                for lane in [1usize, 7, 299] {
                    assert_eq!(receiver_lanes(&recv, lane), whole);
                }
            }
        }
    }
}
