//! A Llama-family decoder as candle variables, trainable, honouring each block's
//! [`DecoderBlockVariant`]: SiLU or ReLU in the gated MLP, causal Softmax or causal
//! ReLU-normalise (ReLU(x_i) / (Σ_visible ReLU(x_j) + ε), masked keys 0,
//! ε = [`veil_core::defaults::RELU_NORMALISE_EPS`]), RMSNorm or Scale (x·γ) before attention and
//! MLP. Rotary embeddings as `decode_f32` (Hugging Face half-split order, the model's inverse
//! frequencies), grouped-query attention, tied or separate LM head.
//!
//! Parameters carry Hugging Face names without the `model.` prefix (`layers.3.mlp.up_proj.weight`).
//! Only the parameters marked trainable ([`TrainableDecoder::set_trainable`]) enter a forward
//! pass as variables; the others are detached, so backward computes no gradient for them (it
//! still flows through them to the trainable ones below).

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{DType, Device, Tensor, Var, D};
use veil_core::{ensure, Error, Result};
use veil_model::decoder::{
    DecoderActivation, DecoderBlockVariant, DecoderConfig, DecoderFamily, DecoderNormKind,
    DecoderWeights, Linear, Matrix, Mlp,
};
use veil_model::{candle_error, AttentionNorm};

type CResult<T> = candle_core::Result<T>;

/// Keys and values of every block so far, for incremental (generation) forwards.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The decoder as candle variables.
pub struct TrainableDecoder {
    config: DecoderConfig,
    variants: Vec<DecoderBlockVariant>,
    params: Vec<(String, Var)>,
    index: HashMap<String, usize>,
    trainable: Vec<bool>,
    inv_freq: Vec<f64>,
}

fn matrix_tensor(m: &Matrix) -> CResult<Tensor> {
    Tensor::from_slice(&m.data, (m.rows, m.cols), &Device::Cpu)
}

fn vector_tensor(v: &[f32]) -> CResult<Tensor> {
    Tensor::from_slice(v, v.len(), &Device::Cpu)
}

impl TrainableDecoder {
    /// Variables holding `weights` (Llama family only), with `weights.config`'s variants.
    pub fn from_weights(weights: &DecoderWeights) -> Result<Self> {
        let c = &weights.config;
        ensure!(
            c.family == DecoderFamily::Llama,
            Unsupported,
            "the trainable decoder is implemented for the Llama family only"
        );
        let mut named: Vec<(String, Tensor)> = Vec::new();
        let ce = candle_error("building the trainable decoder");
        (|| -> CResult<()> {
            named.push((
                "embed_tokens.weight".into(),
                matrix_tensor(&weights.token_embedding)?,
            ));
            let linear = |named: &mut Vec<(String, Tensor)>, p: String, l: &Linear| {
                named.push((format!("{p}.weight"), matrix_tensor(&l.weight)?));
                if let Some(b) = &l.bias {
                    named.push((format!("{p}.bias"), vector_tensor(b)?));
                }
                Ok::<_, candle_core::Error>(())
            };
            for (i, b) in weights.blocks.iter().enumerate() {
                let p = |s: &str| format!("layers.{i}.{s}");
                named.push((
                    p("input_layernorm.weight"),
                    vector_tensor(&b.attn_norm.weight)?,
                ));
                linear(&mut named, p("self_attn.q_proj"), &b.q)?;
                linear(&mut named, p("self_attn.k_proj"), &b.k)?;
                linear(&mut named, p("self_attn.v_proj"), &b.v)?;
                linear(&mut named, p("self_attn.o_proj"), &b.o)?;
                named.push((
                    p("post_attention_layernorm.weight"),
                    vector_tensor(&b.mlp_norm.weight)?,
                ));
                let Mlp::Gated { gate, up, down } = &b.mlp else {
                    return Err(candle_core::Error::Msg(
                        "a Llama block without a gated MLP".into(),
                    ));
                };
                linear(&mut named, p("mlp.gate_proj"), gate)?;
                linear(&mut named, p("mlp.up_proj"), up)?;
                linear(&mut named, p("mlp.down_proj"), down)?;
            }
            named.push((
                "norm.weight".into(),
                vector_tensor(&weights.final_norm.weight)?,
            ));
            if let Some(head) = &weights.lm_head {
                named.push(("lm_head.weight".into(), matrix_tensor(head)?));
            }
            Ok(())
        })()
        .map_err(ce)?;
        let mut params = Vec::with_capacity(named.len());
        let mut index = HashMap::new();
        for (name, t) in named {
            let var =
                Var::from_tensor(&t).map_err(candle_error("building the trainable decoder"))?;
            index.insert(name.clone(), params.len());
            params.push((name, var));
        }
        let variants = (0..c.layers).map(|i| c.variant(i)).collect();
        let mut config = c.clone();
        config.variants.clear();
        Ok(TrainableDecoder {
            trainable: vec![false; params.len()],
            inv_freq: veil_model::decoder::RopeScaling::inv_freqs(
                c.rope_scaling.as_ref(),
                c.rope_theta,
                c.head_dim,
            ),
            config,
            variants,
            params,
            index,
        })
    }

    /// The shape (its `variants` left empty: see [`Self::variants`]).
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Blocks.
    pub fn num_blocks(&self) -> usize {
        self.config.layers
    }

    /// The operators of every block.
    pub fn variants(&self) -> &[DecoderBlockVariant] {
        &self.variants
    }

    /// Sets the operators of block `i`.
    pub fn set_variant(&mut self, i: usize, variant: DecoderBlockVariant) -> Result<()> {
        ensure!(
            i < self.variants.len(),
            InvalidArgument,
            "block {i} of {}",
            self.variants.len()
        );
        self.variants[i] = variant;
        Ok(())
    }

    /// Every parameter, named.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The parameter `name`.
    pub fn param(&self, name: &str) -> Result<&Var> {
        self.index
            .get(name)
            .map(|&i| &self.params[i].1)
            .ok_or_else(|| Error::InvalidArgument(format!("the decoder has no parameter {name:?}")))
    }

    /// Whether parameter `name` belongs to one of `blocks`.
    pub fn in_blocks(name: &str, blocks: &Range<usize>) -> bool {
        name.strip_prefix("layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| blocks.contains(&i))
    }

    /// Makes exactly the parameters of `blocks` trainable; returns them.
    pub fn set_trainable(&mut self, blocks: Range<usize>) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        for (k, (name, var)) in self.params.iter().enumerate() {
            self.trainable[k] = Self::in_blocks(name, &blocks);
            if self.trainable[k] {
                out.push((name.clone(), var.clone()));
            }
        }
        out
    }

    fn t(&self, name: &str) -> CResult<Tensor> {
        let k = *self
            .index
            .get(name)
            .ok_or_else(|| candle_core::Error::Msg(format!("no parameter {name}")))?;
        let t = self.params[k].1.as_tensor();
        Ok(if self.trainable[k] {
            t.clone()
        } else {
            t.detach()
        })
    }

    fn linear(&self, x: &Tensor, prefix: &str) -> CResult<Tensor> {
        let w = self.t(&format!("{prefix}.weight"))?;
        let (b, t, i) = x.dims3()?;
        let y = x.reshape((b * t, i))?.matmul(&w.t()?)?;
        let y = match self.index.contains_key(&format!("{prefix}.bias")) {
            true => y.broadcast_add(&self.t(&format!("{prefix}.bias"))?)?,
            false => y,
        };
        y.reshape((b, t, w.dim(0)?))
    }

    fn norm(&self, x: &Tensor, name: &str, kind: DecoderNormKind) -> CResult<Tensor> {
        let g = self.t(name)?;
        match kind {
            DecoderNormKind::Original => {
                let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
                let inv = (ms + self.config.norm_eps)?.sqrt()?.recip()?;
                x.broadcast_mul(&inv)?.broadcast_mul(&g)
            }
            DecoderNormKind::Scale => x.broadcast_mul(&g),
        }
    }

    /// cos and sin `[rows, head_dim/2]` for positions `start ..`.
    fn rotary(&self, start: usize, rows: usize) -> CResult<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(rows * half);
        let mut sin = Vec::with_capacity(rows * half);
        for p in start..start + rows {
            for &f in &self.inv_freq {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok((
            Tensor::from_vec(cos, (rows, half), &Device::Cpu)?,
            Tensor::from_vec(sin, (rows, half), &Device::Cpu)?,
        ))
    }

    /// x `[B, heads, T, head_dim]`, rotate-half order.
    fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> CResult<Tensor> {
        let half = x.dim(D::Minus1)? / 2;
        let a = x.narrow(D::Minus1, 0, half)?;
        let b = x.narrow(D::Minus1, half, half)?;
        let first = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
        let second = (b.broadcast_mul(cos)? + a.broadcast_mul(sin)?)?;
        Tensor::cat(&[first, second], D::Minus1)
    }

    fn attention(
        &self,
        i: usize,
        x: &Tensor,
        start: usize,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> CResult<Tensor> {
        let c = &self.config;
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, dh) = (c.heads, c.kv_heads, c.head_dim);
        let p = |s: &str| format!("layers.{i}.self_attn.{s}");
        let heads = |y: Tensor, n: usize| y.reshape((b, t, n, dh))?.transpose(1, 2)?.contiguous();
        let q = heads(self.linear(x, &p("q_proj"))?, nh)?;
        let k = heads(self.linear(x, &p("k_proj"))?, nkv)?;
        let v = heads(self.linear(x, &p("v_proj"))?, nkv)?;
        let (cos, sin) = self.rotary(start, t)?;
        let q = Self::rope(&q, &cos, &sin)?;
        let mut k = Self::rope(&k, &cos, &sin)?;
        let mut v = v;
        if let Some(slot) = cache {
            if let Some((ck, cv)) = slot.as_ref() {
                k = Tensor::cat(&[ck, &k], 2)?;
                v = Tensor::cat(&[cv, &v], 2)?;
            }
            *slot = Some((k.clone(), v.clone()));
        }
        let tk = k.dim(2)?;
        let g = nh / nkv;
        let expand = |y: Tensor| -> CResult<Tensor> {
            if g == 1 {
                return Ok(y);
            }
            y.unsqueeze(2)?
                .expand((b, nkv, g, tk, dh))?
                .reshape((b, nh, tk, dh))
        };
        let (k, v) = (expand(k)?, expand(v)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (dh as f64).sqrt()))?;
        // Query row r sits at position (tk - t) + r and sees keys 0 ..= that position.
        let offset = tk - t;
        let visible: Vec<f32> = (0..t)
            .flat_map(|r| (0..tk).map(move |j| (j <= offset + r) as u8 as f32))
            .collect();
        let visible = Tensor::from_vec(visible, (t, tk), &Device::Cpu)?;
        let weights = match self.variants[i].attention {
            AttentionNorm::Softmax => {
                let masked = (visible.affine(1e9, -1e9)?).broadcast_add(&scores)?;
                let max = masked.max_keepdim(D::Minus1)?.detach();
                let e = masked.broadcast_sub(&max)?.exp()?;
                e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?
            }
            AttentionNorm::ReluNormalise => {
                let r = scores.relu()?.broadcast_mul(&visible)?;
                let s = (r.sum_keepdim(D::Minus1)? + veil_core::defaults::RELU_NORMALISE_EPS)?;
                r.broadcast_div(&s)?
            }
        };
        let out = weights
            .matmul(&v.contiguous()?)?
            .transpose(1, 2)?
            .reshape((b, t, nh * dh))?;
        self.linear(&out, &p("o_proj"))
    }

    fn mlp(&self, i: usize, x: &Tensor) -> CResult<Tensor> {
        let p = |s: &str| format!("layers.{i}.mlp.{s}");
        let gate = self.linear(x, &p("gate_proj"))?;
        let act = match self.variants[i].activation {
            DecoderActivation::Original => gate.silu()?,
            DecoderActivation::Relu => gate.relu()?,
            DecoderActivation::HardSwish => (&gate * ((&gate + 3.0)?.clamp(0f32, 6f32)? / 6.0)?)?,
        };
        let up = self.linear(x, &p("up_proj"))?;
        self.linear(&(act * up)?, &p("down_proj"))
    }

    fn block(
        &self,
        i: usize,
        x: &Tensor,
        start: usize,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> CResult<Tensor> {
        let v = self.variants[i];
        let n1 = self.norm(
            x,
            &format!("layers.{i}.input_layernorm.weight"),
            v.attn_norm,
        )?;
        let h = (x + self.attention(i, &n1, start, cache)?)?;
        let n2 = self.norm(
            &h,
            &format!("layers.{i}.post_attention_layernorm.weight"),
            v.mlp_norm,
        )?;
        h + self.mlp(i, &n2)?
    }

    /// Token embeddings of `ids` `[B, T]` (u32): `[B, T, hidden]`.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        (|| {
            let (b, t) = ids.dims2()?;
            let e = self.t("embed_tokens.weight")?;
            e.index_select(&ids.flatten_all()?, 0)?
                .reshape((b, t, self.config.hidden))
        })()
        .map_err(candle_error("decoder embedding"))
    }

    /// Runs `blocks` on `x` `[B, T, hidden]` whose first row is at position `start`; `each`
    /// sees every block's output.
    pub fn run_blocks(
        &self,
        mut x: Tensor,
        blocks: Range<usize>,
        start: usize,
        mut cache: Option<&mut KvCache>,
        mut each: impl FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        ensure!(
            blocks.end <= self.num_blocks(),
            InvalidArgument,
            "blocks {blocks:?} of {}",
            self.num_blocks()
        );
        let t = x.dim(1).map_err(candle_error("decoder forward"))?;
        if let Some(c) = cache.as_deref_mut() {
            c.layers.resize(self.num_blocks(), None);
        }
        for i in blocks {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            x = self
                .block(i, &x, start, slot)
                .map_err(candle_error("decoder block"))?;
            each(i, &x)?;
        }
        if let Some(c) = cache {
            c.len = start + t;
        }
        Ok(x)
    }

    /// The final norm and the LM head: logits `[B, T, vocab]`.
    pub fn head(&self, x: &Tensor) -> Result<Tensor> {
        (|| {
            let h = self.norm(x, "norm.weight", DecoderNormKind::Original)?;
            let w = if self.index.contains_key("lm_head.weight") {
                self.t("lm_head.weight")?
            } else {
                self.t("embed_tokens.weight")?
            };
            let (b, t, hd) = h.dims3()?;
            h.reshape((b * t, hd))?
                .matmul(&w.t()?)?
                .reshape((b, t, w.dim(0)?))
        })()
        .map_err(candle_error("decoder head"))
    }

    /// Logits `[B, T, vocab]` of the token rows `ids` (all of one length), from position 0.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.embed(ids)?;
        let x = self.run_blocks(x, 0..self.num_blocks(), 0, None, |_, _| Ok(()))?;
        self.head(&x)
    }

    /// The next tokens of one sequence against `cache`: logits of the last new position,
    /// `[vocab]`.
    pub fn step(&self, ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        ensure!(!ids.is_empty(), InvalidArgument, "no tokens to run");
        let start = cache.len();
        ensure!(
            start + ids.len() <= self.config.max_positions,
            InvalidArgument,
            "{} positions exceed the model's {}",
            start + ids.len(),
            self.config.max_positions
        );
        let ids = ids_tensor(&[ids.to_vec()])?;
        let x = self.embed(&ids)?;
        let x = self.run_blocks(x, 0..self.num_blocks(), start, Some(cache), |_, _| Ok(()))?;
        let t = x.dim(1).map_err(candle_error("decoder forward"))?;
        let last = x
            .narrow(1, t - 1, 1)
            .map_err(candle_error("decoder forward"))?;
        self.head(&last)?
            .flatten_all()
            .and_then(|l| l.to_vec1::<f32>())
            .map_err(candle_error("decoder logits"))
    }

    /// Current values of the parameters `names` selects (copies).
    pub fn values(&self, select: impl Fn(&str) -> bool) -> Result<Vec<(String, Tensor)>> {
        self.params
            .iter()
            .filter(|(n, _)| select(n))
            .map(|(n, v)| {
                v.as_tensor()
                    .copy()
                    .map(|t| (n.clone(), t))
                    .map_err(candle_error("copying parameters"))
            })
            .collect()
    }

    /// Sets named parameters (shapes must match).
    pub fn set_values<'a>(
        &self,
        values: impl IntoIterator<Item = (&'a String, &'a Tensor)>,
    ) -> Result<()> {
        for (name, t) in values {
            let var = self.param(name)?;
            ensure!(
                var.dims() == t.dims(),
                Malformed,
                "parameter {name:?} has shape {:?}, given {:?}",
                var.dims(),
                t.dims()
            );
            var.set(
                &t.to_dtype(DType::F32)
                    .map_err(candle_error("setting parameters"))?,
            )
            .map_err(candle_error("setting parameters"))?;
        }
        Ok(())
    }
}

/// Token rows (all of one length) as a `[B, T]` u32 tensor.
pub fn ids_tensor(rows: &[Vec<u32>]) -> Result<Tensor> {
    let t = rows.first().map_or(0, Vec::len);
    ensure!(
        t > 0 && rows.iter().all(|r| r.len() == t),
        InvalidArgument,
        "token rows must be non-empty and of one length"
    );
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (rows.len(), t), &Device::Cpu).map_err(candle_error("token ids"))
}
