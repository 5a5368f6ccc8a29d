//! Hugging Face decoder folders: `config.json` + `model.safetensors`, with `tokenizer.json`
//! and, for chat, `tokenizer_config.json`'s `chat_template`.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use veil_core::{Error, Result};

use super::chat::ChatTemplate;
use super::config::{DecoderConfig, DecoderFamily};
use super::hf_config;
use super::tokenizer::DecoderTokenizer;
use super::weights::{DecoderBlock, DecoderWeights, Linear, Matrix, Mlp, Norm};
use super::DecoderModel;

/// Whether `dir/config.json` declares a decoder `model_type` Veil knows (so encoder commands
/// can refuse it by name).
pub fn is_decoder_folder(dir: &Path) -> bool {
    model_type(dir).is_some_and(|t| hf_config::MODEL_TYPES.contains(&t.as_str()))
}

/// The `model_type` of `dir/config.json`, if it can be read.
pub fn model_type(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("model_type")?.as_str().map(str::to_string)
}

/// Reads and checks `dir/config.json`.
pub fn load_config(dir: &Path) -> Result<DecoderConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!(
            "{} (a decoder folder needs its config.json)",
            path.display()
        )),
        _ => Error::Other(format!("{}: {e}", path.display())),
    })?;
    hf_config::parse(&text, &path.display().to_string())
}

/// Loads a decoder folder.
pub fn load(dir: &Path) -> Result<DecoderModel> {
    let config = load_config(dir)?;
    let tokenizer = load_tokenizer(dir)?;
    let weights = load_weights(dir, config)?;
    Ok(DecoderModel { weights, tokenizer })
}

/// `tokenizer.json`, with the chat template of `tokenizer_config.json` when there is one.
pub fn load_tokenizer(dir: &Path) -> Result<DecoderTokenizer> {
    let path = dir.join("tokenizer.json");
    let name = path.display().to_string();
    if !path.is_file() {
        return Err(Error::NotFound(format!(
            "{name} (a decoder folder needs its tokenizer.json)"
        )));
    }
    let inner = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| Error::Malformed(format!("{name}: {e}")))?;
    let chat = chat_template(dir)?;
    Ok(DecoderTokenizer::new(inner, chat, name))
}

/// The `chat_template` of `tokenizer_config.json` (a string, or a list of named templates of
/// which `default` is taken), with its `bos_token` and `eos_token`.
fn chat_template(dir: &Path) -> Result<Option<ChatTemplate>> {
    let path = dir.join("tokenizer_config.json");
    let name = path.display().to_string();
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let v: Value =
        serde_json::from_str(&text).map_err(|e| Error::Malformed(format!("{name}: {e}")))?;
    let template = match v.get("chat_template") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .ok_or_else(|| {
                Error::Malformed(format!("{name}: chat_template has no \"default\" entry"))
            })?
            .to_string(),
        Some(_) => {
            return Err(Error::Malformed(format!(
                "{name}: chat_template is not a string"
            )))
        }
    };
    // A special token is a string or an AddedToken object {content, ...}.
    let token = |key: &str| -> String {
        match v.get(key) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(o)) => o
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        }
    };
    ChatTemplate::new(template, token("bos_token"), token("eos_token"), &name).map(Some)
}

/// The tensors of `dir/model.safetensors` as f32, named without the `model.` / `transformer.`
/// prefix.
fn read_tensors(dir: &Path) -> Result<(HashMap<String, Tensor>, String)> {
    let path = dir.join("model.safetensors");
    let name = path.display().to_string();
    if !path.is_file() {
        let sharded = dir.join("model.safetensors.index.json").is_file();
        return Err(if sharded {
            Error::Unsupported(format!("{name}: sharded checkpoints are not supported"))
        } else if dir.join(crate::MANIFEST_FILE).is_file() {
            Error::InvalidArgument(format!(
                "{}: a client bundle holds no weights; it serves only a private generation \
                 with a server that has them (--connect)",
                dir.display()
            ))
        } else {
            Error::NotFound(format!("{name} (a decoder folder needs its weights)"))
        });
    }
    let raw =
        candle_core::safetensors::load(&path, &Device::Cpu).map_err(crate::candle_error(&name))?;
    let tensors = raw
        .into_iter()
        .map(|(k, v)| {
            let k = k
                .strip_prefix("model.")
                .or_else(|| k.strip_prefix("transformer."))
                .unwrap_or(&k)
                .to_string();
            (k, v)
        })
        .collect();
    Ok((tensors, name))
}

/// Takes named tensors out of a checkpoint, checking shapes; leftovers are an error.
struct Checkpoint {
    tensors: HashMap<String, Tensor>,
    source: String,
}

impl Checkpoint {
    fn err(&self, what: String) -> Error {
        Error::Malformed(format!("{}: {what}", self.source))
    }

    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| self.err(format!("tensor {name} is missing")))?;
        if t.dims() != shape {
            return Err(self.err(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                t.dims()
            )));
        }
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(crate::candle_error(&format!(
                "{}: tensor {name}",
                self.source
            )))
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        Matrix::new(rows, cols, self.take(name, &[rows, cols])?)
    }

    /// A `[out, in]` nn.Linear, with its bias when `bias`.
    fn linear(&mut self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        Ok(Linear {
            weight: self.matrix(&format!("{prefix}.weight"), out, inp)?,
            bias: if bias {
                Some(self.take(&format!("{prefix}.bias"), &[out])?)
            } else {
                None
            },
        })
    }

    /// A GPT-2 Conv1D (`[in, out]`, always biased), transposed to `[out, in]`.
    fn conv1d(&mut self, prefix: &str, inp: usize, out: usize) -> Result<Linear> {
        let w = self.take(&format!("{prefix}.weight"), &[inp, out])?;
        Ok(Linear {
            weight: transpose(&w, inp, out),
            bias: Some(self.take(&format!("{prefix}.bias"), &[out])?),
        })
    }

    fn norm(&mut self, prefix: &str, width: usize, bias: bool) -> Result<Norm> {
        Ok(Norm {
            weight: self.take(&format!("{prefix}.weight"), &[width])?,
            bias: if bias {
                Some(self.take(&format!("{prefix}.bias"), &[width])?)
            } else {
                None
            },
        })
    }

    /// Drops buffers that are not weights (rotary tables, GPT-2's causal masks), then errors on
    /// any tensor left unread.
    fn finish(mut self) -> Result<()> {
        self.tensors.retain(|k, _| {
            !(k.ends_with("rotary_emb.inv_freq")
                || k.ends_with("attn.bias")
                || k.ends_with("attn.masked_bias"))
        });
        let mut left: Vec<&String> = self.tensors.keys().collect();
        left.sort();
        match left.first() {
            Some(k) => Err(Error::Unsupported(format!(
                "{}: tensor {k} is not part of the model Veil builds",
                self.source
            ))),
            None => Ok(()),
        }
    }
}

/// `[rows, cols]` row-major → `[cols, rows]`.
fn transpose(w: &[f32], rows: usize, cols: usize) -> Matrix {
    let mut t = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    Matrix {
        rows: cols,
        cols: rows,
        data: t,
    }
}

/// The weights of `dir` for `config`.
pub fn load_weights(dir: &Path, config: DecoderConfig) -> Result<DecoderWeights> {
    let (tensors, source) = read_tensors(dir)?;
    let mut ck = Checkpoint { tensors, source };
    let weights = match config.family {
        DecoderFamily::Llama => llama_weights(&mut ck, config)?,
        DecoderFamily::Gpt2 => gpt2_weights(&mut ck, config)?,
    };
    weights.validate(&ck.source)?;
    ck.finish()?;
    Ok(weights)
}

fn llama_weights(ck: &mut Checkpoint, config: DecoderConfig) -> Result<DecoderWeights> {
    let c = &config;
    let (h, q_out, kv_out, f) = (
        c.hidden,
        c.heads * c.head_dim,
        c.kv_heads * c.head_dim,
        c.intermediate,
    );
    let token_embedding = ck.matrix("embed_tokens.weight", c.vocab_size, h)?;
    let mut blocks = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let p = |s: &str| format!("layers.{i}.{s}");
        // Llama's attention_bias covers o_proj as well; Qwen2 has q/k/v biases only.
        let o_bias = ck.has(&p("self_attn.o_proj.bias"));
        blocks.push(DecoderBlock {
            attn_norm: ck.norm(&p("input_layernorm"), h, false)?,
            q: ck.linear(&p("self_attn.q_proj"), q_out, h, c.attention_bias)?,
            k: ck.linear(&p("self_attn.k_proj"), kv_out, h, c.attention_bias)?,
            v: ck.linear(&p("self_attn.v_proj"), kv_out, h, c.attention_bias)?,
            o: ck.linear(&p("self_attn.o_proj"), h, q_out, c.attention_bias && o_bias)?,
            mlp_norm: ck.norm(&p("post_attention_layernorm"), h, false)?,
            mlp: Mlp::Gated {
                gate: ck.linear(&p("mlp.gate_proj"), f, h, c.mlp_bias)?,
                up: ck.linear(&p("mlp.up_proj"), f, h, c.mlp_bias)?,
                down: ck.linear(&p("mlp.down_proj"), h, f, c.mlp_bias)?,
            },
        });
    }
    let final_norm = ck.norm("norm", h, false)?;
    let lm_head = lm_head(ck, c)?;
    Ok(DecoderWeights {
        config,
        token_embedding,
        position_embedding: None,
        blocks,
        final_norm,
        lm_head,
    })
}

fn gpt2_weights(ck: &mut Checkpoint, config: DecoderConfig) -> Result<DecoderWeights> {
    let c = &config;
    let (h, f) = (c.hidden, c.intermediate);
    let token_embedding = ck.matrix("wte.weight", c.vocab_size, h)?;
    let position_embedding = Some(ck.matrix("wpe.weight", c.max_positions, h)?);
    let mut blocks = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let p = |s: &str| format!("h.{i}.{s}");
        let fused = ck.take(&p("attn.c_attn.weight"), &[h, 3 * h])?;
        let fused_bias = ck.take(&p("attn.c_attn.bias"), &[3 * h])?;
        let [q, k, v] = split_qkv(&transpose(&fused, h, 3 * h), &fused_bias, h);
        blocks.push(DecoderBlock {
            attn_norm: ck.norm(&p("ln_1"), h, true)?,
            q,
            k,
            v,
            o: ck.conv1d(&p("attn.c_proj"), h, h)?,
            mlp_norm: ck.norm(&p("ln_2"), h, true)?,
            mlp: Mlp::Plain {
                up: ck.conv1d(&p("mlp.c_fc"), h, f)?,
                down: ck.conv1d(&p("mlp.c_proj"), f, h)?,
            },
        });
    }
    let final_norm = ck.norm("ln_f", h, true)?;
    let lm_head = lm_head(ck, c)?;
    Ok(DecoderWeights {
        config,
        token_embedding,
        position_embedding,
        blocks,
        final_norm,
        lm_head,
    })
}

/// The separate head, or `None` when tied (a tied checkpoint's copy of the embedding is
/// dropped).
fn lm_head(ck: &mut Checkpoint, c: &DecoderConfig) -> Result<Option<Matrix>> {
    if c.tie_word_embeddings {
        ck.tensors.remove("lm_head.weight");
        Ok(None)
    } else {
        ck.matrix("lm_head.weight", c.vocab_size, c.hidden)
            .map(Some)
    }
}

/// GPT-2's fused `[3h, in]` q/k/v projection and its bias cut into three `[h, in]` ones.
fn split_qkv(fused: &Matrix, bias: &[f32], h: usize) -> [Linear; 3] {
    let cols = fused.cols;
    std::array::from_fn(|part| Linear {
        weight: Matrix {
            rows: h,
            cols,
            data: fused.data[part * h * cols..(part + 1) * h * cols].to_vec(),
        },
        bias: Some(bias[part * h..(part + 1) * h].to_vec()),
    })
}
