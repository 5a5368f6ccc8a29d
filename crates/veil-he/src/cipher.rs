//! Encoding, seeded secret-key encryption (client) and plaintext × ciphertext
//! multiply-accumulate in the NTT domain (server).

use veil_core::{ensure, Prg, Result, Seed};
use zeroize::Zeroize;

use crate::keys::{expand_uniform_ntt, SecretKey};
use crate::math::{add_mod, reduce_once, sample_cbd, signed_mod, small_signed_mod};
use crate::params::Params;
use crate::poly::RnsPoly;

/// round(Q·m/t) mod q_i for a plaintext polynomial m with coefficients in [0, t).
///
/// Scaling by the exact rational Q/t (rather than ⌊Q/t⌋) is what makes products with plaintexts
/// cheap in noise: w·round(Q·m/t) = (Q/t)·(w·m) + w·ε with |ε| ≤ 1/2, and the multiple of Q
/// hidden in (Q/t)·t·k vanishes, so no noise term proportional to t appears (SEAL's
/// "scaling variant" of plaintext multiplication).
pub(crate) fn scaled_message(p: &Params, m: &[u64]) -> RnsPoly {
    let mut out = RnsPoly::zero(p);
    let n = p.degree();
    // No skipping of zero coefficients: the message is secret, so the work must not depend on it.
    for (j, &mj) in m.iter().enumerate() {
        for (i, v) in scaled_coefficient(p, mj).enumerate() {
            out.data[i * n + j] = v;
        }
    }
    out
}

/// round(Q·m/t) mod q_i for one m in [0, t), for every limb i (at most 8 limbs).
pub(crate) fn scaled_coefficient(p: &Params, m: u64) -> impl Iterator<Item = u64> + '_ {
    let inner = p.inner();
    let t_bits = p.ring().bits();
    let frac = ((inner.q_mod_t as u128 * m as u128 + (1u128 << (t_bits - 1))) >> t_bits) as u64;
    // m < t and frac < Q mod t < t; with t ≤ 2·q (ℓ no wider than the primes plus one bit, a
    // public fact) one branch-free subtraction reduces them, instead of two divisions.
    p.moduli().iter().zip(&inner.delta).map(move |(&q, d)| {
        let reduce = |x: u64| {
            if t_bits < 64 && 1u64 << t_bits <= 2 * q {
                reduce_once(x, q)
            } else {
                x % q
            }
        };
        add_mod(d.mul(reduce(m), q), reduce(frac), q)
    })
}

fn check_message(p: &Params, m: &[u64]) -> Result<()> {
    ensure!(
        m.len() <= p.degree(),
        InvalidArgument,
        "plaintext of {} coefficients exceeds N = {}",
        m.len(),
        p.degree()
    );
    ensure!(
        m.iter().all(|&x| p.ring().contains(x)),
        InvalidArgument,
        "plaintext coefficient outside Z_2^{}",
        p.ring().bits()
    );
    Ok(())
}

/// A fresh client ciphertext: c1 = a is given by its seed, c0 = -a·s + e + round(Q·m/t) is kept in
/// the NTT domain so the server needs no transform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeededCiphertext {
    pub(crate) seed: [u8; 16],
    pub(crate) c0_ntt: Vec<u64>,
}

impl SecretKey {
    /// Encrypts the plaintext polynomial with coefficients `m` (in Z_{2^ℓ}, length ≤ N).
    pub fn encrypt(&self, m: &[u64], prg: &mut Prg) -> Result<SeededCiphertext> {
        let p = &self.params;
        check_message(p, m)?;
        let seed = prg.block();
        let a = expand_uniform_ntt(p, &Seed(seed));
        let mut e = sample_cbd(prg, p.degree());
        let mut c0 = RnsPoly::from_signed(p, &e);
        e.zeroize();
        let mut scaled = scaled_message(p, m);
        c0.add_assign(p, &scaled);
        scaled.data.zeroize();
        c0.ntt(p);
        c0.mul_acc(p, &a.data, &self.neg_s_ntt);
        Ok(SeededCiphertext {
            seed,
            c0_ntt: c0.data,
        })
    }
}

/// A client ciphertext expanded on the server: both halves in the NTT domain.
pub struct EvalCiphertext {
    pub(crate) c0: RnsPoly,
    pub(crate) c1: RnsPoly,
}

impl EvalCiphertext {
    /// The full ciphertext: c1 regenerated from its seed, both parts in NTT form.
    pub fn expand(p: &Params, ct: &SeededCiphertext) -> Self {
        EvalCiphertext {
            c0: RnsPoly {
                data: ct.c0_ntt.clone(),
            },
            c1: expand_uniform_ntt(p, &Seed(ct.seed)),
        }
    }

    /// Adds the plaintext `m` (coefficients in Z_{2^ℓ}): the server folds its own share of the
    /// input into the client's ciphertext so one product covers both shares.
    pub fn add_plain(&mut self, p: &Params, m: &[u64]) -> Result<()> {
        check_message(p, m)?;
        let mut s = scaled_message(p, m);
        s.ntt(p);
        self.c0.add_assign(p, &s);
        s.data.zeroize();
        Ok(())
    }
}

/// A plaintext polynomial with signed coefficients (centred lift of Z_{2^ℓ} values) under a
/// public magnitude bound, transformed for multiplication. The bound, not the values, is what
/// the flooding check uses, so accepting or refusing a product never depends on a secret.
pub struct NttPlaintext {
    pub(crate) data: RnsPoly,
    /// Public bound on every |coefficient|.
    max_abs: u64,
    /// Coefficient slots (the length of the coefficient vector, a public shape).
    slots: usize,
}

fn check_bound(coeffs: &[i64], max_abs: u64) -> Result<()> {
    // One pass without early exit: the error is the only thing that depends on the values.
    let over = coeffs
        .iter()
        .fold(0u64, |acc, &c| acc | (c.unsigned_abs() > max_abs) as u64);
    ensure!(
        over == 0,
        Insecure,
        "plaintext coefficient above the declared public bound 2^{:.1}",
        (max_abs.max(1) as f64).log2()
    );
    Ok(())
}

impl NttPlaintext {
    /// `coeffs` are centred integers with |c| ≤ `max_abs` < 2^62 (else [`veil_core::Error::Insecure`]);
    /// length ≤ N.
    pub fn new(p: &Params, coeffs: &[i64], max_abs: u64) -> Result<Self> {
        ensure!(
            coeffs.len() <= p.degree() && max_abs < 1 << 62,
            InvalidArgument,
            "plaintext of {} coefficients exceeds N = {} (or bound ≥ 2^62)",
            coeffs.len(),
            p.degree()
        );
        check_bound(coeffs, max_abs)?;
        let mut data = RnsPoly::from_signed(p, coeffs);
        data.ntt(p);
        Ok(NttPlaintext {
            data,
            max_abs,
            slots: coeffs.len(),
        })
    }

    /// Re-uses this buffer for new coefficients under the same bound (saves an allocation).
    pub fn set(&mut self, p: &Params, coeffs: &[i64]) -> Result<()> {
        ensure!(
            coeffs.len() <= p.degree(),
            InvalidArgument,
            "plaintext of {} coefficients exceeds N",
            coeffs.len()
        );
        check_bound(coeffs, self.max_abs)?;
        let n = p.degree();
        for (limb, &q) in self.data.limbs_mut(n).zip(p.moduli()) {
            let (used, rest) = limb.split_at_mut(coeffs.len());
            rest.fill(0);
            if self.max_abs < q {
                // Every |c| < q (checked above): one masked addition each, which vectorises
                // (the general reduction is the weight transforms' largest cost outside the NTT).
                for (o, &c) in used.iter_mut().zip(coeffs) {
                    *o = small_signed_mod(c, q);
                }
            } else {
                for (o, &c) in used.iter_mut().zip(coeffs) {
                    *o = signed_mod(c, q);
                }
            }
        }
        self.data.ntt(p);
        self.slots = coeffs.len();
        Ok(())
    }
}

/// Σ plaintext_i × ciphertext_i, accumulated in the NTT domain, with the public noise bounds
/// of what was multiplied in (checked by [`Accumulator::into_response`]).
#[derive(Clone)]
pub struct Accumulator {
    pub(crate) c0: RnsPoly,
    pub(crate) c1: RnsPoly,
    /// Σ slots·max_abs and Σ slots·max_abs² of the plaintexts (public).
    pub(crate) l1: f64,
    pub(crate) l2sq: f64,
    /// Worst-case noise added after the products (key switching when packed), public.
    pub(crate) extra: f64,
}

impl Accumulator {
    /// An empty sum (zero ciphertext, zero noise bounds).
    pub fn new(p: &Params) -> Self {
        Accumulator {
            c0: RnsPoly::zero(p),
            c1: RnsPoly::zero(p),
            l1: 0.0,
            l2sq: 0.0,
            extra: 0.0,
        }
    }

    /// Adds ct × w, carrying w's public bound into the noise bounds.
    pub fn mul_acc(&mut self, p: &Params, ct: &EvalCiphertext, w: &NttPlaintext) {
        self.c0.mul_acc(p, &ct.c0.data, &w.data.data);
        self.c1.mul_acc(p, &ct.c1.data, &w.data.data);
        let (slots, m) = (w.slots as f64, w.max_abs as f64);
        self.l1 += slots * m;
        self.l2sq += slots * m * m;
    }

    /// Multiplies the accumulated product by the monomial X^e (0 ≤ e < 2N): a signed rotation of
    /// its coefficients, so members whose useful coefficients sit on different residues can be
    /// aligned for [`crate::GaloisKeys::pack`]. Exact; the noise and its bounds are unchanged.
    pub fn mul_monomial(&mut self, p: &Params, e: usize) {
        assert!(e < 2 * p.degree(), "monomial exponent {e} ≥ 2N");
        for c in [&mut self.c0, &mut self.c1] {
            c.intt(p);
            *c = c.monomial_mul(p, e);
            c.ntt(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ParamSet;
    use veil_core::{Prg, Ring};

    /// A re-used plaintext buffer equals a fresh one, whether the bound is below every modulus
    /// (the masked-addition path) or above them (the general reduction), for a shorter
    /// polynomial written over a longer one too.
    #[test]
    fn set_equals_new_below_and_above_the_moduli() {
        let p = Params::new(ParamSet::N8192Q4L48, Ring::new(48).unwrap()).unwrap();
        let mut prg = Prg::from_os_entropy();
        for bound in [1u64 << 16, (1 << 61) + 3] {
            let mut draw = |n: usize| -> Vec<i64> {
                (0..n)
                    .map(|_| (prg.u64() % (2 * bound + 1)) as i64 - bound as i64)
                    .collect()
            };
            let (long, short) = (draw(p.degree()), draw(100));
            let mut reused = NttPlaintext::new(&p, &long, bound).unwrap();
            reused.set(&p, &short).unwrap();
            let fresh = NttPlaintext::new(&p, &short, bound).unwrap();
            assert_eq!(reused.data, fresh.data, "bound {bound}");
            assert_eq!(reused.slots, 100);
            let mut over = short.clone();
            over[7] = bound as i64 + 1;
            assert!(reused.set(&p, &over).is_err());
        }
    }
}
