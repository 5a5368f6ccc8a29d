//! IKNP OT extension (Ishai–Kilian–Nissim–Petrank, CRYPTO'03) producing correlated OT.
//!
//! Output: the COT *sender* holds a secret Δ and `q_i`; the *receiver* holds choice bits `r_i`
//! and `t_i = q_i ⊕ r_i·Δ`. Derived flavours hash these with the TCCR hash (see
//! [`crate::aes_prims`]).
//!
//! Protocol: 128 base OTs with roles reversed (the COT sender chooses the bits of Δ) give seeds
//! for 128 column PRGs (AES-CTR). For a batch of `m` rows the receiver sends the 128 columns
//! `u_j = G(k_j^0) ⊕ G(k_j^1) ⊕ r` (m bits each); the sender computes `q_j = G(k_j^{Δ_j}) ⊕ Δ_j·u_j`
//! and both transpose. Traffic: 128 bits per COT plus framing, one flight (receiver → sender)
//! per call of [`IknpReceiver::extend`].
//!
//! Security: semi-honest, 128-bit computational (PRG security of AES-CTR under secret keys); no
//! consistency check is needed against semi-honest receivers. Δ, the column seeds and the
//! receiver's choices are zeroized on drop (the `aes` crate zeroizes its key schedules).

use veil_core::{ensure, Prg, Result};
use veil_net::Channel;
use zeroize::{Zeroize, Zeroizing};

use crate::aes_prims::AesCtr;
use crate::base_ot;
use crate::transpose::transpose_columns;

/// Rows processed per message: 8192 rows = 128 KiB per flight chunk, cache-friendly columns.
const CHUNK_ROWS: usize = 1 << 13;
const WORDS: usize = CHUNK_ROWS / 128;

/// COT sender side of IKNP: knows Δ.
pub struct IknpSender {
    delta: u128,
    columns: Vec<AesCtr>,
}

/// COT receiver side of IKNP: chooses the bits.
pub struct IknpReceiver {
    columns: Vec<(AesCtr, AesCtr)>,
}

impl Drop for IknpSender {
    fn drop(&mut self) {
        self.delta.zeroize();
    }
}

impl IknpSender {
    /// Runs the 128 base OTs (as their receiver) with a fresh random Δ.
    pub fn setup<C: Channel>(ch: &mut C) -> Result<Self> {
        let delta = Zeroizing::new(u128::from_le_bytes(Prg::from_os_entropy().block()));
        let choices: Zeroizing<Vec<bool>> =
            Zeroizing::new((0..128).map(|j| (*delta >> j) & 1 == 1).collect());
        let keys = Zeroizing::new(base_ot::receive(ch, &choices)?);
        Ok(IknpSender {
            delta: *delta,
            columns: keys.iter().map(|&k| AesCtr::new(k)).collect(),
        })
    }

    /// Δ, the correlation every COT of this sender carries.
    pub fn delta(&self) -> u128 {
        self.delta
    }

    /// Extends by `m` COTs: returns `q_i` (the receiver holds `q_i ⊕ r_i·Δ`).
    pub fn extend<C: Channel>(&mut self, ch: &mut C, m: usize) -> Result<Vec<u128>> {
        // Zeroizing, so an early return on a peer's error leaves no COT material behind.
        let mut out = Zeroizing::new(vec![0u128; m.div_ceil(CHUNK_ROWS) * CHUNK_ROWS]);
        let mut cols = Zeroizing::new(vec![0u128; 128 * WORDS]);
        for rows in out.chunks_mut(CHUNK_ROWS) {
            let msg = ch.recv_msg_exact(128 * WORDS * 16)?;
            for (j, col) in cols.chunks_mut(WORDS).enumerate() {
                self.columns[j].fill(col);
                // Constant time in Δ: every column reads u, masked by Δ_j (no branch on Δ).
                let delta_j = 0u128.wrapping_sub((self.delta >> j) & 1);
                let u = &msg[j * WORDS * 16..(j + 1) * WORDS * 16];
                for (c, b) in col.iter_mut().zip(u.chunks_exact(16)) {
                    *c ^= u128::from_le_bytes(b.try_into().expect("16 bytes")) & delta_j;
                }
            }
            transpose_columns(&cols, WORDS, rows);
        }
        out.truncate(m);
        Ok(std::mem::take(&mut *out))
    }
}

impl IknpReceiver {
    /// Runs the 128 base OTs (as their sender).
    pub fn setup<C: Channel>(ch: &mut C) -> Result<Self> {
        let keys = Zeroizing::new(base_ot::send(ch, 128)?);
        Ok(IknpReceiver {
            columns: keys
                .iter()
                .map(|k| (AesCtr::new(k[0]), AesCtr::new(k[1])))
                .collect(),
        })
    }

    /// Extends by one COT per choice (0/1 bytes): returns `t_i = q_i ⊕ r_i·Δ`.
    pub fn extend<C: Channel>(&mut self, ch: &mut C, choices: &[u8]) -> Result<Vec<u128>> {
        ensure!(
            choices.iter().all(|&c| c <= 1),
            InvalidArgument,
            "IKNP choices must be 0 or 1"
        );
        let m = choices.len();
        let mut out = Zeroizing::new(vec![0u128; m.div_ceil(CHUNK_ROWS) * CHUNK_ROWS]);
        let mut cols = Zeroizing::new(vec![0u128; 128 * WORDS]);
        let mut other = Zeroizing::new([0u128; WORDS]);
        let mut packed = Zeroizing::new([0u128; WORDS]);
        let mut msg = vec![0u8; 128 * WORDS * 16];
        for (chunk, rows) in out.chunks_mut(CHUNK_ROWS).enumerate() {
            packed.fill(0);
            let start = chunk * CHUNK_ROWS;
            for (i, &c) in choices[start..m.min(start + CHUNK_ROWS)].iter().enumerate() {
                packed[i / 128] |= (c as u128) << (i % 128);
            }
            for (j, col) in cols.chunks_mut(WORDS).enumerate() {
                let (g0, g1) = &mut self.columns[j];
                g0.fill(col);
                g1.fill(&mut other[..]);
                let u = &mut msg[j * WORDS * 16..(j + 1) * WORDS * 16];
                for w in 0..WORDS {
                    let v = col[w] ^ other[w] ^ packed[w];
                    u[16 * w..16 * w + 16].copy_from_slice(&v.to_le_bytes());
                }
            }
            ch.send_msg(&msg)?;
            transpose_columns(&cols, WORDS, rows);
        }
        ch.flush()?;
        out.truncate(m);
        Ok(std::mem::take(&mut *out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_net::run_two_party;

    #[test]
    fn cot_correlation_holds_for_every_row() {
        let n = 20_000; // not a multiple of the chunk: exercises truncation
        let mut prg = Prg::from_os_entropy();
        let choices: Vec<u8> = (0..n).map(|_| prg.bit() as u8).collect();
        let ch2 = choices.clone();
        let ((t, t2), (delta, q, q2)) = run_two_party(
            move |c| {
                let mut r = IknpReceiver::setup(c)?;
                let t = r.extend(c, &ch2)?;
                let t2 = r.extend(c, &ch2[..300])?;
                Ok((t, t2))
            },
            |s| {
                let mut snd = IknpSender::setup(s)?;
                let q = snd.extend(s, n)?;
                let q2 = snd.extend(s, 300)?;
                Ok((snd.delta(), q, q2))
            },
        )
        .unwrap();
        for i in 0..n {
            assert_eq!(t[i], q[i] ^ if choices[i] == 1 { delta } else { 0 });
        }
        for i in 0..300 {
            assert_eq!(t2[i], q2[i] ^ if choices[i] == 1 { delta } else { 0 });
        }
        // Fresh rows: the second batch does not repeat the first.
        assert_ne!(q[..300], q2[..]);
    }
}
