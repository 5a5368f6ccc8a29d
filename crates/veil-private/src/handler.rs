//! The server's end of a session: a handler over the client's typed requests
//! ([`crate::protocol::Request`]). After the hello ([`crate::protocol::Hello`]), the server
//! admits the session, runs the set-up, then answers each request in turn: an inference runs
//! [`crate::forward`] and sends the server's output share; a preprocessing request is priced
//! against the session's reserve ([`crate::reserve`]) and, when it fits, runs
//! [`crate::preprocess`] and fills the silent-OT pools; goodbye ends the session.
//!
//! Every step has a deadline on socket transports ([`crate::Deadlines`]): a total per step,
//! proportional to its work, so a stalled or dripping peer is dropped. No admission control
//! here: [`crate::server`] adds it.
//!
//! From the admission on, both ends carry the session in records (`veil_net::records`), so a
//! session the server ends early is ended with a close record saying why, whatever the client
//! is waiting for at that moment: the malformed message it sent, the deadline that passed and
//! its step, the limit it hit, or the shutdown grace that cut it ([`told`]). The client's
//! receive then fails with `Error::PeerClosed` and shows the reason escaped.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use veil_core::approx::Approx;
use veil_core::{bail, ensure, Error, Result, RingTensor};
use veil_linear::ServerSession;
use veil_model::BundleDigest;
use veil_model::{EmbeddingMode, ModelConfig};
use veil_net::{Channel, Role};
use veil_nonlinear::OtSession;

use crate::deadlines::{in_step, Deadlines};
use crate::embedding::{embed_server, ServerEmbedding, DEFAULT_METHOD};
use crate::forward::{Party, Pre, Side};
use crate::pool_size::CotCounts;
use crate::prepared::ServerModel;
use crate::preprocess::{material_bytes, plan, preprocess_server, ServerMaterial};
use crate::protocol::{
    session_format, Admission, Announced, EmbeddingLookup, Hello, Message, OutputShare,
    PreprocessReply, Request,
};
use crate::reserve::{preprocess_budget, Reserve, SessionMemory, UnsharedMemory};

/// Serves one session on `ch` until the client says goodbye or fails.
pub fn serve_session<C: Channel>(ch: C, model: &ServerModel) -> Result<()> {
    let emb = match model.config().veil.embedding {
        EmbeddingMode::Private => Some(ServerEmbedding::new(model.fixed(), DEFAULT_METHOD)?),
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
    let hello = Hello::recv(&mut ch)?;
    serve_admitted(
        ch,
        model,
        emb,
        hello,
        &SessionLimits {
            deadlines: None,
            load: &|| 1.0,
            memory: &UnsharedMemory,
            cots: &CotCounts::default(),
            bundle: None,
            ended: &|| None,
        },
        &mut SessionSummary::default(),
    )
}

/// What one session did, for the server's log.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionSummary {
    /// Inferences run.
    pub inferences: usize,
    /// Their tokens, summed.
    pub tokens: usize,
    /// Bytes the server sent.
    pub bytes_sent: u64,
    /// Bytes the server received.
    pub bytes_received: u64,
}

/// What bounds a served session besides its announced length, and what it shares with the
/// server's other sessions.
pub(crate) struct SessionLimits<'a> {
    /// Each step's deadline (none without).
    pub deadlines: Option<&'a Deadlines>,
    /// The factor stretching an inference's deadline when sessions share the cores.
    pub load: &'a dyn Fn() -> f64,
    /// Where preprocessing takes its memory from.
    pub memory: &'a dyn SessionMemory,
    /// The COTs an inference draws, per length (sampled once per server).
    pub cots: &'a CotCounts,
    /// The digest of the client bundle this server would export, announced at admission.
    pub bundle: Option<BundleDigest>,
    /// Why the server ended the session from outside (its shutdown grace passed: the
    /// channel's reads were stopped), if it did.
    pub ended: &'a dyn Fn() -> Option<String>,
}

/// Serves an admitted session (its `hello` read) until the client says goodbye or fails,
/// within `limits`; a session ended early is closed telling the client why ([`told`]).
pub(crate) fn serve_admitted<C: Channel>(
    mut ch: C,
    model: &ServerModel,
    emb: Option<&ServerEmbedding>,
    hello: Hello,
    limits: &SessionLimits<'_>,
    summary: &mut SessionSummary,
) -> Result<()> {
    let res = Handler::set_up(&mut ch, model, emb, hello, limits, summary).and_then(Handler::serve);
    let res = match ((limits.ended)(), res) {
        (Some(why), Err(_)) => Err(Error::TimedOut(why)),
        (_, res) => res,
    };
    if let Some(why) = res.as_ref().err().and_then(told) {
        let _ = ch.close_with(&why);
    }
    res
}

/// What the client is told when the server ends its session on `e`: what it sent that was
/// wrong, which deadline passed in which step, which limit it hit. `None` when the client is
/// gone or the transport failed; a fault of the server's own is named as one, its details left
/// in the server's log (they may describe the server's state).
pub(crate) fn told(e: &Error) -> Option<String> {
    match e {
        Error::Disconnected | Error::PeerClosed(_) | Error::Io(_) => None,
        Error::Malformed(_)
        | Error::TooLarge { .. }
        | Error::Unsupported(_)
        | Error::TimedOut(_)
        | Error::Refused(_)
        | Error::Insecure(_) => Some(e.to_string()),
        _ => Some("the server failed on its side (its log has the cause)".into()),
    }
}

fn budget(d: Option<Duration>) -> Duration {
    d.unwrap_or(Duration::MAX)
}

/// Per length, oldest first: the material and what it took from the reserve (COTs, bytes).
type Held = (ServerMaterial, (crate::pool_size::Draw, usize));

/// One admitted session past its set-up.
struct Handler<'a, C: Channel> {
    ch: C,
    model: &'a ServerModel,
    cfg: &'a ModelConfig,
    emb: Option<&'a ServerEmbedding>,
    limits: &'a SessionLimits<'a>,
    summary: &'a mut SessionSummary,
    ax: Approx,
    /// The longest request: the hello's length within the model's limit.
    limit: usize,
    lin: ServerSession,
    ot: OtSession,
    material: HashMap<usize, VecDeque<Held>>,
    reserve: Reserve<'a>,
}

impl<'a, C: Channel> Handler<'a, C> {
    /// Admits the session (the model's public configuration, and in private-embedding mode its
    /// lookup method) and runs the key set-up.
    fn set_up(
        mut ch: C,
        model: &'a ServerModel,
        emb: Option<&'a ServerEmbedding>,
        hello: Hello,
        limits: &'a SessionLimits<'a>,
        summary: &'a mut SessionSummary,
    ) -> Result<Self> {
        let cfg = model.config();
        let private = cfg.veil.embedding == EmbeddingMode::Private;
        ensure!(
            private == emb.is_some(),
            InvalidArgument,
            "an embedding layer is needed exactly in private-embedding mode"
        );
        let ax = Approx::new(session_format())?;
        ensure!(
            model.fixed().fp() == ax.fp,
            InvalidArgument,
            "model encoded at another fixed-point format"
        );
        let limit = match crate::admission::announced_tokens(&hello, cfg.max_sequence_len()) {
            Ok(n) => n,
            Err(why) => {
                let _ = refuse(&mut ch, &why);
                bail!(Refused, "refused: {why}");
            }
        };
        // A fixed total: other sessions' load (an attacker's among them) cannot stretch it.
        let allowed = limits.deadlines.map(|d| d.setup);
        set_deadline(&mut ch, allowed)?;
        Admission::Admitted(Announced {
            config: cfg.announced(),
            bundle: limits.bundle,
            activation_bits: model.fixed().activation_bits(),
            cuts: model.cuts(),
        })
        .send(&mut ch)?;
        // From here on a close can tell the client why (the answer above left unframed).
        ch.start_records()?;
        if let Some(e) = emb {
            EmbeddingLookup(e.method()).send(&mut ch)?;
        }
        let setup = (|| {
            let lin = ServerSession::setup(&mut ch, ax.fp.ring)?;
            let ot = OtSession::setup(&mut ch, Role::Server)?;
            Ok((lin, ot))
        })();
        let (lin, ot) = setup.map_err(|e| in_step(e, "set-up", budget(allowed)))?;
        let mut h = Handler {
            ch,
            model,
            cfg,
            emb,
            limits,
            summary,
            ax,
            limit,
            lin,
            ot,
            material: HashMap::new(),
            reserve: Reserve::new(preprocess_budget(), limits.memory),
        };
        h.count();
        tracing::debug!("set-up done");
        Ok(h)
    }

    /// Answers requests until the client says goodbye or hangs up.
    fn serve(mut self) -> Result<()> {
        loop {
            let idle = self.limits.deadlines.map(|d| d.idle);
            self.set_deadline(idle)?;
            let req = match self.ch.recv_msg(Request::MAX_BYTES) {
                Ok(m) => Request::decode(&m)?,
                Err(Error::Disconnected) => return Ok(()),
                Err(e) => {
                    let step = "waiting for the next request (the idle deadline)";
                    return Err(in_step(e, step, budget(idle)));
                }
            };
            match req {
                Request::Goodbye => return Ok(()),
                Request::Infer {
                    tokens,
                    preprocessed,
                } => self.infer(tokens as usize, preprocessed)?,
                Request::Preprocess { tokens } => self.preprocess(tokens as usize)?,
            }
        }
    }

    fn set_deadline(&mut self, d: Option<Duration>) -> Result<()> {
        set_deadline(&mut self.ch, d)
    }

    /// Adds the traffic since the last count to the summary.
    fn count(&mut self) {
        let t = self.ch.meter().total();
        self.summary.bytes_sent += t.bytes_sent;
        self.summary.bytes_received += t.bytes_received;
        self.ch.meter().reset();
    }

    /// The deadline of a step of `seq` tokens.
    fn step_allowed(&self, seq: usize) -> Option<Duration> {
        (self.limits.deadlines).map(|d| d.inference(seq, (self.limits.load)()))
    }

    /// Answers a preprocessing request: refused (the session goes on) when it does not fit the
    /// reserve, else preprocessed and held for an inference of that length.
    fn preprocess(&mut self, seq: usize) -> Result<()> {
        let limit = self.limit;
        ensure!(
            (1..=limit).contains(&seq) && self.emb.is_none(),
            Malformed,
            "preprocessing for {seq} tokens (1..={limit}, public-embedding models only)"
        );
        let steps = plan(self.cfg, self.ax.fp.ring, seq)?;
        let bytes = material_bytes(self.cfg, &steps, false);
        // Refused before the inference's COT count is sampled (a local run of the protocol,
        // the first time a length is asked for).
        let fill = match self.reserve.room_for(bytes) {
            Ok(()) => {
                let need = self.limits.cots.per_inference(self.model, seq)?;
                let ot = &self.ot;
                let pool_bytes = |ready, built| ot.pool_bytes_for_ready(ready, built);
                (self.reserve.take(need, bytes, pool_bytes)).map(|f| (f, need))
            }
            Err(why) => Err(why),
        };
        let (fill, need) = match fill {
            Ok(fill) => fill,
            Err(why) => {
                PreprocessReply::Refused(why.clone()).send(&mut self.ch)?;
                self.ch.flush()?;
                tracing::info!(tokens = seq, why, "preprocessing refused");
                return Ok(());
            }
        };
        PreprocessReply::Accepted(fill).send(&mut self.ch)?;
        let allowed = self.step_allowed(seq);
        self.set_deadline(allowed)?;
        let made = (|| {
            let (ch, ring) = (&mut self.ch, self.ax.fp.ring);
            let m = preprocess_server(ch, &self.lin, self.model, ring, seq, &steps)?;
            fill.apply(&mut self.ot, ch)?;
            Ok((m, (need, bytes)))
        })()
        .map_err(|e| in_step(e, "preprocessing", budget(allowed)))?;
        self.material.entry(seq).or_default().push_back(made);
        tracing::info!(
            tokens = seq,
            held_bytes = self.reserve.bytes(),
            "preprocessed"
        );
        self.count();
        Ok(())
    }

    /// Runs an inference of `seq` tokens (on preprocessed material when asked) and sends the
    /// server's output share.
    fn infer(&mut self, seq: usize, use_material: bool) -> Result<()> {
        let limit = self.limit;
        ensure!(
            (1..=limit).contains(&seq),
            Malformed,
            "requested sequence length {seq} outside 1..={limit} (the model's limit or the \
             length announced in the hello)"
        );
        let mut pre = if use_material {
            let m = self.material.get_mut(&seq).and_then(VecDeque::pop_front);
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
        let allowed = self.step_allowed(seq);
        self.set_deadline(allowed)?;
        let started = Instant::now();
        let ots_before = self.ot.consumed();
        let (ax, cfg, model) = (self.ax, self.cfg, self.model);
        let res = (|| {
            let (ch, ot) = (&mut self.ch, &mut self.ot);
            let x1 = match self.emb {
                Some(e) => embed_server(ch, ot, ax, &self.lin, model.fixed(), e, seq)?,
                None => RingTensor::zeros(ax.fp.ring, &[seq, cfg.hidden_size])?,
            };
            let y1 = Party {
                ch: &mut *ch,
                ot,
                ax,
                cfg,
                activation_bits: model.fixed().activation_bits(),
                cuts: model.cuts(),
                side: Side::Server(&self.lin, model),
                pre: pre.as_mut().map(|(m, _)| Pre::Server(m)),
            }
            .encoder_and_head(&x1)?;
            OutputShare(y1.data().to_vec()).send(ch, ax.fp.ring)?;
            ch.flush()
        })();
        res.map_err(|e| in_step(e, &format!("an inference of {seq} tokens"), budget(allowed)))?;
        if let Some((_, taken)) = &pre {
            self.reserve.ran(*taken);
        }
        let ots_after = self.ot.consumed();
        let t = self.ch.meter().total();
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
        self.summary.inferences += 1;
        self.summary.tokens += seq;
        self.count();
        Ok(())
    }
}

/// Answers a hello with a refusal the client shows its user, and ends the session.
pub(crate) fn refuse<C: Channel>(ch: &mut C, reason: &str) -> Result<()> {
    Admission::Refused(reason.into()).send(ch)?;
    ch.flush()
}

fn set_deadline<C: Channel>(ch: &mut C, d: Option<Duration>) -> Result<()> {
    match d {
        Some(d) => ch.set_deadline(Some(Instant::now() + d)),
        None => ch.set_deadline(None),
    }
}
