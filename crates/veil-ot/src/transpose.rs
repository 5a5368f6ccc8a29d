//! Bit-matrix transpose for IKNP: 128 columns of `m` bits become `m` rows of 128 bits.
//!
//! The core is a 128×128 transpose by recursive block swaps (Hacker's Delight §7-3, widened to
//! 128 bits): 7 rounds of 64 masked swaps, branch-free. On x86_64 it runs on SSE2 registers
//! (part of the baseline, so no detection is needed); elsewhere on `u128`. Both are tested
//! against the bit-by-bit definition and against each other.

/// Masks selecting the bit positions `i` with `i & s == 0`, for s = 64, 32, …, 1.
const MASKS: [(usize, u128); 7] = [
    (64, 0x0000_0000_0000_0000_FFFF_FFFF_FFFF_FFFF),
    (32, 0x0000_0000_FFFF_FFFF_0000_0000_FFFF_FFFF),
    (16, 0x0000_FFFF_0000_FFFF_0000_FFFF_0000_FFFF),
    (8, 0x00FF_00FF_00FF_00FF_00FF_00FF_00FF_00FF),
    (4, 0x0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F),
    (2, 0x3333_3333_3333_3333_3333_3333_3333_3333),
    (1, 0x5555_5555_5555_5555_5555_5555_5555_5555),
];

/// Transposes a 128×128 bit matrix in place: afterwards bit `j` of `m[i]` is the former bit `i`
/// of `m[j]`.
pub(crate) fn transpose_128(m: &mut [u128; 128]) {
    #[cfg(target_arch = "x86_64")]
    transpose_128_sse2(m);
    #[cfg(not(target_arch = "x86_64"))]
    transpose_128_portable(m);
}

/// The same swaps on SSE2 registers. For s < 64 the 64-bit-lane shifts are exact: bits that a
/// 128-bit shift would carry across the lane boundary land where the mask clears them.
#[cfg(target_arch = "x86_64")]
fn transpose_128_sse2(m: &mut [u128; 128]) {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is in the x86_64 baseline. `u128` and `__m128i` have the same size and
    // 16-byte alignment, so the array can be viewed as 128 vectors.
    unsafe {
        let v = &mut *(m as *mut [u128; 128] as *mut [__m128i; 128]);
        let low = _mm_set_epi64x(0, -1);
        for r in 0..64 {
            let (a, b) = (v[r], v[r + 64]);
            let t = _mm_and_si128(_mm_xor_si128(_mm_srli_si128::<8>(a), b), low);
            v[r + 64] = _mm_xor_si128(b, t);
            v[r] = _mm_xor_si128(a, _mm_slli_si128::<8>(t));
        }
        for &(s, mask) in &MASKS[1..] {
            let mask = _mm_set_epi64x((mask >> 64) as i64, mask as i64);
            let count = _mm_cvtsi32_si128(s as i32);
            let mut j = 0;
            while j < 128 {
                for r in j..j + s {
                    let (a, b) = (v[r], v[r + s]);
                    let t = _mm_and_si128(_mm_xor_si128(_mm_srl_epi64(a, count), b), mask);
                    v[r + s] = _mm_xor_si128(b, t);
                    v[r] = _mm_xor_si128(a, _mm_sll_epi64(t, count));
                }
                j += 2 * s;
            }
        }
    }
}

/// Portable version on `u128`.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn transpose_128_portable(m: &mut [u128; 128]) {
    for &(s, mask) in &MASKS {
        let mut j = 0;
        while j < 128 {
            for r in j..j + s {
                let t = ((m[r] >> s) ^ m[r + s]) & mask;
                m[r + s] ^= t;
                m[r] ^= t << s;
            }
            j += 2 * s;
        }
    }
}

/// `cols[j]` holds column `j` as `words` u128 words (bit `i` of word `w` = row `128w + i`).
/// Writes row `r` (bit `j` = column `j`'s bit `r`) to `rows[r]`, for `128 * words` rows.
pub(crate) fn transpose_columns(cols: &[u128], words: usize, rows: &mut [u128]) {
    assert_eq!(
        cols.len(),
        128 * words,
        "transpose_columns: column matrix size"
    );
    assert_eq!(
        rows.len(),
        128 * words,
        "transpose_columns: row buffer size"
    );
    let mut tile = [0u128; 128];
    for w in 0..words {
        for (j, t) in tile.iter_mut().enumerate() {
            *t = cols[j * words + w];
        }
        transpose_128(&mut tile);
        rows[128 * w..128 * w + 128].copy_from_slice(&tile);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_core::Prg;

    #[test]
    fn matches_bitwise_definition() {
        let mut prg = Prg::from_os_entropy();
        let words = 3;
        let cols: Vec<u128> = (0..128 * words)
            .map(|_| u128::from_le_bytes(prg.block()))
            .collect();
        let mut rows = vec![0u128; 128 * words];
        transpose_columns(&cols, words, &mut rows);
        for r in 0..128 * words {
            for j in 0..128 {
                let col_bit = (cols[j * words + r / 128] >> (r % 128)) & 1;
                assert_eq!((rows[r] >> j) & 1, col_bit, "row {r} col {j}");
            }
        }
    }

    #[test]
    fn simd_and_portable_agree() {
        let mut prg = Prg::from_os_entropy();
        for _ in 0..20 {
            let orig: [u128; 128] = std::array::from_fn(|_| u128::from_le_bytes(prg.block()));
            let (mut a, mut b) = (orig, orig);
            transpose_128(&mut a);
            transpose_128_portable(&mut b);
            assert_eq!(a, b);
        }
    }

    #[test]
    fn is_an_involution() {
        let mut prg = Prg::from_os_entropy();
        let orig: [u128; 128] = std::array::from_fn(|_| u128::from_le_bytes(prg.block()));
        let mut m = orig;
        transpose_128(&mut m);
        assert_ne!(m, orig);
        transpose_128(&mut m);
        assert_eq!(m, orig);
    }
}
