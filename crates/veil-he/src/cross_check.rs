//! Cross-check against an independent BFV implementation (fhe.rs): the same plaintext × ciphertext
//! product, computed by both engines at t = 2^41 (the encoder's ring) and t = 2^48 (the
//! decoder's) with polynomial (coefficient) encoding, must decrypt to the same polynomial, which
//! must also equal the schoolbook negacyclic product; and products packed at the decoder's
//! largest stride must decrypt to fhe.rs's products at their packed positions.

use fhe::bfv::{BfvParametersBuilder, Ciphertext, Encoding, Plaintext, SecretKey as FheSecretKey};
use fhe_traits::{FheDecoder, FheDecrypter, FheEncoder, FheEncrypter};
use veil_core::{Prg, Ring, Seed};

use crate::tests::negacyclic_mod_t;
use crate::*;

#[test]
fn products_agree_with_fhe_rs() {
    check(ParamSet::N8192, 41, 1024);
}

/// At t = 2^48 with weights at the FC bound 2^17, through the set whose switch rounding is
/// budgeted by its tail bound.
#[test]
fn products_agree_with_fhe_rs_at_l48() {
    check(ParamSet::N8192Q4L48, 48, 1 << 17);
}

/// A random polynomial m mod 2^`bits`, weights w in ±`bound`, and fhe.rs's decryption of
/// Enc(m)·w, checked against the schoolbook negacyclic product.
fn fhe_rs_product(g: &mut Prg, ring: Ring, bound: i64) -> (Vec<u64>, Vec<i64>, Vec<u64>) {
    let n = 8192;
    let mut m = vec![0u64; n];
    g.fill_ring(ring, &mut m);
    let w: Vec<i64> = (0..n)
        .map(|_| g.below(2 * bound as u64 + 1) as i64 - bound)
        .collect();
    let want = negacyclic_mod_t(ring, &[(w.clone(), m.clone())], n);

    // fhe.rs (its own parameters: no security table, large Q for its noise growth).
    let fp = BfvParametersBuilder::new()
        .set_degree(n)
        .set_plaintext_modulus(1 << ring.bits())
        .set_moduli_sizes(&[62, 62, 62])
        .build_arc()
        .unwrap();
    let mut rng = rand09::rng();
    let fsk = FheSecretKey::random(&fp, &mut rng);
    let pt_m = Plaintext::try_encode(&m, Encoding::poly(), &fp).unwrap();
    let w_mod_t: Vec<u64> = w.iter().map(|&x| ring.from_signed(x)).collect();
    let pt_w = Plaintext::try_encode(&w_mod_t, Encoding::poly(), &fp).unwrap();
    let ct: Ciphertext = fsk.try_encrypt(&pt_m, &mut rng).unwrap();
    let prod = &ct * &pt_w;
    let theirs =
        Vec::<u64>::try_decode(&fsk.try_decrypt(&prod).unwrap(), Encoding::poly()).unwrap();
    assert_eq!(theirs, want, "fhe.rs disagrees with the schoolbook product");
    (m, w, theirs)
}

/// This engine's accumulator of Enc(m)·w.
fn product(
    p: &Params,
    sk: &SecretKey,
    g: &mut Prg,
    m: &[u64],
    w: &[i64],
    bound: i64,
) -> Accumulator {
    let mut acc = Accumulator::new(p);
    let ev = EvalCiphertext::expand(p, &sk.encrypt(m, g).unwrap());
    acc.mul_acc(p, &ev, &NttPlaintext::new(p, w, bound as u64).unwrap());
    acc
}

fn check(set: ParamSet, bits: u32, bound: i64) {
    let ring = Ring::new(bits).unwrap();
    let mut g = Prg::from_seed(&Seed([21; 16]));
    let (m, w, theirs) = fhe_rs_product(&mut g, ring, bound);
    let n = m.len();

    // This engine, through the full hardened response path.
    let p = Params::new(set, ring).unwrap();
    let sk = SecretKey::generate(&p, &mut g);
    let pk = sk.public_key(&mut g);
    let acc = product(&p, &sk, &mut g, &m, &w, bound);
    let positions: Vec<usize> = (0..n).collect();
    let r = acc
        .into_response(&pk, &positions, &vec![0; n], &mut g)
        .unwrap();
    let ours = sk.decrypt_response(&r, &positions).unwrap();
    assert_eq!(ours, theirs);
}

/// Products packed at the decoder's largest stride (2^[`MAX_GALOIS_LEVELS`], one member per
/// leaf of a 512-leaf merge, so every key level is used and the noise bound is the largest the
/// set allows) decrypt, at their packed positions, to fhe.rs's products.
#[test]
fn packed_products_agree_with_fhe_rs_at_l48() {
    let ring = Ring::new(48).unwrap();
    let bound = 1 << 17;
    let mut g = Prg::from_seed(&Seed([22; 16]));
    let p = Params::new(ParamSet::N8192Q4L48, ring).unwrap();
    let sk = SecretKey::generate(&p, &mut g);
    let pk = sk.public_key(&mut g);
    let gk = sk.galois_keys(&mut g).unwrap();
    let stride = 1 << MAX_GALOIS_LEVELS;
    let shape = PackShape::new(stride, stride, stride - 1).unwrap();
    let (mut accs, mut positions, mut want) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..3 {
        let (m, w, theirs) = fhe_rs_product(&mut g, ring, bound);
        accs.push(product(&p, &sk, &mut g, &m, &w, bound));
        for pos in (stride - 1..m.len()).step_by(stride) {
            positions.push(shape.position(pos, r));
            want.push(theirs[pos]);
        }
    }
    let packed = gk.pack(accs, &shape).unwrap();
    let zeros = vec![0; positions.len()];
    let r = packed
        .into_response(&pk, &positions, &zeros, &mut g)
        .unwrap();
    assert_eq!(sk.decrypt_response(&r, &positions).unwrap(), want);
}
