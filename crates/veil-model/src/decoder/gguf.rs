//! llama.cpp's GGUF files: the `llama` architecture, every tensor dequantised to f32 with
//! candle, mapped to Hugging Face layout; the tokenizer and chat template from the metadata.
//!
//! candle parses the container (with bounds checks on every length); Veil checks each metadata
//! key and tensor shape against what the Llama composition needs before reading data, so a
//! truncated or corrupt file is an error naming the file, never a panic or a huge allocation.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::Device;
use veil_core::{Error, Result};

use super::bpe::{byte_level_bpe, PreSplit, SpecialToken};
use super::chat::ChatTemplate;
use super::config::{DecoderConfig, DecoderFamily, RopeScaling};
use super::tokenizer::DecoderTokenizer;
use super::weights::{DecoderBlock, DecoderWeights, Linear, Matrix, Mlp, Norm};
use super::DecoderModel;

/// `llama.*` metadata keys Veil reads or knows not to change the computation. Any other
/// `llama.*` key (experts, sliding windows, …) is refused by name.
const KNOWN_LLAMA_KEYS: [&str; 16] = [
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.attention.key_length",
    "llama.attention.value_length",
    "llama.rope.freq_base",
    "llama.rope.dimension_count",
    "llama.rope.scaling.type",
    "llama.rope.scaling.factor",
    "llama.rope.scaling.original_context_length",
    "llama.rope.scaling.finetuned",
    "llama.vocab_size",
];

/// token_type values of llama.cpp's vocabulary (`llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Loads a GGUF decoder with its tokenizer and chat template.
pub fn load(path: &Path) -> Result<DecoderModel> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!("{name}: no such GGUF file")),
        _ => Error::Io(e),
    })?;
    let mut reader = BufReader::new(file);
    let content = read_content(&mut reader, &name)?;
    let gguf = Gguf {
        content: &content,
        name: &name,
    };
    let arch = gguf.string("general.architecture")?;
    if arch != "llama" {
        return Err(Error::Unsupported(format!(
            "{name}: architecture general.architecture = {arch:?} is not supported (only llama)"
        )));
    }
    let tokenizer = gguf.tokenizer()?;
    let config = gguf.config(tokenizer.vocab_size())?;
    let weights = gguf.weights(config, &mut reader)?;
    Ok(DecoderModel { weights, tokenizer })
}

/// candle's header parser, with any panic it might hit on a hostile file (it divides by the
/// file's alignment field) turned into an error.
fn read_content(reader: &mut BufReader<File>, name: &str) -> Result<Content> {
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Content::read(reader)));
    match parsed {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(Error::Malformed(format!(
            "{name}: not a readable GGUF file: {e}"
        ))),
        Err(_) => Err(Error::Malformed(format!("{name}: corrupt GGUF header"))),
    }
}

struct Gguf<'a> {
    content: &'a Content,
    name: &'a str,
}

impl Gguf<'_> {
    fn err(&self, what: String) -> Error {
        Error::Malformed(format!("{}: {what}", self.name))
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| self.err(format!("metadata {key} is missing")))
    }

    fn string(&self, key: &str) -> Result<String> {
        match self.require(key)? {
            Value::String(s) => Ok(s.clone()),
            v => Err(self.err(format!(
                "metadata {key} is {:?}, not a string",
                v.value_type()
            ))),
        }
    }

    fn opt_string(&self, key: &str) -> Result<Option<String>> {
        self.get(key).map(|_| self.string(key)).transpose()
    }

    /// Any integer type, as llama.cpp writes u32 or i32 or u64 depending on the converter.
    fn int(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        as_int(v).ok_or_else(|| {
            self.err(format!(
                "metadata {key} is not a non-negative integer ({v:?})"
            ))
        })
    }

    fn opt_int(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|_| self.int(key)).transpose()
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let v = self.int(key)?;
        usize::try_from(v).map_err(|_| self.err(format!("metadata {key} = {v} is too large")))
    }

    fn id(&self, key: &str) -> Result<Option<u32>> {
        self.opt_int(key)?
            .map(|v| {
                u32::try_from(v).map_err(|_| self.err(format!("metadata {key} = {v} is too large")))
            })
            .transpose()
    }

    fn float(&self, key: &str) -> Result<f64> {
        match self.require(key)? {
            Value::F32(v) => Ok(f64::from(*v)),
            Value::F64(v) => Ok(*v),
            v => Err(self.err(format!(
                "metadata {key} is {:?}, not a float",
                v.value_type()
            ))),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => as_int(v)
                .map(|i| i != 0)
                .ok_or_else(|| self.err(format!("metadata {key} is not a boolean"))),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.require(key)? {
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(self.err(format!("metadata {key} holds a non-string"))),
                })
                .collect(),
            _ => Err(self.err(format!("metadata {key} is not an array"))),
        }
    }

    fn config(&self, vocab_size: usize) -> Result<DecoderConfig> {
        for key in self.content.metadata.keys() {
            if key.starts_with("llama.") && !KNOWN_LLAMA_KEYS.contains(&key.as_str()) {
                return Err(Error::Unsupported(format!(
                    "{}: metadata {key} is not supported (it may change the computation)",
                    self.name
                )));
            }
        }
        let hidden = self.usize("llama.embedding_length")?;
        let heads = self.usize("llama.attention.head_count")?;
        let kv_heads = match self.get("llama.attention.head_count_kv") {
            Some(_) => self.usize("llama.attention.head_count_kv")?,
            None => heads,
        };
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(self.err(format!(
                "hidden size {hidden} is not a multiple of {heads} heads"
            )));
        }
        let head_dim = hidden / heads;
        for key in [
            "llama.attention.key_length",
            "llama.attention.value_length",
            "llama.rope.dimension_count",
        ] {
            if let Some(v) = self.opt_int(key)? {
                if v != head_dim as u64 {
                    return Err(Error::Unsupported(format!(
                        "{}: metadata {key} = {v} differs from the head size {head_dim}",
                        self.name
                    )));
                }
            }
        }
        if let Some(v) = self.opt_int("llama.vocab_size")? {
            if v != vocab_size as u64 {
                return Err(self.err(format!(
                    "llama.vocab_size = {v} but the tokenizer has {vocab_size} tokens"
                )));
            }
        }
        let mut eos_token_ids = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = self.id(key)? {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }
        let config = DecoderConfig {
            family: DecoderFamily::Llama,
            vocab_size,
            hidden,
            layers: self.usize("llama.block_count")?,
            heads,
            kv_heads,
            head_dim,
            intermediate: self.usize("llama.feed_forward_length")?,
            norm_eps: self.float("llama.attention.layer_norm_rms_epsilon")?,
            rope_theta: match self.get("llama.rope.freq_base") {
                Some(_) => self.float("llama.rope.freq_base")?,
                None => 10_000.0,
            },
            rope_scaling: self.rope_scaling()?,
            max_positions: self.usize("llama.context_length")?,
            attention_bias: false,
            mlp_bias: false,
            tie_word_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            bos_token_id: self.id("tokenizer.ggml.bos_token_id")?,
            eos_token_ids,
            variants: Vec::new(),
        };
        config.validate(self.name)?;
        Ok(config)
    }

    fn rope_scaling(&self) -> Result<Option<RopeScaling>> {
        if self.content.tensor_infos.contains_key("rope_freqs.weight") {
            return Err(Error::Unsupported(format!(
                "{}: tensor rope_freqs (precomputed llama3 rope scaling) is not supported",
                self.name
            )));
        }
        match self.opt_string("llama.rope.scaling.type")?.as_deref() {
            None | Some("none") => Ok(None),
            Some("linear") => {
                let factor = self.float("llama.rope.scaling.factor")?;
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(self.err(format!(
                        "llama.rope.scaling.factor = {factor} is not positive"
                    )));
                }
                Ok(Some(RopeScaling::Linear { factor }))
            }
            Some(other) => Err(Error::Unsupported(format!(
                "{}: llama.rope.scaling.type = {other:?} is not supported (none, linear are)",
                self.name
            ))),
        }
    }

    fn tokenizer(&self) -> Result<DecoderTokenizer> {
        let model = self.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "{}: tokenizer.ggml.model = {model:?} is not supported (only gpt2, byte-level BPE; \
                 llama is SentencePiece)",
                self.name
            )));
        }
        if self.bool_or("tokenizer.ggml.add_space_prefix", false)? {
            return Err(Error::Unsupported(format!(
                "{}: tokenizer.ggml.add_space_prefix = true is not supported",
                self.name
            )));
        }
        let split =
            PreSplit::from_gguf(self.opt_string("tokenizer.ggml.pre")?.as_deref(), self.name)?;
        let tokens = self.strings("tokenizer.ggml.tokens")?;
        let merges = self.strings("tokenizer.ggml.merges")?;
        let types: Vec<i64> = match self.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    as_signed(v).ok_or_else(|| {
                        self.err("tokenizer.ggml.token_type holds a non-integer".into())
                    })
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(self.err("tokenizer.ggml.token_type is not an array".into())),
        };
        if types.len() != tokens.len() {
            return Err(self.err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let specials: Vec<SpecialToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(s, &t)| SpecialToken {
                content: s.clone(),
                special: t == TOKEN_TYPE_CONTROL,
            })
            .collect();
        let bos = match (
            self.bool_or("tokenizer.ggml.add_bos_token", false)?,
            self.id("tokenizer.ggml.bos_token_id")?,
        ) {
            (true, Some(id)) => {
                let token = tokens.get(id as usize).ok_or_else(|| {
                    self.err(format!(
                        "tokenizer.ggml.bos_token_id = {id} is outside the vocabulary"
                    ))
                })?;
                Some((token.as_str(), id))
            }
            _ => None,
        };
        let inner = byte_level_bpe(&tokens, &merges, &specials, split, bos, self.name)?;
        let token_text = |key: &str| -> Result<String> {
            Ok(match self.id(key)? {
                Some(id) => tokens
                    .get(id as usize)
                    .cloned()
                    .ok_or_else(|| self.err(format!("{key} = {id} is outside the vocabulary")))?,
                None => String::new(),
            })
        };
        let chat = match self.opt_string("tokenizer.chat_template")? {
            Some(t) => Some(ChatTemplate::new(
                t,
                token_text("tokenizer.ggml.bos_token_id")?,
                token_text("tokenizer.ggml.eos_token_id")?,
                self.name,
            )?),
            None => None,
        };
        Ok(DecoderTokenizer::new(inner, chat, self.name))
    }

    fn weights(
        &self,
        config: DecoderConfig,
        reader: &mut BufReader<File>,
    ) -> Result<DecoderWeights> {
        let c = &config;
        let expected = expected_tensors(c);
        for name in self.content.tensor_infos.keys() {
            if !expected.iter().any(|(n, _)| n == name) {
                return Err(Error::Unsupported(format!(
                    "{}: tensor {name} is not part of a llama model Veil supports",
                    self.name
                )));
            }
        }
        let mut read = |name: &str| -> Result<Vec<f32>> {
            let shape = &expected
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| self.err(format!("tensor {name} is not expected")))?
                .1;
            self.tensor(reader, name, shape)
        };
        let (h, q_out, kv_out) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let token_embedding = Matrix::new(c.vocab_size, h, read("token_embd.weight")?)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(Matrix::new(c.vocab_size, h, read("output.weight")?)?)
        };
        let linear = |data: Vec<f32>, rows: usize, cols: usize| -> Result<Linear> {
            Ok(Linear {
                weight: Matrix::new(rows, cols, data)?,
                bias: None,
            })
        };
        let norm = |weight: Vec<f32>| Norm { weight, bias: None };
        let mut blocks = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let mut t = |part: &str| read(&format!("blk.{i}.{part}.weight"));
            let q = unpermute_rotary(&t("attn_q")?, c.heads, c.head_dim, h);
            let k = unpermute_rotary(&t("attn_k")?, c.kv_heads, c.head_dim, h);
            blocks.push(DecoderBlock {
                attn_norm: norm(t("attn_norm")?),
                q: linear(q, q_out, h)?,
                k: linear(k, kv_out, h)?,
                v: linear(t("attn_v")?, kv_out, h)?,
                o: linear(t("attn_output")?, h, q_out)?,
                mlp_norm: norm(t("ffn_norm")?),
                mlp: Mlp::Gated {
                    gate: linear(t("ffn_gate")?, c.intermediate, h)?,
                    up: linear(t("ffn_up")?, c.intermediate, h)?,
                    down: linear(t("ffn_down")?, h, c.intermediate)?,
                },
            });
        }
        let final_norm = norm(read("output_norm.weight")?);
        let weights = DecoderWeights {
            config,
            token_embedding,
            position_embedding: None,
            blocks,
            final_norm,
            lm_head,
        };
        weights.validate(self.name)?;
        Ok(weights)
    }

    /// One tensor as f32, after checking its shape (candle's order: `[out, in]`).
    fn tensor(
        &self,
        reader: &mut BufReader<File>,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| self.err(format!("tensor {name} is missing")))?;
        if info.shape.dims() != shape {
            return Err(self.err(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                info.shape.dims()
            )));
        }
        let q = info
            .read(reader, self.content.tensor_data_offset, &Device::Cpu)
            .map_err(crate::candle_error(&format!(
                "{}: tensor {name} ({:?})",
                self.name, info.ggml_dtype
            )))?;
        let t = q.dequantize(&Device::Cpu).map_err(|e| {
            Error::Unsupported(format!(
                "{}: tensor {name}: candle cannot dequantise type {:?}: {e}",
                self.name, info.ggml_dtype
            ))
        })?;
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(crate::candle_error(&format!(
                "{}: tensor {name}",
                self.name
            )))
    }
}

/// Every tensor a llama GGUF with `config` holds, with its shape.
fn expected_tensors(c: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
    let (h, q_out, kv_out, f) = (
        c.hidden,
        c.heads * c.head_dim,
        c.kv_heads * c.head_dim,
        c.intermediate,
    );
    let mut out = vec![
        ("token_embd.weight".to_string(), vec![c.vocab_size, h]),
        ("output_norm.weight".to_string(), vec![h]),
    ];
    if !c.tie_word_embeddings {
        out.push(("output.weight".to_string(), vec![c.vocab_size, h]));
    }
    for i in 0..c.layers {
        for (part, shape) in [
            ("attn_norm", vec![h]),
            ("attn_q", vec![q_out, h]),
            ("attn_k", vec![kv_out, h]),
            ("attn_v", vec![kv_out, h]),
            ("attn_output", vec![h, q_out]),
            ("ffn_norm", vec![h]),
            ("ffn_gate", vec![f, h]),
            ("ffn_up", vec![f, h]),
            ("ffn_down", vec![h, f]),
        ] {
            out.push((format!("blk.{i}.{part}.weight"), shape));
        }
    }
    out
}

/// Undoes llama.cpp's converter, which stores each head's rows as
/// `w.reshape(n_head, 2, head_dim/2, in).swapaxes(1, 2)`: GGUF row `2i + s` of a head is Hugging
/// Face row `s·head_dim/2 + i` (the first and second rotary halves interleaved).
pub fn unpermute_rotary(gguf: &[f32], n_head: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut hf = vec![0f32; gguf.len()];
    for head in 0..n_head {
        for i in 0..half {
            for s in 0..2 {
                let from = (head * head_dim + 2 * i + s) * cols;
                let to = (head * head_dim + s * half + i) * cols;
                hf[to..to + cols].copy_from_slice(&gguf[from..from + cols]);
            }
        }
    }
    hf
}

fn as_int(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(u64::from(*x)),
        Value::U16(x) => Some(u64::from(*x)),
        Value::U32(x) => Some(u64::from(*x)),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

fn as_signed(v: &Value) -> Option<i64> {
    match v {
        Value::I8(x) => Some(i64::from(*x)),
        Value::I16(x) => Some(i64::from(*x)),
        Value::I32(x) => Some(i64::from(*x)),
        Value::I64(x) => Some(*x),
        _ => as_int(v).and_then(|x| i64::try_from(x).ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_restores_rotate_half_order() {
        // One head of size 4 (halves {0,1} and {2,3}), one column: llama.cpp stores rows
        // 0, 2, 1, 3 (pairs of the two halves interleaved).
        assert_eq!(
            unpermute_rotary(&[0.0, 2.0, 1.0, 3.0], 1, 4, 1),
            vec![0.0, 1.0, 2.0, 3.0]
        );
        // Two heads of size 2 and two columns: each head is already its own pair.
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        assert_eq!(unpermute_rotary(&w, 2, 2, 2), w.to_vec());
    }
}
