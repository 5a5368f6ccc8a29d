//! Random OT on single bits: the sender gets random pairs `(r0, r1)`, the receiver a random
//! choice `c` and `r_c`. Built directly from random COT, `r_b = lsb H(q ⊕ b·Δ, τ)`, so it costs
//! no flights beyond refills. Security: semi-honest, 128-bit computational (TCCR hash).

use veil_core::Result;
use veil_net::Channel;
use zeroize::Zeroizing;

use crate::aes_prims::tccr_hash_seq;
use crate::OtSession;

impl OtSession {
    /// Random bit-OT sender: `n` pairs `[r0, r1]`.
    pub fn send_random_bits<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<Vec<[bool; 2]>> {
        let batch = self.take_send(ch, n)?;
        let x1 = Zeroizing::new(batch.q.iter().map(|&q| q ^ batch.delta).collect::<Vec<_>>());
        let mut h0 = Zeroizing::new(vec![0u128; n]);
        let mut h1 = Zeroizing::new(vec![0u128; n]);
        tccr_hash_seq(batch.q, batch.index as u128, &mut h0);
        tccr_hash_seq(&x1, batch.index as u128, &mut h1);
        Ok(h0
            .iter()
            .zip(h1.iter())
            .map(|(&a, &b)| [a & 1 == 1, b & 1 == 1])
            .collect())
    }

    /// Random bit-OT receiver: `(choices, r_choice)`.
    pub fn recv_random_bits<C: Channel>(
        &mut self,
        ch: &mut C,
        n: usize,
    ) -> Result<(Vec<bool>, Vec<bool>)> {
        let batch = self.take_recv(ch, n)?;
        let mut h = Zeroizing::new(vec![0u128; n]);
        tccr_hash_seq(batch.t, batch.index as u128, &mut h);
        Ok((
            batch.bits.iter().map(|&b| b == 1).collect(),
            h.iter().map(|&x| x & 1 == 1).collect(),
        ))
    }
}
