//! Sessions: the handshake, one-off set-up, and the per-inference exchange.
//!
//! Wire protocol (every message length-prefixed and size-limited, see `veil_net::Channel`):
//! 1. client → server `Hello` = "VEIL" ‖ version (u32);
//! 2. server → client the model's public `config.json` (architecture and operator variants),
//!    and in private-embedding mode one byte naming the lookup method
//!    ([`veil_linear::LookupMethod::tag`]);
//! 3. set-up: the client's BFV public keys (veil-linear), base OTs and the first silent-COT
//!    bootstrap (veil-ot);
//! 4. per inference: client → server `Request` = tag 1 ‖ sequence length (u32); both run
//!    [`crate::forward`]; server → client its share of the output; tag 0 ends the session.
//!
//! What the server learns: the sequence length (the request says it). A client hides it by
//! padding ([`ClientConnection::infer_padded`]): it masks the padding keys itself, so the
//! server sees only the padded length. What the client learns: the output (logits, or the pooled vector of an embedding model).
//! In public-embedding mode the client embeds its tokens with the public tables and holds the
//! whole embedding as its share (the server's share is zero), which hides it perfectly and
//! costs no traffic. In private-embedding mode the client sends nothing but encrypted queries:
//! [`ClientConnection::infer_ids`] runs [`crate::embedding`] first (cost line "Embedding").

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use veil_core::approx::Approx;
use veil_core::wire::{Reader, Writer};
use veil_core::{bail, ensure, FixedPoint, Result, RingTensor};
use veil_linear::{ClientSession, LookupMethod, ServerSession};
use veil_model::{EmbeddingMode, HeadKind, ModelConfig};
use veil_net::{shaped_pair, Channel, MemChannel, NetworkModel, RealClock, Role, TcpChannel};
use veil_nonlinear::OtSession;

use crate::embedding::{embed_client, embed_server, ServerEmbedding, DEFAULT_METHOD};
use crate::forward::{Party, Side};
use crate::prepared::ServerModel;
use crate::report::{CostReport, PhaseCost};

const MAGIC: &[u8; 4] = b"VEIL";
const VERSION: u32 = 1;
const MAX_CONFIG_BYTES: usize = 1 << 20;
const TAG_BYE: u8 = 0;
const TAG_INFER: u8 = 1;

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
}

/// What the client feeds the encoder: its own embedding (public mode) or token ids.
enum Input<'a> {
    Embedded(&'a RingTensor),
    Ids(&'a [u32], &'a [u32]),
}

impl<C: Channel> ClientConnection<C> {
    /// Handshake and set-up.
    pub fn connect(mut ch: C) -> Result<Self> {
        ch.meter().reset();
        let cfg;
        let lookup;
        let ax = Approx::new(session_format())?;
        let (lin, ot) = {
            let _g = ch.meter().enter("Setup");
            let mut w = Writer::new();
            w.bytes(MAGIC).u32(VERSION);
            ch.send_msg(&w.finish())?;
            let text = ch.recv_msg(MAX_CONFIG_BYTES)?;
            let text = std::str::from_utf8(&text)
                .map_err(|_| veil_core::Error::Malformed("server config is not UTF-8".into()))?;
            cfg = ModelConfig::from_json(text)?;
            lookup = match cfg.veil.embedding {
                EmbeddingMode::Private => Some(LookupMethod::from_tag(
                    *ch.recv_msg_exact(1)?.first().expect("one byte"),
                )?),
                EmbeddingMode::Public => None,
            };
            let lin = ClientSession::setup(&mut ch, ax.fp.ring)?;
            let ot = OtSession::setup(&mut ch, Role::Client)?;
            (lin, ot)
        };
        let setup = phase(&ch);
        Ok(ClientConnection {
            ch,
            cfg,
            lin,
            ot,
            ax,
            setup,
            lookup,
        })
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
        ensure!(
            (1..=self.cfg.max_sequence_len()).contains(&seq),
            InvalidArgument,
            "sequence length {seq} outside 1..={}",
            self.cfg.max_sequence_len()
        );
        let mut w = Writer::new();
        w.u8(TAG_INFER).u32(seq as u32);
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
/// private-embedding mode, where it also fixes the lookup method).
pub fn serve_session_with<C: Channel>(
    mut ch: C,
    model: &ServerModel,
    emb: Option<&ServerEmbedding>,
) -> Result<()> {
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
    let hello = ch.recv_msg(8)?;
    let mut r = Reader::new(&hello, "hello");
    ensure!(&r.array::<4>()? == MAGIC, Malformed, "not a Veil client");
    let v = r.u32()?;
    r.finish()?;
    ensure!(
        v == VERSION,
        Unsupported,
        "client speaks protocol version {v}, server {VERSION}"
    );
    ch.send_msg(model.config().to_json().as_bytes())?;
    if let Some(e) = emb {
        ch.send_msg(&[e.method().tag()])?;
    }
    let lin = ServerSession::setup(&mut ch, ax.fp.ring)?;
    let mut ot = OtSession::setup(&mut ch, Role::Server)?;
    loop {
        let req = match ch.recv_msg(5) {
            Ok(m) => m,
            Err(veil_core::Error::Disconnected) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut r = Reader::new(&req, "request");
        match r.u8()? {
            TAG_BYE => {
                r.finish()?;
                return Ok(());
            }
            TAG_INFER => {}
            t => bail!(Malformed, "unknown request tag {t}"),
        }
        let seq = r.u32()? as usize;
        r.finish()?;
        let cfg = model.config();
        ensure!(
            (1..=cfg.max_sequence_len()).contains(&seq),
            Malformed,
            "requested sequence length {seq} outside 1..={}",
            cfg.max_sequence_len()
        );
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
        }
        .encoder_and_head(&x1)?;
        let mut w = Writer::new();
        w.ring_elems(ax.fp.ring, y1.data());
        ch.send_msg(&w.finish())?;
        ch.flush()?;
        ch.meter().reset();
    }
}

/// How long a server waits on a silent client before dropping the session.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Accepts clients forever, one thread per session; a failing session is logged and dropped,
/// the others go on.
pub fn serve(listener: TcpListener, model: Arc<ServerModel>) -> Result<()> {
    serve_with(listener, model, DEFAULT_METHOD)
}

/// A server for `model` on a thread of this process, on a TCP loopback port, and a client
/// session connected to it: both parties in one process (`veil demo`, `veil eval`), over the
/// same transport as a real deployment.
pub fn connect_loopback(model: Arc<ServerModel>) -> Result<ClientConnection<TcpChannel>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || serve(listener, model));
    ClientConnection::connect(TcpChannel::connect(addr)?)
}

/// Both parties in one process, as [`connect_loopback`], but over an in-memory link shaped like
/// `net` (`veil_net::shaped_pair`, on the wall clock), so reports measure the time on `net`.
pub fn connect_shaped(
    model: Arc<ServerModel>,
    net: NetworkModel,
) -> Result<ClientConnection<MemChannel>> {
    let (client, server) = shaped_pair(net, Arc::new(RealClock::new()))?;
    std::thread::spawn(move || {
        if let Err(e) = serve_session(server, &model) {
            eprintln!("veil: the shaped-link server session failed: {e}");
        }
    });
    ClientConnection::connect(client)
}

/// [`serve`] with the lookup method of private-embedding mode chosen (the tables are prepared
/// per sequence length for the few most recently used lengths and shared by all sessions).
pub fn serve_with(
    listener: TcpListener,
    model: Arc<ServerModel>,
    method: LookupMethod,
) -> Result<()> {
    let emb = match model.config().veil.embedding {
        EmbeddingMode::Private => Some(Arc::new(ServerEmbedding::new(&model.fixed, method)?)),
        EmbeddingMode::Public => None,
    };
    for stream in listener.incoming() {
        let stream: TcpStream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("veil serve: accept failed: {e}");
                continue;
            }
        };
        let model = model.clone();
        let emb = emb.clone();
        std::thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            let res = TcpChannel::from_stream(stream).and_then(|mut ch| {
                ch.set_timeout(Some(IDLE_TIMEOUT))?;
                serve_session_with(ch, &model, emb.as_deref())
            });
            match res {
                Ok(()) => eprintln!("veil serve: session with {peer} ended"),
                Err(e) => eprintln!("veil serve: session with {peer} failed: {e}"),
            }
        });
    }
    Ok(())
}
