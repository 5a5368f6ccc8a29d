//! Fixed-point simulator: the private forward pass computed in one process, in Z_{2^ℓ}, with
//! exactly the integers the two-party protocol produces (with faithful truncation).
//!
//! Encoding ([`FixedModel::encode`], shared with the private forward pass so both use the same
//! integers):
//! * weights at f fractional bits, biases at 2f; every linear layer is y = ⌊(W·x + b) / 2^f⌋
//!   with W·x exact mod 2^ℓ (the HE product) and ⌊·⌋ the arithmetic shift
//!   ([`veil_core::approx::Approx::trunc`]);
//! * the attention scale 1/√d_head is folded into the query weights and bias before encoding,
//!   so scores are ⌊Q·Kᵀ / 2^f⌋ with no extra multiplication; MPNet's relative-position bias is
//!   encoded at f bits and added to the scores;
//! * secret × secret products (Q·Kᵀ, P·V) are exact mod 2^ℓ, then truncated by f;
//! * every non-linearity is the one of [`veil_core::approx`] (GELU, Softmax with mask,
//!   ReLU-normalise, LayerNorm, centring + affine, tanh, mean); GELU's sign comparisons on the
//!   model's proved bound ([`FixedModel::activation_bits`]), the two-party pass's value inside
//!   it; an input beyond it (possible only after a LayerNorm's input left its domain), where
//!   the private output is unspecified, is counted as a domain violation.
//!
//! Embeddings: in [`EmbeddingMode::Public`] the f32 embedding output (after its LayerNorm) is
//! encoded; in `Private` the encoded table rows are summed in the ring (a one-hot selection is
//! exact) and the LayerNorm runs in fixed point.
//!
//! Overflow: every product accumulator is kept in 64-bit wrapping arithmetic, which equals the
//! true integer while it is below 2^63, and is checked against the ring bound 2^(ℓ−1) before
//! reduction; a larger value would wrap in Z_{2^ℓ}. Inputs of GELU and LayerNorm are checked
//! against the domains `approx` states accuracy for. Each block reports its maxima
//! ([`BlockReport`]), and every violation becomes a warning (returned and printed to stderr).

use crate::candle_error;
use crate::config::ModelConfig;
use crate::engine::{self, Engine, LayerId, NormId};
use crate::nn::{Batch, Block, Embeddings, Head, Norm, Transformer};
use crate::normed_bound;
use crate::variants::{Activation, AttentionNorm, EmbeddingMode, HeadKind, LayerNormKind};
use candle_core::{Device, Module, Tensor};
use candle_nn::Linear;
use veil_core::approx::Approx;
use veil_core::{ensure, CostClass, Error, FixedPoint, Result, RingTensor};

/// A linear layer in fixed point: `weight` [out, in] (HF layout, y = W·x + b) at f bits,
/// `bias` [out] at 2f bits.
#[derive(Clone, Debug)]
pub struct FixedLinear {
    /// W [out, in] at f bits.
    pub weight: RingTensor,
    /// b [out] at 2f bits, the scale of W·x before its truncation.
    pub bias: RingTensor,
}

impl FixedLinear {
    /// Encodes an HF linear layer (weight [out, in]) scaled by `scale`.
    fn encode(fp: FixedPoint, linear: &Linear, scale: f64) -> Result<Self> {
        let w = to_vec2(linear.weight())?;
        let (out_dim, in_dim) = (w.len(), w.first().map_or(0, Vec::len));
        let scaled: Vec<f64> = w.concat().iter().map(|&v| v as f64 * scale).collect();
        let bias = match linear.bias() {
            Some(b) => to_vec1(b)?,
            None => vec![0.0; out_dim],
        };
        let bias_raw = bias
            .iter()
            .map(|&b| fp.encode_at(b as f64 * scale, 2 * fp.frac_bits()))
            .collect();
        Ok(FixedLinear {
            weight: RingTensor::encode(fp, &[out_dim, in_dim], &scaled)?,
            bias: RingTensor::from_vec(fp.ring, &[out_dim], bias_raw)?,
        })
    }

    /// The input width.
    pub fn in_dim(&self) -> usize {
        self.weight.shape()[1]
    }

    /// The output width.
    pub fn out_dim(&self) -> usize {
        self.weight.shape()[0]
    }
}

/// γ and β of a LayerNorm at f bits, with its variant.
#[derive(Clone, Debug)]
pub struct FixedNorm {
    /// Exact LayerNorm or centring.
    pub kind: LayerNormKind,
    /// γ at f bits.
    pub gamma: Vec<u64>,
    /// β at f bits.
    pub beta: Vec<u64>,
    /// The ε added to the variance (public, part of the plan).
    pub eps: f64,
}

impl FixedNorm {
    fn encode(fp: FixedPoint, norm: &Norm) -> Result<Self> {
        let enc = |t: &Tensor| -> Result<Vec<u64>> {
            Ok(to_vec1(t)?.iter().map(|&v| fp.encode(v as f64)).collect())
        };
        Ok(FixedNorm {
            kind: norm.kind,
            gamma: enc(&norm.weight)?,
            beta: enc(&norm.bias)?,
            eps: norm.eps,
        })
    }
}

/// One encoder block in fixed point (query weights pre-scaled by 1/√d_head).
#[derive(Clone, Debug)]
pub struct FixedBlock {
    /// The block's operators.
    pub variant: crate::variants::BlockVariant,
    /// Attention heads.
    pub num_heads: usize,
    /// Q projection, pre-scaled by 1/√d_head.
    pub query: FixedLinear,
    /// K projection.
    pub key: FixedLinear,
    /// V projection.
    pub value: FixedLinear,
    /// The attention output projection.
    pub attn_out: FixedLinear,
    /// The normalisation after attention.
    pub ln1: FixedNorm,
    /// The feed-forward layer's first (widening) projection.
    pub intermediate: FixedLinear,
    /// The feed-forward layer's second projection.
    pub output: FixedLinear,
    /// The normalisation after the feed-forward layer.
    pub ln2: FixedNorm,
}

impl FixedBlock {
    fn encode(fp: FixedPoint, b: &Block) -> Result<Self> {
        let dh = b.query.weight().dims()[0] / b.num_heads;
        Ok(FixedBlock {
            variant: b.variant,
            num_heads: b.num_heads,
            query: FixedLinear::encode(fp, &b.query, 1.0 / (dh as f64).sqrt())?,
            key: FixedLinear::encode(fp, &b.key, 1.0)?,
            value: FixedLinear::encode(fp, &b.value, 1.0)?,
            attn_out: FixedLinear::encode(fp, &b.attn_out, 1.0)?,
            ln1: FixedNorm::encode(fp, &b.ln1)?,
            intermediate: FixedLinear::encode(fp, &b.intermediate, 1.0)?,
            output: FixedLinear::encode(fp, &b.output, 1.0)?,
            ln2: FixedNorm::encode(fp, &b.ln2)?,
        })
    }
}

/// The head in fixed point.
#[derive(Clone, Debug)]
pub struct FixedHead {
    /// Pooler or mean pooling.
    pub kind: HeadKind,
    /// The pooler's dense layer (before tanh), for [`HeadKind::Pooler`].
    pub pool_dense: Option<FixedLinear>,
    /// The classifier on the pooled vector, when the model has labels.
    pub classifier: Option<FixedLinear>,
}

impl FixedHead {
    fn encode(fp: FixedPoint, h: &Head) -> Result<Self> {
        let enc = |l: &Option<Linear>| -> Result<Option<FixedLinear>> {
            l.as_ref()
                .map(|l| FixedLinear::encode(fp, l, 1.0))
                .transpose()
        };
        Ok(FixedHead {
            kind: h.kind,
            pool_dense: enc(&h.pool_dense)?,
            classifier: enc(&h.classifier)?,
        })
    }
}

/// The encoded model: what the server holds in the private forward pass.
#[derive(Clone, Debug)]
pub struct FixedModel {
    /// The format and the fixed-point algorithms every operator uses.
    pub approx: Approx,
    /// The f32 embedding tables of the model it was encoded from (sharing their tensors):
    /// public embeddings are computed from them, private ones read them. Nothing else of the
    /// f32 model is kept, so its layers' weights are freed with it.
    pub embeddings: Embeddings,
    /// The model's shape and operators.
    pub config: ModelConfig,
    /// The encoder blocks in order.
    pub blocks: Vec<FixedBlock>,
    /// MPNet: per-head relative-position bias table [buckets][heads] at f bits.
    pub relative_attention_bias: Option<Vec<Vec<u64>>>,
    /// Embedding LayerNorm (used in fixed point only in private-embedding mode).
    pub embedding_norm: FixedNorm,
    /// The head after the last block.
    pub head: FixedHead,
    /// k with every GELU input below 2^k, proved from the weights ([`FixedModel::activation_bits`]).
    activation_bits: Option<u32>,
}

/// Per-block overflow and domain statistics (real units).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockReport {
    /// The block's index (0: the embedding).
    pub block: usize,
    /// Largest |value| of the block's output hidden state.
    pub max_abs_hidden: f64,
    /// Largest |accumulator| of any product in the block before truncation (2f bits).
    pub max_abs_accumulator: f64,
    /// The accumulators' wrap bound 2^(ℓ−1−2f) (16384 at (41, 13)).
    pub accumulator_bound: f64,
    /// Accumulators that exceeded the bound (each wrapped mod 2^ℓ).
    pub wrapped: usize,
    /// Largest |x − mean(x)| entering an exact LayerNorm (its square must fit the ring).
    pub max_abs_norm_deviation: f64,
    /// GELU / LayerNorm / ReLU inputs outside the domains `approx` is accurate on
    /// ([`gelu_domain`], [`layer_norm_domain`], [`relu_domain`]).
    pub out_of_domain: usize,
}

/// |x| up to which `approx::gelu` is accurate (`approx::GELU_DOMAIN`).
pub(crate) fn gelu_domain(_fp: FixedPoint) -> f64 {
    veil_core::approx::GELU_DOMAIN
}

/// |x − mean| up to which `approx::layer_norm_row` is accurate (2^`approx::LAYER_NORM_DEV_BITS`).
/// The ReLU-normalise row sums Σ ReLU(x) + ε the reciprocal is exact on: below 2^(norm_bits − f)
/// (2048 at ℓ = 41, f = 13); the protocol equals `approx` only inside it.
pub(crate) fn relu_normalise_domain(fp: FixedPoint) -> f64 {
    let bits = veil_core::approx::Approx::new(fp).map_or(0, |a| a.norm_bits());
    2f64.powi(bits as i32 - fp.frac_bits() as i32)
}

/// |x| below which the private ReLU (of the FFN and of ReLU-normalise) is exact
/// (2^`approx::RELU_DOMAIN_BITS`).
pub(crate) fn relu_domain(_fp: FixedPoint) -> f64 {
    (1u64 << veil_core::approx::RELU_DOMAIN_BITS) as f64
}

/// |x − mean| below which the private LayerNorm is within its error bound
/// (2^`approx::LAYER_NORM_DEV_BITS`).
pub(crate) fn layer_norm_domain(_fp: FixedPoint) -> f64 {
    (1u64 << veil_core::approx::LAYER_NORM_DEV_BITS) as f64
}

/// Simulator output: ring values and their reports.
#[derive(Clone, Debug)]
pub struct SimOutput {
    /// Embedding output then each block's output, [seq, hidden] at f bits.
    pub hidden_states: Vec<RingTensor>,
    /// [hidden].
    pub pooled: RingTensor,
    /// [num_labels] when the model has a classifier.
    pub logits: Option<RingTensor>,
    /// One per block; entry 0 is the embedding (its LayerNorm in private mode).
    pub reports: Vec<BlockReport>,
    /// Accumulators that wrapped and inputs outside the approximations' domains, a line per block.
    pub warnings: Vec<String>,
}

impl SimOutput {
    /// The logits decoded to reals, when the model has a classifier.
    pub fn logits_f64(&self, fp: FixedPoint) -> Option<Vec<f64>> {
        self.logits.as_ref().map(|l| l.decode(fp))
    }
}

/// The encoder input in public-embedding mode: the f32 embedding output (after its LayerNorm)
/// of one unpadded sequence, encoded at `fp`. All the client computes, from public tables only.
pub(crate) fn public_embedding(
    config: &ModelConfig,
    tables: &Embeddings,
    ids: &[u32],
    type_ids: &[u32],
    fp: FixedPoint,
) -> Result<RingTensor> {
    let batch = Batch::single(ids, type_ids, &Device::Cpu).map_err(candle_error("batch"))?;
    let (x, _) = tables
        .embed(config, &batch)
        .map_err(candle_error("embedding"))?;
    let v: Vec<f64> = to_vec2(&x.squeeze(0).map_err(candle_error("embedding"))?)?
        .concat()
        .iter()
        .map(|&v| v as f64)
        .collect();
    RingTensor::encode(fp, &[ids.len(), config.hidden_size], &v)
}

/// Collects the statistics of one block while it runs.
pub(crate) struct Tracker {
    bound: i64,
    scale2: f64,
    pub(crate) report: BlockReport,
}

impl Tracker {
    pub(crate) fn new(fp: FixedPoint, block: usize) -> Self {
        let bound = 1i64 << (fp.ring.bits() - 1);
        let scale2 = (2f64).powi(2 * fp.frac_bits() as i32);
        Tracker {
            bound,
            scale2,
            report: BlockReport {
                block,
                max_abs_hidden: 0.0,
                max_abs_accumulator: 0.0,
                accumulator_bound: bound as f64 / scale2,
                wrapped: 0,
                max_abs_norm_deviation: 0.0,
                out_of_domain: 0,
            },
        }
    }

    /// Records one exact product accumulator (2f fractional bits) before its reduction.
    pub(crate) fn accumulator(&mut self, acc: i64) {
        let a = acc.unsigned_abs();
        if a >= self.bound as u64 {
            self.report.wrapped += 1;
        }
        let real = a as f64 / self.scale2;
        if real > self.report.max_abs_accumulator {
            self.report.max_abs_accumulator = real;
        }
    }
}

impl FixedModel {
    /// Encodes an f32 model at the fixed-point format `fp`.
    pub fn encode(model: &Transformer, fp: FixedPoint) -> Result<Self> {
        let approx = Approx::new(fp)?;
        let hidden = model.config.hidden_size;
        ensure!(
            hidden <= approx.layer_norm_max_row(),
            InvalidArgument,
            "hidden size {hidden} exceeds the {} values a LayerNorm row may have at ℓ = {}",
            approx.layer_norm_max_row(),
            fp.ring.bits()
        );
        let blocks = model
            .blocks
            .iter()
            .map(|b| FixedBlock::encode(fp, b))
            .collect::<Result<Vec<_>>>()?;
        let relative_attention_bias = match &model.relative_attention_bias {
            Some(e) => Some(
                to_vec2(e.embeddings())?
                    .iter()
                    .map(|row| row.iter().map(|&v| fp.encode(v as f64)).collect())
                    .collect(),
            ),
            None => None,
        };
        let activation_bits =
            normed_bound::encoder_activation_bits(&approx, &model.config, &blocks);
        Ok(FixedModel {
            approx,
            embeddings: model.embeddings.clone(),
            config: model.config.clone(),
            blocks,
            relative_attention_bias,
            embedding_norm: FixedNorm::encode(fp, &model.embeddings.norm)?,
            head: FixedHead::encode(fp, &model.head)?,
            activation_bits,
        })
    }

    /// k with |input| < 2^k for every GELU this model computes on rows in its LayerNorms'
    /// domain, proved from its weights (`crate::normed_bound`); None when it runs no GELU or
    /// none narrower than the ring. Both parties' GELUs compare on k bits
    /// (`Approx::gelu_within`), so a server announces it to its clients.
    pub fn activation_bits(&self) -> Option<u32> {
        self.activation_bits
    }

    /// Widens the GELU bound to at least `bits`, for benchmarks on random weights.
    pub fn widen_activation_bound(&mut self, bits: u32) {
        self.activation_bits = normed_bound::widened(self.activation_bits, bits, self.fp().ring);
    }

    /// The fixed-point format the weights are encoded at.
    pub fn fp(&self) -> FixedPoint {
        self.approx.fp
    }

    /// The encoder input [seq, hidden] for one unpadded sequence, with the embedding report.
    pub fn embed(&self, ids: &[u32], type_ids: &[u32]) -> Result<(RingTensor, BlockReport)> {
        let fp = self.fp();
        let h = self.config.hidden_size;
        let batch = Batch::single(ids, type_ids, &Device::Cpu).map_err(candle_error("batch"))?;
        let mut tracker = Tracker::new(fp, 0);
        let x = match self.config.veil.embedding {
            EmbeddingMode::Public => {
                public_embedding(&self.config, &self.embeddings, ids, type_ids, fp)?
            }
            EmbeddingMode::Private => {
                let e = &self.embeddings;
                let mask = vec![vec![1.0f32; ids.len()]];
                let positions = crate::nn::position_ids(&self.config, &mask, &Device::Cpu)
                    .map_err(candle_error("positions"))?;
                let tables = [
                    Some((&e.word, batch.input_ids.clone())),
                    Some((&e.position, positions)),
                    e.token_type.as_ref().map(|t| {
                        (
                            t,
                            batch.token_type_ids.clone().expect("single() sets types"),
                        )
                    }),
                ];
                let mut sum = RingTensor::zeros(fp.ring, &[ids.len(), h])?;
                for (table, idx) in tables.into_iter().flatten() {
                    let rows = to_vec2(
                        &table
                            .forward(&idx)
                            .and_then(|t| t.squeeze(0))
                            .map_err(candle_error("embedding lookup"))?,
                    )?;
                    let v: Vec<f64> = rows.concat().iter().map(|&v| v as f64).collect();
                    sum.add_in_place(&RingTensor::encode(fp, &[ids.len(), h], &v)?)?;
                }
                self.norm(&sum, &self.embedding_norm, &mut tracker)
            }
        };
        tracker.report.max_abs_hidden = max_abs(&x, fp);
        Ok((x, tracker.report))
    }

    /// Runs the fixed-point forward pass on one unpadded token sequence: the composition of
    /// [`crate::engine`] with this model's [`Simulation`] engine.
    pub fn forward(&self, ids: &[u32], type_ids: &[u32]) -> Result<SimOutput> {
        ensure!(
            !ids.is_empty() && ids.len() == type_ids.len(),
            InvalidArgument,
            "need a non-empty sequence with one type id per token"
        );
        self.config.check_input(ids, type_ids)?;
        let fp = self.fp();
        let (x, report) = self.embed(ids, type_ids)?;
        let mut sim = Simulation {
            model: self,
            position_bias: self.position_bias(ids.len()),
            tracker: Tracker::new(fp, 1),
            reports: vec![report],
            hidden_states: vec![x.clone()],
        };
        let out = engine::encoder_and_head(&mut sim, &self.config, &x)?;
        let Simulation {
            tracker,
            reports,
            hidden_states,
            ..
        } = sim;
        let mut warnings = Vec::new();
        for r in reports.iter().chain(std::iter::once(&tracker.report)) {
            if r.wrapped > 0 {
                warnings.push(format!(
                    "block {}: {} product accumulators exceeded the ring bound {} (max {:.1}) and wrapped mod 2^{}",
                    r.block, r.wrapped, r.accumulator_bound, r.max_abs_accumulator, fp.ring.bits()
                ));
            }
            if r.out_of_domain > 0 {
                warnings.push(format!(
                    "block {}: {} GELU/ReLU/LayerNorm inputs or ReLU-normalise rows outside the approximation domain (max |x - mean| into LayerNorm {:.1}, domain {:.1}; GELU domain |x| <= {:.1}; ReLU domain |x| < {:.1}; ReLU-normalise row sums < {:.1})",
                    r.block, r.out_of_domain, r.max_abs_norm_deviation, layer_norm_domain(fp), gelu_domain(fp), relu_domain(fp), relu_normalise_domain(fp)
                ));
            }
        }
        for w in &warnings {
            eprintln!("veil-model simulator warning: {w}");
        }
        Ok(SimOutput {
            hidden_states,
            pooled: out.pooled,
            logits: out.logits,
            reports,
            warnings,
        })
    }

    /// MPNet's bias as [heads][seq·seq] at f bits (None for other architectures).
    pub fn position_bias(&self, seq: usize) -> Option<Vec<Vec<u64>>> {
        let table = self.relative_attention_bias.as_ref()?;
        let heads = self.config.num_heads;
        let buckets = self.config.relative_attention_num_buckets;
        let mut out = vec![vec![0u64; seq * seq]; heads];
        for q in 0..seq {
            for k in 0..seq {
                let b = crate::nn::relative_position_bucket(k as i64 - q as i64, buckets, 128);
                for (h, o) in out.iter_mut().enumerate() {
                    o[q * seq + k] = table[b as usize][h];
                }
            }
        }
        Some(out)
    }

    /// The encoded layer `id` (Q, K and V side by side for [`LayerId::Qkv`]).
    fn layers(&self, id: LayerId) -> Result<Vec<&FixedLinear>> {
        let missing = || Error::Unsupported(format!("the model has no layer {id:?}"));
        let block = |i: usize| self.blocks.get(i).ok_or_else(missing);
        Ok(match id {
            LayerId::Qkv(i) => {
                let b = block(i)?;
                vec![&b.query, &b.key, &b.value]
            }
            LayerId::AttnOut(i) => vec![&block(i)?.attn_out],
            LayerId::Intermediate(i) => vec![&block(i)?.intermediate],
            LayerId::Output(i) => vec![&block(i)?.output],
            LayerId::Pooler => vec![self.head.pool_dense.as_ref().ok_or_else(missing)?],
            LayerId::Classifier => vec![self.head.classifier.as_ref().ok_or_else(missing)?],
        })
    }

    /// γ and β of norm `id`.
    pub fn norm_params(&self, id: NormId) -> Result<&FixedNorm> {
        let (NormId::Ln1(i) | NormId::Ln2(i)) = id;
        let b = self
            .blocks
            .get(i)
            .ok_or_else(|| Error::Unsupported(format!("the model has no norm {id:?}")))?;
        Ok(match id {
            NormId::Ln1(_) => &b.ln1,
            NormId::Ln2(_) => &b.ln2,
        })
    }

    /// y = ⌊(x·W + b) / 2^f⌋ for x [rows, in].
    pub(crate) fn linear(
        &self,
        x: &RingTensor,
        l: &FixedLinear,
        t: &mut Tracker,
    ) -> Result<RingTensor> {
        let (rows, inner) = (x.shape()[0], x.shape()[1]);
        ensure!(
            inner == l.in_dim(),
            InvalidArgument,
            "linear layer expects {} inputs, got {inner}",
            l.in_dim()
        );
        let out = self.matmul_rows(
            x.data(),
            l.weight.data(),
            (rows, inner, l.out_dim()),
            Some(l.bias.data()),
            t,
        );
        RingTensor::from_vec(self.fp().ring, &[rows, l.out_dim()], out)
    }

    /// How many of `xs` lie outside [`relu_domain`].
    fn outside_relu_domain(&self, xs: &[u64]) -> usize {
        let fp = self.fp();
        xs.iter()
            .filter(|&&v| fp.decode(v).abs() >= relu_domain(fp))
            .count()
    }

    /// Σ ReLU(x) + ε over a row of attention scores, in real units (all columns are valid in
    /// the simulator's unpadded rows).
    fn relu_normalise_sum(&self, row: &[u64]) -> f64 {
        let fp = self.fp();
        let sum: f64 = row.iter().map(|&v| fp.decode(v).max(0.0)).sum();
        sum + fp.decode(self.approx.relu_normalise_eps())
    }

    /// [`matmul_signed`] on ring values.
    fn matmul_rows(
        &self,
        a: &[u64],
        b: &[u64],
        dims: (usize, usize, usize),
        bias: Option<&[u64]>,
        t: &mut Tracker,
    ) -> Vec<u64> {
        let ring = self.fp().ring;
        let sa: Vec<i64> = a.iter().map(|&v| ring.to_signed(v)).collect();
        let sb: Vec<i64> = b.iter().map(|&v| ring.to_signed(v)).collect();
        matmul_signed(&self.approx, &sa, &sb, dims, bias, t)
    }

    pub(crate) fn norm(&self, x: &RingTensor, n: &FixedNorm, t: &mut Tracker) -> RingTensor {
        let fp = self.fp();
        let h = x.shape()[1];
        let mut out = Vec::with_capacity(x.len());
        for row in x.data().chunks(h) {
            out.extend(match n.kind {
                LayerNormKind::Exact => {
                    let centred = self.approx.centre(row);
                    let dev = centred
                        .iter()
                        .map(|&v| fp.decode(v).abs())
                        .fold(0.0, f64::max);
                    t.report.max_abs_norm_deviation = t.report.max_abs_norm_deviation.max(dev);
                    if dev > layer_norm_domain(fp) {
                        t.report.out_of_domain += 1;
                    }
                    self.approx.layer_norm_row(row, &n.gamma, &n.beta, n.eps)
                }
                LayerNormKind::Centring => self.approx.centre_affine_row(row, &n.gamma, &n.beta),
            });
        }
        RingTensor::from_vec(fp.ring, x.shape(), out).expect("same shape as the input")
    }
}

/// The simulator as an [`Engine`]: each operator on the values themselves, with
/// `veil_core::approx`'s arithmetic, recording every block's output and statistics.
struct Simulation<'a> {
    model: &'a FixedModel,
    position_bias: Option<Vec<Vec<u64>>>,
    /// The running block's statistics (after the last block: the head's).
    tracker: Tracker,
    reports: Vec<BlockReport>,
    hidden_states: Vec<RingTensor>,
}

impl Simulation<'_> {
    fn map(&self, x: &RingTensor, f: impl FnMut(&u64) -> u64) -> Result<RingTensor> {
        RingTensor::from_vec(x.ring(), x.shape(), x.data().iter().map(f).collect())
    }
}

impl Engine for Simulation<'_> {
    type Scope = ();

    fn scope(&mut self, _class: CostClass) {}

    fn linear(&mut self, id: LayerId, x: &RingTensor) -> Result<RingTensor> {
        let m = self.model;
        let parts = m
            .layers(id)?
            .into_iter()
            .map(|l| m.linear(x, l, &mut self.tracker))
            .collect::<Result<Vec<_>>>()?;
        RingTensor::concat_columns(&parts.iter().collect::<Vec<_>>())
    }

    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        secret_products(&self.model.approx, a, b, &mut self.tracker)
    }

    fn adjust_scores(&mut self, scores: &mut RingTensor) -> Result<()> {
        if let Some(bias) = &self.position_bias {
            let ring = scores.ring();
            for (v, &b) in scores.data_mut().iter_mut().zip(bias.iter().flatten()) {
                *v = ring.add(*v, b);
            }
        }
        Ok(())
    }

    fn attention_norm(&mut self, kind: AttentionNorm, scores: &RingTensor) -> Result<RingTensor> {
        let m = self.model;
        let s = scores.shape()[1];
        let valid = vec![true; s];
        let mut probs = Vec::with_capacity(scores.len());
        for row in scores.data().chunks(s) {
            probs.extend(match kind {
                AttentionNorm::Softmax => m.approx.softmax_row(row, &valid),
                AttentionNorm::ReluNormalise => {
                    let t = &mut self.tracker.report;
                    if m.relu_normalise_sum(row) >= relu_normalise_domain(m.fp()) {
                        t.out_of_domain += 1;
                    }
                    t.out_of_domain += m.outside_relu_domain(row);
                    m.approx.relu_normalise_row(row, &valid)
                }
            });
        }
        RingTensor::from_vec(scores.ring(), scores.shape(), probs)
    }

    fn activation(&mut self, kind: Activation, x: &RingTensor) -> Result<RingTensor> {
        let m = self.model;
        let fp = m.fp();
        let t = &mut self.tracker.report;
        let y = x
            .data()
            .iter()
            .map(|&v| match kind {
                Activation::Relu => {
                    t.out_of_domain += m.outside_relu_domain(&[v]);
                    m.approx.relu(v)
                }
                Activation::Gelu => {
                    // Beyond the proved bound (only after a LayerNorm input left its domain)
                    // the bounded comparisons no longer compute GELU.
                    let beyond = normed_bound::beyond(m.activation_bits, fp.ring, v);
                    if beyond || fp.decode(v).abs() > gelu_domain(fp) {
                        t.out_of_domain += 1;
                    }
                    m.approx.gelu_within(v, m.activation_bits)
                }
            })
            .collect();
        RingTensor::from_vec(x.ring(), x.shape(), y)
    }

    fn norm(&mut self, id: NormId, kind: LayerNormKind, x: &RingTensor) -> Result<RingTensor> {
        let n = self.model.norm_params(id)?;
        ensure!(
            n.kind == kind,
            InvalidArgument,
            "{id:?} is {:?} in the weights but {kind:?} in the config",
            n.kind
        );
        Ok(self.model.norm(x, n, &mut self.tracker))
    }

    fn tanh(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let ax = self.model.approx;
        self.map(x, |&v| ax.tanh(v))
    }

    fn mean_rows(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let (s, h) = (x.shape()[0], x.shape()[1]);
        let ring = x.ring();
        let ax = self.model.approx;
        let means = (0..h)
            .map(|c| (0..s).fold(0u64, |acc, r| ring.add(acc, x.data()[r * h + c])))
            .map(|sum| ax.mean_of_sum(sum, s))
            .collect();
        RingTensor::from_vec(ring, &[1, h], means)
    }

    fn block_done(&mut self, block: usize, output: &RingTensor) -> Result<()> {
        let fp = self.model.fp();
        let mut finished = std::mem::replace(&mut self.tracker, Tracker::new(fp, block + 2));
        finished.report.max_abs_hidden = max_abs(output, fp);
        self.reports.push(finished.report);
        self.hidden_states.push(output.clone());
        Ok(())
    }
}

/// ⌊a_i·b_i / 2^f⌋ for each pair of secret matrices, a_i [m, k] and b_i [k, n], the exact
/// accumulators recorded: the attention products of the encoder's and the decoder's simulators.
pub(crate) fn secret_products(
    ax: &Approx,
    a: &[RingTensor],
    b: &[RingTensor],
    t: &mut Tracker,
) -> Result<Vec<RingTensor>> {
    engine::check_operand_pairs(a.len(), b.len())?;
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
            ensure!(
                b.shape()[0] == k,
                InvalidArgument,
                "product of [{m}, {k}] and {:?}",
                b.shape()
            );
            let ring = a.ring();
            let signed = |x: &[u64]| x.iter().map(|&v| ring.to_signed(v)).collect::<Vec<i64>>();
            let bt = b.transpose()?;
            let out = matmul_signed(
                ax,
                &signed(a.data()),
                &signed(bt.data()),
                (m, k, n),
                None,
                t,
            );
            RingTensor::from_vec(ring, &[m, n], out)
        })
        .collect()
}

/// out[i][j] = ⌊(Σ_k a[i][k]·b[j][k] (+ bias[j] at 2f)) / 2^f⌋ with a [m, k], b [n, k] given
/// row-major as signed values; the exact accumulator (wrapping in i64, which is exact mod 2^ℓ)
/// is checked against the ring bound before reduction. The one fixed-point matrix product of
/// the encoder and decoder simulators.
pub(crate) fn matmul_signed<W: Copy + Into<i64>>(
    ax: &Approx,
    sa: &[i64],
    sb: &[W],
    (m, k, n): (usize, usize, usize),
    bias: Option<&[u64]>,
    t: &mut Tracker,
) -> Vec<u64> {
    let ring = ax.fp.ring;
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        let ra = &sa[i * k..(i + 1) * k];
        for j in 0..n {
            let rb = &sb[j * k..(j + 1) * k];
            let mut acc = ra
                .iter()
                .zip(rb)
                .fold(0i64, |s, (&x, &y)| s.wrapping_add(x.wrapping_mul(y.into())));
            if let Some(bias) = bias {
                acc = acc.wrapping_add(ring.to_signed(bias[j]));
            }
            t.accumulator(acc);
            out.push(ax.trunc(ring.from_signed(acc), ax.fp.frac_bits()));
        }
    }
    out
}

pub(crate) fn max_abs(x: &RingTensor, fp: FixedPoint) -> f64 {
    x.data()
        .iter()
        .map(|&v| fp.decode(v).abs())
        .fold(0.0, f64::max)
}

fn to_vec1(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(candle_core::DType::F32)
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(candle_error("reading weights"))
}

fn to_vec2(t: &Tensor) -> Result<Vec<Vec<f32>>> {
    t.to_dtype(candle_core::DType::F32)
        .and_then(|t| t.to_vec2::<f32>())
        .map_err(candle_error("reading weights"))
}
