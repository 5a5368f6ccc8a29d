//! A provable bound on every input of a decoder's SiLU (Llama) or GELU (GPT-2), from the
//! server's own weights, so that the activation's two sign comparisons run on k bits instead of
//! ℓ − 1 (`veil_nonlinear::Ctx::odd_split`'s `bound`; 21 bits instead of 47 for SmolLM2-135M).
//!
//! The activation's input is row j of the MLP's first linear layer applied to a normalised row:
//! g_j = Σ_i W_ji·y_i (+ b_j) with y_i = γ_i·z_i (+ β_i), where the exact normalised row ẑ
//! (RMSNorm: x/√(mean x² + ε); LayerNorm: (x − μ)/√(var + ε)) has ‖ẑ‖₂ ≤ √d whatever x is. The
//! fixed-point z differs from ẑ by at most a + b·|ẑ_i| per value (the norms' documented error
//! bounds: `RMS_NORM_ERROR`, `layer_norm_error_bound` at var + ε ≥ ε), y and g each add a few
//! ulps of rounding. By Cauchy–Schwarz,
//!
//!   |g_j| ≤ (1 + b)·√d·‖W_j ⊙ γ‖₂ + a·‖W_j ⊙ γ‖₁ + 4u·‖W_j‖₁ + |W_j·β| + |b_j| + 4u,
//!
//! u = 2^-f, for every input row in the norms' domain: the bound holds for any prompt, not only
//! for the text it was measured on, and needs no trained promise. k is the smallest width with
//! max_j |g_j|·2^f < 2^k, raised to the split's tail (the clamp compares |g| − A on k bits too).
//!
//! Public to the client: the server announces k at admission (one integer per model, a coarse
//! function of its weights' largest row norm), as it announces the format.

use veil_core::approx::{layer_norm_error_bound, Approx, SplitPlan, RMS_NORM_ERROR};

use super::{FixedBlock, FixedLinear, FixedNorm};
use crate::decoder::{DecoderActivation, DecoderConfig, DecoderFamily, DecoderNormKind};

/// k for `blocks` of `config` at `ax`'s format, or None when no block runs the original
/// activation, a block's MLP norm does not normalise (the Scale substitute: its input is only
/// promised below 2^norm_dev_bits) or the bound leaves nothing to save (k ≥ ℓ − 1).
pub(super) fn provable_activation_bits(
    ax: &Approx,
    config: &DecoderConfig,
    blocks: &[FixedBlock],
) -> Option<u32> {
    let (plan, (a, b)): (SplitPlan, (f64, f64)) = match config.family {
        DecoderFamily::Llama => (ax.silu_plan(), RMS_NORM_ERROR),
        // The same normalisation with the centring's error on top (var + ε ≥ ε).
        DecoderFamily::Gpt2 => (
            ax.gelu_plan(),
            (layer_norm_error_bound(config.norm_eps), RMS_NORM_ERROR.1),
        ),
    };
    let mut largest = 0f64;
    let mut any = false;
    for (i, block) in blocks.iter().enumerate() {
        let variant = config.variant(i);
        let first = match config.family {
            DecoderFamily::Llama if variant.activation != DecoderActivation::Original => continue,
            DecoderFamily::Llama => block.gate.as_ref()?,
            DecoderFamily::Gpt2 => &block.up,
        };
        if variant.mlp_norm != DecoderNormKind::Original {
            return None;
        }
        any = true;
        largest = largest.max(row_bound(ax, config.hidden, &block.mlp_norm, first, (a, b)));
    }
    let raw = largest * ax.fp.scale();
    let tail_bits = 64 - plan.tail.leading_zeros();
    let k = (raw.log2().floor() as u32 + 1).max(tail_bits);
    (any && raw.is_finite() && k < ax.fp.ring.bits() - 1).then_some(k)
}

/// max_j of the module's bound on |g_j|, in real units.
fn row_bound(
    ax: &Approx,
    d: usize,
    norm: &FixedNorm,
    lin: &FixedLinear,
    (a, b): (f64, f64),
) -> f64 {
    let fp = ax.fp;
    let u = 1.0 / fp.scale();
    let gamma: Vec<f64> = norm.gamma.iter().map(|&g| fp.decode(g)).collect();
    let beta: Option<Vec<f64>> = norm
        .beta
        .as_ref()
        .map(|bs| bs.iter().map(|&v| fp.decode(v)).collect());
    let sqrt_d = (d as f64).sqrt();
    (0..lin.rows)
        .map(|j| {
            let w = &lin.weight[j * lin.cols..(j + 1) * lin.cols];
            let (mut s2, mut s1, mut w1, mut wb) = (0f64, 0f64, 0f64, 0f64);
            for (i, &wi) in w.iter().enumerate() {
                let wi = f64::from(wi) * u;
                let wg = wi * gamma[i];
                s2 += wg * wg;
                s1 += wg.abs();
                w1 += wi.abs();
                if let Some(beta) = &beta {
                    wb += wi * beta[i];
                }
            }
            // Biases are at 2f bits.
            let bias = lin
                .bias
                .as_ref()
                .map_or(0.0, |bs| fp.decode(bs[j]).abs() * u);
            (1.0 + b) * sqrt_d * s2.sqrt() + a * s1 + 4.0 * u * w1 + wb.abs() + bias + 4.0 * u
        })
        .fold(0.0, f64::max)
}
