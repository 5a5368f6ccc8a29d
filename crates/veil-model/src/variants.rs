//! Operator variants: which non-linearity each encoder block uses.
//!
//! Veil makes a model privacy-computing friendly by swapping expensive operators for cheap ones
//! block by block (GELU→ReLU, Softmax→ReLU-normalise, LayerNorm→centring+affine) and fine-tuning.
//! The choice is part of the model, so it is stored in the model folder: the `"veil"` object of
//! `config.json` (see [`crate::config`]), e.g.
//!
//! ```json
//! "veil": {
//!   "embedding": "public",
//!   "head": "mean_pool",
//!   "blocks": [ {"activation": "relu", "attention": "relu_normalise", "ln1": "centring", "ln2": "exact"} ]
//! }
//! ```

use serde::{Deserialize, Serialize};

/// The FFN activation of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// GELU with the exact erf form in f32 (HF `"gelu"`); the simulator uses the protocol's
    /// approximation.
    Gelu,
    /// max(x, 0): a comparison and a multiplexer under MPC, far cheaper than GELU.
    Relu,
}

impl Activation {
    /// Parses an HF `hidden_act` value. Only the activations Veil has protocols for are accepted.
    pub fn from_hf(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Activation::Gelu),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    /// The `hidden_act` value of `config.json` that names it.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::Relu => "relu",
        }
    }
}

/// How attention scores become weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionNorm {
    /// exp(x_i − max) / Σ_j exp(x_j − max), as pre-trained.
    #[default]
    Softmax,
    /// ReLU(x_i) / (Σ_j ReLU(x_j) + ε), ε = [`veil_core::defaults::RELU_NORMALISE_EPS`].
    ReluNormalise,
}

/// A layer normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerNormKind {
    /// (x − mean)/sqrt(var + eps)·γ + β.
    Exact,
    /// (x − mean)·γ + β: no division, so no reciprocal square root under MPC.
    Centring,
}

/// The operator choice of one encoder block. LN1 follows attention, LN2 follows the FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockVariant {
    /// The feed-forward activation.
    pub activation: Activation,
    /// The attention-score normalisation.
    pub attention: AttentionNorm,
    /// The normalisation after attention.
    pub ln1: LayerNormKind,
    /// The normalisation after the feed-forward layer.
    pub ln2: LayerNormKind,
}

impl BlockVariant {
    /// The original operators of a pre-trained model with the given activation.
    pub fn exact(activation: Activation) -> Self {
        BlockVariant {
            activation,
            attention: AttentionNorm::Softmax,
            ln1: LayerNormKind::Exact,
            ln2: LayerNormKind::Exact,
        }
    }

    /// Every cheap substitute at once.
    pub fn friendly() -> Self {
        BlockVariant {
            activation: Activation::Relu,
            attention: AttentionNorm::ReluNormalise,
            ln1: LayerNormKind::Centring,
            ln2: LayerNormKind::Centring,
        }
    }
}

/// Whether the embedding lookup (and its LayerNorm) is done in the clear by the party holding
/// the tokens' embeddings, or inside the private protocol. Recorded now, used by the private
/// forward pass; the simulator runs the embedding LayerNorm in fixed point only when `Private`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbeddingMode {
    /// The client looks its tokens up in the public tables and sends the result in shares.
    #[default]
    Public,
    /// The lookup and its LayerNorm run inside the protocol: the server's tables stay private.
    Private,
}

/// How the private pass truncates: after each linear or attention product, and in the
/// operators' internal truncations (Softmax, ReLU-normalise, LayerNorm, centring, the pooler's
/// tanh; GELU stays exact); the simulator always computes the faithful ⌊x / 2^f⌋. A deployment
/// choice the server announces in the config it sends, so both parties run the same protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProductTruncation {
    /// Exactly ⌊x / 2^f⌋: the private result equals the simulator's integers.
    Faithful,
    /// ⌊x / 2^f⌋ or one ulp (2^−f) less, per product output: one COT per element instead of a
    /// comparison on f bits (Cheetah's default), about 10× cheaper.
    #[default]
    OneBitError,
}

/// What a classifier's prompt is: one text, or a sentence pair (`[CLS] a [SEP] b [SEP]`, segment
/// ids 0 then 1). Recorded by fine-tuning from its training data, because a model reads a
/// prompt of the other kind as an input it never saw and answers anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Inputs {
    /// One text per prompt.
    Single,
    /// A sentence pair per prompt.
    Pairs,
}

impl Inputs {
    /// The kind of a prompt that is (`pairs`) or is not a sentence pair.
    pub fn of(pairs: bool) -> Self {
        if pairs {
            Inputs::Pairs
        } else {
            Inputs::Single
        }
    }

    /// Why `given` prompts do not suit a model trained on `recorded` (`None`: not recorded,
    /// either kind is taken); each caller says it with its own context.
    pub fn refusal(recorded: Option<Inputs>, given: Inputs) -> Option<String> {
        recorded
            .filter(|&r| r != given)
            .map(|r| format!("the model classifies {}", r.describe()))
    }

    /// What a prompt of this kind is, for messages.
    fn describe(self) -> &'static str {
        match self {
            Inputs::Single => "single texts, not sentence pairs",
            Inputs::Pairs => "sentence pairs (first, second), not single texts",
        }
    }
}

/// What turns the last hidden states into the model output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadKind {
    /// First token → dense → tanh (HF pooler, or RoBERTa's `classifier.dense`) → optional
    /// classifier with `num_labels` outputs.
    Pooler,
    /// Mean over the real tokens → optional linear classifier with `num_labels` outputs.
    MeanPool,
}
