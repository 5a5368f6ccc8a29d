//! End-to-end checks of the engine against exact integer arithmetic.

use veil_core::{Prg, Ring, Seed};

use crate::response::decrypt_accumulator_for_test;
use crate::*;

fn prg(tag: u8) -> Prg {
    Prg::from_seed(&Seed([tag; 16]))
}

/// Σ_c w_c·m_c in Z_t[X]/(X^N+1), computed over the integers: the oracle.
pub(crate) fn negacyclic_mod_t(ring: Ring, pairs: &[(Vec<i64>, Vec<u64>)], n: usize) -> Vec<u64> {
    let mut out = vec![0u64; n];
    for (w, m) in pairs {
        for (i, &wi) in w.iter().enumerate() {
            if wi == 0 {
                continue;
            }
            for (j, &mj) in m.iter().enumerate() {
                let v = (wi as u64).wrapping_mul(mj);
                if i + j < n {
                    out[i + j] = out[i + j].wrapping_add(v);
                } else {
                    out[i + j - n] = out[i + j - n].wrapping_sub(v);
                }
            }
        }
    }
    out.iter().map(|&v| ring.reduce(v)).collect()
}

fn setup(set: ParamSet) -> (Params, SecretKey, PublicKey) {
    setup_at(set, 41)
}

fn setup_at(set: ParamSet, bits: u32) -> (Params, SecretKey, PublicKey) {
    let ring = Ring::new(bits).unwrap();
    let p = Params::new(set, ring).unwrap();
    let mut g = prg(1);
    let sk = SecretKey::generate(&p, &mut g);
    let pk = sk.public_key(&mut g);
    (p, sk, pk)
}

#[test]
fn encrypt_decrypt_round_trip_through_response() {
    let (p, sk, pk) = setup(ParamSet::N8192);
    let ring = p.ring();
    let mut g = prg(2);
    let mut m = vec![0u64; p.degree()];
    g.fill_ring(ring, &mut m);
    m[0] = ring.mask();
    m[1] = 0;
    let ct = sk.encrypt(&m, &mut g).unwrap();
    let mut acc = Accumulator::new(&p);
    acc.mul_acc(
        &p,
        &EvalCiphertext::expand(&p, &ct),
        &NttPlaintext::new(&p, &[1], 1).unwrap(),
    );
    assert_eq!(decrypt_accumulator_for_test(&sk, &acc), m);
    let positions: Vec<usize> = (0..p.degree()).collect();
    let mask: Vec<u64> = (0..p.degree() as u64)
        .map(|i| ring.reduce(i * 977))
        .collect();
    let r = acc.into_response(&pk, &positions, &mask, &mut g).unwrap();
    let got = sk.decrypt_response(&r, &positions).unwrap();
    let want: Vec<u64> = m.iter().zip(&mask).map(|(&a, &b)| ring.add(a, b)).collect();
    assert_eq!(got, want);
}

fn check_products(set: ParamSet, ring_bits: u32, weight_bits: u32, count: usize, tag: u8) {
    let (p, sk, pk) = setup_at(set, ring_bits);
    let ring = p.ring();
    let n = p.degree();
    let mut g = prg(tag);
    let mut acc = Accumulator::new(&p);
    let mut pairs = Vec::new();
    for _ in 0..count {
        let mut m = vec![0u64; n];
        g.fill_ring(ring, &mut m);
        let w: Vec<i64> = (0..n)
            .map(|_| g.below(1 << (weight_bits + 1)) as i64 - (1 << weight_bits))
            .collect();
        let ct = sk.encrypt(&m, &mut g).unwrap();
        let mut ev = EvalCiphertext::expand(&p, &ct);
        // Fold a plaintext "server share" in, as the FC protocol does.
        let mut share = vec![0u64; n];
        g.fill_ring(ring, &mut share);
        ev.add_plain(&p, &share).unwrap();
        let sum: Vec<u64> = m
            .iter()
            .zip(&share)
            .map(|(&a, &b)| ring.add(a, b))
            .collect();
        let bound = 1 << weight_bits;
        acc.mul_acc(&p, &ev, &NttPlaintext::new(&p, &w, bound).unwrap());
        pairs.push((w, sum));
    }
    let want = negacyclic_mod_t(ring, &pairs, n);
    assert_eq!(decrypt_accumulator_for_test(&sk, &acc), want);
    let positions: Vec<usize> = (0..n).step_by(3).collect();
    let mask = vec![5u64; positions.len()];
    let r = acc.into_response(&pk, &positions, &mask, &mut g).unwrap();
    let got = sk.decrypt_response(&r, &positions).unwrap();
    for (k, &j) in positions.iter().enumerate() {
        assert_eq!(got[k], ring.add(want[j], 5), "coefficient {j}");
    }
    // The client's count of revealed coefficients is the server's.
    assert_eq!(sk.revealed(), positions.len() as u64);
    assert_eq!(pk.revealed(), sk.revealed());
}

#[test]
fn weight_sized_products_are_exact() {
    check_products(ParamSet::N8192, 41, 16, 3, 3);
}

/// At ℓ = 48 (the decoder's ring): FC-weight-sized and 24-bit-limb-sized plaintexts, through
/// the response path whose switch rounding is budgeted by its tail bound.
#[test]
fn products_are_exact_at_l48() {
    check_products(ParamSet::N8192Q4L48, 48, 17, 3, 7);
    check_products(ParamSet::N8192Q4L48, 48, 23, 2, 8);
}

#[test]
fn share_sized_products_are_exact_at_n8192q4() {
    check_products(ParamSet::N8192Q4, 41, 40, 1, 4);
}

/// The plaintext's declared public bound is enforced, and the response refuses a product whose
/// bounds exceed the flooding budget (the check cannot be skipped).
#[test]
fn responses_check_the_public_bounds() {
    let (p, sk, pk) = setup(ParamSet::N8192);
    let mut g = prg(6);
    assert!(matches!(
        NttPlaintext::new(&p, &[5, -9], 8),
        Err(veil_core::Error::Insecure(_))
    ));
    let ev = EvalCiphertext::expand(&p, &sk.encrypt(&[1], &mut g).unwrap());
    let mut acc = Accumulator::new(&p);
    acc.mul_acc(
        &p,
        &ev,
        &NttPlaintext::new(&p, &[1 << 40], 1 << 40).unwrap(),
    );
    assert!(matches!(
        acc.into_response(&pk, &[0], &[0], &mut g),
        Err(veil_core::Error::Insecure(_))
    ));
}

#[test]
fn responses_reject_bad_layouts() {
    let (p, sk, pk) = setup(ParamSet::N8192);
    let acc = Accumulator::new(&p);
    let mut g = prg(5);
    assert!(Accumulator::new(&p)
        .into_response(&pk, &[p.degree()], &[0], &mut g)
        .is_err());
    let r = acc.into_response(&pk, &[0, 1], &[0, 0], &mut g).unwrap();
    assert!(sk.decrypt_response(&r, &[0]).is_err());
    assert!(sk.encrypt(&[1 << 41], &mut g).is_err());
    assert!(sk.encrypt(&vec![0; p.degree() + 1], &mut g).is_err());
}

/// The largest uniform weight magnitude B ≤ 2^(ℓ-1) such that a full polynomial of ±B passes
/// the set's flooding check, found by bisection on the public bound.
fn edge_weight(p: &Params) -> i64 {
    let n = p.degree() as f64;
    let ok = |b: i64| p.check_public_product(n, b as f64, 0.0).is_ok();
    let max = 1i64 << (p.ring().bits() - 1);
    if ok(max) {
        return max; // every centred ℓ-bit value is accepted (N8192Q4)
    }
    let (mut lo, mut hi) = (1i64, max);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if ok(mid) {
            lo = mid
        } else {
            hi = mid
        }
    }
    assert!(ok(lo) && !ok(lo + 1));
    lo
}

fn check_edge(set: ParamSet, ring_bits: u32) {
    let (p, sk, pk) = setup_at(set, ring_bits);
    let ring = p.ring();
    let n = p.degree();
    let b = edge_weight(&p);
    let mut g = prg(11);
    let w: Vec<i64> = (0..n).map(|_| if g.bit() { b } else { -b }).collect();
    let mut m = vec![0u64; n];
    g.fill_ring(ring, &mut m);
    // The extreme message values maximise the encoding rounding terms.
    m[0] = ring.mask();
    m[1] = 1 << (ring_bits - 1);
    let mut acc = Accumulator::new(&p);
    let ev = EvalCiphertext::expand(&p, &sk.encrypt(&m, &mut g).unwrap());
    acc.mul_acc(&p, &ev, &NttPlaintext::new(&p, &w, b as u64).unwrap());
    let want = negacyclic_mod_t(ring, &[(w, m)], n);
    let positions: Vec<usize> = (0..n).collect();
    let r = acc
        .into_response(&pk, &positions, &vec![0; n], &mut g)
        .unwrap();
    assert_eq!(sk.decrypt_response(&r, &positions).unwrap(), want);
}

#[test]
fn edge_weights_decrypt_exactly_n8192() {
    check_edge(ParamSet::N8192, 41);
}

#[test]
fn edge_weights_decrypt_exactly_at_l48() {
    check_edge(ParamSet::N8192Q4L48, 48);
}

#[test]
fn edge_weights_decrypt_exactly_n8192q4() {
    check_edge(ParamSet::N8192Q4, 41);
}
