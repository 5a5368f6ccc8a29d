//! Element-wise functions on shares: exp (x ≤ 0), reciprocal, reciprocal square root, tanh, SiLU.
//!
//! Each runs, step for step, the algorithm of the same name in `veil_core::approx` (see there for
//! the method, the domain and the error against f64, measured over the whole domain):
//! * exp_neg: |error| ≤ 1.79 ulp on x ≤ 0 (clamped below −16); its squarings are narrow products
//!   (|p| ≤ 1), so the shares equal `approx` only on that domain;
//! * recip:   ≤ 1 ulp + 2^-12 relative on raw inputs [1, 2^24] (values [2^-13, 2048]), the
//!   quotient by Goldschmidt's two coupled steps (three rounds of products);
//! * rsqrt:   ≤ 1 ulp + 2^-14 relative on the same domain, by pieces: a quadratic on each
//!   of 8 pieces per octave of s, no Newton step;
//! * tanh:    ≤ 2.7 ulp on all x; in the 1-bit-error mode within 1e-3 (3.8e-4 measured).
//! * silu:    ≤ 1.8e-4 for every x (`approx::SILU_MAX_ERROR`), exactly ReLU from |x| = 12 on;
//!   the decoders' gated MLP. GELU's piecewise-cubic odd split with SiLU's constants
//!   (`Ctx::odd_split` in `layers`), no exp and no quotient.
//! * hard_swish_gated: hard-swish(x)·u, SiLU's substitute in the gated MLP, exactly
//!   `approx::hard_swish_gated` (error vs f64 `approx::HARD_SWISH_MAX_ERROR` at u = 1) on
//!   |x| < 2^RELU_DOMAIN_BITS − 3 and |x·u| < 2^15: one ReLU call on x ± 3 (the comparisons
//!   bounded), the product x·u, one truncation call for both the factor and x·u, and the
//!   factor's product. In the 1-bit-error mode each of the three truncations may land one unit
//!   low: the output is within 3 ulps + |x·u|·2^-18 of the faithful one.
//! * layer_norm_rsqrts: LayerNorm's (and RMSNorm's) √n/√S over the class range of its plan
//!   (see `approx::Approx::layer_norm_rsqrt`), the coarse and the fine sums in one pass.
//!
//! With [`TruncMode::Faithful`](crate::TruncMode) (the default of [`Ctx::new`]) the shares open to
//! exactly the integers `approx` computes; the tests check equality.
//!
//! Reciprocal and rsqrt need the bit length e of their input: DReLUs of s − 2^k for
//! k = 1 … K−1 (one batch, narrow when s has a known range; the reciprocal skips the thresholds
//! below a promised floor), converted to arithmetic shares; the one-hot class
//! h_e = c_(e−1) − c_e then selects public constants by a local linear combination. rsqrt
//! compares with 7 more thresholds inside each octave in the same batch, so the one-hot piece
//! selects a quadratic good to 6e-6 and no Newton iteration follows (LayerNorm and RMSNorm:
//! 30 flights fewer per norm, about 2 % more bytes). These comparisons are per row in the layers
//! (one reciprocal per Softmax row, one rsqrt per norm row), so they cost little per element.
//!
//! Security: semi-honest; compositions of the primitives' protocols.

use veil_core::approx::{LayerNormPlan, RsqrtPiece, EXP_QUAD_NUM, EXP_QUAD_SHIFT};
use veil_core::{ensure, CostClass, Result, Ring};
use veil_net::Channel;

use crate::compare::Thresholds;
use crate::ctx::Ctx;
use crate::mul::Narrow;
use crate::trunc::extend_with_b2a;

impl<C: Channel> Ctx<'_, C> {
    /// exp(x) for x ≤ 0 (approx::exp_neg). `bound`: a promise |x + 16| < 2^k for a cheaper clamp.
    pub fn exp_neg(&mut self, x: &[u64], bound: Option<u32>) -> Result<Vec<u64>> {
        let p = self.exp_neg_wide(x, bound)?;
        let _g = self.ch.meter().enter(CostClass::Exp);
        self.round(&p, veil_core::approx::EXP_SQUARINGS)
    }

    /// [`Ctx::exp_neg`] before its last rounding: exp(x) at `exp_frac` = f + 5 bits
    /// (approx::exp_neg_wide), for Softmax to round its row sums once.
    pub fn exp_neg_wide(&mut self, x: &[u64], bound: Option<u32>) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Exp);
        let ring = self.ring();
        let fe = self.ax.exp_frac();
        let lo = (veil_core::approx::EXP_CLAMP as u64) << self.ax.fp.frac_bits();
        // t = max(x, −16) = ReLU(x + 16) − 16, read at f + 5 bits (= x / 32).
        let mut v = x.to_vec();
        self.add_public(&mut v, lo);
        let mut t = self.relu(&v, bound)?;
        self.add_public(&mut t, ring.neg(lo));
        // p = 1 + t + (31/64)·t², then five rounded squarings.
        // |t| ≤ 2^(f+4) and p ∈ [0, 2^fe]: narrow squares.
        let t2 = self.square_narrow(&t, Narrow::signed(self.ax.fp.frac_bits() + 6))?;
        let q: Vec<u64> = t2.iter().map(|&v| ring.mul(v, EXP_QUAD_NUM)).collect();
        let t2 = self.round(&q, fe + EXP_QUAD_SHIFT)?;
        let mut p: Vec<u64> = t.iter().zip(&t2).map(|(&a, &b)| ring.add(a, b)).collect();
        self.add_public(&mut p, 1u64 << fe);
        for _ in 0..veil_core::approx::EXP_SQUARINGS {
            let sq = self.square_narrow(&p, Narrow::signed(fe + 2))?;
            p = self.round(&sq, fe)?;
        }
        Ok(p)
    }

    /// 1/s with the output at `out_frac` fractional bits (approx::recip_at), on the domain
    /// s ∈ [2^floor, 2^K] (K = norm_bits; s = 2^K is Softmax's sum over 2048 equal scores, clamped
    /// to class K as in `approx`), for shares of s in `s_ring` (the format's ring, or a narrower
    /// one of at least K + 2 bits, where the class comparisons then run and whose extension to
    /// ℓ rides in the B2A's call). `floor` is the caller's promise s ≥ 2^floor (ReLU-normalise's
    /// ε, Softmax's largest term): the classes below it are impossible, so only the thresholds
    /// 2^(floor+1) … 2^(K−1) are compared, one batch of K-bit DReLUs (|s − 2^j| < 2^K); the
    /// products are narrow (g = 2^(K−e) ≤ 2^(K−floor−1), y < 2^(F+2)). Outside the domain the
    /// shares open to unspecified values. Flights: the DReLU batch, the B2A (2), the
    /// normalisation (4), Goldschmidt (12), the output scaling (4).
    pub fn recip_at(
        &mut self,
        s: &[u64],
        s_ring: Ring,
        floor: u32,
        out_frac: u32,
    ) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Recip);
        let ax = self.ax;
        let k = ax.norm_bits();
        let fr = ax.newton_frac();
        let ring = self.ring();
        ensure!(
            s_ring.bits() >= k + 2 && s_ring.bits() <= ring.bits(),
            InvalidArgument,
            "a reciprocal of sums in Z_2^{}",
            s_ring.bits()
        );
        ensure!(
            floor < k,
            InvalidArgument,
            "a reciprocal of sums promised above 2^{floor} (the domain ends at 2^{k})"
        );
        let lo = floor + 1;
        let bits = {
            let _g = self.ch.meter().enter(CostClass::Compare);
            let ts: Vec<u64> = (lo..k).map(|j| 1u64 << j).collect();
            let js = Thresholds { values: s, ts: &ts };
            self.drelu_thresholds_in(s_ring, &[], &[js], Some(k))?
        };
        let (s, c) = if s_ring == ring {
            (s.to_vec(), self.b2a(&bits)?)
        } else {
            extend_with_b2a(self.ot, self.ch, self.role, (s_ring, ring), s, &bits)?
        };
        let h = onehot(self, &c, s.len(), (k - lo) as usize);
        let g = select(self, &h, k - lo + 1, |i| ax.norm_scale(lo + i));
        // g = 2^(K−e) ≤ 2^(K−lo) is the narrower factor of m = s·g.
        let m = self.mul_narrow_trunc(&g, Narrow::unsigned(k - lo + 1), &s, k - fr, fr + 2)?;
        let y = goldschmidt(self, &m, None)?;
        let shift = ax.recip_out_shift(out_frac);
        // y·g < 2^(F+1+K−e) with e > floor: the result is below 2^(F+K−floor−shift).
        let out = fr + k - floor - shift + 2;
        self.mul_narrow_trunc(&y, Narrow::unsigned(fr + 2), &g, shift, out)
    }

    /// 1/√s with the output at `out_frac` fractional bits (approx::rsqrt_at), on the domain
    /// s ∈ [1, 2^K): the comparisons with every threshold of `approx::rsqrt_thresholds` (the
    /// classes and the pieces of each octave) in one batch, their B2A, then the normalisation
    /// and the piece's quadratic ([`rsqrt_pieces`]). Flights: the DReLU batch (11 at ℓ = 41),
    /// the B2A (2), three fused products (4 each).
    pub fn rsqrt_at(&mut self, s: &[u64], out_frac: u32) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Rsqrt);
        let ladder = Ladder {
            kappa: self.ax.rsqrt_kappa(out_frac),
            lo: 1,
            hi: self.ax.norm_bits(),
            s,
        };
        let ts = ladder.thresholds(self);
        let bits = {
            let _g = self.ch.meter().enter(CostClass::Compare);
            let set = Thresholds { values: s, ts: &ts };
            self.drelu_thresholds_in(self.ring(), &[], &[set], None)?
        };
        let c = self.b2a(&bits)?;
        let (r1, _, scaled) = rsqrt_pieces(self, &[ladder], &c)?;
        // b = 0 on every piece (out_frac + f/2 < R): r = r1.
        ensure!(
            !scaled,
            InvalidArgument,
            "rsqrt output precision {out_frac} too high"
        );
        Ok(r1)
    }

    /// tanh(x) (approx::tanh): sign by DReLU, exp(−2|x|), Goldschmidt quotient, sign re-applied.
    pub fn tanh(&mut self, x: &[u64]) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Tanh);
        let ring = self.ring();
        let f = self.ax.fp.frac_bits();
        let fr = self.ax.newton_frac();
        let pos = self.drelu(x, None)?;
        let px = self.mux(&pos, x)?;
        // −2|x| = −2(2·px − x) = 2x − 4·px.
        let neg2a: Vec<u64> = x
            .iter()
            .zip(&px)
            .map(|(&v, &p)| ring.sub(ring.add(v, v), ring.mul(p, 4)))
            .collect();
        let z = self.exp_neg(&neg2a, None)?;
        // m = (1 + z)/2 and num = 1 − z at F bits: N ≈ 2·tanh(|x|) at F bits.
        let up = 1u64 << (fr - f);
        let mut m: Vec<u64> = z.iter().map(|&v| ring.mul(v, up / 2)).collect();
        self.add_public(&mut m, 1u64 << (fr - 1));
        let mut num: Vec<u64> = z.iter().map(|&v| ring.neg(ring.mul(v, up))).collect();
        self.add_public(&mut num, 1u64 << fr);
        let n = goldschmidt(self, &m, Some(&num))?;
        let th = self.round(&n, fr - f + 1)?;
        let pth = self.mux(&pos, &th)?;
        Ok(pth
            .iter()
            .zip(&th)
            .map(|(&p, &t)| ring.sub(ring.add(p, p), t))
            .collect())
    }

    /// SiLU(x) = x·σ(x) (approx::silu): ReLU(x) − ψ(|x|) with ψ(a) = a·σ(−a) piecewise cubic
    /// on [0, 12) and 0 beyond, GELU's protocol with SiLU's constants ([`Ctx::odd_split`] with
    /// `approx::silu_plan`). Every x is in the domain; shares open to exactly `approx::silu`
    /// with faithful truncations, and in the 1-bit-error mode the three narrow-ring truncations
    /// (a², a³, the rounding of V) may each land one unit low: within 2 ulps of it. Label
    /// "SiLU". Flights at the default format unbounded: 46 in the 1-bit-error mode, 66 faithful
    /// (were 76 and 152 with exp and Goldschmidt's quotient); `bound` as [`Ctx::odd_split`]'s
    /// (approx::silu_within), 42 and 62 at a decoder's 21-bit gate bound.
    pub fn silu(&mut self, x: &[u64], bound: Option<u32>) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Silu);
        let plan = self.ax.silu_plan();
        self.odd_split(&plan, x, bound)
    }

    /// hard-swish(x)·u (approx::hard_swish_gated): the factor c = ReLU(x + 3) − ReLU(x − 3)
    /// from one ReLU call on [x + 3, x − 3] (comparisons promised |·| < 2^`bound`), the product
    /// x·u, then ⌊c·K⌋_f and ⌊x·u⌋_f in one truncation call, and ⌊fac·⌊x·u⌋⌋_(f+e). Label
    /// "Hard-swish". Flights at the default format, the product by `up` included: 18 in the
    /// 1-bit-error mode, 32 faithful (SiLU alone: 46 and 66, its product by `up` after).
    pub fn hard_swish_gated(
        &mut self,
        x: &[u64],
        u: &[u64],
        bound: Option<u32>,
    ) -> Result<Vec<u64>> {
        ensure!(
            x.len() == u.len(),
            InvalidArgument,
            "hard-swish of {} values gating {}",
            x.len(),
            u.len()
        );
        let _g = self.ch.meter().enter(CostClass::HardSwish);
        let ring = self.ring();
        let n = x.len();
        let f = self.ax.fp.frac_bits();
        let three = 3u64 << f;
        let mut shifted = [x, x].concat();
        self.add_public(&mut shifted[..n], three);
        self.add_public(&mut shifted[n..], ring.neg(three));
        let r = self.relu(&shifted, bound)?;
        let xu = self.mul(x, u)?;
        let k = self.ax.hard_swish_sixth();
        let mut both: Vec<u64> = r[..n]
            .iter()
            .zip(&r[n..])
            .map(|(&a, &b)| ring.mul(ring.sub(a, b), k))
            .collect();
        both.extend(xu);
        let t = self.trunc(&both, f)?;
        let (fac, xu) = t.split_at(n);
        self.mul_trunc(fac, xu, f + veil_core::approx::HARD_SWISH_EXTRA_BITS)
    }
}

/// Goldschmidt for num/m on m ∈ [1/2, 1] at F = newton_frac bits (approx::goldschmidt; `None`
/// for num = 1, where N0 = y0 needs no product). Three rounds of products, 12 flights: D0 and
/// N0 in one call, then each step's two products by 1 + δ in one call. Narrow promises, with
/// margin for the fused normalisation's m a few units outside [2^(F−1), 2^F]: y0 < 2^(F+1),
/// |δ0| ≤ 0.086 < 2^-3, |δ1| ≤ 0.0075 < 2^-6 (each also holds the 1-bit-error mode's few ulps).
fn goldschmidt<C: Channel>(cx: &mut Ctx<C>, m: &[u64], num: Option<&[u64]>) -> Result<Vec<u64>> {
    let ring = cx.ring();
    let fr = cx.ax.newton_frac();
    let n = m.len();
    let mut y0: Vec<u64> = m.iter().map(|&v| ring.neg(ring.add(v, v))).collect();
    cx.add_public(&mut y0, cx.ax.recip_guess());
    let y_nw = Narrow::unsigned(fr + 1);
    // D0 = ⌊m·y0⌋_F and N0 = ⌊num·y0⌋_F (< 2^(F+2) for num ≤ 2^F).
    let (d0, n0) = match num {
        None => (cx.mul_narrow_trunc(&y0, y_nw, m, fr, fr + 3)?, y0),
        Some(num) => {
            let a = [y0.as_slice(), y0.as_slice()].concat();
            let b = [m, num].concat();
            let mut d0 = cx.mul_narrow_trunc(&a, y_nw, &b, fr, fr + 3)?;
            let n0 = d0.split_off(n);
            (d0, n0)
        }
    };
    let one_minus = |cx: &Ctx<C>, d: &[u64]| {
        let mut delta: Vec<u64> = d.iter().map(|&v| ring.neg(v)).collect();
        cx.add_public(&mut delta, 1u64 << fr);
        delta
    };
    // D1 = D0 + ⌊D0·δ0⌋_F and N1 = N0 + ⌊N0·δ0⌋_F in one call.
    let delta0 = one_minus(cx, &d0);
    let a = [delta0.as_slice(), delta0.as_slice()].concat();
    let b = [d0.as_slice(), n0.as_slice()].concat();
    let steps = cx.mul_narrow_trunc(&a, Narrow::signed(fr - 2), &b, fr, fr + 1)?;
    let (d1, n1): (Vec<u64>, Vec<u64>) = {
        let (dd, dn) = steps.split_at(n);
        (
            d0.iter().zip(dd).map(|(&x, &d)| ring.add(x, d)).collect(),
            n0.iter().zip(dn).map(|(&x, &d)| ring.add(x, d)).collect(),
        )
    };
    // N2 = N1 + ⌊N1·δ1⌋_F.
    let delta1 = one_minus(cx, &d1);
    let dn = cx.mul_narrow_trunc(&delta1, Narrow::signed(fr - 5), &n1, fr, fr)?;
    Ok(n1.iter().zip(&dn).map(|(&x, &d)| ring.add(x, d)).collect())
}

/// One rsqrt over a ladder of public thresholds: r ≈ κ/√S over the classes lo ..= hi of S
/// (approx::rsqrt_pieces), for this party's shares `s`.
struct Ladder<'a> {
    kappa: f64,
    lo: u32,
    hi: u32,
    s: &'a [u64],
}

impl Ladder<'_> {
    fn thresholds<C: Channel>(&self, cx: &Ctx<C>) -> Vec<u64> {
        cx.ax.rsqrt_thresholds(self.lo, self.hi)
    }

    /// The pieces in threshold order: (class, (M_c, P, Q, R', b)).
    fn pieces<C: Channel>(&self, cx: &Ctx<C>) -> Vec<(u32, RsqrtPiece)> {
        (self.lo..=self.hi)
            .flat_map(|e| cx.ax.rsqrt_pieces_in_class(e))
            .map(|piece| (piece.0, cx.ax.rsqrt_piece(self.kappa, piece)))
            .collect()
    }
}

/// r1 = P + ⌊(Q + ⌊R·D / 2^F⌋)·D / 2^F⌋ of every ladder's S (concatenated, ladder by ladder;
/// approx::rsqrt_pieces) from the arithmetic shares `c` of their threshold comparisons
/// (element-major per ladder, ladder by ladder), the selected powers 2^b (r = r1·2^b) and
/// whether any b is above 0. The one-hot piece selects the public constants locally; then three
/// fused products for all ladders at once (12 flights): the normalisation M = ⌊S·2^(hi−e) /
/// 2^(hi−F)⌋ (2^(hi−e) the narrow factor), then Horner's two products by D = M − M_c, the
/// narrow factor: |D| < 2^F for every S in [0, 2^hi) (|D| < 2^(F−4) inside the classes, a
/// piece spanning < 2^-3.4 of x; down to −0.53·2^F below the lowest class: a coarse sum under
/// LayerNorm's switch, a fine one under its variance floor), where |slope·D| < 2^(R+F) keeps
/// the products in the ring. The ladders share their top class hi (one truncation).
fn rsqrt_pieces<C: Channel>(
    cx: &mut Ctx<C>,
    ladders: &[Ladder],
    c: &[u64],
) -> Result<(Vec<u64>, Vec<u64>, bool)> {
    let ax = cx.ax;
    let fr = ax.newton_frac();
    let hi = ladders[0].hi;
    ensure!(
        ladders.iter().all(|l| l.hi == hi && l.lo <= hi && hi >= fr),
        InvalidArgument,
        "rsqrt ladders of different tops"
    );
    let ring = cx.ring();
    let (mut g, mut mc, mut p, mut qr, mut pow) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut s = Vec::new();
    let (mut first, mut scaled) = (0, false);
    for l in ladders {
        let pieces = l.pieces(cx);
        let k = (pieces.len() - 1) * l.s.len();
        ensure!(
            first + k <= c.len(),
            InvalidArgument,
            "rsqrt comparison bits"
        );
        let h = onehot(cx, &c[first..first + k], l.s.len(), pieces.len() - 1);
        first += k;
        let width = pieces.len() as u32;
        let pick = |f: &dyn Fn(&(u32, RsqrtPiece)) -> u64| {
            select(cx, &h, width, |i| f(&pieces[i as usize]))
        };
        g.extend(pick(&|x| 1u64 << (hi - x.0)));
        mc.extend(pick(&|x| x.1 .0));
        p.extend(pick(&|x| x.1 .1));
        qr.push((pick(&|x| x.1 .2), pick(&|x| x.1 .3)));
        pow.extend(pick(&|x| 1u64 << x.1 .4));
        s.extend_from_slice(l.s);
        scaled |= pieces.iter().any(|x| x.1 .4 > 0);
    }
    let g_bits = ladders.iter().map(|l| hi - l.lo + 1).max().unwrap_or(1);
    let m = cx.mul_narrow_trunc(&g, Narrow::unsigned(g_bits), &s, hi - fr, fr + 2)?;
    let d: Vec<u64> = m.iter().zip(&mc).map(|(&a, &b)| ring.sub(a, b)).collect();
    let (q, r): (Vec<u64>, Vec<u64>) = qr.into_iter().fold((vec![], vec![]), |mut acc, x| {
        acc.0.extend(x.0);
        acc.1.extend(x.1);
        acc
    });
    // |R·D|, |slope·D| < 2^(R+F): below 2^R after the truncation by F.
    let nw = Narrow::signed(fr + 1);
    let out = ax.rsqrt_piece_bits() + 1;
    let t = cx.mul_narrow_trunc(&d, nw, &r, fr, out)?;
    let slope: Vec<u64> = q.iter().zip(&t).map(|(&a, &b)| ring.add(a, b)).collect();
    let u = cx.mul_narrow_trunc(&d, nw, &slope, fr, out)?;
    let r1 = p.iter().zip(&u).map(|(&a, &b)| ring.add(a, b)).collect();
    Ok((r1, pow, scaled))
}

/// The one-hot intervals of n values from the arithmetic shares c of their k ascending
/// thresholds each (element-major, [`Thresholds`] order): h_i = c_(i−1) − c_i over the k + 1
/// intervals, local.
fn onehot<C: Channel>(cx: &Ctx<C>, c: &[u64], n: usize, k: usize) -> Vec<u64> {
    let ring = cx.ring();
    let one = if cx.is_server() { 1 } else { 0 };
    let mut h = Vec::with_capacity(n * (k + 1));
    for i in 0..n {
        // c_j = [s ≥ t_j] for j < k; below the first comparison 1, above the last 0.
        let cj = |j: usize| -> u64 {
            if j == 0 {
                one
            } else if j == k + 1 {
                0
            } else {
                c[i * k + j - 1]
            }
        };
        for j in 1..=k + 1 {
            h.push(ring.sub(cj(j - 1), cj(j)));
        }
    }
    h
}

/// Σ_i h_i·const(i) over the `width` intervals of each element: a public constant per element,
/// selected by its one-hot interval.
fn select(cx: &Ctx<impl Channel>, h: &[u64], width: u32, konst: impl Fn(u32) -> u64) -> Vec<u64> {
    let ring = cx.ring();
    h.chunks(width as usize)
        .map(|hs| {
            hs.iter().enumerate().fold(0u64, |acc, (j, &hv)| {
                ring.add(acc, ring.mul(hv, konst(j as u32)))
            })
        })
        .collect()
}

/// LayerNorm's r ≈ √n/√(S/2^g) at W bits from the row sums of squares S, for the coarse and the
/// fine sums at once (approx::layer_norm_rsqrt on each: [`rsqrt_pieces`] over the sum's classes,
/// then the power 2^b), and LayerNorm's choice between them, the XOR-shared [`switch` ≥ 0] of
/// `switch` (= switch − 1 − S_coarse): every comparison (both ladders and the switch) in one
/// DReLU batch, one B2A, the three fused products of the pieces for both sums in one call each,
/// and one product by 2^b. Flights: 11 + 2 + 12 + 3 at ℓ = 41 and 48.
/// Returns (r_coarse, r_fine, use_fine).
pub(crate) fn layer_norm_rsqrts<C: Channel>(
    cx: &mut Ctx<C>,
    plan: &LayerNormPlan,
    (coarse, fine): (&[u64], &[u64]),
    switch: &[u64],
) -> Result<(Vec<u64>, Vec<u64>, Vec<bool>)> {
    let _g = cx.ch.meter().enter(CostClass::Rsqrt);
    let rows = coarse.len();
    let ladders = [(&plan.coarse, coarse), (&plan.fine, fine)].map(|(sum, s)| Ladder {
        kappa: sum.kappa,
        lo: sum.class_min,
        hi: sum.class_max,
        s,
    });
    // S ∈ [0, 2^hi) whenever its root is used: the coarse sum always, the fine sum when it is
    // picked (below the switch); a wrapped fine sum of a coarse row gives a root that is dropped.
    let ts = ladders.each_ref().map(|l| l.thresholds(cx));
    let bits = {
        let _g = cx.ch.meter().enter(CostClass::Compare);
        let sets = [0, 1].map(|i| Thresholds {
            values: ladders[i].s,
            ts: &ts[i],
        });
        cx.drelu_thresholds_in(cx.ring(), switch, &sets, None)?
    };
    let (use_fine, thresholds) = bits.split_at(rows);
    let c = cx.b2a(thresholds)?;
    let (r1, pow, _) = rsqrt_pieces(cx, &ladders, &c)?;
    let mut r = cx.mul(&r1, &pow)?;
    let r_fine = r.split_off(rows);
    Ok((r, r_fine, use_fine.to_vec()))
}
