//! Cross-check against an independent BFV implementation (fhe.rs): the same plaintext × ciphertext
//! product, computed by both engines at t = 2^41 (the encoder's ring) and t = 2^48 (the
//! decoder's) with polynomial (coefficient) encoding, must decrypt to the same polynomial, which
//! must also equal the schoolbook negacyclic product.

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

fn check(set: ParamSet, bits: u32, bound: i64) {
    let ring = Ring::new(bits).unwrap();
    let n = 8192;
    let mut g = Prg::from_seed(&Seed([21; 16]));
    let mut m = vec![0u64; n];
    g.fill_ring(ring, &mut m);
    let w: Vec<i64> = (0..n)
        .map(|_| g.below(2 * bound as u64 + 1) as i64 - bound)
        .collect();
    let want = negacyclic_mod_t(ring, &[(w.clone(), m.clone())], n);

    // fhe.rs (its own parameters: no security table, large Q for its noise growth).
    let fp = BfvParametersBuilder::new()
        .set_degree(n)
        .set_plaintext_modulus(1 << bits)
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

    // This engine, through the full hardened response path.
    let p = Params::new(set, ring).unwrap();
    let sk = SecretKey::generate(&p, &mut g);
    let pk = sk.public_key(&mut g);
    let mut acc = Accumulator::new(&p);
    let ev = EvalCiphertext::expand(&p, &sk.encrypt(&m, &mut g).unwrap());
    acc.mul_acc(&p, &ev, &NttPlaintext::new(&p, &w, bound as u64).unwrap());
    let positions: Vec<usize> = (0..n).collect();
    let r = acc
        .into_response(&pk, &positions, &vec![0; n], &mut g)
        .unwrap();
    let ours = sk.decrypt_response(&r, &positions).unwrap();

    assert_eq!(theirs, want, "fhe.rs disagrees with the schoolbook product");
    assert_eq!(ours, theirs);
}
