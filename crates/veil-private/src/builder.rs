//! One way to assemble a server, for every front end (`veil serve`, `veil demo`, Python's
//! `veil.Server`, the in-process [`crate::Loopback`]): its identity (a TLS identity kept
//! in a state directory, a fresh one, or plain TCP), its limits (sessions, queue, deadlines,
//! memory, the NTT budget of the prepared weights) and the process settings a server relies on
//! ([`veil_core::process::keep_freed_memory`], without which HE runs 30–60 % slower). What is
//! not set takes [`ServeOptions::for_model`]'s default.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use veil_core::{ensure, Result};
use veil_linear::LookupMethod;
use veil_model::{BundleDigest, ProductTruncation};
use veil_net::{Fingerprint, Identity, ServerTls};

use crate::decoder::ServerDecoder;
use crate::limits::{open_file_limit, MachineCaps, MAX_DEFAULT_SESSIONS};
use crate::prepared::{ServerModel, DEFAULT_NTT_BUDGET_BYTES};
use crate::protocol::AnnouncedTables;
use crate::server::{available_memory, ServeOptions, Server, Transport, DEFAULT_HANDSHAKES};

/// How the server identifies itself to clients.
#[derive(Clone, Debug)]
pub enum ServerIdentity {
    /// TLS 1.3 with the identity kept in this directory (created on first start, key file mode
    /// 0600); `None`: `veil_net::tls::default_state_dir`.
    StateDir(Option<PathBuf>),
    /// TLS 1.3 with a fresh identity that lives in memory only (an in-process server whose
    /// client pins it).
    Ephemeral,
    /// Plain TCP: no authentication, no confidentiality.
    Plaintext,
}

/// Assembles a [`Server`]: identity, limits and process settings.
#[derive(Clone, Debug)]
pub struct ServerBuilder {
    identity: ServerIdentity,
    client_allow: Option<PathBuf>,
    max_sessions: Option<usize>,
    queue: Option<usize>,
    queue_wait: Option<Duration>,
    handshake: Option<Duration>,
    setup: Option<Duration>,
    idle: Option<Duration>,
    handshakes: Option<usize>,
    per_address: Option<usize>,
    shutdown_grace: Option<Duration>,
    memory_budget: Option<u64>,
    ntt_budget: usize,
    slowness: u32,
    shutdown: Option<Arc<AtomicBool>>,
    method: Option<LookupMethod>,
    bundle: Option<BundleDigest>,
    private_tables: bool,
    truncation: Option<ProductTruncation>,
}

impl ServerBuilder {
    /// A server with `identity` and every limit at its default.
    pub fn new(identity: ServerIdentity) -> Self {
        ServerBuilder {
            identity,
            client_allow: None,
            max_sessions: None,
            queue: None,
            queue_wait: None,
            handshake: None,
            setup: None,
            idle: None,
            handshakes: None,
            per_address: None,
            shutdown_grace: None,
            memory_budget: None,
            ntt_budget: DEFAULT_NTT_BUDGET_BYTES,
            slowness: 1,
            shutdown: None,
            method: None,
            bundle: None,
            private_tables: false,
            truncation: None,
        }
    }

    /// The truncations a decoder [`Self::build_named_decoder`] loads runs every session with
    /// ([`ServerDecoder::with_truncation`]; default: [`crate::DEFAULT_DECODER_TRUNCATION`]). An
    /// encoder's mode is its model's (config.json), so [`Self::build`] and
    /// [`Self::build_prepared`] refuse it.
    pub fn decoder_truncation(mut self, truncation: ProductTruncation) -> Self {
        self.truncation = Some(truncation);
        self
    }

    /// A decoder [`Self::build_named_decoder`] loads keeps its token embedding and output
    /// table private ([`ServerDecoder::keep_tables_private`]): clients connect with its
    /// configuration only. An encoder's embedding mode is its model's, so [`Self::build`] and
    /// [`Self::build_prepared`] refuse it.
    pub fn private_tables(mut self, on: bool) -> Self {
        self.private_tables = on;
        self
    }

    /// Require client certificates: a file of allowed fingerprints (TLS identities only).
    pub fn client_allow(mut self, file: Option<PathBuf>) -> Self {
        self.client_allow = file;
        self
    }

    /// Sessions running at once (`None`: [`ServeOptions::for_model`]'s default); the queue then
    /// defaults to twice it, at least 4.
    pub fn max_sessions(mut self, n: Option<usize>) -> Self {
        self.max_sessions = n;
        self
    }

    /// Connections waiting for a session beyond `max_sessions`.
    pub fn queue(mut self, n: Option<usize>) -> Self {
        self.queue = n;
        self
    }

    /// How long a connection waits for a session before it is refused.
    pub fn queue_wait(mut self, d: Duration) -> Self {
        self.queue_wait = Some(d);
        self
    }

    /// The allowance of the TLS handshake and the client's hello.
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake = Some(d);
        self
    }

    /// The allowance of the key set-up once a session is admitted (a fixed total: it is how long
    /// a client that stalls after its hello holds a session slot).
    pub fn setup_timeout(mut self, d: Duration) -> Self {
        self.setup = Some(d);
        self
    }

    /// Connections in their TLS handshake and hello at once (each has a thread until its
    /// handshake deadline).
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.handshakes = Some(n);
        self
    }

    /// Connections from one source address that may be handshaking or queued at once.
    pub fn per_address(mut self, n: usize) -> Self {
        self.per_address = Some(n);
        self
    }

    /// How long a session may stay silent between two requests.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle = Some(d);
        self
    }

    /// How long open sessions get to finish once the shutdown flag is set.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = Some(d);
        self
    }

    /// The flag that stops the server (a signal handler's, say); one of its own otherwise.
    pub fn shutdown_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.shutdown = Some(flag);
        self
    }

    /// Memory for sessions, in bytes (default: 80 % of what is available now).
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// Bytes of NTT-domain weights the prepared model may keep ([`ServerModel::with_ntt_budget`];
    /// a decoder [`Self::build_named_decoder`] loads: [`ServerDecoder::with_ntt_budget`]).
    pub fn ntt_budget(mut self, bytes: usize) -> Self {
        self.ntt_budget = bytes;
        self
    }

    /// Set-up and inferences may take `factor` times the deadlines a remote client gets (an
    /// in-process client on a slow or busy machine: the deadlines guard against peers, not
    /// against this machine).
    pub fn stretch_deadlines(mut self, factor: u32) -> Self {
        self.slowness = factor.max(1);
        self
    }

    /// The lookup method of private-embedding mode.
    pub fn lookup_method(mut self, method: LookupMethod) -> Self {
        self.method = Some(method);
        self
    }

    /// The limits checked before any work (no model needed): zero counts are refused, and
    /// sessions, queue and handshakes are capped by what this machine can hold (the open-file
    /// limit, one descriptor per connection, and the memory for sessions, at least
    /// [`crate::limits::SESSION_FIXED_BYTES`] each), each cap logged with its reason. [`Self::build`] does
    /// this too; call it first to find a bad flag before preparing weights.
    pub fn checked(mut self) -> Result<Self> {
        ensure!(
            self.max_sessions != Some(0),
            InvalidArgument,
            "max sessions 0: at least one session"
        );
        for (v, what) in [
            (self.handshakes, "handshakes"),
            (self.per_address, "connections per address"),
        ] {
            ensure!(v != Some(0), InvalidArgument, "{what} 0: at least one");
        }
        let memory = self
            .memory_budget
            .or_else(|| available_memory().map(|m| m / 5 * 4));
        let caps = MachineCaps {
            files: open_file_limit(),
            memory,
        };
        if let Some(n) = self.max_sessions {
            let (n, why) = caps.sessions(n);
            if let Some(why) = why {
                tracing::warn!("--max-sessions capped to {n}: {why}");
            }
            self.max_sessions = Some(n);
        }
        let sessions = self.max_sessions.unwrap_or(MAX_DEFAULT_SESSIONS);
        let queue = self.queue.unwrap_or((2 * sessions).max(4));
        let handshakes = self.handshakes.unwrap_or(DEFAULT_HANDSHAKES);
        let (queue, handshakes, why) = caps.waiting(sessions, queue, handshakes);
        if let Some(why) = why {
            tracing::warn!("queue capped to {queue}, handshakes to {handshakes}: {why}");
            self.queue = Some(queue);
            self.handshakes = Some(handshakes);
        }
        Ok(self)
    }

    /// Prepares `model`'s weights for HE within the NTT budget, then builds the server, which
    /// announces the digest of the client bundle `veil export-client` would write for `model`
    /// (when it has a tokenizer): clients with another bundle refuse before any key moves.
    pub fn build(self, model: &veil_model::Model) -> Result<Server> {
        let mut this = self.checked()?;
        if model.tokenizer.is_some() {
            let digest = veil_model::manifest::model_digest(model)?;
            tracing::info!(bundle = %digest, "client bundle digest");
            this.bundle = Some(digest);
        }
        let prepared = ServerModel::from_model(model, this.ntt_budget)?;
        let layers = prepared.prepared();
        tracing::info!(
            prepared_mib = layers.prepared_bytes() >> 20,
            ntt_mib = layers.ntt_cached_bytes()? >> 20,
            ntt_budget_mib = this.ntt_budget >> 20,
            "prepared weights (the same for every prompt length)"
        );
        this.build_prepared(Arc::new(prepared))
    }

    /// The server for a model already prepared.
    pub fn build_prepared(self, model: Arc<ServerModel>) -> Result<Server> {
        ensure!(
            !self.private_tables,
            InvalidArgument,
            "private tables are a decoder's setting: an encoder's embedding mode is its model's \
             (config.json's \"veil\" object)"
        );
        ensure!(
            self.truncation.is_none(),
            InvalidArgument,
            "the truncation mode is a decoder server's setting: an encoder's is its model's \
             (config.json's \"product_truncation\")"
        );
        let this = self.checked()?;
        this.build_checked(
            |t| ServeOptions::for_model(&model, t),
            |opts| Server::new(model.clone(), opts),
        )
    }

    /// The server of a decoder: generation sessions ([`crate::GenerationClient`]) under the
    /// same admission, limits, deadlines and transport as an encoder's (the lookup method and
    /// the NTT budget do not apply; clients check the decoder's public tables' digest, which
    /// its admission announces, instead of a bundle's).
    pub fn build_decoder(self, model: Arc<ServerDecoder>) -> Result<Server> {
        // A decoder's settings are its prepared model's; one the builder holds that the model
        // contradicts would otherwise be ignored without a word.
        ensure!(
            self.truncation.is_none_or(|t| t == model.truncation()),
            InvalidArgument,
            "truncation {:?} asked of a decoder prepared for {:?}: set it with \
             ServerDecoder::with_truncation",
            self.truncation,
            model.truncation()
        );
        ensure!(
            !self.private_tables || matches!(model.announced_tables(), AnnouncedTables::Private(_)),
            InvalidArgument,
            "private tables asked of a decoder prepared with open ones: prepare it with \
             ServerDecoder::keep_tables_private"
        );
        let this = self.checked()?;
        tracing::info!(
            prepared_mib = model.prepared_bytes() >> 20,
            ntt_mib = model.ntt_cached_bytes()? >> 20,
            tables = ?model.announced_tables(),
            "prepared decoder"
        );
        this.build_checked(
            |t| ServeOptions::for_decoder(&model, t),
            |opts| Server::decoder(model.clone(), opts),
        )
    }

    /// [`Self::build_decoder`] of the decoder `spec` names ([`veil_model::decoder::load`]), its
    /// weights in the shipped fixed-point format.
    pub fn build_named_decoder(self, spec: &str) -> Result<Server> {
        let m = veil_model::decoder::load(spec)?;
        let fixed = veil_model::FixedDecoder::encode(&m.weights, Default::default())?;
        let mut model = ServerDecoder::with_ntt_budget(fixed, self.ntt_budget)?;
        if self.private_tables {
            model = model.keep_tables_private()?;
        }
        if let Some(t) = self.truncation {
            model = model.with_truncation(t);
        }
        self.build_decoder(Arc::new(model))
    }

    fn build_checked(
        self,
        defaults: impl FnOnce(Transport) -> ServeOptions,
        server: impl FnOnce(ServeOptions) -> Result<Server>,
    ) -> Result<Server> {
        veil_core::process::keep_freed_memory();
        let (transport, fingerprint) = self.transport()?;
        let mut opts = defaults(transport);
        if let Some(n) = self.max_sessions {
            opts.max_sessions = n;
            opts.queue = (2 * n).max(4);
        }
        for (slot, v) in [
            (&mut opts.queue, self.queue),
            (&mut opts.handshakes, self.handshakes),
            (&mut opts.per_address, self.per_address),
        ] {
            if let Some(v) = v {
                *slot = v;
            }
        }
        let set = |slot: &mut Duration, v: Option<Duration>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut opts.queue_wait, self.queue_wait);
        set(&mut opts.deadlines.handshake, self.handshake);
        set(&mut opts.deadlines.setup, self.setup);
        set(&mut opts.deadlines.idle, self.idle);
        set(&mut opts.shutdown_grace, self.shutdown_grace);
        opts.deadlines = opts.deadlines.stretched(self.slowness);
        if let Some(b) = self.memory_budget {
            opts.memory_budget = b;
        }
        if let Some(flag) = self.shutdown {
            opts.shutdown = flag;
        }
        if let Some(m) = self.method {
            opts.method = m;
        }
        opts.bundle = self.bundle;
        Ok(server(opts)?.with_fingerprint(fingerprint))
    }

    fn transport(&self) -> Result<(Transport, Option<Fingerprint>)> {
        let id = match &self.identity {
            ServerIdentity::Plaintext => {
                ensure!(
                    self.client_allow.is_none(),
                    InvalidArgument,
                    "client certificates need TLS, not plain TCP"
                );
                tracing::warn!("plain TCP: connections are neither encrypted nor authenticated");
                return Ok((Transport::Plaintext, None));
            }
            ServerIdentity::Ephemeral => Identity::generate()?,
            ServerIdentity::StateDir(dir) => {
                let dir = match dir {
                    Some(d) => d.clone(),
                    None => veil_net::tls::default_state_dir()?,
                };
                let (id, created) = Identity::load_or_create(&dir)?;
                tracing::info!(
                    state_dir = %dir.display(),
                    created,
                    "TLS identity; clients pin --server-fingerprint {}",
                    id.fingerprint()
                );
                id
            }
        };
        let allowed = match &self.client_allow {
            Some(f) => {
                let set = veil_net::tls::read_fingerprints(f)?;
                tracing::info!(clients = set.len(), file = %f.display(), "client certificates required");
                Some(set)
            }
            None => None,
        };
        let tls = ServerTls::new(&id, allowed)?;
        Ok((Transport::Tls(tls), Some(id.fingerprint())))
    }
}
