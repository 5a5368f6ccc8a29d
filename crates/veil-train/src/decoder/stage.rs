//! A saved stage of a substituted decoder: the base model it came from, the operators of every
//! block, and only the tensors that changed (`delta.safetensors`: the fine-tuned blocks), so a
//! stage of SmolLM2-135M is a few MB per changed block instead of the whole 540 MB.
//!
//! Layout of a stage folder: `stage.json` ([`StageInfo`]) and `delta.safetensors`. The
//! workflow's progress states and its output folder are stage folders; the output folder also
//! holds a complete Hugging Face folder (`config.json` with the `"veil"` object,
//! `model.safetensors`, the tokenizer) for tools that load weights directly.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::json;
use veil_core::{ensure, Error, Result};
use veil_model::candle_error;
use veil_model::decoder::{DecoderBlockVariant, DecoderTokenizer};

use super::model::TrainableDecoder;
use crate::checkpoint::{io_err, write_json_atomically};

/// `stage.json`.
pub const STAGE_FILE: &str = "stage.json";
/// The changed tensors.
pub const DELTA_FILE: &str = "delta.safetensors";

/// What `stage.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageInfo {
    /// The original model (a built-in name or an absolute path), as `--model` takes it.
    pub base: String,
    /// The operators of every block.
    pub variants: Vec<DecoderBlockVariant>,
    /// Blocks whose parameters differ from the base (their tensors are in the delta).
    pub changed_blocks: Vec<usize>,
}

fn in_changed(name: &str, changed: &BTreeSet<usize>) -> bool {
    changed
        .iter()
        .any(|&b| TrainableDecoder::in_blocks(name, &(b..b + 1)))
}

/// Writes `model`'s stage into `dir` (which must exist).
pub fn save_stage(
    dir: &Path,
    model: &TrainableDecoder,
    base: &str,
    changed: &BTreeSet<usize>,
) -> Result<()> {
    let values: HashMap<String, Tensor> = model
        .values(|n| in_changed(n, changed))?
        .into_iter()
        .collect();
    let path = dir.join(DELTA_FILE);
    candle_core::safetensors::save(&values, &path)
        .map_err(candle_error(&path.display().to_string()))?;
    write_json_atomically(
        &dir.join(STAGE_FILE),
        &StageInfo {
            base: base.to_string(),
            variants: model.variants().to_vec(),
            changed_blocks: changed.iter().copied().collect(),
        },
    )
}

/// Reads `dir/stage.json`, `None` when `dir` is not a stage folder.
pub fn read_stage_info(dir: &Path) -> Result<Option<StageInfo>> {
    let path = dir.join(STAGE_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path).map_err(|e| io_err("cannot read", &path, e))?;
    let info = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))?;
    Ok(Some(info))
}

/// Makes `model` (holding the base's weights in the blocks not changed) the stage in `dir`:
/// its variants and changed tensors; returns the stage's description.
pub fn apply_stage(dir: &Path, model: &mut TrainableDecoder) -> Result<StageInfo> {
    let info = read_stage_info(dir)?.ok_or_else(|| {
        Error::NotFound(format!(
            "{} has no {STAGE_FILE}",
            dir.join(STAGE_FILE).display()
        ))
    })?;
    ensure!(
        info.variants.len() == model.num_blocks()
            && info.changed_blocks.iter().all(|&b| b < model.num_blocks()),
        Malformed,
        "{}: made for another number of blocks than the model's {}",
        dir.join(STAGE_FILE).display(),
        model.num_blocks()
    );
    let path = dir.join(DELTA_FILE);
    let delta = candle_core::safetensors::load(&path, &Device::Cpu)
        .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))?;
    let changed: BTreeSet<usize> = info.changed_blocks.iter().copied().collect();
    let expected = model
        .params()
        .iter()
        .filter(|(n, _)| in_changed(n, &changed))
        .count();
    ensure!(
        delta.len() == expected && delta.keys().all(|k| in_changed(k, &changed)),
        Malformed,
        "{}: holds {} tensors, the changed blocks have {expected}",
        path.display(),
        delta.len()
    );
    model.set_values(delta.iter())?;
    for (i, v) in info.variants.iter().enumerate() {
        model.set_variant(i, *v)?;
    }
    Ok(info)
}

/// A Hugging Face `config.json` for `model` with its variants in the `"veil"` object.
pub fn hf_config_text(model: &TrainableDecoder) -> Result<String> {
    let c = model.config();
    ensure!(
        c.rope_scaling.is_none(),
        Unsupported,
        "writing a config with rope scaling is not implemented"
    );
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "max_position_embeddings": c.max_positions,
        "attention_bias": c.attention_bias,
        "mlp_bias": c.mlp_bias,
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids,
        "torch_dtype": "float32",
    });
    let text = serde_json::to_string_pretty(&config).map_err(|e| Error::Other(e.to_string()))?;
    veil_model::decoder::with_variants(&text, model.variants())
}

/// Writes a complete Hugging Face folder of `model` into `dir`: `config.json` (with the
/// variants), `model.safetensors` (every tensor), `tokenizer.json` and, when the model has a
/// chat template, `tokenizer_config.json`. The folder is read back to check it.
pub fn write_hf_folder(
    dir: &Path,
    model: &TrainableDecoder,
    tokenizer: &DecoderTokenizer,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create", dir, e))?;
    let config = hf_config_text(model)?;
    let path = dir.join("config.json");
    std::fs::write(&path, config).map_err(|e| io_err("cannot write", &path, e))?;
    let tensors: HashMap<String, Tensor> = model
        .values(|_| true)?
        .into_iter()
        .map(|(n, t)| match n.as_str() {
            "lm_head.weight" => (n, t),
            _ => (format!("model.{n}"), t),
        })
        .collect();
    let path = dir.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &path)
        .map_err(candle_error(&path.display().to_string()))?;
    let path = dir.join("tokenizer.json");
    tokenizer
        .inner()
        .save(&path, false)
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
    if let Some(chat) = tokenizer.chat_template() {
        let path = dir.join("tokenizer_config.json");
        let text = json!({
            "bos_token": chat.bos_token(),
            "eos_token": chat.eos_token(),
            "chat_template": chat.template(),
        })
        .to_string();
        std::fs::write(&path, text).map_err(|e| io_err("cannot write", &path, e))?;
    }
    let read_back = veil_model::decoder::hf::load_config(dir)?;
    ensure!(
        read_back.layers == model.num_blocks()
            && (0..model.num_blocks()).all(|i| read_back.variant(i) == model.variants()[i]),
        Other,
        "{}: the written config does not read back as the model",
        dir.join("config.json").display()
    );
    Ok(())
}
