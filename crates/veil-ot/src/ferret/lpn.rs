//! The primal-LPN step of Ferret: `out_i ⊕= ⊕_{j ∈ row(i)} base_j`, a sparse public matrix with
//! `D = 10` uniformly random entries per output (Ferret's choice), derived from a public seed
//! with AES-CTR (3 blocks give the 10 32-bit indices of one row). Both parties derive the same
//! rows; the sender applies it to its blocks, the receiver to its blocks and choice bits, which
//! keeps the COT correlation because the map is linear.
//!
//! This step is memory-bound (random reads in a k-block table), so rows are generated in small
//! batches right before use and the output range is split into jobs of the process's worker pool
//! (`veil_core::parallel`). Every row depends only on its index, so the output is the same
//! however the jobs fall.

use rayon::prelude::*;
use veil_core::parallel::pool;

use super::Threads;
use crate::aes_prims::Cipher;

/// Non-zeros per output row (Ferret uses d = 10).
pub(crate) const D: usize = 10;
/// AES blocks per row: 12 32-bit words, of which the first 10 are used.
const BLOCKS_PER_ROW: usize = 3;
/// Rows generated per AES batch.
const ROWS: usize = 256;
/// Rows per job of the worker pool (a multiple of [`ROWS`]): ~0.2 ms of work, small enough for
/// idle workers to share the end of an iteration, large enough that scheduling costs nothing.
const JOB_ROWS: usize = 16 * ROWS;

/// The public sparse matrix of one parameter set.
#[derive(Clone)]
pub(crate) struct LpnMatrix {
    cipher: Cipher,
    k: usize,
    /// Separates the counter streams of different parameter sets under one seed.
    stream: u64,
}

impl LpnMatrix {
    pub(crate) fn new(seed: u128, stream: u64, k: usize) -> Self {
        assert!(k > 0 && k <= u32::MAX as usize, "LPN secret length {k}");
        LpnMatrix {
            cipher: Cipher::new(seed),
            k,
            stream,
        }
    }

    /// Column indices of rows `first..first + idx.len() / D`, D per row.
    fn rows(&self, first: usize, idx: &mut [u32]) {
        let mut blocks = [0u128; ROWS * BLOCKS_PER_ROW];
        for (c, idx) in idx.chunks_mut(ROWS * D).enumerate() {
            let count = idx.len() / D;
            let start =
                ((self.stream as u128) << 64) | ((first + c * ROWS) * BLOCKS_PER_ROW) as u128;
            let blocks = &mut blocks[..count * BLOCKS_PER_ROW];
            for (i, b) in blocks.iter_mut().enumerate() {
                *b = start + i as u128;
            }
            self.cipher.encrypt(blocks);
            let k = self.k as u64;
            for (words, row) in blocks
                .chunks_exact(BLOCKS_PER_ROW)
                .zip(idx.chunks_exact_mut(D))
            {
                for (j, x) in row.iter_mut().enumerate() {
                    let w = (words[j / 4] >> (32 * (j % 4))) as u32;
                    *x = ((w as u64 * k) >> 32) as u32;
                }
            }
        }
    }

    /// `out[i] ⊕= ⊕_{j ∈ row(offset + i)} base[j]`, and the same on the receiver's bits
    /// (packed 64 per word, so the bit table stays in L2 and does not compete with the block
    /// table). The bits get their own pass over each batch of rows, after the blocks: mixed
    /// into the block loop, their L1 misses took fill buffers from the block loads
    /// (micro-benchmark, receiver's LPN per row: +19 ns over blocks alone mixed, +12 ns apart).
    fn apply(
        &self,
        offset: usize,
        out: &mut [u128],
        mut bits: Option<(&mut [u8], &[u64])>,
        base: &[u128],
    ) {
        let mut idx = [0u32; ROWS * D];
        for (c, chunk) in out.chunks_mut(ROWS).enumerate() {
            let first = c * ROWS;
            let idx = &mut idx[..chunk.len() * D];
            self.rows(offset + first, idx);
            gather_xor(chunk, idx, base);
            if let Some((out_bits, packed)) = bits.as_mut() {
                let out_bits = &mut out_bits[first..first + chunk.len()];
                for (b, row) in out_bits.iter_mut().zip(idx.chunks_exact(D)) {
                    let acc = row
                        .iter()
                        .fold(0u64, |a, &j| a ^ (packed[j as usize / 64] >> (j % 64)));
                    *b ^= (acc & 1) as u8;
                }
            }
        }
    }

    /// Sender: `out` gets rows `first..first + out.len()` applied (on the worker pool when
    /// they are more than one job and `threads` allows it).
    pub(crate) fn encode(&self, first: usize, out: &mut [u128], base: &[u128], threads: Threads) {
        assert_eq!(base.len(), self.k, "LPN base length");
        if out.len() <= JOB_ROWS || threads == Threads::Caller {
            return self.apply(first, out, None, base);
        }
        pool().install(|| {
            out.par_chunks_mut(JOB_ROWS)
                .enumerate()
                .for_each(|(j, part)| self.apply(first + j * JOB_ROWS, part, None, base));
        });
    }

    /// Receiver: the same on blocks and bits; `packed`: the base's choice bits
    /// ([`pack_bits`]).
    pub(crate) fn encode_with_bits(
        &self,
        first: usize,
        (out, out_bits): (&mut [u128], &mut [u8]),
        base: &[u128],
        packed: &[u64],
        threads: Threads,
    ) {
        assert!(
            base.len() == self.k
                && packed.len() == self.k.div_ceil(64)
                && out.len() == out_bits.len(),
            "LPN shapes"
        );
        if out.len() <= JOB_ROWS || threads == Threads::Caller {
            return self.apply(first, out, Some((out_bits, packed)), base);
        }
        pool().install(|| {
            out.par_chunks_mut(JOB_ROWS)
                .zip(out_bits.par_chunks_mut(JOB_ROWS))
                .enumerate()
                .for_each(|(j, (part, part_bits))| {
                    let at = first + j * JOB_ROWS;
                    self.apply(at, part, Some((part_bits, packed)), base)
                });
        });
    }
}

/// Rows ahead whose table entries are prefetched: keeps ~40 loads in flight.
const PREFETCH_ROWS: usize = 8;

/// `out[r] ⊕= ⊕_j base[idx[r·D + j]]` for every row. The table
/// (9.4 MB for the main set) is far larger than L2, so the loop is bound by L3 latency unless
/// many loads are in flight: prefetch the entries of a few rows ahead. (Bucketing the indices
/// by table segment was tried and was slower: a pass would need far more rows than fit in
/// cache to reuse each table line.)
#[inline]
fn gather_xor(out: &mut [u128], idx: &[u32], base: &[u128]) {
    let rows = out.len();
    for r in 0..rows {
        if r + PREFETCH_ROWS < rows {
            for &j in &idx[(r + PREFETCH_ROWS) * D..(r + PREFETCH_ROWS + 1) * D] {
                prefetch(&base[j as usize]);
            }
        }
        let row = &idx[r * D..r * D + D];
        let mut acc = out[r];
        for &j in row {
            acc ^= base[j as usize];
        }
        out[r] = acc;
    }
}

#[inline(always)]
fn prefetch(p: &u128) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint with no architectural effect; `p` is a valid reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const u128 as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// 0/1 bytes packed 64 per word.
pub(crate) fn pack_bits(bits: &[u8]) -> Vec<u64> {
    let mut out = vec![0u64; bits.len().div_ceil(64)];
    for (i, &b) in bits.iter().enumerate() {
        out[i / 64] |= ((b & 1) as u64) << (i % 64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_encoding_matches_a_direct_row_by_row_computation() {
        let k = 1000;
        let m = LpnMatrix::new(7, 1, k);
        let base: Vec<u128> = (0..k as u128).map(|i| i * 0x1234567 + 99).collect();
        let base_bits: Vec<u8> = (0..k).map(|i| (i % 3 == 0) as u8).collect();
        let n = 5000;
        let mut out = vec![0u128; n];
        let mut out_bits = vec![0u8; n];
        m.encode_with_bits(
            0,
            (&mut out, &mut out_bits),
            &base,
            &pack_bits(&base_bits),
            Threads::Pool,
        );
        let mut only_blocks = vec![0u128; n];
        m.encode(0, &mut only_blocks, &base, Threads::Pool);
        assert_eq!(out, only_blocks);
        let mut idx = [0u32; D];
        let mut hits = vec![0u32; k];
        for i in 0..n {
            m.rows(i, &mut idx);
            let (mut want, mut want_bit) = (0u128, 0u8);
            for &j in &idx[..D] {
                want ^= base[j as usize];
                want_bit ^= base_bits[j as usize];
                hits[j as usize] += 1;
            }
            assert_eq!(out[i], want);
            assert_eq!(out_bits[i], want_bit);
        }
        // 50,000 indices over 1,000 columns: every column is hit (mean 50).
        assert!(
            hits.iter().all(|&h| h > 10),
            "column indices are not spread"
        );
    }
}
