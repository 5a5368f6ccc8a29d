//! Shape and hyper-parameters of a decoder-only language model, whatever file it came from.

use serde::{Deserialize, Serialize};
use veil_core::{Error, Result};

use crate::variants::AttentionNorm;

/// The block layout a decoder uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderFamily {
    /// Llama / SmolLM / Qwen2 / Mistral: RMSNorm, rotary positions, SiLU-gated MLP.
    Llama,
    /// GPT-2: LayerNorm, learned positions, GELU-tanh MLP.
    Gpt2,
}

/// How rotary frequencies are rescaled for long contexts (Hugging Face `rope_scaling`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (HF `"linear"`).
    Linear {
        /// How much longer the context is than the trained one.
        factor: f64,
    },
    /// Llama 3.1's band-wise frequency scaling (HF `"llama3"`).
    Llama3 {
        /// How much longer the context is than the trained one.
        factor: f64,
        /// Wavelengths above original / this are scaled by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below original / this are kept.
        high_freq_factor: f64,
        /// The context length the model was trained for.
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// The inverse frequencies θ^(−2i/d), i < d/2, after scaling: the one definition the f32
    /// model and the fixed-point simulator share.
    pub fn inv_freqs(scaling: Option<&RopeScaling>, theta: f64, head_dim: usize) -> Vec<f64> {
        let half = head_dim / 2;
        (0..half)
            .map(|i| {
                let f = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                match scaling {
                    None => f,
                    Some(RopeScaling::Linear { factor }) => f / factor,
                    Some(RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position_embeddings,
                    }) => {
                        let old = *original_max_position_embeddings as f64;
                        let low_wavelen = old / low_freq_factor;
                        let high_wavelen = old / high_freq_factor;
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    }
                }
            })
            .collect()
    }
}

/// The MLP activation of a decoder block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecoderActivation {
    /// As pre-trained: SiLU in the Llama family's gated MLP, GELU-tanh in GPT-2's.
    #[default]
    Original,
    /// max(x, 0) in its place: a comparison and a multiplexer under MPC.
    Relu,
    /// Hard-swish x·min(max(x + 3, 0), 6)/6 in its place: SiLU's shape (x for x ≥ 3, 0 for
    /// x ≤ −3, smooth enough between) at about ReLU's price under MPC — one comparison call on
    /// x ± 3 and two products. Untrained in all 30 SmolLM2 blocks it keeps 80 % next-token
    /// agreement where ReLU keeps 6 % (docs/RESULTS.md).
    HardSwish,
}

/// The normalisation before a decoder block's attention or MLP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecoderNormKind {
    /// As pre-trained: RMSNorm (Llama family) or LayerNorm (GPT-2).
    #[default]
    Original,
    /// x·γ (Llama family only): no division by the root mean square, so no reciprocal square
    /// root under MPC; the scale of the residual stream is left to fine-tuning.
    Scale,
}

/// The operator choice of one decoder block: the original operators, or the privacy-computing
/// friendly substitutes of the substitution workflow. Stored in the model folder's
/// `config.json` as the `"veil"` object, `{"blocks": [{"activation": "relu", "attention":
/// "relu_normalise", "attn_norm": "original", "mlp_norm": "original"}, …]}` (one per block); a
/// folder without it has the original operators everywhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecoderBlockVariant {
    /// The MLP activation.
    pub activation: DecoderActivation,
    /// How causal attention scores become weights (Softmax, or ReLU-normalise with the causal
    /// mask).
    pub attention: AttentionNorm,
    /// The norm before attention.
    pub attn_norm: DecoderNormKind,
    /// The norm before the MLP.
    pub mlp_norm: DecoderNormKind,
}

impl DecoderBlockVariant {
    /// The pre-trained operators.
    pub const ORIGINAL: Self = DecoderBlockVariant {
        activation: DecoderActivation::Original,
        attention: AttentionNorm::Softmax,
        attn_norm: DecoderNormKind::Original,
        mlp_norm: DecoderNormKind::Original,
    };

    /// ReLU in the gated MLP and ReLU-normalise attention, the norms kept: the block
    /// `veil bench generate --friendly` runs everywhere.
    pub const FRIENDLY: Self = DecoderBlockVariant {
        activation: DecoderActivation::Relu,
        attention: AttentionNorm::ReluNormalise,
        ..Self::ORIGINAL
    };

    /// Both norms replaced by x·γ, SiLU and Softmax kept.
    pub const SCALED: Self = DecoderBlockVariant {
        attn_norm: DecoderNormKind::Scale,
        mlp_norm: DecoderNormKind::Scale,
        ..Self::ORIGINAL
    };

    /// Whether every operator is the pre-trained one.
    pub fn is_original(&self) -> bool {
        *self == Self::ORIGINAL
    }
}

/// Everything the composition needs to know about a decoder's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// Llama family or GPT-2: the block's layout and operators.
    pub family: DecoderFamily,
    /// Token ids are below this.
    pub vocab_size: usize,
    /// The residual stream's width.
    pub hidden: usize,
    /// The number of blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads: grouped-query attention when fewer than `heads` (each serves
    /// `heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// The width of one head.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// RMSNorm (Llama) or LayerNorm (GPT-2) epsilon.
    pub norm_eps: f64,
    /// Rotary base (Llama family only; unused by GPT-2).
    pub rope_theta: f64,
    /// How the rotary frequencies are stretched for long contexts, if at all.
    pub rope_scaling: Option<RopeScaling>,
    /// Longest sequence the model was trained for (GPT-2: the size of its position table).
    pub max_positions: usize,
    /// Whether q/k/v/o have biases.
    pub attention_bias: bool,
    /// Whether the MLP's projections have biases.
    pub mlp_bias: bool,
    /// Whether the LM head is the token embedding.
    pub tie_word_embeddings: bool,
    /// The token a prompt starts with, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Generation stops at any of these.
    pub eos_token_ids: Vec<u32>,
    /// The operators of each block: empty for the original operators everywhere, otherwise one
    /// per block (see [`DecoderConfig::variant`]).
    pub variants: Vec<DecoderBlockVariant>,
}

impl DecoderConfig {
    /// Rejects shapes the composition cannot run (zero sizes, heads not dividing, odd rotary
    /// head size), naming `source` and the field.
    pub fn validate(&self, source: &str) -> Result<()> {
        let bad = |what: String| Err(Error::Malformed(format!("{source}: {what}")));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate", self.intermediate),
            ("max_positions", self.max_positions),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if self.family == DecoderFamily::Llama && !self.head_dim.is_multiple_of(2) {
            return bad(format!("rotary head size {} is odd", self.head_dim));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(format!(
                "norm epsilon {} is not a positive number",
                self.norm_eps
            ));
        }
        if self.family == DecoderFamily::Llama
            && !(self.rope_theta.is_finite() && self.rope_theta > 1.0)
        {
            return bad(format!(
                "rope theta {} is not a number above 1",
                self.rope_theta
            ));
        }
        if let Err(Error::InvalidArgument(m) | Error::Unsupported(m)) = self.check_variants() {
            return bad(m);
        }
        let vocab = self.vocab_size as u64;
        for id in self.bos_token_id.iter().chain(&self.eos_token_ids) {
            if u64::from(*id) >= vocab {
                return bad(format!(
                    "special token id {id} is outside the vocabulary of {vocab}"
                ));
            }
        }
        Ok(())
    }

    /// The operators of block `i`.
    pub fn variant(&self, i: usize) -> DecoderBlockVariant {
        self.variants.get(i).copied().unwrap_or_default()
    }

    /// The rules on [`DecoderConfig::variants`], for configs loaded ([`DecoderConfig::validate`])
    /// and built in memory alike (the composition checks them before it runs): none or one per
    /// block (`InvalidArgument` otherwise), substitutes in the Llama family only (`Unsupported`).
    pub fn check_variants(&self) -> Result<()> {
        if !self.variants.is_empty() && self.variants.len() != self.layers {
            return Err(Error::InvalidArgument(format!(
                "{} block variants for {} blocks",
                self.variants.len(),
                self.layers
            )));
        }
        if self.family != DecoderFamily::Llama && self.is_substituted() {
            return Err(Error::Unsupported(
                "substituted operators are implemented for the Llama family only".into(),
            ));
        }
        Ok(())
    }

    /// Whether any block has a substituted operator.
    pub fn is_substituted(&self) -> bool {
        self.variants.iter().any(|v| !v.is_original())
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.heads / self.kv_heads
    }
}
