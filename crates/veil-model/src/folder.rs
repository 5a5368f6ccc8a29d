//! Hugging Face model folders on disk: `config.json` (+ Veil's `"veil"` object),
//! `model.safetensors` or `pytorch_model.bin`, `tokenizer.json` or `vocab.txt`.
//!
//! Weight names may carry the HF task-model prefix (`bert.`, `roberta.`, `mpnet.`); it is
//! stripped on load. [`save`] writes base names for models without a classifier and prefixed
//! names otherwise, as HF's `*Model` / `*ForSequenceClassification` checkpoints do, so a folder
//! Veil writes loads back identically, in Veil and in HF.

use crate::candle_error;
use crate::config::ModelConfig;
use crate::nn::{Batch, ForwardOutput, Transformer};
use crate::tokenize::TextTokenizer;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::path::Path;
use veil_core::{bail, Error, Result};

/// A loaded model: configuration, f32 weights and (if the folder has one) tokenizer.
#[derive(Clone, Debug)]
pub struct Model {
    /// The shape and operators (`config.json`).
    pub config: ModelConfig,
    /// The f32 weights.
    pub transformer: Transformer,
    /// The tokenizer, when the folder has one.
    pub tokenizer: Option<TextTokenizer>,
}

impl Model {
    /// Tokenises `a` (and the pair sentence `b`) and runs the f32 forward pass on it alone.
    pub fn forward_text(&self, a: &str, b: Option<&str>) -> Result<ForwardOutput> {
        let Some(tok) = &self.tokenizer else {
            bail!(InvalidArgument, "model has no tokenizer")
        };
        let enc = tok.encode(a, b)?;
        let batch = Batch::single(&enc.ids, &enc.type_ids, self.transformer.device())
            .map_err(candle_error("building the input batch"))?;
        self.transformer
            .forward(&batch)
            .map_err(candle_error("forward pass"))
    }
}

impl Model {
    /// Tokenises several inputs into one batch, right-padded with `pad_token_id` to the longest
    /// and masked (for evaluation throughput; private inference runs one unpadded sequence).
    pub fn batch(&self, inputs: &[(&str, Option<&str>)]) -> Result<Batch> {
        let Some(tok) = &self.tokenizer else {
            bail!(InvalidArgument, "model has no tokenizer")
        };
        veil_core::ensure!(!inputs.is_empty(), InvalidArgument, "empty batch");
        let encoded = inputs
            .iter()
            .map(|(a, b)| tok.encode(a, *b))
            .collect::<Result<Vec<_>>>()?;
        let len = encoded.iter().map(|e| e.len()).max().unwrap_or(0);
        let pad = self.config.pad_token_id;
        let (mut ids, mut types, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        for e in &encoded {
            let fill = len - e.len();
            ids.extend(e.ids.iter().copied().chain(std::iter::repeat_n(pad, fill)));
            types.extend(
                e.type_ids
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, fill)),
            );
            mask.extend(std::iter::repeat_n(1f32, e.len()).chain(std::iter::repeat_n(0.0, fill)));
        }
        let dev = self.transformer.device();
        let shape = (encoded.len(), len);
        let make = || -> candle_core::Result<Batch> {
            Ok(Batch {
                input_ids: Tensor::from_vec(ids, shape, dev)?,
                token_type_ids: Some(Tensor::from_vec(types, shape, dev)?),
                attention_mask: Some(Tensor::from_vec(mask, shape, dev)?),
            })
        };
        make().map_err(candle_error("building the input batch"))
    }
}

/// Reads and validates `dir/config.json`.
pub fn load_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!(
            "{} (a model folder needs its config.json)",
            path.display()
        )),
        _ => Error::Other(format!("{}: {e}", path.display())),
    })?;
    ModelConfig::from_json(&text).map_err(|e| match e {
        Error::Malformed(m) => Error::Malformed(format!("{}: {m}", path.display())),
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", path.display())),
        Error::Unsupported(m) => Error::Unsupported(format!("{}: {m}", path.display())),
        e => e,
    })
}

/// Weight files a model folder may hold, in order of preference.
const WEIGHT_FILES: [&str; 2] = ["model.safetensors", "pytorch_model.bin"];

/// Whether `dir` holds model weights.
pub(crate) fn has_weights(dir: &Path) -> bool {
    WEIGHT_FILES.iter().any(|f| dir.join(f).is_file())
}

/// The tokenizer of `dir`, truncating to what `config` can take.
pub(crate) fn load_tokenizer(dir: &Path, config: &ModelConfig) -> Result<TextTokenizer> {
    TextTokenizer::from_folder(dir, config.max_sequence_len().min(512))
}

/// Reads the weights of `dir` with the task-model prefix stripped.
pub fn load_weights(dir: &Path, config: &ModelConfig) -> Result<HashMap<String, Tensor>> {
    let st = dir.join(WEIGHT_FILES[0]);
    let pt = dir.join(WEIGHT_FILES[1]);
    let raw: Vec<(String, Tensor)> = if st.is_file() {
        candle_core::safetensors::load(&st, &Device::Cpu)
            .map_err(|e| Error::Malformed(format!("{}: {e}", st.display())))?
            .into_iter()
            .collect()
    } else if pt.is_file() {
        candle_core::pickle::read_all(&pt)
            .map_err(|e| Error::Malformed(format!("{}: {e}", pt.display())))?
    } else {
        bail!(
            NotFound,
            "{}: no model.safetensors or pytorch_model.bin",
            dir.display()
        )
    };
    let prefix = format!("{}.", config.architecture.model_type());
    Ok(raw
        .into_iter()
        .map(|(k, v)| match k.strip_prefix(&prefix) {
            Some(base) => (base.to_string(), v),
            None => (k, v),
        })
        .collect())
}

/// Loads a model folder. The tokenizer truncates to the model's maximum sequence length.
pub fn load(dir: &Path) -> Result<Model> {
    load_with_config(dir, load_config(dir)?)
}

/// Loads a model folder with a caller-adjusted configuration (e.g. another head or fewer
/// blocks); only the tensors that configuration needs are read from the weights.
pub fn load_with_config(dir: &Path, config: ModelConfig) -> Result<Model> {
    let weights = load_weights(dir, &config)?;
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let transformer = Transformer::new(&config, vb)
        .map_err(candle_error(&format!("{}: loading weights", dir.display())))?;
    let has_tokenizer = dir.join("tokenizer.json").is_file() || dir.join("vocab.txt").is_file();
    let tokenizer = if has_tokenizer {
        Some(load_tokenizer(dir, &config)?)
    } else {
        None
    };
    Ok(Model {
        config,
        transformer,
        tokenizer,
    })
}

/// Writes `config.json` (with the `"veil"` object), `model.safetensors` and, if given,
/// `tokenizer.json` into `dir` (created if missing).
pub fn save(
    dir: &Path,
    transformer: &Transformer,
    tokenizer: Option<&TextTokenizer>,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let config = &transformer.config;
    std::fs::write(dir.join("config.json"), config.to_json())?;
    let prefix = if config.veil.num_labels > 0 {
        format!("{}.", config.architecture.model_type())
    } else {
        String::new()
    };
    let tensors: HashMap<String, Tensor> = transformer
        .named
        .iter()
        .map(|(name, t)| {
            let key = if name.starts_with("classifier.") {
                name.clone()
            } else {
                format!("{prefix}{name}")
            };
            (key, t.clone())
        })
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))
        .map_err(candle_error("writing model.safetensors"))?;
    if let Some(tok) = tokenizer {
        tok.save(&dir.join("tokenizer.json"))?;
    }
    Ok(())
}

/// Prefix of the public tensors (embedding tables and their LayerNorm): what an overlay leaves
/// to its base model and all a client bundle carries.
pub(crate) const PUBLIC_PREFIX: &str = "embeddings.";

/// Writes the trained part of a public-embedding model to `path`, for shipping without the
/// public tables: every tensor of `model` except `embeddings.*`, as f16 safetensors (half the
/// size; the rounding, ≤ 2^-11 relative, is far below the fixed-point step of inference).
pub fn save_overlay(model: &Transformer, path: &Path) -> Result<()> {
    let tensors: HashMap<String, Tensor> = model
        .named
        .iter()
        .filter(|(name, _)| !name.starts_with(PUBLIC_PREFIX))
        .map(|(name, t)| Ok((name.clone(), t.to_dtype(DType::F16)?)))
        .collect::<candle_core::Result<_>>()
        .map_err(candle_error("converting the overlay to f16"))?;
    candle_core::safetensors::save(&tensors, path).map_err(candle_error("writing the overlay"))
}

/// A model assembled from a base folder (its public embedding tables and tokenizer) and an
/// overlay made by [`save_overlay`] with its `config.json`: how a fine-tuned model whose
/// embeddings stayed frozen ships in a few megabytes. Every tensor the config needs outside
/// the embeddings must come from the overlay.
pub fn load_overlay(base: &Path, config_json: &str, overlay: &[u8]) -> Result<Model> {
    let config = ModelConfig::from_json(config_json)?;
    let mut weights: HashMap<String, Tensor> = load_weights(base, &config)?
        .into_iter()
        .filter(|(name, _)| name.starts_with(PUBLIC_PREFIX))
        .collect();
    let trained = candle_core::safetensors::load_buffer(overlay, &Device::Cpu)
        .map_err(candle_error("model overlay"))?;
    for (name, t) in trained {
        if name.starts_with(PUBLIC_PREFIX) {
            bail!(
                Malformed,
                "model overlay carries the public tensor {name:?}"
            );
        }
        let t = t
            .to_dtype(DType::F32)
            .map_err(candle_error("model overlay"))?;
        weights.insert(name, t);
    }
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let transformer = Transformer::new(&config, vb)
        .map_err(candle_error("assembling the model from its overlay"))?;
    let tokenizer = load_tokenizer(base, &config)?;
    Ok(Model {
        config,
        transformer,
        tokenizer: Some(tokenizer),
    })
}
