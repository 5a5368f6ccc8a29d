//! Random OT on single bits: the sender gets random pairs `(r0, r1)`, the receiver a random
//! choice `c` and `r_c`. Built directly from random COT, `r_b = lsb H(q ⊕ b·Δ, τ)`, so it costs
//! no flights beyond refills. Security: semi-honest, 128-bit computational (TCCR hash).

use veil_core::Result;
use veil_net::Channel;
use zeroize::Zeroizing;

use crate::aes_prims::tccr_hash_seq;
use crate::derand::CHUNK;
use crate::OtSession;

impl OtSession {
    /// Random bit-OT sender: `n` pairs `[r0, r1]`.
    pub fn send_random_bits<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<Vec<[bool; 2]>> {
        let batch = self.take_send(ch, n)?;
        let mut x1 = Zeroizing::new([0u128; CHUNK]);
        let mut h = Zeroizing::new([[0u128; CHUNK]; 2]);
        let mut out = Vec::with_capacity(n);
        for (c, q) in batch.q.chunks(CHUNK).enumerate() {
            let (len, tweak) = (q.len(), batch.index as u128 + (c * CHUNK) as u128);
            for (x, &q) in x1.iter_mut().zip(q) {
                *x = q ^ batch.delta;
            }
            let [h0, h1] = &mut *h;
            tccr_hash_seq(q, tweak, &mut h0[..len]);
            tccr_hash_seq(&x1[..len], tweak, &mut h1[..len]);
            out.extend(
                h0[..len]
                    .iter()
                    .zip(&h1[..len])
                    .map(|(&a, &b)| [a & 1 == 1, b & 1 == 1]),
            );
        }
        Ok(out)
    }

    /// Random bit-OT receiver: `(choices, r_choice)`.
    pub fn recv_random_bits<C: Channel>(
        &mut self,
        ch: &mut C,
        n: usize,
    ) -> Result<(Vec<bool>, Vec<bool>)> {
        let batch = self.take_recv(ch, n)?;
        let mut h = Zeroizing::new([0u128; CHUNK]);
        let mut out = Vec::with_capacity(n);
        for (c, t) in batch.t.chunks(CHUNK).enumerate() {
            tccr_hash_seq(
                t,
                batch.index as u128 + (c * CHUNK) as u128,
                &mut h[..t.len()],
            );
            out.extend(h[..t.len()].iter().map(|&x| x & 1 == 1));
        }
        Ok((batch.bits.iter().map(|&b| b == 1).collect(), out))
    }
}
