//! Chosen-message 1-out-of-2 OT of `bits`-bit messages (1 ≤ bits ≤ 64) from random COT.
//!
//! Receiver → sender: `d_i = c_i ⊕ r_i` (1 bit per OT). Sender → receiver:
//! `y_{i,b} = m_{i,b} ⊕ pad_{i,b}` for b = 0, 1 (2·bits bits per OT); derandomised as in `derand` (Beaver).
//! Two flights per call (plus refills). Security: semi-honest, 128-bit computational
//! (TCCR hash from fixed-key AES in the ideal-permutation model).

use veil_core::Result;
use veil_net::Channel;

use crate::derand::{
    check_bits, check_values, receiver_pads, recv_corrections, send_corrections, sender_pads,
};
use crate::pack::{mask, pack, packed_len, PackedView};
use crate::OtSession;

impl OtSession {
    /// Chosen-message 1-out-of-2 OT sender: pairs `(m0, m1)`, each < 2^bits.
    pub fn send_chosen<C: Channel>(
        &mut self,
        ch: &mut C,
        msgs: &[[u64; 2]],
        bits: u32,
    ) -> Result<()> {
        check_bits(bits)?;
        check_values(msgs.as_flattened(), bits, "send_chosen messages")?;
        let batch = self.take_send(ch, msgs.len())?;
        let d = recv_corrections(ch, msgs.len())?;
        let (p0, p1) = sender_pads(&batch, &d);
        let m = mask(bits);
        let mut y = Vec::with_capacity(2 * msgs.len());
        for (i, pair) in msgs.iter().enumerate() {
            y.push(pair[0] ^ (p0[i] as u64 & m));
            y.push(pair[1] ^ (p1[i] as u64 & m));
        }
        ch.send_msg(&pack(&y, bits))?;
        ch.flush()
    }

    /// Chosen-message 1-out-of-2 OT receiver: returns `m_{choice}` per OT.
    pub fn recv_chosen<C: Channel>(
        &mut self,
        ch: &mut C,
        choices: &[bool],
        bits: u32,
    ) -> Result<Vec<u64>> {
        check_bits(bits)?;
        let n = choices.len();
        let batch = self.take_recv(ch, n)?;
        send_corrections(ch, &batch, choices.iter().copied())?;
        let pads = receiver_pads(&batch);
        let msg = ch.recv_msg_exact(packed_len(2 * n, bits))?;
        let y = PackedView::new(&msg, 2 * n, bits, "chosen OT ciphertexts")?;
        let m = mask(bits);
        // Read both ciphertexts and select with a mask: no choice-dependent address.
        Ok((0..n)
            .map(|i| {
                let (y0, y1) = (y.get(2 * i), y.get(2 * i + 1));
                (y0 ^ ((y0 ^ y1) & 0u64.wrapping_sub(choices[i] as u64))) ^ (pads[i] as u64 & m)
            })
            .collect())
    }
}
