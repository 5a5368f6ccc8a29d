//! Server-side response hardening and client-side decoding.
//!
//! After the multiply-accumulate the server turns its accumulator into a [`Response`]:
//! 1. **re-randomise** with a fresh public-key encryption of zero, (pk0·u + e1, pk1·u + e2), so
//!    that c1 is no longer Σ wᵢ·aᵢ (which the client, knowing every aᵢ, could solve for w);
//! 2. **mask** with the server's output share and **flood** the c0 coefficients it will send with
//!    uniform noise of 2^b ≥ 2^40 × the weight-dependent noise;
//! 3. **modulus-switch** from Q to the final prime p (RNS rescaling, then exact CRT and rounding);
//! 4. **send only the needed coefficients of c0**, with their low h−1 bits dropped, and all of c1.
//!
//! The client recovers each needed coefficient as round(t·(c0 + c1·s mod p)/p) mod t.

use veil_core::{ensure, Prg, Result};

use crate::cipher::{scaled_coefficient, Accumulator};
use crate::keys::{PublicKey, SecretKey};
use crate::math::{add_mod, sample_cbd, sample_ternary, sub_mod};
use crate::params::{Inner, Params};
use crate::poly::RnsPoly;

/// A hardened, switched ciphertext: all of c1 modulo p, and the needed c0 coefficients with
/// their low `c0_drop_bits` removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub(crate) c1: Vec<u64>,
    pub(crate) c0: Vec<u64>,
}

impl Response {
    pub fn needed(&self) -> usize {
        self.c0.len()
    }
}

/// Switches one coefficient, given by its residues `x` modulo every RNS prime, to the final
/// modulus: round(p·x/Q) mod p. `x` is used as scratch.
fn switch_coefficient(inner: &Inner, x: &mut [u64]) -> u64 {
    let q = &inner.moduli;
    // RNS rescaling: x ← round(x / q_j), dropping the top limbs.
    // Moduli are equal-sized and descending, so any residue mod q_j (j > i) is < 2·q_i.
    let reduce = |v: u64, qi: u64| if v >= qi { v - qi } else { v };
    for j in (inner.crt_limbs..q.len()).rev() {
        let r = x[j];
        let neg = r > q[j] / 2;
        for i in 0..j {
            let rc = if neg {
                // x - (r - q_j): add (q_j - r) mod q_i.
                add_mod(x[i], reduce(q[j] - r, q[i]), q[i])
            } else {
                sub_mod(x[i], reduce(r, q[i]), q[i])
            };
            x[i] = inner.rescale_inv[j][i].mul(rc, q[i]);
        }
    }
    // Exact CRT into [0, Q').
    let big_q = inner.crt_modulus;
    let mut acc: u128 = 0;
    for i in 0..inner.crt_limbs {
        acc += inner.crt_hat_inv[i].mul(x[i], q[i]) as u128 * inner.crt_basis[i];
        if acc >= big_q {
            acc -= big_q;
        }
    }
    // round(p·acc/Q'): float estimate, then exact correction in wrapping 128-bit arithmetic
    // (the true remainder is within 2^10·Q' ≤ 2^120 of zero, so wrapping is harmless).
    let p = inner.final_modulus;
    let mut k = ((acc as f64) * (p as f64 / big_q as f64)).round() as u128;
    let mut rem = (acc.wrapping_mul(p as u128)).wrapping_sub(k.wrapping_mul(big_q)) as i128;
    let half = (big_q / 2) as i128;
    while rem > half {
        k += 1;
        rem -= big_q as i128;
    }
    while rem < -half {
        k -= 1;
        rem += big_q as i128;
    }
    let k = k as u64;
    if k >= p {
        k - p
    } else {
        k
    }
}

/// Uniform in [-2^bits, 2^bits).
fn sample_flood(prg: &mut Prg, bits: u32) -> i128 {
    let mut b = [0u8; 16];
    prg.fill(&mut b);
    let r = u128::from_le_bytes(b) & ((1u128 << (bits + 1)) - 1);
    r as i128 - (1i128 << bits)
}

impl Accumulator {
    /// Hardens the accumulated product into a response that reveals only
    /// `[product + add]` at `positions` (all mod t), see the module docs.
    pub fn into_response(
        mut self,
        pk: &PublicKey,
        positions: &[usize],
        add: &[u64],
        prg: &mut Prg,
    ) -> Result<Response> {
        let p = pk.params();
        let n = p.degree();
        ensure!(
            positions.len() == add.len() && positions.iter().all(|&j| j < n),
            InvalidArgument,
            "response positions must be < N and match the added values"
        );
        ensure!(
            add.iter().all(|&v| p.ring().contains(v)),
            InvalidArgument,
            "added value outside Z_2^{}",
            p.ring().bits()
        );
        let inner = p.inner();
        // 1. Fresh encryption of zero under the client's public key.
        let mut u = RnsPoly::from_signed(p, &sample_ternary(prg, n));
        u.ntt(p);
        self.c0.mul_acc(p, &pk.pk0_ntt, &u.data);
        self.c1.mul_acc(p, &pk.pk1_ntt, &u.data);
        self.c0.intt(p);
        self.c1.intt(p);
        self.c1
            .add_assign(p, &RnsPoly::from_signed(p, &sample_cbd(prg, n)));

        // 2. Mask and flood only the coefficients that will be sent.
        let e1 = sample_cbd(prg, positions.len());
        let limbs = p.limbs();
        let mut x = vec![0u64; limbs];
        let mut c0_out = Vec::with_capacity(positions.len());
        let d = inner.budget.c0_drop_bits;
        let pf = inner.final_modulus;
        for (k, &j) in positions.iter().enumerate() {
            let noise = sample_flood(prg, inner.budget.flood_bits) + e1[k] as i128;
            for (i, (&q, s)) in p
                .moduli()
                .iter()
                .zip(scaled_coefficient(p, add[k]))
                .enumerate()
            {
                let e = noise.rem_euclid(q as i128) as u64;
                x[i] = add_mod(add_mod(self.c0.data[i * n + j], s, q), e, q);
            }
            // 3–4. Switch, then drop the low d bits (rounded).
            let v = switch_coefficient(inner, &mut x);
            c0_out.push((v + (1 << (d - 1))) >> d);
        }
        let mut c1_out = Vec::with_capacity(n);
        for j in 0..n {
            for (i, xi) in x.iter_mut().enumerate() {
                *xi = self.c1.data[i * n + j];
            }
            c1_out.push(switch_coefficient(inner, &mut x));
        }
        debug_assert!(c1_out.iter().all(|&v| v < pf));
        Ok(Response {
            c1: c1_out,
            c0: c0_out,
        })
    }
}

impl SecretKey {
    /// Decodes the needed coefficients of a response: round(t·(c0 + c1·s mod p)/p) mod t.
    pub fn decrypt_response(&self, r: &Response, positions: &[usize]) -> Result<Vec<u64>> {
        let p: &Params = &self.params;
        let n = p.degree();
        let inner = p.inner();
        let pf = inner.final_modulus;
        ensure!(
            r.c1.len() == n && r.c0.len() == positions.len() && positions.iter().all(|&j| j < n),
            InvalidArgument,
            "response does not match the expected layout"
        );
        let mut cs = r.c1.clone();
        inner.final_plan.fwd(&mut cs);
        inner
            .final_plan
            .mul_assign_normalize(&mut cs, &self.s_final_ntt);
        inner.final_plan.inv(&mut cs);
        let d = inner.budget.c0_drop_bits;
        let t_bits = p.ring().bits();
        let ring = p.ring();
        Ok(positions
            .iter()
            .zip(&r.c0)
            .map(|(&j, &c0)| {
                let c0 = ((c0 as u128) << d) % pf as u128;
                let x = add_mod(c0 as u64, cs[j], pf);
                let xc = if x > pf / 2 {
                    x as i128 - pf as i128
                } else {
                    x as i128
                };
                let m = ((xc << (t_bits + 1)) + pf as i128).div_euclid(2 * pf as i128);
                ring.reduce(m as u64)
            })
            .collect())
    }
}

/// Reference decryption of an accumulator at the full modulus (tests only): needs no hardening,
/// so products can be checked before the response path.
#[cfg(test)]
pub(crate) fn decrypt_accumulator_for_test(sk: &SecretKey, acc: &Accumulator) -> Vec<u64> {
    let p = &sk.params;
    let n = p.degree();
    let mut c0 = acc.c0.clone();
    c0.mul_acc(p, &acc.c1.data, &negate(p, &sk.neg_s_ntt));
    c0.intt(p);
    let inner = p.inner();
    let mut x = vec![0u64; p.limbs()];
    let pf = inner.final_modulus;
    let ring = p.ring();
    (0..n)
        .map(|j| {
            for (i, xi) in x.iter_mut().enumerate() {
                *xi = c0.data[i * n + j];
            }
            let v = switch_coefficient(inner, &mut x);
            let xc = if v > pf / 2 {
                v as i128 - pf as i128
            } else {
                v as i128
            };
            let m = ((xc << (ring.bits() + 1)) + pf as i128).div_euclid(2 * pf as i128);
            ring.reduce(m as u64)
        })
        .collect()
}

#[cfg(test)]
fn negate(p: &Params, v: &[u64]) -> Vec<u64> {
    let n = p.degree();
    let mut out = v.to_vec();
    for (limb, &q) in out.chunks_exact_mut(n).zip(p.moduli()) {
        for x in limb {
            *x = if *x == 0 { 0 } else { q - *x };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EvalCiphertext, NttPlaintext, ParamSet};
    use veil_core::{Ring, Seed};

    /// The noise the client sees after switching: x − (p/t)·m at each sent coefficient.
    fn visible_noise(sk: &SecretKey, r: &Response, positions: &[usize], m: &[u64]) -> Vec<f64> {
        let p = &sk.params;
        let inner = p.inner();
        let pf = inner.final_modulus as f64;
        let mut cs = r.c1.clone();
        inner.final_plan.fwd(&mut cs);
        inner
            .final_plan
            .mul_assign_normalize(&mut cs, &sk.s_final_ntt);
        inner.final_plan.inv(&mut cs);
        let t = (1u64 << p.ring().bits()) as f64;
        positions
            .iter()
            .zip(&r.c0)
            .zip(m)
            .map(|((&j, &c0), &mj)| {
                let c0 = ((c0 as u128) << inner.budget.c0_drop_bits) % inner.final_modulus as u128;
                let x = add_mod(c0 as u64, cs[j], inner.final_modulus) as f64;
                let v = (x - pf / t * mj as f64).rem_euclid(pf);
                if v > pf / 2.0 {
                    v - pf
                } else {
                    v
                }
            })
            .collect()
    }

    /// Responses carry the flood: the visible noise is the dropped c0 bits (uniform on
    /// ±2^(h-2)) plus the switched flood (uniform on ±2^b·p/Q); its rms must match that sum, not
    /// the dropped bits alone, and the noise must stay inside the decryption bound 2^h.
    #[test]
    fn responses_are_flooded_within_budget() {
        let p = Params::new(ParamSet::N4096, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([4; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let pk = sk.public_key(&mut g);
        let n = p.degree();
        let mut m = vec![0u64; n];
        g.fill_ring(p.ring(), &mut m);
        let mut acc = Accumulator::new(&p);
        let ev = EvalCiphertext::expand(&p, &sk.encrypt(&m, &mut g).unwrap());
        acc.mul_acc(&p, &ev, &NttPlaintext::new(&p, &[1]).unwrap());
        let positions: Vec<usize> = (0..n).collect();
        let r = acc
            .into_response(&pk, &positions, &vec![0; n], &mut g)
            .unwrap();
        let noise = visible_noise(&sk, &r, &positions, &m);
        let h = p.budget().headroom_bits as i32;
        let rms = (noise.iter().map(|v| v * v).sum::<f64>() / n as f64).sqrt();
        let b = p.budget();
        let dropped = 2f64.powi(h - 2) / 3f64.sqrt();
        let flood = 2f64.powf(b.flood_bits as f64 - b.log2_q_over_p) / 3f64.sqrt();
        let expected = (dropped * dropped + flood * flood).sqrt();
        assert!(
            rms > (expected + dropped) / 2.0,
            "rms {rms} vs {expected}: flood missing?"
        );
        assert!(
            rms < 1.05 * expected,
            "rms {rms} vs {expected}: more noise than budgeted"
        );
        assert!(noise.iter().all(|v| v.abs() < 2f64.powi(h)));
    }

    /// Without re-randomisation c1 would be the switched Σ w·a, which the client can compute
    /// from its seeds; the response's c1 must differ from it almost everywhere.
    #[test]
    fn responses_are_rerandomised() {
        let p = Params::new(ParamSet::N4096, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([8; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let pk = sk.public_key(&mut g);
        let ct = sk.encrypt(&[1, 2, 3], &mut g).unwrap();
        let mut acc = Accumulator::new(&p);
        acc.mul_acc(
            &p,
            &EvalCiphertext::expand(&p, &ct),
            &NttPlaintext::new(&p, &[1]).unwrap(),
        );
        let r = acc.into_response(&pk, &[0], &[0], &mut g).unwrap();
        let mut a = crate::keys::expand_uniform_ntt(&p, &Seed(ct.seed));
        a.intt(&p);
        let n = p.degree();
        let mut x = vec![0u64; p.limbs()];
        let same = (0..n)
            .filter(|&j| {
                for (i, xi) in x.iter_mut().enumerate() {
                    *xi = a.data[i * n + j];
                }
                switch_coefficient(p.inner(), &mut x) == r.c1[j]
            })
            .count();
        assert!(
            same < n / 100,
            "{same} of {n} c1 coefficients equal the client-computable Σ w·a"
        );
    }
}
