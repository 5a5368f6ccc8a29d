//! Polynomials in R_Q = Z_Q[X]/(X^N + 1) in RNS form (one residue vector per prime, limb-major),
//! transformed with tfhe-ntt. "NTT domain" means tfhe-ntt's unnormalised forward transform, in
//! which ring multiplication is a pointwise product.

use crate::math::signed_mod;
use crate::params::Params;

/// Residues of a polynomial modulo each RNS prime: `data[i * N + j]` is coefficient (or NTT
/// slot) j modulo prime i.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RnsPoly {
    pub data: Vec<u64>,
}

impl RnsPoly {
    pub(crate) fn zero(p: &Params) -> Self {
        RnsPoly {
            data: vec![0; p.limbs() * p.degree()],
        }
    }

    /// Small signed coefficients (length ≤ N, the rest zero) reduced into every limb.
    pub(crate) fn from_signed(p: &Params, coeffs: &[i64]) -> Self {
        let n = p.degree();
        let mut out = Self::zero(p);
        for (limb, &q) in out.data.chunks_exact_mut(n).zip(p.moduli()) {
            for (o, &c) in limb.iter_mut().zip(coeffs) {
                *o = signed_mod(c, q);
            }
        }
        out
    }

    pub(crate) fn limbs_mut(&mut self, n: usize) -> std::slice::ChunksExactMut<'_, u64> {
        self.data.chunks_exact_mut(n)
    }

    pub(crate) fn ntt(&mut self, p: &Params) {
        let n = p.degree();
        for (limb, plan) in self.data.chunks_exact_mut(n).zip(&p.inner().plans) {
            plan.fwd(limb);
        }
    }

    pub(crate) fn intt(&mut self, p: &Params) {
        let n = p.degree();
        for (limb, plan) in self.data.chunks_exact_mut(n).zip(&p.inner().plans) {
            plan.inv(limb);
            plan.normalize(limb);
        }
    }

    /// `self += a ⊙ b` in the NTT domain.
    pub(crate) fn mul_acc(&mut self, p: &Params, a: &[u64], b: &[u64]) {
        let n = p.degree();
        for (i, plan) in p.inner().plans.iter().enumerate() {
            let r = i * n..(i + 1) * n;
            plan.mul_accumulate(&mut self.data[r.clone()], &a[r.clone()], &b[r]);
        }
    }

    /// `self −= other` (either domain).
    pub(crate) fn sub_assign(&mut self, p: &Params, other: &RnsPoly) {
        let n = p.degree();
        for (i, &q) in p.moduli().iter().enumerate() {
            for (x, &y) in self.data[i * n..(i + 1) * n]
                .iter_mut()
                .zip(&other.data[i * n..(i + 1) * n])
            {
                *x = crate::math::sub_mod(*x, y, q);
            }
        }
    }

    /// Inverse transform whose 1/N normalisation is replaced by a multiplication by the public
    /// constant c_i of each limb (which must include N^-1): one pass instead of two when the
    /// result is scaled anyway.
    pub(crate) fn intt_scaled(&mut self, p: &Params, c: &[crate::math::ShoupConst]) {
        let n = p.degree();
        for (((limb, plan), &q), ci) in self
            .data
            .chunks_exact_mut(n)
            .zip(&p.inner().plans)
            .zip(p.moduli())
            .zip(c)
        {
            plan.inv(limb);
            for x in limb {
                *x = ci.mul(*x, q);
            }
        }
    }

    /// X^e · self for 0 ≤ e < 2N, coefficient domain (a signed rotation: X^N = −1).
    pub(crate) fn monomial_mul(&self, p: &Params, e: usize) -> RnsPoly {
        let n = p.degree();
        let (shift, flip) = (e % n, e >= n);
        let mut out = RnsPoly::zero(p);
        for ((src, dst), &q) in self
            .data
            .chunks_exact(n)
            .zip(out.data.chunks_exact_mut(n))
            .zip(p.moduli())
        {
            // Coefficients j < N − shift move up by `shift`; the rest wrap around with a sign.
            let (low, high) = src.split_at(n - shift);
            let neg = |x: u64| crate::math::neg_mod(x, q);
            for (d, &x) in dst[shift..].iter_mut().zip(low) {
                *d = if flip { neg(x) } else { x };
            }
            for (d, &x) in dst[..shift].iter_mut().zip(high) {
                *d = if flip { x } else { neg(x) };
            }
        }
        out
    }

    /// 2·self in place.
    pub(crate) fn double_assign(&mut self, p: &Params) {
        let n = p.degree();
        for (limb, &q) in self.data.chunks_exact_mut(n).zip(p.moduli()) {
            for x in limb {
                *x = crate::math::add_mod(*x, *x, q);
            }
        }
    }

    pub(crate) fn add_assign(&mut self, p: &Params, other: &RnsPoly) {
        let n = p.degree();
        for (i, &q) in p.moduli().iter().enumerate() {
            for (x, &y) in self.data[i * n..(i + 1) * n]
                .iter_mut()
                .zip(&other.data[i * n..(i + 1) * n])
            {
                *x = crate::math::add_mod(*x, y, q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ParamSet;
    use veil_core::Ring;

    /// Schoolbook negacyclic product over the integers, the oracle for the NTT path.
    fn negacyclic(a: &[i64], b: &[i64]) -> Vec<i128> {
        let n = a.len();
        let mut out = vec![0i128; n];
        for i in 0..n {
            for j in 0..n {
                let v = a[i] as i128 * b[j] as i128;
                if i + j < n {
                    out[i + j] += v;
                } else {
                    out[i + j - n] -= v;
                }
            }
        }
        out
    }

    #[test]
    fn ntt_product_is_negacyclic_convolution() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let n = p.degree();
        let a: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % 201 - 100).collect();
        let b: Vec<i64> = (0..n as i64).map(|i| (i * 104729) % 61 - 30).collect();
        let want = negacyclic(&a, &b);
        let (mut pa, mut pb) = (RnsPoly::from_signed(&p, &a), RnsPoly::from_signed(&p, &b));
        pa.ntt(&p);
        pb.ntt(&p);
        let mut acc = RnsPoly::zero(&p);
        acc.mul_acc(&p, &pa.data, &pb.data);
        acc.intt(&p);
        for (i, &q) in p.moduli().iter().enumerate() {
            for (j, w) in want.iter().enumerate() {
                assert_eq!(acc.data[i * n + j] as i128, w.rem_euclid(q as i128));
            }
        }
    }
}
