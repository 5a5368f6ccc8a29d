//! Private-embedding mode ([`EmbeddingMode::Private`]): the word and token-type tables are the
//! server's secret (fine-tuned) and the token ids the client's. The embedding layer runs on
//! shares and yields the shares `Party::encoder_and_head` starts from:
//!
//! 1. a private lookup ([`veil_linear::lookup`], method announced by the server at set-up) gives
//!    additive shares of word[id] + type[type_id] (rows encoded at f fractional bits, exactly
//!    as `FixedModel::embed` encodes them);
//! 2. positions are public (the server knows the sequence length), so the server adds its
//!    position rows to its own share locally;
//! 3. the embedding LayerNorm (always exact) runs on shares through the same operator
//!    as the encoder's ([`Ctx::layer_norm`]) with the server's γ, β.
//!
//! Both steps are metered under "Embedding", so the cost report shows this layer on its own
//! line (in public-embedding mode the client embeds locally and the line is absent).
//!
//! **Security:** semi-honest, 128-bit computational, 40-bit statistical — the lookup's
//! (veil-linear) and the LayerNorm's (veil-nonlinear), composed sequentially on uniformly masked
//! shares; the server learns the sequence length only, the client nothing about the tables.
//! **Error:** none beyond the simulator's: the output equals `FixedModel::embed`'s integers
//! (the lookup is exact mod 2^ℓ; with the batched method, except with the negligible hashing
//! failure of [`veil_linear::lookup`], which the client reports as an error).

use std::sync::{Arc, Mutex};

use veil_core::approx::Approx;
use veil_core::{ensure, Error, Result, RingTensor};
use veil_linear::lookup::{lookup_client, lookup_server, LookupShape};
use veil_linear::{ClientSession, LookupMethod, PreparedLookup, ServerSession};
use veil_model::sim::FixedModel;
use veil_model::ModelConfig;
use veil_net::{Channel, Role};
use veil_nonlinear::{AffineParams, Ctx, OtSession};

/// The lookup a server uses unless told otherwise: batch PIR. At 128 tokens of the BERT
/// vocabulary it needs ≈ 1/10 of the one-hot method's products; it sends more bytes (width 768:
/// 243 MB against 74.5 MB), but its lookup time (28 s against 87 s at load 9 on this machine)
/// keeps it ahead even on the modelled WAN (100 Mbps: 48 s against 94 s), see
/// docs/BENCHMARKS.md.
pub const DEFAULT_METHOD: LookupMethod = LookupMethod::Batched;

/// Meter label of the whole embedding layer.
pub const LABEL: &str = "Embedding";

/// NTT-domain cache budget for the prepared tables of one length (all parts together).
pub const TABLE_NTT_CACHE_BYTES: usize = 256 << 20;

/// Sequence lengths whose prepared lookup is kept (most recently used first). The lookup's
/// plan depends on the number of queries, so each length has its own preparation; keeping a
/// bounded few makes the server's memory independent of how many lengths it serves (at most
/// this many × [`TABLE_NTT_CACHE_BYTES`] plus the parts), at the price of preparing again a
/// length that was evicted.
pub const PREPARED_LENGTHS_KEPT: usize = 4;

/// The public lookup shape of a model at `seq` tokens: the word table, then the token-type
/// table if the model has one.
pub fn lookup_shape(cfg: &ModelConfig, seq: usize) -> LookupShape {
    let mut vocabs = vec![cfg.vocab_size];
    if cfg.type_vocab_size > 0 {
        vocabs.push(cfg.type_vocab_size);
    }
    LookupShape {
        vocabs,
        width: cfg.hidden_size,
        queries: seq,
    }
}

/// Position ids of an all-real sequence of `seq` tokens.
fn position_ids(cfg: &ModelConfig, seq: usize) -> Vec<usize> {
    veil_model::nn::position_id_rows(cfg, &[vec![1.0; seq]])[0]
        .iter()
        .map(|&p| p as usize)
        .collect()
}

/// The model's embedding tables encoded at f bits: word, token type (if any), position.
struct Tables {
    word: RingTensor,
    types: Option<RingTensor>,
    position: RingTensor,
}

/// Encodes a candle embedding table (`$table.embeddings()`, f32) at f bits. A macro because
/// this crate does not name candle's types.
macro_rules! encode_table {
    ($fp:expr, $table:expr) => {{
        let rows = $table
            .embeddings()
            .to_vec2::<f32>()
            .map_err(|e| Error::Other(format!("reading an embedding table (f32 expected): {e}")))?;
        let shape = [rows.len(), rows.first().map_or(0, |r| r.len())];
        let v: Vec<f64> = rows.concat().iter().map(|&x| x as f64).collect();
        RingTensor::encode($fp, &shape, &v)
    }};
}

/// The server's embedding layer: encoded tables, and the lookup prepared per sequence length
/// for the [`PREPARED_LENGTHS_KEPT`] most recently used lengths.
pub struct ServerEmbedding {
    method: LookupMethod,
    tables: Tables,
    prepared: Mutex<Vec<(usize, Arc<PreparedLookup>)>>,
}

impl ServerEmbedding {
    pub fn new(model: &FixedModel, method: LookupMethod) -> Result<Self> {
        let fp = model.fp();
        let e = &model.float.embeddings;
        let tables = Tables {
            word: encode_table!(fp, e.word)?,
            types: match &e.token_type {
                Some(t) => Some(encode_table!(fp, t)?),
                None => None,
            },
            position: encode_table!(fp, e.position)?,
        };
        Ok(ServerEmbedding {
            method,
            tables,
            prepared: Mutex::new(Vec::new()),
        })
    }

    pub fn method(&self) -> LookupMethod {
        self.method
    }

    /// The tables prepared for `seq` tokens (prepared now unless one of the recently used
    /// lengths).
    pub fn prepared(&self, seq: usize) -> Result<Arc<PreparedLookup>> {
        let mut cache = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.iter().position(|(n, _)| *n == seq) {
            let hit = cache.remove(i);
            let p = hit.1.clone();
            cache.insert(0, hit);
            return Ok(p);
        }
        let mut tables = vec![&self.tables.word];
        tables.extend(self.tables.types.as_ref());
        let p = Arc::new(PreparedLookup::new(
            &tables,
            seq,
            self.method,
            TABLE_NTT_CACHE_BYTES,
        )?);
        cache.insert(0, (seq, p.clone()));
        cache.truncate(PREPARED_LENGTHS_KEPT);
        Ok(p)
    }

    /// The lengths whose preparation is kept, most recently used first.
    pub fn kept_lengths(&self) -> Vec<usize> {
        let cache = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().map(|(n, _)| *n).collect()
    }

    /// The position rows of a `seq`-token input (seq × hidden).
    fn positions(&self, cfg: &ModelConfig, seq: usize) -> Result<RingTensor> {
        let t = &self.tables.position;
        let w = t.shape()[1];
        let ids = position_ids(cfg, seq);
        ensure!(
            ids.last().is_none_or(|&p| p < t.shape()[0]),
            InvalidArgument,
            "{seq} tokens exceed the position table"
        );
        let data = ids
            .iter()
            .flat_map(|&p| t.data()[p * w..(p + 1) * w].iter().copied())
            .collect();
        RingTensor::from_vec(t.ring(), &[seq, w], data)
    }
}

/// Client: its share of the embedding output for `ids` / `type_ids` (checked against the
/// config by the caller).
#[allow(clippy::too_many_arguments)]
pub fn embed_client<C: Channel>(
    ch: &mut C,
    ot: &mut OtSession,
    ax: Approx,
    cfg: &ModelConfig,
    lin: &ClientSession,
    method: LookupMethod,
    ids: &[u32],
    type_ids: &[u32],
) -> Result<RingTensor> {
    let _g = ch.meter().enter(LABEL);
    let shape = lookup_shape(cfg, ids.len());
    let mut all: Vec<&[u32]> = vec![ids];
    if cfg.type_vocab_size > 0 {
        all.push(type_ids);
    }
    let sum = lookup_client(ch, lin, &shape, method, &all)?;
    let mut cx = Ctx::new(ot, ch, Role::Client, ax);
    cx.layer_norm(&sum, None, cfg.layer_norm_eps)
}

/// Server: its share of the embedding output for a `seq`-token request.
pub fn embed_server<C: Channel>(
    ch: &mut C,
    ot: &mut OtSession,
    ax: Approx,
    lin: &ServerSession,
    model: &FixedModel,
    emb: &ServerEmbedding,
    seq: usize,
) -> Result<RingTensor> {
    let _g = ch.meter().enter(LABEL);
    let prepared = emb.prepared(seq)?;
    let mut sum = lookup_server(ch, lin, &prepared)?;
    sum.add_in_place(&emb.positions(&model.config, seq)?)?;
    let norm = &model.embedding_norm;
    let params = AffineParams {
        gamma: &norm.gamma,
        beta: &norm.beta,
    };
    let mut cx = Ctx::new(ot, ch, Role::Server, ax);
    cx.layer_norm(&sum, Some(&params), norm.eps)
}
