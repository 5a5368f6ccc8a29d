//! The transformer's non-linear layers on shares, row-wise over the last dimension, exactly as the
//! paper's Algorithms 2–4 and their privacy-computing-friendly substitutes. Each function runs
//! the row algorithm of `veil_core::approx` of the same name; with faithful truncation (the
//! default) the shares open to exactly those integers. Errors against f64 (measured in the
//! approx tests and re-checked here on BERT-shaped rows):
//! * GELU (tanh form of Alg. 2, as ReLU(x) − φ(|x|), φ piecewise cubic on [0, 4.25), 0 beyond):
//!   ≤ 1.6e-4 for every x;
//! * Softmax (Alg. 3, max subtraction, public padding mask): ≤ 8e-4 per output (the errors of
//!   the row's exp values add up in the sum, which is rounded once from exp's f + 5 bits);
//! * ReLU-normalise: ReLU(x_i) / (Σ_j ReLU(x_j) + ε): ≤ 3e-4;
//! * LayerNorm (Alg. 4, γ and β private to the server), on |x − mean| < 2048 and
//!   var + ε ≥ 2^-13: ≤ 1 ulp + |γ|·(4.5e-3 + 2.5e-4/√(var + ε))
//!   (`approx::layer_norm_error_bound`). The variance comes from a coarse sum of squares of
//!   pre-shifted deviations (whole domain) or an exact one (Σd² < 4096), chosen per row by one
//!   comparison; the 1/n is folded into the public constants of the row's rsqrt;
//! * centre + affine (x − mean)·γ + β: ≤ 2 ulp·(1 + |γ|).
//!
//! Products by a value of known small magnitude use the narrow (mixed-width) product of
//! [`mod@crate::mul`]: e_i·(1/s) in Softmax (e ∈ [0, 1], always), ReLU(x_i)·(1/s) in ReLU-normalise
//! (relies on the domain s < 2048), the squares and d·r in LayerNorm (rely on the domain
//! |x − mean| < 2048), the products by γ (the server promises |γ| < 2^[`GAMMA_BITS`] and errs
//! otherwise). Outside those domains the shares no longer open to `approx` (GELU and Softmax
//! still do, for every input).
//!
//! With 1-bit-error truncation (`TruncMode::OneBitError`) the shares no longer open to `approx`:
//! each truncation may land 1 ulp low, each rounding ([`Ctx::round`]) is stochastic (the floor
//! or the ceiling, unbiased), and the final products of Softmax, ReLU-normalise,
//! LayerNorm's d·r and the products by γ are fused with their truncation
//! ([`Ctx::mul_narrow_trunc`], [`Ctx::mul_server_trunc`]: only the high part of the product is
//! computed, each COT carrying n ≤ ℓ − t bits instead of up to ℓ) and land within −3 … +2 ulp.
//! Tested bounds in that mode: ReLU-normalise 3e-4 + 3 ulp, LayerNorm (2e-3 + 3 ulp)·(1 + |γ|)
//! plus the mean's error (≤ 2 ulp, in every d_i) times |γ|/σ, which matters for tiny variances;
//! centre + affine 4 ulp·(1 + |γ|), Softmax 8e-4 + 8 ulp (its row sums are rounded once from
//! f + 5 bits, so a long row's many near-zero terms add no bias). LayerNorm's two sums of squares come in that mode from one square of d in a
//! wide ring (the fine sum exact as before, the coarse one finer than the faithful path's).
//! When the context has HE keys ([`Ctx::with_he`]), that mode computes the sum of squares and
//! the client-side cross term of d·r on BFV ([`crate::he_rows`]): same values for the sums, the
//! same −3 … +2 ulp contract for d·r, about half the traffic.
//!
//! Rows are processed together: every round trip carries all rows of the tensor.
//!
//! The padding mask is public (both parties know the sequence length, as in BERT serving).
//! Security: semi-honest; compositions of the primitives' protocols.

use veil_core::approx::SplitPlan;
use veil_core::{ensure, CostClass, Result, RingTensor};
use veil_net::Channel;

use crate::ctx::Ctx;
use crate::elementary::layer_norm_rsqrts;
use crate::layer_norm_he;
use crate::mul::Narrow;
use crate::TruncMode;

/// Row length (last dimension) of a tensor.
fn row_len(x: &RingTensor) -> Result<usize> {
    let n = *x.shape().last().unwrap_or(&0);
    ensure!(
        n > 0,
        InvalidArgument,
        "tensor {:?} has empty rows",
        x.shape()
    );
    Ok(n)
}

fn check_ring<C: Channel>(cx: &Ctx<C>, x: &RingTensor) -> Result<()> {
    ensure!(
        x.ring() == cx.ring(),
        InvalidArgument,
        "tensor ring differs from the format's"
    );
    Ok(())
}

impl<C: Channel> Ctx<'_, C> {
    /// GELU, tanh form, as ReLU(x) − φ(|x|) with φ piecewise cubic (approx::gelu: the clamp to
    /// [0, A], the narrow-ring powers, the segment comparisons and the telescoping selection are the
    /// same steps, [`Ctx::odd_split`], whose `bound` it takes). Label "GELU". Flights at the
    /// default format: 64 (faithful truncations) unbounded, 60 at a Base model's 21-bit bound.
    pub fn gelu(&mut self, x: &RingTensor, bound: Option<u32>) -> Result<RingTensor> {
        check_ring(self, x)?;
        let _g = self.ch.meter().enter(CostClass::Gelu);
        let plan = self.ax.gelu_plan();
        let y = self.odd_split(&plan, x.data(), bound)?;
        RingTensor::from_vec(self.ring(), x.shape(), y)
    }

    /// ReLU(x) − φ̃(|x|) for the piecewise cubic φ̃ of `plan` (approx::odd_split, step for step;
    /// GELU and SiLU): the sign DReLU and ReLU's multiplexer on the full ring, the clamp
    /// c = [|x| ≥ A] (a second full-ring DReLU) and a_c = a − c·(a − A), then in the plan's
    /// narrow ring the square and the cube of a_c (narrow products, a_c < 2^cmp_bits) with their
    /// truncations, the segment bits [a_c ≥ t_j] (one batch of cmp_bits-wide DReLUs), one batch
    /// of multiplexers for the telescoping selection, the rounding and the sign extension.
    /// Shares open to exactly `approx::odd_split` with faithful truncations, for every x.
    /// Flights: 64 faithful for GELU's plan, 66 for SiLU's (its wider narrow ring), 46 in the
    /// 1-bit-error mode (the three narrow-ring truncations take 2 flights instead of 8).
    ///
    /// `bound`: the promise |x| < 2^k runs the sign and the clamp as k-bit comparisons (fewer
    /// correlations and flights; shares open to exactly `approx::odd_split` with the same bound
    /// for every x inside the promise, and to something unspecified outside it, where a
    /// misread sign can break the narrow products' promise). The clamp's input a − A is then
    /// below 2^k too, so k must exceed A's bits.
    pub fn odd_split(
        &mut self,
        plan: &SplitPlan,
        xs: &[u64],
        bound: Option<u32>,
    ) -> Result<Vec<u64>> {
        let ring = self.ring();
        let k = plan.ring;
        let f = self.ax.fp.frac_bits();
        let n = xs.len();
        if let Some(b) = bound {
            ensure!(
                b < ring.bits() && plan.tail < 1u64 << b,
                InvalidArgument,
                "a bound of 2^{b} on the input of a split whose tail is {} in a {}-bit ring",
                plan.tail,
                ring.bits()
            );
        }
        let (_, r, a) = self.relu_and_abs(xs, bound)?;
        // c = [a ≥ A]; a_c = a − c·(a − A), from here on in the narrow ring.
        let mut over = a.clone();
        self.add_public(&mut over, ring.neg(plan.tail));
        let clamp = self.drelu(&over, bound)?;
        let over_k: Vec<u64> = over.iter().map(|&v| k.reduce(v)).collect();
        let cut = self.mux_in(k, &clamp, &over_k)?;
        let ac: Vec<u64> = a.iter().zip(&cut).map(|(&v, &c)| k.sub(v, c)).collect();
        // a_c ≤ A·2^f < 2^cmp_bits: narrow products (m = cmp_bits + 1).
        let m = plan.cmp_bits + 1;
        let sq = self.square_narrow_in(k, &ac, Narrow::signed(m))?;
        let a2 = self.trunc_in(k, &sq, f)?;
        let cube = self.mul_narrow_in(k, &ac, Narrow::signed(m), &a2)?;
        let a3 = self.trunc_in(k, &cube, f)?;
        // Segment bits [a_c ≥ t_j], breakpoint-major.
        let breaks = plan.breaks();
        let mut diffs = Vec::with_capacity(breaks.len() * n);
        for &t in breaks {
            diffs.extend(
                ac.iter()
                    .map(|&v| if self.is_server() { k.sub(v, t) } else { v }),
            );
        }
        let mut bits = self.drelu_in(k, &diffs, Some(plan.cmp_bits))?;
        bits.extend_from_slice(&clamp);
        // P_j on shares: the server adds the constant term C_(j,0).
        let segs = plan.segs;
        let poly: Vec<Vec<u64>> = (0..segs)
            .map(|j| {
                (0..n)
                    .map(|i| {
                        let p = plan.poly(j, ac[i], a2[i], a3[i]);
                        if self.is_server() {
                            p
                        } else {
                            k.sub(p, plan.coef[j][0])
                        }
                    })
                    .collect()
            })
            .collect();
        // Telescoping selection: bit j (< segs − 1) adds P_(j+1) − P_j, the clamp bit subtracts P_last.
        let mut deltas = Vec::with_capacity(segs * n);
        for j in 0..segs - 1 {
            deltas.extend((0..n).map(|i| k.sub(poly[j + 1][i], poly[j][i])));
        }
        deltas.extend(poly[segs - 1].iter().map(|&p| k.neg(p)));
        let picked = self.mux_in(k, &bits, &deltas)?;
        let v: Vec<u64> = (0..n)
            .map(|i| (0..segs).fold(poly[0][i], |acc, j| k.add(acc, picked[j * n + i])))
            .collect();
        let phi = self.round_in(k, &v, plan.coef_frac)?;
        let phi = self.extend(k, &phi)?;
        Ok(r.iter().zip(&phi).map(|(&p, &q)| ring.sub(p, q)).collect())
    }

    /// ReLU as a layer on a tensor (the GELU substitute): [`Ctx::relu`] on the tensor's values,
    /// named apart from it because the slice form is the primitive the other functions use.
    /// `bound`: promise |x| < 2^k for cheaper comparisons. Label "ReLU". Flights:
    /// 5 + 2·⌈log2 ⌈k/4⌉⌉ (11 at the models' bound).
    pub fn relu_tensor(&mut self, x: &RingTensor, bound: Option<u32>) -> Result<RingTensor> {
        check_ring(self, x)?;
        let y = self.relu(x.data(), bound)?;
        RingTensor::from_vec(x.ring(), x.shape(), y)
    }

    /// Softmax over the last dimension with max subtraction; `valid` is the public padding mask of
    /// the columns, the same for every row (false: excluded, output 0). Algorithm 3 /
    /// approx::softmax_row. Label "Softmax". Flights at the default format (1-bit-error mode):
    /// 88 on rows of up to 16 values (`ALL_PAIRS_MAX_LEN`: the row max in one round of all pairs);
    /// on longer rows, in a batch of at most 2^12 values (`GROUPED_MAX_VALUES`: a decoder's
    /// step), 104 up to 256 values (two rounds) and 16 more per further round, in a larger batch
    /// 132 at 32 values (a tree of pairwise maxima, 12 more per doubling: 144 at 41).
    pub fn softmax(&mut self, x: &RingTensor, valid: &[bool]) -> Result<RingTensor> {
        let mask = every_row(x, valid)?;
        self.softmax_masked(x, &mask)
    }

    /// [`Ctx::softmax`] with a public mask per row, `mask` [rows · cols] (a decoder's causal
    /// attention: query row r sees the keys up to its position). Rows of different lengths run
    /// in the same flights: the longest row and the batch's size set the max's rounds.
    pub fn softmax_masked(&mut self, x: &RingTensor, mask: &[bool]) -> Result<RingTensor> {
        check_ring(self, x)?;
        let _g = self.ch.meter().enter(CostClass::Softmax);
        let ring = self.ring();
        let rows = MaskedRows::new(x, mask)?;
        if rows.selected() == 0 {
            return RingTensor::zeros(ring, x.shape());
        }
        let sel = rows.gather(x.data());
        let mx = max_rows(self, rows.split(&sel), None)?;
        let d: Vec<u64> = rows
            .row_of_each()
            .zip(&sel)
            .map(|(r, &v)| ring.sub(v, mx[r]))
            .collect();
        // The entries and the row sums rounded from f + 5 bits in one batch (approx::softmax_row):
        // one rounding per sum, so the one-bit-error mode's low ulps do not pile up in long rows.
        let mut p = self.exp_neg_wide(&d, None)?;
        let n = p.len();
        let sums = rows.sums(ring, &p);
        p.extend(sums);
        let e = {
            let _g = self.ch.meter().enter(CostClass::Exp);
            self.round(&p, veil_core::approx::EXP_SQUARINGS)?
        };
        let (e, sums) = e.split_at(n);
        // e ∈ [0, 1]: a narrow product (|e| < 2^(f+1)); the output y ≤ 1. The row's largest
        // score gives exp(0) = 1 (a few ulps low at most), so every sum is at least 1/2 (a row
        // with nothing selected has sum 0, outside the domain: its quotients are never used).
        let f = self.ax.fp.frac_bits();
        let y = divide_rows(self, e, &rows, Narrow::signed(f + 2), (sums, ring, f - 1))?;
        RingTensor::from_vec(ring, x.shape(), rows.scatter(&y))
    }

    /// ReLU-normalise, the Softmax substitute: ReLU(x_i) / (Σ_j ReLU(x_j) + ε) over valid columns,
    /// one reciprocal per row then one product per element (approx::relu_normalise_row).
    /// `bound`: promise |x| < 2^k for cheaper comparisons. Label "ReLU-normalise". Flights at
    /// the default format: 44 (1-bit-error mode, the models' bound).
    pub fn relu_normalise(
        &mut self,
        x: &RingTensor,
        valid: &[bool],
        bound: Option<u32>,
    ) -> Result<RingTensor> {
        let mask = every_row(x, valid)?;
        self.relu_normalise_masked(x, &mask, bound)
    }

    /// [`Ctx::relu_normalise`] with a public mask per row, `mask` [rows · cols], as
    /// [`Ctx::softmax_masked`].
    pub fn relu_normalise_masked(
        &mut self,
        x: &RingTensor,
        mask: &[bool],
        bound: Option<u32>,
    ) -> Result<RingTensor> {
        check_ring(self, x)?;
        let _g = self.ch.meter().enter(CostClass::ReluNormalise);
        let ring = self.ring();
        let rows = MaskedRows::new(x, mask)?;
        let sel = rows.gather(x.data());
        // In the domain s < 2^K (K = norm_bits) every ReLU(x_i) < 2^K: selected in a ring of K + 2
        // bits (the multiplexer's COTs are that wide instead of ℓ), summed there, and the row sums
        // extended to ℓ (|s| < 2^K = 2^(K+2−2)).
        let nb = self.ax.norm_bits();
        let kr = veil_core::Ring::narrow(nb + 2)?;
        let r = {
            let _g = self.ch.meter().enter(CostClass::Relu);
            let pos = self.drelu(&sel, bound)?;
            let low: Vec<u64> = sel.iter().map(|&v| kr.reduce(v)).collect();
            self.mux_in(kr, &pos, &low)?
        };
        let mut sums = rows.sums(kr, &r);
        self.add_public_in(kr, &mut sums, self.ax.relu_normalise_eps());
        // ReLU(x_i) ≤ s < 2^norm_bits in the domain: a narrow product; the output y ≤ 1 + 2^-10
        // (the reciprocal's error). The sums stay in the narrow ring: the reciprocal compares them
        // there and extends them in its B2A's call. Every sum is at least ε ≥ 2^eps_floor.
        let eps_floor = 63 - self.ax.relu_normalise_eps().leading_zeros();
        let y = divide_rows(
            self,
            &r,
            &rows,
            Narrow::unsigned(nb),
            (&sums, kr, eps_floor),
        )?;
        RingTensor::from_vec(ring, x.shape(), rows.scatter(&y))
    }

    /// LayerNorm over the last dimension (Algorithm 4 / approx::layer_norm_row). The server passes
    /// `Some(params)`, the client `None`. Label "LayerNorm". Flights at the default format: 46
    /// (1-bit-error mode).
    pub fn layer_norm(
        &mut self,
        x: &RingTensor,
        params: Option<&AffineParams>,
        eps: f64,
    ) -> Result<RingTensor> {
        let dev_bits = veil_core::approx::LAYER_NORM_DEV_BITS;
        self.layer_norm_at(x, params, eps, dev_bits)
    }

    /// [`Ctx::layer_norm`] for rows promised |x − mean| < 2^`dev_bits` (approx::layer_norm_row_at:
    /// GPT-2's LayerNorm on a decoder's wide domain).
    pub fn layer_norm_at(
        &mut self,
        x: &RingTensor,
        params: Option<&AffineParams>,
        eps: f64,
        dev_bits: u32,
    ) -> Result<RingTensor> {
        check_ring(self, x)?;
        let _g = self.ch.meter().enter(CostClass::LayerNorm);
        let cols = row_len(x)?;
        check_norm_row(self, cols, dev_bits)?;
        let d = centre(self, x.data(), cols)?;
        let weights = (params.map(|p| p.gamma), params.map(|p| p.beta));
        let y = scale_rows(self, &d, cols, weights, eps, dev_bits)?;
        RingTensor::from_vec(self.ring(), x.shape(), y)
    }

    /// RMSNorm over the last dimension, x_i·γ_i / √(mean(x²) + ε) (approx::rms_norm_row): LayerNorm's
    /// scaling without the centring and without β, for rows promised |x| < 2^`dev_bits` (a
    /// decoder's residual stream: the Llama family's outliers need a wider domain than
    /// LayerNorm's). The server passes `Some(γ)`, the client `None`. Label "RMSNorm". Flights at
    /// the default format: 42 (1-bit-error mode; LayerNorm's less the centring's). Rows whose
    /// exact sum of squares would need more than 64 bits (576 values on |x| < 2^16 at f = 13)
    /// take the faithful mode's coarse and fine sums in either mode.
    pub fn rms_norm(
        &mut self,
        x: &RingTensor,
        gamma: Option<&[u64]>,
        eps: f64,
        dev_bits: u32,
    ) -> Result<RingTensor> {
        check_ring(self, x)?;
        let _g = self.ch.meter().enter(CostClass::RmsNorm);
        let cols = row_len(x)?;
        check_norm_row(self, cols, dev_bits)?;
        let y = scale_rows(self, x.data(), cols, (gamma, None), eps, dev_bits)?;
        RingTensor::from_vec(self.ring(), x.shape(), y)
    }

    /// The LayerNorm substitute (x − mean)·γ + β (approx::centre_affine_row). Label "Centre-affine".
    /// Flights: 8 (1-bit-error mode).
    pub fn centre_affine(
        &mut self,
        x: &RingTensor,
        params: Option<&AffineParams>,
    ) -> Result<RingTensor> {
        check_ring(self, x)?;
        let _g = self.ch.meter().enter(CostClass::CentreAffine);
        let cols = row_len(x)?;
        let d = centre(self, x.data(), cols)?;
        // No bound on (x − mean)·γ beyond the ring's head-room: the high part keeps ℓ − f bits.
        let f = self.ax.fp.frac_bits();
        let weights = (params.map(|p| p.gamma), params.map(|p| p.beta));
        let y = affine(self, &d, cols, weights, x.ring().bits() - f)?;
        RingTensor::from_vec(x.ring(), x.shape(), y)
    }

    /// The RMSNorm substitute x·γ (+ β) with the server's γ (and β): ⌊x_i·γ_i / 2^f⌋ (+ β_i)
    /// (approx::mul_trunc by γ, then β added), the product RMSNorm and LayerNorm end with,
    /// without their normalisation. The server passes `Some(γ)` (promised |γ| < 2^GAMMA_BITS
    /// as for the norms; a larger γ is an error on the server), the client `None`. No bound on
    /// x·γ beyond the ring's head-room (|x·γ| < 2^(ℓ−2) raw at 2f bits). Runs under the
    /// caller's cost class.
    pub fn scale_affine(
        &mut self,
        x: &RingTensor,
        gamma: Option<&[u64]>,
        beta: Option<&[u64]>,
    ) -> Result<RingTensor> {
        check_ring(self, x)?;
        let cols = row_len(x)?;
        let f = self.ax.fp.frac_bits();
        let y = affine(self, x.data(), cols, (gamma, beta), x.ring().bits() - f)?;
        RingTensor::from_vec(x.ring(), x.shape(), y)
    }
}

/// The scaling LayerNorm and RMSNorm share (approx::scale_row): d (centred or not, |d| <
/// 2^dev_bits) times √n/√(Σd² + nε) from the coarse or the fine sum of squares, then ·γ (+ β):
/// the server's `affine` weights (β absent for RMSNorm), the client's `(None, None)`.
fn scale_rows<C: Channel>(
    cx: &mut Ctx<C>,
    d: &[u64],
    cols: usize,
    affine_weights: (Option<&[u64]>, Option<&[u64]>),
    eps: f64,
    dev_bits: u32,
) -> Result<Vec<u64>> {
    let ring = cx.ring();
    let ax = cx.ax;
    let plan = ax.norm_plan(cols, eps, dev_bits);
    // Coarse sum of squares (whole domain) and fine one (exact for small variances).
    // |d| < 2^(dev_bits+f) in the domain: narrow squares and product.
    let dev = dev_bits + ax.fp.frac_bits();
    // With HE keys (1-bit mode), the client's narrow share of d goes encrypted once and serves
    // the sum of squares and d·r (crate::layer_norm_he). Rows whose exact sum of squares needs
    // more than 64 bits (a decoder's wide domain) take the faithful mode's two sums instead.
    let wide = match cx.trunc_mode {
        TruncMode::OneBitError => wide_ring(ring, cols, dev)?,
        TruncMode::Faithful => None,
    };
    let he = match wide {
        Some(w) => layer_norm_he::open(cx, d, Narrow::signed(dev + 1), cols, w)?,
        None => None,
    };
    let (mut coarse, mut fine) = if let Some(wide) = wide {
        let sums = match &he {
            Some(h) => h.square_sums(cx)?,
            None => {
                let dw = cx.extend_to(ring, wide, d)?;
                let sq = cx.square_narrow_in(wide, &dw, Narrow::signed(dev + 1))?;
                row_sums(wide, &sq, cols)
            }
        };
        split_sums(cx, wide, &sums, plan.coarse.frac)?
    } else {
        let dp = round_if(cx, d, plan.pre_shift)?;
        let sq = cx.square_narrow(&dp, Narrow::signed(dev - plan.pre_shift + 2))?;
        let sq = round_if(cx, &sq, plan.square_shift)?;
        let coarse = row_sums(ring, &sq, cols);
        let sq = cx.square_narrow(d, Narrow::signed(dev + 1))?;
        (coarse, row_sums(ring, &sq, cols))
    };
    cx.add_public(&mut coarse, plan.coarse.eps_sum);
    cx.add_public(&mut fine, plan.fine.eps_sum);
    // use_fine = [switch − 1 − S_c ≥ 0]; r = r_c + use_fine·(r_f − r_c).
    let mut diff: Vec<u64> = coarse.iter().map(|&v| ring.neg(v)).collect();
    cx.add_public(&mut diff, plan.switch - 1);
    let (r_c, r_f, use_fine) = layer_norm_rsqrts(cx, &plan, (&coarse, &fine), &diff)?;
    let delta: Vec<u64> = r_f
        .iter()
        .zip(&r_c)
        .map(|(&a, &b)| ring.sub(a, b))
        .collect();
    let pick = cx.mux(&use_fine, &delta)?;
    let r: Vec<u64> = r_c
        .iter()
        .zip(&pick)
        .map(|(&a, &b)| ring.add(a, b))
        .collect();
    let w = plan.out_frac;
    let r_b: Vec<u64> = (0..d.len()).map(|i| r[i / cols]).collect();
    // |d·r| < 2^(ℓ−2) by the choice of w, and the normalised value |d_i·r| ≤ √n·1.01
    // (|d_i| ≤ √(Σd²), the rsqrt's error well below 1 %) is below 2^(f + normalised_bits).
    let out = ax.fp.frac_bits() + normalised_bits(cols) + 1;
    let out = out.min(ring.bits() - w);
    let nrm = match &he {
        Some(h) => h.mul_rows_trunc(cx, &r, w, out)?,
        None => cx.mul_narrow_trunc(d, Narrow::signed(dev + 1), &r_b, w, out)?,
    };
    // |nrm·γ| < 2^(normalised_bits + GAMMA_BITS) in value.
    let out = ax.fp.frac_bits() + normalised_bits(cols) + GAMMA_BITS + 2;
    affine(
        cx,
        &nrm,
        cols,
        affine_weights,
        out.min(ring.bits() - ax.fp.frac_bits()),
    )
}

/// Refuses rows too long for their sum of squares to fit the ring.
fn check_norm_row<C: Channel>(cx: &Ctx<C>, cols: usize, dev_bits: u32) -> Result<()> {
    let max_cols = cx.ax.norm_max_row(dev_bits);
    ensure!(
        cols <= max_cols,
        InvalidArgument,
        "norm rows of {cols} exceed {max_cols} on |x| < 2^{dev_bits} (the sum of squares must fit the ring)"
    );
    Ok(())
}

/// `valid` (one row's column mask) repeated for every row of x.
fn every_row(x: &RingTensor, valid: &[bool]) -> Result<Vec<bool>> {
    let cols = row_len(x)?;
    ensure!(
        valid.len() == cols,
        InvalidArgument,
        "mask of {} for rows of {cols}",
        valid.len()
    );
    Ok(valid.repeat(x.len() / cols))
}

/// The selected columns of every row of a [rows, cols] tensor under a per-row public mask: the
/// selected values are processed flattened, row after row, and scattered back (0 elsewhere).
struct MaskedRows {
    cols: usize,
    /// The selected column indices of each row.
    idx: Vec<Vec<usize>>,
}

impl MaskedRows {
    fn new(x: &RingTensor, mask: &[bool]) -> Result<Self> {
        let cols = row_len(x)?;
        ensure!(
            mask.len() == x.len(),
            InvalidArgument,
            "mask of {} for a tensor of {} values",
            mask.len(),
            x.len()
        );
        let idx = mask
            .chunks(cols)
            .map(|m| (0..cols).filter(|&j| m[j]).collect())
            .collect();
        Ok(MaskedRows { cols, idx })
    }

    fn selected(&self) -> usize {
        self.idx.iter().map(Vec::len).sum()
    }

    fn gather(&self, xs: &[u64]) -> Vec<u64> {
        (self.idx.iter().enumerate())
            .flat_map(|(r, idx)| idx.iter().map(move |&j| xs[r * self.cols + j]))
            .collect()
    }

    /// The row of each selected value, in the flattened order.
    fn row_of_each(&self) -> impl Iterator<Item = usize> + '_ {
        (self.idx.iter().enumerate()).flat_map(|(r, idx)| std::iter::repeat_n(r, idx.len()))
    }

    /// Flattened selected values split back into their rows.
    fn split(&self, v: &[u64]) -> Vec<Vec<u64>> {
        let mut at = 0;
        self.idx
            .iter()
            .map(|idx| {
                at += idx.len();
                v[at - idx.len()..at].to_vec()
            })
            .collect()
    }

    /// Σ of each row's selected values in `ring`.
    fn sums(&self, ring: veil_core::Ring, v: &[u64]) -> Vec<u64> {
        (self.split(v).iter())
            .map(|row| row.iter().fold(0, |a, &x| ring.add(a, x)))
            .collect()
    }

    fn scatter(&self, y: &[u64]) -> Vec<u64> {
        let mut out = vec![0u64; self.idx.len() * self.cols];
        let mut it = y.iter();
        for (r, idx) in self.idx.iter().enumerate() {
            for (&j, &v) in idx.iter().zip(&mut it) {
                out[r * self.cols + j] = v;
            }
        }
        out
    }
}

/// ⌊v_i / s_row(i)⌋ at f bits for the flattened selected values v: one reciprocal per row at
/// the wide fraction, broadcast over the row's values, then one narrow product each.
fn divide_rows<C: Channel>(
    cx: &mut Ctx<C>,
    v: &[u64],
    rows: &MaskedRows,
    nw: Narrow,
    (sums, sums_ring, floor): (&[u64], veil_core::Ring, u32),
) -> Result<Vec<u64>> {
    let w = cx.ax.wide_recip_frac();
    let inv = cx.recip_at(sums, sums_ring, floor, w)?;
    let inv_b: Vec<u64> = rows.row_of_each().map(|r| inv[r]).collect();
    let f = cx.ax.fp.frac_bits();
    cx.mul_narrow_trunc(v, nw, &inv_b, w, f + 2)
}

/// Rows of at most this many values take the all-pairs max in one round ([`max_rows_all_pairs`],
/// 18 flights at ℓ = 41 and 48). A group of s values costs s(s − 1)/2 comparisons.
const ALL_PAIRS_MAX_LEN: usize = 16;

/// Batches of longer rows with at most this many values in all (a decoder step's attention: 9
/// rows of the context's length) cut each row into groups of at most [`ALL_PAIRS_MAX_LEN`] whose
/// maxima are the next round's row, ⌈log_16 n⌉ rounds in all: each round after the first adds
/// 16 flights to Softmax's, where a tree of pairwise maxima adds 12 a level (104 flights against
/// 144 at 41 values). Its groups are as small as the rounds allow, yet they compare about three
/// times as many pairs as the tree at 41 values; a larger batch (a prefill's rows) takes the tree,
/// whose fewer comparisons cost less than the flights it adds (measured in docs/BENCHMARKS.md,
/// session 36).
const GROUPED_MAX_VALUES: usize = 1 << 12;

/// The max of each row (rows of any lengths, an empty row's max is 0): one round of all pairs
/// when the longest row has at most [`ALL_PAIRS_MAX_LEN`] values; rounds of all pairs over
/// groups when the batch is small ([`GROUPED_MAX_VALUES`]); otherwise a tree of pairwise
/// [`Ctx::relu`]-based maxima in one batch per level. Every row takes the same rounds, so they
/// share their flights; all give the row's max exactly (while |x_i − x_j| < 2^(ℓ−1)).
fn max_rows<C: Channel>(
    cx: &mut Ctx<C>,
    mut cur: Vec<Vec<u64>>,
    bound: Option<u32>,
) -> Result<Vec<u64>> {
    let _g = cx.ch.meter().enter(CostClass::Max);
    let longest = cur.iter().map(Vec::len).max().unwrap_or(0);
    let values: usize = cur.iter().map(Vec::len).sum();
    if longest > ALL_PAIRS_MAX_LEN && values > GROUPED_MAX_VALUES {
        return max_rows_tree(cx, cur, bound);
    }
    let mut rounds = max_rounds(longest);
    while rounds > 0 {
        // Each row in groups of at most s values, s the smallest with s^rounds ≥ its length.
        let mut groups = Vec::new();
        let counts: Vec<usize> = cur
            .iter()
            .map(|row| {
                let s = group_len(row.len(), rounds);
                groups.extend(row.chunks(s).map(<[u64]>::to_vec));
                row.len().div_ceil(s)
            })
            .collect();
        let maxima = max_rows_all_pairs(cx, &groups, bound)?;
        let mut at = 0;
        cur = counts
            .iter()
            .map(|&c| {
                at += c;
                maxima[at - c..at].to_vec()
            })
            .collect();
        rounds -= 1;
    }
    Ok(first_or_zero(cur))
}

/// Each row's only value, 0 for an empty row.
fn first_or_zero(rows: Vec<Vec<u64>>) -> Vec<u64> {
    rows.into_iter()
        .map(|v| v.first().copied().unwrap_or(0))
        .collect()
}

/// The tree of [`max_rows`]: max(a, b) = b + ReLU(a − b) on the rows' pairs, one batch per
/// level, as many levels as the longest row needs (14 flights a level).
fn max_rows_tree<C: Channel>(
    cx: &mut Ctx<C>,
    mut cur: Vec<Vec<u64>>,
    bound: Option<u32>,
) -> Result<Vec<u64>> {
    let ring = cx.ring();
    while cur.iter().any(|v| v.len() > 1) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for row in &cur {
            for pair in row.chunks_exact(2) {
                a.push(ring.sub(pair[0], pair[1]));
                b.push(pair[1]);
            }
        }
        let m = cx.relu(&a, bound)?;
        let mut at = 0;
        cur = cur
            .iter()
            .map(|row| {
                let half = row.len() / 2;
                let mut next: Vec<u64> = (at..at + half).map(|i| ring.add(m[i], b[i])).collect();
                at += half;
                if row.len() % 2 == 1 {
                    next.push(row[row.len() - 1]);
                }
                next
            })
            .collect();
    }
    Ok(first_or_zero(cur))
}

/// Rounds of the all-pairs max a row of `len` values needs: ⌈log_16 len⌉ (none for 0 or 1).
fn max_rounds(len: usize) -> u32 {
    let mut rounds = 0;
    let mut reach = 1usize;
    while reach < len {
        reach = reach.saturating_mul(ALL_PAIRS_MAX_LEN);
        rounds += 1;
    }
    rounds
}

/// The smallest group length s ≥ 1 with s^rounds ≥ len (rounds ≥ 1), at most
/// [`ALL_PAIRS_MAX_LEN`] while `rounds` is at least [`max_rounds`]`(len)`.
fn group_len(len: usize, rounds: u32) -> usize {
    (1..=ALL_PAIRS_MAX_LEN)
        .find(|&s| s.checked_pow(rounds).is_none_or(|v| v >= len))
        .unwrap_or(ALL_PAIRS_MAX_LEN)
}

/// The max of each row from all its pairs in one batch: c_ij = [x_i ≥ x_j] for i < j (one DReLU
/// batch), their B2A in a ring of k + 2 bits (n − 1 < 2^k for the longest row's n), then per
/// value the count s_i of the others it beats, x_j ≤ x_i after it and x_j < x_i before it (ties
/// go to the first), so exactly the first maximum has s_i = n − 1: w_i = [s_i − (n − 1) ≥ 0]
/// by a k-bit DReLU, and the max is Σ_i w_i·x_i by one multiplexer. Flights: the comparison
/// batch (11 at ℓ = 41 and 48), the B2A (2), the k-bit DReLU (2 for k ≤ 4, 5 for k ≤ 8), the
/// multiplexer (3). Rows of one value take w = 1 (no pair), empty rows 0.
fn max_rows_all_pairs<C: Channel>(
    cx: &mut Ctx<C>,
    rows: &[Vec<u64>],
    bound: Option<u32>,
) -> Result<Vec<u64>> {
    let ring = cx.ring();
    let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
    let k = (usize::BITS - longest.saturating_sub(1).leading_zeros()).max(1);
    let mut d = Vec::new();
    for row in rows {
        for (i, &xi) in row.iter().enumerate() {
            d.extend(row[i + 1..].iter().map(|&xj| ring.sub(xi, xj)));
        }
    }
    let c = cx.drelu(&d, bound)?;
    let kr = veil_core::Ring::narrow(k + 2)?;
    let a = crate::boolean::bool_to_arith(cx.ot, cx.ch, cx.role, kr, &c)?;
    let public = |v: u64| if cx.is_server() { kr.reduce(v) } else { 0 };
    let mut s = Vec::with_capacity(rows.iter().map(Vec::len).sum());
    let mut first = 0;
    for row in rows {
        let n = row.len();
        // Pair (i, j), i < j, of this row: its index in the row's block of d.
        let pair = |i: usize, j: usize| first + i * n - i * (i + 1) / 2 + (j - i - 1);
        for i in 0..n {
            let mut v = public(kr.neg(n as u64 - 1));
            for j in 0..n {
                if j > i {
                    v = kr.add(v, a[pair(i, j)]);
                } else if j < i {
                    v = kr.add(v, kr.sub(public(1), a[pair(j, i)]));
                }
            }
            s.push(v);
        }
        first += n * n.saturating_sub(1) / 2;
    }
    let w = cx.drelu_in(kr, &s, Some(k))?;
    let flat: Vec<u64> = rows.iter().flatten().copied().collect();
    let picked = cx.mux(&w, &flat)?;
    let mut at = 0;
    Ok(rows
        .iter()
        .map(|row| {
            at += row.len();
            picked[at - row.len()..at]
                .iter()
                .fold(0, |acc, &v| ring.add(acc, v))
        })
        .collect())
}

/// |γ| < 2^GAMMA_BITS (32) is promised by the server: the product by γ is then driven by
/// f + GAMMA_BITS + 1 bits of γ instead of ℓ; a larger γ is an error on the server. Real
/// checkpoints stay far below: max |γ| is 1.55 in all-MiniLM-L6-v2 and its fine-tuned
/// substitutes, 2.72 in all-mpnet-base-v2.
pub(crate) const GAMMA_BITS: u32 = 5;

/// The server's LayerNorm weights γ, β (raw fixed point at f bits, one per column), for
/// [`Ctx::layer_norm`] and [`Ctx::centre_affine`]: the server promises |γ| < 32 (2^`GAMMA_BITS`),
/// and a larger γ is an error on the server.
pub struct AffineParams<'a> {
    /// γ, one per column.
    pub gamma: &'a [u64],
    /// β, one per column.
    pub beta: &'a [u64],
}

/// x − mean(x) per row (approx::centre): local sums, then two cheap truncations per row.
fn centre<C: Channel>(cx: &mut Ctx<C>, xs: &[u64], cols: usize) -> Result<Vec<u64>> {
    let ring = cx.ring();
    let sums: Vec<u64> = xs
        .chunks(cols)
        .map(|c| c.iter().fold(0, |a, &v| ring.add(a, v)))
        .collect();
    let mu = mean_of_sums(cx, &sums, cols)?;
    Ok(xs
        .iter()
        .enumerate()
        .map(|(i, &v)| ring.sub(v, mu[i / cols]))
        .collect())
}

/// approx::mean_of_sum on shares.
fn mean_of_sums<C: Channel>(cx: &mut Ctx<C>, sums: &[u64], n: usize) -> Result<Vec<u64>> {
    let (p, c) = cx.ax.mean_params(n);
    let t = if p > 0 {
        cx.trunc(sums, p)?
    } else {
        sums.to_vec()
    };
    cx.scale_trunc(
        &t,
        c,
        cx.ax.fp.frac_bits() + veil_core::approx::MEAN_EXTRA_BITS,
    )
}

/// ⌊v·γ⌋_f + β with the server's γ and β (β absent for RMSNorm; shape-checked on the server),
/// for |v·γ| / 2^f below 2^(out−1) − 2.
fn affine<C: Channel>(
    cx: &mut Ctx<C>,
    v: &[u64],
    cols: usize,
    (gamma, beta): (Option<&[u64]>, Option<&[u64]>),
    out: u32,
) -> Result<Vec<u64>> {
    let ring = cx.ring();
    if let Some(g) = gamma {
        let beta_len = beta.map_or(cols, <[u64]>::len);
        ensure!(
            g.len() == cols && beta_len == cols,
            InvalidArgument,
            "γ/β of length {}/{beta_len} for rows of {cols}",
            g.len()
        );
    }
    if let Some(b) = beta {
        ensure!(
            b.iter().all(|&b| ring.contains(b)),
            InvalidArgument,
            "β outside the ring"
        );
    }
    let f = cx.ax.fp.frac_bits();
    let g_bits = f + GAMMA_BITS + 1;
    let mut y = cx.mul_server_trunc(v, cols, gamma, g_bits, f, out)?;
    if let Some(b) = beta {
        for (i, yi) in y.iter_mut().enumerate() {
            *yi = ring.add(*yi, b[i % cols]);
        }
    }
    Ok(y)
}

/// Integer bits of the largest normalised LayerNorm value: |d_i|/σ ≤ √n, times 1.01 for the
/// rsqrt's error.
fn normalised_bits(n: usize) -> u32 {
    ((n as f64).sqrt() * 1.01).log2().ceil().max(0.0) as u32
}

/// The 1-bit-error mode's sums of squares come from one exact sum Σd² in a ring of
/// W = 2·dev + ⌈log2 n⌉ + 2 ≤ 64 bits (60 for BERT rows at (41, 13)), the narrowest (and at
/// least ℓ) where Σd² < 2^(W−2) is exact and can be truncated (on COTs every square's COT is
/// W − j bits wide, so the narrowest ring is the cheapest). The fine sum is its low ℓ bits (the
/// faithful path's value), the coarse one ⌊Σd² / 2^(2f − g_c)⌋ per row (1 ulp low at most; the
/// faithful path rounds each d and d² instead, which is coarser). `None` when W would exceed 64.
fn wide_ring(ring: veil_core::Ring, cols: usize, dev: u32) -> Result<Option<veil_core::Ring>> {
    let log_n = usize::BITS - (cols - 1).leading_zeros();
    if 2 * dev + log_n > 62 {
        return Ok(None);
    }
    // At least ℓ bits: the fine sum is the wide sum's low ℓ bits.
    veil_core::Ring::new((2 * dev + log_n + 2).max(ring.bits())).map(Some)
}

/// (coarse, fine) from the wide sums of squares ([`wide_ring`]).
fn split_sums<C: Channel>(
    cx: &mut Ctx<C>,
    wide: veil_core::Ring,
    sums: &[u64],
    coarse_frac: u32,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let ring = cx.ring();
    let fine = sums.iter().map(|&v| ring.reduce(v)).collect();
    let coarse = cx.trunc_in(wide, sums, 2 * cx.ax.fp.frac_bits() - coarse_frac)?;
    Ok((coarse.iter().map(|&v| ring.reduce(v)).collect(), fine))
}

/// Σ of each row of `cols` values.
fn row_sums(ring: veil_core::Ring, v: &[u64], cols: usize) -> Vec<u64> {
    v.chunks(cols)
        .map(|c| c.iter().fold(0, |a, &x| ring.add(a, x)))
        .collect()
}

/// approx::round_if on shares: rounded truncation by s bits, nothing for s = 0.
fn round_if<C: Channel>(cx: &mut Ctx<C>, v: &[u64], s: u32) -> Result<Vec<u64>> {
    if s == 0 {
        Ok(v.to_vec())
    } else {
        cx.round(v, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_harness::{fp, open, pick, run_mem, share_values};
    use veil_core::approx::Approx;

    fn ax() -> Approx {
        Approx::new(fp()).unwrap()
    }

    /// The private row max of `rows` (signed values, `cols` each) under a row-major `mask`,
    /// opened.
    fn private_row_max(a: Approx, rows: &[Vec<i64>], cols: usize, mask: &[bool]) -> Vec<u64> {
        let ring = a.fp.ring;
        let flat: Vec<u64> = rows
            .iter()
            .flatten()
            .map(|&v| ring.from_signed(v))
            .collect();
        let x = share_values(ring, &flat);
        open(run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, a);
            let t =
                RingTensor::from_vec(ring, &[rows.len(), cols], pick(role, &x).data().to_vec())?;
            let masked = MaskedRows::new(&t, mask)?;
            let m = max_rows(&mut cx, masked.split(&masked.gather(t.data())), None)?;
            RingTensor::from_vec(ring, &[m.len()], m)
        }))
    }

    /// The row max of masked rows of every length up to beyond [`ALL_PAIRS_MAX_LEN`] and of a
    /// few longer ones (so one, two and three rounds run) equals the plaintext max: random values, ties,
    /// all-equal rows, extremes at ±(2^(ℓ−2) − 1) (differences below 2^(ℓ−1)), rows of one
    /// value and empty rows (max 0) under a per-row mask.
    #[test]
    fn row_max_equals_the_plaintext_max_at_every_length() {
        let a = ax();
        let ring = a.fp.ring;
        let top = (1i64 << (ring.bits() - 2)) - 1;
        let mut prg = veil_core::Prg::from_os_entropy();
        for cols in (1..=ALL_PAIRS_MAX_LEN + 3).chain([41, 256, 257]) {
            let mut rows: Vec<Vec<i64>> = Vec::new();
            for kind in 0..6 {
                rows.push(
                    (0..cols)
                        .map(|_| {
                            let r = prg.u64();
                            match kind {
                                0 => (r % 7) as i64 - 3,
                                1 => 5,
                                2 => [top, -top, 0][(r % 3) as usize],
                                _ => ring.to_signed(ring.reduce(r)) >> 3,
                            }
                        })
                        .collect(),
                );
            }
            // Row r sees its first (r + cols) % (cols + 1) columns: lengths 0 … cols, the
            // longest (cols) always among them.
            let lens: Vec<usize> = (0..rows.len()).map(|r| (r + cols) % (cols + 1)).collect();
            let mask: Vec<bool> = lens
                .iter()
                .flat_map(|&n| (0..cols).map(move |j| j < n))
                .collect();
            let m = private_row_max(a, &rows, cols, &mask);
            for (r, row) in rows.iter().enumerate() {
                let want = row[..lens[r]].iter().copied().max().unwrap_or(0);
                assert_eq!(
                    ring.to_signed(m[r]),
                    want,
                    "{cols} columns, row {r}: {row:?}"
                );
            }
        }
    }

    #[test]
    fn row_max_is_exact_including_ties_and_padding() {
        let a = ax();
        let ring = a.fp.ring;
        let big = (1i64 << 38) - 1;
        let rows: Vec<Vec<i64>> = vec![
            vec![5, 5, 5, 5, 5],
            vec![-big, big, 0, -1, 1],
            vec![-3, -7, -1, -2, -9],
            vec![0, 0, -1, 0, 0],
            vec![1, 2, 3, 4, 100],
        ];
        let cols = 5;
        // Column 4 is padding; the last row has only its first two columns.
        let mut mask: Vec<bool> = [true, true, true, true, false].repeat(rows.len());
        mask[4 * cols + 2..].fill(false);
        let m = private_row_max(a, &rows, cols, &mask);
        for (r, row) in rows.iter().enumerate() {
            let want = row[..if r == 4 { 2 } else { 4 }]
                .iter()
                .copied()
                .max()
                .unwrap();
            assert_eq!(ring.to_signed(m[r]), want, "row {r}");
        }
    }

    /// A batch above [`GROUPED_MAX_VALUES`] takes the tree: rows of 300 values (ties, one
    /// maximum at either end, random) and shorter ones under the mask, exact.
    #[test]
    fn row_max_of_a_large_batch_is_exact() {
        let a = ax();
        let ring = a.fp.ring;
        let cols = 300;
        let mut prg = veil_core::Prg::from_os_entropy();
        let rows: Vec<Vec<i64>> = (0..16)
            .map(|r| {
                (0..cols)
                    .map(|j| match r % 4 {
                        0 => 7,
                        1 => i64::from(j == 0) * 50 - 20,
                        2 => i64::from(j == cols - 1) * 50 - 20,
                        _ => ring.to_signed(ring.reduce(prg.u64())) >> 3,
                    })
                    .collect()
            })
            .collect();
        let lens: Vec<usize> = (0..rows.len()).map(|r| cols - 17 * (r % 3)).collect();
        let mask: Vec<bool> = lens
            .iter()
            .flat_map(|&n| (0..cols).map(move |j| j < n))
            .collect();
        assert!(mask.iter().filter(|&&v| v).count() > GROUPED_MAX_VALUES);
        let m = private_row_max(a, &rows, cols, &mask);
        for (r, row) in rows.iter().enumerate() {
            let want = row[..lens[r]].iter().copied().max().unwrap();
            assert_eq!(ring.to_signed(m[r]), want, "row {r}");
        }
    }
}
