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

use veil_core::Result;
use veil_net::Channel;

use crate::derand::{
    check_bits, check_values, for_receiver_pads, for_sender_pads, recv_corrections,
    send_corrections,
};
use crate::pack::{mask, packed_len, BitReader, BitWriter};
use crate::OtSession;

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
        self.send_cot(ch, deltas, bits, Group::Add)
    }

    /// Arithmetic COT receiver: returns `y_i = x_i + c_i·δ_i mod 2^bits`.
    pub fn recv_arith_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        bits: u32,
    ) -> Result<Vec<u64>> {
        self.recv_cot(ch, choices, bits, Group::Add)
    }

    /// Binary COT sender: correlations `δ_i < 2^bits`; returns `x_i`.
    pub fn send_xor_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        bits: u32,
    ) -> Result<Vec<u64>> {
        self.send_cot(ch, deltas, bits, Group::Xor)
    }

    /// Binary COT receiver: returns `y_i = x_i ⊕ c_i·δ_i`.
    pub fn recv_xor_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        bits: u32,
    ) -> Result<Vec<u64>> {
        self.recv_cot(ch, choices, bits, Group::Xor)
    }

    fn send_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        bits: u32,
        group: Group,
    ) -> Result<Vec<u64>> {
        check_bits(bits)?;
        check_values(deltas, bits, "COT correlations")?;
        let batch = self.take_send(ch, deltas.len())?;
        let d = recv_corrections(ch, deltas.len())?;
        let m = mask(bits);
        let mut x = Vec::with_capacity(deltas.len());
        let mut u = BitWriter::new(deltas.len(), bits);
        for_sender_pads(&batch, &d, |first, p0, p1| {
            for ((&delta, a), b) in deltas[first..].iter().zip(p0).zip(p1) {
                let xi = *a as u64 & m;
                x.push(xi);
                u.push(group.op(group.op(xi, delta), group.inv(*b as u64)));
            }
        });
        ch.send_msg(&u.finish())?;
        ch.flush()?;
        Ok(x)
    }

    fn recv_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        bits: u32,
        group: Group,
    ) -> Result<Vec<u64>> {
        check_bits(bits)?;
        let n = choices.len();
        let batch = self.take_recv(ch, n)?;
        send_corrections(ch, &batch, choices.iter().copied())?;
        // pad_{c_i} first (while the sender works), then ∘ c·u with c as a mask.
        let mut out = Vec::with_capacity(n);
        for_receiver_pads(&batch, |_, pads| out.extend(pads.iter().map(|&p| p as u64)));
        let msg = ch.recv_msg_exact(packed_len(n, bits))?;
        let mut u = BitReader::new(&msg, n, bits, "COT corrections")?;
        let m = mask(bits);
        for (o, &c) in out.iter_mut().zip(choices) {
            *o = group.op(*o, u.next_value() & 0u64.wrapping_sub(c as u64)) & m;
        }
        Ok(out)
    }
}
