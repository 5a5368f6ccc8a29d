//! AES-128 encryption of many blocks four to an instruction, on CPUs with VAES and AVX-512.
//!
//! Why hand-rolled: the `aes` crate (0.8) pipelines 128-bit AES-NI only, and AES is a fifth of
//! an online phase's CPU (the LPN rows, the Half-Tree nodes, the COTs' hashes; `perf` of BERT-Base
//! after preprocessing). A 512-bit `vaesenc` does four blocks' round in one instruction. The
//! round keys come from AES-NI's key-generation assist; the output is the crate's bit for bit
//! (test `wide_encryption_is_the_crates`), and blocks the wide path does not take (a tail of
//! fewer than four, or a CPU without VAES) go through the crate.

use std::arch::x86_64::*;

use zeroize::Zeroize;

/// The eleven AES-128 round keys, zeroized on drop (IKNP's column PRGs are keyed by secrets).
#[derive(Clone)]
pub(crate) struct RoundKeys([u128; 11]);

impl Drop for RoundKeys {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl RoundKeys {
    /// The round keys of `key` when this CPU can run [`RoundKeys::encrypt`], else `None`.
    pub(crate) fn for_this_cpu(key: u128) -> Option<Self> {
        let wide = is_x86_feature_detected!("aes")
            && is_x86_feature_detected!("vaes")
            && is_x86_feature_detected!("avx512f");
        // SAFETY: the CPU has AES-NI (checked above).
        wide.then(|| RoundKeys(unsafe { expand(key) }))
    }

    /// Encrypts the leading multiple of four blocks of `data` in place and returns how many it
    /// did; the caller encrypts the rest.
    pub(crate) fn encrypt(&self, data: &mut [u128]) -> usize {
        // SAFETY: `for_this_cpu` made `self` only on a CPU with VAES and AVX-512F.
        unsafe { encrypt_wide(&self.0, data) }
    }
}

/// One step of the key schedule (FIPS-197 §5.2 with AES-NI's assist for SubWord and RotWord).
#[target_feature(enable = "aes")]
fn next_round_key<const RCON: i32>(k: __m128i) -> __m128i {
    let t = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<RCON>(k));
    let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    _mm_xor_si128(k, t)
}

#[target_feature(enable = "aes")]
unsafe fn expand(key: u128) -> [u128; 11] {
    let mut k = [_mm_setzero_si128(); 11];
    // SAFETY: an unaligned 16-byte load of a u128 (little-endian: the key's bytes in order, as
    // the crate reads `key.to_le_bytes()`).
    k[0] = unsafe { _mm_loadu_si128(&key as *const u128 as *const __m128i) };
    k[1] = next_round_key::<0x01>(k[0]);
    k[2] = next_round_key::<0x02>(k[1]);
    k[3] = next_round_key::<0x04>(k[2]);
    k[4] = next_round_key::<0x08>(k[3]);
    k[5] = next_round_key::<0x10>(k[4]);
    k[6] = next_round_key::<0x20>(k[5]);
    k[7] = next_round_key::<0x40>(k[6]);
    k[8] = next_round_key::<0x80>(k[7]);
    k[9] = next_round_key::<0x1b>(k[8]);
    k[10] = next_round_key::<0x36>(k[9]);
    let mut out = [0u128; 11];
    for (o, r) in out.iter_mut().zip(&k) {
        // SAFETY: an unaligned 16-byte store into a u128.
        unsafe { _mm_storeu_si128(o as *mut u128 as *mut __m128i, *r) };
    }
    k.zeroize_vectors();
    out
}

/// Overwrites the round keys' register copies before they go out of scope.
trait ZeroizeVectors {
    fn zeroize_vectors(&mut self);
}

macro_rules! zeroize_vectors {
    ($($t:ty),*) => {$(
        impl<const N: usize> ZeroizeVectors for [$t; N] {
            fn zeroize_vectors(&mut self) {
                for v in self.iter_mut() {
                    // SAFETY: a volatile write through a valid reference of an all-zero vector
                    // (valid for every SIMD type), so the wipe is not elided.
                    unsafe { std::ptr::write_volatile(v, std::mem::zeroed()) };
                }
            }
        }
    )*};
}

zeroize_vectors!(__m128i, __m512i);

/// Blocks per pass of the main loop: eight registers in flight hide `vaesenc`'s latency.
const LANES: usize = 8;

#[target_feature(enable = "avx512f,vaes")]
unsafe fn encrypt_wide(rk: &[u128; 11], data: &mut [u128]) -> usize {
    // SAFETY: unaligned 16-byte loads of the u128 round keys.
    let mut keys: [__m512i; 11] = std::array::from_fn(|i| unsafe {
        _mm512_broadcast_i32x4(_mm_loadu_si128(&rk[i] as *const u128 as *const __m128i))
    });
    let mut chunks = data.chunks_exact_mut(4 * LANES);
    for chunk in &mut chunks {
        // SAFETY: the chunk is 4·LANES blocks, the CPU has the features of this function.
        unsafe { encrypt_registers::<LANES>(&keys, chunk.as_mut_ptr()) };
    }
    for quad in chunks.into_remainder().chunks_exact_mut(4) {
        // SAFETY: as above, for four blocks.
        unsafe { encrypt_registers::<1>(&keys, quad.as_mut_ptr()) };
    }
    keys.zeroize_vectors();
    data.len() / 4 * 4
}

/// Encrypts the 4·R blocks at `p` in place, R registers through the rounds side by side.
///
/// SAFETY: `p` points to 4·R writable u128 (unaligned 64-byte accesses).
#[target_feature(enable = "avx512f,vaes")]
#[inline]
unsafe fn encrypt_registers<const R: usize>(keys: &[__m512i; 11], p: *mut u128) {
    let p = p as *mut __m512i;
    let mut b: [__m512i; R] =
        std::array::from_fn(|j| unsafe { _mm512_loadu_si512(p.add(j) as *const _) });
    for v in &mut b {
        *v = _mm512_xor_si512(*v, keys[0]);
    }
    for key in &keys[1..10] {
        for v in &mut b {
            *v = _mm512_aesenc_epi128(*v, *key);
        }
    }
    for (j, v) in b.iter().enumerate() {
        unsafe { _mm512_storeu_si512(p.add(j) as *mut _, _mm512_aesenclast_epi128(*v, keys[10])) };
    }
}

#[cfg(test)]
mod tests {
    use aes::cipher::{BlockEncrypt, KeyInit};
    use aes::Aes128;

    use super::RoundKeys;

    fn crate_encrypt(key: u128, data: &[u128]) -> Vec<u128> {
        let cipher = Aes128::new(&key.to_le_bytes().into());
        data.iter()
            .map(|&x| {
                let mut b = aes::Block::from(x.to_le_bytes());
                cipher.encrypt_block(&mut b);
                u128::from_le_bytes(b.into())
            })
            .collect()
    }

    #[test]
    fn wide_encryption_is_the_crates() {
        if RoundKeys::for_this_cpu(0).is_none() {
            eprintln!("this CPU has no VAES / AVX-512F: the wide path cannot run here");
            return;
        }
        // FIPS-197 appendix C.1.
        let key = u128::from_le_bytes(std::array::from_fn(|i| i as u8));
        let plain = u128::from_le_bytes(std::array::from_fn(|i| (i as u8) * 0x11));
        let mut one = [plain; 4];
        assert_eq!(RoundKeys::for_this_cpu(key).unwrap().encrypt(&mut one), 4);
        let want = 0x69c4e0d86a7b0430d8cdb78070b4c55au128.to_be();
        assert_eq!(one, [want; 4]);
        for (seed, len) in (0u128..).zip([0usize, 1, 3, 4, 5, 31, 32, 33, 35, 36, 64, 67, 1000]) {
            let key = seed.wrapping_mul(0x9e3779b97f4a7c15_f39cc0605cedc834) ^ 0xabcdef;
            let data: Vec<u128> = (0..len as u128)
                .map(|i| (i + seed).wrapping_mul(0xd1b54a32d192ed03_2545f4914f6cdd1d))
                .collect();
            let mut got = data.clone();
            let done = RoundKeys::for_this_cpu(key).unwrap().encrypt(&mut got);
            assert_eq!(done, len / 4 * 4, "length {len}");
            let want = crate_encrypt(key, &data);
            assert_eq!(got[..done], want[..done], "length {len}");
            assert_eq!(got[done..], data[done..], "the tail is left to the caller");
            let mut whole = data.clone();
            crate::aes_prims::Cipher::new(key).encrypt(&mut whole);
            assert_eq!(whole, want, "length {len}");
        }
    }
}
