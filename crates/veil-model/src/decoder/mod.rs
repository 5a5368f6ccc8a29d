//! Decoder-only language models (Llama family, GPT-2): loading, tokenising, chat templates and
//! sampling. The composition that runs them lives outside this module.
//!
//! * [`load`]`(spec)` → [`DecoderModel`] { [`DecoderWeights`], [`DecoderTokenizer`] }: `spec`
//!   is a built-in name ([`NAMES`]), a `.gguf` file (llama architecture; every tensor
//!   dequantised to f32 with candle), or a Hugging Face folder or cached model id
//!   (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`, `GPT2LMHeadModel`).
//! * Weights are plain row-major f32 in Hugging Face layout ([`weights`]): linear `[out, in]`,
//!   q/k rows in rotate-half order (llama.cpp's permutation undone), GPT-2's fused `c_attn` split.
//! * [`DecoderTokenizer`]: encode/decode, a streaming [`tokenizer::TextStream`], and
//!   [`DecoderTokenizer::render_chat`] with the model's own Jinja template.
//! * [`sample`]: greedy, temperature, top-k, top-p with a seeded generator.

mod bpe;
/// What a generation's client holds: configuration, tokenizer, open tables.
mod bundle;
/// Chat messages and the model's Jinja template.
pub mod chat;
/// The decoder's shape and family.
pub mod config;
/// Reading llama GGUF files.
pub mod gguf;
/// Reading Hugging Face decoder folders.
pub mod hf;
mod hf_config;
/// Tiny seeded decoders written as folders and GGUF files, for tests.
pub mod random;
/// Picking the next token from the logits.
pub mod sample;
mod shapes;
/// The byte-level BPE tokenizer and its streaming decoder.
pub mod tokenizer;
/// The f32 weights in Hugging Face layout.
pub mod weights;

pub use bundle::{DecoderBundle, PublicTables};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{
    DecoderActivation, DecoderBlockVariant, DecoderConfig, DecoderFamily, DecoderNormKind,
    RopeScaling,
};
pub use hf_config::with_variants;
pub use sample::{argmax, Sampler, SamplingParams};
pub use shapes::DecoderShape;
pub use tokenizer::{DecoderTokenizer, TextStream};
pub use weights::{DecoderBlock, DecoderWeights, Linear, Matrix, Mlp, Norm};

use std::path::{Path, PathBuf};

use veil_core::{Error, Result};

use crate::source::{hf_cache_snapshot, known_names, looks_like_model_id};

/// A decoder ready to run: its weights and its tokenizer.
#[derive(Clone, Debug)]
pub struct DecoderModel {
    /// The f32 weights.
    pub weights: DecoderWeights,
    /// The tokenizer with the model's chat template.
    pub tokenizer: DecoderTokenizer,
}

impl DecoderModel {
    /// The token ids of a conversation: the chat template rendered with the assistant's opening
    /// (after the BOS token when the model declares one and the template does not).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.tokenizer.chat_ids(messages)
    }
}

/// Built-in decoder names and the fetchers of their GGUF files.
pub const BUILT_IN: [(&str, crate::source::Fetcher); 1] =
    [("smollm2-135m-instruct", crate::fetch::smollm2_135m_instruct)];

/// The decoder names [`load`] knows without a path.
pub const NAMES: [&str; 1] = [BUILT_IN[0].0];

/// Whether `path` names a GGUF file (by its extension; it need not exist).
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Whether `spec` names a decoder LLM (a built-in decoder, a `.gguf` file, or a folder whose
/// config declares a decoder) rather than an encoder: a server serves it for generation.
pub fn names_decoder(spec: &str) -> bool {
    let path = Path::new(spec);
    NAMES.contains(&spec) || is_gguf_path(path) || (path.is_dir() && hf::is_decoder_folder(path))
}

/// A decoder named by `--model`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecoderSource {
    /// A llama.cpp GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face decoder folder (possibly in the local Hugging Face cache).
    Folder(PathBuf),
}

impl DecoderSource {
    /// Resolves `spec`: a `.gguf` file, a folder, a built-in name (fetched on first use), else a
    /// model id in the local Hugging Face cache. Encoders are refused by name.
    pub fn resolve(spec: &str) -> Result<Self> {
        let path = Path::new(spec);
        if is_gguf_path(path) || path.is_file() {
            return Ok(DecoderSource::Gguf(path.to_path_buf()));
        }
        if path.is_dir() {
            return Self::folder(path);
        }
        if let Some((_, fetch)) = BUILT_IN.iter().find(|(n, _)| *n == spec) {
            return Ok(DecoderSource::Gguf(fetch()?));
        }
        let encoders = known_names();
        if encoders.split(", ").any(|n| n == spec) {
            return Err(Error::Unsupported(format!(
                "{spec:?} is an encoder, not a decoder LLM: generation needs a decoder ({}, a \
                 .gguf file, or a Hugging Face Llama/Qwen2/Mistral/GPT-2 folder)",
                NAMES.join(", ")
            )));
        }
        if looks_like_model_id(spec) {
            if let (Some(dir), _) = hf_cache_snapshot(spec) {
                return Self::folder(&dir);
            }
        }
        Err(Error::NotFound(format!(
            "{spec:?} is neither a GGUF file, a decoder folder, a model id in the local Hugging \
             Face cache, nor a built-in decoder ({})",
            NAMES.join(", ")
        )))
    }

    fn folder(dir: &Path) -> Result<Self> {
        match hf::model_type(dir) {
            Some(t) if !hf::is_decoder_folder(dir) => Err(Error::Unsupported(format!(
                "{}: model_type {t:?} is not a supported decoder LLM (llama, qwen2, mistral, gpt2 \
                 are); encoders run with the other commands",
                dir.display()
            ))),
            _ => Ok(DecoderSource::Folder(dir.to_path_buf())),
        }
    }

    /// Reads the weights and the tokenizer (fetching a built-in model on first use).
    pub fn load(&self) -> Result<DecoderModel> {
        match self {
            DecoderSource::Gguf(path) => gguf::load(path),
            DecoderSource::Folder(dir) => hf::load(dir),
        }
    }
}

/// Loads the decoder `spec` names (see [`DecoderSource::resolve`]).
pub fn load(spec: &str) -> Result<DecoderModel> {
    DecoderSource::resolve(spec)?.load()
}
