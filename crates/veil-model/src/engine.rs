//! The transformer's composition, written once: the encoder block and the head as a sequence of
//! operator calls on an [`Engine`], which says how each operator is computed. The decoder's
//! composition (causal attention with a KV cache) is [`decoder`].
//!
//! Two engines implement it: the fixed-point simulator ([`crate::sim::FixedModel::forward`], the
//! plaintext oracle, whose operators are `veil_core::approx`) and the two-party pass
//! (`veil_private::forward::Party`, each party on its shares). Because both run this one
//! composition, a private result can differ from the simulator's only inside an operator, and
//! each party operator is tested against its `approx` twin; the f32 model (`crate::nn`, candle,
//! batched and differentiable for training) is compared with the simulator to check that this
//! composition is the model's.
//!
//! All tensors are [rows, columns] in Z_{2^ℓ} at f fractional bits.

use veil_core::defaults::PADDING_KEY_OFFSET;
use veil_core::{ensure, CostClass, FixedPoint, Result, RingTensor};

/// The decoder step, composed once over a [`decoder::DecoderEngine`].
pub mod decoder;

/// Pushes the attention scores [rows, `cols`] that `hidden(row, column)` names down by
/// [`PADDING_KEY_OFFSET`]: padding that hides a prompt's length from the server, which cannot
/// tell it apart. Softmax's exp then clamps those keys' weights to exactly 0 and
/// ReLU-normalise's ReLU zeroes them. Additive, so a client applies it to its share alone (a
/// local step the server cannot see) and the simulator to the values. The encoder's trailing
/// padding and the decoder's leading padding
/// ([`decoder::hide_padding_keys`]) differ only in `hidden`.
pub fn push_down_keys(
    fp: FixedPoint,
    scores: &mut [u64],
    cols: usize,
    hidden: impl Fn(usize, usize) -> bool,
) {
    let ring = fp.ring;
    let down = ring.neg(fp.encode(PADDING_KEY_OFFSET));
    for (r, row) in scores.chunks_mut(cols).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            if hidden(r, c) {
                *v = ring.add(*v, down);
            }
        }
    }
}

use crate::config::ModelConfig;
use crate::variants::{Activation, AttentionNorm, HeadKind, LayerNormKind};

/// Names a linear layer of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerId {
    /// Query, key and value of a block, fused: output columns [Q | K | V], the query's scale
    /// 1/√d_head folded into its weights.
    Qkv(usize),
    /// The attention output projection of block i.
    AttnOut(usize),
    /// The feed-forward layer's first (widening) projection of block i.
    Intermediate(usize),
    /// The feed-forward layer's second projection of block i.
    Output(usize),
    /// The pooler's dense layer.
    Pooler,
    /// The classifier.
    Classifier,
}

impl LayerId {
    /// (input features, output features), from the public config alone.
    pub fn dims(self, cfg: &ModelConfig) -> (usize, usize) {
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        match self {
            LayerId::Qkv(_) => (h, 3 * h),
            LayerId::AttnOut(_) | LayerId::Pooler => (h, h),
            LayerId::Intermediate(_) => (h, ff),
            LayerId::Output(_) => (ff, h),
            LayerId::Classifier => (h, cfg.veil.num_labels),
        }
    }

    /// The most input rows the layer ever sees: one pooled row for the head's layers, the
    /// model's sequence limit for the rest.
    pub fn max_rows(self, cfg: &ModelConfig) -> usize {
        match self {
            LayerId::Pooler | LayerId::Classifier => 1,
            _ => cfg.max_sequence_len(),
        }
    }
}

/// Names a LayerNorm (or its centring substitute) of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormId {
    /// After the attention's residual sum of block i.
    Ln1(usize),
    /// After the feed-forward's residual sum of block i.
    Ln2(usize),
}

/// How each operator of the composition is computed. Every method takes and returns the
/// engine's view of a value: the value itself for the simulator, a party's share for the
/// two-party engine.
pub trait Engine {
    /// Keeps an operator class's cost accounted while it lives (the two-party engine's meter
    /// label; nothing for the simulator).
    type Scope;

    /// Opens the cost class `class` for everything until the scope is dropped.
    fn scope(&mut self, class: CostClass) -> Self::Scope;

    /// ⌊(x·Wᵀ + b) / 2^f⌋ for the model's layer `id`, x [rows, in].
    fn linear(&mut self, id: LayerId, x: &RingTensor) -> Result<RingTensor>;

    /// ⌊a_i·b_i / 2^f⌋ for each pair, a_i [m, k] and b_i [k, n] (the attention's products,
    /// one pair per head).
    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>>;

    /// What the attention scores [heads·seq, seq] get beyond ⌊Q·Kᵀ / 2^f⌋: MPNet's
    /// relative-position bias (from the weights) and the offset that masks padding keys (the
    /// client's, when it pads).
    fn adjust_scores(&mut self, scores: &mut RingTensor) -> Result<()>;

    /// Softmax or ReLU-normalise of every row of the scores.
    fn attention_norm(&mut self, kind: AttentionNorm, scores: &RingTensor) -> Result<RingTensor>;

    /// The feed-forward activation, element-wise.
    fn activation(&mut self, kind: Activation, x: &RingTensor) -> Result<RingTensor>;

    /// LayerNorm or centring (+ the affine γ, β of norm `id`) of every row.
    fn norm(&mut self, id: NormId, kind: LayerNormKind, x: &RingTensor) -> Result<RingTensor>;

    /// tanh, element-wise (the pooler's).
    fn tanh(&mut self, x: &RingTensor) -> Result<RingTensor>;

    /// The column means of x [seq, h], as [1, h].
    fn mean_rows(&mut self, x: &RingTensor) -> Result<RingTensor>;

    /// Sees each block's output as it is produced (the simulator records it).
    fn block_done(&mut self, _block: usize, _output: &RingTensor) -> Result<()> {
        Ok(())
    }
}

/// The head's outputs.
pub struct HeadOutput {
    /// [hidden]: the pooled vector.
    pub pooled: RingTensor,
    /// [num_labels] when the model has a classifier.
    pub logits: Option<RingTensor>,
}

/// Every encoder block, then the head, on the encoder input x [seq, hidden].
pub fn encoder_and_head<E: Engine>(
    e: &mut E,
    cfg: &ModelConfig,
    x: &RingTensor,
) -> Result<HeadOutput> {
    ensure!(
        x.shape().len() == 2 && x.shape()[1] == cfg.hidden_size && x.shape()[0] > 0,
        InvalidArgument,
        "encoder input of shape {:?}, expected [seq, {}]",
        x.shape(),
        cfg.hidden_size
    );
    let mut h = x.clone();
    for i in 0..cfg.num_layers {
        h = block(e, cfg, i, &h)?;
        e.block_done(i, &h)?;
    }
    head(e, cfg, &h)
}

/// One encoder block: fused QKV → per-head Q·Kᵀ → Softmax / ReLU-normalise → per-head P·V →
/// output projection + residual → LN1 / centring → FFN with GELU / ReLU + residual →
/// LN2 / centring.
fn block<E: Engine>(e: &mut E, cfg: &ModelConfig, i: usize, x: &RingTensor) -> Result<RingTensor> {
    let variant = cfg.veil.blocks[i];
    let (s, h) = (x.shape()[0], x.shape()[1]);
    let nh = cfg.num_heads;
    let dh = h / nh;
    let qkv = e.linear(LayerId::Qkv(i), x)?;
    let mut qs = Vec::with_capacity(nh);
    let mut kts = Vec::with_capacity(nh);
    let mut vs = Vec::with_capacity(nh);
    for hd in 0..nh {
        qs.push(qkv.columns(hd * dh, dh)?);
        kts.push(qkv.columns(h + hd * dh, dh)?.transpose()?);
        vs.push(qkv.columns(2 * h + hd * dh, dh)?);
    }
    let per_head = e.products(&qs, &kts)?;
    let mut scores = RingTensor::concat_rows(&per_head.iter().collect::<Vec<_>>())?; // [nh·s, s]
    e.adjust_scores(&mut scores)?;
    let probs = e.attention_norm(variant.attention, &scores)?;
    let heads = e.products(&probs.split_rows(s)?, &vs)?;
    let context = RingTensor::concat_columns(&heads.iter().collect::<Vec<_>>())?;
    let attn = e.linear(LayerId::AttnOut(i), &context)?.add(x)?;
    let y = e.norm(NormId::Ln1(i), variant.ln1, &attn)?;
    let inter = e.linear(LayerId::Intermediate(i), &y)?;
    let act = e.activation(variant.activation, &inter)?;
    let out = e.linear(LayerId::Output(i), &act)?.add(&y)?;
    e.norm(NormId::Ln2(i), variant.ln2, &out)
}

/// Pooling (first token → dense → tanh, or the mean over tokens) and the classifier.
fn head<E: Engine>(e: &mut E, cfg: &ModelConfig, x: &RingTensor) -> Result<HeadOutput> {
    let _scope = e.scope(CostClass::Head);
    let h = x.shape()[1];
    let pooled = match cfg.veil.head {
        HeadKind::Pooler => {
            let first = RingTensor::from_vec(x.ring(), &[1, h], x.data()[..h].to_vec())?;
            let dense = e.linear(LayerId::Pooler, &first)?;
            e.tanh(&dense)?
        }
        HeadKind::MeanPool => e.mean_rows(x)?,
    };
    let logits = match cfg.veil.num_labels {
        0 => None,
        n => Some(e.linear(LayerId::Classifier, &pooled)?.reshape(&[n])?),
    };
    Ok(HeadOutput {
        pooled: pooled.reshape(&[h])?,
        logits,
    })
}

/// Refuses a batch of products whose left and right operand lists differ in length (every
/// engine's `products`).
pub(crate) fn check_operand_pairs(left: usize, right: usize) -> Result<()> {
    ensure!(
        left == right,
        InvalidArgument,
        "{left} left and {right} right operands"
    );
    Ok(())
}
