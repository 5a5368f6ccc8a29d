//! 1-out-of-N OT, N = 2^log_n (1 ≤ log_n ≤ 8), from log_n random COTs per OT (the
//! Naor–Pinkas / Brassard–Crépeau–Robert reduction to 1-out-of-2 string OT).
//!
//! OT i uses log_n COTs, derandomised to the bits c_j of the receiver's choice (log_n bits up).
//! COT j yields two pad streams `S_{j,b} = H(q_j ⊕ (b ⊕ d_j)·Δ, τ(j, 0)) ‖ H(.., τ(j, 1)) ‖ …`
//! of N/2·bits bits; the receiver can compute `S_{j,c_j}` only. Message x is masked with
//! `K_x = ⊕_j S_{j,x_j}[x without bit j]` (a `bits`-bit chunk). Every chunk of an unknown
//! stream masks exactly one message, so all keys other than `K_c` are jointly pseudo-random
//! (TCCR with a unique tweak per COT and block). Sender → receiver: `(N − 1)·bits` bits per OT.
//! Cost per OT: `2·log_n·⌈N·bits/256⌉` hashes for the sender (8 for the comparison protocol's
//! N = 16, bits ≤ 16), half that for the receiver. Two flights per call (plus refills), also for
//! a call of several groups of OTs with their own N and widths ([`OneOfN`]: the millionaire's
//! digits): all their corrections go up in one flight and all their rows come back in one.
//! When a row of N messages fits one word (N·bits ≤ 64: the millionaire's 1-of-8 OTs of 1–2
//! bits), the sender assembles a row's N pads with word shifts and the receiver selects its
//! message from one word; the bytes on the wire are the same.
//!
//! XOR-shared output ([`OtSession::send_1_of_n_shared_groups`]): the sender's output share is derived
//! from the keys, r = m_0 ⊕ K_0, and the rows sent are m_x ⊕ r ⊕ K_x for x ≥ 1 only (the one for
//! x = 0 is zero by construction), so the receiver gets m_c ⊕ r: XOR shares of m_c for
//! (N − 1)·bits bits instead of N·bits. r is pseudo-random to the receiver (K_0 is unknown to it
//! unless c = 0, and then its output K_0 is independent of the messages); the other masks
//! K_0 ⊕ K_x stay jointly pseudo-random. The millionaire's leaves need exactly these shares.
//!
//! Why not KK13: KK13 needs a 256-bit-wide OT extension (≥ 256 bits of traffic per OT before
//! the N·bits payload), while log_n silent COTs cost under log_n bits plus log_n correction
//! bits, so this construction sends less whenever COTs are silent.
//! Security: semi-honest, 128-bit computational.

use std::ops::Range;

use veil_core::parallel::{joined, lanes};
use veil_core::{ensure, Result};
use veil_net::Channel;
use zeroize::Zeroizing;

use crate::aes_prims::tccr_hash_tweaked;
use crate::ct::eq_mask;
use crate::derand::{check_bits, check_values, recv_corrections, send_corrections};
use crate::session::{ReceiverBatch, SenderBatch};
use crate::OtSession;
use veil_core::bitpack::{mask, packed_len, BitReader, BitWriter};

/// Tweak for block `c` of the pad stream of COT `index`: indices stay below 2^64, c above.
fn tweak(index: u64, c: usize) -> u128 {
    ((c as u128) << 64) | index as u128
}

fn check_log_n(log_n: u32) -> Result<usize> {
    ensure!(
        (1..=8).contains(&log_n),
        InvalidArgument,
        "1-of-N OT needs 1 <= log_n <= 8, got {log_n}"
    );
    Ok(1usize << log_n)
}

/// Blocks per pad stream: N/2 chunks of `bits` bits.
fn stream_blocks(n_msgs: usize, bits: u32) -> usize {
    (n_msgs / 2 * bits as usize).div_ceil(128)
}

/// `x` with bit `j` removed: its chunk index in the stream of COT j.
fn without_bit(x: usize, j: usize) -> usize {
    (x & ((1 << j) - 1)) | ((x >> (j + 1)) << j)
}

/// Chunk `y` (of `bits` bits) of a pad stream.
fn chunk(stream: &[u128], y: usize, bits: u32) -> u64 {
    let pos = y * bits as usize;
    let (w, off) = (pos / 128, pos % 128);
    let mut v = stream[w] >> off;
    if off + bits as usize > 128 {
        v |= stream[w + 1] << (128 - off);
    }
    v as u64 & mask(bits)
}

/// Whether a whole row of N messages fits one 64-bit word (and each pad stream one block):
/// then the sender builds a row's N pads with word operations instead of N·log N lookups (the
/// millionaire's 1-of-8 OTs of 1–2 bits).
fn packed_rows(n_msgs: usize, bits: u32) -> bool {
    n_msgs * bits as usize <= 64
}

/// The N pads of one OT packed as a row (pad x at bits x·bits..), from its 2·log N single-block
/// streams (index 2j + b). Chunk y of stream (j, b) is the pad share of the message x with
/// x_j = b and x without bit j = y: consecutive runs of 2^j chunks of a stream land in every
/// other run of 2^j messages.
fn row_pads(streams: &[u128], l: usize, bits: u32) -> u64 {
    let half = 1usize << (l - 1);
    let mut pads = 0u64;
    for j in 0..l {
        let width = (1u32 << j) * bits;
        let run = mask(width);
        for b in 0..2 {
            let s = streams[2 * j + b] as u64;
            for r in 0..(half >> j) as u32 {
                pads ^= ((s >> (r * width)) & run) << ((2 * r + b as u32) * width);
            }
        }
    }
    pads
}

/// OTs hashed per batch: bounds scratch memory to a few MiB whatever N is.
const OTS_PER_BATCH: usize = 1024;

/// One group of a batched 1-of-N call ([`OtSession::send_1_of_n_shared_groups`]): `count` OTs of
/// N = 2^`log_n` messages of `bits` bits each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OneOfN {
    /// log2 N: each OT chooses one of N = 2^log_n messages.
    pub log_n: u32,
    /// The number of OTs.
    pub count: usize,
    /// Bits per message.
    pub bits: u32,
}

impl OneOfN {
    fn check(&self) -> Result<usize> {
        check_bits(self.bits)?;
        check_log_n(self.log_n)
    }

    fn cots(&self) -> usize {
        self.count * self.log_n as usize
    }

    /// The OTs `at` of this group as a group of their own, and the range of their COTs.
    fn lane(&self, at: &Range<usize>) -> (OneOfN, Range<usize>) {
        let l = self.log_n as usize;
        let g = OneOfN {
            count: at.len(),
            ..*self
        };
        (g, at.start * l..at.end * l)
    }
}

impl OtSession {
    /// 1-out-of-N OT with XOR-shared output (module doc) on several groups of OTs (each its own
    /// N and width) in one call: two flights in all. `fill_row(g, i, row)` (called from the
    /// lanes of the worker pool, in no particular order) writes the N messages
    /// (< 2^bits) of OT i of group g on demand, so no count × N table is ever allocated; a
    /// message of more than `bits` bits is a caller bug: an error that leaves this session out
    /// of step with the peer. Returns this sender's share r_i of each OT, group by group; the
    /// receiver's [`OtSession::recv_1_of_n_shared_groups`] (with the same groups) returns
    /// `row_i[c_i] ⊕ r_i`. Flights: the corrections of all groups come in one, their masked rows
    /// go back in one.
    pub fn send_1_of_n_shared_groups<C: Channel>(
        &mut self,
        ch: &mut C,
        groups: &[OneOfN],
        fill_row: impl Fn(usize, usize, &mut [u64]) + Sync,
    ) -> Result<Vec<Vec<u64>>> {
        for g in groups {
            g.check()?;
        }
        let total: usize = groups.iter().map(OneOfN::cots).sum();
        let batch = self.take_send(ch, total)?;
        let d = recv_corrections(ch, total)?;
        let (mut first, mut messages, mut shares) = (0, Vec::new(), Vec::new());
        for (gi, g) in groups.iter().enumerate() {
            let part = batch.part(first..first + g.cots());
            let fill = |i: usize, row: &mut [u64]| {
                fill_row(gi, i, row);
                check_values(row, g.bits, "1-of-N message")
            };
            let (msg, sh) = mask_rows(&part, &d[first..first + g.cots()], *g, OT_LANE, fill)?;
            first += g.cots();
            messages.push(msg);
            shares.push(sh);
        }
        for m in &messages {
            ch.send_msg(m)?;
        }
        ch.flush()?;
        Ok(shares)
    }

    /// Receiver of [`OtSession::send_1_of_n_shared_groups`]: per group (log_n, bits, choices),
    /// in the sender's order; returns `row_i[choice_i] ⊕ r_i` group by group.
    pub fn recv_1_of_n_shared_groups<C: Channel>(
        &mut self,
        ch: &mut C,
        groups: &[(u32, u32, &[u8])],
    ) -> Result<Vec<Vec<u64>>> {
        let shapes: Vec<OneOfN> = groups
            .iter()
            .map(|&(log_n, bits, choices)| OneOfN {
                log_n,
                count: choices.len(),
                bits,
            })
            .collect();
        for (g, &(_, _, choices)) in shapes.iter().zip(groups) {
            let n_msgs = g.check()?;
            if let Some(c) = choices.iter().find(|&&c| c as usize >= n_msgs) {
                veil_core::bail!(
                    InvalidArgument,
                    "1-of-N choice {c} is not below N = {n_msgs}"
                );
            }
        }
        let total: usize = shapes.iter().map(OneOfN::cots).sum();
        let batch = self.take_recv(ch, total)?;
        let bit_choices: Vec<bool> = groups
            .iter()
            .flat_map(|&(log_n, _, choices)| {
                let l = log_n as usize;
                (0..choices.len() * l).map(move |k| (choices[k / l] >> (k % l)) & 1 == 1)
            })
            .collect();
        send_corrections(ch, &batch, bit_choices.into_iter())?;
        // The keys K_c are computed while the sender works and become the outputs in place.
        let mut first = 0;
        let mut keys = Vec::with_capacity(groups.len());
        for (g, &(_, _, choices)) in shapes.iter().zip(groups) {
            let part = batch.part(first..first + g.cots());
            keys.push(receiver_keys(&part, *g, choices, OT_LANE));
            first += g.cots();
        }
        for ((g, &(_, _, choices)), out) in shapes.iter().zip(groups).zip(&mut keys) {
            unmask_rows(ch, *g, choices, out)?;
        }
        Ok(keys)
    }
}

/// OTs per lane of a group (`veil_core::parallel::lanes`): a whole number of hashing batches,
/// ≈ 0.2 ms of a sender's work.
const OT_LANE: usize = 4 * OTS_PER_BATCH;

/// The sender's masked rows of one group (the bytes to send) and its output shares, in lanes
/// of `lane` OTs. `next_row(i, row)` writes OT i's messages and checks that they fit `bits`.
fn mask_rows(
    batch: &SenderBatch<'_>,
    d: &[u8],
    g: OneOfN,
    lane: usize,
    next_row: impl Fn(usize, &mut [u64]) -> Result<()> + Sync,
) -> Result<(Vec<u8>, Vec<u64>)> {
    let parts = lanes(g.count, lane, |at| {
        let (lane, cots) = g.lane(&at);
        mask_lane(&batch.part(cots.clone()), &d[cots], lane, |i, row| {
            next_row(at.start + i, row)
        })
    });
    let (rows, shares): (Vec<_>, Vec<_>) = parts
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    Ok((BitWriter::joined(rows), joined(shares)))
}

/// [`mask_rows`] of the OTs of one lane (`batch` and `d` its COTs, `g.count` its OTs).
fn mask_lane(
    batch: &SenderBatch<'_>,
    d: &[u8],
    g: OneOfN,
    mut next_row: impl FnMut(usize, &mut [u64]) -> Result<()>,
) -> Result<(BitWriter, Vec<u64>)> {
    let OneOfN { log_n, count, bits } = g;
    let n_msgs = 1usize << log_n;
    let l = log_n as usize;
    let blocks = stream_blocks(n_msgs, bits);
    let packed = packed_rows(n_msgs, bits);
    // Row x = 0 is zero by construction and not sent.
    let sent = n_msgs - 1;
    // Same bytes either way: a row of `sent` `bits`-bit values is one sent·bits-bit value.
    let mut out = if packed {
        BitWriter::new(count, sent as u32 * bits)
    } else {
        BitWriter::new(count * sent, bits)
    };
    let mut shares = Vec::with_capacity(count);
    // The N keys of the current OT; wiped on every exit, early or not.
    let mut pad = Zeroizing::new([0u64; 256]);
    let mut row = Zeroizing::new(vec![0u64; n_msgs]);
    let m = mask(bits);
    // 1 in every message slot of a packed row: r·ones copies r (< 2^bits) into all N slots.
    let ones = match packed {
        true => (0..n_msgs).fold(0u64, |a, _| (a << bits) | 1),
        false => 0,
    };
    let (mut inputs, mut tweaks) = (Zeroizing::new(Vec::new()), Vec::new());
    let mut streams = Zeroizing::new(Vec::new());
    for first in (0..count).step_by(OTS_PER_BATCH) {
        let last = (first + OTS_PER_BATCH).min(count);
        inputs.clear();
        tweaks.clear();
        // Layout: OT, then COT j, then b, then block c.
        #[allow(clippy::needless_range_loop)] // k indexes q, d and the tweak together
        for k in first * l..last * l {
            for b in 0..2u8 {
                let x = batch.q[k] ^ (batch.delta & 0u128.wrapping_sub((b ^ d[k]) as u128));
                for c in 0..blocks {
                    inputs.push(x);
                    tweaks.push(tweak(batch.index + k as u64, c));
                }
            }
        }
        streams.resize(inputs.len(), 0);
        tccr_hash_tweaked(&inputs, &tweaks, &mut streams);
        for i in first..last {
            next_row(i, &mut row[..])?;
            if packed {
                let k = (i - first) * l;
                let msgs = row.iter().rev().fold(0u64, |a, &v| (a << bits) | v);
                let masked = msgs ^ row_pads(&streams[2 * k..2 * (k + l)], l, bits);
                let r = masked & m;
                shares.push(r);
                out.push((masked ^ (r * ones)) >> bits);
                continue;
            }
            pad[..n_msgs].fill(0);
            for j in 0..l {
                let k = i * l + j - first * l;
                for b in 0..2 {
                    let s = &streams[(2 * k + b) * blocks..(2 * k + b + 1) * blocks];
                    // Chunk c of stream (j, b) masks the message x with x_j = b and
                    // x without bit j equal to c.
                    let mut single = s[0];
                    for c in 0..n_msgs / 2 {
                        let x = ((c >> j) << (j + 1)) | (b << j) | (c & ((1 << j) - 1));
                        pad[x] ^= if blocks == 1 {
                            let v = single as u64 & m;
                            single >>= bits;
                            v
                        } else {
                            chunk(s, c, bits)
                        };
                    }
                }
            }
            let r = row[0] ^ pad[0];
            for (x, p) in row.iter().zip(pad.iter()).skip(1) {
                out.push(x ^ p ^ r);
            }
            shares.push(r);
        }
    }
    Ok((out, shares))
}

/// The receiver's keys K_(c_i) of one group, from its COTs (no traffic), in lanes of `lane` OTs.
fn receiver_keys(batch: &ReceiverBatch<'_>, g: OneOfN, choices: &[u8], lane: usize) -> Vec<u64> {
    joined(lanes(g.count, lane, |at| {
        let (lane, cots) = g.lane(&at);
        lane_keys(&batch.part(cots), lane, &choices[at])
    }))
}

/// [`receiver_keys`] of the OTs of one lane.
fn lane_keys(batch: &ReceiverBatch<'_>, g: OneOfN, choices: &[u8]) -> Vec<u64> {
    let (n_msgs, l, bits) = (1usize << g.log_n, g.log_n as usize, g.bits);
    let blocks = stream_blocks(n_msgs, bits);
    let mut out = Vec::with_capacity(g.count);
    let (mut inputs, mut tweaks) = (Zeroizing::new(Vec::new()), Vec::new());
    let mut streams = Zeroizing::new(Vec::new());
    for first in (0..g.count).step_by(OTS_PER_BATCH) {
        let last = (first + OTS_PER_BATCH).min(g.count);
        inputs.clear();
        tweaks.clear();
        for k in first * l..last * l {
            for c in 0..blocks {
                inputs.push(batch.t[k]);
                tweaks.push(tweak(batch.index + k as u64, c));
            }
        }
        streams.resize(inputs.len(), 0);
        tccr_hash_tweaked(&inputs, &tweaks, &mut streams);
        // The choice is secret: every chunk of a stream is read and the wanted one kept by
        // a mask, so no address depends on it (O(N·log N) per OT, like the sender's work).
        out.extend(choices[first..last].iter().enumerate().map(|(i, &c)| {
            let c = c as usize;
            (0..l).fold(0u64, |key, j| {
                let k = i * l + j;
                let stream = &streams[k * blocks..(k + 1) * blocks];
                key ^ select_chunk(stream, without_bit(c, j), n_msgs / 2, bits)
            })
        }));
    }
    out
}

/// Receives one group's masked rows and turns its keys `out` into the chosen messages.
fn unmask_rows<C: Channel>(ch: &mut C, g: OneOfN, choices: &[u8], out: &mut [u64]) -> Result<()> {
    // Row x = 0 is zero and not sent: K_0 alone is the output for c = 0.
    let sent = g.count * ((1usize << g.log_n) - 1);
    let msg = ch.recv_msg_exact(packed_len(sent, g.bits))?;
    let chosen = chosen_rows(&msg, g, choices, OT_LANE)?;
    for (o, m) in out.iter_mut().zip(chosen) {
        *o ^= m;
    }
    Ok(())
}

/// The masked row each choice selects from the sender's message, read in lanes of `lane` OTs
/// (a multiple of 8: every lane's rows start on a byte). The message's length and padding are
/// checked once, before the lanes.
fn chosen_rows(msg: &[u8], g: OneOfN, choices: &[u8], lane: usize) -> Result<Vec<u64>> {
    assert!(
        lane.is_multiple_of(8),
        "1-of-N lanes of {lane} OTs do not start on bytes"
    );
    let n_msgs = 1usize << g.log_n;
    let what = "1-of-N OT ciphertexts";
    BitReader::new(msg, g.count * (n_msgs - 1), g.bits, what)?;
    let ot_bits = (n_msgs - 1) * g.bits as usize;
    let parts = lanes(g.count, lane, |at| -> Result<Vec<u64>> {
        let bytes = &msg[at.start * ot_bits / 8..(at.end * ot_bits).div_ceil(8)];
        let mut y = BitReader::new(bytes, at.len() * (n_msgs - 1), g.bits, what)?;
        Ok(choices[at]
            .iter()
            .map(|&c| {
                (1..n_msgs).fold(0u64, |acc, x| {
                    acc | (y.next_value() & eq_mask(x, c as usize))
                })
            })
            .collect())
    });
    Ok(joined(parts.into_iter().collect::<Result<_>>()?))
}

/// Chunk `want` of a pad stream of `chunks` chunks, read without a `want`-dependent address.
#[inline]
fn select_chunk(stream: &[u128], want: usize, chunks: usize, bits: u32) -> u64 {
    if let [single] = stream {
        let (m, mut s) = (mask(bits), *single);
        (0..chunks).fold(0u64, |acc, y| {
            let v = s as u64 & m;
            s >>= bits;
            acc | (v & eq_mask(y, want))
        })
    } else {
        (0..chunks).fold(0u64, |acc, y| {
            acc | (chunk(stream, y, bits) & eq_mask(y, want))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Distinct pseudo-random blocks (splitmix-style), enough for hashing tests.
    pub(crate) fn blocks(n: usize, seed: u128) -> Vec<u128> {
        (0..n as u128)
            .map(|i| (i + seed).wrapping_mul(0x9e3779b97f4a7c15_f39cc0605cedc834) ^ seed)
            .collect()
    }

    /// Lanes of any length give the one-lane rows, shares and keys: counts 0, 1 and counts
    /// that no lane length divides, packed rows (N·bits ≤ 64) and rows of several blocks.
    #[test]
    fn any_lane_length_gives_the_one_lane_result() {
        for (log_n, bits) in [(3u32, 2u32), (4, 2), (4, 16), (2, 64)] {
            for count in [0usize, 1, 5, 37] {
                let g = OneOfN { log_n, count, bits };
                let (n, l) = (1usize << log_n, log_n as usize);
                let q = blocks(count * l, 7);
                let d: Vec<u8> = (0..count * l).map(|k| (k * 5 % 3 == 0) as u8).collect();
                let batch = SenderBatch {
                    delta: 0xdead_beef_u128 << 64 | 1,
                    q: &q,
                    index: 1000,
                };
                let row = |i: usize, row: &mut [u64]| {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = (i as u64 * 31 + x as u64 * 7) & mask(bits);
                    }
                    Ok(())
                };
                let t = blocks(count * l, 9);
                let rbits = vec![0u8; count * l];
                let recv = ReceiverBatch {
                    t: &t,
                    bits: &rbits,
                    index: 1000,
                };
                let choices: Vec<u8> = (0..count).map(|i| (i * 3 % n) as u8).collect();
                let whole = mask_rows(&batch, &d, g, usize::MAX, row).unwrap();
                let keys = receiver_keys(&recv, g, &choices, usize::MAX);
                for lane in [1usize, 2, 3, 8, 36] {
                    assert_eq!(mask_rows(&batch, &d, g, lane, row).unwrap(), whole);
                    assert_eq!(receiver_keys(&recv, g, &choices, lane), keys);
                }
                let chosen = chosen_rows(&whole.0, g, &choices, usize::MAX & !7).unwrap();
                assert_eq!(chosen.len(), count);
                for lane in [8usize, 16, 32] {
                    assert_eq!(chosen_rows(&whole.0, g, &choices, lane).unwrap(), chosen);
                }
                // A message one byte short or long is refused before any lane reads it.
                let mut longer = whole.0.clone();
                longer.push(0);
                assert!(chosen_rows(&longer, g, &choices, 8).is_err());
                if let Some((_, shorter)) = whole.0.split_last() {
                    assert!(chosen_rows(shorter, g, &choices, 8).is_err());
                }
            }
        }
    }
}
