//! The client as a library: what `veil classify`, `veil demo`, `veil eval` and the Python package
//! all run.
//!
//! * [`ClientModel`] — the client's bundle (public configuration, tokenizer and, in
//!   public-embedding mode, the public embedding tables): prompts are tokenised, checked and
//!   embedded here, before anything is sent;
//! * [`Client`] — a session with a server: it connects, compares the server's configuration with
//!   its bundle before any key material moves, and classifies a batch of texts, sentence pairs
//!   or token ids, returning each [`Classification`] (label, probabilities, cost report) as a
//!   value; made with [`Client::connect_renewing`] it moves to a new session (fresh keys) before
//!   the current keys would reveal more than the server allows;
//! * [`ClientTransport`] — the client's channel to a server address: TLS 1.3 with the server's
//!   fingerprint pinned (or trusted on first use and recorded), or plain TCP when asked for.
//!
//! The pipeline of one prompt: tokenise → pad (`pad_to`) → embed with the public tables (or, in
//! private-embedding mode, send the ids through the private lookup) → the private forward pass
//! ([`ClientConnection`]) → softmax of the revealed logits, on the client.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use veil_core::{bail, ensure, Result};
use veil_model::folder::Model;
use veil_model::source::ModelSource;
use veil_model::ClientBundle;
use veil_model::Encoded;
use veil_model::{EmbeddingMode, HeadKind, Inputs, ModelConfig};
use veil_net::{Channel, ClientTls, Fingerprint, Identity, KnownServers, ServerPin, TcpChannel};

use crate::connection::{ClientConnection, ClientOptions, Tokens};
use crate::key_budget::KeyBudget;
use crate::protocol::{session_format, Announced};
use crate::report::CostReport;

/// exp-normalise in f64 (client-side, on the revealed logits).
pub fn softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// The index of the largest value (the first of equal ones; 0 for an empty slice).
pub fn argmax(v: &[f64]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i)
}

/// One prompt as the caller gives it.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A text.
    Text(&'a str),
    /// A sentence pair (MRPC-style tasks), first then second.
    Pair(&'a str, &'a str),
    /// Token ids, already tokenised (special tokens included).
    Ids(&'a [u32]),
}

/// How the client sends a prompt.
#[derive(Clone, Copy, Debug, Default)]
pub struct PromptOptions {
    /// Send this many tokens whatever the prompt's length (the padding is masked by the client).
    pub pad_to: Option<usize>,
    /// Classify the first tokens of a prompt longer than the model's limit instead of refusing it.
    pub truncate: bool,
}

/// One classified prompt.
#[derive(Clone, Debug)]
pub struct Classification {
    /// The most probable class.
    pub label: usize,
    /// The softmax of the logits the client reconstructed.
    pub probabilities: Vec<f64>,
    /// What this prompt cost (the session's set-up apart).
    pub cost: CostReport,
}

/// What the client holds: its bundle (public configuration, tokenizer and, in public-embedding
/// mode, the public embedding tables; see `veil_model::ClientBundle`), from a bundle folder written by
/// `veil export-client` or the public part of a full model.
pub struct ClientModel {
    bundle: ClientBundle,
    /// The folder it was opened from (named when the server's bundle digest differs).
    source: Option<PathBuf>,
}

impl ClientModel {
    /// A bundle folder, or the public part of a full model folder.
    pub fn open(dir: &Path) -> Result<Self> {
        Ok(ClientModel {
            bundle: ClientBundle::open(dir)?,
            source: Some(dir.to_path_buf()),
        })
    }

    /// The client's model as `--model` names it (`veil_model::source`): a bundle or model
    /// folder as it is, the built-in model (`default`) or an overlay by its public part.
    pub fn named(spec: &str) -> Result<Self> {
        Self::from_source(&ModelSource::resolve(spec)?)
    }

    /// The client's model from a resolved `--model` (a folder is opened without loading its
    /// weights).
    pub fn from_source(source: &ModelSource) -> Result<Self> {
        match source {
            ModelSource::Folder(dir) => Self::open(dir),
            source => Self::from_model(&source.load()?),
        }
    }

    /// The public part of a loaded model.
    pub fn from_model(m: &Model) -> Result<Self> {
        Ok(ClientModel {
            bundle: ClientBundle::from_model(m)?,
            source: None,
        })
    }

    /// The model's public configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.bundle.config
    }

    /// Options that do not depend on the prompt, checked before anything is sent: `pad_to`
    /// needs a first-token (pooler) head and at most the model's limit.
    pub fn check_options(&self, opts: PromptOptions) -> Result<()> {
        let cfg = &self.bundle.config;
        if let Some(n) = opts.pad_to {
            ensure!(
                (1..=cfg.max_sequence_len()).contains(&n),
                InvalidArgument,
                "--pad-to {n}: the model takes 1 to {} tokens",
                cfg.max_sequence_len()
            );
            ensure!(
                cfg.veil.head == HeadKind::Pooler,
                InvalidArgument,
                "--pad-to needs a first-token (pooler) head; this model mean-pools its outputs"
            );
        }
        Ok(())
    }

    /// The server must serve the model this bundle was exported from: the same bundle digest
    /// (when the server announces one: tables, tokenizer and configuration byte for byte) and
    /// the same architecture. Checked before any key material moves.
    pub fn check_server(&self, server: &Announced) -> Result<()> {
        if let Some(theirs) = server.bundle {
            let mine = self.bundle.digest;
            ensure!(
                theirs == mine,
                InvalidArgument,
                "the client bundle {} (SHA-256 {mine}) is not the one the server exports \
                 (SHA-256 {theirs}): the server's model changed or the bundle was altered; \
                 export it again with `veil export-client` from the served model. Nothing was \
                 sent",
                self.source
                    .as_ref()
                    .map_or("built from the model".into(), |p| p.display().to_string())
            );
        }
        ensure!(
            server.config.announced() == self.bundle.config.announced(),
            InvalidArgument,
            "the server's model configuration differs from the client's model folder (another \
             model or version is being served); nothing was sent"
        );
        Ok(())
    }

    /// The token ids `input` is sent as, or why it is refused: an empty prompt, one longer
    /// than the model's limit (unless `opts.truncate`; a pair is cut the longer sentence
    /// first), one longer than `--pad-to`, ids outside the vocabulary, or a prompt of the
    /// other kind than the model was trained on (its config's `veil.inputs`). Checked before
    /// anything is sent, so a refused prompt costs no traffic.
    pub fn encode(&self, input: Input<'_>, opts: PromptOptions) -> Result<Encoded> {
        match input {
            Input::Text(text) => self.encode_text(text, None, opts),
            Input::Pair(first, second) => self.encode_text(first, Some(second), opts),
            Input::Ids(ids) => self.encode_ids(ids, opts),
        }
    }

    /// Refuses a prompt of the other kind than the model was trained on (`pairs`: a sentence
    /// pair), when its config records that.
    fn check_prompt_kind(&self, pairs: bool) -> Result<()> {
        match Inputs::refusal(self.bundle.config.veil.inputs, Inputs::of(pairs)) {
            Some(why) => bail!(InvalidArgument, "{why}"),
            None => Ok(()),
        }
    }

    /// A text, or with `pair` a sentence pair (`[CLS] first [SEP] second [SEP]`, segment ids
    /// 0 then 1, both sentences non-empty), checked and tokenised.
    fn encode_text(&self, text: &str, pair: Option<&str>, opts: PromptOptions) -> Result<Encoded> {
        self.check_prompt_kind(pair.is_some())?;
        ensure!(
            !text.trim().is_empty() && pair.is_none_or(|p| !p.trim().is_empty()),
            InvalidArgument,
            "the prompt is empty: there is no text to classify{}",
            if pair.is_some() {
                " (both sentences of a pair need text)"
            } else {
                ""
            }
        );
        let tok = &self.bundle.tokenizer;
        let enc = tok.encode(text, pair)?;
        ensure!(
            enc.truncated == 0 || opts.truncate,
            InvalidArgument,
            "the prompt has {} tokens, {} more than the model's limit of {}; pass --truncate to \
             classify {}",
            enc.len() + enc.truncated,
            enc.truncated,
            tok.max_len(),
            match pair {
                None => format!("its first {}", tok.max_len()),
                Some(_) => format!("it cut to {} (the longer sentence first)", tok.max_len()),
            }
        );
        self.check_length(&enc, opts)?;
        Ok(enc)
    }

    /// Token ids given by the caller (already tokenised, special tokens included), checked as
    /// a text's: not empty, within the model's vocabulary and limit and within `--pad-to`.
    /// Token types are all 0, so a model trained on sentence pairs refuses them (its second
    /// segment's type is 1).
    fn encode_ids(&self, ids: &[u32], opts: PromptOptions) -> Result<Encoded> {
        self.check_prompt_kind(false)?;
        ensure!(
            !ids.is_empty(),
            InvalidArgument,
            "the prompt is empty: there are no token ids to classify"
        );
        let cfg = &self.bundle.config;
        ensure!(
            ids.len() <= cfg.max_sequence_len(),
            InvalidArgument,
            "the prompt has {} tokens, {} more than the model's limit of {}",
            ids.len(),
            ids.len() - cfg.max_sequence_len(),
            cfg.max_sequence_len()
        );
        let types = vec![0; ids.len()];
        cfg.check_input(ids, &types)?;
        let enc = Encoded {
            ids: ids.to_vec(),
            type_ids: types,
            truncated: 0,
        };
        self.check_length(&enc, opts)?;
        Ok(enc)
    }

    fn check_length(&self, enc: &Encoded, opts: PromptOptions) -> Result<()> {
        if let Some(total) = opts.pad_to {
            ensure!(
                total >= enc.len(),
                InvalidArgument,
                "the prompt has {} tokens, more than --pad-to {total}",
                enc.len()
            );
        }
        Ok(())
    }

    /// The limits a session for `prompts` announces: the longest prompt (or `pad_to`), and
    /// each step within `step_timeout`.
    pub fn session_options(
        &self,
        prompts: &[Encoded],
        opts: PromptOptions,
        step_timeout: Option<Duration>,
    ) -> ClientOptions {
        let longest = prompts.iter().map(|e| e.ids.len()).max().unwrap_or(1);
        ClientOptions {
            max_tokens: Some(opts.pad_to.unwrap_or(longest)),
            step_timeout,
        }
    }

    /// Private inference of an encoded prompt on `conn`: the decoded output (logits, or the
    /// pooled vector of an embedding model) and its cost report.
    ///
    /// `opts.pad_to`: send that many tokens whatever the prompt's length, so the server cannot
    /// learn it (the padding rows embed token 0 at the following positions and are masked by the
    /// client in every attention; see `ClientConnection::infer`).
    fn run<C: Channel>(
        &self,
        conn: &mut ClientConnection<C>,
        enc: &Encoded,
        opts: PromptOptions,
    ) -> Result<(Vec<f64>, CostReport)> {
        let real = enc.ids.len();
        let asked = opts.pad_to.unwrap_or(real);
        // Padded up to preprocessed material's length when the head allows it.
        let total = conn.preprocessed_length_for(asked).unwrap_or(asked);
        ensure!(
            total >= real,
            InvalidArgument,
            "the prompt has {real} tokens, more than --pad-to {total}"
        );
        let mut ids = enc.ids.clone();
        let mut types = enc.type_ids.clone();
        ids.resize(total, 0);
        types.resize(total, 0);
        match self.bundle.config.veil.embedding {
            EmbeddingMode::Public => {
                let x = self.bundle.embed(&ids, &types, session_format())?;
                conn.infer(&x, Some(real))
            }
            EmbeddingMode::Private => conn.infer(Tokens::Ids(&ids, &types), Some(real)),
        }
    }
}

/// Opens a new channel to the same server, for a new session.
pub(crate) type Reconnect<C> = Box<dyn FnMut() -> Result<C> + Send>;

/// A session with a server, on the client's side; with a [`Reconnect`], a series of sessions.
pub struct Client<C: Channel> {
    model: ClientModel,
    /// `None` only between closing a spent session and opening its successor, if that failed.
    conn: Option<ClientConnection<C>>,
    opts: PromptOptions,
    limits: ClientOptions,
    budget: KeyBudget,
    /// Where a new session comes from when this one's keys are nearly spent (`None`: the
    /// caller rotates sessions itself, or meets the server's refusal).
    reconnect: Option<Reconnect<C>>,
    /// What a key may reveal: the server's limit (lower in tests, to reach it).
    key_limit: u64,
    sessions: usize,
}

impl<C: Channel> Client<C> {
    /// Handshake on `ch`, the server's configuration compared with `model`'s before any key
    /// material moves, then set-up. `limits.max_tokens` is announced to the server (`None`: the
    /// bundle's limit); prompts longer than it are refused later.
    pub fn connect(
        model: ClientModel,
        ch: C,
        opts: PromptOptions,
        limits: ClientOptions,
    ) -> Result<Self> {
        model.check_options(opts)?;
        let limits = ClientOptions {
            max_tokens: limits
                .max_tokens
                .or(Some(model.config().max_sequence_len())),
            ..limits
        };
        let conn = ClientConnection::connect_with(ch, limits, |a| model.check_server(a))?;
        Ok(Client {
            model,
            conn: Some(conn),
            opts,
            limits,
            budget: KeyBudget::default(),
            reconnect: None,
            key_limit: veil_he::SESSION_REVEALED_LIMIT,
            sessions: 1,
        })
    }

    /// As [`Self::connect`] on a channel from `reconnect`, which is called again for a new
    /// session (the spent one closed first, then fresh keys) before an inference or a
    /// preprocessing that might not fit in what the current keys may still reveal
    /// ([`Self::key_budget_fits`]): any number of prompts then runs without meeting the server's
    /// refusal. Work preprocessed under the current keys is used first: an inference it covers
    /// does not renew, and preprocessing more while some is held is refused
    /// ([`veil_core::Error::Refused`]) rather than throwing it away.
    pub fn connect_renewing(
        model: ClientModel,
        mut reconnect: impl FnMut() -> Result<C> + Send + 'static,
        opts: PromptOptions,
        limits: ClientOptions,
    ) -> Result<Self> {
        let ch = reconnect()?;
        let mut client = Self::connect(model, ch, opts, limits)?;
        client.reconnect = Some(Box::new(reconnect));
        Ok(client)
    }

    /// Sessions this client has opened (more than one only with [`Self::connect_renewing`]).
    pub fn sessions(&self) -> usize {
        self.sessions
    }

    /// A new session in place of this one when there is none (opening one failed before) or
    /// this one's keys have revealed something and might not cover `len` more tokens of work,
    /// unless that work is `covered` by material preprocessed under them.
    fn renew_if_spent(&mut self, len: usize, covered: bool) -> Result<()> {
        let spent = self.conn.is_none() || (!covered && self.spent_for(len));
        let Some(reconnect) = self.reconnect.as_mut().filter(|_| spent) else {
            return Ok(());
        };
        // Closed first: a server may hold one session per client, and these keys are done.
        if let Some(old) = self.conn.take() {
            if let Err(e) = old.close() {
                tracing::debug!(error = %e, "closing the spent session");
            }
        }
        let model = &self.model;
        let fresh =
            ClientConnection::connect_with(reconnect()?, self.limits, |a| model.check_server(a))?;
        self.conn = Some(fresh);
        self.sessions += 1;
        Ok(())
    }

    /// The client's model (its bundle).
    pub fn model(&self) -> &ClientModel {
        &self.model
    }

    /// How this session sends prompts.
    pub fn options(&self) -> PromptOptions {
        self.opts
    }

    /// Classifies each prompt privately (texts, sentence pairs or token ids, mixed as the
    /// model allows). Every prompt is tokenised and checked before the first is sent, so one
    /// refused prompt costs no traffic. [`Self::classify_ahead`] is the same with
    /// preprocessing ahead and each result handed out as it comes.
    pub fn classify(&mut self, inputs: &[Input<'_>]) -> Result<Vec<Classification>> {
        let mut out = Vec::with_capacity(inputs.len());
        self.classify_ahead(inputs, Ahead::default(), |_, c| {
            out.push(c);
            Ok(())
        })?;
        Ok(out)
    }

    /// Every input encoded and checked (before anything is sent), or the first refusal; a
    /// model without a classifier is refused here too.
    fn encode_all(&self, inputs: &[Input<'_>]) -> Result<Vec<Encoded>> {
        ensure!(
            self.model.config().veil.num_labels > 0,
            InvalidArgument,
            "the model has no classifier (it outputs sentence embeddings)"
        );
        inputs
            .iter()
            .map(|&input| self.model.encode(input, self.opts))
            .collect()
    }

    /// One encoded prompt's classification.
    fn classify_one(&mut self, enc: &Encoded) -> Result<Classification> {
        let (logits, cost) = self.infer(enc)?;
        let probabilities = softmax(&logits);
        Ok(Classification {
            label: argmax(&probabilities),
            probabilities,
            cost,
        })
    }

    /// The raw output of one encoded prompt: logits, or the pooled vector of an embedding model.
    pub fn infer(&mut self, enc: &Encoded) -> Result<(Vec<f64>, CostReport)> {
        let len = self.sent_length(enc);
        let covered =
            (self.conn.as_ref()).is_some_and(|c| c.preprocessed_length_for(len).is_some());
        self.renew_if_spent(len, covered)?;
        let conn = self.conn.as_mut().ok_or_else(no_session)?;
        let before = conn.key_revealed();
        let out = self.model.run(conn, enc, self.opts)?;
        self.budget.record(len, conn.key_revealed() - before);
        Ok(out)
    }

    /// Whether the inference of `enc` is known to fit in what this session's keys may still
    /// reveal ([`crate::key_budget`]). When it is not, the server might refuse part-way and end
    /// the session: a client made by [`Self::connect_renewing`] opens a new one first.
    pub fn key_budget_fits(&self, enc: &Encoded) -> bool {
        self.fits(self.sent_length(enc))
    }

    fn fits(&self, len: usize) -> bool {
        self.budget.fits(self.key_revealed(), len, self.key_limit)
    }

    /// Whether these keys have revealed something and might not cover `len` more tokens of work
    /// (fresh keys always take one inference: the server refuses a key too small for it).
    fn spent_for(&self, len: usize) -> bool {
        self.key_revealed() > 0 && !self.fits(len)
    }

    /// Response coefficients revealed under this session's fullest key so far.
    pub fn key_revealed(&self) -> u64 {
        self.conn.as_ref().map_or(0, ClientConnection::key_revealed)
    }

    /// The length `enc` is sent at.
    fn sent_length(&self, enc: &Encoded) -> usize {
        self.opts.pad_to.unwrap_or(enc.ids.len())
    }

    /// Preprocesses one future inference of `seq` tokens (the length sent: `pad_to`, or the
    /// encoded prompt's); the next prompt sent at that length uses it, and so may a shorter one
    /// if the model's head lets the client pad it (its pooler). Returns the offline cost. A
    /// server over its per-session budget answers [`veil_core::Error::Refused`]; the session
    /// goes on.
    pub fn preprocess(&mut self, seq: usize) -> Result<crate::report::PhaseCost> {
        let holds = (self.conn.as_ref()).is_some_and(ClientConnection::holds_preprocessed);
        if holds && self.spent_for(seq) {
            bail!(
                Refused,
                "this session's keys are nearly spent: no more preprocessing until the next \
                 session"
            );
        }
        self.renew_if_spent(seq, false)?;
        let conn = self.conn.as_mut().ok_or_else(no_session)?;
        let before = conn.key_revealed();
        let cost = conn.preprocess(seq)?;
        self.budget.record(seq, conn.key_revealed() - before);
        Ok(cost)
    }

    /// [`Self::preprocess`] for the length `enc` will be sent at.
    pub fn preprocess_for(&mut self, enc: &Encoded) -> Result<crate::report::PhaseCost> {
        self.preprocess(self.sent_length(enc))
    }

    /// Ends the session politely.
    pub fn close(self) -> Result<()> {
        self.conn.map_or(Ok(()), ClientConnection::close)
    }
}

/// How many prompts a run keeps preprocessed ahead of the one it classifies (`--preprocess K`),
/// and whether the first ones are preprocessed before the first prompt runs (`veil classify`:
/// the prompts are all known) or the first prompt runs at once and each next one is
/// preprocessed while the current result is handed out (`veil demo`: the first answer soon).
#[derive(Clone, Copy, Debug, Default)]
pub struct Ahead {
    /// Prompts kept preprocessed ahead (0: none).
    pub prompts: usize,
    /// Preprocess the first `prompts` before the first prompt runs.
    pub upfront: bool,
}

impl<C: Channel> Client<C> {
    /// Classifies `inputs` in order, each checked before the first is sent, preprocessing as
    /// `ahead` says, and hands each result to `each` (its index and classification) before the
    /// next prompt's preprocessing. A server that refuses to preprocess more (its budget), or a
    /// model preprocessing does not cover, is logged once per session; the rest run without.
    pub fn classify_ahead(
        &mut self,
        inputs: &[Input<'_>],
        ahead: Ahead,
        mut each: impl FnMut(usize, Classification) -> Result<()>,
    ) -> Result<()> {
        let prompts = self.encode_all(inputs)?;
        let mut next = if ahead.upfront { 0 } else { 1 };
        let mut refused = false;
        // A new session (the old one's keys spent) may take preprocessing again.
        let mut session = self.sessions();
        // Preprocesses prompts `from..upto` not yet preprocessed.
        let mut top_up = |client: &mut Self, from: usize, upto: usize| -> Result<()> {
            if client.sessions() != session {
                session = client.sessions();
                refused = false;
            }
            next = next.max(from);
            while next < upto.min(prompts.len()) && !refused {
                match client.preprocess_for(&prompts[next]) {
                    Ok(_) => next += 1,
                    Err(veil_core::Error::Refused(why) | veil_core::Error::Unsupported(why)) => {
                        tracing::warn!("{why}; the next prompts run without preprocessing");
                        refused = true;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        if ahead.upfront {
            top_up(self, 0, ahead.prompts)?;
        }
        for (i, enc) in prompts.iter().enumerate() {
            each(i, self.classify_one(enc)?)?;
            if ahead.prompts > 0 {
                top_up(self, i + 1, i + 1 + ahead.prompts)?;
            }
        }
        Ok(())
    }
}

/// A renewing client whose new session could not be opened; the next prompt tries again.
fn no_session() -> veil_core::Error {
    veil_core::Error::Other(
        "no session: opening a new one (the last one's keys were spent) failed; the next prompt \
         tries again"
            .into(),
    )
}

/// How the client reaches a server over a network.
#[derive(Clone, Debug)]
pub struct ClientTransport {
    /// Accept only the server with this certificate fingerprint.
    pub server_fingerprint: Option<Fingerprint>,
    /// Trust on first use: the file recording each server's fingerprint (default
    /// `known_servers` in [`veil_net::tls::default_state_dir`]), when no fingerprint is given.
    pub known_servers: Option<PathBuf>,
    /// The client's identity directory (created if missing), for servers that require one.
    pub client_identity: Option<PathBuf>,
    /// Plain TCP instead of TLS (the server must say so too).
    pub insecure_plaintext: bool,
    /// The TCP connection and the TLS handshake must finish within this.
    pub connect_timeout: Duration,
}

impl Default for ClientTransport {
    fn default() -> Self {
        ClientTransport {
            server_fingerprint: None,
            known_servers: None,
            client_identity: None,
            insecure_plaintext: false,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl ClientTransport {
    /// The channel to `addr`: TLS with the server pinned (or trusted on first use and
    /// recorded), or plain TCP when asked for. What it creates or trusts is logged.
    pub fn connect(&self, addr: &str) -> Result<Box<dyn Channel + Send>> {
        let stream = veil_net::connect_timeout(addr, self.connect_timeout)?;
        if self.insecure_plaintext {
            tracing::warn!(
                "--insecure-plaintext: the connection is neither encrypted nor authenticated"
            );
            return Ok(Box::new(TcpChannel::from_stream(stream)?));
        }
        let identity = match &self.client_identity {
            Some(dir) => {
                let (id, created) = Identity::load_or_create(dir)?;
                if created {
                    tracing::info!(
                        "created the client identity in {}; its fingerprint (for the server's \
                         --client-allow) is {}",
                        dir.display(),
                        id.fingerprint()
                    );
                }
                Some(id)
            }
            None => None,
        };
        let mut known = None;
        let pin = match (self.server_fingerprint, &self.known_servers) {
            (Some(fp), _) => ServerPin::Fingerprint {
                fp,
                source: "--server-fingerprint".into(),
            },
            (None, file) => {
                let path = match file {
                    Some(p) => p.clone(),
                    None => veil_net::tls::default_state_dir()?.join("known_servers"),
                };
                let k = KnownServers::open(&path)?;
                let pin = match k.get(addr) {
                    Some(fp) => ServerPin::Fingerprint {
                        fp,
                        source: format!(
                            "{} (recorded on first use for {addr}; if the server's key changed \
                             on purpose, delete that line)",
                            path.display()
                        ),
                    },
                    None => ServerPin::FirstUse,
                };
                known = Some(k);
                pin
            }
        };
        let first_use = matches!(pin, ServerPin::FirstUse);
        let tls = ClientTls { pin, identity };
        let ch = tls.connect(stream, Instant::now() + self.connect_timeout)?;
        if let (true, Some(k), Some(fp)) = (first_use, known.as_mut(), ch.peer_fingerprint()) {
            k.record(addr, fp)?;
            tracing::warn!(
                "first connection to {addr}: trusting its key {fp}, recorded in {}",
                k.path().display()
            );
        }
        Ok(Box::new(ch))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use veil_model::{folder, random};

    use super::*;
    use crate::builder::{ServerBuilder, ServerIdentity};
    use crate::prepared::{ServerModel, DEFAULT_NTT_BUDGET_BYTES};

    /// With a key limit that holds two inferences, a renewing client opens a new session before
    /// every third prompt or preprocessing (unless preprocessed material already covers it, or
    /// would be lost), and every answer is the one the first session gave; a client without
    /// `reconnect` stays on its session.
    #[test]
    fn a_renewing_client_opens_a_new_session_before_the_keys_run_out() {
        let tmp = tempfile::tempdir().unwrap();
        random::write_tiny_classifier(tmp.path(), 1, 2, 3).unwrap();
        let model = folder::load(tmp.path()).unwrap();
        let server = Arc::new(ServerModel::from_model(&model, DEFAULT_NTT_BUDGET_BYTES).unwrap());
        let running = ServerBuilder::new(ServerIdentity::Plaintext)
            .build_prepared(server)
            .unwrap()
            .spawn(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .unwrap();
        let addr = running.local_addr();
        let connector = move || TcpChannel::connect(addr);
        let open = || ClientModel::open(tmp.path()).unwrap();
        let mut client = Client::connect_renewing(
            open(),
            connector,
            PromptOptions::default(),
            ClientOptions::default(),
        )
        .unwrap();
        let text = [Input::Text("good film")];
        let first = client.classify(&text).unwrap()[0].probabilities.clone();
        let once = client.key_revealed();
        client.key_limit = 2 * once + once / 2;
        let mut sessions = vec![];
        for _ in 0..4 {
            let got = client.classify(&text).unwrap();
            assert_eq!(got[0].probabilities, first);
            sessions.push(client.sessions());
        }
        assert_eq!(sessions, [1, 2, 2, 3]);
        // Material preprocessed under these keys covers the next prompt: no new session for it.
        let enc = client
            .model()
            .encode(text[0], PromptOptions::default())
            .unwrap();
        client.preprocess_for(&enc).unwrap();
        assert!(!client.key_budget_fits(&enc));
        let got = client.classify(&text).unwrap();
        assert_eq!(got[0].probabilities, first);
        assert!(got[0].cost.offline.is_some());
        assert_eq!(client.sessions(), 3);
        // Preprocessing renews as inference does when nothing preprocessed is held, and is
        // refused, not renewed, while some is (it was paid for under these keys).
        client.preprocess_for(&enc).unwrap();
        assert_eq!(client.sessions(), 4);
        client.preprocess_for(&enc).unwrap();
        let refused = client.preprocess_for(&enc).unwrap_err();
        assert!(matches!(refused, veil_core::Error::Refused(_)), "{refused}");
        for _ in 0..2 {
            let got = client.classify(&text).unwrap();
            assert_eq!(got[0].probabilities, first);
            assert!(got[0].cost.offline.is_some());
        }
        assert_eq!(client.sessions(), 4);
        client.classify(&text).unwrap();
        assert_eq!(client.sessions(), 5);
        client.close().unwrap();

        let mut fixed = Client::connect(
            open(),
            connector().unwrap(),
            PromptOptions::default(),
            ClientOptions::default(),
        )
        .unwrap();
        fixed.key_limit = 1;
        fixed.classify(&text).unwrap();
        fixed.classify(&text).unwrap();
        assert_eq!(fixed.sessions(), 1);
        fixed.close().unwrap();
        running.stop().unwrap();
    }
}
