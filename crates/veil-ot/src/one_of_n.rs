//! 1-out-of-N OT, N = 2^log_n (1 ≤ log_n ≤ 8), from log_n random COTs per OT (Naor–Pinkas style).
//!
//! For OT i the receiver derandomises log_n COTs to the bits of its choice c (log_n bits up).
//! The key of message x is `K_x = ⊕_j H(q_j ⊕ (x_j ⊕ d_j)·Δ, τ(j, x))`, with a tweak unique per
//! COT *and* message index, so `K_c` is computable by the receiver (`⊕_j H(t_j, τ(j, c))`) and
//! every other key contains at least one term `H(t_j ⊕ Δ, ·)` under a fresh tweak, hence is
//! pseudo-random to it (TCCR); the per-x tweaks rule out XOR relations between keys.
//! Sender → receiver: `N·bits` bits per OT. Two flights per call (plus refills).
//!
//! Why not KK13: KK13 needs a 256-bit-wide OT extension (≥ 256 bits of traffic per OT before
//! the N·bits payload), while log_n silent COTs cost under log_n bits plus log_n correction
//! bits. Its sender costs N·log_n hashes per OT instead of N, acceptable for the comparison
//! protocol's N ≤ 16 and still correct up to N = 256.
//! Security: semi-honest, 128-bit computational.

use veil_core::{ensure, Result};
use veil_net::Channel;

use crate::aes_prims::tccr_hash_tweaked;
use crate::derand::{check_bits, check_values, recv_corrections, send_corrections};
use crate::pack::{mask, pack, packed_len, unpack};
use crate::OtSession;

/// Tweak for COT `index` and message `x`: indices stay below 2^64, x lives above.
fn tweak(index: u64, x: usize) -> u128 {
    ((x as u128) << 64) | index as u128
}

fn check_log_n(log_n: u32) -> Result<usize> {
    ensure!(
        (1..=8).contains(&log_n),
        InvalidArgument,
        "1-of-N OT needs 1 <= log_n <= 8, got {log_n}"
    );
    Ok(1usize << log_n)
}

/// OTs hashed per batch: bounds scratch memory to a few MiB whatever N is.
const OTS_PER_BATCH: usize = 256;

impl OtSession {
    /// 1-out-of-N OT sender: `table` holds count × N messages (< 2^bits), row i = OT i.
    pub fn send_1_of_n<C: Channel>(
        &mut self,
        ch: &mut C,
        log_n: u32,
        table: &[u64],
        bits: u32,
    ) -> Result<()> {
        let n_msgs = check_log_n(log_n)?;
        check_bits(bits)?;
        ensure!(
            table.len().is_multiple_of(n_msgs),
            InvalidArgument,
            "1-of-N table length {} is not a multiple of N = {n_msgs}",
            table.len()
        );
        check_values(table, bits, "send_1_of_n table")?;
        let count = table.len() / n_msgs;
        let l = log_n as usize;
        let batch = self.take_send(ch, count * l)?;
        let d = recv_corrections(ch, count * l)?;
        let m = mask(bits);
        let mut y = table.to_vec();
        let (mut inputs, mut tweaks, mut hashes) = (Vec::new(), Vec::new(), Vec::new());
        for first in (0..count).step_by(OTS_PER_BATCH) {
            let last = (first + OTS_PER_BATCH).min(count);
            inputs.clear();
            tweaks.clear();
            for i in first..last {
                for j in 0..l {
                    let k = i * l + j;
                    for x in 0..n_msgs {
                        let b = ((x >> j) as u8 & 1) ^ d[k];
                        inputs.push(batch.q[k] ^ (batch.delta & 0u128.wrapping_sub(b as u128)));
                        tweaks.push(tweak(batch.index + k as u64, x));
                    }
                }
            }
            hashes.resize(inputs.len(), 0);
            tccr_hash_tweaked(&inputs, &tweaks, &mut hashes);
            for (off, i) in (first..last).enumerate() {
                for j in 0..l {
                    let h = &hashes[(off * l + j) * n_msgs..][..n_msgs];
                    for (x, hx) in h.iter().enumerate() {
                        y[i * n_msgs + x] ^= *hx as u64 & m;
                    }
                }
            }
        }
        ch.send_msg(&pack(&y, bits))?;
        ch.flush()
    }

    /// 1-out-of-N OT receiver: one choice < N per OT; returns `table[i][choice_i]`.
    pub fn recv_1_of_n<C: Channel>(
        &mut self,
        ch: &mut C,
        log_n: u32,
        choices: &[u8],
        bits: u32,
    ) -> Result<Vec<u64>> {
        let n_msgs = check_log_n(log_n)?;
        check_bits(bits)?;
        if let Some(c) = choices.iter().find(|&&c| c as usize >= n_msgs) {
            veil_core::bail!(
                InvalidArgument,
                "1-of-N choice {c} is not below N = {n_msgs}"
            );
        }
        let count = choices.len();
        let l = log_n as usize;
        let batch = self.take_recv(ch, count * l)?;
        let bit_choices = (0..count * l).map(|k| (choices[k / l] >> (k % l)) & 1 == 1);
        send_corrections(ch, &batch, bit_choices)?;
        let tweaks: Vec<u128> = (0..count * l)
            .map(|k| tweak(batch.index + k as u64, choices[k / l] as usize))
            .collect();
        let mut keys = vec![0u128; count * l];
        tccr_hash_tweaked(batch.t, &tweaks, &mut keys);
        let msg = ch.recv_msg_exact(packed_len(count * n_msgs, bits))?;
        let y = unpack(&msg, count * n_msgs, bits, "1-of-N OT ciphertexts")?;
        let m = mask(bits);
        Ok((0..count)
            .map(|i| {
                let key = keys[i * l..(i + 1) * l]
                    .iter()
                    .fold(0u64, |a, &k| a ^ k as u64);
                (y[i * n_msgs + choices[i] as usize] ^ key) & m
            })
            .collect())
    }
}
