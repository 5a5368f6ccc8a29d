//! The decoder's composition, written once: a pre-norm decoder block (Llama family or GPT-2)
//! and the LM head as operator calls on a [`DecoderEngine`], with a KV cache the engine holds.
//!
//! Three engines run it: plain f32 ([`crate::decode_f32::F32Decoder`]), the fixed-point simulator
//! ([`crate::decode_sim::FixedDecoder`], `veil_core::approx` arithmetic, what the private pass
//! must equal), and later the two-party pass (issue #37), which implements the same operators on
//! shares. Prefill (a whole prompt) and decode (one new token) are the same call: the engine's
//! cache holds the keys and values of the `start` earlier positions, the new rows attend to all
//! of them and causally to each other, and their keys and values are appended.
//!
//! Per block: h = norm(x); q, k, v = linear(h) (the attention scale 1/√d_head is part of the
//! engine's q); Llama: rotary(q), rotary(k) by position; K, V = cache ∪ (k, v); per query head
//! (grouped: head j reads key/value head j / (heads / kv_heads)) scores = q·Kᵀ; causal softmax;
//! context = P·V — computed as one product per key/value head, its query heads' rows stacked,
//! so each cached key and value is an operand once; x += o(context); h = norm(x);
//! x += down(silu(gate(h)) ⊙ up(h)) or down(gelu_tanh(up(h))). Then the final norm and the LM head on the last position (or all).
//!
//! Operator variants ([`DecoderConfig::variant`], Llama family only): the composition passes
//! each block's choice to the engine's call, so every engine computes the same substitute.
//! [`DecoderNormKind::Scale`] makes a block norm x·γ (no division by the root mean square; the
//! final norm is always the original), [`AttentionNorm::ReluNormalise`] makes the causal
//! attention weights ReLU(x_i) / (Σ_j ReLU(x_j) + ε) over the visible keys (ε =
//! `veil_core::defaults::RELU_NORMALISE_EPS`, masked keys exactly 0), and
//! [`DecoderActivation::Relu`] makes the gated MLP relu(gate) ⊙ up and
//! [`DecoderActivation::HardSwish`] gate·min(max(gate + 3, 0), 6)/6 ⊙ up.

use veil_core::{ensure, FixedPoint, Result, RingTensor};

use crate::decoder::{DecoderActivation, DecoderConfig, DecoderFamily, DecoderNormKind};
use crate::variants::AttentionNorm;

/// Names a linear layer of the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecoderLayer {
    /// The query projection of a block, with the attention scale 1/√d_head folded in.
    Query(usize),
    /// The key projection of block i.
    Key(usize),
    /// The value projection of block i.
    Value(usize),
    /// The attention output projection of block i.
    AttnOut(usize),
    /// The gated MLP's gate projection of block i (Llama family).
    Gate(usize),
    /// The MLP's widening projection of block i.
    Up(usize),
    /// The MLP's projection back to the residual width of block i.
    Down(usize),
    /// The output projection to the vocabulary (tied to the token embedding or separate).
    LmHead,
}

/// Names a norm of the decoder (RMSNorm for the Llama family, LayerNorm for GPT-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecoderNorm {
    /// Before the attention of block i.
    Attn(usize),
    /// Before the MLP of block i.
    Mlp(usize),
    /// Before the LM head.
    Final,
}

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// The last new position only: what generation needs.
    Last,
    /// Every new position (agreement tests).
    All,
}

/// The structural operations the composition needs on an engine's values: slicing and
/// stacking rows and columns, and the residual sum — all local on shares.
pub trait Rows: Sized {
    /// (rows, columns).
    fn dims(&self) -> (usize, usize);
    /// Columns `from..from + width` (one head's slice).
    fn columns(&self, from: usize, width: usize) -> Result<Self>;
    /// Rows `from..from + count`.
    fn rows(&self, from: usize, count: usize) -> Result<Self>;
    /// The transpose (Kᵀ for the scores).
    fn transpose(&self) -> Result<Self>;
    /// The parts one above the other (the KV cache growing).
    fn stack_rows(parts: &[&Self]) -> Result<Self>;
    /// The parts side by side (the heads joined).
    fn stack_columns(parts: &[&Self]) -> Result<Self>;
    /// Consecutive blocks of `rows` rows (one per head, from a batched product).
    fn split_rows(&self, rows: usize) -> Result<Vec<Self>>;
    /// The element-wise sum (the residual connection).
    fn plus(&self, other: &Self) -> Result<Self>;
}

impl Rows for RingTensor {
    fn dims(&self) -> (usize, usize) {
        match self.shape() {
            [r, c] => (*r, *c),
            _ => (0, 0),
        }
    }
    fn columns(&self, from: usize, width: usize) -> Result<Self> {
        RingTensor::columns(self, from, width)
    }
    fn rows(&self, from: usize, count: usize) -> Result<Self> {
        let (r, c) = self.dims();
        ensure!(
            from + count <= r,
            InvalidArgument,
            "rows {from}..{} of {r}",
            from + count
        );
        RingTensor::from_vec(
            self.ring(),
            &[count, c],
            self.data()[from * c..(from + count) * c].to_vec(),
        )
    }
    fn transpose(&self) -> Result<Self> {
        RingTensor::transpose(self)
    }
    fn stack_rows(parts: &[&Self]) -> Result<Self> {
        RingTensor::concat_rows(parts)
    }
    fn stack_columns(parts: &[&Self]) -> Result<Self> {
        RingTensor::concat_columns(parts)
    }
    fn split_rows(&self, rows: usize) -> Result<Vec<Self>> {
        RingTensor::split_rows(self, rows)
    }
    fn plus(&self, other: &Self) -> Result<Self> {
        self.add(other)
    }
}

/// How each operator of the decoder is computed, and where the KV cache lives. Every method
/// takes and returns the engine's view of a value (the value for f32 and the simulator, a
/// party's share for the two-party engine); positions and the causal mask are public.
pub trait DecoderEngine {
    /// What the engine computes on: an f32 matrix, ring values, or a party's shares.
    type Value: Rows;

    /// Positions already in the KV cache.
    fn cached(&self) -> usize;

    /// The embedding of `ids` at positions start.. (token row, plus the learned position row
    /// for GPT-2), [ids, hidden].
    fn embed(&mut self, ids: &[u32], start: usize) -> Result<Self::Value>;

    /// x·Wᵀ + b of layer `id`, x [rows, in].
    fn linear(&mut self, id: DecoderLayer, x: &Self::Value) -> Result<Self::Value>;

    /// Norm `id` of every row: with [`DecoderNormKind::Original`] RMSNorm (Llama family) or
    /// LayerNorm (GPT-2); with [`DecoderNormKind::Scale`] (Llama family only) x·γ, no division.
    fn norm(
        &mut self,
        id: DecoderNorm,
        kind: DecoderNormKind,
        x: &Self::Value,
    ) -> Result<Self::Value>;

    /// Rotary positions on x [rows, heads·head_dim], row r at position start + r: in each head,
    /// (a, b) = (first, second half) becomes (a·cos − b·sin, b·cos + a·sin). A public linear map.
    fn rotary(&mut self, x: &Self::Value, heads: usize, start: usize) -> Result<Self::Value>;

    /// Appends the new keys and values [new, kv_heads·head_dim] to block `block`'s cache, which
    /// must hold exactly `start` positions, and returns all of them, [start + new, …].
    fn append_cache(
        &mut self,
        block: usize,
        start: usize,
        k: &Self::Value,
        v: &Self::Value,
    ) -> Result<(Self::Value, Self::Value)>;

    /// a_i·b_i for each pair (the attention's products, one pair per key/value head).
    fn products(&mut self, a: &[Self::Value], b: &[Self::Value]) -> Result<Vec<Self::Value>>;

    /// The attention weights of the scores [heads·new, start + new] under `kind` (Softmax, or
    /// ReLU(x_i) / (Σ_j ReLU(x_j) + ε)): row r (query position start + r mod new) sees the keys
    /// 0..=start + (r mod new) ([`causal_visible`]); the others get exactly zero.
    fn causal_weights(
        &mut self,
        kind: AttentionNorm,
        scores: &Self::Value,
        start: usize,
    ) -> Result<Self::Value>;

    /// act(gate) ⊙ up, element-wise: silu for [`DecoderActivation::Original`], max(·, 0) for
    /// [`DecoderActivation::Relu`], x·min(max(x + 3, 0), 6)/6 for
    /// [`DecoderActivation::HardSwish`].
    fn gated(
        &mut self,
        act: DecoderActivation,
        gate: &Self::Value,
        up: &Self::Value,
    ) -> Result<Self::Value>;

    /// GELU (tanh form), element-wise.
    fn gelu(&mut self, x: &Self::Value) -> Result<Self::Value>;

    /// Sees each block's output (the simulator records it).
    fn block_done(&mut self, _block: usize, _output: &Self::Value) -> Result<()> {
        Ok(())
    }
}

/// A KV cache of ring values — the simulator's values, or one party's shares in the two-party
/// engine: per block, the keys and values of every position so far, [positions, width]
/// row-major (width = kv_heads·head_dim). The one implementation of
/// [`DecoderEngine::append_cache`] for the engines on rings.
#[derive(Clone, Debug)]
pub struct KvCache {
    width: usize,
    blocks: Vec<(Vec<u64>, Vec<u64>)>,
}

impl KvCache {
    /// An empty cache for `cfg`'s blocks.
    pub fn new(cfg: &DecoderConfig) -> Self {
        Self::with_capacity(cfg, 0)
    }

    /// An empty cache for `cfg`'s blocks with room for `positions` allocated now: a cache
    /// with a fixed limit then holds exactly what was counted for it, never a grown vector's
    /// spare capacity.
    pub fn with_capacity(cfg: &DecoderConfig, positions: usize) -> Self {
        let width = cfg.kv_heads * cfg.head_dim;
        let room = || Vec::with_capacity(positions * width);
        KvCache {
            width,
            blocks: (0..cfg.layers).map(|_| (room(), room())).collect(),
        }
    }

    /// Positions held (block 0's; a step that failed part-way may leave later blocks shorter).
    pub fn positions(&self) -> usize {
        self.blocks
            .first()
            .map_or(0, |(k, _)| k.len() / self.width.max(1))
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        self.blocks.iter_mut().for_each(|(k, v)| {
            k.clear();
            v.clear();
        });
    }

    /// [`DecoderEngine::append_cache`]: appends the rows of `k` and `v` [new, width] to block
    /// `block`, which must hold exactly `start` positions; returns all of them.
    pub fn append(
        &mut self,
        block: usize,
        start: usize,
        k: &RingTensor,
        v: &RingTensor,
    ) -> Result<(RingTensor, RingTensor)> {
        let width = self.width;
        let (new, cols) = k.dims();
        ensure!(
            cols == width && v.dims() == (new, width) && k.ring() == v.ring(),
            InvalidArgument,
            "keys {:?} and values {:?} for a cache {width} wide",
            k.shape(),
            v.shape()
        );
        let (ck, cv) = self
            .blocks
            .get_mut(block)
            .ok_or_else(|| veil_core::Error::InvalidArgument(format!("no block {block}")))?;
        ensure!(
            ck.len() == start * width && cv.len() == start * width,
            InvalidArgument,
            "block {block}'s cache holds {} positions, the step starts at {start}",
            ck.len() / width.max(1)
        );
        ck.extend_from_slice(k.data());
        cv.extend_from_slice(v.data());
        let total = start + new;
        Ok((
            RingTensor::from_vec(k.ring(), &[total, width], ck.clone())?,
            RingTensor::from_vec(k.ring(), &[total, width], cv.clone())?,
        ))
    }
}

/// Runs `ids` (the next positions after the engine's cache) through every block and the LM
/// head; returns the logits [1 or ids, vocab]. The cache grows by `ids.len()` positions; after
/// an error it is inconsistent and the engine must be reset.
pub fn forward<E: DecoderEngine>(
    e: &mut E,
    cfg: &DecoderConfig,
    ids: &[u32],
    rows: LogitRows,
) -> Result<E::Value> {
    let start = e.cached();
    cfg.check_variants()?;
    ensure!(!ids.is_empty(), InvalidArgument, "no tokens to run");
    ensure!(
        start + ids.len() <= cfg.max_positions,
        InvalidArgument,
        "{} positions exceed the model's {}",
        start + ids.len(),
        cfg.max_positions
    );
    let mut x = e.embed(ids, start)?;
    for i in 0..cfg.layers {
        x = block(e, cfg, i, start, &x)?;
        e.block_done(i, &x)?;
    }
    let n = ids.len();
    let last = match rows {
        LogitRows::Last => x.rows(n - 1, 1)?,
        LogitRows::All => x,
    };
    let h = e.norm(DecoderNorm::Final, DecoderNormKind::Original, &last)?;
    e.linear(DecoderLayer::LmHead, &h)
}

fn block<E: DecoderEngine>(
    e: &mut E,
    cfg: &DecoderConfig,
    i: usize,
    start: usize,
    x: &E::Value,
) -> Result<E::Value> {
    let (nh, nkv, dh) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
    let variant = cfg.variant(i);
    let h = e.norm(DecoderNorm::Attn(i), variant.attn_norm, x)?;
    let mut q = e.linear(DecoderLayer::Query(i), &h)?;
    let mut k = e.linear(DecoderLayer::Key(i), &h)?;
    let v = e.linear(DecoderLayer::Value(i), &h)?;
    if cfg.family == DecoderFamily::Llama {
        q = e.rotary(&q, nh, start)?;
        k = e.rotary(&k, nkv, start)?;
    }
    let (keys, values) = e.append_cache(i, start, &k, &v)?;
    // One product per key/value head: its query heads' rows stacked (group·n × d) times its
    // Kᵀ, so each cached key and value enters a product once, not once per query head. Rows
    // are independent in a product, and the stacked groups in order are the query heads in
    // order, so the scores come out head-major [heads·n, total] as if per head.
    let n = q.dims().0;
    let group = nh / nkv;
    let mut qs = Vec::with_capacity(nkv);
    let mut kts = Vec::with_capacity(nkv);
    let mut vs = Vec::with_capacity(nkv);
    for kv in 0..nkv {
        let heads = (kv * group..(kv + 1) * group)
            .map(|hd| q.columns(hd * dh, dh))
            .collect::<Result<Vec<_>>>()?;
        qs.push(E::Value::stack_rows(&heads.iter().collect::<Vec<_>>())?);
        kts.push(keys.columns(kv * dh, dh)?.transpose()?);
        vs.push(values.columns(kv * dh, dh)?);
    }
    let per_group = e.products(&qs, &kts)?;
    let scores = E::Value::stack_rows(&per_group.iter().collect::<Vec<_>>())?;
    let probs = e.causal_weights(variant.attention, &scores, start)?;
    // The probabilities' rows are head-major too: a group's rows times its V, then each
    // query head's n rows of the result side by side.
    let grouped = e.products(&probs.split_rows(group * n)?, &vs)?;
    let mut heads = Vec::with_capacity(nh);
    for g in &grouped {
        heads.extend(g.split_rows(n)?);
    }
    let context = E::Value::stack_columns(&heads.iter().collect::<Vec<_>>())?;
    let x = e.linear(DecoderLayer::AttnOut(i), &context)?.plus(x)?;
    let h = e.norm(DecoderNorm::Mlp(i), variant.mlp_norm, &x)?;
    let act = match cfg.family {
        DecoderFamily::Llama => {
            let gate = e.linear(DecoderLayer::Gate(i), &h)?;
            let up = e.linear(DecoderLayer::Up(i), &h)?;
            e.gated(variant.activation, &gate, &up)?
        }
        DecoderFamily::Gpt2 => {
            let up = e.linear(DecoderLayer::Up(i), &h)?;
            e.gelu(&up)?
        }
    };
    e.linear(DecoderLayer::Down(i), &act)?.plus(&x)
}

/// (cos, sin) of the rotary angles p·θ_i for p in start..start + rows, i < head_dim/2, row-major
/// [rows, head_dim/2]: public constants both engines encode their way.
pub fn rotary_tables(cfg: &DecoderConfig, start: usize, rows: usize) -> (Vec<f64>, Vec<f64>) {
    let inv = crate::decoder::RopeScaling::inv_freqs(
        cfg.rope_scaling.as_ref(),
        cfg.rope_theta,
        cfg.head_dim,
    );
    let mut cos = Vec::with_capacity(rows * inv.len());
    let mut sin = Vec::with_capacity(rows * inv.len());
    for p in start..start + rows {
        for &f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    (cos, sin)
}

/// The rotary products before their truncation: x [rows, heads·head_dim] (signed, at f bits),
/// row r at position start + r, in each head (a, b) ↦ (a·cos − b·sin, b·cos + a·sin) with cos
/// and sin encoded at f bits, so each result carries 2f fractional bits. The arithmetic wraps
/// mod 2^64, so it is also right mod 2^ℓ on a party's shares: the simulator truncates these
/// values, the two-party engine computes them locally on its shares and truncates on shares.
pub fn rotary_accumulators(
    cfg: &DecoderConfig,
    fp: FixedPoint,
    x: &[i64],
    (rows, heads): (usize, usize),
    start: usize,
) -> Result<Vec<i64>> {
    let dh = cfg.head_dim;
    let cols = heads * dh;
    ensure!(
        x.len() == rows * cols,
        InvalidArgument,
        "rotary on {} values, expected {rows}·{heads}·{dh}",
        x.len()
    );
    let half = dh / 2;
    let (cos, sin) = rotary_tables(cfg, start, rows);
    let enc =
        |v: &[f64]| -> Vec<i64> { v.iter().map(|&c| fp.ring.to_signed(fp.encode(c))).collect() };
    let (cos, sin) = (enc(&cos), enc(&sin));
    let mut out = vec![0i64; x.len()];
    for r in 0..rows {
        for hd in 0..heads {
            let base = r * cols + hd * dh;
            for j in 0..half {
                let (a, b) = (x[base + j], x[base + half + j]);
                let (c, s) = (cos[r * half + j], sin[r * half + j]);
                out[base + j] = a.wrapping_mul(c).wrapping_sub(b.wrapping_mul(s));
                out[base + half + j] = b.wrapping_mul(c).wrapping_add(a.wrapping_mul(s));
            }
        }
    }
    Ok(out)
}

/// Whether query row r (of `new` rows at positions start..) may see key column c: c ≤ start + r.
pub fn causal_visible(start: usize, new: usize, row: usize, total: usize) -> Vec<bool> {
    let pos = start + row % new.max(1);
    (0..total).map(|c| c <= pos).collect()
}

/// Hides a generation's leading padding (`--pad-to`: the client's first `padding` positions are
/// made-up tokens that hide the prompt's length from the server): the scores `scores` [heads·new,
/// total] (the rows of [`DecoderEngine::causal_weights`]) with every visible score of a row
/// against a padding key other than its own position pushed down ([`super::push_down_keys`]),
/// so a real position attends as without the padding and a padding position attends to itself
/// alone (its row stays well-formed whatever it holds); `None` without padding (nothing to
/// copy).
///
/// GPT-2's learned positions count from the first real token ([`crate::DecoderTables::embed`]);
/// Llama's rotary positions are relative, so the real positions' products are those of the
/// unpadded prompt up to the rotary tables' rounding at the shifted positions.
pub fn hide_padding_keys(
    fp: FixedPoint,
    padding: usize,
    scores: &RingTensor,
    start: usize,
) -> Result<Option<RingTensor>> {
    if padding == 0 {
        return Ok(None);
    }
    let (rows, total) = scores.dims();
    ensure!(
        total > start,
        InvalidArgument,
        "scores of {rows} rows over {total} keys for a step starting at {start}"
    );
    let new = total - start;
    let mut hidden = scores.clone();
    // Row r is query position start + r mod new; it sees keys up to its position.
    super::push_down_keys(fp, hidden.data_mut(), total, |r, c| {
        c < padding && c < start + r % new
    });
    Ok(Some(hidden))
}
