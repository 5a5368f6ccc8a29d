//! `config.json` of a Hugging Face decoder folder → [`DecoderConfig`]. Every field is either
//! read, checked to have the value Veil computes with, or on an explicit list of fields that
//! do not change the computation; anything else is an error naming the field.

use serde_json::{Map, Value};
use veil_core::{Error, Result};

use super::config::{DecoderBlockVariant, DecoderConfig, DecoderFamily, RopeScaling};

/// `model_type`s Veil loads as decoders.
pub(crate) const MODEL_TYPES: [&str; 4] = ["llama", "qwen2", "mistral", "gpt2"];

/// Fields that do not change an inference forward pass (bookkeeping, training-only dropout,
/// heads Veil does not build, tokenizer ids used only by other tools).
const HARMLESS: [&str; 37] = [
    "_name_or_path",
    "architectures",
    "model_type",
    "transformers_version",
    "transformers.js_config",
    "torch_dtype",
    "dtype",
    "use_cache",
    "initializer_range",
    "pad_token_id",
    "unk_token_id",
    "sep_token_id",
    "attention_dropout",
    "hidden_dropout",
    "embd_pdrop",
    "resid_pdrop",
    "attn_pdrop",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_proj_to_labels",
    "summary_first_dropout",
    "task_specific_params",
    "is_llama_config",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "id2label",
    "label2id",
    "tokenizer_class",
    "n_ctx",
    "reorder_and_upcast_attn",
    "pretraining_tp",
    "max_window_layers",
    "use_return_dict",
    "problem_type",
    "gradient_checkpointing",
];

/// The config fields, consumed as they are read.
struct Fields {
    map: Map<String, Value>,
    source: String,
}

impl Fields {
    fn err(&self, field: &str, what: &str) -> Error {
        Error::Malformed(format!("{}: field {field} {what}", self.source))
    }

    fn unsupported(&self, field: &str, what: String) -> Error {
        Error::Unsupported(format!(
            "{}: field {field} = {what} is not supported",
            self.source
        ))
    }

    /// Removes `field`; JSON `null` counts as absent.
    fn take(&mut self, field: &str) -> Option<Value> {
        self.map.remove(field).filter(|v| !v.is_null())
    }

    fn usize(&mut self, field: &str) -> Result<usize> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "is missing"))
    }

    fn opt_usize(&mut self, field: &str) -> Result<Option<usize>> {
        match self.take(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.err(field, "is not a non-negative integer")),
        }
    }

    fn f64_or(&mut self, field: &str, default: f64) -> Result<f64> {
        match self.take(field) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.err(field, "is not a number")),
        }
    }

    fn bool_or(&mut self, field: &str, default: bool) -> Result<bool> {
        match self.take(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, "is not a boolean")),
        }
    }

    fn string(&mut self, field: &str) -> Result<Option<String>> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(field, "is not a string")),
        }
    }

    /// `field` must be absent or `expected` (a setting Veil computes only one way).
    fn require(&mut self, field: &str, expected: &Value) -> Result<()> {
        match self.take(field) {
            Some(v) if &v != expected => Err(self.unsupported(field, v.to_string())),
            _ => Ok(()),
        }
    }

    fn token_ids(&mut self, field: &str) -> Result<Vec<u32>> {
        let id = |v: &Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
        match self.take(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| id(v).ok_or_else(|| self.err(field, "holds a non-id")))
                .collect(),
            Some(v) => id(&v)
                .map(|i| vec![i])
                .ok_or_else(|| self.err(field, "is not a token id")),
        }
    }

    /// Errors on the first field nobody read that is not known to be harmless.
    fn finish(self) -> Result<()> {
        let mut left: Vec<&String> = self
            .map
            .keys()
            .filter(|k| !HARMLESS.contains(&k.as_str()))
            .collect();
        left.sort();
        match left.first() {
            Some(k) => Err(Error::Unsupported(format!(
                "{}: field {k} is not supported (it may change the computation)",
                self.source
            ))),
            None => Ok(()),
        }
    }
}

/// Parses `config.json` text; `source` names the file in errors.
pub(crate) fn parse(text: &str, source: &str) -> Result<DecoderConfig> {
    let map = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(Error::Malformed(format!("{source}: not a JSON object"))),
        Err(e) => return Err(Error::Malformed(format!("{source}: {e}"))),
    };
    let mut f = Fields {
        map,
        source: source.to_string(),
    };
    let model_type = f
        .map
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| f.err("model_type", "is missing"))?
        .to_string();
    let mut config = match model_type.as_str() {
        "llama" | "qwen2" | "mistral" => llama(&mut f, &model_type)?,
        "gpt2" => gpt2(&mut f)?,
        other => {
            return Err(Error::Unsupported(format!(
                "{source}: model_type {other:?} is not a supported decoder ({})",
                MODEL_TYPES.join(", ")
            )))
        }
    };
    config.variants = variants(&mut f)?;
    f.finish()?;
    config.validate(source)?;
    Ok(config)
}

fn llama(f: &mut Fields, model_type: &str) -> Result<DecoderConfig> {
    f.require("hidden_act", &Value::from("silu"))?;
    f.require("rope_interleaved", &Value::Bool(false))?;
    f.require("use_sliding_window", &Value::Bool(false))?;
    let hidden = f.usize("hidden_size")?;
    let heads = f.usize("num_attention_heads")?;
    let kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(f.err("num_attention_heads", "does not divide hidden_size"));
    }
    let head_dim = f.opt_usize("head_dim")?.unwrap_or(hidden / heads);
    let mut max_positions = f.usize("max_position_embeddings")?;
    // Mistral's sliding window changes nothing on sequences no longer than the window.
    if let Some(window) = f.opt_usize("sliding_window")? {
        if model_type == "mistral" {
            max_positions = max_positions.min(window);
        }
    }
    let rope_theta = f.f64_or("rope_theta", 10_000.0)?;
    let rope_scaling = rope_scaling(f)?;
    // Qwen2 has q/k/v biases and no field saying so; Llama's `attention_bias` adds them to o too.
    let attention_bias = f.bool_or("attention_bias", model_type == "qwen2")?;
    Ok(DecoderConfig {
        family: DecoderFamily::Llama,
        vocab_size: f.usize("vocab_size")?,
        hidden,
        layers: f.usize("num_hidden_layers")?,
        heads,
        kv_heads,
        head_dim,
        intermediate: f.usize("intermediate_size")?,
        norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
        rope_theta,
        rope_scaling,
        max_positions,
        attention_bias,
        mlp_bias: f.bool_or("mlp_bias", false)?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
        bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
        eos_token_ids: f.token_ids("eos_token_id")?,
        variants: Vec::new(),
    })
}

/// Veil's `"veil"` object: `{"blocks": [DecoderBlockVariant, …]}`, the operators each block
/// uses after substitution (absent: the original operators everywhere).
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VeilDecoderSettings {
    pub(crate) blocks: Vec<DecoderBlockVariant>,
}

fn variants(f: &mut Fields) -> Result<Vec<DecoderBlockVariant>> {
    let Some(v) = f.take("veil") else {
        return Ok(Vec::new());
    };
    serde_json::from_value::<VeilDecoderSettings>(v)
        .map(|s| s.blocks)
        .map_err(|e| f.err("veil", &e.to_string()))
}

/// `config_text` (a decoder's `config.json`) with its `"veil"` object set to `variants`
/// (removed when every block is original): how a substituted model's folder records its
/// operators, every other field kept as it was.
pub fn with_variants(config_text: &str, variants: &[DecoderBlockVariant]) -> Result<String> {
    let mut map = match serde_json::from_str::<Value>(config_text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(Error::Malformed("config.json: not a JSON object".into())),
        Err(e) => return Err(Error::Malformed(format!("config.json: {e}"))),
    };
    if variants.iter().all(DecoderBlockVariant::is_original) {
        map.remove("veil");
    } else {
        let settings = VeilDecoderSettings {
            blocks: variants.to_vec(),
        };
        let v = serde_json::to_value(settings)
            .map_err(|e| Error::Other(format!("config.json: {e}")))?;
        map.insert("veil".into(), v);
    }
    serde_json::to_string_pretty(&Value::Object(map))
        .map_err(|e| Error::Other(format!("config.json: {e}")))
}

/// `config` as a Hugging Face `config.json` that [`parse`] reads back to the same
/// [`DecoderConfig`]: every field written explicitly (so no family default decides it), Veil's
/// block variants in its `"veil"` object. How a decoder's client bundle carries the shape of a
/// model that came from a GGUF file as well as from a folder.
pub(crate) fn to_json(config: &DecoderConfig) -> Result<String> {
    let c = config;
    let mut map = Map::new();
    let mut put = |k: &str, v: Value| {
        map.insert(k.to_string(), v);
    };
    match c.family {
        DecoderFamily::Llama => {
            put("model_type", "llama".into());
            put("hidden_act", "silu".into());
            put("hidden_size", c.hidden.into());
            put("num_attention_heads", c.heads.into());
            put("num_key_value_heads", c.kv_heads.into());
            put("head_dim", c.head_dim.into());
            put("num_hidden_layers", c.layers.into());
            put("intermediate_size", c.intermediate.into());
            put("max_position_embeddings", c.max_positions.into());
            put("rms_norm_eps", c.norm_eps.into());
            put("rope_theta", c.rope_theta.into());
            put("attention_bias", c.attention_bias.into());
            put("mlp_bias", c.mlp_bias.into());
            if let Some(s) = &c.rope_scaling {
                put("rope_scaling", rope_scaling_json(s));
            }
        }
        DecoderFamily::Gpt2 => {
            put("model_type", "gpt2".into());
            put("activation_function", "gelu_new".into());
            put("n_embd", c.hidden.into());
            put("n_head", c.heads.into());
            put("n_layer", c.layers.into());
            put("n_inner", c.intermediate.into());
            put("n_positions", c.max_positions.into());
            put("layer_norm_epsilon", c.norm_eps.into());
        }
    }
    put("vocab_size", c.vocab_size.into());
    put("tie_word_embeddings", c.tie_word_embeddings.into());
    if let Some(id) = c.bos_token_id {
        put("bos_token_id", id.into());
    }
    put("eos_token_id", c.eos_token_ids.clone().into());
    if !c.variants.is_empty() {
        let settings = VeilDecoderSettings {
            blocks: c.variants.clone(),
        };
        let v = serde_json::to_value(settings)
            .map_err(|e| Error::Other(format!("config.json: {e}")))?;
        put("veil", v);
    }
    serde_json::to_string_pretty(&Value::Object(map))
        .map_err(|e| Error::Other(format!("config.json: {e}")))
}

fn rope_scaling_json(s: &RopeScaling) -> Value {
    match s {
        RopeScaling::Linear { factor } => {
            serde_json::json!({"rope_type": "linear", "factor": factor})
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => serde_json::json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    }
}

fn rope_scaling(f: &mut Fields) -> Result<Option<RopeScaling>> {
    let Some(v) = f.take("rope_scaling") else {
        return Ok(None);
    };
    let Value::Object(mut m) = v else {
        return Err(f.err("rope_scaling", "is not an object"));
    };
    // Newer configs name it `rope_type`, older `type`; some carry both.
    let (new, old) = (m.remove("rope_type"), m.remove("type"));
    let kind = new
        .or(old)
        .and_then(|k| k.as_str().map(str::to_string))
        .ok_or_else(|| f.err("rope_scaling.rope_type", "is missing"))?;
    let mut num = |key: &str| -> Result<f64> {
        m.remove(key)
            .and_then(|x| x.as_f64())
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| {
                f.err(
                    &format!("rope_scaling.{key}"),
                    "is missing or not a positive number",
                )
            })
    };
    let scaling = match kind.as_str() {
        "linear" => RopeScaling::Linear {
            factor: num("factor")?,
        },
        "llama3" => {
            let (factor, low, high) = (
                num("factor")?,
                num("low_freq_factor")?,
                num("high_freq_factor")?,
            );
            let original = num("original_max_position_embeddings")?;
            if high <= low {
                return Err(f.err(
                    "rope_scaling.high_freq_factor",
                    "is not above low_freq_factor",
                ));
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original as usize,
            }
        }
        other => {
            return Err(f.unsupported(
                "rope_scaling.rope_type",
                format!("{other:?} (linear, llama3 are)"),
            ))
        }
    };
    if let Some(extra) = m.keys().next() {
        return Err(f.unsupported(&format!("rope_scaling.{extra}"), "present".into()));
    }
    Ok(Some(scaling))
}

fn gpt2(f: &mut Fields) -> Result<DecoderConfig> {
    match f.string("activation_function")?.as_deref() {
        None | Some("gelu_new") | Some("gelu_pytorch_tanh") => {}
        Some(other) => {
            return Err(f.unsupported("activation_function", format!("{other:?} (gelu_new is)")))
        }
    }
    f.require("scale_attn_weights", &Value::Bool(true))?;
    f.require("scale_attn_by_inverse_layer_idx", &Value::Bool(false))?;
    f.require("add_cross_attention", &Value::Bool(false))?;
    let hidden = f.usize("n_embd")?;
    let heads = f.usize("n_head")?;
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(f.err("n_head", "does not divide n_embd"));
    }
    let intermediate = f.opt_usize("n_inner")?.unwrap_or(4 * hidden);
    Ok(DecoderConfig {
        family: DecoderFamily::Gpt2,
        vocab_size: f.usize("vocab_size")?,
        hidden,
        layers: f.usize("n_layer")?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate,
        norm_eps: f.f64_or("layer_norm_epsilon", 1e-5)?,
        rope_theta: 0.0,
        rope_scaling: None,
        max_positions: f.usize("n_positions")?,
        attention_bias: true,
        mlp_bias: true,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", true)?,
        bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
        eos_token_ids: f.token_ids("eos_token_id")?,
        variants: Vec::new(),
    })
}
