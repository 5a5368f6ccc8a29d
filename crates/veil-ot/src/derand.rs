//! Derandomisation shared by the chosen-input flavours (Beaver's trick on random COT).
//!
//! The receiver, holding random `(r_i, t_i = q_i ⊕ r_i·Δ)` and wanting choice `c_i`, sends
//! `d_i = c_i ⊕ r_i`. Then `pad_b = H(q_i ⊕ (b ⊕ d_i)·Δ, τ_i)` is what the receiver can compute
//! exactly for `b = c_i` (it equals `H(t_i, τ_i)`), while `pad_{1−c_i}` is pseudo-random to it
//! by tweakable correlation robustness, with `τ_i` the COT's unique session index.

use veil_core::Result;
use veil_net::Channel;
use zeroize::Zeroizing;

use crate::ct::bit_mask_128;

use crate::aes_prims::tccr_hash_seq;
use crate::session::{ReceiverBatch, SenderBatch};
use veil_core::bitpack::{pack_bools, unpack_bools};

/// Validates the message width shared by the flavours.
pub(crate) fn check_bits(bits: u32) -> Result<()> {
    veil_core::ensure!(
        (1..=64).contains(&bits),
        InvalidArgument,
        "message width {bits} bits is outside 1..=64"
    );
    Ok(())
}

/// Validates that every value fits in `bits` bits.
pub(crate) fn check_values(values: &[u64], bits: u32, what: &str) -> Result<()> {
    let mask = veil_core::bitpack::mask(bits);
    if let Some(v) = values.iter().find(|&&v| v & !mask != 0) {
        veil_core::bail!(InvalidArgument, "{what}: value {v:#x} exceeds {bits} bits");
    }
    Ok(())
}

/// Receiver: sends the corrections `d_i = c_i ⊕ r_i` (one flight, packed bits).
pub(crate) fn send_corrections<C: Channel>(
    ch: &mut C,
    batch: &ReceiverBatch<'_>,
    choices: impl ExactSizeIterator<Item = bool>,
) -> Result<()> {
    let d = pack_bools(choices.zip(batch.bits).map(|(c, &r)| c ^ (r == 1)));
    ch.send_msg(&d)?;
    ch.flush()
}

/// Sender: receives `count` correction bits.
pub(crate) fn recv_corrections<C: Channel>(ch: &mut C, count: usize) -> Result<Vec<u8>> {
    let msg = ch.recv_msg_exact(count.div_ceil(8))?;
    unpack_bools(&msg, count, "OT choice corrections")
}

/// COTs hashed per chunk: the pads live in stack scratch that stays in L1 and is wiped after
/// use, so no call allocates in proportion to its size.
pub(crate) const CHUNK: usize = 256;

/// Sender: `f(first, pad_0, pad_1)` for consecutive chunks of the batch, `first` being the
/// index of the chunk's first COT.
pub(crate) fn for_sender_pads(
    batch: &SenderBatch<'_>,
    d: &[u8],
    mut f: impl FnMut(usize, &[u128], &[u128]),
) {
    assert_eq!(batch.q.len(), d.len(), "sender pads: corrections length");
    let mut x = Zeroizing::new([[0u128; CHUNK]; 2]);
    let mut p = Zeroizing::new([[0u128; CHUNK]; 2]);
    for (c, (q, d)) in batch.q.chunks(CHUNK).zip(d.chunks(CHUNK)).enumerate() {
        let n = q.len();
        for i in 0..n {
            let x0 = q[i] ^ (batch.delta & bit_mask_128(d[i] as u128));
            x[0][i] = x0;
            x[1][i] = x0 ^ batch.delta;
        }
        let tweak = batch.index as u128 + (c * CHUNK) as u128;
        let [p0, p1] = &mut *p;
        tccr_hash_seq(&x[0][..n], tweak, &mut p0[..n]);
        tccr_hash_seq(&x[1][..n], tweak, &mut p1[..n]);
        f(c * CHUNK, &p0[..n], &p1[..n]);
    }
}

/// Receiver: `f(first, pad)` with `pad_{c_i} = H(t_i, τ_i)` for consecutive chunks.
pub(crate) fn for_receiver_pads(batch: &ReceiverBatch<'_>, mut f: impl FnMut(usize, &[u128])) {
    let mut p = Zeroizing::new([0u128; CHUNK]);
    for (c, t) in batch.t.chunks(CHUNK).enumerate() {
        let n = t.len();
        tccr_hash_seq(t, batch.index as u128 + (c * CHUNK) as u128, &mut p[..n]);
        f(c * CHUNK, &p[..n]);
    }
}
