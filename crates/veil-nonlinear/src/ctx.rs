//! [`Ctx`]: one party's handle on a running two-party computation (OT session, channel, role and
//! the fixed-point format), with the primitive operations on raw share slices that the function
//! and layer protocols are written in. Every operation mirrors one step of `veil_core::approx`.
//! The elementary functions and the layers are methods of [`Ctx`] too, each beside its
//! algorithm (`elementary`, `layers`).

use veil_core::{approx::Approx, CostClass, Result, Ring, RingTensor};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::boolean::{bool_to_arith, mux};
use crate::compare::{drelu_batch, drelu_values, Thresholds};
use crate::mul::{
    mul_narrow_high_values, mul_narrow_values, mul_server_row, mul_server_row_high,
    mul_server_row_narrow, mul_values, square_narrow_values, square_values, Narrow,
};
use crate::trunc::{extend_values, truncate_into, truncate_values, TruncMode};

/// One party's handle on a running two-party computation, and the crate's whole public surface:
/// both parties build one over their OT session and channel and call the same methods with their
/// own shares. The format `ax` and the truncation mode are part of the protocol: both parties
/// must use the same ones.
pub struct Ctx<'a, C: Channel> {
    /// This party's end of the OT session.
    pub ot: &'a mut OtSession,
    /// The channel to the peer.
    pub ch: &'a mut C,
    /// Which party this is.
    pub role: Role,
    /// The fixed-point format and the approximations' parameters (`veil_core::approx`).
    pub ax: Approx,
    /// Truncation used inside the function protocols: `Faithful` reproduces `approx` exactly.
    pub trunc_mode: TruncMode,
    /// BFV keys for the row-wise HE products ([`crate::he_rows`]); without them every product
    /// runs on COTs. Set only through [`Ctx::with_he`], which checks them.
    pub(crate) he: Option<HeKeys<'a>>,
}

/// This party's BFV keys (veil-he, plaintext modulus 2^ℓ of the context's ring; share operands
/// need a set that floods them: `ParamSet::N8192Q4` for ℓ ≤ 41, `ParamSet::N8192Q4L48`'s 24-bit
/// limbs for ℓ = 48).
#[derive(Clone, Copy)]
pub enum HeKeys<'a> {
    /// The client's secret key.
    Client(&'a veil_he::SecretKey),
    /// The client's public key (re-randomisation) and Galois keys (response packing).
    Server(&'a veil_he::PublicKey, &'a veil_he::GaloisKeys),
}

impl<'a> HeKeys<'a> {
    /// The share-product keys of the client's linear session over `ring`
    /// ([`veil_he::session::shared_set`]: `N8192Q4` up to ℓ = 41, `N8192Q4L48` for the
    /// decoder's ℓ = 48, whose share scalars are multiplied as 24-bit limbs).
    pub fn client(s: &'a veil_he::session::ClientSession, ring: Ring) -> Result<Self> {
        Ok(HeKeys::Client(s.key(veil_he::session::shared_set(ring))?))
    }

    /// The server's side of [`HeKeys::client`].
    pub fn server(s: &'a veil_he::session::ServerSession, ring: Ring) -> Result<Self> {
        let (pk, gk) = s.keys_for(veil_he::session::shared_set(ring))?;
        Ok(HeKeys::Server(pk, gk))
    }

    pub(crate) fn params(&self) -> &veil_he::Params {
        match self {
            HeKeys::Client(sk) => sk.params(),
            HeKeys::Server(pk, _) => pk.params(),
        }
    }
}

impl<'a, C: Channel> Ctx<'a, C> {
    /// A context computing exactly the `approx` semantics (faithful truncation).
    pub fn new(ot: &'a mut OtSession, ch: &'a mut C, role: Role, ax: Approx) -> Self {
        Ctx {
            ot,
            ch,
            role,
            ax,
            trunc_mode: TruncMode::Faithful,
            he: None,
        }
    }

    /// Adds BFV keys (this party's side) for the row-wise HE products. The keys' plaintext ring
    /// must be the format's ring and the key must belong to this party's role. Like the format,
    /// this is part of the protocol both parties run: give both contexts keys or neither (the
    /// operators pick their path from it, so a mismatch desynchronises the transcript, which then
    /// fails with a message-size or decoding error).
    pub fn with_he(mut self, keys: HeKeys<'a>) -> Result<Self> {
        veil_core::ensure!(
            keys.params().ring() == self.ring(),
            InvalidArgument,
            "HE keys for Z_2^{} in a context over Z_2^{}",
            keys.params().ring().bits(),
            self.ring().bits()
        );
        veil_core::ensure!(
            matches!(
                (self.role, keys),
                (Role::Client, HeKeys::Client(_)) | (Role::Server, HeKeys::Server(..))
            ),
            InvalidArgument,
            "HE keys of the other party's role"
        );
        self.he = Some(keys);
        Ok(self)
    }

    /// The ring of the format.
    pub fn ring(&self) -> Ring {
        self.ax.fp.ring
    }

    /// Whether this party is the server.
    pub fn is_server(&self) -> bool {
        self.role == Role::Server
    }

    /// Adds a public constant to the shared values (the server adds it to its share).
    pub fn add_public(&self, v: &mut [u64], c: u64) {
        self.add_public_in(self.ring(), v, c);
    }

    /// [`Ctx::add_public`] on shares of `ring`.
    pub fn add_public_in(&self, ring: Ring, v: &mut [u64], c: u64) {
        if self.is_server() {
            v.iter_mut().for_each(|x| *x = ring.add(*x, c));
        }
    }

    /// The shares of a public constant.
    pub fn public(&self, n: usize, c: u64) -> Vec<u64> {
        vec![if self.is_server() { c } else { 0 }; n]
    }

    /// Element-wise a·b of two shared vectors.
    pub fn mul(&mut self, a: &[u64], b: &[u64]) -> Result<Vec<u64>> {
        self.mul_in(self.ring(), a, b)
    }

    /// Product in another ring (e.g. a narrow one, on shares reduced into it).
    pub fn mul_in(&mut self, ring: Ring, a: &[u64], b: &[u64]) -> Result<Vec<u64>> {
        mul_values(self.ot, self.ch, self.role, ring, a, b)
    }

    /// a·b for a narrow a (SiRNN's mixed-width product: only the m + 1 bits of a drive COTs;
    /// exact under the promise `nw`, otherwise not a·b).
    pub fn mul_narrow(&mut self, a: &[u64], nw: Narrow, b: &[u64]) -> Result<Vec<u64>> {
        self.mul_narrow_in(self.ring(), a, nw, b)
    }

    /// [`Ctx::mul_narrow`] on shares of `ring`.
    pub fn mul_narrow_in(
        &mut self,
        ring: Ring,
        a: &[u64],
        nw: Narrow,
        b: &[u64],
    ) -> Result<Vec<u64>> {
        mul_narrow_values(self.ot, self.ch, self.role, ring, a, nw, b)
    }

    /// ⌊a·b / 2^s⌋ for a narrow a (promise `nw`, m = its bits), |a·b| < 2^(ℓ−2) and
    /// |a·b| / 2^s < 2^(out−1) − 2.
    /// * `Faithful`: [`Ctx::mul_narrow`] then the faithful truncation (exactly `approx`).
    /// * `OneBitError`: the product's high part only (its COTs carry the bits above the
    ///   truncation), then a short truncation delivered in the full ring: ⌊a·b / 2^s⌋ + c,
    ///   c ∈ {−3, …, 2}. Four flights (the product's three, then the truncation's
    ///   COT, whose corrections ride on the product's last flight).
    pub fn mul_narrow_trunc(
        &mut self,
        a: &[u64],
        nw: Narrow,
        b: &[u64],
        s: u32,
        out: u32,
    ) -> Result<Vec<u64>> {
        let (ot_ring, role) = (self.ring(), self.role);
        self.fused_trunc(
            s,
            out,
            (nw.bits() + 1).min(s) + 1,
            |cx| {
                let p = cx.mul_narrow(a, nw, b)?;
                cx.trunc(&p, s)
            },
            |cx, t, n| mul_narrow_high_values(cx.ot, cx.ch, role, ot_ring, a, nw, b, t, n),
        )
    }

    /// ⌊a·γ / 2^s⌋ for the server's γ ∈ [−2^(g−1), 2^(g−1)) broadcast over rows of `row`
    /// ([`Ctx::mul_server_narrow`]), |a·γ| < 2^(ℓ−2) and |a·γ| / 2^s < 2^(out−1) − 2; modes as
    /// [`Ctx::mul_narrow_trunc`].
    #[allow(clippy::too_many_arguments)]
    pub fn mul_server_trunc(
        &mut self,
        a: &[u64],
        row: usize,
        gamma: Option<&[u64]>,
        g: u32,
        s: u32,
        out: u32,
    ) -> Result<Vec<u64>> {
        let role = self.role;
        self.fused_trunc(
            s,
            out,
            (g.min(s) + 2).div_ceil(2),
            |cx| {
                let p = cx.mul_server_narrow(a, row, gamma, g)?;
                cx.trunc(&p, s)
            },
            |cx, sh, n| {
                let x = RingTensor::from_vec(cx.ring(), &[a.len() / row.max(1), row], a.to_vec())?;
                mul_server_row_high(cx.ot, cx.ch, role, &x, gamma, g, sh, n)
            },
        )
    }

    /// A product P followed by a truncation by s, for |P| / 2^s < 2^(out−1) − 2. `Faithful` (or
    /// too small an s) runs `exact`. `OneBitError` runs `high(t, n)`, the product's high part
    /// P / 2^t + e mod 2^n with |e| ≤ `max_err` < 2^(g+1), at g guard bits below 2^s (t = s − g)
    /// on n = out + g + 1 bits (at most ℓ − t): its COTs carry n bits instead of up to ℓ. That
    /// value lies in (−2^(n−2), 2^(n−2)), the head-room the 1-bit-error truncation by g needs;
    /// it is truncated straight into the ℓ-bit ring (one COT: `trunc::truncate_into`). Result ⌊P / 2^s⌋ + c, c ∈ {−3, …, 2}: |e| / 2^g < 2 moves
    /// the floor by at most two either way, the truncation by one down. The worst case needs
    /// most rounding errors of one sign; typically |e| / 2^g is a fraction of an ulp. Needs
    /// |P| < 2^(ℓ−2).
    pub(crate) fn fused_trunc(
        &mut self,
        s: u32,
        out: u32,
        max_err: u32,
        exact: impl FnOnce(&mut Self) -> Result<Vec<u64>>,
        high: impl FnOnce(&mut Self, u32, u32) -> Result<Vec<u64>>,
    ) -> Result<Vec<u64>> {
        let l = self.ring().bits();
        // 2^(g+1) > max_err: |e| / 2^g < 2.
        let g = (32 - max_err.leading_zeros()).saturating_sub(1).max(1);
        if self.trunc_mode == TruncMode::Faithful || s <= g {
            return exact(self);
        }
        let t = s - g;
        let n = (out + g + 1).min(l - t);
        // The truncation and extension need a share ring of at least RingBits::MIN bits: the
        // n-bit value sits in the top bits of a k-bit ring.
        let k = n.max(veil_core::RingBits::MIN);
        if k >= l {
            return exact(self);
        }
        let hi = high(self, t, n)?;
        let kr = Ring::new(k)?;
        let up: Vec<u64> = hi.iter().map(|&v| kr.reduce(v << (k - n))).collect();
        let _g = self.ch.meter().enter(CostClass::Truncation);
        let ring = self.ring();
        truncate_into(
            self.ot,
            self.ch,
            self.role,
            kr,
            ring,
            &up,
            g + k - n,
            self.trunc_mode,
        )
    }

    /// a² for a narrow a (one cross term on the m + 1 bits of a; exact under the promise `nw`).
    pub fn square_narrow(&mut self, a: &[u64], nw: Narrow) -> Result<Vec<u64>> {
        self.square_narrow_in(self.ring(), a, nw)
    }

    /// [`Ctx::square_narrow`] on shares of `ring`.
    pub fn square_narrow_in(&mut self, ring: Ring, a: &[u64], nw: Narrow) -> Result<Vec<u64>> {
        square_narrow_values(self.ot, self.ch, self.role, ring, a, nw)
    }

    /// Element-wise a².
    pub fn square(&mut self, a: &[u64]) -> Result<Vec<u64>> {
        self.square_in(self.ring(), a)
    }

    /// [`Ctx::square`] on shares of `ring`.
    pub fn square_in(&mut self, ring: Ring, a: &[u64]) -> Result<Vec<u64>> {
        square_values(self.ot, self.ch, self.role, ring, a)
    }

    /// ⌊a / 2^s⌋ with the context's truncation mode.
    pub fn trunc(&mut self, a: &[u64], s: u32) -> Result<Vec<u64>> {
        self.trunc_in(self.ring(), a, s)
    }

    /// [`Ctx::trunc`] on shares of `ring`.
    pub fn trunc_in(&mut self, ring: Ring, a: &[u64], s: u32) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Truncation);
        truncate_values(self.ot, self.ch, self.role, ring, a, s, self.trunc_mode)
    }

    /// ⌊(a + 2^(s−1)) / 2^s⌋ (approx::round) with faithful truncation. In the one-bit-error
    /// mode, a/2^s rounded stochastically: ⌊a/2^s⌋ or ⌊a/2^s⌋ + 1, unbiased, |error| < 1 ulp.
    /// (That mode's truncation of y is ⌊y/2^s⌋ − c, where the carry c of the two shares' low
    /// bits is 1 with probability 1 − (y mod 2^s + 1)/2^s over the uniform shares, so its
    /// mean is y/2^s − 1 + 2^−s; truncating a + 2^s centres it. Adding 2^(s−1) instead, as the
    /// faithful rounding does, would leave every rounding half an ulp low on average, and a sum
    /// of many rounded values — a long Softmax row — that many half ulps low.)
    pub fn round(&mut self, a: &[u64], s: u32) -> Result<Vec<u64>> {
        self.round_in(self.ring(), a, s)
    }

    /// [`Ctx::round`] on shares of `ring`.
    pub fn round_in(&mut self, ring: Ring, a: &[u64], s: u32) -> Result<Vec<u64>> {
        let offset = match self.trunc_mode {
            TruncMode::Faithful => 1u64 << (s - 1),
            TruncMode::OneBitError => 1u64 << s,
        };
        let mut v = a.to_vec();
        self.add_public_in(ring, &mut v, offset);
        self.trunc_in(ring, &v, s)
    }

    /// Sign extension of values |x| < 2^(k−2) from the narrow ring `from` to the format's ring.
    pub fn extend(&mut self, from: Ring, a: &[u64]) -> Result<Vec<u64>> {
        self.extend_to(from, self.ring(), a)
    }

    /// Sign extension of values |x| < 2^(k−2) from the ring `from` to the wider ring `to`.
    pub fn extend_to(&mut self, from: Ring, to: Ring, a: &[u64]) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Extension);
        extend_values(self.ot, self.ch, self.role, from, to, a)
    }

    /// ⌊a·b / 2^s⌋ with the context's truncation mode.
    pub fn mul_trunc(&mut self, a: &[u64], b: &[u64], s: u32) -> Result<Vec<u64>> {
        let p = self.mul(a, b)?;
        self.trunc(&p, s)
    }

    /// Product by a public constant, then truncation by s.
    pub fn scale_trunc(&mut self, a: &[u64], c: u64, s: u32) -> Result<Vec<u64>> {
        let r = self.ring();
        let p: Vec<u64> = a.iter().map(|&x| r.mul(x, c)).collect();
        self.trunc(&p, s)
    }

    /// a·γ for a server-private γ broadcast over rows of length γ.len() (server: Some).
    pub fn mul_server(&mut self, a: &[u64], row: usize, gamma: Option<&[u64]>) -> Result<Vec<u64>> {
        let t = RingTensor::from_vec(self.ring(), &[a.len() / row.max(1), row], a.to_vec())?;
        Ok(mul_server_row(self.ot, self.ch, self.role, &t, gamma)?.into_data())
    }

    /// a·γ as [`Ctx::mul_server`] for a γ the server promises in [−2^(g−1), 2^(g−1)): g bits of
    /// γ drive the COTs instead of ℓ; a γ outside is an error on the server.
    pub fn mul_server_narrow(
        &mut self,
        a: &[u64],
        row: usize,
        gamma: Option<&[u64]>,
        g: u32,
    ) -> Result<Vec<u64>> {
        let t = RingTensor::from_vec(self.ring(), &[a.len() / row.max(1), row], a.to_vec())?;
        Ok(mul_server_row_narrow(self.ot, self.ch, self.role, &t, gamma, g)?.into_data())
    }

    /// XOR shares of [a ≥ 0]; `bound` promises |a| < 2^bound, so fewer bits are compared.
    pub fn drelu(&mut self, a: &[u64], bound: Option<u32>) -> Result<Vec<bool>> {
        self.drelu_in(self.ring(), a, bound)
    }

    /// [`Ctx::drelu`] on shares of `ring` (approx::drelu_bounded for any input).
    pub fn drelu_in(&mut self, ring: Ring, a: &[u64], bound: Option<u32>) -> Result<Vec<bool>> {
        let _g = self.ch.meter().enter(CostClass::DRelu);
        drelu_values(self.ot, self.ch, self.role, ring, a, bound)
    }

    /// [`Ctx::drelu_in`] on `plain`, then [s ≥ 2^j] for every set of thresholds, in one batch
    /// (`compare::drelu_batch`: the thresholds of one value share their low digits' leaves).
    pub(crate) fn drelu_thresholds_in(
        &mut self,
        ring: Ring,
        plain: &[u64],
        sets: &[Thresholds],
        bound: Option<u32>,
    ) -> Result<Vec<bool>> {
        let _g = self.ch.meter().enter(CostClass::DRelu);
        drelu_batch(self.ot, self.ch, self.role, ring, plain, sets, bound)
    }

    /// b ? v : 0 for XOR-shared bits b.
    pub fn mux(&mut self, b: &[bool], v: &[u64]) -> Result<Vec<u64>> {
        self.mux_in(self.ring(), b, v)
    }

    /// [`Ctx::mux`] on shares of `ring`.
    pub fn mux_in(&mut self, ring: Ring, b: &[bool], v: &[u64]) -> Result<Vec<u64>> {
        mux(self.ot, self.ch, self.role, ring, b, v)
    }

    /// max(a, 0), with [`Ctx::drelu`]'s `bound`.
    pub fn relu(&mut self, a: &[u64], bound: Option<u32>) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Relu);
        let b = self.drelu(a, bound)?;
        self.mux(&b, a)
    }

    /// The sign bits [x ≥ 0], ReLU(x) and |x| = 2·ReLU(x) − x: the odd-symmetric split GELU and
    /// SiLU start from (|x| wraps only at x = −2^(ℓ−1)), the sign with [`Ctx::drelu`]'s `bound`.
    pub(crate) fn relu_and_abs(
        &mut self,
        x: &[u64],
        bound: Option<u32>,
    ) -> Result<(Vec<bool>, Vec<u64>, Vec<u64>)> {
        let ring = self.ring();
        let pos = self.drelu(x, bound)?;
        let r = self.mux(&pos, x)?;
        let a = r
            .iter()
            .zip(x)
            .map(|(&p, &v)| ring.sub(ring.add(p, p), v))
            .collect();
        Ok((pos, r, a))
    }

    /// Additive shares of XOR-shared bits.
    pub fn b2a(&mut self, b: &[bool]) -> Result<Vec<u64>> {
        bool_to_arith(self.ot, self.ch, self.role, self.ring(), b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_harness::{fp, pick, run_mem, share_values};
    use veil_core::Prg;

    /// The high part of a narrow product is a·b / 2^t + e mod 2^n with |e| ≤ min(m+1, t) + 1, and
    /// the fused product-truncation of the 1-bit-error mode is ⌊a·b / 2^s⌋ + {−3, …, 2} (the
    /// faithful mode exactly ⌊a·b / 2^s⌋), for operands at the edges of their promises.
    #[test]
    fn fused_product_truncation_is_within_its_bound() {
        let mut prg = Prg::from_os_entropy();
        let ring = fp().ring;
        let ax = Approx::new(fp()).unwrap();
        // (m, s, out): ReLU-normalise's, Softmax's and LayerNorm's shapes.
        // Unsigned: ReLU-normalise's ReLU outputs 0 ≤ r < 2^24.
        for (signed, m, s, out) in [
            (true, 25u32, 24u32, 16u32),
            (false, 24, 24, 15),
            (true, 15, 24, 16),
            (true, 24, 19, 22),
            (true, 24, 19, 19),
        ] {
            let nw = if signed {
                Narrow::signed(m)
            } else {
                Narrow::unsigned(m)
            };
            // |a| < 2^mag; b reaches the contract's edge |a·b| / 2^s → 2^(out−1) − 3 (and |a·b| < 2^39).
            let mag = if signed { m - 1 } else { m };
            let lim = 1i64 << mag;
            let blim = ((((1i64 << (out - 1)) - 3) << s) >> mag).min(1i64 << (39 - mag));
            let (mut sa, mut sb): (Vec<i64>, Vec<i64>) = if signed {
                (
                    vec![0, 1, -1, lim - 1, -lim + 1, lim - 1, -lim + 1, 0],
                    vec![blim - 1, blim - 1, -blim + 1, blim - 1, blim - 1, 0, 1, -1],
                )
            } else {
                (
                    vec![0, 1, lim - 1, lim - 1, lim - 2, 0],
                    vec![blim - 1, -blim + 1, blim - 1, -blim + 1, 1, -1],
                )
            };
            for _ in 0..200 {
                sa.push(if signed {
                    (prg.u64() % (2 * lim as u64)) as i64 - lim
                } else {
                    (prg.u64() % lim as u64) as i64
                });
                sb.push((prg.u64() % (2 * blim as u64)) as i64 - blim);
            }
            let a: Vec<u64> = sa.iter().map(|&v| ring.from_signed(v)).collect();
            let b: Vec<u64> = sb.iter().map(|&v| ring.from_signed(v)).collect();
            let (x, y) = (share_values(ring, &a), share_values(ring, &b));
            let g = (32 - ((m + 1).min(s) + 1).leading_zeros()) - 1;
            let (t, n) = (s - g, (out + g + 1).min(ring.bits() - (s - g)));
            let out2 = run_mem(|ot, ch, role| {
                let (xs, ys) = (pick(role, &x).data(), pick(role, &y).data());
                let hi = mul_narrow_high_values(ot, ch, role, ring, xs, nw, ys, t, n)?;
                let mut cx = Ctx::new(ot, ch, role, ax);
                let exact = cx.mul_narrow_trunc(xs, nw, ys, s, out)?;
                cx.trunc_mode = TruncMode::OneBitError;
                let cheap = cx.mul_narrow_trunc(xs, nw, ys, s, out)?;
                Ok((hi, exact, cheap))
            });
            let (c, sv) = out2;
            for i in 0..a.len() {
                let p = sa[i] as i128 * sb[i] as i128;
                // got − ⌊a·b / 2^t⌋ = e + frac(a·b / 2^t), as a signed n-bit value.
                let want_hi = (p >> t) as i64;
                let diff = c.0[i].wrapping_add(sv.0[i]).wrapping_sub(want_hi as u64) << (64 - n);
                let e = (diff as i64) >> (64 - n);
                let bound = (m + 1).min(t) as i64 + 1;
                assert!(
                    (-bound..=bound).contains(&e),
                    "m={m} t={t}: high part of {}·{} off by {e}",
                    sa[i],
                    sb[i]
                );
                let want = (p >> s) as i64;
                assert_eq!(
                    ring.to_signed(ring.add(c.1[i], sv.1[i])),
                    want,
                    "faithful {}·{} >> {s}",
                    sa[i],
                    sb[i]
                );
                let d = want - ring.to_signed(ring.add(c.2[i], sv.2[i]));
                assert!(
                    (-2..=3).contains(&d),
                    "fused {}·{} >> {s} off by {d}",
                    sa[i],
                    sb[i]
                );
            }
        }
    }
}
