//! The decoder in plain f32: the composition of [`crate::engine::decoder`] with f32 operators,
//! the linear layers as candle matrix products (CPU), the rest on row-major [`Matrix`] values.
//! It is the reference the fixed-point simulator is compared with, and is itself compared with
//! candle-transformers' independent `quantized_llama` (tests/decoder_candle.rs).
//!
//! Substituted operators (Llama family) in f32: the Scale norm x·γ, ReLU-normalise attention
//! ReLU(x_i) / (Σ_j ReLU(x_j) + ε) over the visible keys (ε =
//! `veil_core::defaults::RELU_NORMALISE_EPS`), and relu(gate) ⊙ up.

use candle_core::{Device, Tensor};
use veil_core::{ensure, Error, Result};

use crate::candle_error;
use crate::decoder::{
    DecoderActivation, DecoderConfig, DecoderNormKind, DecoderWeights, Linear, Matrix, Mlp, Norm,
};
use crate::engine::decoder::{
    self as composition, causal_visible, rotary_tables, DecoderEngine, DecoderLayer, DecoderNorm,
    LogitRows, Rows,
};
use crate::variants::AttentionNorm;

impl Rows for Matrix {
    fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
    fn columns(&self, from: usize, width: usize) -> Result<Self> {
        ensure!(
            from + width <= self.cols,
            InvalidArgument,
            "columns {from}..{} of {} columns",
            from + width,
            self.cols
        );
        let data = (0..self.rows)
            .flat_map(|r| self.row(r)[from..from + width].iter().copied())
            .collect();
        Matrix::new(self.rows, width, data)
    }
    fn rows(&self, from: usize, count: usize) -> Result<Self> {
        ensure!(
            from + count <= self.rows,
            InvalidArgument,
            "rows {from}..{} of {}",
            from + count,
            self.rows
        );
        Matrix::new(
            count,
            self.cols,
            self.data[from * self.cols..(from + count) * self.cols].to_vec(),
        )
    }
    fn transpose(&self) -> Result<Self> {
        let mut out = vec![0.0; self.data.len()];
        for i in 0..self.rows {
            for j in 0..self.cols {
                out[j * self.rows + i] = self.data[i * self.cols + j];
            }
        }
        Matrix::new(self.cols, self.rows, out)
    }
    fn stack_rows(parts: &[&Self]) -> Result<Self> {
        let cols = parts.first().map_or(0, |p| p.cols);
        ensure!(
            parts.iter().all(|p| p.cols == cols),
            InvalidArgument,
            "stacked matrices need {cols} columns"
        );
        let rows = parts.iter().map(|p| p.rows).sum();
        Matrix::new(
            rows,
            cols,
            parts.iter().flat_map(|p| p.data.iter().copied()).collect(),
        )
    }
    fn stack_columns(parts: &[&Self]) -> Result<Self> {
        let rows = parts.first().map_or(0, |p| p.rows);
        ensure!(
            parts.iter().all(|p| p.rows == rows),
            InvalidArgument,
            "matrices side by side need {rows} rows"
        );
        let cols = parts.iter().map(|p| p.cols).sum();
        let data = (0..rows)
            .flat_map(|r| parts.iter().flat_map(move |p| p.row(r).iter().copied()))
            .collect();
        Matrix::new(rows, cols, data)
    }
    fn split_rows(&self, rows: usize) -> Result<Vec<Self>> {
        ensure!(
            rows > 0 && self.rows.is_multiple_of(rows),
            InvalidArgument,
            "cannot cut {} rows into blocks of {rows}",
            self.rows
        );
        self.data
            .chunks(rows * self.cols.max(1))
            .map(|d| Matrix::new(rows, self.cols, d.to_vec()))
            .collect()
    }
    fn plus(&self, other: &Self) -> Result<Self> {
        ensure!(
            (self.rows, self.cols) == (other.rows, other.cols),
            InvalidArgument,
            "adding {}x{} and {}x{}",
            self.rows,
            self.cols,
            other.rows,
            other.cols
        );
        Matrix::new(
            self.rows,
            self.cols,
            self.data
                .iter()
                .zip(&other.data)
                .map(|(a, b)| a + b)
                .collect(),
        )
    }
}

/// A linear layer as a candle tensor Wᵀ view [in, out] (the weight copied once) and its bias.
#[derive(Clone, Debug)]
struct F32Linear {
    weight_t: Tensor,
    bias: Option<Vec<f32>>,
}

impl F32Linear {
    fn new(weight: &Matrix, bias: Option<&[f32]>, scale: f32) -> Result<Self> {
        let data: Vec<f32> = weight.data.iter().map(|&v| v * scale).collect();
        let w = Tensor::from_vec(data, (weight.rows, weight.cols), &Device::Cpu)
            .and_then(|w| w.t())
            .map_err(candle_error("decoder weight"))?;
        Ok(F32Linear {
            weight_t: w,
            bias: bias.map(|b| b.iter().map(|&v| v * scale).collect()),
        })
    }

    fn from(l: &Linear, scale: f32) -> Result<Self> {
        Self::new(&l.weight, l.bias.as_deref(), scale)
    }

    fn apply(&self, x: &Matrix) -> Result<Matrix> {
        let ctx = candle_error("decoder linear layer");
        let xt = Tensor::from_slice(&x.data, (x.rows, x.cols), &Device::Cpu).map_err(ctx)?;
        let y = xt
            .matmul(&self.weight_t)
            .and_then(|y| y.flatten_all())
            .and_then(|y| y.to_vec1::<f32>())
            .map_err(candle_error("decoder linear layer"))?;
        let out = y.len() / x.rows.max(1);
        let mut m = Matrix::new(x.rows, out, y)?;
        if let Some(b) = &self.bias {
            for row in m.data.chunks_mut(out) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        Ok(m)
    }
}

struct F32Block {
    q: F32Linear,
    k: F32Linear,
    v: F32Linear,
    o: F32Linear,
    gate: Option<F32Linear>,
    up: F32Linear,
    down: F32Linear,
}

/// A decoder's weights prepared for the f32 engine (linear layers as candle tensors; the query
/// pre-scaled by 1/√d_head like the simulator's).
pub struct F32Model<'w> {
    /// The weights it was prepared from (the embeddings and norms are read from them).
    pub weights: &'w DecoderWeights,
    blocks: Vec<F32Block>,
    lm_head: F32Linear,
}

impl<'w> F32Model<'w> {
    /// Prepares `weights`' linear layers as candle tensors.
    pub fn new(weights: &'w DecoderWeights) -> Result<Self> {
        let c = &weights.config;
        let q_scale = 1.0 / (c.head_dim as f32).sqrt();
        let blocks = weights
            .blocks
            .iter()
            .map(|b| {
                let (gate, up, down) = match &b.mlp {
                    Mlp::Gated { gate, up, down } => (Some(F32Linear::from(gate, 1.0)?), up, down),
                    Mlp::Plain { up, down } => (None, up, down),
                };
                Ok(F32Block {
                    q: F32Linear::from(&b.q, q_scale)?,
                    k: F32Linear::from(&b.k, 1.0)?,
                    v: F32Linear::from(&b.v, 1.0)?,
                    o: F32Linear::from(&b.o, 1.0)?,
                    gate,
                    up: F32Linear::from(up, 1.0)?,
                    down: F32Linear::from(down, 1.0)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(F32Model {
            weights,
            blocks,
            lm_head: F32Linear::new(weights.lm_head(), None, 1.0)?,
        })
    }

    /// The decoder's shape and family.
    pub fn config(&self) -> &DecoderConfig {
        &self.weights.config
    }

    /// A generation session: an empty KV cache on this model.
    pub fn session(&self) -> F32Decoder<'_, 'w> {
        F32Decoder {
            model: self,
            cache: (0..self.blocks.len())
                .map(|_| (Vec::new(), Vec::new()))
                .collect(),
        }
    }
}

/// The f32 engine with its KV cache.
pub struct F32Decoder<'m, 'w> {
    model: &'m F32Model<'w>,
    cache: Vec<(Vec<f32>, Vec<f32>)>,
}

impl F32Decoder<'_, '_> {
    /// Runs the next tokens against the cache; logits [1 or ids, vocab].
    pub fn step(&mut self, ids: &[u32], rows: LogitRows) -> Result<Matrix> {
        let cfg = self.model.weights.config.clone();
        composition::forward(self, &cfg, ids, rows)
    }

    /// Forgets the cache.
    pub fn reset(&mut self) {
        self.cache.iter_mut().for_each(|(k, v)| {
            k.clear();
            v.clear();
        });
    }

    fn block(&self, i: usize) -> Result<&F32Block> {
        self.model
            .blocks
            .get(i)
            .ok_or_else(|| Error::InvalidArgument(format!("no block {i}")))
    }
}

fn map(x: &Matrix, f: impl Fn(f32) -> f32) -> Matrix {
    Matrix {
        rows: x.rows,
        cols: x.cols,
        data: x.data.iter().map(|&v| f(v)).collect(),
    }
}

/// x·σ(x).
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// x·min(max(x + 3, 0), 6)/6: SiLU's substitute ([`DecoderActivation::HardSwish`]).
pub(crate) fn hard_swish(x: f32) -> f32 {
    x * (x + 3.0).clamp(0.0, 6.0) / 6.0
}

/// GELU, tanh form (GPT-2's "gelu_new").
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    let k = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + veil_core::approx::GELU_CUBIC as f32 * x * x * x)).tanh())
}

/// RMSNorm (no bias) or LayerNorm (with bias) of one row, in f32; [`DecoderNormKind::Scale`]:
/// x·γ (+ β).
fn norm_row(row: &[f32], n: &Norm, kind: DecoderNormKind, eps: f64, out: &mut Vec<f32>) {
    if kind == DecoderNormKind::Scale {
        for (i, &x) in row.iter().enumerate() {
            out.push(x * n.weight[i] + n.bias.as_ref().map_or(0.0, |b| b[i]));
        }
        return;
    }
    let len = row.len() as f32;
    let mean = match n.bias {
        Some(_) => row.iter().sum::<f32>() / len,
        None => 0.0,
    };
    let var = row.iter().map(|&x| (x - mean) * (x - mean)).sum::<f32>() / len;
    let r = 1.0 / (var + eps as f32).sqrt();
    for (i, &x) in row.iter().enumerate() {
        let y = (x - mean) * r * n.weight[i];
        out.push(y + n.bias.as_ref().map_or(0.0, |b| b[i]));
    }
}

impl DecoderEngine for F32Decoder<'_, '_> {
    type Value = Matrix;

    fn cached(&self) -> usize {
        let c = &self.model.weights.config;
        self.cache
            .first()
            .map_or(0, |(k, _)| k.len() / (c.kv_heads * c.head_dim))
    }

    fn embed(&mut self, ids: &[u32], start: usize) -> Result<Matrix> {
        let w = self.model.weights;
        let h = w.config.hidden;
        let mut data = Vec::with_capacity(ids.len() * h);
        for (r, &id) in ids.iter().enumerate() {
            ensure!(
                (id as usize) < w.config.vocab_size,
                InvalidArgument,
                "token id {id} outside the vocabulary of {}",
                w.config.vocab_size
            );
            let tok = w.token_embedding.row(id as usize);
            match &w.position_embedding {
                Some(p) => data.extend(tok.iter().zip(p.row(start + r)).map(|(a, b)| a + b)),
                None => data.extend_from_slice(tok),
            }
        }
        Matrix::new(ids.len(), h, data)
    }

    fn linear(&mut self, id: DecoderLayer, x: &Matrix) -> Result<Matrix> {
        let missing = || Error::Unsupported(format!("the decoder has no layer {id:?}"));
        let l = match id {
            DecoderLayer::Query(i) => &self.block(i)?.q,
            DecoderLayer::Key(i) => &self.block(i)?.k,
            DecoderLayer::Value(i) => &self.block(i)?.v,
            DecoderLayer::AttnOut(i) => &self.block(i)?.o,
            DecoderLayer::Gate(i) => self.block(i)?.gate.as_ref().ok_or_else(missing)?,
            DecoderLayer::Up(i) => &self.block(i)?.up,
            DecoderLayer::Down(i) => &self.block(i)?.down,
            DecoderLayer::LmHead => &self.model.lm_head,
        };
        l.apply(x)
    }

    fn norm(&mut self, id: DecoderNorm, kind: DecoderNormKind, x: &Matrix) -> Result<Matrix> {
        let w = self.model.weights;
        let missing = || Error::Unsupported(format!("the decoder has no norm {id:?}"));
        let n = match id {
            DecoderNorm::Attn(i) => &w.blocks.get(i).ok_or_else(missing)?.attn_norm,
            DecoderNorm::Mlp(i) => &w.blocks.get(i).ok_or_else(missing)?.mlp_norm,
            DecoderNorm::Final => &w.final_norm,
        };
        let mut out = Vec::with_capacity(x.data.len());
        for row in x.data.chunks(x.cols.max(1)) {
            norm_row(row, n, kind, w.config.norm_eps, &mut out);
        }
        Matrix::new(x.rows, x.cols, out)
    }

    fn rotary(&mut self, x: &Matrix, heads: usize, start: usize) -> Result<Matrix> {
        let c = &self.model.weights.config;
        let dh = c.head_dim;
        ensure!(
            x.cols == heads * dh,
            InvalidArgument,
            "rotary on {} columns, expected {heads}·{dh}",
            x.cols
        );
        let half = dh / 2;
        let (cos, sin) = rotary_tables(c, start, x.rows);
        let mut out = x.clone();
        for r in 0..x.rows {
            for hd in 0..heads {
                let base = r * x.cols + hd * dh;
                for j in 0..half {
                    let (a, b) = (x.data[base + j], x.data[base + half + j]);
                    let (co, si) = (cos[r * half + j] as f32, sin[r * half + j] as f32);
                    out.data[base + j] = a * co - b * si;
                    out.data[base + half + j] = b * co + a * si;
                }
            }
        }
        Ok(out)
    }

    fn append_cache(
        &mut self,
        block: usize,
        start: usize,
        k: &Matrix,
        v: &Matrix,
    ) -> Result<(Matrix, Matrix)> {
        let width = k.cols;
        let (ck, cv) = self
            .cache
            .get_mut(block)
            .ok_or_else(|| Error::InvalidArgument(format!("no block {block}")))?;
        ensure!(
            ck.len() == start * width && cv.len() == start * width && v.cols == width,
            InvalidArgument,
            "block {block}'s cache holds {} positions, the step starts at {start}",
            ck.len() / width.max(1)
        );
        ck.extend_from_slice(&k.data);
        cv.extend_from_slice(&v.data);
        let total = ck.len() / width;
        Ok((
            Matrix::new(total, width, ck.clone())?,
            Matrix::new(total, width, cv.clone())?,
        ))
    }

    fn products(&mut self, a: &[Matrix], b: &[Matrix]) -> Result<Vec<Matrix>> {
        crate::engine::check_operand_pairs(a.len(), b.len())?;
        a.iter()
            .zip(b)
            .map(|(a, b)| {
                ensure!(
                    a.cols == b.rows,
                    InvalidArgument,
                    "product of {}x{} and {}x{}",
                    a.rows,
                    a.cols,
                    b.rows,
                    b.cols
                );
                let mut out = vec![0.0f32; a.rows * b.cols];
                for i in 0..a.rows {
                    let o = &mut out[i * b.cols..(i + 1) * b.cols];
                    for (t, &x) in a.row(i).iter().enumerate() {
                        o.iter_mut().zip(b.row(t)).for_each(|(o, &y)| *o += x * y);
                    }
                }
                Matrix::new(a.rows, b.cols, out)
            })
            .collect()
    }

    fn causal_weights(
        &mut self,
        kind: AttentionNorm,
        scores: &Matrix,
        start: usize,
    ) -> Result<Matrix> {
        let total = scores.cols;
        ensure!(
            total > start,
            InvalidArgument,
            "scores over {total} keys for a step starting at {start}"
        );
        let new = total - start;
        let mut out = Vec::with_capacity(scores.data.len());
        for (r, row) in scores.data.chunks(total).enumerate() {
            let visible = causal_visible(start, new, r, total);
            if kind == AttentionNorm::ReluNormalise {
                let relu: Vec<f32> = row
                    .iter()
                    .zip(&visible)
                    .map(|(&x, &v)| if v { x.max(0.0) } else { 0.0 })
                    .collect();
                let s = relu.iter().sum::<f32>() + veil_core::defaults::RELU_NORMALISE_EPS as f32;
                out.extend(relu.iter().map(|&v| v / s));
                continue;
            }
            let max = row
                .iter()
                .zip(&visible)
                .filter(|(_, &v)| v)
                .map(|(&x, _)| x)
                .fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row
                .iter()
                .zip(&visible)
                .map(|(&x, &v)| if v { (x - max).exp() } else { 0.0 })
                .collect();
            let s: f32 = e.iter().sum();
            out.extend(e.iter().map(|&v| v / s));
        }
        Matrix::new(scores.rows, total, out)
    }

    fn gated(&mut self, act: DecoderActivation, gate: &Matrix, up: &Matrix) -> Result<Matrix> {
        ensure!(
            gate.data.len() == up.data.len(),
            InvalidArgument,
            "gate and up of different shapes"
        );
        Matrix::new(
            gate.rows,
            gate.cols,
            gate.data
                .iter()
                .zip(&up.data)
                .map(|(&g, &u)| match act {
                    DecoderActivation::Original => silu(g) * u,
                    DecoderActivation::Relu => g.max(0.0) * u,
                    DecoderActivation::HardSwish => hard_swish(g) * u,
                })
                .collect(),
        )
    }

    fn gelu(&mut self, x: &Matrix) -> Result<Matrix> {
        Ok(map(x, gelu_tanh))
    }
}
