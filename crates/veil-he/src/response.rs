//! Server-side response hardening and client-side decoding.
//!
//! After the multiply-accumulate the server turns its accumulator into a [`Response`]:
//! 1. **re-randomise** with a fresh public-key encryption of zero, (pk0·u + e1, pk1·u + e2), so
//!    that c1 is no longer Σ wᵢ·aᵢ (which the client, knowing every aᵢ, could solve for w);
//! 2. **check** the public noise bounds against the budget and the session's revealed-coefficient
//!    count, **mask** with the server's output share and **flood** the c0 coefficients it will
//!    send with uniform noise of width 2^(b+1) ≥ 2^69 × the weight-dependent noise bound;
//! 3. **modulus-switch** from Q to the final prime p (RNS rescaling, then exact CRT and rounding);
//! 4. **send only the needed coefficients of c0**, with their low h−1 bits dropped, and all of c1.
//!
//! The client recovers each needed coefficient as round(t·(c0 + c1·s mod p)/p) mod t.

use veil_core::{ensure, Prg, Result};

use crate::cipher::{scaled_coefficient, Accumulator};
use crate::keys::{PublicKey, SecretKey};
use crate::math::{
    add_mod, neg_mod, reduce_once, sample_cbd, sample_ternary, select, sign_mask, sub_mod,
};
use crate::params::{Inner, Params};
use crate::poly::RnsPoly;
use zeroize::Zeroize;

/// A hardened, switched ciphertext: all of c1 modulo p, and the needed c0 coefficients with
/// their low `c0_drop_bits` removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub(crate) c1: Vec<u64>,
    pub(crate) c0: Vec<u64>,
}

impl Response {
    /// The number of c0 coefficients sent.
    pub fn needed(&self) -> usize {
        self.c0.len()
    }
}

/// Switches one coefficient, given by its residues `x` modulo every RNS prime, to the final
/// modulus: ≈ round(p·x/Q) mod p (the RNS rescaling adds < 2^-20 to the rounding error). `x`
/// is used as scratch. Branch-free in the (secret) value.
pub(crate) fn switch_coefficient(inner: &Inner, x: &mut [u64]) -> u64 {
    let q = &inner.moduli;
    // RNS rescaling: x ← round(x / q_j), dropping the top limbs, with the centred residue r of
    // q_j: x − r is divisible by q_j. Moduli are equal-sized and descending, so any residue
    // mod q_j (j > i) is < 2·q_i and one conditional subtraction reduces it.
    for j in (inner.crt_limbs..q.len()).rev() {
        let r = x[j];
        let neg = sign_mask((q[j] / 2).wrapping_sub(r)); // r > q_j/2: r stands for r − q_j
        for i in 0..j {
            let up = add_mod(x[i], reduce_once(q[j] - r, q[i]), q[i]);
            let down = sub_mod(x[i], reduce_once(r, q[i]), q[i]);
            x[i] = inner.rescale_inv[j][i].mul(select(neg, up, down), q[i]);
        }
    }
    // Exact CRT into [0, Q').
    let big_q = inner.crt_modulus;
    let mut acc: u128 = 0;
    for i in 0..inner.crt_limbs {
        acc += inner.crt_hat_inv[i].mul(x[i], q[i]) as u128 * inner.crt_basis[i];
        let t = acc.wrapping_sub(big_q);
        acc = t.wrapping_add(big_q & 0u128.wrapping_sub(t >> 127));
    }
    let p = inner.final_modulus;
    reduce_once(round_ratio(acc, p, big_q), p)
}

/// round(a·num/den) exactly, for a < den ≤ 2^110 and num < 2^62 (so the result is ≤ num),
/// in constant time: an f64 estimate k (off by at most 2^6: a few roundings of relative size
/// 2^-53 on a value below 2^62, and truncation instead of rounding), its remainder
/// a·num − k·den computed exactly in wrapping 128-bit arithmetic (|remainder| ≤ 2^7·den <
/// 2^118, so wrapping is harmless), one f64 correction of that remainder (exact to within
/// one unit, truncated), and two branch-free ±1 steps. Only native conversions (64-bit halves,
/// truncation): `u128 as f64` and `f64::round` are library calls on the baseline x86-64
/// target and cost more than the arithmetic around them.
pub(crate) fn round_ratio(a: u128, num: u64, den: u128) -> u64 {
    let num = num as u128;
    let k = (u128_to_f64(a) * (num as f64 / u128_to_f64(den))) as i128;
    let rem = a
        .wrapping_mul(num)
        .wrapping_sub((k as u128).wrapping_mul(den)) as i128;
    let step = (i128_to_f64(rem) / u128_to_f64(den)) as i128;
    let (mut k, mut rem) = (k + step, rem - step * den as i128);
    let half = (den / 2) as i128;
    for _ in 0..2 {
        let up = ((half - rem) >> 127) & 1; // rem > half
        let down = ((rem + half) >> 127) & 1; // rem < −half
        k += up - down;
        rem -= (up - down) * den as i128;
    }
    k as u64
}

/// u128 → f64 from its two 64-bit halves.
#[inline]
fn u128_to_f64(a: u128) -> f64 {
    ((a >> 64) as u64 as f64) * 18_446_744_073_709_551_616.0 + (a as u64 as f64)
}

/// i128 → f64 from its signed high half and unsigned low half.
#[inline]
fn i128_to_f64(a: i128) -> f64 {
    ((a >> 64) as i64 as f64) * 18_446_744_073_709_551_616.0 + (a as u64 as f64)
}

/// Uniform in [-2^bits, 2^bits).
fn sample_flood(prg: &mut Prg, bits: u32) -> i128 {
    let mut b = [0u8; 16];
    prg.fill(&mut b);
    let r = u128::from_le_bytes(b) & ((1u128 << (bits + 1)) - 1);
    r as i128 - (1i128 << bits)
}

/// x mod q for |x| < 2^126 (the flood), by a public-divisor reduction of |x| and a
/// branch-free sign fix-up.
fn residue_i128(x: i128, q: u64) -> u64 {
    let r = (x.unsigned_abs() % q as u128) as u64;
    select(sign_mask((x >> 64) as u64), neg_mod(r, q), r)
}

impl Accumulator {
    /// Hardens the accumulated product into a response that reveals only
    /// `[product + add]` at `positions` (all mod t), see the module docs.
    ///
    /// Refuses ([`veil_core::Error::Insecure`]) when the public bounds of the plaintexts
    /// multiplied in exceed the flooding budget, or when the session's key would reveal more
    /// than 2^[`crate::params::SESSION_REVEALED_LOG2`] coefficients in total.
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
        let (tail, worst) = p.product_noise_bounds(self.l1, self.l2sq);
        p.budget().check(tail + self.extra, worst + self.extra)?;
        pk.reserve_revealed(positions.len())?;
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
                let e = residue_i128(noise, q);
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
        assert!(c1_out.iter().all(|&v| v < pf), "switched c1 out of range");
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
        self.count_revealed(positions.len());
        let mut cs = r.c1.clone();
        inner.final_plan.fwd(&mut cs);
        inner
            .final_plan
            .mul_assign_normalize(&mut cs, &self.s_final_ntt);
        inner.final_plan.inv(&mut cs);
        let d = inner.budget.c0_drop_bits;
        let out = positions
            .iter()
            .zip(&r.c0)
            .map(|(&j, &c0)| {
                let c0 = reduce_once(c0 << d, pf);
                decode_coefficient(p, add_mod(c0, cs[j], pf))
            })
            .collect();
        cs.zeroize();
        Ok(out)
    }
}

/// round(t·x/p) mod t for a residue x mod p: the centred lift is unnecessary, since shifting x
/// by p shifts the result by t.
fn decode_coefficient(p: &Params, x: u64) -> u64 {
    let ring = p.ring();
    ring.reduce(round_ratio(
        x as u128,
        1 << ring.bits(),
        p.final_modulus() as u128,
    ))
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
    (0..n)
        .map(|j| {
            for (i, xi) in x.iter_mut().enumerate() {
                *xi = c0.data[i * n + j];
            }
            decode_coefficient(p, switch_coefficient(inner, &mut x))
        })
        .collect()
}

#[cfg(test)]
fn negate(p: &Params, v: &[u64]) -> Vec<u64> {
    let n = p.degree();
    let mut out = v.to_vec();
    for (limb, &q) in out.chunks_exact_mut(n).zip(p.moduli()) {
        for x in limb {
            *x = neg_mod(*x, q);
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
        // ℓ = 48: the switch rounding is budgeted by its tail bound there.
        for (set, bits) in [(ParamSet::N8192, 41), (ParamSet::N8192Q4L48, 48)] {
            check_flooded_within_budget(Params::new(set, Ring::new(bits).unwrap()).unwrap());
        }
    }

    fn check_flooded_within_budget(p: Params) {
        let mut g = Prg::from_seed(&Seed([4; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let pk = sk.public_key(&mut g);
        let n = p.degree();
        let mut m = vec![0u64; n];
        g.fill_ring(p.ring(), &mut m);
        let mut acc = Accumulator::new(&p);
        let ev = EvalCiphertext::expand(&p, &sk.encrypt(&m, &mut g).unwrap());
        acc.mul_acc(&p, &ev, &NttPlaintext::new(&p, &[1], 1).unwrap());
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
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([8; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let pk = sk.public_key(&mut g);
        let ct = sk.encrypt(&[1, 2, 3], &mut g).unwrap();
        let mut acc = Accumulator::new(&p);
        acc.mul_acc(
            &p,
            &EvalCiphertext::expand(&p, &ct),
            &NttPlaintext::new(&p, &[1], 1).unwrap(),
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

    /// round(a·num/den) by binary long division over 192 bits: the oracle for `round_ratio`.
    fn round_ratio_reference(a: u128, num: u64, den: u128) -> u64 {
        // v = a·num + den/2 as (hi, lo) in base 2^128.
        let (a_hi, a_lo) = (a >> 64, a & u64::MAX as u128);
        let lo_prod = a_lo * num as u128;
        let hi_prod = a_hi * num as u128 + (lo_prod >> 64);
        let mut hi = hi_prod >> 64;
        let mut lo = (hi_prod << 64) | (lo_prod & u64::MAX as u128);
        let (sum, carry) = lo.overflowing_add(den / 2);
        lo = sum;
        hi += carry as u128;
        let (mut quot, mut rem) = (0u128, 0u128);
        for bit in (0..256).rev() {
            let b = if bit >= 128 {
                (hi >> (bit - 128)) & 1
            } else {
                (lo >> bit) & 1
            };
            rem = (rem << 1) | b;
            quot <<= 1;
            if rem >= den {
                rem -= den;
                quot |= 1;
            }
        }
        quot as u64
    }

    /// The switch's rounding is exact at the extremes the parameter checks allow (Q' up to 2^110,
    /// p up to 2^62) and at rounding boundaries, not only for the named sets.
    #[test]
    fn switch_rounding_is_exact_for_extreme_moduli() {
        let p = Params::custom(8192, 36, 3, 62, Ring::new(41).unwrap()).unwrap();
        let inner = p.inner();
        assert!(inner.crt_modulus > 1 << 106);
        let (den, num) = (inner.crt_modulus, inner.final_modulus);
        let mut g = Prg::from_seed(&Seed([12; 16]));
        let mut cases: Vec<u128> = vec![0, 1, den - 1, den / 2, den / 2 + 1];
        // Values whose exact quotient is just below / above a half.
        for k in [1u128, 7, 1 << 18] {
            let boundary = (2 * k + 1) * den / (2 * num as u128);
            cases.extend([boundary.saturating_sub(1), boundary, boundary + 1]);
        }
        for _ in 0..2000 {
            cases.push(((g.u64() as u128) << 64 | g.u64() as u128) % den);
        }
        for a in cases.into_iter().filter(|&a| a < den) {
            assert_eq!(
                round_ratio(a, num, den),
                round_ratio_reference(a, num, den),
                "a = {a}"
            );
            // Through the whole switch (RNS residues of a).
            let mut x: Vec<u64> = p.moduli().iter().map(|&q| (a % q as u128) as u64).collect();
            let want = round_ratio_reference(a, num, den) % num;
            assert_eq!(switch_coefficient(inner, &mut x), want);
        }
    }

    /// The flood before switching is as wide as the security argument needs: the visible noise
    /// after switching must have the spread of a uniform flood of width 2^FLOOD_MARGIN_BITS times
    /// the largest hidden noise the budget accepts (fails if the flood is removed or narrowed).
    #[test]
    fn flood_is_wide_enough_for_the_session_margin() {
        for (set, bits) in [
            (ParamSet::N8192, 41),
            (ParamSet::N8192Q4, 41),
            (ParamSet::N8192Q4L48, 48),
        ] {
            let p = Params::new(set, Ring::new(bits).unwrap()).unwrap();
            let b = p.budget();
            // Largest hidden noise the check accepts, by bisection on log2.
            let (mut lo, mut hi) = (0.0f64, 126.0f64);
            for _ in 0..60 {
                let mid = (lo + hi) / 2.0;
                if b.check(2f64.powf(mid), 1.0).is_ok() {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            let needed_width = 2f64.powf(lo + crate::params::FLOOD_MARGIN_BITS);
            let mut g = Prg::from_seed(&Seed([13; 16]));
            let sk = SecretKey::generate(&p, &mut g);
            let pk = sk.public_key(&mut g);
            let n = p.degree();
            let mut acc = Accumulator::new(&p);
            let ev = EvalCiphertext::expand(&p, &sk.encrypt(&[], &mut g).unwrap());
            acc.mul_acc(&p, &ev, &NttPlaintext::new(&p, &[1], 1).unwrap());
            let positions: Vec<usize> = (0..n).collect();
            let r = acc
                .into_response(&pk, &positions, &vec![0; n], &mut g)
                .unwrap();
            let noise = visible_noise(&sk, &r, &positions, &vec![0; n]);
            let var = noise.iter().map(|v| v * v).sum::<f64>() / n as f64;
            let dropped_var = 2f64.powi(2 * (b.headroom_bits as i32 - 2)) / 3.0;
            let flood_sd = (var - dropped_var).max(0.0).sqrt() * 2f64.powf(b.log2_q_over_p);
            // A uniform flood of width W has standard deviation W/√12.
            assert!(
                flood_sd > 0.9 * needed_width / 12f64.sqrt(),
                "{set:?}: flood sd 2^{:.1} < needed 2^{:.1}",
                flood_sd.log2(),
                (needed_width / 12f64.sqrt()).log2()
            );
        }
    }

    /// One key reveals at most 2^28 coefficients; beyond that responses are refused.
    #[test]
    fn session_limit_is_enforced() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([14; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let pk = sk.public_key(&mut g);
        let clone = pk.clone();
        clone
            .reserve_revealed(crate::params::SESSION_REVEALED_LIMIT as usize - 2)
            .unwrap();
        assert!(Accumulator::new(&p)
            .into_response(&pk, &[0, 1], &[0, 0], &mut g)
            .is_ok());
        assert!(matches!(
            Accumulator::new(&p).into_response(&pk, &[0], &[0], &mut g),
            Err(veil_core::Error::Insecure(_))
        ));
    }
}
