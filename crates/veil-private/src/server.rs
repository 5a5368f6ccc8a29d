//! The multi-client server: TLS (or, explicitly, plain TCP) on every connection, a bounded number
//! of concurrent sessions and of connections waiting for one, deadlines on every step, a memory
//! estimate checked before a session is admitted, accept errors backed off, structured logs
//! (`tracing`: one span per session with its id and peer) and graceful shutdown.
//!
//! Admission ([`crate::admission`]): a connection first gets a handshake place (at most
//! `handshakes` at once and `per_address` unadmitted connections per source address; further
//! ones are closed at once, logged) and a thread for the fixed handshake deadline, in which it
//! must finish TLS and send a valid hello. Its hello then reserves the session memory of the
//! length it announces: a session slot now, else a place in the queue, where its socket waits
//! without a thread for at most `queue_wait`, else a refusal saying the server is busy. Every
//! refusal is sent with its reason. Set-up and idle deadlines are fixed totals; only an
//! inference's grows with the sessions sharing the cores. The heavy work of every session runs
//! on the process's one worker pool (`veil_core::parallel`). Sessions still open when the
//! shutdown grace ends are cut: their reads stop (`TcpChannel::stop_reads_on`), and each ends
//! with a close record telling its client so ([`crate::handler`]).

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use veil_core::{ensure, Error, Result};
use veil_linear::LookupMethod;
use veil_model::decoder::DecoderConfig;
use veil_model::BundleDigest;
use veil_model::{EmbeddingMode, ModelConfig};
use veil_net::{Channel, Fingerprint, ServerTls, TcpChannel};

use crate::admission::{announced_tokens, PerAddress, Queue, Waiting};
use crate::deadlines::Deadlines;
use crate::decoder::{
    serve_generation_admitted, step_bytes, Generation, GenerationOptions, ServerDecoder,
};
use crate::embedding::{self, ServerEmbedding, DEFAULT_METHOD};
use crate::handler::{refuse, serve_admitted, SessionLimits, SessionSummary};
use crate::limits::{MAX_DEFAULT_SESSIONS, SESSION_FIXED_BYTES};
use crate::pool_size::CotCounts;
use crate::prepared::ServerModel;
use crate::protocol::{Hello, Message};
use crate::reserve::SessionMemory;

/// How connections are carried.
#[derive(Clone)]
pub enum Transport {
    /// TLS 1.3 with the server's identity (and optionally an allow-list of clients).
    Tls(ServerTls),
    /// Plain TCP: no authentication, no confidentiality (`--insecure-plaintext`; in-process
    /// loopback).
    Plaintext,
}

/// The server's limits and settings.
#[derive(Clone)]
pub struct ServeOptions {
    /// TLS or plain TCP.
    pub transport: Transport,
    /// Sessions running at once.
    pub max_sessions: usize,
    /// Connections waiting for a session slot, beyond `max_sessions` (sockets, no threads).
    pub queue: usize,
    /// Connections in their TLS handshake and hello at once (one thread each, for at most the
    /// handshake deadline).
    pub handshakes: usize,
    /// Connections from one source address not yet in a session (handshaking or queued).
    pub per_address: usize,
    /// How long a connection waits for a slot before it is refused.
    pub queue_wait: Duration,
    /// Each step's allowance.
    pub deadlines: Deadlines,
    /// Memory for sessions, in bytes: admitted sessions' estimates
    /// ([`session_memory_estimate`] at their announced length) stay below it, with the
    /// private-embedding lookups' share ([`embedding::cache_bytes`]) reserved from it first.
    pub memory_budget: u64,
    /// Set to stop accepting; open sessions then get `shutdown_grace` to finish.
    pub shutdown: Arc<AtomicBool>,
    /// How long open sessions may finish after `shutdown`.
    pub shutdown_grace: Duration,
    /// The lookup method of private-embedding mode.
    pub method: LookupMethod,
    /// The digest of the client bundle this server would export, announced to every client,
    /// which refuses a bundle that differs ([`crate::ServerBuilder::build`] sets it).
    pub bundle: Option<BundleDigest>,
}

/// Connections in their handshake at once, by default: each costs a thread for at most the
/// handshake deadline.
pub(crate) const DEFAULT_HANDSHAKES: usize = 256;
/// Unadmitted connections per source address, by default: enough for a host behind one NAT
/// address, a quarter of the handshakes.
pub(crate) const DEFAULT_PER_ADDRESS: usize = 64;

/// How long sessions cut at the end of the shutdown grace get to notice it (at their next
/// read), before they linger for their clients.
const CUT_NOTICE: Duration = Duration::from_secs(1);

/// Bytes per element of a linear layer's widest output while it is under HE (ciphertexts,
/// masks, packed responses).
const BYTES_PER_LINEAR_ELEMENT: u64 = 2000;
/// Bytes per attention score while the attention normalisation runs on OT (COT pads, bits).
const BYTES_PER_SCORE: u64 = 650;

/// A conservative estimate of one session's peak memory on the server at `seq` tokens: the
/// fixed part plus the larger of the linear layers' and the attention's working set (they do not
/// overlap in time). Calibrated so that it stays above the measured peaks (BERT-Base at 128
/// tokens ≈ 0.8 GB above its weights; the default model at 512 tokens ≈ 2.2 GB for the whole
/// process); an estimate, not a bound the code enforces.
pub fn session_memory_estimate(cfg: &ModelConfig, seq: usize) -> u64 {
    let seq = seq as u64;
    let linear =
        seq * cfg.intermediate_size.max(3 * cfg.hidden_size) as u64 * BYTES_PER_LINEAR_ELEMENT;
    let attention = cfg.num_heads as u64 * seq * seq * BYTES_PER_SCORE;
    SESSION_FIXED_BYTES + linear.max(attention)
}

/// The memory the system can still give (`MemAvailable`, else `MemTotal`, from /proc/meminfo).
pub(crate) fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib << 10)
    };
    field("MemAvailable:").or_else(|| field("MemTotal:"))
}

/// Bytes a decoder session keeps whatever its generations: the client's BFV keys at the
/// decoder's ring and the OT session, as an encoder session's fixed part.
const DECODER_SESSION_BYTES: u64 = SESSION_FIXED_BYTES;

/// A decoder session's peak memory at a context cap of `cap` positions: its keys plus what one
/// generation at that cap reserves (its KV cache and a step's working set), which the session
/// takes from the server's session memory when it starts a generation.
pub fn decoder_memory_estimate(cfg: &DecoderConfig, cap: usize) -> u64 {
    DECODER_SESSION_BYTES + (Generation::cache_bytes(cfg, cap) + step_bytes(cfg, cap)) as u64
}

/// What a server serves: an encoder's inferences or a decoder's generations.
pub(crate) enum Served {
    /// An encoder, with its private-embedding lookups in that mode.
    Encoder {
        model: Arc<ServerModel>,
        emb: Option<Box<ServerEmbedding>>,
    },
    /// A decoder LLM: generation sessions ([`crate::decoder`]).
    Decoder(Arc<ServerDecoder>),
}

impl Served {
    /// The longest length a hello may announce: tokens of one prompt, or a decoder's context.
    fn max_tokens(&self) -> usize {
        match self {
            Served::Encoder { model, .. } => model.config().max_sequence_len(),
            Served::Decoder(d) => d.config().max_positions,
        }
    }

    /// The memory a session announcing `tokens` may need at its peak (checked against the
    /// server's session memory at admission), and what its slot reserves: all of it for an
    /// encoder; only the keys for a decoder, whose generations take their cache from the same
    /// session memory when they start (refused then, the session going on, when it is full).
    fn session_bytes(&self, tokens: usize) -> (u64, u64) {
        match self {
            Served::Encoder { model, .. } => {
                let b = session_memory_estimate(model.config(), tokens);
                (b, b)
            }
            Served::Decoder(d) => (
                decoder_memory_estimate(d.config(), tokens),
                DECODER_SESSION_BYTES,
            ),
        }
    }
}

impl ServeOptions {
    /// Defaults for a decoder: as [`Self::for_model`]'s, sessions counted at their keys and one
    /// position, and [`Deadlines::for_decoder`].
    pub fn for_decoder(model: &ServerDecoder, transport: Transport) -> Self {
        let cfg = model.config();
        let budget = available_memory().map_or(4 << 30, |m| m / 5 * 4);
        let max_sessions = (budget / decoder_memory_estimate(cfg, 1))
            .clamp(1, MAX_DEFAULT_SESSIONS as u64) as usize;
        Self::defaults(transport, budget, max_sessions, Deadlines::for_decoder(cfg))
    }

    fn defaults(
        transport: Transport,
        budget: u64,
        max_sessions: usize,
        deadlines: Deadlines,
    ) -> Self {
        ServeOptions {
            transport,
            max_sessions,
            queue: (2 * max_sessions).max(4),
            queue_wait: Duration::from_secs(30),
            handshakes: DEFAULT_HANDSHAKES,
            per_address: DEFAULT_PER_ADDRESS,
            deadlines,
            memory_budget: budget,
            shutdown: Arc::new(AtomicBool::new(false)),
            shutdown_grace: Duration::from_secs(60),
            method: DEFAULT_METHOD,
            bundle: None,
        }
    }

    /// Defaults for `model`: memory = 80 % of the memory available now (4 GiB if unknown), as
    /// many sessions of one token as fit beside the embedding lookups' share (1 to 64: each
    /// session's hello reserves the memory of the length it announces, so memory, not this
    /// count, bounds long sessions; a count sized for the longest prompt would let a few
    /// clients that announce little and go quiet fill every slot), a queue of twice that (at least 4) waiting up to 30 s, [`DEFAULT_HANDSHAKES`]
    /// handshakes and [`DEFAULT_PER_ADDRESS`] per address, [`Deadlines::for_model`].
    pub fn for_model(model: &ServerModel, transport: Transport) -> Self {
        let cfg = model.config();
        let budget = available_memory().map_or(4 << 30, |m| m / 5 * 4);
        let least = session_memory_estimate(cfg, 1);
        let for_sessions = budget.saturating_sub(embedding::cache_bytes(cfg));
        let max_sessions = (for_sessions / least).clamp(1, MAX_DEFAULT_SESSIONS as u64) as usize;
        Self::defaults(transport, budget, max_sessions, Deadlines::for_model(cfg))
    }
}

/// What the server holds for connections, under one lock: session slots and their memory,
/// handshakes, and the queue.
#[derive(Default)]
struct Slots {
    active: usize,
    reserved: u64,
    closing: bool,
    /// Connections in their TLS handshake or hello.
    handshakes: usize,
    /// Connections not yet in a session (handshaking or queued), per source address.
    unadmitted: PerAddress,
    queue: Queue<Ticket>,
}

impl Slots {
    fn fits(&self, o: &ServeOptions, bytes: u64) -> bool {
        self.active < o.max_sessions && self.reserved + bytes <= o.memory_budget
    }

    fn take(&mut self, bytes: u64) {
        self.active += 1;
        self.reserved += bytes;
    }

    fn busy(&self, o: &ServeOptions) -> String {
        format!(
            "the server is busy ({} sessions running, at most {}; {} connections waiting, at \
             most {}; {} MiB of {} MiB of session memory in use): try again later",
            self.active,
            o.max_sessions,
            self.queue.len(),
            o.queue,
            self.reserved >> 20,
            o.memory_budget >> 20,
        )
    }
}

struct Shared {
    served: Served,
    opts: ServeOptions,
    /// The memory budget less the embedding lookups' share: what one session may need at most.
    session_memory: u64,
    /// The COTs an inference draws, per length, for preprocessing requests.
    cots: CotCounts,
    /// Set when the shutdown grace is over: every connection's reads stop, and open sessions
    /// end telling their clients why.
    cut: Arc<AtomicBool>,
    slots: Mutex<Slots>,
    /// Connection threads alive (handshakes and sessions).
    threads: AtomicUsize,
    ended: Condvar,
    ended_lock: Mutex<()>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A session slot, given back on drop; the queue's first connections then get the room.
struct Slot {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut s = self.shared.lock();
            s.active -= 1;
            s.reserved -= self.bytes;
        }
        dispatch(&self.shared);
    }
}

/// A connection not yet in a session: counted against its address (and, while it handshakes,
/// against the handshakes) until dropped.
struct Ticket {
    shared: Arc<Shared>,
    ip: IpAddr,
    handshaking: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        if self.handshaking {
            s.handshakes -= 1;
        }
        s.unadmitted.remove(self.ip);
    }
}

/// Counts a connection thread until it ends.
struct ThreadGuard(Arc<Shared>);

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        self.0.threads.fetch_sub(1, Ordering::SeqCst);
        let _l = self.0.ended_lock.lock();
        self.0.ended.notify_all();
    }
}

/// Preprocessing takes from the same session memory the admitted sessions' estimates do.
impl SessionMemory for Arc<Shared> {
    fn take(&self, bytes: u64) -> bool {
        let mut s = self.lock();
        let free = s.reserved + bytes <= self.opts.memory_budget && !s.closing;
        if free {
            s.reserved += bytes;
        }
        free
    }

    fn give(&self, bytes: u64) {
        self.lock().reserved -= bytes;
        dispatch(self);
    }
}

/// Starts a session for each connection at the head of the queue that now fits.
fn dispatch(shared: &Arc<Shared>) {
    loop {
        let next = {
            let mut s = shared.lock();
            if s.closing {
                return;
            }
            let o = &shared.opts;
            let active = s.active;
            let reserved = s.reserved;
            let w = s
                .queue
                .pop_if(|bytes| active < o.max_sessions && reserved + bytes <= o.memory_budget);
            if let Some(w) = &w {
                s.take(w.bytes);
            }
            w
        };
        let Some(w) = next else { return };
        let slot = Slot {
            shared: shared.clone(),
            bytes: w.bytes,
        };
        let (id, peer) = (w.id, w.peer);
        spawn_logged(shared, id, peer, move |_| {
            let Waiting {
                ch,
                hello,
                tokens,
                bytes,
                since,
                ticket,
                ..
            } = w;
            drop(ticket);
            tracing::info!(queued_s = since.elapsed().as_secs_f64(), "left the queue");
            run_session(ch, hello, tokens, bytes, slot).map(Some)
        });
    }
}

/// Refuses queued connections that have waited their time, and every one when shutting down.
fn expire(shared: &Arc<Shared>) {
    let o = &shared.opts;
    let (gone, why) = {
        let mut s = shared.lock();
        if s.queue.is_empty() {
            return;
        }
        let why = match s.closing {
            true => "the server is shutting down: try again later".to_string(),
            false => format!("{}; waited {:.0} s", s.busy(o), o.queue_wait.as_secs_f64()),
        };
        let gone = match s.closing {
            true => s.queue.drain(),
            false => s.queue.expired(Instant::now(), o.queue_wait),
        };
        (gone, why)
    };
    for mut w in gone {
        let _span = tracing::info_span!("session", id = w.id, peer = %w.peer).entered();
        // A refusal is a few bytes: written at once, or not at all.
        let _ =
            w.ch.set_deadline(Some(Instant::now() + Duration::from_secs(1)));
        let _ = refuse(&mut w.ch, &why);
        tracing::info!(outcome = "refused", "{why}");
    }
}

/// Runs `work` in a connection thread, counted and logged under the session's span.
fn spawn_logged(
    shared: &Arc<Shared>,
    id: u64,
    peer: SocketAddr,
    work: impl FnOnce(&Arc<Shared>) -> Result<Option<SessionSummary>> + Send + 'static,
) {
    shared.threads.fetch_add(1, Ordering::SeqCst);
    let guard = ThreadGuard(shared.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("veil-session-{id}"))
        .spawn(move || {
            let shared = guard.0.clone();
            let span = tracing::info_span!("session", id, %peer);
            let _e = span.enter();
            let started = Instant::now();
            let res = work(&shared);
            let seconds = started.elapsed().as_secs_f64();
            match res {
                Ok(Some(s)) => tracing::info!(
                    outcome = "ended",
                    seconds,
                    inferences = s.inferences,
                    tokens = s.tokens,
                    bytes_sent = s.bytes_sent,
                    bytes_received = s.bytes_received,
                    "session ended"
                ),
                Ok(None) => tracing::info!(outcome = "queued", seconds, "queued"),
                Err(Error::Disconnected) => tracing::info!(
                    outcome = "disconnected",
                    seconds,
                    "the client closed the connection"
                ),
                Err(Error::TimedOut(m)) => {
                    tracing::warn!(outcome = "timed out", seconds, "session timed out: {m}")
                }
                Err(e) => tracing::warn!(outcome = "failed", seconds, "session failed: {e}"),
            }
            drop(guard);
        });
    if let Err(e) = spawned {
        // The closure (its guard, channel, ticket or slot) was dropped: all given back.
        tracing::warn!(%peer, error = %e, "could not start a connection thread");
    }
}

/// A connection's handshake and hello within the fixed handshake deadline, then its admission:
/// a session now, a place in the queue, or a refusal that says why.
fn handshake(
    shared: &Arc<Shared>,
    stream: TcpStream,
    mut ticket: Ticket,
    id: u64,
    peer: SocketAddr,
) -> Result<Option<SessionSummary>> {
    let o = &shared.opts;
    let d = &o.deadlines;
    let hs_deadline = Instant::now() + d.handshake;
    let mut ch: Box<dyn Channel + Send> = match &o.transport {
        Transport::Tls(tls) => {
            let mut ch = tls.accept(stream, hs_deadline).map_err(|e| match e {
                Error::TimedOut(m) => Error::TimedOut(format!("TLS handshake: {m}")),
                e => e,
            })?;
            if let Some(fp) = ch.peer_fingerprint() {
                tracing::info!(client = %fp, "client certificate accepted");
            }
            ch.stop_reads_on(shared.cut.clone());
            Box::new(ch)
        }
        Transport::Plaintext => {
            let mut ch = TcpChannel::from_stream(stream)?;
            ch.set_deadline(Some(hs_deadline))?;
            ch.stop_reads_on(shared.cut.clone());
            Box::new(ch)
        }
    };
    let hello = match Hello::recv(&mut ch) {
        Ok(h) => h,
        Err(Error::TimedOut(m)) => {
            return Err(Error::TimedOut(format!(
                "waiting for the hello: the handshake's {:.1} s passed ({m})",
                d.handshake.as_secs_f64()
            )))
        }
        Err(e @ (Error::Malformed(_) | Error::Unsupported(_))) => {
            let _ = refuse(&mut ch, &e.to_string());
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let refused = |ch: &mut Box<dyn Channel + Send>, why: String| {
        let _ = refuse(ch, &why);
        Err(Error::Refused(format!("refused: {why}")))
    };
    let tokens = match announced_tokens(&hello, shared.served.max_tokens()) {
        Ok(n) => n,
        Err(why) => return refused(&mut ch, why),
    };
    let (peak, bytes) = shared.served.session_bytes(tokens);
    if peak > shared.session_memory {
        let why = format!(
            "a session of up to {tokens} tokens needs about {} MiB, more than this server's \
             session memory ({} MiB): send shorter prompts",
            peak >> 20,
            shared.session_memory >> 20
        );
        return refused(&mut ch, why);
    }
    enum Next {
        Now(Slot),
        Refuse(String),
    }
    let next = {
        let mut s = shared.lock();
        if s.closing {
            Next::Refuse("the server is shutting down: try again later".into())
        } else if s.queue.is_empty() && s.fits(o, bytes) {
            s.take(bytes);
            Next::Now(Slot {
                shared: shared.clone(),
                bytes,
            })
        } else if s.queue.len() < o.queue {
            // The socket waits, not this thread; the client waits for our answer, so no
            // deadline of ours runs meanwhile (the wait is bounded by `queue_wait`).
            s.handshakes -= 1;
            ticket.handshaking = false;
            let _ = ch.set_deadline(None);
            s.queue.push(Waiting {
                ch,
                hello,
                tokens,
                bytes,
                since: Instant::now(),
                id,
                peer,
                ticket,
            });
            return Ok(None);
        } else {
            Next::Refuse(s.busy(o))
        }
    };
    match next {
        Next::Now(slot) => {
            drop(ticket);
            run_session(ch, hello, tokens, bytes, slot).map(Some)
        }
        Next::Refuse(why) => refused(&mut ch, why),
    }
}

/// An admitted session: set-up, then requests until goodbye.
fn run_session(
    ch: Box<dyn Channel + Send>,
    hello: Hello,
    tokens: usize,
    bytes: u64,
    slot: Slot,
) -> Result<SessionSummary> {
    let shared = slot.shared.clone();
    tracing::info!(tokens, memory_mib = bytes >> 20, "admitted");
    let mut summary = SessionSummary::default();
    let load = || {
        let active = shared.lock().active;
        (active as f64 / veil_core::parallel::threads() as f64).max(1.0)
    };
    let ended = || {
        let grace = shared.opts.shutdown_grace.as_secs_f64();
        (shared.cut.load(Ordering::SeqCst)).then(|| {
            format!(
                "the server is shutting down: its grace of {grace:.1} s for open sessions passed"
            )
        })
    };
    let res = match &shared.served {
        Served::Encoder { model, emb } => serve_admitted(
            ch,
            model,
            emb.as_deref(),
            hello,
            &SessionLimits {
                deadlines: Some(&shared.opts.deadlines),
                load: &load,
                memory: &shared,
                cots: &shared.cots,
                bundle: shared.opts.bundle,
                ended: &ended,
            },
            &mut summary,
        ),
        Served::Decoder(model) => {
            let d = &shared.opts.deadlines;
            let opts = GenerationOptions {
                truncation: model.truncation(),
                setup: Some(d.setup),
                idle: Some(d.idle),
                per_block_token: Some(d.infer_per_token / model.config().layers.max(1) as u32),
            };
            serve_generation_admitted(ch, model, &opts, hello, &shared, &ended)
        }
    };
    drop(slot);
    res.map(|()| summary)
}

/// A server ready to accept.
pub struct Server {
    shared: Arc<Shared>,
    /// The fingerprint of its TLS identity, when [`crate::ServerBuilder`] knows it.
    fingerprint: Option<Fingerprint>,
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl Server {
    /// A server of `model` with `opts` (the private-embedding tables encoded here, once).
    pub fn new(model: Arc<ServerModel>, opts: ServeOptions) -> Result<Self> {
        let emb = match model.config().veil.embedding {
            EmbeddingMode::Private => Some(ServerEmbedding::new(model.fixed(), opts.method)?),
            EmbeddingMode::Public => None,
        };
        let lookups = embedding::cache_bytes(model.config());
        let emb = emb.map(Box::new);
        Self::serving(Served::Encoder { model, emb }, opts, lookups)
    }

    /// A server of the decoder `model` with `opts`: its sessions are private generations
    /// ([`crate::GenerationClient`] on the client), admitted as encoder sessions are.
    pub fn decoder(model: Arc<ServerDecoder>, opts: ServeOptions) -> Result<Self> {
        Self::serving(Served::Decoder(model), opts, 0)
    }

    /// A server of `served`, `lookups` bytes of its memory kept for the server's life.
    fn serving(served: Served, opts: ServeOptions, lookups: u64) -> Result<Self> {
        ensure!(
            lookups < opts.memory_budget,
            InvalidArgument,
            "a memory budget of {} MiB leaves nothing for sessions beside the {} MiB the \
             private-embedding lookups may keep",
            opts.memory_budget >> 20,
            lookups >> 20
        );
        Ok(Server {
            shared: Arc::new(Shared {
                served,
                session_memory: opts.memory_budget - lookups,
                cots: CotCounts::default(),
                cut: Arc::new(AtomicBool::new(false)),
                opts,
                // The embedding lookups' share is reserved for the server's life.
                slots: Mutex::new(Slots {
                    reserved: lookups,
                    ..Slots::default()
                }),
                threads: AtomicUsize::new(0),
                ended: Condvar::new(),
                ended_lock: Mutex::new(()),
            }),
            fingerprint: None,
        })
    }

    /// The server, presenting the TLS identity of this fingerprint.
    pub(crate) fn with_fingerprint(mut self, fingerprint: Option<Fingerprint>) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// The fingerprint of its TLS identity (`None` over plain TCP, or when made without
    /// [`crate::ServerBuilder`]).
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.fingerprint
    }

    /// Its limits and settings.
    pub fn options(&self) -> &ServeOptions {
        &self.shared.opts
    }

    /// Connection threads alive now.
    pub fn connections(&self) -> usize {
        self.shared.threads.load(Ordering::SeqCst)
    }

    /// Serves on `listener` from a background thread until [`RunningServer::stop`] (or its
    /// drop) sets the shutdown flag; open sessions then get the grace period to finish.
    pub fn spawn(self, listener: TcpListener) -> Result<RunningServer> {
        let addr = listener.local_addr()?;
        let shutdown = self.shared.opts.shutdown.clone();
        let fingerprint = self.fingerprint;
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("veil-accept".into())
            .spawn(move || self.run(listener))?;
        Ok(RunningServer {
            addr,
            shared,
            fingerprint,
            shutdown,
            thread: Some(thread),
        })
    }

    /// Accepts until the shutdown flag is set, then stops accepting, refuses queued
    /// connections and waits up to the grace period for open sessions.
    pub fn run(&self, listener: TcpListener) -> Result<()> {
        const POLL: Duration = Duration::from_millis(25);
        let shared = &self.shared;
        let o = &shared.opts;
        let max_tokens = shared.served.max_tokens();
        tracing::info!(
            listen = %listener.local_addr()?,
            max_sessions = o.max_sessions,
            queue = o.queue,
            queue_wait_s = o.queue_wait.as_secs_f64(),
            session_memory_mib = o.memory_budget >> 20,
            peak_per_session_mib = shared.served.session_bytes(max_tokens).0 >> 20,
            max_tokens,
            "serving"
        );
        listener.set_nonblocking(true)?;
        let mut backoff = Duration::ZERO;
        while !o.shutdown.load(Ordering::SeqCst) {
            expire(shared);
            let (stream, peer) = match listener.accept() {
                Ok(c) => {
                    backoff = Duration::ZERO;
                    c
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(POLL);
                    continue;
                }
                Err(e) => {
                    // EMFILE, ENFILE, ENOMEM…: wait for resources instead of spinning.
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "accept failed");
                    std::thread::sleep(backoff);
                    continue;
                }
            };
            let ip = peer.ip();
            let full = {
                let mut s = shared.lock();
                if s.handshakes >= o.handshakes {
                    Some("handshakes full")
                } else if !s.unadmitted.try_add(ip, o.per_address) {
                    Some("too many connections from this address waiting")
                } else {
                    s.handshakes += 1;
                    None
                }
            };
            if let Some(why) = full {
                tracing::warn!(%peer, "connection closed: {why}");
                continue;
            }
            let ticket = Ticket {
                shared: shared.clone(),
                ip,
                handshaking: true,
            };
            if let Err(e) = stream.set_nonblocking(false) {
                tracing::warn!(%peer, error = %e, "connection dropped");
                continue;
            }
            let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
            spawn_logged(shared, id, peer, move |shared| {
                tracing::info!("connected");
                handshake(shared, stream, ticket, id, peer)
            });
        }
        drop(listener);
        let open = self.connections();
        tracing::info!(
            open,
            grace_s = o.shutdown_grace.as_secs_f64(),
            "shutting down: no longer accepting"
        );
        shared.lock().closing = true;
        expire(shared);
        if !self.wait_for_connections(Instant::now() + o.shutdown_grace) {
            tracing::warn!(
                open = self.connections(),
                "grace period over: ending open sessions"
            );
            // Each notices at its next read (within 0.1 s if it is waiting for its client),
            // tells its client why, and lingers at most LINGER for the client to hang up.
            shared.cut.store(true, Ordering::SeqCst);
            let ending = CUT_NOTICE + veil_net::LINGER;
            if !self.wait_for_connections(Instant::now() + ending) {
                tracing::warn!(open = self.connections(), "sessions still open: left");
            }
        }
        Ok(())
    }

    /// Waits until every connection thread has ended (true) or `until` passed (false).
    fn wait_for_connections(&self, until: Instant) -> bool {
        let shared = &self.shared;
        let mut l = shared.ended_lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.connections() > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            l = shared
                .ended
                .wait_timeout(l, left.min(Duration::from_millis(200)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// Accepts clients forever over plain TCP with the default limits of
/// [`ServeOptions::for_model`] (for loopback and tests: `veil serve` uses TLS).
pub fn serve(listener: TcpListener, model: Arc<ServerModel>) -> Result<()> {
    let opts = ServeOptions::for_model(&model, Transport::Plaintext);
    Server::new(model, opts)?.run(listener)
}

/// A [`Server`] accepting in a background thread ([`Server::spawn`]).
pub struct RunningServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    fingerprint: Option<Fingerprint>,
    shutdown: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl RunningServer {
    /// The address it listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The fingerprint of its TLS identity ([`Server::fingerprint`]).
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.fingerprint
    }

    /// Connection threads alive now ([`Server::connections`]).
    pub fn connections(&self) -> usize {
        self.shared.threads.load(Ordering::SeqCst)
    }

    /// Whether it is still accepting (false once stopped or failed).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops accepting, refuses queued connections, gives open sessions the grace period, and
    /// returns how the accepting thread ended.
    pub fn stop(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        self.shutdown.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::Other("the server's thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!("the server stopped with an error: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_model::Architecture;

    #[test]
    fn memory_estimate_grows_with_the_prompt_and_the_model() {
        let base = ModelConfig::builder(Architecture::Bert)
            .vocab(100)
            .hidden(768)
            .layers(12)
            .heads(12)
            .ffn(3072)
            .positions(512)
            .build()
            .unwrap();
        let small = ModelConfig::builder(Architecture::Bert)
            .vocab(100)
            .hidden(384)
            .heads(12)
            .ffn(1536)
            .positions(512)
            .build()
            .unwrap();
        let e = |c: &ModelConfig, n| session_memory_estimate(c, n) >> 20;
        // The fixed part (pools and keys) plus one token's working set.
        let fixed = crate::limits::SESSION_FIXED_BYTES >> 20;
        assert!(
            e(&base, 1) >= fixed && e(&base, 1) < fixed + 44,
            "{} MiB",
            e(&base, 1)
        );
        assert!(e(&base, 128) > e(&base, 16));
        assert!(e(&base, 128) >= 800, "{} MiB", e(&base, 128));
        assert!(e(&small, 512) >= 2048, "{} MiB", e(&small, 512));
        assert!(e(&base, 512) > e(&small, 512));
        assert!(available_memory().is_some_and(|m| m > 0));
    }
}
