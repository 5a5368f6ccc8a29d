//! The client's end of a session ([`ClientConnection`]): the hello and the check of the
//! server's configuration before anything secret moves, the set-up, then preprocessing and
//! inferences on request, each step under a deadline ([`ClientOptions`]). After the server's
//! answer both ends carry the session in records, so a session the server ends early fails
//! here with `Error::PeerClosed`, its reason (shown escaped) rather than a bare disconnection.
//!
//! What the server learns: the sequence length (the request says it). A client hides it by
//! padding (`real_len` of [`ClientConnection::infer`]): it masks the padding keys itself, so the
//! server sees only the padded length. What the client learns: the output (logits, or the
//! pooled vector of an embedding model). In public-embedding mode the client embeds its tokens
//! with the public tables and holds the whole embedding as its share (the server's share is
//! zero), which hides it perfectly and costs no traffic. In private-embedding mode the client
//! sends nothing but encrypted queries: an inference on [`Tokens::Ids`] runs
//! [`crate::embedding`] first (cost line "Embedding").
//!
//! Preprocessed material is kept per length, oldest first; an inference of that length uses
//! the oldest, once, and material a session did not use is dropped with it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use veil_core::approx::Approx;
use veil_core::{bail, ensure, escape_control, CostClass, Result, RingTensor};
use veil_linear::{ClientSession, LookupMethod};
use veil_model::{EmbeddingMode, HeadKind, ModelConfig};
use veil_net::{Channel, Role};
use veil_nonlinear::OtSession;

use crate::deadlines::{in_step, Deadlines};
use crate::embedding::embed_client;
use crate::forward::{Party, Pre, Side};
use crate::prepared::Cuts;
use crate::preprocess::{preprocess_client, ClientMaterial};
use crate::protocol::{
    session_format, Admission, Announced, EmbeddingLookup, Hello, Message, OutputShare,
    PreprocessReply, Request,
};
use crate::report::{CostReport, PhaseCost};

/// The client's limits.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientOptions {
    /// The longest prompt (in tokens) this session will send, announced in the hello: the
    /// server reserves memory for it and refuses longer requests. Required by
    /// [`ClientConnection::connect_with`]; `None` for a [`crate::Client`] means its bundle's
    /// limit.
    pub max_tokens: Option<usize>,
    /// Each step (the server's answer to the hello, set-up, one inference) must finish within
    /// this time — an inference within the larger of this and [`Deadlines::for_model`]'s
    /// allowance for its length; `None`: no deadline.
    pub step_timeout: Option<Duration>,
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
    /// The server's announced GELU bound ([`Announced::activation_bits`]).
    activation_bits: Option<u32>,
    /// The cuts the server's linear layers take ([`Announced::cuts`]).
    cuts: Cuts,
    setup: PhaseCost,
    /// The lookup method the server announced (private-embedding mode only).
    lookup: Option<LookupMethod>,
    opts: ClientOptions,
    /// Preprocessed material per sequence length, oldest first, with what making it cost.
    material: HashMap<usize, VecDeque<(ClientMaterial, PhaseCost)>>,
}

/// What the client feeds the encoder through a session.
#[derive(Clone, Copy, Debug)]
pub enum Tokens<'a> {
    /// Public-embedding mode: its own embedding of the prompt ([seq, hidden] at the session's
    /// fixed-point format, computed locally from the public tables).
    Embedded(&'a RingTensor),
    /// Private-embedding mode: token ids and their segment ids (the tables stay with the
    /// server, the ids with the client).
    Ids(&'a [u32], &'a [u32]),
}

impl<'a> From<&'a RingTensor> for Tokens<'a> {
    fn from(x: &'a RingTensor) -> Self {
        Tokens::Embedded(x)
    }
}

impl<C: Channel> ClientConnection<C> {
    /// Response coefficients revealed under this session's fullest key (the server refuses
    /// past [`veil_he::SESSION_REVEALED_LIMIT`]).
    pub fn key_revealed(&self) -> u64 {
        self.lin.most_revealed()
    }

    /// Handshake and set-up, announcing prompts of at most `max_tokens` tokens.
    pub fn connect(ch: C, max_tokens: usize) -> Result<Self> {
        let opts = ClientOptions {
            max_tokens: Some(max_tokens),
            step_timeout: None,
        };
        Self::connect_with(ch, opts, |_| Ok(()))
    }

    /// Handshake, then `check` on what the server announced (the caller compares its
    /// configuration and bundle digest with its own bundle and validates its options), then
    /// set-up: nothing secret and no key material
    /// moves before the check passes. Each step within `opts.step_timeout`.
    pub fn connect_with(
        mut ch: C,
        opts: ClientOptions,
        check: impl FnOnce(&Announced) -> Result<()>,
    ) -> Result<Self> {
        ch.meter().reset();
        let cfg;
        let lookup;
        let activation_bits;
        let cuts;
        let ax = Approx::new(session_format())?;
        let deadline = |ch: &mut C| match opts.step_timeout {
            Some(t) => ch.set_deadline(Some(Instant::now() + t)),
            None => Ok(()),
        };
        let budget = opts.step_timeout.unwrap_or(Duration::MAX);
        let (lin, ot) = {
            let _g = ch.meter().enter(CostClass::Setup);
            deadline(&mut ch)?;
            let Some(max_tokens) = opts.max_tokens.filter(|&n| n > 0 && n <= u32::MAX as usize)
            else {
                bail!(
                    InvalidArgument,
                    "announce the longest prompt of the session (ClientOptions::max_tokens, at \
                     least 1 token): the server reserves memory for it ({:?} given)",
                    opts.max_tokens
                );
            };
            Hello {
                max_tokens: max_tokens as u32,
            }
            .send(&mut ch)?;
            let admission = Admission::recv(&mut ch)
                .map_err(|e| in_step(e, "the server's answer to the hello", budget))?;
            let announced = match admission {
                Admission::Admitted(a) => a,
                Admission::Refused(why) => bail!(
                    Refused,
                    "the server refused the session: {}",
                    escape_control(&why)
                ),
            };
            // As the server after its answer: a close can now tell this client why.
            ch.start_records()?;
            cfg = announced.config.clone();
            activation_bits = announced.activation_bits;
            cuts = announced.cuts;
            lookup = match cfg.veil.embedding {
                EmbeddingMode::Private => Some(
                    EmbeddingLookup::recv(&mut ch)
                        .map_err(|e| in_step(e, "the server's answer to the hello", budget))?
                        .0,
                ),
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
            check(&announced)?;
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
            activation_bits,
            cuts,
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
            Request::Preprocess { tokens: seq as u32 }.send(&mut self.ch)?;
            let fill = match PreprocessReply::recv(&mut self.ch)? {
                PreprocessReply::Accepted(fill) => fill,
                PreprocessReply::Refused(why) => bail!(
                    Refused,
                    "the server refused to preprocess: {}",
                    escape_control(&why)
                ),
            };
            let m = preprocess_client(
                &mut self.ch,
                &self.lin,
                &self.cfg,
                self.cuts,
                self.ax.fp.ring,
                seq,
            )?;
            fill.apply(&mut self.ot, &mut self.ch)?;
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
    /// lets the client pad (its first-token pooler; see [`Self::infer`]). Material is
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

    /// Runs one private inference on `input` and returns the decoded output (logits, or the
    /// pooled vector of an embedding model) and the cost report of this inference.
    ///
    /// `real_len`: the input is padded to hide the prompt's length, rows (or ids)
    /// `real_len..` being padding (any in-domain rows, e.g. the tokenizer's padding token at
    /// the following positions). The server learns only the padded length; the client masks
    /// the padding keys in every attention on its own, so the output equals the unpadded
    /// run's. Mean-pooling heads average over the rows and cannot be padded this way (the
    /// server's share of a padding row is not the client's to remove): refused.
    pub fn infer<'a>(
        &mut self,
        input: impl Into<Tokens<'a>>,
        real_len: Option<usize>,
    ) -> Result<(Vec<f64>, CostReport)> {
        let input = input.into();
        let sent = match input {
            Tokens::Embedded(x) => x.shape().first().copied().unwrap_or(0),
            Tokens::Ids(ids, _) => ids.len(),
        };
        let real_len = real_len.unwrap_or(sent);
        match input {
            Tokens::Embedded(x) => {
                ensure!(
                    (1..=sent).contains(&real_len),
                    InvalidArgument,
                    "{real_len} real tokens in a sequence of {sent}"
                );
                ensure!(
                    real_len == sent || self.cfg.veil.head == HeadKind::Pooler,
                    Unsupported,
                    "padding needs a first-token (pooler) head; this model mean-pools its \
                     outputs"
                );
                ensure!(
                    self.lookup.is_none(),
                    Unsupported,
                    "this model uses private embeddings: pass token ids (Tokens::Ids)"
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
            }
            Tokens::Ids(ids, type_ids) => {
                ensure!(
                    self.lookup.is_some(),
                    Unsupported,
                    "this model uses public embeddings: embed the tokens locally \
                     (Tokens::Embedded)"
                );
                self.cfg.check_input(ids, type_ids)?;
                ensure!(
                    (1..=sent).contains(&real_len)
                        && (real_len == sent || self.cfg.veil.head == HeadKind::Pooler),
                    InvalidArgument,
                    "{real_len} real tokens in a sequence of {sent} (padding needs a pooler \
                     head)"
                );
            }
        }
        self.run(input, real_len)
    }

    fn run(&mut self, input: Tokens<'_>, real_len: usize) -> Result<(Vec<f64>, CostReport)> {
        let seq = match input {
            Tokens::Embedded(x) => x.shape()[0],
            Tokens::Ids(ids, _) => ids.len(),
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
        input: Tokens<'_>,
        real_len: usize,
        seq: usize,
    ) -> Result<(Vec<f64>, CostReport)> {
        let mut pre = self.material.get_mut(&seq).and_then(VecDeque::pop_front);
        Request::Infer {
            tokens: seq as u32,
            preprocessed: pre.is_some(),
        }
        .send(&mut self.ch)?;
        let embedded;
        let x = match (input, self.lookup) {
            (Tokens::Embedded(x), _) => x,
            (Tokens::Ids(ids, types), Some(method)) => {
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
            (Tokens::Ids(..), None) => unreachable!("checked by infer"),
        };
        let y0 = Party {
            ch: &mut self.ch,
            ot: &mut self.ot,
            ax: self.ax,
            cfg: &self.cfg,
            activation_bits: self.activation_bits,
            cuts: self.cuts,
            side: Side::Client(&self.lin, real_len),
            pre: pre.as_mut().map(|(m, _)| Pre::Client(m)),
        }
        .encoder_and_head(x)?;
        let y1 = {
            let _g = self.ch.meter().enter(CostClass::Head);
            let ring = self.ax.fp.ring;
            let share = OutputShare::recv(&mut self.ch, ring, y0.len())?;
            RingTensor::from_vec(ring, y0.shape(), share.0)?
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
        Request::Goodbye.send(&mut self.ch)?;
        self.ch.flush()
    }
}
