//! Element-wise functions on shares: exp (x ≤ 0), reciprocal, reciprocal square root, tanh, SiLU.
//!
//! Each runs, step for step, the algorithm of the same name in `veil_core::approx` (see there for
//! the method, the domain and the error against f64, measured over the whole domain):
//! * exp_neg: |error| ≤ 1.79 ulp on x ≤ 0 (clamped below −16); its squarings are narrow products
//!   (|p| ≤ 1), so the shares equal `approx` only on that domain;
//! * recip:   ≤ 1 ulp + 2^-12 relative on raw inputs [1, 2^24] (values [2^-13, 2048]), the
//!   quotient by Goldschmidt's two coupled steps (three rounds of products);
//! * rsqrt:   ≤ 1 ulp + 2^-11 relative on the same domain;
//! * tanh:    ≤ 2.7 ulp on all x; in the 1-bit-error mode within 1e-3 (3.8e-4 measured).
//! * silu:    ≤ 1.8e-4 for every x (`approx::SILU_MAX_ERROR`), exactly ReLU from |x| = 12 on;
//!   the decoders' gated MLP. GELU's piecewise-cubic odd split with SiLU's constants
//!   (`Ctx::odd_split` in `layers`), no exp and no quotient.
//! * layer_norm_rsqrts: LayerNorm's √n/√S over the class range of its plan (see
//!   `approx::Approx::layer_norm_rsqrt`), the coarse and the fine sums in one pass.
//!
//! With [`TruncMode::Faithful`](crate::TruncMode) (the default of [`Ctx::new`]) the shares open to
//! exactly the integers `approx` computes; the tests check equality.
//!
//! Reciprocal and rsqrt need the bit length e of their input: DReLUs of s − 2^k for
//! k = 1 … K−1 (one batch, narrow when s has a known range; the reciprocal skips the thresholds
//! below a promised floor), converted to arithmetic shares; the
//! one-hot class h_e = c_(e−1) − c_e then selects public constants by a local linear combination. These comparisons are per row in the layers
//! (one reciprocal per Softmax row), so they cost little per element.
//!
//! Security: semi-honest; compositions of the primitives' protocols.

use veil_core::approx::{LayerNormPlan, EXP_QUAD_NUM, EXP_QUAD_SHIFT};
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
            let js = Thresholds {
                values: s,
                js: lo..k,
            };
            self.drelu_thresholds_in(s_ring, &[], &[js], Some(k))?
        };
        let (s, c) = if s_ring == ring {
            (s.to_vec(), self.b2a(&bits)?)
        } else {
            extend_with_b2a(self.ot, self.ch, self.role, (s_ring, ring), s, &bits)?
        };
        let h = onehot(self, &c, s.len(), lo, k);
        let g = select(self, &h, lo, k, |e| ax.norm_scale(e));
        // g = 2^(K−e) ≤ 2^(K−lo) is the narrower factor of m = s·g.
        let m = self.mul_narrow_trunc(&g, Narrow::unsigned(k - lo + 1), &s, k - fr, fr + 2)?;
        let y = goldschmidt(self, &m, None)?;
        let shift = ax.recip_out_shift(out_frac);
        // y·g < 2^(F+1+K−e) with e > floor: the result is below 2^(F+K−floor−shift).
        let out = fr + k - floor - shift + 2;
        self.mul_narrow_trunc(&y, Narrow::unsigned(fr + 2), &g, shift, out)
    }

    /// 1/√s with the output at `out_frac` fractional bits (approx::rsqrt_at).
    pub fn rsqrt_at(&mut self, s: &[u64], out_frac: u32) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Rsqrt);
        let ax = self.ax;
        let k = ax.norm_bits();
        let h = class_onehot(self, s, 1, k)?;
        let g = select(self, &h, 1, k, |e| ax.norm_scale(e));
        let big_g = select(self, &h, 1, k, |e| ax.rsqrt_out_scale(e, out_frac));
        let m = self.mul_trunc(s, &g, ax.norm_bits() - ax.newton_frac())?;
        let y = newton_rsqrt(self, &m)?;
        self.mul_trunc(&y, &big_g, ax.rsqrt_out_shift(out_frac))
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
    /// "SiLU". Flights at the default format: 46 in the 1-bit-error mode, 66 faithful (were 76
    /// and 152 with exp and Goldschmidt's quotient).
    pub fn silu(&mut self, x: &[u64]) -> Result<Vec<u64>> {
        let _g = self.ch.meter().enter(CostClass::Silu);
        let plan = self.ax.silu_plan();
        self.odd_split(&plan, x)
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

/// Newton for 1/√m on m ∈ [1/2, 1) (approx::newton_rsqrt). Narrow products: |m| < 2^(F+1) (a
/// fused normalisation lands m within −3 … +2 of its value in [0, 2^F]: LayerNorm's sums below
/// the variance floor give m near 0, the top of a class m near 2^F), and |y| < 2^(F+3)
/// (y < 4.03·2^F below the floor, y0 ≤ 1.79·2^F otherwise).
fn newton_rsqrt<C: Channel>(cx: &mut Ctx<C>, m: &[u64]) -> Result<Vec<u64>> {
    let ring = cx.ring();
    let fr = cx.ax.newton_frac();
    let sc = (1u64 << fr) as f64;
    let (a, b) = veil_core::approx::RSQRT_GUESS;
    let bm = cx.scale_trunc(m, (b * sc).round() as u64, fr)?;
    let mut y: Vec<u64> = bm.iter().map(|&v| ring.neg(v)).collect();
    cx.add_public(&mut y, (a * sc).round() as u64);
    let y_nw = Narrow::signed(fr + 4);
    for _ in 0..veil_core::approx::NEWTON_ITERS {
        let y2 = cx.square_narrow(&y, y_nw)?;
        let y2 = cx.trunc(&y2, fr)?;
        // m·y² < 2^F·16.3.
        let my2 = cx.mul_narrow_trunc(m, Narrow::signed(fr + 2), &y2, fr, fr + 6)?;
        let mut u: Vec<u64> = my2.iter().map(|&v| ring.neg(v)).collect();
        cx.add_public(&mut u, 3u64 << fr);
        y = cx.mul_narrow_trunc(&y, y_nw, &u, fr + 1, fr + 4)?;
    }
    Ok(y)
}

/// Arithmetic shares of the one-hot class h_e of each s over classes e = lo … hi (element-major:
/// h[i·(hi−lo+1) + e − lo]): class e holds s ∈ [2^(e−1), 2^e), clamped to the range.
/// The thresholds [s ≥ 2^j] are DReLUs of s − 2^j on the whole ring, all in one batch (one
/// comparison tree's depth, 11 flights at ℓ = 41, then a B2A). (A bit decomposition of s and a
/// suffix OR need fewer bits per row but two prefix networks, about 4·⌈log2 b⌉ flights: these
/// comparisons are per row, so their bytes are small and their depth is what costs.)
fn class_onehot<C: Channel>(cx: &mut Ctx<C>, s: &[u64], lo: u32, hi: u32) -> Result<Vec<u64>> {
    let bits = {
        let _g = cx.ch.meter().enter(CostClass::Compare);
        let js = Thresholds {
            values: s,
            js: lo..hi,
        };
        cx.drelu_thresholds_in(cx.ring(), &[], &[js], None)?
    };
    let c = cx.b2a(&bits)?;
    Ok(onehot(cx, &c, s.len(), lo, hi))
}

/// The one-hot classes of n values from the arithmetic shares c of their thresholds
/// (element-major, [`Thresholds`] order): h_e = c_(e−1) − c_e, local.
fn onehot<C: Channel>(cx: &Ctx<C>, c: &[u64], n: usize, lo: u32, hi: u32) -> Vec<u64> {
    let k = (hi - lo) as usize;
    let ring = cx.ring();
    let one = if cx.is_server() { 1 } else { 0 };
    let mut h = Vec::with_capacity(n * (k + 1));
    for i in 0..n {
        // c_j = [s ≥ 2^(lo+j)] for j < k; below the first comparison 1, above the last 0.
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

/// Σ_e h_e·const(e) over classes lo … hi: selects a public constant per element by its class.
fn select(
    cx: &Ctx<impl Channel>,
    h: &[u64],
    lo: u32,
    hi: u32,
    konst: impl Fn(u32) -> u64,
) -> Vec<u64> {
    let ring = cx.ring();
    h.chunks((hi - lo + 1) as usize)
        .map(|hs| {
            hs.iter().enumerate().fold(0u64, |acc, (j, &hv)| {
                ring.add(acc, ring.mul(hv, konst(lo + j as u32)))
            })
        })
        .collect()
}

/// LayerNorm's r ≈ √n/√(S/2^g) at W bits from the row sums of squares S, for the coarse and the
/// fine sums at once (approx::layer_norm_rsqrt on each: class over the plan's range,
/// normalisation, Newton, then the two selected output constants), and LayerNorm's choice
/// between them, the XOR-shared [`switch` ≥ 0] of `switch` (= switch − 1 − S_coarse): every
/// comparison of both class ranges and the switch in one DReLU batch, both B2As in one call, one
/// Newton on both vectors and one final product; only the normalisations and the output
/// scalings, whose constants differ, run apart (as one call when their shifts agree).
/// Returns (r_coarse, r_fine, use_fine).
pub(crate) fn layer_norm_rsqrts<C: Channel>(
    cx: &mut Ctx<C>,
    plan: &LayerNormPlan,
    (coarse, fine): (&[u64], &[u64]),
    switch: &[u64],
) -> Result<(Vec<u64>, Vec<u64>, Vec<bool>)> {
    let _g = cx.ch.meter().enter(CostClass::Rsqrt);
    let ax = cx.ax;
    let rows = coarse.len();
    let parts = [(&plan.coarse, coarse), (&plan.fine, fine)];
    // S ∈ [0, 2^hi) whenever its root is used: the coarse sum always, the fine sum when it is
    // picked (below the switch); a wrapped fine sum of a coarse row gives a root that is dropped.
    let sets = parts.map(|(sum, s)| Thresholds {
        values: s,
        js: sum.class_min..sum.class_max,
    });
    let bits = {
        let _g = cx.ch.meter().enter(CostClass::Compare);
        cx.drelu_thresholds_in(cx.ring(), switch, &sets, None)?
    };
    let (use_fine, thresholds) = bits.split_at(rows);
    let c = cx.b2a(thresholds)?;
    let mut classes = Vec::with_capacity(2);
    let mut first = 0;
    for (sum, _) in parts {
        let (lo, hi) = (sum.class_min, sum.class_max);
        let k = (hi - lo) as usize * rows;
        classes.push(onehot(cx, &c[first..first + k], rows, lo, hi));
        first += k;
    }
    let mut m = Vec::with_capacity(2 * rows);
    for ((sum, s), h) in parts.iter().zip(&classes) {
        let (lo, hi) = (sum.class_min, sum.class_max);
        let g = select(cx, h, lo, hi, |e| 1u64 << (hi - e));
        // g = 2^(hi−e) ≤ 2^(hi−lo) and m = S·g / 2^(hi−F) < 2^F.
        m.extend(cx.mul_narrow_trunc(
            &g,
            Narrow::unsigned(hi - lo + 1),
            s,
            hi - ax.newton_frac(),
            ax.newton_frac() + 2,
        )?);
    }
    let y = newton_rsqrt(cx, &m)?;
    let (mut a, mut b) = (Vec::with_capacity(2 * rows), Vec::with_capacity(2 * rows));
    for ((sum, _), h) in parts.iter().zip(&classes) {
        let (lo, hi) = (sum.class_min, sum.class_max);
        a.extend(select(cx, h, lo, hi, |e| {
            ax.layer_norm_class_consts(plan, sum, e).0
        }));
        b.extend(select(cx, h, lo, hi, |e| {
            ax.layer_norm_class_consts(plan, sum, e).1
        }));
    }
    let y_nw = Narrow::signed(ax.newton_frac() + 4);
    let l = cx.ring().bits();
    let r1 = if plan.coarse.scale_shift == plan.fine.scale_shift {
        let c = plan.coarse.scale_shift;
        cx.mul_narrow_trunc(&y, y_nw, &a, c, l - c)?
    } else {
        let mut r1 = Vec::with_capacity(2 * rows);
        for (half, (sum, _)) in parts.iter().enumerate() {
            let span = half * rows..(half + 1) * rows;
            let c = sum.scale_shift;
            r1.extend(cx.mul_narrow_trunc(&y[span.clone()], y_nw, &a[span], c, l - c)?);
        }
        r1
    };
    let mut r = cx.mul(&r1, &b)?;
    let r_fine = r.split_off(rows);
    Ok((r, r_fine, use_fine.to_vec()))
}
