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

use std::sync::{Arc, Condvar, Mutex};

use veil_core::approx::Approx;
use veil_core::{ensure, CostClass, Error, Result, RingTensor};
use veil_linear::lookup::{lookup_client, lookup_server, LookupShape, CANDIDATES};
use veil_linear::{ClientSession, LookupMethod, PreparedLookup, ServerSession};
use veil_model::FixedModel;
use veil_model::{EmbeddingMode, ModelConfig};
use veil_net::{Channel, Role};
use veil_nonlinear::{AffineParams, Ctx, OtSession};

/// The lookup a server uses unless told otherwise: batch PIR. At 128 tokens of the BERT
/// vocabulary it needs ≈ 1/10 of the one-hot method's products; it sends more bytes (width 768:
/// 243 MB against 74.5 MB), but its lookup time (28 s against 87 s at load 9 on this machine)
/// keeps it ahead even on the modelled WAN (100 Mbps: 48 s against 94 s), see
/// docs/BENCHMARKS.md.
pub(crate) const DEFAULT_METHOD: LookupMethod = LookupMethod::Batched;

/// NTT-domain cache budget for the prepared tables of one length (all parts together).
pub(crate) const TABLE_NTT_CACHE_BYTES: usize = 256 << 20;

/// Sequence lengths whose prepared lookup is kept (most recently used first). The lookup's
/// plan depends on the number of queries, so each length has its own preparation; keeping a
/// bounded few makes the server's memory independent of how many lengths it serves, at the
/// price of preparing again a length that was evicted. A preparation a session is using is
/// never evicted, and one length is prepared at a time, so at most this many plus one exist
/// ([`cache_bytes`]).
pub const PREPARED_LENGTHS_KEPT: usize = 4;

/// An upper estimate of one length's prepared lookup in memory: the batched plan puts each
/// table row in [`CANDIDATES`] bins (one copy more while a part is being prepared), and the
/// NTT-domain cache. The one-hot plan keeps a single copy, so this covers it too.
pub fn preparation_bytes(cfg: &ModelConfig) -> u64 {
    let rows = (cfg.vocab_size + cfg.type_vocab_size) as u64;
    (CANDIDATES as u64 + 1) * rows * cfg.hidden_size as u64 * 8 + TABLE_NTT_CACHE_BYTES as u64
}

/// The memory a server keeps for its prepared embedding lookups: [`PREPARED_LENGTHS_KEPT`]
/// preparations and the one being made, in private-embedding mode; none otherwise. The server
/// reserves it from its memory budget for its whole life.
pub fn cache_bytes(cfg: &ModelConfig) -> u64 {
    match cfg.veil.embedding {
        EmbeddingMode::Private => (PREPARED_LENGTHS_KEPT as u64 + 1) * preparation_bytes(cfg),
        EmbeddingMode::Public => 0,
    }
}

/// The public lookup shape of a model at `seq` tokens: the word table, then the token-type
/// table if the model has one.
pub(crate) fn lookup_shape(cfg: &ModelConfig, seq: usize) -> LookupShape {
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
    veil_model::position_id_rows(cfg, &[vec![1.0; seq]])[0]
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
    /// Prepared lookups by length, most recently used first. Locked only to find, insert or
    /// evict, never while a length is prepared, so sessions at a kept length do not wait.
    kept: Mutex<Vec<(usize, Arc<PreparedLookup>)>>,
    /// Signalled when a session stops using a preparation (which may then be evicted).
    released: Condvar,
    /// Held while a length is prepared: one at a time, so preparing lengths in turn cannot
    /// make the server hold more than [`cache_bytes`].
    preparing: Mutex<()>,
}

/// A session's use of a prepared lookup: while it lasts, the preparation is not evicted.
pub struct PreparationInUse<'a> {
    lookup: Option<Arc<PreparedLookup>>,
    emb: &'a ServerEmbedding,
}

impl std::ops::Deref for PreparationInUse<'_> {
    type Target = PreparedLookup;
    fn deref(&self) -> &PreparedLookup {
        self.lookup.as_deref().expect("held until dropped")
    }
}

impl Drop for PreparationInUse<'_> {
    fn drop(&mut self) {
        // Release the reference first, then signal under the lock a waiter checks it under.
        self.lookup = None;
        let _kept = self.emb.kept.lock().unwrap_or_else(|e| e.into_inner());
        self.emb.released.notify_all();
    }
}

impl ServerEmbedding {
    /// The server's tables of `model` at its format, looked up with `method`.
    pub fn new(model: &FixedModel, method: LookupMethod) -> Result<Self> {
        let fp = model.fp();
        let e = &model.embeddings;
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
            kept: Mutex::new(Vec::new()),
            released: Condvar::new(),
            preparing: Mutex::new(()),
        })
    }

    /// The lookup method every session of this server uses.
    pub fn method(&self) -> LookupMethod {
        self.method
    }

    /// The tables prepared for `seq` tokens (prepared now unless one of the recently used
    /// lengths). Preparing a new length waits until a kept one is not in use, which an
    /// inference's deadline bounds.
    pub fn prepared(&self, seq: usize) -> Result<PreparationInUse<'_>> {
        if let Some(p) = self.kept_use(seq) {
            return Ok(p);
        }
        let _one = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
        // Another session may have prepared it while this one waited.
        if let Some(p) = self.kept_use(seq) {
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
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        while kept.len() >= PREPARED_LENGTHS_KEPT {
            // The least recently used preparation no session holds.
            match kept.iter().rposition(|(_, q)| Arc::strong_count(q) == 1) {
                Some(i) => drop(kept.remove(i)),
                None => kept = self.released.wait(kept).unwrap_or_else(|e| e.into_inner()),
            }
        }
        kept.insert(0, (seq, p.clone()));
        Ok(PreparationInUse {
            lookup: Some(p),
            emb: self,
        })
    }

    /// The kept preparation for `seq`, moved to the front, if there is one.
    fn kept_use(&self, seq: usize) -> Option<PreparationInUse<'_>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let i = kept.iter().position(|(n, _)| *n == seq)?;
        let hit = kept.remove(i);
        let p = hit.1.clone();
        kept.insert(0, hit);
        Some(PreparationInUse {
            lookup: Some(p),
            emb: self,
        })
    }

    /// The lengths whose preparation is kept, most recently used first.
    pub fn kept_lengths(&self) -> Vec<usize> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().map(|(n, _)| *n).collect()
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
pub(crate) fn embed_client<C: Channel>(
    ch: &mut C,
    ot: &mut OtSession,
    ax: Approx,
    cfg: &ModelConfig,
    lin: &ClientSession,
    method: LookupMethod,
    ids: &[u32],
    type_ids: &[u32],
) -> Result<RingTensor> {
    let _g = ch.meter().enter(CostClass::Embedding);
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
pub(crate) fn embed_server<C: Channel>(
    ch: &mut C,
    ot: &mut OtSession,
    ax: Approx,
    lin: &ServerSession,
    model: &FixedModel,
    emb: &ServerEmbedding,
    seq: usize,
) -> Result<RingTensor> {
    let _g = ch.meter().enter(CostClass::Embedding);
    let prepared = emb.prepared(seq)?;
    let mut sum = lookup_server(ch, lin, &prepared)?;
    drop(prepared);
    sum.add_in_place(&emb.positions(&model.config, seq)?)?;
    let norm = &model.embedding_norm;
    let params = AffineParams {
        gamma: &norm.gamma,
        beta: &norm.beta,
    };
    let mut cx = Ctx::new(ot, ch, Role::Server, ax);
    cx.layer_norm(&sum, Some(&params), norm.eps)
}
