//! AES building blocks shared by every OT protocol in this crate, all on `u128` blocks.
//!
//! * [`tccr_hash`] — the tweakable correlation-robust hash of Guo–Katz–Wang–Yu (S&P'20),
//!   `H(x, τ) = π(π(x) ⊕ τ) ⊕ π(x)` with π fixed-key AES. It turns a correlated OT
//!   `(q, q ⊕ Δ)` into independent-looking pads: `H(q ⊕ Δ, τ)` is pseudo-random given `q`, as long
//!   as Δ is secret and every tweak is used once. Every caller passes a unique tweak.
//! * [`AesCtr`] — AES-128 in counter mode keyed by a secret seed: the column PRG of IKNP.
//! * [`ccr_hash`] — the circular-correlation-robust hash `H(x) = π'(σ(x)) ⊕ σ(x)` of
//!   Guo–Katz–Wang–Yu (S&P'20, §7.3), with `σ(x_hi ‖ x_lo) = (x_hi ⊕ x_lo) ‖ x_hi` a linear
//!   orthomorphism and π' a second fixed-key AES: the node function of the Half-Tree trees.
//!
//! All batch functions hand whole slices to [`Cipher::encrypt`]: four blocks an instruction
//! where the CPU has VAES and AVX-512 (`crate::aes_wide`), else the `aes` crate's AES-NI
//! pipeline of eight blocks (or its software tables).

use std::sync::OnceLock;

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;

/// AES-128 under one key, encrypting slices of `u128` blocks in place.
#[derive(Clone)]
pub(crate) struct Cipher {
    /// The `aes` crate's cipher: every block where the wide path is absent, and its tails.
    narrow: Aes128,
    #[cfg(target_arch = "x86_64")]
    wide: Option<crate::aes_wide::RoundKeys>,
}

impl Cipher {
    pub(crate) fn new(key: u128) -> Self {
        Cipher {
            narrow: Aes128::new(&key.to_le_bytes().into()),
            #[cfg(target_arch = "x86_64")]
            wide: crate::aes_wide::RoundKeys::for_this_cpu(key),
        }
    }

    /// Encrypts `data` in place, viewing each `u128` as one AES block (its little-endian bytes).
    pub(crate) fn encrypt(&self, data: &mut [u128]) {
        #[cfg(target_arch = "x86_64")]
        let data = match &self.wide {
            Some(keys) => {
                let done = keys.encrypt(data);
                &mut data[done..]
            }
            None => data,
        };
        self.encrypt_narrow(data);
    }

    fn encrypt_narrow(&self, data: &mut [u128]) {
        // SAFETY: `aes::Block` is a 16-byte array with alignment 1; a `u128` slice has the same
        // length in bytes and stricter alignment, so the reinterpretation is valid for its
        // lifetime.
        let blocks = unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut aes::Block, data.len())
        };
        self.narrow.encrypt_blocks(blocks);
    }
}

#[cfg(target_endian = "big")]
compile_error!("veil-ot reinterprets u128 blocks as AES blocks and assumes little-endian");

/// Public, arbitrary keys for the fixed-key permutations (hex digits of π, e and √2).
const PI_KEY: u128 = 0x243f6a8885a308d313198a2e03707344;
const CCR_KEY: u128 = 0xb7e151628aed2a6abf7158809cf4f3c7;

fn fixed(key: u128, cell: &'static OnceLock<Cipher>) -> &'static Cipher {
    cell.get_or_init(|| Cipher::new(key))
}

fn pi() -> &'static Cipher {
    static C: OnceLock<Cipher> = OnceLock::new();
    fixed(PI_KEY, &C)
}

fn ccr_pi() -> &'static Cipher {
    static C: OnceLock<Cipher> = OnceLock::new();
    fixed(CCR_KEY, &C)
}

/// Blocks processed per stack batch: a multiple of both AES paths' widths (32 and 8 blocks).
const BATCH: usize = 64;

/// `out[i] = H(x[i], tweak_base + i)` for the TCCR hash. `x` and `out` have equal length.
pub(crate) fn tccr_hash_seq(x: &[u128], tweak_base: u128, out: &mut [u128]) {
    assert_eq!(x.len(), out.len(), "tccr_hash_seq: length mismatch");
    let mut saved = [0u128; BATCH];
    for (c, (xs, os)) in x.chunks(BATCH).zip(out.chunks_mut(BATCH)).enumerate() {
        let n = xs.len();
        os.copy_from_slice(xs);
        pi().encrypt(os);
        saved[..n].copy_from_slice(os);
        let base = tweak_base.wrapping_add((c * BATCH) as u128);
        for (i, o) in os.iter_mut().enumerate() {
            *o ^= base.wrapping_add(i as u128);
        }
        pi().encrypt(os);
        for (o, s) in os.iter_mut().zip(&saved[..n]) {
            *o ^= s;
        }
    }
}

/// `out[i] = H(x[i], tweaks[i])` for arbitrary tweaks.
pub(crate) fn tccr_hash_tweaked(x: &[u128], tweaks: &[u128], out: &mut [u128]) {
    assert!(
        x.len() == out.len() && x.len() == tweaks.len(),
        "tccr_hash_tweaked: length mismatch"
    );
    let mut saved = [0u128; BATCH];
    for ((xs, ts), os) in x
        .chunks(BATCH)
        .zip(tweaks.chunks(BATCH))
        .zip(out.chunks_mut(BATCH))
    {
        let n = xs.len();
        os.copy_from_slice(xs);
        pi().encrypt(os);
        saved[..n].copy_from_slice(os);
        for (o, t) in os.iter_mut().zip(ts) {
            *o ^= t;
        }
        pi().encrypt(os);
        for (o, s) in os.iter_mut().zip(&saved[..n]) {
            *o ^= s;
        }
    }
}

#[cfg(test)]
/// One TCCR hash (convenience for small inputs).
pub(crate) fn tccr_hash(x: u128, tweak: u128) -> u128 {
    let mut out = [0u128];
    tccr_hash_seq(&[x], tweak, &mut out);
    out[0]
}

/// The orthomorphism σ(x_hi ‖ x_lo) = (x_hi ⊕ x_lo) ‖ x_hi.
#[inline]
fn sigma(x: u128) -> u128 {
    ((x ^ (x >> 64)) << 64) | (x >> 64)
}

/// `out[i] = H(x[i])` for the circular-correlation-robust hash (equal lengths).
pub(crate) fn ccr_hash(x: &[u128], out: &mut [u128]) {
    assert_eq!(x.len(), out.len(), "ccr_hash: length mismatch");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = sigma(v);
    }
    let mut saved = [0u128; BATCH];
    for os in out.chunks_mut(BATCH) {
        saved[..os.len()].copy_from_slice(os);
        ccr_pi().encrypt(os);
        for (o, s) in os.iter_mut().zip(&saved) {
            *o ^= s;
        }
    }
}

/// AES-128-CTR over `u128` blocks with a secret key; the counter persists across calls so one
/// stream can be consumed in chunks.
pub(crate) struct AesCtr {
    cipher: Cipher,
    counter: u128,
}

impl AesCtr {
    pub(crate) fn new(key: u128) -> Self {
        AesCtr {
            cipher: Cipher::new(key),
            counter: 0,
        }
    }

    /// Overwrites `out` with the next `out.len()` keystream blocks.
    pub(crate) fn fill(&mut self, out: &mut [u128]) {
        for o in out.iter_mut() {
            *o = self.counter;
            self.counter = self.counter.wrapping_add(1);
        }
        self.cipher.encrypt(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tccr_batch_matches_single_and_depends_on_tweak() {
        let x: Vec<u128> = (0..200u128)
            .map(|i| i.wrapping_mul(0x9e3779b97f4a7c15))
            .collect();
        let mut out = vec![0u128; 200];
        tccr_hash_seq(&x, 1000, &mut out);
        for i in 0..200 {
            assert_eq!(out[i], tccr_hash(x[i], 1000 + i as u128));
        }
        let tweaks: Vec<u128> = (0..200).map(|i| 1000 + i as u128).collect();
        let mut out2 = vec![0u128; 200];
        tccr_hash_tweaked(&x, &tweaks, &mut out2);
        assert_eq!(out, out2);
        assert_ne!(tccr_hash(5, 1), tccr_hash(5, 2));
        assert_ne!(tccr_hash(5, 1), tccr_hash(6, 1));
    }

    #[test]
    fn ctr_stream_is_chunking_invariant() {
        let mut a = AesCtr::new(42);
        let mut b = AesCtr::new(42);
        let mut whole = vec![0u128; 100];
        a.fill(&mut whole);
        let mut parts = vec![0u128; 100];
        b.fill(&mut parts[..37]);
        b.fill(&mut parts[37..]);
        assert_eq!(whole, parts);
        assert_ne!(whole[0], whole[1]);
    }

    #[test]
    fn sigma_is_an_orthomorphism_and_the_hash_is_batch_invariant() {
        let x: Vec<u128> = (0..150u128)
            .map(|i| i.wrapping_mul(0x9e3779b97f4a7c15_f39cc0605cedc834))
            .collect();
        for &v in &x {
            // σ and σ(x) ⊕ x are both invertible linear maps: check on the halves.
            let (s, d) = (sigma(v), sigma(v) ^ v);
            let (hi, lo) = (v >> 64, v & u64::MAX as u128);
            assert_eq!((s >> 64, s & u64::MAX as u128), (hi ^ lo, hi));
            assert_eq!((d >> 64, d & u64::MAX as u128), (lo, hi ^ lo));
        }
        let mut all = vec![0u128; 150];
        ccr_hash(&x, &mut all);
        for (i, &v) in x.iter().enumerate() {
            let mut one = [0u128];
            ccr_hash(&[v], &mut one);
            assert_eq!(all[i], one[0]);
            assert_ne!(one[0], v);
        }
    }
}
