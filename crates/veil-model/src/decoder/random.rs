//! Tiny seeded random decoders written as Hugging Face folders, for tests that need no
//! download: `config.json`, `model.safetensors`, a byte-level BPE `tokenizer.json` and a
//! `tokenizer_config.json` with a ChatML template (SmolLM2's); and the same models as llama.cpp
//! GGUF files ([`write_tiny_gguf`]).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use serde_json::json;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use veil_core::{Error, Prg, Result, Seed};

use super::bpe::{byte_level_bpe, PreSplit, SpecialToken};
use crate::random::gaussian;

/// The chat template of SmolLM2-135M-Instruct (its GGUF metadata and `tokenizer_config.json`).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Special tokens of the tiny vocabulary, ids 0, 1, 2 (as in SmolLM2).
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Merges of the tiny vocabulary (after the 256 byte symbols), so that common words become
/// single tokens.
const MERGES: [&str; 10] = [
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "a t", "e r", "Ġ c", "Ġc at", "o n",
];

/// Shape of a tiny decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct TinyShape {
    /// Blocks.
    pub layers: usize,
    /// Residual width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Llama only (GPT-2 requires `heads`).
    pub kv_heads: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Longest sequence (GPT-2's position table).
    pub max_positions: usize,
    /// Whether the LM head is the token embedding.
    pub tie_word_embeddings: bool,
    /// Llama: biases on q/k/v/o (`attention_bias`). GPT-2 always has biases.
    pub attention_bias: bool,
    /// Standard deviation of the random weights.
    pub std: f64,
}

impl Default for TinyShape {
    /// 2 blocks of width 32, 4 query and 2 key/value heads, MLP 64, 64 positions, tied head.
    fn default() -> Self {
        TinyShape {
            layers: 2,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            intermediate: 64,
            max_positions: 64,
            tie_word_embeddings: true,
            attention_bias: false,
            std: 0.2,
        }
    }
}

/// The tiny tokenizer's vocabulary: the specials, GPT-2's 256 byte symbols (sorted), then one
/// token per merge.
pub fn tiny_vocabulary() -> Vec<String> {
    let mut bytes: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    bytes.sort_unstable();
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    tokens.extend(bytes.iter().map(char::to_string));
    tokens.extend(MERGES.iter().map(|m| m.replace(' ', "")));
    tokens
}

/// Writes `tokenizer.json` and `tokenizer_config.json` (ChatML template, `<|im_start|>` as BOS
/// and `<|im_end|>` as EOS) into `dir`.
pub fn write_tiny_tokenizer(dir: &Path) -> Result<()> {
    let specials: Vec<SpecialToken> = SPECIALS
        .iter()
        .map(|s| SpecialToken {
            content: s.to_string(),
            special: true,
        })
        .collect();
    let merges: Vec<String> = MERGES.iter().map(|m| m.to_string()).collect();
    let tokenizer = byte_level_bpe(
        &tiny_vocabulary(),
        &merges,
        &specials,
        PreSplit::DigitsThenGpt2,
        None,
        "tiny tokenizer",
    )?;
    let path = dir.join("tokenizer.json");
    tokenizer
        .save(&path, true)
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
    let config = json!({
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
        "chat_template": CHATML_TEMPLATE,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string())?;
    Ok(())
}

/// Draws named tensors from one seeded stream, in call order.
struct Draw {
    prg: Prg,
    std: f64,
    tensors: HashMap<String, Tensor>,
}

impl Draw {
    fn new(seed: u8, std: f64) -> Self {
        Draw {
            prg: Prg::from_seed(&Seed([seed; 16])),
            std,
            tensors: HashMap::new(),
        }
    }

    /// N(mean, std²) values of `shape` under `name`.
    fn put(&mut self, name: &str, shape: &[usize], mean: f64) -> Result<()> {
        let n = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| (mean + gaussian(&mut self.prg) * self.std) as f32)
            .collect();
        let t = Tensor::from_vec(values, shape, &Device::Cpu).map_err(crate::candle_error(name))?;
        self.tensors.insert(name.to_string(), t);
        Ok(())
    }

    fn save(self, dir: &Path) -> Result<()> {
        let path = dir.join("model.safetensors");
        candle_core::safetensors::save(&self.tensors, &path)
            .map_err(crate::candle_error(&path.display().to_string()))
    }
}

/// Writes a random `LlamaForCausalLM` folder of `shape` into `dir`, weights from `seed`.
pub fn write_tiny_llama(dir: &Path, seed: u8, shape: &TinyShape) -> Result<()> {
    let s = shape;
    let vocab = tiny_vocabulary().len();
    let head_dim = s.hidden / s.heads;
    let (q_out, kv_out) = (s.heads * head_dim, s.kv_heads * head_dim);
    std::fs::create_dir_all(dir)?;
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "intermediate_size": s.intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": null,
        "max_position_embeddings": s.max_positions,
        "attention_bias": s.attention_bias,
        "mlp_bias": false,
        "tie_word_embeddings": s.tie_word_embeddings,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).map_err(|e| Error::Other(e.to_string()))?,
    )?;
    let mut d = Draw::new(seed, s.std);
    d.put("model.embed_tokens.weight", &[vocab, s.hidden], 0.0)?;
    for i in 0..s.layers {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        d.put(&p("input_layernorm.weight"), &[s.hidden], 1.0)?;
        for (n, out, inp) in [
            ("self_attn.q_proj", q_out, s.hidden),
            ("self_attn.k_proj", kv_out, s.hidden),
            ("self_attn.v_proj", kv_out, s.hidden),
            ("self_attn.o_proj", s.hidden, q_out),
        ] {
            d.put(&p(&format!("{n}.weight")), &[out, inp], 0.0)?;
            if s.attention_bias {
                d.put(&p(&format!("{n}.bias")), &[out], 0.0)?;
            }
        }
        d.put(&p("post_attention_layernorm.weight"), &[s.hidden], 1.0)?;
        d.put(&p("mlp.gate_proj.weight"), &[s.intermediate, s.hidden], 0.0)?;
        d.put(&p("mlp.up_proj.weight"), &[s.intermediate, s.hidden], 0.0)?;
        d.put(&p("mlp.down_proj.weight"), &[s.hidden, s.intermediate], 0.0)?;
    }
    d.put("model.norm.weight", &[s.hidden], 1.0)?;
    if !s.tie_word_embeddings {
        d.put("lm_head.weight", &[vocab, s.hidden], 0.0)?;
    }
    d.save(dir)?;
    write_tiny_tokenizer(dir)
}

/// Writes a random `GPT2LMHeadModel` folder of `shape` into `dir` (`kv_heads` must equal
/// `heads`; biases always), weights from `seed`.
pub fn write_tiny_gpt2(dir: &Path, seed: u8, shape: &TinyShape) -> Result<()> {
    let s = shape;
    if s.kv_heads != s.heads {
        return Err(Error::InvalidArgument(
            "GPT-2 has as many key/value heads as query heads".into(),
        ));
    }
    let vocab = tiny_vocabulary().len();
    std::fs::create_dir_all(dir)?;
    let config = json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_embd": s.hidden,
        "n_layer": s.layers,
        "n_head": s.heads,
        "n_inner": s.intermediate,
        "n_positions": s.max_positions,
        "n_ctx": s.max_positions,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": s.tie_word_embeddings,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "scale_attn_weights": true,
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).map_err(|e| Error::Other(e.to_string()))?,
    )?;
    let mut d = Draw::new(seed, s.std);
    let h = s.hidden;
    d.put("transformer.wte.weight", &[vocab, h], 0.0)?;
    d.put("transformer.wpe.weight", &[s.max_positions, h], 0.0)?;
    for i in 0..s.layers {
        let p = |n: &str| format!("transformer.h.{i}.{n}");
        d.put(&p("ln_1.weight"), &[h], 1.0)?;
        d.put(&p("ln_1.bias"), &[h], 0.0)?;
        // Conv1D weights are [in, out].
        for (n, inp, out) in [
            ("attn.c_attn", h, 3 * h),
            ("attn.c_proj", h, h),
            ("mlp.c_fc", h, s.intermediate),
            ("mlp.c_proj", s.intermediate, h),
        ] {
            d.put(&p(&format!("{n}.weight")), &[inp, out], 0.0)?;
            d.put(&p(&format!("{n}.bias")), &[out], 0.0)?;
        }
        d.put(&p("ln_2.weight"), &[h], 1.0)?;
        d.put(&p("ln_2.bias"), &[h], 0.0)?;
    }
    d.put("transformer.ln_f.weight", &[h], 1.0)?;
    d.put("transformer.ln_f.bias", &[h], 0.0)?;
    if !s.tie_word_embeddings {
        d.put("lm_head.weight", &[vocab, h], 0.0)?;
    }
    d.save(dir)?;
    write_tiny_tokenizer(dir)
}

/// Writes a llama-architecture `weights` (tiny vocabulary) as a llama.cpp GGUF at `path`, as
/// llama.cpp's converter does: q/k rows permuted to its rotary layout, every matrix in `dtype`
/// (norms in f32), the tiny tokenizer and ChatML template in the metadata. For testing the GGUF
/// reader against the folder it came from and for the bad-file tests.
pub fn write_tiny_gguf(
    path: &Path,
    weights: &super::DecoderWeights,
    dtype: GgmlDType,
) -> Result<()> {
    let c = &weights.config;
    if c.family != super::DecoderFamily::Llama || c.vocab_size != tiny_vocabulary().len() {
        return Err(Error::InvalidArgument(
            "write_tiny_gguf takes a tiny llama model".into(),
        ));
    }
    let name = path.display().to_string();
    let err = |e| crate::candle_error(&name)(e);
    let matrix = |m: &super::Matrix, kind: GgmlDType| -> Result<QTensor> {
        let t = Tensor::from_vec(m.data.clone(), (m.rows, m.cols), &Device::Cpu).map_err(err)?;
        QTensor::quantize(&t, kind).map_err(err)
    };
    // llama.cpp's `permute`: w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2).
    let permuted = |m: &super::Matrix, n_head: usize| -> Result<QTensor> {
        let t = Tensor::from_vec(
            m.data.clone(),
            (n_head, 2, m.rows / n_head / 2, m.cols),
            &Device::Cpu,
        )
        .and_then(|t| t.transpose(1, 2))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((m.rows, m.cols)))
        .map_err(err)?;
        QTensor::quantize(&t, dtype).map_err(err)
    };
    let vector = |v: &[f32]| -> Result<QTensor> {
        let t = Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).map_err(err)?;
        QTensor::quantize(&t, GgmlDType::F32).map_err(err)
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            matrix(&weights.token_embedding, dtype)?,
        ),
        (
            "output_norm.weight".into(),
            vector(&weights.final_norm.weight)?,
        ),
    ];
    if let Some(head) = &weights.lm_head {
        tensors.push(("output.weight".into(), matrix(head, dtype)?));
    }
    for (i, b) in weights.blocks.iter().enumerate() {
        let super::Mlp::Gated { gate, up, down } = &b.mlp else {
            return Err(Error::InvalidArgument(
                "a llama block has a gated MLP".into(),
            ));
        };
        let n = |part: &str| format!("blk.{i}.{part}.weight");
        tensors.push((n("attn_norm"), vector(&b.attn_norm.weight)?));
        tensors.push((n("attn_q"), permuted(&b.q.weight, c.heads)?));
        tensors.push((n("attn_k"), permuted(&b.k.weight, c.kv_heads)?));
        tensors.push((n("attn_v"), matrix(&b.v.weight, dtype)?));
        tensors.push((n("attn_output"), matrix(&b.o.weight, dtype)?));
        tensors.push((n("ffn_norm"), vector(&b.mlp_norm.weight)?));
        tensors.push((n("ffn_gate"), matrix(&gate.weight, dtype)?));
        tensors.push((n("ffn_up"), matrix(&up.weight, dtype)?));
        tensors.push((n("ffn_down"), matrix(&down.weight, dtype)?));
    }
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let tokens = tiny_vocabulary();
    let types = Value::Array(
        (0..tokens.len())
            .map(|i| Value::I32(if i < SPECIALS.len() { 3 } else { 1 }))
            .collect(),
    );
    let u32v = |x: usize| Value::U32(x as u32);
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny".into())),
        ("llama.block_count", u32v(c.layers)),
        ("llama.context_length", u32v(c.max_positions)),
        ("llama.embedding_length", u32v(c.hidden)),
        ("llama.feed_forward_length", u32v(c.intermediate)),
        ("llama.attention.head_count", u32v(c.heads)),
        ("llama.attention.head_count_kv", u32v(c.kv_heads)),
        ("llama.rope.freq_base", Value::F32(c.rope_theta as f32)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(c.norm_eps as f32),
        ),
        ("llama.rope.dimension_count", u32v(c.head_dim)),
        ("llama.vocab_size", u32v(c.vocab_size)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("smollm".into())),
        ("tokenizer.ggml.tokens", strings(tokens)),
        ("tokenizer.ggml.token_type", types),
        (
            "tokenizer.ggml.merges",
            strings(MERGES.iter().map(|m| m.to_string()).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        (
            "tokenizer.chat_template",
            Value::String(CHATML_TEMPLATE.into()),
        ),
    ];
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    gguf_file::write(&mut file, &meta, &refs).map_err(err)?;
    std::io::Write::flush(&mut file)?;
    Ok(())
}
