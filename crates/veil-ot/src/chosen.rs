//! Chosen-message 1-out-of-2 OT of `bits`-bit messages (1 ≤ bits ≤ 64) from random COT.
//!
//! Receiver → sender: `d_i = c_i ⊕ r_i` (1 bit per OT). Sender → receiver:
//! `y_{i,b} = m_{i,b} ⊕ pad_{i,b}` for b = 0, 1 (2·bits bits per OT); derandomised as in `derand` (Beaver).
//! Two flights per call (plus refills). Security: semi-honest, 128-bit computational
//! (TCCR hash from fixed-key AES in the ideal-permutation model).

use veil_core::Result;
use veil_net::Channel;

use crate::derand::{
    check_bits, check_values, for_receiver_pads, for_sender_pads, recv_corrections,
    send_corrections,
};
use crate::OtSession;
use veil_core::bitpack::{mask, packed_len, BitReader, BitWriter};

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
        let m = mask(bits);
        let mut y = BitWriter::new(2 * msgs.len(), bits);
        for_sender_pads(&batch, &d, |first, p0, p1| {
            for ((pair, a), b) in msgs[first..].iter().zip(p0).zip(p1) {
                y.push(pair[0] ^ (*a as u64 & m));
                y.push(pair[1] ^ (*b as u64 & m));
            }
        });
        ch.send_msg(&y.finish())?;
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
        let m = mask(bits);
        // The pads are computed while the sender works; they become the outputs in place.
        let mut out = Vec::with_capacity(n);
        for_receiver_pads(&batch, |_, pads| {
            out.extend(pads.iter().map(|&p| p as u64 & m))
        });
        let msg = ch.recv_msg_exact(packed_len(2 * n, bits))?;
        let mut y = BitReader::new(&msg, 2 * n, bits, "chosen OT ciphertexts")?;
        // Read both ciphertexts and select with a mask: no choice-dependent address.
        for (o, &c) in out.iter_mut().zip(choices) {
            let (y0, y1) = (y.next_value(), y.next_value());
            *o ^= y0 ^ ((y0 ^ y1) & 0u64.wrapping_sub(c as u64));
        }
        Ok(out)
    }
}
