//! Galois keys and hybrid key switching: the server applies the automorphisms
//! σ_k: X ↦ X^k (k = 1 + N/u, u = 1, 2, 4, …, 2^(levels−1), levels = [`Params::galois_levels`])
//! to ciphertexts under the client's key, which is what [`crate::pack`] needs to merge many
//! sparse responses into one. Every level's key costs limbs digits × log2(Q·P)·N bits on the
//! wire and is used the same way, so a switch costs the same at every level.
//!
//! # Keys
//! For each level and each RNS limb i (the CRT "digit") the client sends, modulo Q·P with the
//! special prime P of the parameter set ([`Params::special_modulus`]),
//! b_i = −a_i·s + e_i + P·g_i·σ_k(s), with a_i expanded from one 16-byte seed and
//! g_i = (Q/q_i)·[(Q/q_i)^{-1}]_{q_i}, the CRT idempotent (≡ 1 mod q_i, ≡ 0 mod q_j), so that
//! Σ_i d_i·g_i ≡ c (mod Q) for the digits d_i = [c]_{q_i}, the residues themselves. Security: RLWE samples under the same ternary s at modulus
//! Q·P, log2(Q·P) within the HE-standard bound (checked when P is chosen); like every
//! key-switching key they also assume circular security of σ_k(s) under s, as in SEAL, OpenFHE,
//! Cheetah, BumbleBee.
//!
//! # Switching and its noise
//! For (c0, c1) decrypting under s to φ, (σ(c0), σ(c1)) decrypts under σ(s) to σ(φ). With
//! centred digits d_i of σ(c1), (acc0, acc1) = Σ_i d_i·(b_i, a_i) mod Q·P decrypts to
//! P·σ(c1)·σ(s) + Σ d_i·e_i; dividing by P with rounding and adding σ(c0) gives a ciphertext
//! under s with phase σ(φ) + E, where, coefficient-wise and in the worst case (e_i ∈ [−η, η]
//! exactly, |d_i| ≤ q_i/2, ternary s),
//! |E| ≤ Σ_i (q_i/2)·N·η / P + (1 + N)/2 + 1 = [`ks_noise_bound`].
//! All arithmetic on secret-dependent values (digits, residues) is branch-free.

use veil_core::{Error, Prg, Result, Seed};
use zeroize::{Zeroize, Zeroizing};

use crate::keys::SecretKey;
use crate::math::{
    add_mod, fill_uniform_mod, reduce_once, sample_cbd, sign_mask, signed_mod, small_signed_mod,
    sub_mod, Barrett, ShoupConst, CBD_ETA,
};
use crate::params::{Params, Special};
use crate::poly::RnsPoly;

/// Automorphism levels of every set's Galois keys (u = 1, 2, …, 32): responses whose useful
/// coefficients have any stride up to 2^6 = 64 can be packed under any set.
pub const MIN_GALOIS_LEVELS: usize = 6;

/// Automorphism levels of the decoder's set ([`crate::ParamSet::N8192Q4L48`]): strides up to
/// 2^9 = 512, the widest inner blocks its single-row (decode-step) products pick (GPT-2's
/// 3072 → 768 takes 512; a tenth level, 1024, is picked by no decoder shape and would add
/// ≈ 0.9 MB to the set-up).
pub const MAX_GALOIS_LEVELS: usize = 9;

/// The Galois element of level `level` (u = 2^level): k = 1 + N/u, the automorphism that maps
/// X^u to −X^u and fixes X^{2u}.
pub(crate) fn galois_element(n: usize, level: usize) -> usize {
    1 + (n >> level)
}

/// The client's Galois keys for every level (server side: public data).
pub struct GaloisKeys {
    pub(crate) params: Params,
    pub(crate) seed: Seed,
    /// b per level, laid out (digit i, extended limb r, coefficient) with limb L = P; NTT domain.
    pub(crate) b: Vec<Vec<u64>>,
    /// a per level, same layout, expanded from `seed`.
    pub(crate) a: Vec<Vec<u64>>,
}

pub(crate) fn special(p: &Params) -> Result<&Special> {
    p.inner().special.as_ref().ok_or_else(|| {
        Error::InvalidArgument(
            "parameter set leaves no room for a key-switching prime under the HE-standard bound"
                .into(),
        )
    })
}

/// Modulus of extended limb r (the RNS primes, then P).
fn ext_modulus(p: &Params, sp: &Special, r: usize) -> u64 {
    p.moduli().get(r).copied().unwrap_or(sp.modulus)
}

fn ext_plan<'a>(p: &'a Params, sp: &'a Special, r: usize) -> &'a tfhe_ntt::prime64::Plan {
    p.inner().plans.get(r).unwrap_or(&sp.plan)
}

/// The uniform `a` parts of every level's key from one seed (NTT domain).
pub(crate) fn expand_key_masks(p: &Params, seed: &Seed) -> Result<Vec<Vec<u64>>> {
    let sp = special(p)?;
    let (n, l) = (p.degree(), p.limbs());
    let mut prg = Prg::from_seed(seed);
    Ok((0..p.galois_levels())
        .map(|_| {
            let mut a = vec![0u64; l * (l + 1) * n];
            for (idx, chunk) in a.chunks_exact_mut(n).enumerate() {
                fill_uniform_mod(&mut prg, ext_modulus(p, sp, idx % (l + 1)), chunk);
            }
            a
        })
        .collect())
}

/// σ_k on signed coefficients: X^j ↦ ±X^{jk mod N}.
fn automorph_signed(x: &[i64], k: usize) -> Vec<i64> {
    let n = x.len();
    let mut out = vec![0i64; n];
    for (j, &v) in x.iter().enumerate() {
        let idx = (j * k) & (2 * n - 1); // N is a power of two
        if idx < n {
            out[idx] = v;
        } else {
            out[idx - n] = -v;
        }
    }
    out
}

/// σ_k on a coefficient-domain RNS polynomial.
fn automorph(p: &Params, x: &RnsPoly, k: usize) -> RnsPoly {
    let n = p.degree();
    let mut out = RnsPoly::zero(p);
    for ((src, dst), &q) in x
        .data
        .chunks_exact(n)
        .zip(out.data.chunks_exact_mut(n))
        .zip(p.moduli())
    {
        for (j, &v) in src.iter().enumerate() {
            let idx = (j * k) & (2 * n - 1); // N is a power of two
            if idx < n {
                dst[idx] = v;
            } else {
                dst[idx - n] = crate::math::neg_mod(v, q);
            }
        }
    }
    out
}

impl SecretKey {
    /// The secret's signed coefficients (from −s in limb 0; caller zeroizes).
    fn secret_coefficients(&self) -> Vec<i64> {
        let p = &self.params;
        let n = p.degree();
        let q = p.moduli()[0];
        let mut neg = self.neg_s_ntt[..n].to_vec();
        let plan = &p.inner().plans[0];
        plan.inv(&mut neg);
        plan.normalize(&mut neg);
        // neg holds −s mod q ∈ {0, 1, q − 1}; its centred lift c gives s = −c.
        let s = neg
            .iter()
            .map(|&v| {
                let high = sign_mask((q / 2).wrapping_sub(v));
                -((v as i64) - (q & high) as i64)
            })
            .collect();
        neg.zeroize();
        s
    }

    /// Galois keys for every level (sent once per session; see the module docs).
    pub fn galois_keys(&self, prg: &mut Prg) -> Result<GaloisKeys> {
        let p = &self.params;
        let sp = special(p)?;
        let (n, l) = (p.degree(), p.limbs());
        // Secret-dependent buffers are wiped when dropped, on the error paths too.
        let s = Zeroizing::new(self.secret_coefficients());
        // −s in the NTT domain of every extended limb.
        let mut neg_s = Zeroizing::new(vec![0u64; (l + 1) * n]);
        for (r, chunk) in neg_s.chunks_exact_mut(n).enumerate() {
            let m = ext_modulus(p, sp, r);
            for (o, &c) in chunk.iter_mut().zip(s.iter()) {
                *o = signed_mod(-c, m);
            }
            ext_plan(p, sp, r).fwd(chunk);
        }
        let seed = Seed(prg.block());
        let a = expand_key_masks(p, &seed)?;
        let mut b = Vec::with_capacity(a.len());
        for (level, a_level) in a.iter().enumerate() {
            let rot = Zeroizing::new(automorph_signed(&s, galois_element(n, level)));
            let mut bl = vec![0u64; l * (l + 1) * n];
            for i in 0..l {
                let e = Zeroizing::new(sample_cbd(prg, n));
                for r in 0..=l {
                    let m = ext_modulus(p, sp, r);
                    let off = (i * (l + 1) + r) * n;
                    let out = &mut bl[off..off + n];
                    for (o, &c) in out.iter_mut().zip(e.iter()) {
                        *o = signed_mod(c, m);
                    }
                    if r == i {
                        // P·g_i ≡ P (mod q_i) and ≡ 0 modulo every other limb and P.
                        let pm = ShoupConst::new(sp.p_mod_q[i], m);
                        for (o, &c) in out.iter_mut().zip(rot.iter()) {
                            *o = add_mod(*o, pm.mul(signed_mod(c, m), m), m);
                        }
                    }
                    let plan = ext_plan(p, sp, r);
                    plan.fwd(out);
                    plan.mul_accumulate(out, &a_level[off..off + n], &neg_s[r * n..(r + 1) * n]);
                }
            }
            b.push(bl);
        }
        Ok(GaloisKeys {
            params: p.clone(),
            seed,
            b,
            a,
        })
    }
}

/// Worst-case noise one key switch adds (see the module docs).
pub(crate) fn ks_noise_bound(p: &Params) -> Result<f64> {
    let sp = special(p)?;
    let n = p.degree() as f64;
    let digits: f64 = p
        .moduli()
        .iter()
        .map(|&q| q as f64 / 2.0 * n * CBD_ETA as f64)
        .sum();
    Ok(digits / sp.modulus as f64 + (1.0 + n) / 2.0 + 1.0)
}

impl GaloisKeys {
    /// The parameters the keys were made for.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// (σ_k(c0), σ_k(c1)) switched back to the key s, for k = [`galois_element`]`(N, level)`;
    /// inputs and outputs in the coefficient domain.
    pub(crate) fn rotate(&self, level: usize, c0: &RnsPoly, c1: &RnsPoly) -> (RnsPoly, RnsPoly) {
        let p = &self.params;
        let sp = special(p).expect("keys exist only with a special prime");
        let (n, l) = (p.degree(), p.limbs());
        let k = galois_element(n, level);
        // Digits are centred residues, |d| ≤ q_i/2, and every extended modulus exceeds the
        // largest q_i/2 (equal-sized primes, P > q_i/2), so one masked addition reduces a digit
        // into any limb.
        let half_max = p.moduli().iter().max().expect("at least one limb") / 2;
        assert!(
            (0..=l).all(|r| ext_modulus(p, sp, r) > half_max),
            "key-switching moduli too small for centred digits"
        );
        let mut out0 = automorph(p, c0, k);
        let c1 = automorph(p, c1, k);
        let (b, a) = (&self.b[level], &self.a[level]);
        let mut acc0 = vec![0u64; (l + 1) * n];
        let mut acc1 = vec![0u64; (l + 1) * n];
        let mut digit = vec![0i64; n];
        let mut buf = vec![0u64; n];
        for (i, &q) in p.moduli().iter().enumerate() {
            for (d, &v) in digit.iter_mut().zip(&c1.data[i * n..(i + 1) * n]) {
                // Centred: v > q/2 stands for v − q.
                *d = v as i64 - (q & sign_mask((q / 2).wrapping_sub(v))) as i64;
            }
            for r in 0..=l {
                let m = ext_modulus(p, sp, r);
                if r == i {
                    buf.copy_from_slice(&c1.data[i * n..(i + 1) * n]);
                } else {
                    for (o, &d) in buf.iter_mut().zip(&digit) {
                        *o = small_signed_mod(d, m);
                    }
                }
                let plan = ext_plan(p, sp, r);
                plan.fwd(&mut buf);
                let off = (i * (l + 1) + r) * n;
                plan.mul_accumulate(&mut acc0[r * n..(r + 1) * n], &buf, &b[off..off + n]);
                plan.mul_accumulate(&mut acc1[r * n..(r + 1) * n], &buf, &a[off..off + n]);
            }
        }
        for acc in [&mut acc0, &mut acc1] {
            for (r, chunk) in acc.chunks_exact_mut(n).enumerate() {
                let plan = ext_plan(p, sp, r);
                plan.inv(chunk);
                plan.normalize(chunk);
            }
        }
        // Divide by P with rounding: (x − [x]_P)/P, with the centred residue [x]_P. Its
        // residue mod q_j is (x_P mod q_j) − (P mod q_j)·[x_P > P/2]: x_P < P is reduced by
        // one masked subtraction when P < 2·q_j, by a Barrett step when P is wider (the
        // four-limb sets). The differences go through `buf`, then tfhe-ntt's vectorised
        // product by P^{-1} (the scalar product was the largest part of a switch).
        let (pm, half) = (sp.modulus, sp.modulus / 2);
        let mut out1 = RnsPoly::zero(p);
        for (acc, out, add) in [(&acc0, &mut out0, true), (&acc1, &mut out1, false)] {
            let (low, top) = acc.split_at(l * n);
            for (j, &q) in p.moduli().iter().enumerate() {
                let p_mod_q = sp.p_mod_q[j];
                let barrett = Barrett::new(q);
                let p_below_2q = pm < 2 * q;
                for ((d, &x), &xp) in buf.iter_mut().zip(&low[j * n..(j + 1) * n]).zip(top) {
                    let r = if p_below_2q {
                        reduce_once(xp, q)
                    } else {
                        barrett.reduce(xp, q)
                    };
                    let reduced = sub_mod(r, p_mod_q & sign_mask(half.wrapping_sub(xp)), q);
                    *d = sub_mod(x, reduced, q);
                }
                p.inner().plans[j].mul_assign_normalize(&mut buf, &sp.p_inv_scaled[j]);
                let dst = &mut out.data[j * n..(j + 1) * n];
                if add {
                    for (o, &v) in dst.iter_mut().zip(&buf) {
                        *o = add_mod(*o, v, q);
                    }
                } else {
                    dst.copy_from_slice(&buf);
                }
            }
        }
        buf.zeroize();
        digit.zeroize();
        (out0, out1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ParamSet, SecretKey};
    use veil_core::{ensure, Ring};

    /// Phase c0 + c1·s (coefficient domain, centred, limb 0 only: enough for small values).
    fn phase(sk: &SecretKey, c0: &RnsPoly, c1: &RnsPoly) -> Vec<i64> {
        let p = &sk.params;
        let n = p.degree();
        let q = p.moduli()[0];
        let plan = &p.inner().plans[0];
        let mut x = c1.data[..n].to_vec();
        plan.fwd(&mut x);
        let mut s = sk.neg_s_ntt[..n].to_vec();
        for v in &mut s {
            *v = crate::math::neg_mod(*v, q);
        }
        plan.mul_assign_normalize(&mut x, &s);
        plan.inv(&mut x);
        x.iter()
            .zip(&c0.data[..n])
            .map(|(&a, &b)| {
                let v = add_mod(a, b, q);
                if v > q / 2 {
                    v as i64 - q as i64
                } else {
                    v as i64
                }
            })
            .collect()
    }

    /// A key switch maps an encryption of m to one of σ_k(m), with noise within the bound, at
    /// every level of every parameter set (the decoder's up to [`MAX_GALOIS_LEVELS`]).
    #[test]
    fn rotation_applies_the_automorphism_within_the_noise_bound() {
        for (set, bits) in [
            (ParamSet::N8192, 41),
            (ParamSet::N8192Q4, 41),
            (ParamSet::N8192Q4L48, 48),
        ] {
            let p = Params::new(set, Ring::new(bits).unwrap()).unwrap();
            let n = p.degree();
            let mut g = Prg::from_seed(&Seed([21; 16]));
            let sk = SecretKey::generate(&p, &mut g);
            let gk = sk.galois_keys(&mut g).unwrap();
            assert_eq!(gk.b.len(), set.galois_levels());
            // A trivial-noise "ciphertext" of m: c1 uniform, c0 = m − c1·s.
            let m: Vec<i64> = (0..n as i64).map(|j| (j * 7919) % 1000 - 500).collect();
            let mut c1 = RnsPoly::zero(&p);
            for (limb, &q) in c1.limbs_mut(n).zip(p.moduli()) {
                fill_uniform_mod(&mut g, q, limb);
            }
            let mut c0 = RnsPoly::from_signed(&p, &m);
            c0.ntt(&p);
            let mut c1n = c1.clone();
            c1n.ntt(&p);
            c0.mul_acc(&p, &c1n.data, &sk.neg_s_ntt);
            c0.intt(&p);
            assert_eq!(phase(&sk, &c0, &c1), m);
            let bound = ks_noise_bound(&p).unwrap();
            for level in 0..p.galois_levels() {
                let (r0, r1) = gk.rotate(level, &c0, &c1);
                let want = automorph_signed(&m, galois_element(n, level));
                let got = phase(&sk, &r0, &r1);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .max()
                    .unwrap();
                assert!(
                    (worst as f64) < bound,
                    "{set:?} level {level}: noise {worst} ≥ {bound}"
                );
                assert!(worst > 0, "key switching noise vanished: suspicious");
            }
        }
    }

    #[test]
    fn galois_elements_and_secret_recovery() {
        assert_eq!(galois_element(8192, 0), 8193);
        assert_eq!(galois_element(8192, 5), 257);
        assert_eq!(galois_element(8192, MAX_GALOIS_LEVELS - 1), 33);
        assert_eq!(ParamSet::N8192.galois_levels(), MIN_GALOIS_LEVELS);
        assert_eq!(ParamSet::N8192Q4L48.galois_levels(), MAX_GALOIS_LEVELS);
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([22; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let s = sk.secret_coefficients();
        assert!(s.iter().all(|&c| (-1..=1).contains(&c)));
        assert!((-1..=1).all(|v| s.iter().filter(|&&c| c == v).count() > 2000));
        assert!(ensure_room().is_ok());
    }

    fn ensure_room() -> Result<()> {
        for (set, bits) in [
            (ParamSet::N8192, 41),
            (ParamSet::N8192Q4, 41),
            (ParamSet::N8192Q4L48, 48),
        ] {
            let p = Params::new(set, Ring::new(bits).unwrap())?;
            let pm = p.special_modulus().expect("room for P");
            ensure!(
                p.log2_q() + (pm as f64).log2() <= 218.0,
                Insecure,
                "Q·P too large"
            );
        }
        Ok(())
    }
}
