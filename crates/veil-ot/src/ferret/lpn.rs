//! The primal-LPN step of Ferret: `out_i ⊕= ⊕_{j ∈ row(i)} base_j`, a sparse public matrix with
//! `D = 10` uniformly random entries per output (Ferret's choice), derived from a public seed
//! with AES-CTR (3 blocks give the 10 32-bit indices of one row). Both parties derive the same
//! rows; the sender applies it to its blocks, the receiver to its blocks and choice bits, which
//! keeps the COT correlation because the map is linear.
//!
//! This step is memory-bound (random reads in a k-block table), so rows are generated in small
//! batches right before use and the output range is split across threads.

use aes::cipher::KeyInit;
use aes::Aes128;

use crate::aes_prims::encrypt_in_place;

/// Non-zeros per output row (Ferret uses d = 10).
pub const D: usize = 10;
/// AES blocks per row: 12 32-bit words, of which the first 10 are used.
const BLOCKS_PER_ROW: usize = 3;
/// Rows generated per AES batch.
const ROWS: usize = 64;

/// The public sparse matrix of one parameter set.
pub struct LpnMatrix {
    cipher: Aes128,
    k: usize,
    /// Separates the counter streams of different parameter sets under one seed.
    stream: u64,
}

impl LpnMatrix {
    pub fn new(seed: u128, stream: u64, k: usize) -> Self {
        assert!(k > 0 && k <= u32::MAX as usize, "LPN secret length {k}");
        LpnMatrix {
            cipher: Aes128::new(&seed.to_le_bytes().into()),
            k,
            stream,
        }
    }

    /// Column indices of rows `first..first + count` (count ≤ ROWS), D per row.
    fn rows(&self, first: usize, count: usize, idx: &mut [u32; ROWS * D]) {
        let mut blocks = [0u128; ROWS * BLOCKS_PER_ROW];
        let base = ((self.stream as u128) << 64) | (first * BLOCKS_PER_ROW) as u128;
        for (i, b) in blocks[..count * BLOCKS_PER_ROW].iter_mut().enumerate() {
            *b = base + i as u128;
        }
        encrypt_in_place(&self.cipher, &mut blocks[..count * BLOCKS_PER_ROW]);
        let k = self.k as u64;
        for r in 0..count {
            let words = &blocks[r * BLOCKS_PER_ROW..(r + 1) * BLOCKS_PER_ROW];
            for j in 0..D {
                let w = (words[j / 4] >> (32 * (j % 4))) as u32;
                idx[r * D + j] = ((w as u64 * k) >> 32) as u32;
            }
        }
    }

    /// Sender side: `out[i] ⊕= ⊕_{j ∈ row(offset + i)} base[j]`.
    fn apply_blocks(&self, offset: usize, out: &mut [u128], base: &[u128]) {
        let mut idx = [0u32; ROWS * D];
        for (c, chunk) in out.chunks_mut(ROWS).enumerate() {
            self.rows(offset + c * ROWS, chunk.len(), &mut idx);
            for (r, o) in chunk.iter_mut().enumerate() {
                let mut acc = *o;
                for &j in &idx[r * D..r * D + D] {
                    acc ^= base[j as usize];
                }
                *o = acc;
            }
        }
    }

    /// Receiver side: the same on blocks and on choice bits.
    fn apply_blocks_and_bits(
        &self,
        offset: usize,
        out: &mut [u128],
        out_bits: &mut [u8],
        base: &[u128],
        base_bits: &[u8],
    ) {
        let mut idx = [0u32; ROWS * D];
        for (c, (chunk, bits)) in out
            .chunks_mut(ROWS)
            .zip(out_bits.chunks_mut(ROWS))
            .enumerate()
        {
            self.rows(offset + c * ROWS, chunk.len(), &mut idx);
            for (r, (o, b)) in chunk.iter_mut().zip(bits.iter_mut()).enumerate() {
                let (mut acc, mut accb) = (*o, *b);
                for &j in &idx[r * D..r * D + D] {
                    acc ^= base[j as usize];
                    accb ^= base_bits[j as usize];
                }
                *o = acc;
                *b = accb;
            }
        }
    }

    /// Sender: applies the matrix to all of `out`, in parallel.
    pub fn encode(&self, out: &mut [u128], base: &[u128]) {
        assert_eq!(base.len(), self.k, "LPN base length");
        let parts = split_points(out.len());
        std::thread::scope(|s| {
            let mut rest = out;
            let mut offset = 0;
            for len in parts {
                let (head, tail) = rest.split_at_mut(len);
                rest = tail;
                let start = offset;
                s.spawn(move || self.apply_blocks(start, head, base));
                offset += len;
            }
        });
    }

    /// Receiver: applies the matrix to blocks and bits, in parallel.
    pub fn encode_with_bits(
        &self,
        out: &mut [u128],
        out_bits: &mut [u8],
        base: &[u128],
        base_bits: &[u8],
    ) {
        assert!(
            base.len() == self.k && base_bits.len() == self.k && out.len() == out_bits.len(),
            "LPN shapes"
        );
        let parts = split_points(out.len());
        std::thread::scope(|s| {
            let (mut rest, mut rest_bits) = (out, out_bits);
            let mut offset = 0;
            for len in parts {
                let (head, tail) = rest.split_at_mut(len);
                let (head_bits, tail_bits) = rest_bits.split_at_mut(len);
                rest = tail;
                rest_bits = tail_bits;
                let start = offset;
                s.spawn(move || {
                    self.apply_blocks_and_bits(start, head, head_bits, base, base_bits)
                });
                offset += len;
            }
        });
    }
}

/// Worker count for the parallel steps (the machine's cores, at most 4).
pub fn workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
}

/// Splits `n` rows into per-worker lengths that are multiples of the row batch.
fn split_points(n: usize) -> Vec<usize> {
    let w = workers();
    let per = n.div_ceil(w).div_ceil(ROWS) * ROWS;
    let mut parts = Vec::with_capacity(w);
    let mut left = n;
    while left > 0 {
        let l = per.min(left);
        parts.push(l);
        left -= l;
    }
    parts
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
        m.encode_with_bits(&mut out, &mut out_bits, &base, &base_bits);
        let mut only_blocks = vec![0u128; n];
        m.encode(&mut only_blocks, &base);
        assert_eq!(out, only_blocks);
        let mut idx = [0u32; ROWS * D];
        let mut hits = vec![0u32; k];
        for i in 0..n {
            m.rows(i, 1, &mut idx);
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
