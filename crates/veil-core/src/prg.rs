//! AES-128 in counter mode as a PRG. One type serves both uses:
//! * private randomness: [`Prg::from_os_entropy`] draws its key from the OS CSPRNG;
//! * correlated randomness: two parties that agreed on a [`Seed`] expand identical streams.
//!
//! The key is zeroized on drop. AES-NI is used when the CPU has it (the `aes` crate detects it).

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;
use rand_core::{CryptoRng, RngCore};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::Ring;

/// A 128-bit block.
pub type Block = [u8; 16];

/// A 128-bit PRG seed. Zeroized on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct Seed(pub [u8; 16]);

impl Seed {
    /// A fresh seed from the operating system's CSPRNG.
    pub fn random() -> Self {
        let mut s = [0u8; 16];
        rand_core::OsRng.fill_bytes(&mut s);
        Seed(s)
    }
}

impl std::fmt::Debug for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seed(<secret>)")
    }
}

/// Blocks encrypted per refill: amortises the AES call and lets AES-NI pipeline 8 blocks.
const BUF_BLOCKS: usize = 64;

/// AES-128-CTR keystream generator.
pub struct Prg {
    cipher: Aes128,
    counter: u128,
    buf: [u8; 16 * BUF_BLOCKS],
    pos: usize,
}

impl Drop for Prg {
    fn drop(&mut self) {
        self.buf.zeroize();
        // `Aes128` zeroizes its round keys on drop (aes crate `zeroize` feature is on by default
        // for the software backend; round keys live only inside it).
    }
}

impl Prg {
    /// A PRG expanding `seed`: both parties holding the seed draw the same stream.
    pub fn from_seed(seed: &Seed) -> Self {
        Prg {
            cipher: Aes128::new(&seed.0.into()),
            counter: 0,
            buf: [0u8; 16 * BUF_BLOCKS],
            pos: 16 * BUF_BLOCKS,
        }
    }

    /// A PRG keyed from the OS CSPRNG.
    pub fn from_os_entropy() -> Self {
        Self::from_seed(&Seed::random())
    }

    fn refill(&mut self) {
        let mut blocks = [aes::Block::default(); BUF_BLOCKS];
        for b in blocks.iter_mut() {
            *b = self.counter.to_le_bytes().into();
            self.counter = self.counter.wrapping_add(1);
        }
        self.cipher.encrypt_blocks(&mut blocks);
        for (i, b) in blocks.iter().enumerate() {
            self.buf[16 * i..16 * i + 16].copy_from_slice(b);
        }
        blocks.zeroize_blocks();
        self.pos = 0;
    }

    /// Fills `out` with the next bytes of the stream.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut off = 0;
        while off < out.len() {
            if self.pos == self.buf.len() {
                self.refill();
            }
            let n = (self.buf.len() - self.pos).min(out.len() - off);
            out[off..off + n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            off += n;
        }
    }

    /// The next 16 bytes of the stream.
    pub fn block(&mut self) -> Block {
        let mut b = [0u8; 16];
        self.fill(&mut b);
        b
    }

    /// The next 8 bytes of the stream as a little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        u64::from_le_bytes(b)
    }

    /// A uniform bit.
    pub fn bit(&mut self) -> bool {
        let mut b = [0u8; 1];
        self.fill(&mut b);
        b[0] & 1 == 1
    }

    /// A uniform element of Z_{2^ℓ}.
    #[inline]
    pub fn ring_elem(&mut self, ring: Ring) -> u64 {
        self.u64() & ring.mask()
    }

    /// Fills `out` with uniform elements of Z_{2^ℓ}.
    pub fn fill_ring(&mut self, ring: Ring, out: &mut [u64]) {
        for x in out.iter_mut() {
            *x = self.u64() & ring.mask();
        }
    }

    /// Uniform integer in [0, bound) by rejection sampling (no modulo bias).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below(0) has no value");
        let zone = u64::MAX - (u64::MAX % bound);
        loop {
            let v = self.u64();
            if v < zone {
                return v % bound;
            }
        }
    }
}

trait ZeroizeBlocks {
    fn zeroize_blocks(&mut self);
}

impl ZeroizeBlocks for [aes::Block; BUF_BLOCKS] {
    fn zeroize_blocks(&mut self) {
        for b in self.iter_mut() {
            b.as_mut_slice().zeroize();
        }
    }
}

impl RngCore for Prg {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        self.u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.fill(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill(dest);
        Ok(())
    }
}

/// The stream is a CSPRNG when its key is secret (OS-seeded or a seed only the parties know).
impl CryptoRng for Prg {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let s = Seed([7u8; 16]);
        let (mut a, mut b) = (Prg::from_seed(&s), Prg::from_seed(&s));
        let mut c = Prg::from_seed(&Seed([8u8; 16]));
        let xa: Vec<u64> = (0..1000).map(|_| a.u64()).collect();
        let xb: Vec<u64> = (0..1000).map(|_| b.u64()).collect();
        let xc: Vec<u64> = (0..1000).map(|_| c.u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn matches_aes128_ctr_known_answer() {
        // FIPS-197 C.1: AES-128 with key 000102..0f encrypts block 00112233..ff to 69c4e0d8...
        // Our counter block 0 is all zeros, so check against a direct AES call instead.
        let key = Seed(core::array::from_fn(|i| i as u8));
        let mut p = Prg::from_seed(&key);
        let cipher = Aes128::new(&key.0.into());
        let mut blk = aes::Block::from(1u128.to_le_bytes());
        let _ = p.block();
        cipher.encrypt_block(&mut blk);
        assert_eq!(p.block(), <[u8; 16]>::from(blk));
    }

    #[test]
    fn bits_are_balanced() {
        let mut p = Prg::from_os_entropy();
        let n = 1 << 16;
        let ones: u32 = (0..n / 64).map(|_| p.u64().count_ones()).sum();
        // Mean n/2 = 32768, sd = 128: 6 sd is a 1e-9 false alarm rate.
        assert!((ones as i64 - 32768).abs() < 6 * 128, "ones = {ones}");
    }

    #[test]
    fn below_stays_in_range() {
        let mut p = Prg::from_os_entropy();
        for bound in [1u64, 2, 3, 1000, u64::MAX] {
            for _ in 0..100 {
                assert!(p.below(bound) < bound);
            }
        }
    }
}
