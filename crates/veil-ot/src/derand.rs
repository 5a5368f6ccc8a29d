//! Derandomisation shared by the chosen-input flavours (Beaver's trick on random COT).
//!
//! The receiver, holding random `(r_i, t_i = q_i ⊕ r_i·Δ)` and wanting choice `c_i`, sends
//! `d_i = c_i ⊕ r_i`. Then `pad_b = H(q_i ⊕ (b ⊕ d_i)·Δ, τ_i)` is what the receiver can compute
//! exactly for `b = c_i` (it equals `H(t_i, τ_i)`), while `pad_{1−c_i}` is pseudo-random to it
//! by tweakable correlation robustness, with `τ_i` the COT's unique session index.

use veil_core::Result;
use veil_net::Channel;
use zeroize::Zeroizing;

use crate::aes_prims::tccr_hash_seq;
use crate::pack::{pack_bools, unpack_bools};
use crate::session::{ReceiverBatch, SenderBatch};

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
    let mask = crate::pack::mask(bits);
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

/// Secret scratch that is wiped when dropped.
pub(crate) type Secret = Zeroizing<Vec<u128>>;

/// Sender: `(pad_0, pad_1)` for every COT of the batch given the corrections.
pub(crate) fn sender_pads(batch: &SenderBatch<'_>, d: &[u8]) -> (Secret, Secret) {
    let x0: Vec<u128> = batch
        .q
        .iter()
        .zip(d)
        .map(|(&q, &di)| q ^ (batch.delta & 0u128.wrapping_sub(di as u128)))
        .collect();
    let x0 = Zeroizing::new(x0);
    let x1 = Zeroizing::new(x0.iter().map(|&x| x ^ batch.delta).collect::<Vec<_>>());
    let mut p0 = Zeroizing::new(vec![0u128; x0.len()]);
    let mut p1 = Zeroizing::new(vec![0u128; x0.len()]);
    tccr_hash_seq(&x0, batch.index as u128, &mut p0);
    tccr_hash_seq(&x1, batch.index as u128, &mut p1);
    (p0, p1)
}

/// Receiver: `pad_{c_i} = H(t_i, τ_i)`.
pub(crate) fn receiver_pads(batch: &ReceiverBatch<'_>) -> Secret {
    let mut p = Zeroizing::new(vec![0u128; batch.t.len()]);
    tccr_hash_seq(batch.t, batch.index as u128, &mut p);
    p
}
