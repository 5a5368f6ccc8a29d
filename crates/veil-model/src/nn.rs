//! The f32 encoder as candle modules, with every operator variant and per-block hidden states.
//!
//! Weight names mirror Hugging Face (the `VarBuilder` paths below), following
//! <https://github.com/huggingface/transformers/blob/main/src/transformers/models/bert/modeling_bert.py>,
//! `.../models/roberta/modeling_roberta.py` and `.../models/mpnet/modeling_mpnet.py`.
//! Names are those of the base model (no `bert.`/`roberta.`/`mpnet.` prefix; [`crate::folder`]
//! strips and adds it). Built from a `VarBuilder`, so the same code serves loaded weights,
//! random weights and `VarMap`-backed training (every op here is differentiable in candle).

use crate::config::{Architecture, ModelConfig};
use crate::variants::{Activation, AttentionNorm, BlockVariant, HeadKind, LayerNormKind};
use candle_core::{DType, Device, IndexOp, Module, Result, Shape, Tensor, D};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Embedding, Init, Linear, VarBuilder};
use std::sync::{Arc, Mutex};

/// Added to the scores of padded key positions. Large enough that exp underflows to 0 and
/// ReLU clips to 0, small enough to stay finite in f32.
const MASK_VALUE: f64 = -1e9;

/// A LayerNorm with its Veil variant: exact, or centring + affine.
#[derive(Clone, Debug)]
pub struct Norm {
    /// Exact LayerNorm or centring.
    pub kind: LayerNormKind,
    /// γ.
    pub weight: Tensor,
    /// β.
    pub bias: Tensor,
    /// The ε added to the variance.
    pub eps: f64,
}

impl Norm {
    fn new(kind: LayerNormKind, size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Norm {
            kind,
            weight: vb.get_with_hints(size, "weight", Init::Const(1.0))?,
            bias: vb.get_with_hints(size, "bias", Init::Const(0.0))?,
            eps,
        })
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let normed = match self.kind {
            LayerNormKind::Centring => centred,
            LayerNormKind::Exact => {
                let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
                centred.broadcast_div(&(var + self.eps)?.sqrt()?)?
            }
        };
        normed
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

/// Word + position (+ token type) embeddings and their LayerNorm (always exact).
#[derive(Clone, Debug)]
pub struct Embeddings {
    /// The token table [vocab, hidden].
    pub word: Embedding,
    /// The absolute-position table [positions, hidden].
    pub position: Embedding,
    /// The token-type table (none for MPNet).
    pub token_type: Option<Embedding>,
    /// The LayerNorm of the sum.
    pub norm: Norm,
}

impl Embeddings {
    /// The tables under `vb` (`word_embeddings`, `position_embeddings`, `token_type_embeddings`,
    /// `LayerNorm`), shaped by `cfg`.
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let h = cfg.hidden_size;
        let token_type = if cfg.type_vocab_size > 0 {
            Some(candle_nn::embedding(
                cfg.type_vocab_size,
                h,
                vb.pp("token_type_embeddings"),
            )?)
        } else {
            None
        };
        Ok(Embeddings {
            word: candle_nn::embedding(cfg.vocab_size, h, vb.pp("word_embeddings"))?,
            position: candle_nn::embedding(
                cfg.max_position_embeddings,
                h,
                vb.pp("position_embeddings"),
            )?,
            token_type,
            norm: Norm::new(
                LayerNormKind::Exact,
                h,
                cfg.layer_norm_eps,
                vb.pp("LayerNorm"),
            )?,
        })
    }

    /// Embedding output (after its LayerNorm), [batch, seq, hidden], and the attention mask:
    /// all a client holding only the public tables computes.
    pub fn embed(&self, config: &ModelConfig, batch: &Batch) -> Result<(Tensor, Tensor)> {
        let device = self.word.embeddings().device();
        let (b, s) = batch.input_ids.dims2()?;
        let types = match &batch.token_type_ids {
            Some(t) => t.clone(),
            None => Tensor::zeros((b, s), DType::U32, device)?,
        };
        let (ids_host, types_host) = (
            batch.input_ids.to_dtype(DType::U32)?.to_vec2::<u32>()?,
            types.to_dtype(DType::U32)?.to_vec2::<u32>()?,
        );
        for (ids, tys) in ids_host.iter().zip(&types_host) {
            config
                .check_input(ids, tys)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        }
        let mask = match &batch.attention_mask {
            Some(m) => m.to_dtype(DType::F32)?,
            None => Tensor::ones((b, s), DType::F32, device)?,
        };
        let positions = position_ids(config, &mask.to_vec2::<f32>()?, device)?;
        let sum = self.sum(&batch.input_ids, &positions, &types)?;
        Ok((self.norm.forward(&sum)?, mask))
    }

    /// The sum of the three lookups, before the LayerNorm.
    pub fn sum(&self, ids: &Tensor, positions: &Tensor, type_ids: &Tensor) -> Result<Tensor> {
        let mut x = self
            .word
            .forward(ids)?
            .broadcast_add(&self.position.forward(positions)?)?;
        if let Some(tt) = &self.token_type {
            x = x.broadcast_add(&tt.forward(type_ids)?)?;
        }
        Ok(x)
    }
}

/// Position ids: BERT counts from 0; RoBERTa/MPNet from pad+1 over real tokens, padding
/// positions get pad (HF `create_position_ids_from_input_ids`).
pub(crate) fn position_ids(
    config: &ModelConfig,
    mask: &[Vec<f32>],
    device: &Device,
) -> Result<Tensor> {
    Tensor::new(position_id_rows(config, mask), device)
}

/// [`position_ids`] as plain integers.
pub fn position_id_rows(config: &ModelConfig, mask: &[Vec<f32>]) -> Vec<Vec<u32>> {
    let offset = config.architecture.position_offset(config.pad_token_id) as u32;
    let pad = config.pad_token_id;
    mask.iter()
        .map(|row| {
            let mut seen = 0u32;
            row.iter()
                .enumerate()
                .map(|(j, &m)| match config.architecture {
                    Architecture::Bert => j as u32,
                    _ if m > 0.0 => {
                        seen += 1;
                        offset + seen - 1
                    }
                    _ => pad,
                })
                .collect()
        })
        .collect()
}

/// One encoder block: self-attention, LN1, FFN, LN2 (post-norm, as in BERT).
#[derive(Clone, Debug)]
pub struct Block {
    /// The block's operators.
    pub variant: BlockVariant,
    /// Attention heads.
    pub num_heads: usize,
    /// Q projection.
    pub query: Linear,
    /// K projection.
    pub key: Linear,
    /// V projection.
    pub value: Linear,
    /// The attention output projection.
    pub attn_out: Linear,
    /// The normalisation after attention.
    pub ln1: Norm,
    /// The feed-forward layer's first (widening) projection.
    pub intermediate: Linear,
    /// The feed-forward layer's second projection.
    pub output: Linear,
    /// The normalisation after the feed-forward layer.
    pub ln2: Norm,
}

impl Block {
    fn new(cfg: &ModelConfig, variant: BlockVariant, vb: VarBuilder) -> Result<Self> {
        let (h, i, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let att = vb.pp("attention");
        // BERT/RoBERTa: attention.self.{query,key,value}, attention.output.{dense,LayerNorm};
        // MPNet: attention.attn.{q,k,v,o}, attention.LayerNorm.
        let (q, k, v, o, ln1) = match cfg.architecture {
            Architecture::Bert | Architecture::Roberta => {
                let s = att.pp("self");
                (
                    candle_nn::linear(h, h, s.pp("query"))?,
                    candle_nn::linear(h, h, s.pp("key"))?,
                    candle_nn::linear(h, h, s.pp("value"))?,
                    candle_nn::linear(h, h, att.pp("output").pp("dense"))?,
                    Norm::new(variant.ln1, h, eps, att.pp("output").pp("LayerNorm"))?,
                )
            }
            Architecture::MpNet => {
                let s = att.pp("attn");
                (
                    candle_nn::linear(h, h, s.pp("q"))?,
                    candle_nn::linear(h, h, s.pp("k"))?,
                    candle_nn::linear(h, h, s.pp("v"))?,
                    candle_nn::linear(h, h, s.pp("o"))?,
                    Norm::new(variant.ln1, h, eps, att.pp("LayerNorm"))?,
                )
            }
        };
        Ok(Block {
            variant,
            num_heads: cfg.num_heads,
            query: q,
            key: k,
            value: v,
            attn_out: o,
            ln1,
            intermediate: candle_nn::linear(h, i, vb.pp("intermediate").pp("dense"))?,
            output: candle_nn::linear(i, h, vb.pp("output").pp("dense"))?,
            ln2: Norm::new(variant.ln2, h, eps, vb.pp("output").pp("LayerNorm"))?,
        })
    }

    /// `x`: [batch, seq, hidden]; `mask_bias`: [batch, 1, 1, seq] (0 or [`MASK_VALUE`]);
    /// `position_bias`: [1, heads, seq, seq] (MPNet).
    pub fn forward(
        &self,
        x: &Tensor,
        mask_bias: &Tensor,
        position_bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, s, h) = x.dims3()?;
        let nh = self.num_heads;
        let dh = h / nh;
        let heads = |t: Tensor| t.reshape((b, s, nh, dh))?.transpose(1, 2)?.contiguous();
        let q = heads(tokens_linear(&self.query, x)?)?;
        let k = heads(tokens_linear(&self.key, x)?)?;
        let v = heads(tokens_linear(&self.value, x)?)?;
        let mut scores = (q.matmul(&k.t()?)? / (dh as f64).sqrt())?;
        if let Some(pb) = position_bias {
            scores = scores.broadcast_add(pb)?;
        }
        let scores = scores.broadcast_add(mask_bias)?;
        let probs = match self.variant.attention {
            // The composed softmax, not the fused `softmax_last_dim`: that kernel has no
            // backward pass, and these modules must train.
            AttentionNorm::Softmax => candle_nn::ops::softmax(&scores, D::Minus1)?,
            AttentionNorm::ReluNormalise => {
                let r = scores.relu()?;
                let denom = (r.sum_keepdim(D::Minus1)? + veil_core::defaults::RELU_NORMALISE_EPS)?;
                r.broadcast_div(&denom)?
            }
        };
        let ctx = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, s, h))?;
        let y = self
            .ln1
            .forward(&(tokens_linear(&self.attn_out, &ctx)? + x)?)?;
        let f = tokens_linear(&self.intermediate, &y)?;
        let f = match self.variant.activation {
            Activation::Gelu => f.gelu_erf()?,
            Activation::Relu => f.relu()?,
        };
        self.ln2.forward(&(tokens_linear(&self.output, &f)? + y)?)
    }
}

/// A linear layer over [batch, seq, in] as one [batch·seq, in] matrix product: candle's
/// `Linear` on a 3-D input runs one small product per sequence, several times slower.
fn tokens_linear(l: &Linear, x: &Tensor) -> Result<Tensor> {
    let (b, s, h) = x.dims3()?;
    let y = l.forward(&x.reshape((b * s, h))?)?;
    let out = y.dim(1)?;
    y.reshape((b, s, out))
}

/// Pooling and optional classifier.
#[derive(Clone, Debug)]
pub struct Head {
    /// Pooler or mean pooling.
    pub kind: HeadKind,
    /// `Pooler` only: the dense layer before tanh.
    pub pool_dense: Option<Linear>,
    /// The classifier on the pooled vector, when the model has labels.
    pub classifier: Option<Linear>,
}

impl Head {
    fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (h, n) = (cfg.hidden_size, cfg.veil.num_labels);
        let labelled = n > 0;
        // BERT: pooler.dense + classifier. RoBERTa/MPNet classifiers: classifier.dense +
        // classifier.out_proj (HF *ClassificationHead), same computation on the first token.
        let (pool_name, cls_name) = match (cfg.architecture, labelled) {
            (Architecture::Bert, _) | (_, false) => ("pooler.dense", "classifier"),
            (Architecture::Roberta | Architecture::MpNet, true) => {
                ("classifier.dense", "classifier.out_proj")
            }
        };
        let pool_dense = match cfg.veil.head {
            HeadKind::Pooler => Some(candle_nn::linear(h, h, vb.pp(pool_name))?),
            HeadKind::MeanPool => None,
        };
        let classifier = if labelled {
            let name = match cfg.veil.head {
                HeadKind::Pooler => cls_name,
                HeadKind::MeanPool => "classifier",
            };
            Some(candle_nn::linear(h, n, vb.pp(name))?)
        } else {
            None
        };
        Ok(Head {
            kind: cfg.veil.head,
            pool_dense,
            classifier,
        })
    }

    /// `last`: [batch, seq, hidden]; `mask`: [batch, seq] f32 of 0/1. Returns (pooled, logits).
    pub fn forward(&self, last: &Tensor, mask: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let pooled = match (&self.kind, &self.pool_dense) {
            (HeadKind::Pooler, Some(dense)) => dense.forward(&last.i((.., 0))?)?.tanh()?,
            _ => {
                let m = mask.unsqueeze(D::Minus1)?;
                let summed = last.broadcast_mul(&m)?.sum(1)?;
                summed.broadcast_div(&m.sum(1)?.clamp(1.0, f64::MAX)?)?
            }
        };
        let logits = match &self.classifier {
            Some(c) => Some(c.forward(&pooled)?),
            None => None,
        };
        Ok((pooled, logits))
    }
}

/// Tokenised inputs for the forward pass. Without a mask every position is real.
#[derive(Clone, Debug)]
pub struct Batch {
    /// [batch, seq] u32.
    pub input_ids: Tensor,
    /// [batch, seq] u32; zeros when `None`.
    pub token_type_ids: Option<Tensor>,
    /// [batch, seq] with 1 for real tokens, 0 for padding (any float or integer dtype).
    pub attention_mask: Option<Tensor>,
}

impl Batch {
    /// One unpadded sequence.
    pub fn single(ids: &[u32], type_ids: &[u32], device: &Device) -> Result<Self> {
        Ok(Batch {
            input_ids: Tensor::new(ids, device)?.unsqueeze(0)?,
            token_type_ids: Some(Tensor::new(type_ids, device)?.unsqueeze(0)?),
            attention_mask: None,
        })
    }
}

/// What the forward pass returns.
#[derive(Clone, Debug)]
pub struct ForwardOutput {
    /// Embedding output, then the output of every block: `num_layers + 1` tensors
    /// [batch, seq, hidden].
    pub hidden_states: Vec<Tensor>,
    /// [batch, hidden]: tanh(pooler) or the masked mean.
    pub pooled: Tensor,
    /// [batch, num_labels] when the model has a classifier.
    pub logits: Option<Tensor>,
}

/// The whole model: embeddings, blocks, MPNet's relative-position bias, head.
#[derive(Clone, Debug)]
pub struct Transformer {
    /// The model's shape and operators.
    pub config: ModelConfig,
    /// The embedding layer.
    pub embeddings: Embeddings,
    /// The encoder blocks in order.
    pub blocks: Vec<Block>,
    /// MPNet: `encoder.relative_attention_bias`, [buckets, heads].
    pub relative_attention_bias: Option<Embedding>,
    /// The head after the last block.
    pub head: Head,
    /// Every parameter under its HF name, in construction order (for saving; with a
    /// `VarMap`-backed builder these share storage with the trained variables).
    pub named: Vec<(String, Tensor)>,
}

/// A `VarBuilder` backend that forwards to another builder and remembers what was fetched, so
/// the module code above stays the only place that knows the weight names.
struct Recording<'a> {
    inner: VarBuilder<'a>,
    seen: Arc<Mutex<Vec<(String, Tensor)>>>,
}

impl SimpleBackend for Recording<'_> {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, _: &Device) -> Result<Tensor> {
        let t = self.inner.get_with_hints_dtype(s, name, h, dtype)?;
        self.remember(name, &t);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, _: &Device) -> Result<Tensor> {
        let t = self.inner.get_unchecked_dtype(name, dtype)?;
        self.remember(name, &t);
        Ok(t)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
}

impl Recording<'_> {
    fn remember(&self, name: &str, t: &Tensor) {
        let mut seen = self.seen.lock().expect("recording lock");
        if !seen.iter().any(|(n, _)| n == name) {
            seen.push((name.to_string(), t.clone()));
        }
    }
}

impl Transformer {
    /// Builds the model from HF-named (unprefixed) weights. Missing tensors and wrong shapes
    /// fail with candle's message naming the tensor.
    pub fn new(config: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        config
            .validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recording = Recording {
            inner: vb.clone(),
            seen: seen.clone(),
        };
        let vb = VarBuilder::from_backend(Box::new(recording), vb.dtype(), vb.device().clone());
        let enc = vb.pp("encoder");
        let blocks = config
            .veil
            .blocks
            .iter()
            .enumerate()
            .map(|(i, v)| Block::new(config, *v, enc.pp("layer").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        let relative_attention_bias = match config.architecture {
            Architecture::MpNet => Some(candle_nn::embedding(
                config.relative_attention_num_buckets,
                config.num_heads,
                enc.pp("relative_attention_bias"),
            )?),
            _ => None,
        };
        let embeddings = Embeddings::new(config, vb.pp("embeddings"))?;
        let head = Head::new(config, vb)?;
        let named = std::mem::take(&mut *seen.lock().expect("recording lock"));
        Ok(Transformer {
            config: config.clone(),
            embeddings,
            blocks,
            relative_attention_bias,
            head,
            named,
        })
    }

    /// The device the weights live on (the CPU in Veil).
    pub fn device(&self) -> &Device {
        self.embeddings.word.embeddings().device()
    }

    /// Position ids of `mask`'s rows ([`position_ids`]).
    pub fn position_ids(&self, mask: &[Vec<f32>]) -> Result<Tensor> {
        position_ids(&self.config, mask, self.device())
    }

    /// MPNet's relative-position bias for a length-`seq` input: [1, heads, seq, seq].
    pub fn position_bias(&self, seq: usize) -> Result<Option<Tensor>> {
        let Some(table) = &self.relative_attention_bias else {
            return Ok(None);
        };
        let buckets: Vec<u32> = (0..seq)
            .flat_map(|q| {
                (0..seq).map(move |k| {
                    relative_position_bucket(
                        k as i64 - q as i64,
                        self.config.relative_attention_num_buckets,
                        128,
                    )
                })
            })
            .collect();
        let idx = Tensor::from_vec(buckets, (seq, seq), self.device())?;
        Ok(Some(table.forward(&idx)?.permute((2, 0, 1))?.unsqueeze(0)?))
    }

    /// Embedding output (after its LayerNorm), [batch, seq, hidden], and the attention mask.
    pub fn embed(&self, batch: &Batch) -> Result<(Tensor, Tensor)> {
        self.embeddings.embed(&self.config, batch)
    }

    /// The f32 forward pass.
    pub fn forward(&self, batch: &Batch) -> Result<ForwardOutput> {
        self.forward_detached(batch, None)
    }

    /// The forward pass with `hidden_states[k]` (0: the embedding output, k: block k−1's output)
    /// detached from the autograd graph when `detach_at = Some(k)`: training with everything
    /// below frozen then skips the backward pass through the frozen part (the word-embedding
    /// gradient alone is a 30,522 × hidden scatter per step). Values are unchanged.
    pub fn forward_detached(
        &self,
        batch: &Batch,
        detach_at: Option<usize>,
    ) -> Result<ForwardOutput> {
        let (x, mask) = self.embed(batch)?;
        let (_, s) = mask.dims2()?;
        let mask_bias = ((1.0 - &mask)? * MASK_VALUE)?.unsqueeze(1)?.unsqueeze(1)?;
        let position_bias = self.position_bias(s)?;
        let detach = |k: usize, h: Tensor| if detach_at == Some(k) { h.detach() } else { h };
        let mut hidden_states = vec![detach(0, x)];
        for (i, block) in self.blocks.iter().enumerate() {
            let next = block.forward(
                hidden_states.last().expect("non-empty"),
                &mask_bias,
                position_bias.as_ref(),
            )?;
            hidden_states.push(detach(i + 1, next));
        }
        let (pooled, logits) = self
            .head
            .forward(hidden_states.last().expect("non-empty"), &mask)?;
        Ok(ForwardOutput {
            hidden_states,
            pooled,
            logits,
        })
    }
}

impl Transformer {
    /// The f32 output of one unpadded sequence: the logits of a classifier, otherwise the pooled
    /// vector (what the private pass reveals to the client, for comparisons with it).
    pub fn output_f32(&self, ids: &[u32], type_ids: &[u32]) -> Result<Vec<f32>> {
        let out = self.forward(&Batch::single(ids, type_ids, self.device())?)?;
        out.logits.unwrap_or(out.pooled).squeeze(0)?.to_vec1()
    }
}

/// MPNet's (T5-style) bucketing of a relative position `key − query`: half the buckets for each
/// direction, exact below `max_exact`, logarithmic up to `max_distance`.
pub(crate) fn relative_position_bucket(
    relative: i64,
    num_buckets: usize,
    max_distance: i64,
) -> u32 {
    let half = (num_buckets / 2) as i64;
    let n = -relative;
    let mut ret = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    ret += if n < max_exact {
        n
    } else {
        let large = max_exact
            + ((n as f32 / max_exact as f32).ln() / (max_distance as f32 / max_exact as f32).ln()
                * (half - max_exact) as f32) as i64;
        large.min(half - 1)
    };
    ret as u32
}
