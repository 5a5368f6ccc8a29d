//! Sessions: the handshake, one-off set-up, and the per-inference exchange.
//!
//! Wire protocol (every message length-prefixed and size-limited, see `veil_net::Channel`;
//! `veil serve` / `veil classify` carry it over TLS 1.3, `veil_net::tls`):
//! 1. client → server `Hello` = "VEIL" ‖ version (u32) ‖ the longest prompt it will send, in
//!    tokens (u32; 0: the model's limit), so the server can check its memory before set-up;
//! 2. server → client status (u8) ‖ payload: 0 ‖ the model's public `config.json` (architecture
//!    and operator variants), or 1 ‖ why the session is refused (busy, shutting down, too long
//!    for its memory; UTF-8), which ends the session; in private-embedding mode then one byte
//!    naming the lookup method ([`veil_linear::LookupMethod::tag`]);
//! 3. the client checks the configuration against its own before anything else moves;
//!    set-up: the client's BFV public keys (veil-linear), base OTs and the first silent-COT
//!    bootstrap (veil-ot);
//! 4. per inference: client → server `Request` = tag 1 ‖ sequence length (u32, at most the
//!    length announced in the hello) ‖ whether to use preprocessed material (u8); both run
//!    [`crate::forward`]; server → client its share of the output; tag 0 ends the session;
//! 5. preprocessing for a future inference: client → server tag 2 ‖ sequence length (u32);
//!    server → client status (u8) ‖ the silent-OT pool size both then precompute (u64), or why
//!    it refuses (UTF-8; over its per-session budget, [`preprocess_budget`]), then both run
//!    [`crate::preprocess`] and fill their pools. Each party keeps the
//!    material per length, oldest first; an inference that asks for it uses the oldest of its
//!    length, once (a request for material the server does not hold ends the session), and
//!    material a session did not use is dropped with it.
//!
//! Every step has a deadline on socket transports ([`Deadlines`], [`ClientOptions`]): a total
//! per step, proportional to its work, so a stalled or dripping peer is dropped.
//!
//! What the server learns: the sequence length (the request says it). A client hides it by
//! padding ([`ClientConnection::infer_padded`]): it masks the padding keys itself, so the
//! server sees only the padded length. What the client learns: the output (logits, or the pooled vector of an embedding model).
//! In public-embedding mode the client embeds its tokens with the public tables and holds the
//! whole embedding as its share (the server's share is zero), which hides it perfectly and
//! costs no traffic. In private-embedding mode the client sends nothing but encrypted queries:
//! [`ClientConnection::infer_ids`] runs [`crate::embedding`] first (cost line "Embedding").

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::approx::Approx;
use veil_core::wire::{Reader, Writer};
use veil_core::{bail, ensure, FixedPoint, Result, RingTensor};
use veil_linear::{ClientSession, LookupMethod, ServerSession};
use veil_model::{EmbeddingMode, HeadKind, ModelConfig};
use veil_net::{shaped_pair, Channel, MemChannel, NetworkModel, RealClock, Role};
use veil_nonlinear::OtSession;

use crate::embedding::{embed_client, embed_server, ServerEmbedding, DEFAULT_METHOD};
use crate::forward::{Party, Pre, Side};
use crate::prepared::ServerModel;
use crate::preprocess::{
    material_bytes, plan, preprocess_client, preprocess_server, ClientMaterial, ServerMaterial,
};
use crate::report::{CostReport, PhaseCost};
use crate::server::{ServeOptions, Server, Transport};

const MAGIC: &[u8; 4] = b"VEIL";
/// The protocol version; 2 added the hello's length and the server's status byte; 3 widened
/// LayerNorm's domain to 2^11 (its narrow widths, HE planes and wide ring change) and the FC
/// weight bound to 2^17 (which the layout search both parties run depends on).
pub const VERSION: u32 = 3;
const HELLO_BYTES: usize = 12;
const MAX_CONFIG_BYTES: usize = 1 << 20;
const TAG_BYE: u8 = 0;
const TAG_INFER: u8 = 1;
const TAG_PREPROCESS: u8 = 2;
/// What a server keeps for one session's preprocessed inferences (its masks and triples, and
/// the silent-OT pools filled for them; a BERT-Base inference of 128 tokens needs about 160 MB
/// of material): `VEIL_PREPROCESS_BUDGET_MIB`, 512 MiB when unset. Requests beyond it are
/// refused with a message; the session goes on.
pub fn preprocess_budget() -> usize {
    const DEFAULT_MIB: usize = 512;
    let mib = match std::env::var("VEIL_PREPROCESS_BUDGET_MIB") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                value = v,
                "VEIL_PREPROCESS_BUDGET_MIB is not a number of MiB"
            );
            DEFAULT_MIB
        }),
        Err(_) => DEFAULT_MIB,
    };
    mib << 20
}
const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;

/// How long each step of a session may take on the server (a total per step, not per read).
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// TLS handshake and the client's hello.
    pub handshake: Duration,
    /// Key set-up (BFV keys, base OTs, the first silent-COT bootstrap).
    pub setup: Duration,
    /// Between two requests.
    pub idle: Duration,
    /// One inference: `infer_base` + `infer_per_token` × its tokens (times the load factor the
    /// server passes when sessions share the cores).
    pub infer_base: Duration,
    pub infer_per_token: Duration,
}

impl Deadlines {
    /// Deadlines for a model: the per-token allowance grows with the blocks and the square of
    /// the width (BERT-Base: 18 s per token, so 128 tokens get 39 min, about 4× the measured
    /// time of the original operators and 30× the substituted ones on two cores).
    pub fn for_model(cfg: &ModelConfig) -> Self {
        let width = (cfg.hidden_size as f64 / 768.0).max(1.0 / 16.0);
        let per_token = 1.5 * cfg.num_layers as f64 * width * width;
        Deadlines {
            handshake: Duration::from_secs(10),
            setup: Duration::from_secs(120),
            idle: IDLE_TIMEOUT,
            infer_base: Duration::from_secs(60),
            infer_per_token: Duration::from_secs_f64(per_token.max(0.01)),
        }
    }

    /// These deadlines with the set-up's and each inference's allowance `factor` times longer.
    pub fn stretched(self, factor: u32) -> Self {
        Deadlines {
            setup: self.setup * factor,
            infer_base: self.infer_base * factor,
            infer_per_token: self.infer_per_token * factor,
            ..self
        }
    }

    /// The deadline of one inference of `seq` tokens, stretched by `load` (≥ 1).
    pub fn inference(&self, seq: usize, load: f64) -> Duration {
        (self.infer_base + self.infer_per_token.mul_f64(seq as f64)).mul_f64(load.max(1.0))
    }
}

/// A timed-out step, named.
fn in_step(e: veil_core::Error, step: &str, budget: Duration) -> veil_core::Error {
    match e {
        veil_core::Error::TimedOut(m) => veil_core::Error::TimedOut(format!(
            "{step} did not finish within {:.1} s ({m})",
            budget.as_secs_f64()
        )),
        e => e,
    }
}

/// The client's limits.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientOptions {
    /// The longest prompt (in tokens) this session will send; `None`: the model's limit.
    pub max_tokens: Option<usize>,
    /// Each step (the server's answer to the hello, set-up, one inference) must finish within
    /// this time — an inference within the larger of this and [`Deadlines::for_model`]'s
    /// allowance for its length; `None`: no deadline.
    pub step_timeout: Option<Duration>,
}

/// The fixed-point format of every session (the project defaults; training uses the same).
pub fn session_format() -> FixedPoint {
    FixedPoint::default_format()
}

fn phase<C: Channel>(ch: &C) -> PhaseCost {
    let per_op = ch.meter().by_class();
    ch.meter().reset();
    PhaseCost { per_op }
}

/// The client's end of a session.
pub struct ClientConnection<C: Channel> {
    ch: C,
    cfg: ModelConfig,
    lin: ClientSession,
    ot: OtSession,
    ax: Approx,
    setup: PhaseCost,
    /// The lookup method the server announced (private-embedding mode only).
    lookup: Option<LookupMethod>,
    opts: ClientOptions,
    /// Preprocessed material per sequence length, oldest first, with what making it cost.
    material: HashMap<usize, VecDeque<(ClientMaterial, PhaseCost)>>,
}

/// Where the server's sessions take memory beyond their admitted working set (preprocessed
/// material and filled OT pools): the server's memory for sessions, shared by all of them
/// ([`crate::server`]), so preprocessing cannot push a server past it.
pub trait SessionMemory {
    /// Takes `bytes` if they are free now (never waits); whether it did.
    fn take(&self, bytes: u64) -> bool;
    /// Gives back bytes taken.
    fn give(&self, bytes: u64);
}

/// No memory shared with other sessions (one session, as in tests and `veil demo`): only the
/// session's own preprocessing budget applies.
pub struct UnsharedMemory;

impl SessionMemory for UnsharedMemory {
    fn take(&self, _bytes: u64) -> bool {
        true
    }

    fn give(&self, _bytes: u64) {}
}

/// A party's two silent-OT pools hold about this many bytes per COT (the sender's 16-byte q,
/// the receiver's 16-byte t and its choice bit).
const POOL_BYTES_PER_COT: usize = 33;

/// What a server session holds for its preprocessed inferences: the material's bytes and the OT
/// pools' (against its [`preprocess_budget`], and taken from the server's [`SessionMemory`]),
/// and the COTs reserved for the preprocessed inferences not yet run (in each one's busier
/// direction: one party's sending count is the other's receiving count;
/// [`ServerModel::cots_per_inference`] knows them from the shape). Preprocessing fills both
/// parties' pools to the reservation (the server names the size), as far as the budget's rest
/// allows, so the online phase refills only when the budget is spent; its refills are reported
/// as "OT refill". Everything taken is given back when the session ends, however it ends.
struct Reserve<'a> {
    memory: &'a dyn SessionMemory,
    budget: usize,
    /// Material bytes of the preprocessed inferences not yet run.
    held: usize,
    /// Bytes of the pools as filled so far (they do not shrink during the session).
    pools: usize,
    reserved: u64,
}

impl<'a> Reserve<'a> {
    fn new(budget: usize, memory: &'a dyn SessionMemory) -> Self {
        Reserve {
            memory,
            budget,
            held: 0,
            pools: 0,
            reserved: 0,
        }
    }

    /// Whether this session's budget has room for `bytes` more material (checked before the
    /// inference's COT count is worked out, which may take a while the first time).
    fn room_for(&self, bytes: usize) -> std::result::Result<(), String> {
        if self.held + self.pools + bytes > self.budget {
            return Err(format!(
                "this preprocessing needs {} MiB, and this session holds {} MiB of its {} MiB: \
                 use what is preprocessed first",
                bytes >> 20,
                (self.held + self.pools) >> 20,
                self.budget >> 20
            ));
        }
        Ok(())
    }

    /// Takes one inference drawing `cots` with `bytes` of server material; returns the pool size
    /// to precompute, or why it cannot. `pool_cots(fill)`: what the pools may hold after
    /// precomputing `fill` ([`OtSession::pool_capacity_after`]), nondecreasing in `fill`.
    fn take(
        &mut self,
        cots: u64,
        bytes: usize,
        pool_cots: impl Fn(usize) -> usize,
    ) -> std::result::Result<usize, String> {
        let mib = |b: usize| b >> 20;
        self.room_for(bytes)?;
        let reserved = self.reserved + cots;
        let room = self.budget - self.held - bytes;
        let fits = |fill: usize| pool_cots(fill) * POOL_BYTES_PER_COT <= room;
        let mut fill = reserved.min(OtSession::MAX_PRECOMPUTE as u64) as usize;
        if !fits(fill) {
            // The largest fill whose pools fit (pool_cots(0) = 0 always does).
            let (mut lo, mut hi) = (0, fill);
            while lo < hi {
                let mid = hi - (hi - lo) / 2;
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            fill = lo;
        }
        let pools = self.pools.max(pool_cots(fill) * POOL_BYTES_PER_COT);
        let more = bytes + (pools - self.pools);
        if !self.memory.take(more as u64) {
            return Err(format!(
                "this preprocessing needs {} MiB, and the server's session memory is in use by \
                 other sessions: try again later",
                mib(more)
            ));
        }
        (self.held, self.pools, self.reserved) = (self.held + bytes, pools, reserved);
        Ok(fill)
    }

    /// The inference that used material taken with (`cots`, `bytes`) ran.
    fn ran(&mut self, (cots, bytes): (u64, usize)) {
        self.reserved -= cots;
        self.held -= bytes;
        self.memory.give(bytes as u64);
    }
}

impl Drop for Reserve<'_> {
    fn drop(&mut self) {
        self.memory.give((self.held + self.pools) as u64);
    }
}

/// What the client feeds the encoder: its own embedding (public mode) or token ids.
enum Input<'a> {
    Embedded(&'a RingTensor),
    Ids(&'a [u32], &'a [u32]),
}

impl<C: Channel> ClientConnection<C> {
    /// Response coefficients revealed under this session's fullest key (the server refuses
    /// past [`veil_he::SESSION_REVEALED_LIMIT`]).
    pub fn key_revealed(&self) -> u64 {
        self.lin.most_revealed()
    }

    /// Handshake and set-up.
    pub fn connect(ch: C) -> Result<Self> {
        Self::connect_with(ch, ClientOptions::default(), |_| Ok(()))
    }

    /// Handshake, then `check` on the server's configuration (the caller compares it with its
    /// own bundle and validates its options), then set-up: nothing secret and no key material
    /// moves before the check passes. Each step within `opts.step_timeout`.
    pub fn connect_with(
        mut ch: C,
        opts: ClientOptions,
        check: impl FnOnce(&ModelConfig) -> Result<()>,
    ) -> Result<Self> {
        ch.meter().reset();
        let cfg;
        let lookup;
        let ax = Approx::new(session_format())?;
        let deadline = |ch: &mut C| match opts.step_timeout {
            Some(t) => ch.set_deadline(Some(Instant::now() + t)),
            None => Ok(()),
        };
        let budget = opts.step_timeout.unwrap_or(Duration::MAX);
        let (lin, ot) = {
            let _g = ch.meter().enter("Setup");
            deadline(&mut ch)?;
            let max_tokens = opts.max_tokens.unwrap_or(0);
            ensure!(
                max_tokens <= u32::MAX as usize,
                InvalidArgument,
                "{max_tokens} tokens"
            );
            let mut w = Writer::new();
            w.bytes(MAGIC).u32(VERSION).u32(max_tokens as u32);
            ch.send_msg(&w.finish())?;
            let reply = ch
                .recv_msg(MAX_CONFIG_BYTES)
                .map_err(|e| in_step(e, "the server's answer to the hello", budget))?;
            let (&status, text) = reply
                .split_first()
                .ok_or_else(|| veil_core::Error::Malformed("empty answer to the hello".into()))?;
            let text = std::str::from_utf8(text)
                .map_err(|_| veil_core::Error::Malformed("server answer is not UTF-8".into()))?;
            match status {
                STATUS_OK => {}
                STATUS_REFUSED => bail!(Refused, "the server refused the session: {text}"),
                s => bail!(Malformed, "unknown status {s} in the server's answer"),
            }
            cfg = ModelConfig::from_json(text)?;
            lookup = match cfg.veil.embedding {
                EmbeddingMode::Private => {
                    let tag = ch.recv_msg_exact(1)?;
                    Some(LookupMethod::from_tag(tag[0])?)
                }
                EmbeddingMode::Public => None,
            };
            if let Some(n) = opts.max_tokens {
                ensure!(
                    n <= cfg.max_sequence_len(),
                    InvalidArgument,
                    "{n} tokens requested, but the server's model takes at most {}",
                    cfg.max_sequence_len()
                );
            }
            check(&cfg)?;
            deadline(&mut ch)?;
            let lin = ClientSession::setup(&mut ch, ax.fp.ring)
                .map_err(|e| in_step(e, "set-up", budget))?;
            let ot = OtSession::setup(&mut ch, Role::Client)
                .map_err(|e| in_step(e, "set-up", budget))?;
            (lin, ot)
        };
        let setup = phase(&ch);
        ch.set_deadline(None)?;
        Ok(ClientConnection {
            ch,
            cfg,
            lin,
            ot,
            ax,
            setup,
            lookup,
            opts,
            material: HashMap::new(),
        })
    }

    /// Preprocesses the linear layers of one future inference of `seq` tokens
    /// ([`crate::preprocess`]); the next inference of that length uses it. Returns what it cost
    /// (the offline phase). The server may refuse (its per-session budget,
    /// [`preprocess_budget`]); the session goes on.
    pub fn preprocess(&mut self, seq: usize) -> Result<PhaseCost> {
        self.check_length(seq)?;
        ensure!(
            self.cfg.veil.embedding == EmbeddingMode::Public,
            Unsupported,
            "preprocessing covers public-embedding models only"
        );
        let allowed = self.start_step(seq)?;
        let res = (|| {
            let mut w = Writer::new();
            w.u8(TAG_PREPROCESS).u32(seq as u32);
            self.ch.send_msg(&w.finish())?;
            let reply = self.ch.recv_msg(MAX_CONFIG_BYTES)?;
            let (&status, text) = reply
                .split_first()
                .ok_or_else(|| veil_core::Error::Malformed("empty preprocessing status".into()))?;
            let fill = match status {
                STATUS_OK => {
                    let mut r = Reader::new(text, "preprocessing status");
                    let fill = r.u64()?;
                    r.finish()?;
                    ensure!(
                        fill <= OtSession::MAX_PRECOMPUTE as u64,
                        Malformed,
                        "a pool of {fill} COTs"
                    );
                    fill as usize
                }
                STATUS_REFUSED => bail!(
                    Refused,
                    "the server refused to preprocess: {}",
                    String::from_utf8_lossy(text)
                ),
                s => bail!(Malformed, "unknown preprocessing status {s}"),
            };
            let m = preprocess_client(&mut self.ch, &self.lin, &self.cfg, self.ax.fp.ring, seq)?;
            self.ot.precompute(&mut self.ch, fill)?;
            Ok(m)
        })();
        self.ch.set_deadline(None)?;
        let material =
            res.map_err(|e| in_step(e, "preprocessing", allowed.unwrap_or(Duration::MAX)))?;
        let cost = phase(&self.ch);
        self.material
            .entry(seq)
            .or_default()
            .push_back((material, cost.clone()));
        Ok(cost)
    }

    /// A step of `seq` tokens (an inference or its preprocessing) must fit the model and the
    /// length announced in the hello: the server ends a session that asks for more.
    fn check_length(&self, seq: usize) -> Result<()> {
        ensure!(
            (1..=self.cfg.max_sequence_len()).contains(&seq),
            InvalidArgument,
            "sequence length {seq} outside 1..={}",
            self.cfg.max_sequence_len()
        );
        if let Some(n) = self.opts.max_tokens {
            ensure!(
                seq <= n,
                InvalidArgument,
                "sequence length {seq} above the {n} tokens announced to the server"
            );
        }
        Ok(())
    }

    /// Sets the deadline of a step (an inference or its preprocessing) of `seq` tokens and
    /// returns its allowance: at least the server's own for this length, so a long inference
    /// of a large model is not cut short by a client default meant for the other steps.
    fn start_step(&mut self, seq: usize) -> Result<Option<Duration>> {
        let allowed = self
            .opts
            .step_timeout
            .map(|t| t.max(Deadlines::for_model(&self.cfg).inference(seq, 1.0)));
        if let Some(t) = allowed {
            self.ch.set_deadline(Some(Instant::now() + t))?;
        }
        Ok(allowed)
    }

    /// How many inferences of `seq` tokens are preprocessed and not yet used.
    pub fn preprocessed(&self, seq: usize) -> usize {
        self.material.get(&seq).map_or(0, VecDeque::len)
    }

    /// Whether any preprocessed material is held (work already paid for under these keys).
    pub fn holds_preprocessed(&self) -> bool {
        self.material.values().any(|q| !q.is_empty())
    }

    /// The length at which an input of `seq` rows can use preprocessed material: `seq` when
    /// some of that length is held, else the shortest longer length held if the model's head
    /// lets the client pad (its first-token pooler; see [`Self::infer_padded`]). Material is
    /// never used by an inference of another length.
    pub fn preprocessed_length_for(&self, seq: usize) -> Option<usize> {
        let held = |n: &usize| self.preprocessed(*n) > 0;
        if held(&seq) {
            return Some(seq);
        }
        if self.cfg.veil.head != HeadKind::Pooler {
            return None;
        }
        self.material
            .keys()
            .filter(|&&n| n > seq && held(&n))
            .min()
            .copied()
    }

    /// The model's public configuration, as the server announced it.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Runs one private inference on the client's embedding output `x` ([seq, hidden] at f
    /// fractional bits, computed locally from the public tables). Returns the decoded output
    /// and the cost report of this inference.
    pub fn infer(&mut self, x: &RingTensor) -> Result<(Vec<f64>, CostReport)> {
        let seq = x.shape().first().copied().unwrap_or(0);
        self.infer_padded(x, seq)
    }

    /// [`Self::infer`] on an embedding padded to hide the prompt's length: rows `real_len..`
    /// are padding (any in-domain embedding rows, e.g. of the tokenizer's padding token at the
    /// following positions). The server learns only the padded length; the client masks the
    /// padding keys in every attention on its own, so the output equals the unpadded run's.
    /// Mean-pooling heads average over the rows and cannot be padded this way (the server's
    /// share of a padding row is not the client's to remove): refused.
    pub fn infer_padded(
        &mut self,
        x: &RingTensor,
        real_len: usize,
    ) -> Result<(Vec<f64>, CostReport)> {
        let padded = x.shape().first().copied().unwrap_or(0);
        ensure!(
            (1..=padded).contains(&real_len),
            InvalidArgument,
            "{real_len} real tokens in a sequence of {padded}"
        );
        ensure!(
            real_len == padded || self.cfg.veil.head == HeadKind::Pooler,
            Unsupported,
            "padding needs a first-token (pooler) head; this model mean-pools its outputs"
        );
        ensure!(
            self.lookup.is_none(),
            Unsupported,
            "this model uses private embeddings: pass token ids (infer_ids)"
        );
        ensure!(
            x.ring() == self.ax.fp.ring
                && x.shape().len() == 2
                && x.shape()[1] == self.cfg.hidden_size,
            InvalidArgument,
            "embedding of shape {:?}, expected [seq, {}]",
            x.shape(),
            self.cfg.hidden_size
        );
        self.run(Input::Embedded(x), real_len)
    }

    /// Private-embedding mode: one private inference on token ids (the tables stay with the
    /// server, the ids with the client). Returns the decoded output and the cost report.
    pub fn infer_ids(&mut self, ids: &[u32], type_ids: &[u32]) -> Result<(Vec<f64>, CostReport)> {
        self.infer_ids_padded(ids, type_ids, ids.len())
    }

    /// [`Self::infer_ids`] on ids padded to hide the length: `ids[real_len..]` are padding
    /// tokens (see [`Self::infer_padded`]).
    pub fn infer_ids_padded(
        &mut self,
        ids: &[u32],
        type_ids: &[u32],
        real_len: usize,
    ) -> Result<(Vec<f64>, CostReport)> {
        ensure!(
            self.lookup.is_some(),
            Unsupported,
            "this model uses public embeddings: embed the tokens locally and call infer"
        );
        self.cfg.check_input(ids, type_ids)?;
        ensure!(
            (1..=ids.len()).contains(&real_len)
                && (real_len == ids.len() || self.cfg.veil.head == HeadKind::Pooler),
            InvalidArgument,
            "{real_len} real tokens in a sequence of {} (padding needs a pooler head)",
            ids.len()
        );
        self.run(Input::Ids(ids, type_ids), real_len)
    }

    fn run(&mut self, input: Input<'_>, real_len: usize) -> Result<(Vec<f64>, CostReport)> {
        let seq = match input {
            Input::Embedded(x) => x.shape()[0],
            Input::Ids(ids, _) => ids.len(),
        };
        self.check_length(seq)?;
        let allowed = self.start_step(seq)?;
        let budget = allowed.unwrap_or(Duration::MAX);
        let res = self.run_inner(input, real_len, seq);
        self.ch.set_deadline(None)?;
        res.map_err(|e| in_step(e, "the inference", budget))
    }

    fn run_inner(
        &mut self,
        input: Input<'_>,
        real_len: usize,
        seq: usize,
    ) -> Result<(Vec<f64>, CostReport)> {
        let mut pre = self.material.get_mut(&seq).and_then(VecDeque::pop_front);
        let mut w = Writer::new();
        w.u8(TAG_INFER).u32(seq as u32).u8(pre.is_some() as u8);
        self.ch.send_msg(&w.finish())?;
        let embedded;
        let x = match (input, self.lookup) {
            (Input::Embedded(x), _) => x,
            (Input::Ids(ids, types), Some(method)) => {
                embedded = embed_client(
                    &mut self.ch,
                    &mut self.ot,
                    self.ax,
                    &self.cfg,
                    &self.lin,
                    method,
                    ids,
                    types,
                )?;
                &embedded
            }
            (Input::Ids(..), None) => unreachable!("checked by infer_ids_padded"),
        };
        let y0 = Party {
            ch: &mut self.ch,
            ot: &mut self.ot,
            ax: self.ax,
            cfg: &self.cfg,
            side: Side::Client(&self.lin, real_len),
            pre: pre.as_mut().map(|(m, _)| Pre::Client(m)),
        }
        .encoder_and_head(x)?;
        let y1 = {
            let _g = self.ch.meter().enter("Head");
            let ring = self.ax.fp.ring;
            let msg = self.ch.recv_msg_exact(y0.len() * ring.byte_len())?;
            let mut r = Reader::new(&msg, "output share");
            let v = r.ring_elems(ring, y0.len())?;
            r.finish()?;
            RingTensor::from_vec(ring, y0.shape(), v)?
        };
        let y = y0.add(&y1)?.decode(self.ax.fp);
        let report = CostReport {
            role: Role::Client,
            setup: self.setup.clone(),
            offline: pre.map(|(_, cost)| cost),
            online: phase(&self.ch),
            network: self.ch.network(),
        };
        Ok((y, report))
    }

    /// Ends the session politely.
    pub fn close(mut self) -> Result<()> {
        self.ch.send_msg(&[TAG_BYE])?;
        self.ch.flush()
    }
}

/// Serves one session on `ch` until the client says goodbye or fails.
pub fn serve_session<C: Channel>(ch: C, model: &ServerModel) -> Result<()> {
    let emb = match model.config().veil.embedding {
        EmbeddingMode::Private => Some(ServerEmbedding::new(&model.fixed, DEFAULT_METHOD)?),
        EmbeddingMode::Public => None,
    };
    serve_session_with(ch, model, emb.as_ref())
}

/// [`serve_session`] with the embedding layer given (shared across sessions; required in
/// private-embedding mode, where it also fixes the lookup method). No deadlines, no admission
/// control: the caller's transport and [`crate::server`] add them.
pub fn serve_session_with<C: Channel>(
    mut ch: C,
    model: &ServerModel,
    emb: Option<&ServerEmbedding>,
) -> Result<()> {
    let max_tokens = read_hello(&mut ch)?;
    serve_admitted(
        ch,
        model,
        emb,
        max_tokens,
        &SessionLimits {
            deadlines: None,
            load: &|| 1.0,
            memory: &UnsharedMemory,
        },
        &mut SessionSummary::default(),
    )
}

/// Reads the client's hello; returns the longest prompt it announces (0: the model's limit).
pub fn read_hello<C: Channel>(ch: &mut C) -> Result<usize> {
    // Read a little more than a hello, so that a stranger is named as one.
    let hello = ch.recv_msg(64)?;
    ensure!(
        hello.starts_with(MAGIC),
        Malformed,
        "not a Veil client (its first message is not a Veil hello)"
    );
    let mut r = Reader::new(&hello, "hello");
    r.array::<4>()?;
    let v = r.u32()?;
    ensure!(
        v == VERSION,
        Unsupported,
        "client speaks protocol version {v}, server {VERSION}"
    );
    ensure!(
        hello.len() == HELLO_BYTES,
        Malformed,
        "a hello of {} bytes, expected {HELLO_BYTES}",
        hello.len()
    );
    let max_tokens = r.u32()? as usize;
    r.finish()?;
    Ok(max_tokens)
}

/// Answers a hello with a refusal the client shows its user, and ends the session.
pub fn refuse<C: Channel>(ch: &mut C, reason: &str) -> Result<()> {
    let mut m = vec![STATUS_REFUSED];
    m.extend_from_slice(reason.as_bytes());
    ch.send_msg(&m)?;
    ch.flush()
}

/// What one session did, for the server's log.
#[derive(Clone, Debug, Default)]
pub struct SessionSummary {
    pub inferences: usize,
    pub tokens: usize,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// What bounds a served session besides its announced length.
pub struct SessionLimits<'a> {
    /// Each step's deadline (none without).
    pub deadlines: Option<&'a Deadlines>,
    /// The factor stretching an inference's deadline when sessions share the cores.
    pub load: &'a dyn Fn() -> f64,
    /// Where preprocessing takes its memory from.
    pub memory: &'a dyn SessionMemory,
}

/// Serves an admitted session (its hello read, announcing `max_tokens`, 0 for the model's
/// limit) until the client says goodbye or fails, within `limits`.
pub fn serve_admitted<C: Channel>(
    mut ch: C,
    model: &ServerModel,
    emb: Option<&ServerEmbedding>,
    max_tokens: usize,
    limits: &SessionLimits<'_>,
    summary: &mut SessionSummary,
) -> Result<()> {
    let (deadlines, load) = (limits.deadlines, limits.load);
    let private = model.config().veil.embedding == EmbeddingMode::Private;
    ensure!(
        private == emb.is_some(),
        InvalidArgument,
        "an embedding layer is needed exactly in private-embedding mode"
    );
    let ax = Approx::new(session_format())?;
    ensure!(
        model.fixed.fp() == ax.fp,
        InvalidArgument,
        "model encoded at another fixed-point format"
    );
    let cfg = model.config();
    let limit = match max_tokens {
        0 => cfg.max_sequence_len(),
        n => n.min(cfg.max_sequence_len()),
    };
    let set = |ch: &mut C, d: Option<Duration>| match d {
        Some(d) => ch.set_deadline(Some(Instant::now() + d)),
        None => ch.set_deadline(None),
    };
    let step = |f: fn(&Deadlines) -> Duration| deadlines.map(f);
    let budget = |d: Option<Duration>| d.unwrap_or(Duration::MAX);
    let count = |ch: &C, summary: &mut SessionSummary| {
        let t = ch.meter().total();
        summary.bytes_sent += t.bytes_sent;
        summary.bytes_received += t.bytes_received;
        ch.meter().reset();
    };

    let setup_allowed = deadlines.map(|d| d.setup.mul_f64(load().max(1.0)));
    set(&mut ch, setup_allowed)?;
    let mut hello = vec![STATUS_OK];
    hello.extend_from_slice(cfg.announced().to_json().as_bytes());
    ch.send_msg(&hello)?;
    if let Some(e) = emb {
        ch.send_msg(&[e.method().tag()])?;
    }
    let setup = (|| {
        let lin = ServerSession::setup(&mut ch, ax.fp.ring)?;
        let ot = OtSession::setup(&mut ch, Role::Server)?;
        Ok((lin, ot))
    })();
    let (lin, mut ot) = setup.map_err(|e| in_step(e, "set-up", budget(setup_allowed)))?;
    count(&ch, summary);
    tracing::debug!("set-up done");
    // Per length, oldest first: the material and what it took from the reserve.
    type Held = (ServerMaterial, (u64, usize));
    let mut material: HashMap<usize, VecDeque<Held>> = HashMap::new();
    let mut reserve = Reserve::new(preprocess_budget(), limits.memory);
    loop {
        set(&mut ch, step(|d| d.idle))?;
        let req = match ch.recv_msg(6) {
            Ok(m) => m,
            Err(veil_core::Error::Disconnected) => return Ok(()),
            Err(e) => {
                return Err(in_step(
                    e,
                    "waiting for a request",
                    budget(step(|d| d.idle)),
                ))
            }
        };
        let mut r = Reader::new(&req, "request");
        match r.u8()? {
            TAG_BYE => {
                r.finish()?;
                return Ok(());
            }
            TAG_INFER => {}
            TAG_PREPROCESS => {
                let seq = r.u32()? as usize;
                r.finish()?;
                ensure!(
                    (1..=limit).contains(&seq) && emb.is_none(),
                    Malformed,
                    "preprocessing for {seq} tokens (1..={limit}, public-embedding models only)"
                );
                let steps = plan(cfg, ax.fp.ring, seq)?;
                let bytes = material_bytes(cfg, &steps, false);
                // Refused before the inference's COT count is sampled (a local run of the
                // protocol, the first time a length is asked for).
                let fill = match reserve.room_for(bytes) {
                    Ok(()) => {
                        let cots = model.cots_per_inference(seq)?;
                        let need = cots.0.max(cots.1);
                        let pool_cots = |f| ot.pool_capacity_after(f);
                        reserve.take(need, bytes, pool_cots).map(|f| (f, need))
                    }
                    Err(why) => Err(why),
                };
                let (fill, need) = match fill {
                    Ok(fill) => fill,
                    Err(why) => {
                        let mut reply = vec![STATUS_REFUSED];
                        reply.extend_from_slice(why.as_bytes());
                        ch.send_msg(&reply)?;
                        ch.flush()?;
                        tracing::info!(tokens = seq, why, "preprocessing refused");
                        continue;
                    }
                };
                let mut w = Writer::new();
                w.u8(STATUS_OK).u64(fill as u64);
                ch.send_msg(&w.finish())?;
                let allowed = deadlines.map(|d| d.inference(seq, load()));
                set(&mut ch, allowed)?;
                let made = (|| {
                    let m = preprocess_server(&mut ch, &lin, model, ax.fp.ring, seq, &steps)?;
                    ot.precompute(&mut ch, fill)?;
                    Ok((m, (need, bytes)))
                })()
                .map_err(|e| in_step(e, "preprocessing", budget(allowed)))?;
                material.entry(seq).or_default().push_back(made);
                tracing::info!(
                    tokens = seq,
                    held_bytes = reserve.held + reserve.pools,
                    "preprocessed"
                );
                count(&ch, summary);
                continue;
            }
            t => bail!(Malformed, "unknown request tag {t}"),
        }
        let seq = r.u32()? as usize;
        let use_material = match r.u8()? {
            0 => false,
            1 => true,
            f => bail!(Malformed, "request flag {f}"),
        };
        r.finish()?;
        ensure!(
            (1..=limit).contains(&seq),
            Malformed,
            "requested sequence length {seq} outside 1..={limit} (the model's limit or the \
             length announced in the hello)"
        );
        let mut pre = if use_material {
            let m = material.get_mut(&seq).and_then(VecDeque::pop_front);
            ensure!(
                m.is_some(),
                Malformed,
                "an inference of {seq} tokens asks for preprocessed material the session does \
                 not hold"
            );
            m
        } else {
            None
        };
        let allowed = deadlines.map(|d| d.inference(seq, load()));
        set(&mut ch, allowed)?;
        let started = Instant::now();
        let ots_before = ot.consumed();
        let res = (|| {
            let x1 = match emb {
                Some(e) => embed_server(&mut ch, &mut ot, ax, &lin, &model.fixed, e, seq)?,
                None => RingTensor::zeros(ax.fp.ring, &[seq, cfg.hidden_size])?,
            };
            let y1 = Party {
                ch: &mut ch,
                ot: &mut ot,
                ax,
                cfg,
                side: Side::Server(&lin, model),
                pre: pre.as_mut().map(|(m, _)| Pre::Server(m)),
            }
            .encoder_and_head(&x1)?;
            let mut w = Writer::new();
            w.ring_elems(ax.fp.ring, y1.data());
            ch.send_msg(&w.finish())?;
            ch.flush()
        })();
        res.map_err(|e| in_step(e, &format!("an inference of {seq} tokens"), budget(allowed)))?;
        if let Some((_, taken)) = &pre {
            reserve.ran(*taken);
        }
        let ots_after = ot.consumed();
        let t = ch.meter().total();
        tracing::info!(
            tokens = seq,
            preprocessed = pre.is_some(),
            cots = (ots_after.0 - ots_before.0).max(ots_after.1 - ots_before.1),
            seconds = started.elapsed().as_secs_f64(),
            bytes_sent = t.bytes_sent,
            bytes_received = t.bytes_received,
            flights = t.flights_sent + t.flights_received,
            "inference"
        );
        summary.inferences += 1;
        summary.tokens += seq;
        count(&ch, summary);
    }
}

/// How long a server waits on a silent client between requests before dropping the session.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Accepts clients forever over plain TCP with the default limits of
/// [`crate::server::ServeOptions::for_model`] (for loopback and tests: `veil serve` uses TLS).
pub fn serve(listener: TcpListener, model: Arc<ServerModel>) -> Result<()> {
    serve_with(listener, model, DEFAULT_METHOD)
}

/// Both parties in one process, as [`crate::loopback::LoopbackServer`], but over an in-memory
/// link shaped like `net` (`veil_net::shaped_pair`, on the wall clock), so reports measure the
/// time on `net`.
pub fn shaped_channel(model: Arc<ServerModel>, net: NetworkModel) -> Result<MemChannel> {
    let (client, server) = shaped_pair(net, Arc::new(RealClock::new()))?;
    std::thread::spawn(move || {
        if let Err(e) = serve_session(server, &model) {
            tracing::warn!("the shaped-link server session failed: {e}");
        }
    });
    Ok(client)
}

/// [`serve`] with the lookup method of private-embedding mode chosen (the tables are prepared
/// per sequence length for the few most recently used lengths and shared by all sessions).
pub fn serve_with(
    listener: TcpListener,
    model: Arc<ServerModel>,
    method: LookupMethod,
) -> Result<()> {
    let mut opts = ServeOptions::for_model(&model, Transport::Plaintext);
    opts.method = method;
    Server::new(model, opts)?.run(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretched_deadlines_lengthen_set_up_and_inference_only() {
        let cfg = veil_model::random::Preset::BertTiny.config();
        let d = Deadlines::for_model(&cfg);
        let s = d.stretched(10);
        assert_eq!(s.inference(8, 1.0), d.inference(8, 1.0) * 10);
        assert_eq!(s.setup, d.setup * 10);
        assert_eq!((s.handshake, s.idle), (d.handshake, d.idle));
    }

    /// Preprocessing charges the pools' memory as the pools will hold it: the COTs asked for
    /// while they fit in what the pools hold, the grown buffer (refill iterations included)
    /// once they must grow, with the fill cut to what the budget's rest can hold then.
    #[test]
    fn preprocessing_charges_what_the_pools_allocate() {
        // Pools that hold 1,000 COTs and grow to the need plus 10,000 beyond that.
        let pool_cots = |f: usize| if f <= 1_000 { f } else { f + 10_000 };
        let budget = 100 + POOL_BYTES_PER_COT * 12_000;
        let mut r = Reserve::new(budget, &UnsharedMemory);
        assert_eq!(r.take(800, 100, pool_cots), Ok(800));
        assert_eq!(r.pools, 800 * POOL_BYTES_PER_COT);
        // 1,600 reserved: the pools grow, to 11,600 COTs, which fit.
        assert_eq!(r.take(800, 0, pool_cots), Ok(1_600));
        assert_eq!(r.pools, 11_600 * POOL_BYTES_PER_COT);
        // 2,400 would need 12,400 COTs of pool: the fill is cut to the 2,000 that fit.
        assert_eq!(r.take(800, 0, pool_cots), Ok(2_000));
        assert_eq!(r.pools, 12_000 * POOL_BYTES_PER_COT);
        // Material beyond the budget is refused before anything else.
        assert!(r
            .room_for(1)
            .unwrap_err()
            .contains("use what is preprocessed first"));
    }
}
