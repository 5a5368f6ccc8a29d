//! The multi-client server: TLS (or, explicitly, plain TCP) on every connection, a bounded number
//! of concurrent sessions and of connections waiting for one, deadlines on every step, a memory
//! estimate checked before a session is admitted, accept errors backed off, structured logs
//! (`tracing`: one span per session with its id and peer) and graceful shutdown.
//!
//! Threads: one accepts; each connection has one thread from its handshake to its end, and there
//! are at most `max_sessions + queue` of them (further connections are closed at once, logged).
//! A connection waits for a session slot for at most `queue_wait`, then gets a refusal its
//! client prints. The heavy work of every session runs on the process's one worker pool
//! (`veil_core::parallel`).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use veil_core::{ensure, Error, Result};
use veil_linear::LookupMethod;
use veil_model::{EmbeddingMode, ModelConfig};
use veil_net::{Channel, Fingerprint, ServerTls, TcpChannel};

use crate::deadlines::Deadlines;
use crate::embedding::{self, ServerEmbedding, DEFAULT_METHOD};
use crate::handler::{refuse, serve_admitted, SessionLimits, SessionSummary};
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
    /// Connections waiting for a session slot, beyond `max_sessions`.
    pub queue: usize,
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
}

/// Bytes kept per session whatever its length: the client's BFV public and Galois keys, the
/// OT pools (one silent-COT buffer per direction) and the base-OT state.
const SESSION_FIXED_BYTES: u64 = 256 << 20;
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

impl ServeOptions {
    /// Defaults for `model`: memory = 80 % of the memory available now (4 GiB if unknown), as
    /// many sessions at the model's longest prompt as fit beside the embedding lookups' share
    /// (1 to 64), a queue of twice that (at least 4) waiting up to 30 s,
    /// [`Deadlines::for_model`].
    pub fn for_model(model: &ServerModel, transport: Transport) -> Self {
        let cfg = model.config();
        let budget = available_memory().map_or(4 << 30, |m| m / 5 * 4);
        let peak = session_memory_estimate(cfg, cfg.max_sequence_len());
        let for_sessions = budget.saturating_sub(embedding::cache_bytes(cfg));
        let max_sessions = (for_sessions / peak).clamp(1, 64) as usize;
        ServeOptions {
            transport,
            max_sessions,
            queue: (2 * max_sessions).max(4),
            queue_wait: Duration::from_secs(30),
            deadlines: Deadlines::for_model(cfg),
            memory_budget: budget,
            shutdown: Arc::new(AtomicBool::new(false)),
            shutdown_grace: Duration::from_secs(60),
            method: DEFAULT_METHOD,
        }
    }
}

#[derive(Default)]
struct Slots {
    active: usize,
    reserved: u64,
    closing: bool,
}

struct Shared {
    model: Arc<ServerModel>,
    emb: Option<ServerEmbedding>,
    opts: ServeOptions,
    /// The memory budget less the embedding lookups' share: what one session may need at most.
    session_memory: u64,
    /// The COTs an inference draws, per length, for preprocessing requests.
    cots: CotCounts,
    slots: Mutex<Slots>,
    freed: Condvar,
    /// Connection threads alive.
    threads: AtomicUsize,
    ended: Condvar,
    ended_lock: Mutex<()>,
}

/// A session slot, given back on drop.
struct Slot<'a> {
    shared: &'a Shared,
    bytes: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut s = self.shared.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.active -= 1;
        s.reserved -= self.bytes;
        self.shared.freed.notify_all();
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
impl SessionMemory for Shared {
    fn take(&self, bytes: u64) -> bool {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let free = s.reserved + bytes <= self.opts.memory_budget && !s.closing;
        if free {
            s.reserved += bytes;
        }
        free
    }

    fn give(&self, bytes: u64) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.reserved -= bytes;
        self.freed.notify_all();
    }
}

impl Shared {
    /// Waits up to `queue_wait` for a slot with `bytes` of session memory.
    fn admit(&self, bytes: u64) -> std::result::Result<Slot<'_>, String> {
        let o = &self.opts;
        let until = Instant::now() + o.queue_wait;
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if s.closing {
                return Err("the server is shutting down".into());
            }
            if s.active < o.max_sessions && s.reserved + bytes <= o.memory_budget {
                s.active += 1;
                s.reserved += bytes;
                return Ok(Slot {
                    shared: self,
                    bytes,
                });
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the server is busy ({} sessions running, at most {}; {} MiB of {} MiB of \
                     session memory in use); waited {:.0} s, try again later",
                    s.active,
                    o.max_sessions,
                    s.reserved >> 20,
                    o.memory_budget >> 20,
                    o.queue_wait.as_secs_f64()
                ));
            }
            s = self
                .freed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Sessions sharing the worker pool stretch each other's deadlines.
    fn load(&self) -> f64 {
        let active = self.slots.lock().map(|s| s.active).unwrap_or(1);
        (active as f64 / veil_core::parallel::threads() as f64).max(1.0)
    }

    fn connection(&self, stream: TcpStream, peer: SocketAddr) -> Result<SessionSummary> {
        let d = &self.opts.deadlines;
        let hs_deadline = Instant::now() + d.handshake;
        let mut ch: Box<dyn Channel> = match &self.opts.transport {
            Transport::Tls(tls) => {
                let ch = tls.accept(stream, hs_deadline).map_err(|e| match e {
                    Error::TimedOut(m) => Error::TimedOut(format!("TLS handshake: {m}")),
                    e => e,
                })?;
                if let Some(fp) = ch.peer_fingerprint() {
                    tracing::info!(client = %fp, "client certificate accepted");
                }
                Box::new(ch)
            }
            Transport::Plaintext => {
                let mut ch = TcpChannel::from_stream(stream)?;
                ch.set_deadline(Some(hs_deadline))?;
                Box::new(ch)
            }
        };
        let hello = Hello::recv(&mut ch).map_err(|e| match e {
            Error::TimedOut(m) => Error::TimedOut(format!("waiting for the hello: {m}")),
            e => e,
        })?;
        let cfg = self.model.config();
        let tokens = match hello.max_tokens as usize {
            0 => cfg.max_sequence_len(),
            n => n.min(cfg.max_sequence_len()),
        };
        let bytes = session_memory_estimate(cfg, tokens);
        if bytes > self.session_memory {
            let why = format!(
                "a session of up to {tokens} tokens needs about {} MiB, more than this server's \
                 session memory ({} MiB): send shorter prompts",
                bytes >> 20,
                self.session_memory >> 20
            );
            let _ = refuse(&mut ch, &why);
            return Err(Error::Other(format!("refused: {why}")));
        }
        // The client waits for our answer while we queue: keep its connection without a
        // deadline of ours until a slot is free (the wait is bounded by `queue_wait`).
        ch.set_deadline(None)?;
        let queued = Instant::now();
        let slot = match self.admit(bytes) {
            Ok(s) => s,
            Err(why) => {
                ch.set_deadline(Some(Instant::now() + d.handshake))?;
                let _ = refuse(&mut ch, &why);
                return Err(Error::Other(format!("refused: {why}")));
            }
        };
        tracing::info!(
            tokens,
            memory_mib = bytes >> 20,
            queued_s = queued.elapsed().as_secs_f64(),
            "admitted"
        );
        let _ = peer;
        let mut summary = SessionSummary::default();
        let res = serve_admitted(
            ch,
            &self.model,
            self.emb.as_ref(),
            hello,
            &SessionLimits {
                deadlines: Some(d),
                load: &|| self.load(),
                memory: self,
                cots: &self.cots,
            },
            &mut summary,
        );
        drop(slot);
        res.map(|()| summary)
    }
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
            EmbeddingMode::Private => Some(ServerEmbedding::new(&model.fixed, opts.method)?),
            EmbeddingMode::Public => None,
        };
        let lookups = embedding::cache_bytes(model.config());
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
                model,
                emb,
                session_memory: opts.memory_budget - lookups,
                cots: CotCounts::default(),
                opts,
                // The embedding lookups' share is reserved for the server's life.
                slots: Mutex::new(Slots {
                    reserved: lookups,
                    ..Slots::default()
                }),
                freed: Condvar::new(),
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
        let thread = std::thread::Builder::new()
            .name("veil-accept".into())
            .spawn(move || self.run(listener))?;
        Ok(RunningServer {
            addr,
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
        let cfg = shared.model.config();
        tracing::info!(
            listen = %listener.local_addr()?,
            max_sessions = o.max_sessions,
            queue = o.queue,
            queue_wait_s = o.queue_wait.as_secs_f64(),
            session_memory_mib = o.memory_budget >> 20,
            peak_per_session_mib =
                session_memory_estimate(cfg, cfg.max_sequence_len()) >> 20,
            max_tokens = cfg.max_sequence_len(),
            "serving"
        );
        listener.set_nonblocking(true)?;
        let mut backoff = Duration::ZERO;
        while !o.shutdown.load(Ordering::SeqCst) {
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
            let limit = o.max_sessions + o.queue;
            if shared.threads.load(Ordering::SeqCst) >= limit {
                tracing::warn!(%peer, limit, "connection closed: sessions and queue full");
                drop(stream);
                continue;
            }
            if let Err(e) = stream.set_nonblocking(false) {
                tracing::warn!(%peer, error = %e, "connection dropped");
                continue;
            }
            let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
            shared.threads.fetch_add(1, Ordering::SeqCst);
            let guard = ThreadGuard(shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("veil-session-{id}"))
                .spawn(move || {
                    let shared = guard.0.clone();
                    let span = tracing::info_span!("session", id, %peer);
                    let _e = span.enter();
                    let started = Instant::now();
                    tracing::info!("connected");
                    let res = shared.connection(stream, peer);
                    let seconds = started.elapsed().as_secs_f64();
                    match res {
                        Ok(s) => tracing::info!(
                            outcome = "ended",
                            seconds,
                            inferences = s.inferences,
                            tokens = s.tokens,
                            bytes_sent = s.bytes_sent,
                            bytes_received = s.bytes_received,
                            "session ended"
                        ),
                        Err(Error::Disconnected) => tracing::info!(
                            outcome = "disconnected",
                            seconds,
                            "the client closed the connection"
                        ),
                        Err(Error::TimedOut(m)) => {
                            tracing::warn!(outcome = "timed out", seconds, "session timed out: {m}")
                        }
                        Err(e) => {
                            tracing::warn!(outcome = "failed", seconds, "session failed: {e}")
                        }
                    }
                    drop(guard);
                });
            if let Err(e) = spawned {
                // The closure (and its guard) was dropped: the count is given back.
                tracing::warn!(%peer, error = %e, "could not start a session thread");
            }
        }
        drop(listener);
        let open = self.connections();
        tracing::info!(
            open,
            grace_s = o.shutdown_grace.as_secs_f64(),
            "shutting down: no longer accepting"
        );
        {
            let mut s = shared.slots.lock().unwrap_or_else(|p| p.into_inner());
            s.closing = true;
            shared.freed.notify_all();
        }
        let until = Instant::now() + o.shutdown_grace;
        let mut l = shared.ended_lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.connections() > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    open = self.connections(),
                    "grace period over: ending open sessions"
                );
                break;
            }
            l = shared
                .ended
                .wait_timeout(l, left.min(Duration::from_millis(200)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
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
        assert!(e(&base, 1) >= 256 && e(&base, 1) < 300);
        assert!(e(&base, 128) > e(&base, 16));
        assert!(e(&base, 128) >= 800, "{} MiB", e(&base, 128));
        assert!(e(&small, 512) >= 2048, "{} MiB", e(&small, 512));
        assert!(e(&base, 512) > e(&small, 512));
        assert!(available_memory().is_some_and(|m| m > 0));
    }
}
