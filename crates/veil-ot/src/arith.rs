//! Arithmetic correlated OT in Z_{2^bits}: the sender inputs `δ_i` and gets a uniform `x_i`; the
//! receiver with choice `c_i` gets `x_i + c_i·δ_i`. The building block of secret-shared
//! multiplication (Gilboa).
//!
//! Receiver → sender: `d_i = c_i ⊕ r_i` (1 bit). Sender: `x_i = pad_{i,0}`, sends
//! `u_i = pad_{i,0} + δ_i − pad_{i,1}` (bits bits). Receiver: `y_i = pad_{i,c_i} + c_i·u_i`.
//! Two flights per call (plus refills). Security: semi-honest, 128-bit computational;
//! `x_i` is pseudo-random to the receiver because `pad_{i,0}` is when `c_i = 1`.

use veil_core::Result;
use veil_net::Channel;

use crate::derand::{
    check_bits, check_values, receiver_pads, recv_corrections, send_corrections, sender_pads,
};
use crate::pack::{mask, pack, packed_len, unpack};
use crate::OtSession;

impl OtSession {
    /// Arithmetic COT sender: correlations `δ_i < 2^bits`; returns `x_i`.
    pub fn send_arith_cot<C: Channel>(
        &mut self,
        ch: &mut C,
        deltas: &[u64],
        bits: u32,
    ) -> Result<Vec<u64>> {
        check_bits(bits)?;
        check_values(deltas, bits, "send_arith_cot correlations")?;
        let batch = self.take_send(ch, deltas.len())?;
        let d = recv_corrections(ch, deltas.len())?;
        let (p0, p1) = sender_pads(&batch, &d);
        let m = mask(bits);
        let x: Vec<u64> = p0.iter().map(|&p| p as u64 & m).collect();
        let u: Vec<u64> = (0..deltas.len())
            .map(|i| x[i].wrapping_add(deltas[i]).wrapping_sub(p1[i] as u64) & m)
            .collect();
        ch.send_msg(&pack(&u, bits))?;
        ch.flush()?;
        Ok(x)
    }

    /// Arithmetic COT receiver: returns `y_i = x_i + c_i·δ_i mod 2^bits`.
    pub fn recv_arith_cot<C: Channel>(
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
        let msg = ch.recv_msg_exact(packed_len(n, bits))?;
        let u = unpack(&msg, n, bits, "arithmetic COT corrections")?;
        let m = mask(bits);
        // y + c·u with c as a mask: no branch on the secret choice.
        Ok((0..n)
            .map(|i| (pads[i] as u64).wrapping_add(u[i] & 0u64.wrapping_sub(choices[i] as u64)) & m)
            .collect())
    }
}
