//! The decoder's activation bound: every SiLU (Llama) or GELU (GPT-2) reads the output of its
//! block's MLP norm through the MLP's first layer (the gate, or GPT-2's up projection), so
//! `crate::normed_bound` bounds it from the server's weights (SmolLM2-135M: k = 21 instead of
//! 47 at f = 13). The server announces k at admission, as it announces the format.

use veil_core::approx::{Approx, SplitPlan};

use super::{FixedBlock, FixedLinear, FixedNorm};
use crate::decoder::{DecoderActivation, DecoderConfig, DecoderFamily, DecoderNormKind};
use crate::normed_bound::{comparison_bits, largest_output, NormError, NormedInput};

/// k for `blocks` of `config` at `ax`'s format, or None when no block runs the original
/// activation, a block's MLP norm does not normalise (the Scale substitute: its input is only
/// promised below 2^norm_dev_bits) or the bound leaves nothing to save (k ≥ ℓ − 1).
pub(super) fn provable_activation_bits(
    ax: &Approx,
    config: &DecoderConfig,
    blocks: &[FixedBlock],
) -> Option<u32> {
    let fp = ax.fp;
    let (plan, error): (SplitPlan, NormError) = match config.family {
        DecoderFamily::Llama => (ax.silu_plan(), NormError::rms_norm(fp)),
        // The same normalisation with the centring's error on top (var + ε ≥ ε).
        DecoderFamily::Gpt2 => (ax.gelu_plan(), NormError::layer_norm(fp, config.norm_eps)),
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
        largest = largest.max(row_bound(ax, &block.mlp_norm, first, error));
    }
    any.then(|| comparison_bits(ax, &plan, largest)).flatten()
}

/// max_j of the bound on |g_j| (`crate::normed_bound`), in real units.
fn row_bound(ax: &Approx, norm: &FixedNorm, lin: &FixedLinear, error: NormError) -> f64 {
    let input = NormedInput {
        gamma: &norm.gamma,
        beta: norm.beta.as_deref(),
        error,
    };
    let cols = lin.cols;
    largest_output(
        ax.fp,
        &input,
        lin.rows,
        |j, i| i64::from(lin.weight[j * cols + i]),
        |j| lin.bias.as_ref().map(|b| b[j]),
    )
}
