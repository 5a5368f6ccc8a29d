//! Output packing: merges up to `leaves` accumulators whose useful coefficients sit on one
//! residue class modulo a power-of-two stride into a single ciphertext, so the server sends one
//! c1 for all of them instead of one each (Chen–Dai–Kim–Song's PackLWEs, generalised from
//! constant terms to a stride, as BumbleBee and NEXUS use for matrix products).
//!
//! # The merge
//! Let π keep the coefficients at multiples of the stride s and zero the rest. After
//! multiplying member r by X^{−offset} (its useful coefficients move to multiples of s) and by
//! L^{-1} mod Q (L = `leaves`, invertible since Q is odd — t = 2^ℓ is not, which is why the
//! factor L is removed modulo Q), the recursion
//! Pack(g, u) = A + X^u·B + σ_{1+N/u}(A − X^u·B), A = Pack(even members, 2u),
//! B = Pack(odd members, 2u), Pack([g], u) = g, started at u₀ = s/L, yields a ciphertext whose
//! phase at every coefficient ≡ 0 (mod u₀) is exactly Σ_r X^{u₀·r}·π(phase_r): σ_{1+N/u} fixes
//! X^{2u} and negates X^u, so A + σ(A) and X^u·B − σ(X^u·B) double the wanted classes and
//! cancel the others. Member r's coefficient at `pos` therefore lands at
//! (pos − offset) + u₀·r ([`PackShape::position`]), with its plaintext and its noise unchanged.
//! Coefficients ≢ 0 (mod u₀) hold sums of unrelated ones and must never be sent: the caller
//! asks the response for the packed positions only.
//!
//! **Partial groups.** Members fill the first leaves, so a node can lack its odd side (never
//! its even one). Such a node is 2A, without the key switch: σ would only clear A's class
//! ≡ u (mod 2u), where the absent odd members' coefficients would land, and every ancestor
//! keeps those positions on absent members' places (σ_{1+N/u} maps each class mod u to
//! itself), which are never sent either. Packing r members thus costs r − 1 key switches.
//!
//! # Noise
//! Each internal node adds at most one key switch (≤ E = [`crate::galois::ks_noise_bound`]);
//! each ancestor at most doubles it (x ↦ x ± σ(x), or 2x). With D = log2 L levels the added noise is at
//! most Σ_{d<D} 2^d·2^d·E = (4^D − 1)/3·E, public and worst-case, carried in the accumulator
//! so the response's flooding and decryption checks include it.

use veil_core::parallel::join;
use veil_core::{ensure, Result};

use crate::cipher::Accumulator;
use crate::galois::{ks_noise_bound, GaloisKeys, MAX_GALOIS_LEVELS};
use crate::math::{inv_mod, ShoupConst};
use crate::params::Params;
use crate::poly::RnsPoly;

/// Where the useful coefficients of the members are and how many members one packed
/// ciphertext holds. Public, derived from the matrix layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackShape {
    /// Power of two ≤ 2^[`crate::Params::galois_levels`] of the keys that pack (at most
    /// 2^[`MAX_GALOIS_LEVELS`]): useful coefficients are ≡ `offset` (mod stride).
    pub stride: usize,
    /// Power of two in 2..=stride: members per packed ciphertext.
    pub leaves: usize,
    /// Coefficient of each member's first useful value (its class modulo the stride).
    pub offset: usize,
}

type Ct = (RnsPoly, RnsPoly);

impl PackShape {
    /// A merge of up to `leaves` members whose useful coefficients sit at `offset` + multiples of
    /// `stride`; refused unless both are powers of two the largest Galois keys can serve
    /// ([`GaloisKeys::pack`] checks the stride against its own keys' levels).
    pub fn new(stride: usize, leaves: usize, offset: usize) -> Result<Self> {
        ensure!(
            stride.is_power_of_two()
                && stride <= 1 << MAX_GALOIS_LEVELS
                && leaves.is_power_of_two()
                && (2..=stride).contains(&leaves)
                && offset < stride,
            InvalidArgument,
            "packing needs power-of-two 2 ≤ leaves ≤ stride ≤ {} and offset < stride \
             (got stride {stride}, leaves {leaves}, offset {offset})",
            1 << MAX_GALOIS_LEVELS
        );
        Ok(PackShape {
            stride,
            leaves,
            offset,
        })
    }

    /// Coefficient of the packed ciphertext holding member `member`'s coefficient `pos`
    /// (pos ≡ offset mod stride).
    pub fn position(&self, pos: usize, member: usize) -> usize {
        pos - self.offset + self.stride / self.leaves * member
    }

    /// Key switches to pack `members` (≤ leaves) ciphertexts: one per merge node with members
    /// on both sides (a node with an even side only doubles it), so r members cost r − 1.
    pub fn key_switches(&self, members: usize) -> usize {
        members.min(self.leaves).saturating_sub(1)
    }

    /// Worst-case noise the merge adds: (4^D − 1)/3 key switches' worth, D = log2 leaves.
    pub fn noise_bound(&self, p: &Params) -> Result<f64> {
        let depth = self.leaves.trailing_zeros() as i32;
        Ok((4f64.powi(depth) - 1.0) / 3.0 * ks_noise_bound(p)?)
    }
}

impl GaloisKeys {
    /// Packs 1..=leaves accumulators (member r = `accs[r]`) into one; see the module docs.
    pub fn pack(&self, accs: Vec<Accumulator>, shape: &PackShape) -> Result<Accumulator> {
        let p = &self.params;
        let n = p.degree();
        ensure!(
            (1..=shape.leaves).contains(&accs.len())
                && shape.stride <= n
                && shape.stride <= 1 << self.b.len(),
            InvalidArgument,
            "cannot pack {} ciphertexts into {} leaves at stride {} with {} key levels",
            accs.len(),
            shape.leaves,
            shape.stride,
            self.b.len()
        );
        // (L·N)^-1: L^-1 for the merge, N^-1 the inverse transform's normalisation.
        let linv: Vec<ShoupConst> = p
            .moduli()
            .iter()
            .map(|&q| {
                let ln = (shape.leaves as u128 * n as u128 % q as u128) as u64;
                ShoupConst::new(inv_mod(ln, q), q)
            })
            .collect();
        let (mut l1, mut l2sq, mut extra) = (0f64, 0f64, 0f64);
        let mut members: Vec<Option<Ct>> = Vec::with_capacity(shape.leaves);
        for acc in accs {
            (l1, l2sq, extra) = (l1.max(acc.l1), l2sq.max(acc.l2sq), extra.max(acc.extra));
            members.push(Some((acc.c0, acc.c1)));
        }
        members.resize_with(shape.leaves, || None);
        // A member enters the tree in coefficient form, its useful class moved to 0 mod stride.
        let enter = |(mut c0, mut c1): Ct| {
            for c in [&mut c0, &mut c1] {
                c.intt_scaled(p, &linv);
                if shape.offset > 0 {
                    *c = c.monomial_mul(p, 2 * n - shape.offset);
                }
            }
            (c0, c1)
        };
        let (mut c0, mut c1) = self
            .merge(members, shape.stride / shape.leaves, &enter)
            .expect("at least one member");
        join(|| c0.ntt(p), || c1.ntt(p));
        Ok(Accumulator {
            c0,
            c1,
            l1,
            l2sq,
            extra: extra + shape.noise_bound(p)?,
        })
    }

    /// The recursion of the module docs; the two subtrees are merged in parallel (every node
    /// is a key switch, milliseconds), and each leaf enters through `enter`.
    fn merge(
        &self,
        cts: Vec<Option<Ct>>,
        u: usize,
        enter: &(impl Fn(Ct) -> Ct + Sync),
    ) -> Option<Ct> {
        if cts.len() == 1 {
            return cts.into_iter().next().flatten().map(enter);
        }
        let (mut even, mut odd) = (Vec::new(), Vec::new());
        for (i, c) in cts.into_iter().enumerate() {
            if i % 2 == 0 {
                even.push(c)
            } else {
                odd.push(c)
            }
        }
        let (a, b) = join(
            || self.merge(even, 2 * u, enter),
            || self.merge(odd, 2 * u, enter),
        );
        if a.is_none() && b.is_none() {
            return None;
        }
        let p = &self.params;
        let (mut s0, mut s1) = a.unwrap_or_else(|| (RnsPoly::zero(p), RnsPoly::zero(p)));
        let level = u.trailing_zeros() as usize;
        match b {
            Some((b0, b1)) => {
                let (x0, x1) = (b0.monomial_mul(p, u), b1.monomial_mul(p, u));
                let (mut t0, mut t1) = (s0.clone(), s1.clone());
                t0.sub_assign(p, &x0);
                t1.sub_assign(p, &x1);
                s0.add_assign(p, &x0);
                s1.add_assign(p, &x1);
                let (r0, r1) = self.rotate(level, &t0, &t1);
                s0.add_assign(p, &r0);
                s1.add_assign(p, &r1);
            }
            // No odd member: A + σ(A) would only clear the classes where the absent members'
            // values would go, which are never sent; doubling A keeps the scale without a
            // key switch.
            None => {
                s0.double_assign(p);
                s1.double_assign(p);
            }
        }
        Some((s0, s1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EvalCiphertext, NttPlaintext, ParamSet, SecretKey};
    use veil_core::{Prg, Ring, Seed};

    /// Members with random plaintexts in all coefficients: after packing, every member's
    /// coefficients on the stride class decrypt exactly at their packed positions (full and
    /// partial groups, u₀ = 1 and u₀ > 1, offset 0 and not), for every parameter set, up to the
    /// decoder's largest stride with a merge through all its key levels (u₀ = 1, D = 9: the
    /// noise bound's largest multiple, (4^9 − 1)/3, within the flooding check).
    #[test]
    fn packed_members_decrypt_exactly() {
        for (set, stride, leaves, offset, members) in [
            (ParamSet::N8192, 16, 16, 15, 16),
            (ParamSet::N8192, 64, 8, 63, 5),
            (ParamSet::N8192Q4, 4, 4, 0, 3),
            (ParamSet::N8192, 2, 2, 1, 1),
            (ParamSet::N8192Q4L48, 64, 8, 63, 8),
            (ParamSet::N8192Q4L48, 256, 16, 255, 16),
            (ParamSet::N8192Q4L48, 512, 512, 511, 3),
        ] {
            let bits = if set == ParamSet::N8192Q4L48 { 48 } else { 41 };
            let p = Params::new(set, Ring::new(bits).unwrap()).unwrap();
            let n = p.degree();
            let mut g = Prg::from_seed(&Seed([31; 16]));
            let sk = SecretKey::generate(&p, &mut g);
            let pk = sk.public_key(&mut g);
            let gk = sk.galois_keys(&mut g).unwrap();
            let shape = PackShape::new(stride, leaves, offset).unwrap();
            let mut msgs = Vec::new();
            let mut accs = Vec::new();
            for _ in 0..members {
                let mut m = vec![0u64; n];
                g.fill_ring(p.ring(), &mut m);
                let mut acc = Accumulator::new(&p);
                let ct = EvalCiphertext::expand(&p, &sk.encrypt(&m, &mut g).unwrap());
                acc.mul_acc(&p, &ct, &NttPlaintext::new(&p, &[1], 1).unwrap());
                accs.push(acc);
                msgs.push(m);
            }
            let packed = gk.pack(accs, &shape).unwrap();
            let mut positions = Vec::new();
            let mut want = Vec::new();
            for (r, m) in msgs.iter().enumerate() {
                for pos in (offset..n).step_by(stride) {
                    positions.push(shape.position(pos, r));
                    want.push(m[pos]);
                }
            }
            let zeros = vec![0; positions.len()];
            let resp = packed
                .into_response(&pk, &positions, &zeros, &mut g)
                .unwrap();
            assert_eq!(
                sk.decrypt_response(&resp, &positions).unwrap(),
                want,
                "{set:?} stride {stride} leaves {leaves}"
            );
        }
    }

    /// Keys pack only strides their levels reach: the encoder's sets' keys refuse a stride the
    /// decoder's serve.
    #[test]
    fn keys_refuse_strides_beyond_their_levels() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let mut g = Prg::from_seed(&Seed([32; 16]));
        let sk = SecretKey::generate(&p, &mut g);
        let gk = sk.galois_keys(&mut g).unwrap();
        let accs = || vec![Accumulator::new(&p); 2];
        assert!(gk.pack(accs(), &PackShape::new(64, 2, 0).unwrap()).is_ok());
        let e = gk.pack(accs(), &PackShape::new(128, 2, 0).unwrap()).err();
        assert!(e.unwrap().to_string().contains("6 key levels"));
    }

    #[test]
    fn shapes_are_validated_and_counted() {
        assert!(PackShape::new(1024, 2, 0).is_err());
        assert!(PackShape::new(512, 512, 511).is_ok());
        assert!(PackShape::new(16, 32, 0).is_err());
        assert!(PackShape::new(16, 3, 0).is_err());
        assert!(PackShape::new(16, 4, 16).is_err());
        let s = PackShape::new(16, 8, 3).unwrap();
        assert_eq!(s.position(3, 0), 0);
        assert_eq!(s.position(19, 7), 16 + 14);
        assert_eq!(s.key_switches(8), 7);
        assert_eq!(s.key_switches(1), 0);
        assert_eq!(s.key_switches(5), 4);
    }
}
