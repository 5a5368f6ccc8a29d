//! The non-linearities decoder LLMs add to the encoder's: SiLU (the gated MLP of the Llama
//! family), its substitute hard-swish, and RMSNorm. GELU-tanh (GPT-2) is [`Approx::gelu`] itself, the causal softmax is
//! [`Approx::softmax_row`] with the prefix of visible keys as its mask (masked entries are
//! excluded from the max and the sum and output exactly 0), and the decoders' LayerNorm is
//! [`Approx::layer_norm_row_at`] on a wider domain. Every step is one a two-party protocol does on
//! shares: comparisons, exp_neg, Goldschmidt's quotient, products followed by truncations.

use super::{Approx, LayerNormPlan, SplitSpec};

/// Max |approx::silu − reference::silu| over |x| ≤ 64, every raw input, at (41, 13) and (48, 13):
/// 1.70e-4 at |x| ≈ 2.39 (the cubic fits' ≤ 1.03e-4, the output's half ulp, the truncated
/// powers). From |x| = [`SILU_TAIL`] on SiLU is ReLU exactly (ψ(12) = 7.4e-5).
pub const SILU_MAX_ERROR: f64 = 1.8e-4;

/// ψ(a) = a·σ(−a) (a ≥ 0) is taken as 0 from a = SILU_TAIL on (ψ(12) = 7.4e-5).
pub const SILU_TAIL: f64 = 12.0;

/// (start, [C_0, C_1, C_2, C_3]): ψ(a) ≈ C_0 + C_1·a + C_2·a² + C_3·a³ on [start, next start)
/// (the last segment ends at [`SILU_TAIL`]); weighted least-squares (Lawson) minimax fits, max
/// fit errors 6.0e-5, 3.7e-5, 1.03e-4, 5.5e-5, 7.3e-5, 5.4e-5 (least squares on 4,000 points
/// per segment, reweighted by the residuals 300 times); the first has C_0 = 0, so SiLU(0) = 0.
pub const SILU_SEGMENTS: [(f64, [f64; 4]); 6] = [
    (0.0, [0.0, 0.501578703, -0.262526234, 0.028738315]),
    (0.8, [-0.000498376, 0.513764778, -0.291744629, 0.047383974]),
    (1.8, [0.207788949, 0.184332013, -0.116185724, 0.015824691]),
    (3.0, [0.632739499, -0.250639587, 0.033390121, -0.001444436]),
    (4.8, [0.521287031, -0.197191038, 0.025586962, -0.001131966]),
    (7.5, [0.112375415, -0.030501158, 0.002775554, -0.000084503]),
];

/// SiLU's odd split ([`Approx::silu`]): the narrow ring of 40 bits holds a_c·a2 < 12³·2^26 <
/// 2^37 and V = ψ·2^39 < 2^37.2; the comparisons on a_c − t_j take 17 bits (12·2^13 < 2^17);
/// the coefficients carry 26 extra bits (C_3·a³ on the last segment, a³ ≤ 1728, needs them).
pub const SILU_SPLIT: SplitSpec = SplitSpec {
    tail: SILU_TAIL,
    segments: &SILU_SEGMENTS,
    ring_bits: 40,
    cmp_bits: 17,
    coef_frac: 26,
};

/// Extra fractional bits e of hard-swish's gate factor ([`Approx::hard_swish_factor`]): the
/// factor 1/6 is K = round(2^(f+e)/6), 7.6e-6 relative off at e = 5, so the saturated side
/// (x ≥ 3, factor 1) gives x·u exactly for |x·u| < 16; the final product fac·⌊x·u⌋_f stays in the
/// 48-bit ring for |x·u| < 2^(47 − 2f − e − 1) = 2^15.
pub const HARD_SWISH_EXTRA_BITS: u32 = 5;

/// Max |approx::hard_swish_gated(x, 1) − reference::hard_swish(x)| over |x| ≤ 64, every raw input,
/// at (48, 13): K's excess 7.6e-6·|x| plus the output's floor (1 ulp); measured 4.88e-4 at x = 64.
/// Between −3 and 3, where the factor is not saturated, the error stays within 2 ulps.
pub const HARD_SWISH_MAX_ERROR: f64 = 5e-4;

/// Max error of RMSNorm's normalised value x/√(mean(x²) + ε) vs f64 on a row in the domain,
/// as a + b·|value| (the output then adds ≤ 1.5 ulp + |γ|·this): the output quantisation at W
/// bits (|x|·2^-W) plus the rsqrt's relative error. Checked by the test on rows of 64 to 2,048
/// values from 0.05 to a 60,000 outlier at (48, 13), |x| < 2^16 (worst seen: 0.63 of the bound).
pub const RMS_NORM_ERROR: (f64, f64) = (2e-3, 1e-3);

impl Approx {
    /// SiLU(x) = x·σ(x), evaluated as ReLU(x) − ψ(|x|) with ψ(a) = a·σ(−a) = a/(1 + e^a)
    /// (σ(x) = 1 − σ(−x)), so only a bounded correction (ψ ≤ 0.279) is approximated: ψ is a
    /// cubic on each of the six segments [`SILU_SEGMENTS`] of [0, [`SILU_TAIL`]) and 0 beyond,
    /// GELU's algorithm with SiLU's constants ([`Approx::odd_split`] with [`SILU_SPLIT`]):
    /// a ReLU, one clamp comparison, two narrow products and five 17-bit comparisons instead of
    /// an exp and a quotient.
    /// Domain: every x. Max error vs f64: [`SILU_MAX_ERROR`].
    pub fn silu(&self, x: u64) -> u64 {
        self.odd_split(&self.silu_plan(), x, None)
    }

    /// [`Approx::silu`] with its two sign comparisons promised |x| < 2^k
    /// ([`Approx::odd_split`]'s `bound`; a decoder's provable bound on its gate,
    /// `veil_model::FixedDecoder::activation_bits`): equal to it on that domain.
    pub fn silu_within(&self, x: u64, bound: Option<u32>) -> u64 {
        self.odd_split(&self.silu_plan(), x, bound)
    }

    /// The public constants of [`Approx::silu`].
    pub fn silu_plan(&self) -> super::SplitPlan {
        self.split_plan(&SILU_SPLIT)
    }

    /// Hard-swish's gate factor min(max(x + 3, 0), 6)/6 ∈ [0, 1] at f + [`HARD_SWISH_EXTRA_BITS`]
    /// fractional bits: c = ReLU(x + 3) − ReLU(x − 3) (exact, c ∈ [0, 6]), then ⌊c·K / 2^f⌋ with
    /// K = [`Approx::hard_swish_sixth`]. Under MPC: one ReLU call on x ± 3 and one truncation.
    /// Domain: |x| < 2^[`super::RELU_DOMAIN_BITS`] − 3 (the ReLUs' promised bound).
    pub fn hard_swish_factor(&self, x: u64) -> u64 {
        let ring = self.fp.ring;
        let three = 3u64 << self.fp.frac_bits();
        let c = ring.sub(self.relu(ring.add(x, three)), self.relu(ring.sub(x, three)));
        self.mul_trunc_by(c, self.hard_swish_sixth(), self.fp.frac_bits())
    }

    /// K = round(2^(f+e)/6), the public constant of [`Approx::hard_swish_factor`].
    pub fn hard_swish_sixth(&self) -> u64 {
        let e = self.fp.frac_bits() + HARD_SWISH_EXTRA_BITS;
        ((1u64 << e) + 3) / 6
    }

    /// fac·v for a factor of [`Approx::hard_swish_factor`] and a value v at f bits:
    /// ⌊fac·v / 2^(f+e)⌋.
    pub fn hard_swish_apply(&self, fac: u64, v: u64) -> u64 {
        self.mul_trunc_by(fac, v, self.fp.frac_bits() + HARD_SWISH_EXTRA_BITS)
    }

    /// The gated MLP's hard-swish(x)·u as the protocol computes it: the factor of x applied to
    /// ⌊x·u⌋_f, so x·u is a product that runs beside the factor's ReLUs rather than after them.
    /// Max error vs f64 (u = 1): [`HARD_SWISH_MAX_ERROR`].
    pub fn hard_swish_gated(&self, x: u64, u: u64) -> u64 {
        self.hard_swish_apply(self.hard_swish_factor(x), self.mul_trunc(x, u))
    }

    /// RMSNorm of one row: ⌊⌊x_i·r⌋_W·γ_i⌋_f with r ≈ 1/√(Σx²/n + ε), for |x| < 2^dev_bits.
    /// The sum of squares, its rsqrt and the output are LayerNorm's ([`Approx::scale_row`] with
    /// the plan of [`Approx::norm_plan`]) without the centring and without β: the coarse sum
    /// pre-shifts x by k bits so that n values below 2^dev_bits square into the ring. Error vs
    /// f64: [`RMS_NORM_ERROR`] per normalised value.
    pub fn rms_norm_row(&self, row: &[u64], gamma: &[u64], eps: f64, dev_bits: u32) -> Vec<u64> {
        let plan = self.norm_plan(row.len(), eps, dev_bits);
        self.rms_norm_row_planned(&plan, row, gamma)
    }

    /// [`Approx::rms_norm_row`] with its plan made once for many rows.
    pub fn rms_norm_row_planned(
        &self,
        plan: &LayerNormPlan,
        row: &[u64],
        gamma: &[u64],
    ) -> Vec<u64> {
        self.scale_row(plan, row, gamma, None)
    }
}

/// The real-valued decoder functions (test oracles).
pub mod reference {
    /// x·σ(x).
    pub fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    /// x·min(max(x + 3, 0), 6)/6.
    pub fn hard_swish(x: f64) -> f64 {
        x * (x + 3.0).clamp(0.0, 6.0) / 6.0
    }

    /// x_i·γ_i / √(Σx²/n + ε).
    pub fn rms_norm(row: &[f64], gamma: &[f64], eps: f64) -> Vec<f64> {
        let ms = row.iter().map(|x| x * x).sum::<f64>() / row.len() as f64;
        let r = 1.0 / (ms + eps).sqrt();
        row.iter().zip(gamma).map(|(x, g)| x * r * g).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference as enc_ref;
    use super::*;
    use crate::{FixedPoint, Prg};

    fn formats() -> [Approx; 2] {
        [
            Approx::new(FixedPoint::default_format()).unwrap(),
            Approx::new(FixedPoint::new(48, 13).unwrap()).unwrap(),
        ]
    }

    #[test]
    fn silu_sweep_whole_domain() {
        for a in formats() {
            let fp = a.fp;
            let mut worst = (0.0f64, 0.0);
            for x in -(64i64 << 13)..=(64 << 13) {
                let xv = fp.ring.from_signed(x);
                let err = (fp.decode(a.silu(xv)) - reference::silu(fp.decode(xv))).abs();
                if err > worst.0 {
                    worst = (err, fp.decode(xv));
                }
            }
            assert!(
                worst.0 <= SILU_MAX_ERROR,
                "silu error {} at {}",
                worst.0,
                worst.1
            );
            let r = fp.ring;
            let top = r.bits() - 1;
            for x in [
                1i64 << 20,
                -(1 << 20),
                (1 << (top - 1)) + 7,
                -(1 << top),
                (1 << top) - 1,
            ] {
                let v = r.from_signed(x);
                assert_eq!(a.silu(v), a.relu(v), "silu({x}) is ReLU beyond the tail");
            }
            assert_eq!(a.silu(0), 0);
        }
    }

    /// The bounded split (a decoder's provable gate bound) is the unbounded one on its domain
    /// |x| < 2^k, at the domain's edges and for random values of every magnitude below it; and
    /// just outside it, it is what the protocol's k-bit comparisons make of x, not SiLU.
    #[test]
    fn bounded_silu_equals_silu_on_its_domain() {
        let mut prg = Prg::from_os_entropy();
        for a in formats() {
            let r = a.fp.ring;
            let tail_bits = 64 - a.silu_plan().tail.leading_zeros();
            for k in [tail_bits + 1, 21, r.bits() - 2, r.bits() - 1] {
                let edge = (1i64 << k) - 1;
                let mut xs = vec![0, 1, -1, edge, -edge, edge - 1, -edge + 1];
                for _ in 0..5_000 {
                    let bits = 1 + prg.u64() % u64::from(k);
                    xs.push(r.to_signed(r.reduce(prg.u64() >> (64 - bits))));
                    xs.push(-xs[xs.len() - 1]);
                }
                for &x in &xs {
                    let v = r.from_signed(x);
                    assert_eq!(a.silu_within(v, Some(k)), a.silu(v), "silu({x}) at k = {k}");
                    assert_eq!(a.gelu_within(v, Some(k)), a.gelu(v), "gelu({x}) at k = {k}");
                }
                if k < r.bits() - 1 {
                    // 2^k + 5 looks negative to a k-bit comparison: ReLU gives 0, not x.
                    let out = r.from_signed((1i64 << k) + 5);
                    assert_ne!(a.silu_within(out, Some(k)), a.silu(out), "outside, k = {k}");
                }
            }
        }
    }

    /// Properties of the split over the whole ring (random values of every magnitude and the
    /// segment and tail edges): silu(x) − silu(−x) = x exactly (the correction is even), ReLU
    /// exactly from the tail on, 0 at 0, and the error bound up to |x| = 64.
    #[test]
    fn silu_is_an_odd_split_over_the_whole_ring() {
        let mut prg = Prg::from_os_entropy();
        for a in formats() {
            let (fp, r) = (a.fp, a.fp.ring);
            let plan = a.silu_plan();
            let tail = r.to_signed(plan.tail);
            let mut xs: Vec<i64> = vec![0, 1, -1, tail - 1, tail, tail + 1];
            for &t in plan.breaks() {
                let t = plan.ring.to_signed(t);
                xs.extend([t - 1, t, t + 1]);
            }
            for _ in 0..20_000 {
                let bits = 1 + prg.u64() % u64::from(r.bits() - 1);
                xs.push(r.to_signed(r.reduce(prg.u64() >> (64 - bits))));
            }
            for &x in &xs {
                for x in [x, -x] {
                    let v = r.from_signed(x);
                    let y = a.silu(v);
                    assert_eq!(r.sub(y, a.silu(r.neg(v))), v, "silu({x}) − silu(−x) = x");
                    if x.unsigned_abs() >= tail.unsigned_abs() {
                        assert_eq!(y, a.relu(v), "silu({x}) is ReLU from the tail on");
                    } else {
                        let err = (fp.decode(y) - reference::silu(fp.decode(v))).abs();
                        assert!(err <= SILU_MAX_ERROR, "silu({x}) error {err}");
                    }
                }
            }
        }
    }

    /// Hard-swish within its bound over |x| ≤ 64 at every raw input of the decoder format, x
    /// itself from x = 3 on while |x| < 16 (the factor is 1 to 7.6e-6), 0 at and below −3, and
    /// the gated form ⌊fac·⌊x·u⌋⌋ against f64 on random (x, u).
    #[test]
    fn hard_swish_sweep_and_gated_products() {
        let a = Approx::new(FixedPoint::new(48, 13).unwrap()).unwrap();
        let (fp, r) = (a.fp, a.fp.ring);
        let one = fp.encode(1.0);
        let mut worst = (0.0f64, 0.0);
        for x in -(64i64 << 13)..=(64 << 13) {
            let v = r.from_signed(x);
            let y = a.hard_swish_gated(v, one);
            let err = (fp.decode(y) - reference::hard_swish(fp.decode(v))).abs();
            if err > worst.0 {
                worst = (err, fp.decode(v));
            }
            if x <= -(3 << 13) {
                assert_eq!(y, 0, "hard_swish({x}) = 0");
            } else if x < 3 << 13 {
                assert!(
                    err <= 2.0 / 8192.0,
                    "hard_swish({x}) error {err} in (−3, 3)"
                );
            }
            if (3 << 13..16 << 13).contains(&x) {
                assert_eq!(y, v, "hard_swish({x}) = x");
            }
        }
        assert!(
            worst.0 <= HARD_SWISH_MAX_ERROR,
            "hard-swish error {} at {}",
            worst.0,
            worst.1
        );
        let mut prg = Prg::from_os_entropy();
        for _ in 0..20_000 {
            let (x, u) = (
                random_row(&mut prg, 1, 8.0)[0],
                random_row(&mut prg, 1, 30.0)[0],
            );
            let (xv, uv) = (fp.encode(x), fp.encode(u));
            let (xq, uq) = (fp.decode(xv), fp.decode(uv));
            let got = fp.decode(a.hard_swish_gated(xv, uv));
            let want = reference::hard_swish(xq) * uq;
            // ⌊x·u⌋'s ulp times the factor, the factor's error times |x·u|, the output's ulp.
            let bound = 2.0 / 8192.0 + (xq * uq).abs() * 1.2e-5;
            assert!(
                (got - want).abs() <= bound,
                "hard_swish({xq})·{uq}: {got} vs {want}"
            );
        }
    }

    fn random_row(prg: &mut Prg, n: usize, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|_| (prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale)
            .collect()
    }

    /// RMSNorm at the decoder format on rows of small, typical and massive values (one outlier
    /// near the domain's edge, as SmolLM2's residual stream has), against f64 on the same
    /// quantised inputs.
    #[test]
    fn rms_norm_rows_match_f64() {
        let a = Approx::new(FixedPoint::new(48, 13).unwrap()).unwrap();
        let fp = a.fp;
        let dev_bits = 16;
        let mut prg = Prg::from_os_entropy();
        for (n, scale, outlier) in [
            (576, 0.05, None),
            (576, 1.0, None),
            (576, 1000.0, None),
            (576, 30.0, Some(60_000.0)),
            (64, 3.0, Some(-25_000.0)),
            (2048, 100.0, None),
        ] {
            for _ in 0..4 {
                let mut row = random_row(&mut prg, n, scale);
                if let Some(o) = outlier {
                    row[n / 3] = o;
                }
                let gamma = random_row(&mut prg, n, 2.0);
                let raw: Vec<u64> = row.iter().map(|&x| fp.encode(x)).collect();
                let g_raw: Vec<u64> = gamma.iter().map(|&x| fp.encode(x)).collect();
                let q: Vec<f64> = raw.iter().map(|&x| fp.decode(x)).collect();
                let gq: Vec<f64> = g_raw.iter().map(|&x| fp.decode(x)).collect();
                let got = a.rms_norm_row(&raw, &g_raw, 1e-5, dev_bits);
                let unit = reference::rms_norm(&q, &vec![1.0; n], 1e-5);
                let want = reference::rms_norm(&q, &gq, 1e-5);
                for i in 0..n {
                    let err = (fp.decode(got[i]) - want[i]).abs();
                    let bound = 1.5 / 8192.0
                        + gq[i].abs() * (RMS_NORM_ERROR.0 + RMS_NORM_ERROR.1 * unit[i].abs());
                    assert!(
                        err <= bound,
                        "rms_norm error {err} > {bound} (n {n}, scale {scale}, x {}, γ {})",
                        q[i],
                        gq[i]
                    );
                }
            }
        }
    }

    /// The decoders' wide LayerNorm (GPT-2) on a row with an outlier beyond the encoder domain.
    #[test]
    fn wide_layer_norm_matches_f64() {
        let a = Approx::new(FixedPoint::new(48, 13).unwrap()).unwrap();
        let fp = a.fp;
        let mut prg = Prg::from_os_entropy();
        let mut row = random_row(&mut prg, 768, 5.0);
        row[5] = 3000.0;
        let gamma = random_row(&mut prg, 768, 1.0);
        let beta = random_row(&mut prg, 768, 1.0);
        let enc = |v: &[f64]| v.iter().map(|&x| fp.encode(x)).collect::<Vec<u64>>();
        let (raw, g, b) = (enc(&row), enc(&gamma), enc(&beta));
        let dec = |v: &[u64]| v.iter().map(|&x| fp.decode(x)).collect::<Vec<f64>>();
        let got = dec(&a.layer_norm_row_at(&raw, &g, &b, 1e-5, 16));
        let want = enc_ref::layer_norm(&dec(&raw), &dec(&g), &dec(&b), 1e-5);
        for (x, y) in got.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-2, "wide LayerNorm {x} vs {y}");
        }
    }

    /// Causal softmax is softmax_row with a prefix mask: masked keys contribute exactly zero,
    /// whatever their scores (here huge ones that would dominate the max).
    #[test]
    fn causal_mask_entries_contribute_exactly_zero() {
        let a = Approx::new(FixedPoint::new(48, 13).unwrap()).unwrap();
        let fp = a.fp;
        let row: Vec<u64> = [1.0, -2.0, 0.5, 50.0, 1e4]
            .iter()
            .map(|&x| fp.encode(x))
            .collect();
        let visible = [true, true, true, false, false];
        let got = a.softmax_row(&row, &visible);
        assert_eq!(&got[3..], &[0, 0]);
        let prefix = a.softmax_row(&row[..3], &visible[..3]);
        assert_eq!(&got[..3], &prefix[..]);
    }
}
