//! A provable bound on the outputs of a linear layer that reads a normalised row, the input of
//! every GELU and SiLU in Veil's models (an encoder's FFN after its LayerNorm, a decoder's MLP
//! after its RMSNorm or LayerNorm), so that the activation's two sign comparisons run on k bits
//! instead of ℓ − 1 (`veil_nonlinear::Ctx::odd_split`'s `bound`).
//!
//! g_j = Σ_i W_ji·y_i (+ b_j) with y_i = γ_i·z_i (+ β_i), where the exact normalised row ẑ
//! (RMSNorm: x/√(mean x² + ε); LayerNorm: (x − μ)/√(var + ε)) has ‖ẑ‖₂ ≤ √d whatever x is. The
//! fixed-point y differs from γ_i·ẑ_i (+ β_i) by at most |γ_i|·(a + b·|ẑ_i|) + c per value (the
//! norm's documented error bound in either truncation mode), and g adds a few ulps of rounding.
//! By Cauchy–Schwarz,
//!
//!   |g_j| ≤ (1 + b)·√d·‖W_j ⊙ γ‖₂ + a·‖W_j ⊙ γ‖₁ + (c + 4u)·‖W_j‖₁ + |W_j·β| + |b_j| + 4u,
//!
//! u = 2^-f, for every input row in the norm's domain: the bound holds for any prompt, not only
//! for the text it was measured on, and needs no trained promise. k is the smallest width with
//! max_j |g_j|·2^f < 2^k, raised to the split's tail (the clamp compares |g| − A on k bits too).
//!
//! Public to the client: a server announces k at admission (one integer per model, a coarse
//! function of its weights' largest row norm).

use veil_core::approx::{
    layer_norm_error_bound, Approx, SplitPlan, LAYER_NORM_VAR_FLOOR_BITS, RMS_NORM_ERROR,
};
use veil_core::{FixedPoint, Ring};

use crate::sim::{FixedBlock, FixedLinear};
use crate::variants::{Activation, LayerNormKind};
use crate::ModelConfig;

/// A normalisation's public error bound on y_i = γ_i·ẑ_i (+ β_i): |γ_i|·(a + b·|ẑ_i|) + c.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormError {
    pub a: f64,
    pub b: f64,
    pub c: f64,
}

impl NormError {
    /// The part of every norm's output error that no multiple of γ covers: the one-bit-error
    /// mode's (2e-3 + 3 ulp)·(1 + |γ|) (`veil_nonlinear::layers`), more than the faithful
    /// mode's 1 to 1.5 ulp.
    fn absolute(fp: FixedPoint) -> f64 {
        2e-3 + 3.0 / fp.scale()
    }

    /// RMSNorm on rows in its domain (`RMS_NORM_ERROR`).
    pub(crate) fn rms_norm(fp: FixedPoint) -> Self {
        let (a, b) = RMS_NORM_ERROR;
        NormError {
            a,
            b,
            c: Self::absolute(fp),
        }
    }

    /// LayerNorm on rows with var + ε ≥ `var_floor`: `layer_norm_error_bound` and RMSNorm's
    /// relative term, which LayerNorm's output quantisation shares.
    pub(crate) fn layer_norm(fp: FixedPoint, var_floor: f64) -> Self {
        NormError {
            a: layer_norm_error_bound(var_floor),
            b: RMS_NORM_ERROR.1,
            c: Self::absolute(fp),
        }
    }

    /// An encoder's LayerNorm on rows in its domain (var + ε ≥ max(ε, the variance floor)), any
    /// row length: the 3.3e-3 more `layer_norm_error_bound` allows rows longer than 1,948 values.
    fn encoder_layer_norm(fp: FixedPoint, eps: f64) -> Self {
        let floor = eps.max((-f64::from(LAYER_NORM_VAR_FLOOR_BITS)).exp2());
        let mut e = Self::layer_norm(fp, floor);
        e.a += 3.3e-3;
        e
    }
}

/// The normalisation in front of a linear layer: γ and β at f bits, and its error bound.
pub(crate) struct NormedInput<'a> {
    pub gamma: &'a [u64],
    pub beta: Option<&'a [u64]>,
    pub error: NormError,
}

/// max_j of the module's bound on |g_j| in real units, for a layer of `rows` outputs over
/// `gamma.len()` inputs: `weight(j, i)` is W_ji at f bits (signed), `bias(j)` b_j at 2f bits.
pub(crate) fn largest_output(
    fp: FixedPoint,
    norm: &NormedInput<'_>,
    rows: usize,
    weight: impl Fn(usize, usize) -> i64,
    bias: impl Fn(usize) -> Option<u64>,
) -> f64 {
    let u = 1.0 / fp.scale();
    let d = norm.gamma.len();
    let gamma: Vec<f64> = norm.gamma.iter().map(|&g| fp.decode(g)).collect();
    let beta: Option<Vec<f64>> = norm
        .beta
        .map(|bs| bs.iter().map(|&v| fp.decode(v)).collect());
    let NormError { a, b, c } = norm.error;
    let sqrt_d = (d as f64).sqrt();
    (0..rows)
        .map(|j| {
            let (mut s2, mut s1, mut w1, mut wb) = (0f64, 0f64, 0f64, 0f64);
            for (i, &g) in gamma.iter().enumerate() {
                let wi = weight(j, i) as f64 * u;
                let wg = wi * g;
                s2 += wg * wg;
                s1 += wg.abs();
                w1 += wi.abs();
                if let Some(beta) = &beta {
                    wb += wi * beta[i];
                }
            }
            // Biases are at 2f bits.
            let bias = bias(j).map_or(0.0, |v| fp.decode(v).abs() * u);
            (1.0 + b) * sqrt_d * s2.sqrt() + a * s1 + (c + 4.0 * u) * w1 + wb.abs() + bias + 4.0 * u
        })
        .fold(0.0, f64::max)
}

/// k for inputs below `largest` (real units) of an activation split by `plan`: at least the
/// tail's bits; None when nothing is saved (k ≥ ℓ − 1) or the bound is not finite.
pub(crate) fn comparison_bits(ax: &Approx, plan: &SplitPlan, largest: f64) -> Option<u32> {
    let raw = largest * ax.fp.scale();
    if !raw.is_finite() {
        return None;
    }
    let tail_bits = 64 - plan.tail.leading_zeros();
    let k = (raw.log2().floor().max(0.0) as u32 + 1).max(tail_bits);
    (k < ax.fp.ring.bits() - 1).then_some(k)
}

/// `bound` widened to at least `bits` (still a true bound: a wider one always is), or None
/// once it saves nothing in `ring`: what a benchmark on random weights uses to pay a pretrained
/// model's comparisons.
pub(crate) fn widened(bound: Option<u32>, bits: u32, ring: Ring) -> Option<u32> {
    bound.map(|k| k.max(bits)).filter(|&k| k < ring.bits() - 1)
}

/// Whether raw input `v` lies beyond `bound` (|v| ≥ 2^k), where the bounded split's private
/// output is unspecified: what the simulators count as a domain violation.
pub(crate) fn beyond(bound: Option<u32>, ring: Ring, v: u64) -> bool {
    bound.is_some_and(|k| ring.to_signed(v).unsigned_abs() >= 1 << k)
}

/// k for an encoder's GELUs: every block that runs GELU reads the output of its post-attention
/// LayerNorm through its FFN's first layer. None when no block runs GELU, or one that does
/// follows the centring substitute (whose output is not normalised).
pub(crate) fn encoder_activation_bits(
    ax: &Approx,
    config: &ModelConfig,
    blocks: &[FixedBlock],
) -> Option<u32> {
    let fp = ax.fp;
    let ring = fp.ring;
    let mut largest = None::<f64>;
    for (block, variant) in blocks.iter().zip(&config.veil.blocks) {
        if variant.activation != Activation::Gelu {
            continue;
        }
        if variant.ln1 != LayerNormKind::Exact || block.ln1.kind != LayerNormKind::Exact {
            return None;
        }
        let norm = NormedInput {
            gamma: &block.ln1.gamma,
            beta: Some(&block.ln1.beta),
            error: NormError::encoder_layer_norm(fp, block.ln1.eps),
        };
        let lin: &FixedLinear = &block.intermediate;
        let (rows, cols) = (lin.out_dim(), lin.in_dim());
        if cols != norm.gamma.len() {
            return None;
        }
        let (w, bias) = (lin.weight.data(), lin.bias.data());
        let row = largest_output(
            fp,
            &norm,
            rows,
            |j, i| ring.to_signed(w[j * cols + i]),
            |j| bias.get(j).copied(),
        );
        largest = Some(largest.map_or(row, |l| l.max(row)));
    }
    comparison_bits(ax, &ax.gelu_plan(), largest?)
}

#[cfg(test)]
mod tests {
    use candle_core::Tensor;
    use veil_core::approx::Approx;
    use veil_core::{FixedPoint, RingTensor};

    use crate::random::random_transformer_with_std;
    use crate::sim::{FixedModel, Tracker};
    use crate::variants::{Activation, BlockVariant, LayerNormKind};
    use crate::{Architecture, ModelConfig};

    fn config(variants: &[BlockVariant]) -> ModelConfig {
        let mut cfg = ModelConfig::builder(Architecture::Bert)
            .vocab(40)
            .hidden(48)
            .layers(variants.len())
            .heads(2)
            .ffn(96)
            .positions(16)
            .build()
            .unwrap();
        cfg.veil.blocks = variants.to_vec();
        cfg
    }

    /// With LN1's γ scaled up (so the bound is far above GELU's tail, as in a pretrained model),
    /// a row aligned with the FFN row whose bound is largest drives that GELU input to within
    /// 2 bits of 2^k and never past it: the bound holds at its worst input and is not vacuous.
    #[test]
    fn encoder_bound_holds_at_its_worst_input_and_is_tight() {
        let gelu = BlockVariant::exact(Activation::Gelu);
        let cfg = config(&[gelu, gelu, BlockVariant::exact(Activation::Relu)]);
        let mut model = random_transformer_with_std(&cfg, [7; 16], 0.2).unwrap();
        for b in &mut model.blocks {
            b.ln1.weight = (&b.ln1.weight * 40.0).unwrap();
            b.ln1.bias = Tensor::ones_like(&b.ln1.bias).unwrap();
        }
        let fp = FixedPoint::default_format();
        let fixed = FixedModel::encode(&model, fp).unwrap();
        let k = fixed.activation_bits().expect("a bound below the ring");
        let ring = fp.ring;
        let d = cfg.hidden_size;
        let mut worst = 0u64;
        for b in fixed.blocks.iter().take(2) {
            let w = &b.intermediate.weight;
            let gamma: Vec<f64> = b.ln1.gamma.iter().map(|&g| fp.decode(g)).collect();
            for j in 0..b.intermediate.out_dim() {
                // x ∝ W_j ⊙ γ, centred, at a few units: the norm's output then points along it,
                // where |g_j| = √d·‖W_j ⊙ γ‖₂ (+ W_j·β) is largest.
                let mut x: Vec<f64> = (0..d)
                    .map(|c| fp.decode(w.data()[j * d + c]) * gamma[c])
                    .collect();
                let mean = x.iter().sum::<f64>() / d as f64;
                x.iter_mut().for_each(|v| *v -= mean);
                let scale = 4.0 / x.iter().fold(0f64, |m, v| m.max(v.abs()));
                for sign in [1.0, -1.0] {
                    let row: Vec<u64> = x.iter().map(|v| fp.encode(sign * v * scale)).collect();
                    let row = RingTensor::from_vec(ring, &[1, d], row).unwrap();
                    let mut t = Tracker::new(fp, 1);
                    let h = fixed.norm(&row, &b.ln1, &mut t);
                    let g = fixed.linear(&h, &b.intermediate, &mut t).unwrap();
                    worst = worst.max(ring.to_signed(g.data()[j]).unsigned_abs());
                    assert_eq!(t.report.out_of_domain, 0);
                }
            }
        }
        println!("k = {k}, worst 2^{:.2}", (worst as f64).log2());
        assert!(
            worst < 1 << k,
            "|g| = 2^{:.2} ≥ 2^{k}",
            (worst as f64).log2()
        );
        assert!(
            worst >= 1 << (k - 2),
            "the worst input reaches only 2^{:.2} of 2^{k}",
            (worst as f64).log2()
        );
        // Random prompts stay inside it.
        let ids: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % 40).collect();
        let out = fixed.forward(&ids, &[0; 12]).unwrap();
        assert!(out.reports.iter().all(|r| r.out_of_domain == 0));
    }

    /// No bound without a GELU, or when a GELU reads a centring (not a normalisation).
    #[test]
    fn no_bound_without_a_normalised_gelu_input() {
        let relu = BlockVariant::exact(Activation::Relu);
        let mut centred = BlockVariant::exact(Activation::Gelu);
        centred.ln1 = LayerNormKind::Centring;
        for variants in [
            vec![relu, relu],
            vec![BlockVariant::exact(Activation::Gelu), centred],
        ] {
            let cfg = config(&variants);
            let model = random_transformer_with_std(&cfg, [3; 16], 0.2).unwrap();
            let fixed = FixedModel::encode(&model, FixedPoint::default_format()).unwrap();
            assert_eq!(fixed.activation_bits(), None, "{variants:?}");
        }
        // A bound that saves nothing is none either.
        let ax = Approx::new(FixedPoint::default_format()).unwrap();
        assert_eq!(super::comparison_bits(&ax, &ax.gelu_plan(), 1e9), None);
        assert_eq!(
            super::comparison_bits(&ax, &ax.gelu_plan(), f64::INFINITY),
            None
        );
    }
}
