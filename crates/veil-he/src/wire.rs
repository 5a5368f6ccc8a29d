//! Compact canonical wire formats for every BFV message, with strict validation on receipt.
//!
//! Each message starts with a header naming the parameters (N, the RNS primes, the final
//! modulus, ℓ) which must equal the receiver's; residues are bit-packed at the width of their
//! modulus (`veil_core::bitpack`: LSB first, each vector padded with zero bits to a byte
//! boundary). Decoders check the
//! message kind, the header, counts, every value against its modulus, zero padding and trailing
//! bytes, and return [`Error::Malformed`] on any mismatch.
//!
//! | message | body after the header |
//! |---|---|
//! | public key | 16-byte seed of pk1, pk0 (NTT domain) in every limb |
//! | ciphertexts | u32 count, then per ciphertext: 16-byte seed of c1, c0 (NTT domain) in every limb |
//! | responses | u32 count, then per response: c1 (N values mod p), the needed c0 values (dropped bits) |
//! | Galois keys | special prime P (u64), u8 level count (the set's [`Params::galois_levels`]), 16-byte seed of every a, then per level, digit and limb of Q·P: b (NTT domain) |

use veil_core::bitpack::packed_len;
use veil_core::wire::{Reader, Writer};
use veil_core::{ensure, Result, Seed};

use crate::galois::{expand_key_masks, special, GaloisKeys};
use crate::keys::{expand_uniform_ntt, PublicKey};
use crate::params::Params;
use crate::{Response, SeededCiphertext};

const KIND_PUBLIC_KEY: u8 = 0x50;
const KIND_CIPHERTEXTS: u8 = 0x43;
const KIND_RESPONSES: u8 = 0x52;
const KIND_GALOIS_KEYS: u8 = 0x47;

fn bits_of(modulus: u64) -> u32 {
    64 - (modulus - 1).leading_zeros()
}

fn header(w: &mut Writer, kind: u8, p: &Params) {
    w.u8(kind).u32(p.degree() as u32).u8(p.ring().bits() as u8);
    w.u8(p.limbs() as u8);
    for &q in p.moduli() {
        w.u64(q);
    }
    w.u64(p.final_modulus());
}

fn check_header(r: &mut Reader<'_>, kind: u8, p: &Params, what: &str) -> Result<()> {
    let k = r.u8()?;
    ensure!(k == kind, Malformed, "{what}: wrong message kind {k:#x}");
    let n = r.u32()? as usize;
    let bits = r.u8()? as u32;
    let limbs = r.u8()? as usize;
    ensure!(
        n == p.degree() && bits == p.ring().bits() && limbs == p.limbs(),
        Malformed,
        "{what}: parameters (N={n}, ℓ={bits}, {limbs} limbs) differ from ours"
    );
    for &q in p.moduli() {
        ensure!(r.u64()? == q, Malformed, "{what}: RNS modulus mismatch");
    }
    ensure!(
        r.u64()? == p.final_modulus(),
        Malformed,
        "{what}: final modulus mismatch"
    );
    Ok(())
}

fn pack_limbs(w: &mut Writer, p: &Params, data: &[u64]) {
    for (limb, &q) in data.chunks_exact(p.degree()).zip(p.moduli()) {
        w.bit_packed(limb, bits_of(q));
    }
}

fn unpack_limbs(r: &mut Reader<'_>, p: &Params) -> Result<Vec<u64>> {
    let mut out = Vec::with_capacity(p.limbs() * p.degree());
    for &q in p.moduli() {
        out.extend(r.bit_packed_below(p.degree(), bits_of(q), q)?);
    }
    Ok(out)
}

/// A public key: its seed and the bit-packed residues of pk0.
pub fn encode_public_key(pk: &PublicKey) -> Vec<u8> {
    let p = pk.params();
    let mut w = Writer::new();
    header(&mut w, KIND_PUBLIC_KEY, p);
    w.bytes(&pk.seed.0);
    pack_limbs(&mut w, p, &pk.pk0_ntt);
    w.finish()
}

/// The public key of [`encode_public_key`]; refuses any other length or out-of-range residues.
pub fn decode_public_key(p: &Params, bytes: &[u8]) -> Result<PublicKey> {
    let what = "BFV public key";
    let mut r = Reader::new(bytes, what);
    check_header(&mut r, KIND_PUBLIC_KEY, p, what)?;
    let seed = Seed(r.array::<16>()?);
    let pk0_ntt = unpack_limbs(&mut r, p)?;
    r.finish()?;
    let pk1_ntt = expand_uniform_ntt(p, &seed).data;
    Ok(PublicKey::new(p, seed, pk0_ntt, pk1_ntt))
}

/// Upper bound on encoded Galois keys (for `recv_msg` limits).
pub fn galois_keys_len(p: &Params) -> usize {
    let limb_bytes = |q: u64| packed_len(p.degree(), bits_of(q));
    let per_digit: usize = p.moduli().iter().map(|&q| limb_bytes(q)).sum::<usize>()
        + p.special_modulus().map_or(0, limb_bytes);
    96 + p.limbs() * 8 + p.galois_levels() * p.limbs() * per_digit
}

/// Galois keys: their seed and the bit-packed residues of every key's b part.
pub fn encode_galois_keys(gk: &GaloisKeys) -> Result<Vec<u8>> {
    let p = gk.params();
    let pm = special(p)?.modulus;
    let mut w = Writer::with_capacity(galois_keys_len(p));
    header(&mut w, KIND_GALOIS_KEYS, p);
    w.u64(pm).u8(gk.b.len() as u8);
    w.bytes(&gk.seed.0);
    for level in &gk.b {
        for (idx, chunk) in level.chunks_exact(p.degree()).enumerate() {
            let m = p.moduli().get(idx % (p.limbs() + 1)).copied().unwrap_or(pm);
            w.bit_packed(chunk, bits_of(m));
        }
    }
    Ok(w.finish())
}

/// The keys of [`encode_galois_keys`]; refuses any other length or out-of-range residues.
pub fn decode_galois_keys(p: &Params, bytes: &[u8]) -> Result<GaloisKeys> {
    let what = "BFV Galois keys";
    let mut r = Reader::new(bytes, what);
    check_header(&mut r, KIND_GALOIS_KEYS, p, what)?;
    let pm = special(p)?.modulus;
    ensure!(r.u64()? == pm, Malformed, "{what}: special prime mismatch");
    let levels = r.u8()? as usize;
    ensure!(
        levels == p.galois_levels(),
        Malformed,
        "{what}: {levels} levels, expected {}",
        p.galois_levels()
    );
    let seed = Seed(r.array::<16>()?);
    let l = p.limbs();
    let mut b = Vec::with_capacity(levels);
    for _ in 0..levels {
        let mut level = Vec::with_capacity(l * (l + 1) * p.degree());
        for idx in 0..l * (l + 1) {
            let m = p.moduli().get(idx % (l + 1)).copied().unwrap_or(pm);
            level.extend(r.bit_packed_below(p.degree(), bits_of(m), m)?);
        }
        b.push(level);
    }
    r.finish()?;
    let a = expand_key_masks(p, &seed)?;
    Ok(GaloisKeys {
        params: p.clone(),
        seed,
        b,
        a,
    })
}

/// Upper bound on an encoded batch of `count` ciphertexts (for `recv_msg` limits).
pub fn ciphertexts_len(p: &Params, count: usize) -> usize {
    64 + p.limbs() * 8 + count * (p.ciphertext_bits() as usize / 8 + p.limbs() + 1)
}

/// Seeded ciphertexts, one after the other: seed and bit-packed c0.
pub fn encode_ciphertexts(p: &Params, cts: &[SeededCiphertext]) -> Vec<u8> {
    let mut w = Writer::with_capacity(ciphertexts_len(p, cts.len()));
    header(&mut w, KIND_CIPHERTEXTS, p);
    w.u32(cts.len() as u32);
    for ct in cts {
        w.bytes(&ct.seed);
        pack_limbs(&mut w, p, &ct.c0_ntt);
    }
    w.finish()
}

/// Decodes exactly `expected` ciphertexts.
pub fn decode_ciphertexts(
    p: &Params,
    bytes: &[u8],
    expected: usize,
) -> Result<Vec<SeededCiphertext>> {
    let what = "BFV ciphertexts";
    let mut r = Reader::new(bytes, what);
    check_header(&mut r, KIND_CIPHERTEXTS, p, what)?;
    let count = r.u32()? as usize;
    ensure!(
        count == expected,
        Malformed,
        "{what}: {count} ciphertexts, expected {expected}"
    );
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let seed = r.array::<16>()?;
        let c0_ntt = unpack_limbs(&mut r, p)?;
        out.push(SeededCiphertext { seed, c0_ntt });
    }
    r.finish()?;
    Ok(out)
}

/// Upper bound on an encoded batch of responses with these needed-coefficient counts.
pub fn responses_len(p: &Params, needed: &[usize]) -> usize {
    64 + p.limbs() * 8
        + needed
            .iter()
            .map(|&k| p.response_bits(k) as usize / 8 + 2)
            .sum::<usize>()
}

/// Responses, one after the other: c1, then the needed c0 coefficients.
pub fn encode_responses(p: &Params, rs: &[Response]) -> Vec<u8> {
    let b = p.budget();
    let needed: Vec<usize> = rs.iter().map(Response::needed).collect();
    let mut w = Writer::with_capacity(responses_len(p, &needed));
    header(&mut w, KIND_RESPONSES, p);
    w.u32(rs.len() as u32);
    for r in rs {
        w.bit_packed(&r.c1, b.c1_width);
        w.bit_packed(&r.c0, b.c0_width);
    }
    w.finish()
}

/// Decodes one response per entry of `needed` (the number of c0 coefficients each carries).
pub fn decode_responses(p: &Params, bytes: &[u8], needed: &[usize]) -> Result<Vec<Response>> {
    let what = "BFV responses";
    let b = p.budget();
    let mut r = Reader::new(bytes, what);
    check_header(&mut r, KIND_RESPONSES, p, what)?;
    let count = r.u32()? as usize;
    ensure!(
        count == needed.len(),
        Malformed,
        "{what}: {count} responses, expected {}",
        needed.len()
    );
    // Canonical range: the rounded top bits of a residue below p.
    let c0_bound = ((p.final_modulus() - 1 + (1 << (b.c0_drop_bits - 1))) >> b.c0_drop_bits) + 1;
    let mut out = Vec::with_capacity(count);
    for &k in needed {
        let c1 = r.bit_packed_below(p.degree(), b.c1_width, p.final_modulus())?;
        let c0 = r.bit_packed_below(k, b.c0_width, c0_bound)?;
        out.push(Response { c1, c0 });
    }
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Accumulator, ParamSet, SecretKey};
    use veil_core::{Prg, Ring};

    fn setup() -> (Params, SecretKey, PublicKey, Prg) {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([9; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let pk = sk.public_key(&mut g);
        (p, sk, pk, g)
    }

    /// Every strict prefix and every extension by one byte must be rejected, without panicking.
    fn assert_strict<T>(bytes: &[u8], decode: impl Fn(&[u8]) -> Result<T>) {
        assert!(decode(bytes).is_ok());
        for cut in [0, 1, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "prefix {cut} accepted");
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(decode(&longer).is_err());
        let mut wrong_kind = bytes.to_vec();
        wrong_kind[0] ^= 1;
        assert!(decode(&wrong_kind).is_err());
        let mut wrong_modulus = bytes.to_vec();
        wrong_modulus[8] ^= 1;
        assert!(decode(&wrong_modulus).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, .. Default::default() })]
        /// Arbitrary bytes, and valid messages with one byte flipped, never panic a decoder.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
                                flip in 0usize..100_000, bit in 0u8..8) {
            let (p, sk, pk, mut g) = setup();
            let _ = decode_public_key(&p, &bytes);
            let _ = decode_ciphertexts(&p, &bytes, 1);
            let _ = decode_responses(&p, &bytes, &[1]);
            let _ = decode_galois_keys(&p, &bytes);
            let mut ct = encode_ciphertexts(&p, &[sk.encrypt(&[1], &mut g).unwrap()]);
            let i = flip % ct.len();
            ct[i] ^= 1 << bit;
            let _ = decode_ciphertexts(&p, &ct, 1);
            let mut key = encode_public_key(&pk);
            let i = flip % key.len();
            key[i] ^= 1 << bit;
            let _ = decode_public_key(&p, &key);
        }
    }

    #[test]
    fn galois_keys_round_trip_and_strictness() {
        let (p, sk, _pk, mut g) = setup();
        let gk = sk.galois_keys(&mut g).unwrap();
        let bytes = encode_galois_keys(&gk).unwrap();
        assert!(bytes.len() <= galois_keys_len(&p));
        let back = decode_galois_keys(&p, &bytes).unwrap();
        assert_eq!((back.a, back.b), (gk.a.clone(), gk.b.clone()));
        assert_strict(&bytes, |b| decode_galois_keys(&p, b));
        let other = Params::new(ParamSet::N8192Q4, p.ring()).unwrap();
        assert!(decode_galois_keys(&other, &bytes).is_err());
    }

    /// The decoder's keys carry their set's levels (more than the encoder's), priced exactly by
    /// `galois_keys_len`; a level count other than the set's is refused.
    #[test]
    fn decoder_galois_keys_carry_their_levels() {
        let p = Params::new(ParamSet::N8192Q4L48, veil_core::Ring::new(48).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([23; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let gk = sk.galois_keys(&mut g).unwrap();
        assert_eq!(gk.b.len(), crate::MAX_GALOIS_LEVELS);
        let bytes = encode_galois_keys(&gk).unwrap();
        // The bound leaves 56 bytes of slack for the header (96 − 40).
        assert_eq!(bytes.len(), galois_keys_len(&p) - 56);
        let back = decode_galois_keys(&p, &bytes).unwrap();
        assert_eq!((back.a, back.b), (gk.a, gk.b));
        // The level count follows the header (kind, N, ℓ, limbs, primes, final prime) and P.
        let at = 1 + 4 + 1 + 1 + 8 * p.limbs() + 8 + 8;
        assert_eq!(bytes[at] as usize, crate::MAX_GALOIS_LEVELS);
        let mut fewer = bytes.clone();
        fewer[at] = crate::MIN_GALOIS_LEVELS as u8;
        let e = decode_galois_keys(&p, &fewer).err().unwrap().to_string();
        assert!(e.contains("6 levels, expected 9"), "{e}");
    }

    #[test]
    fn public_key_round_trip_and_strictness() {
        let (p, _sk, pk, _) = setup();
        let bytes = encode_public_key(&pk);
        let back = decode_public_key(&p, &bytes).unwrap();
        assert_eq!(back.pk0_ntt, pk.pk0_ntt);
        assert_eq!(back.pk1_ntt, pk.pk1_ntt);
        assert_strict(&bytes, |b| decode_public_key(&p, b));
        let other = Params::new(ParamSet::N8192Q4, p.ring()).unwrap();
        assert!(decode_public_key(&other, &bytes).is_err());
    }

    #[test]
    fn ciphertexts_round_trip_and_strictness() {
        let (p, sk, _pk, mut g) = setup();
        let cts: Vec<_> = (0..2)
            .map(|i| sk.encrypt(&[i, 1, 2], &mut g).unwrap())
            .collect();
        let bytes = encode_ciphertexts(&p, &cts);
        assert!(bytes.len() <= ciphertexts_len(&p, 2));
        assert_eq!(decode_ciphertexts(&p, &bytes, 2).unwrap(), cts);
        assert!(decode_ciphertexts(&p, &bytes, 3).is_err());
        assert_strict(&bytes, |b| decode_ciphertexts(&p, b, 2));
        // A residue at or above its modulus is rejected: set the first 50-bit value to all ones.
        let body = bytes.len() - 2 * (p.ciphertext_bits() as usize / 8);
        let mut bad = bytes.clone();
        for b in &mut bad[body + 16..body + 16 + 6] {
            *b = 0xff;
        }
        bad[body + 22] |= 0x03;
        assert!(decode_ciphertexts(&p, &bad, 2).is_err());
    }

    #[test]
    fn responses_round_trip_and_strictness() {
        let (p, sk, pk, mut g) = setup();
        let pos = [0usize, 7, 100];
        let rs: Vec<_> = (0..2)
            .map(|_| {
                Accumulator::new(&p)
                    .into_response(&pk, &pos, &[1, 2, 3], &mut g)
                    .unwrap()
            })
            .collect();
        let bytes = encode_responses(&p, &rs);
        assert!(bytes.len() <= responses_len(&p, &[3, 3]));
        let back = decode_responses(&p, &bytes, &[3, 3]).unwrap();
        assert_eq!(back, rs);
        assert_eq!(sk.decrypt_response(&back[1], &pos).unwrap(), vec![1, 2, 3]);
        assert!(decode_responses(&p, &bytes, &[3, 2]).is_err());
        assert_strict(&bytes, |b| decode_responses(&p, b, &[3, 3]));
        // c0 values above the rounded top bits of p − 1 are not canonical.
        let b = p.budget();
        let top = (p.final_modulus() - 1 + (1 << (b.c0_drop_bits - 1))) >> b.c0_drop_bits;
        assert!(
            top + 1 < 1 << b.c0_width,
            "test needs a non-canonical value that fits"
        );
        for (v, ok) in [(top, true), (top + 1, false)] {
            let r = Response {
                c1: rs[0].c1.clone(),
                c0: vec![v],
            };
            assert_eq!(
                decode_responses(&p, &encode_responses(&p, &[r]), &[1]).is_ok(),
                ok
            );
        }
    }
}
