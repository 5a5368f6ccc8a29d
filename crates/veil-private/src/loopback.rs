//! Both parties in one process (`veil demo`, `veil eval`, `veil embed`, `veil bench model`): a
//! [`Loopback`] serves one model to this process's client over a [`Link`] — TCP loopback,
//! plain or TLS 1.3, through a [`crate::Server`] on a thread of this process, or an in-memory
//! link shaped like a network, on which the reports measure the time. A renewing client
//! ([`crate::Client::connect_renewing`]) opens a session per key it spends; they all reach the
//! one model, prepared once; the TCP server stops when the [`Loopback`] is stopped or dropped,
//! so no accepting thread outlives its run. [`InProcess`] pairs a loopback with its client for
//! runs that compare outputs.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::Result;
use veil_model::Encoded;
use veil_net::{shaped_pair, Channel, ClientTls, NetworkModel, RealClock, ServerPin, TcpChannel};

use crate::builder::{ServerBuilder, ServerIdentity};
use crate::client::{Client, ClientModel, PromptOptions};
use crate::connection::ClientOptions;
use crate::handler::serve_session;
use crate::prepared::ServerModel;
use crate::report::CostReport;
use crate::server::RunningServer;

/// How much longer than a remote client's a step of the in-process client may take. The
/// server's deadlines guard against a remote peer holding its threads, not against this
/// machine being slow (an unoptimised build, or cores busy with other work, takes many times
/// a release build's time), and here both ends are this process.
const LOCAL_SLOWNESS: u32 = 10;

/// How long the client waits for the TLS handshake with its own server.
const HANDSHAKE: Duration = Duration::from_secs(30);

/// How the two parties in one process are linked.
#[derive(Clone, Copy, Debug)]
pub enum Link {
    /// Plain TCP loopback: the bytes never leave this machine and both ends are this process.
    Tcp,
    /// TLS 1.3 on TCP loopback, as `veil serve` / `veil classify` run it (to measure what TLS
    /// costs): a fresh in-memory server identity, the client pinning its fingerprint.
    Tls,
    /// An in-memory link shaped like this network (`veil_net::shaped_pair` on the wall clock):
    /// each session is served on its own thread, and reports measure the time on the network.
    Shaped(NetworkModel),
}

impl Link {
    /// The link `--net` / `--tls` ask for (TCP without either); both at once are refused.
    pub fn new(net: Option<NetworkModel>, tls: bool) -> Result<Self> {
        match (net, tls) {
            (Some(_), true) => Err(veil_core::Error::InvalidArgument(
                "--tls runs over TCP loopback; --net over an in-memory shaped link: choose one"
                    .into(),
            )),
            (Some(net), false) => Ok(Link::Shaped(net)),
            (None, true) => Ok(Link::Tls),
            (None, false) => Ok(Link::Tcp),
        }
    }
}

/// Opens one session's channel to a [`Loopback`].
pub type Connector = Box<dyn FnMut() -> Result<Box<dyn Channel>> + Send>;

/// One model served to this process's client over a [`Link`].
pub struct Loopback {
    model: Arc<ServerModel>,
    link: Link,
    /// The TCP server (`None` on a shaped link).
    running: Option<RunningServer>,
}

impl Loopback {
    /// Serves `model` over `link`. On TCP, the server's memory admission is off (both parties
    /// share this process; it guards a server against remote clients) and its deadlines are
    /// stretched (this machine may be slow, not the peer).
    pub fn start(model: Arc<ServerModel>, link: Link) -> Result<Self> {
        let identity = match link {
            Link::Shaped(_) => None,
            Link::Tcp => Some(ServerIdentity::Plaintext),
            Link::Tls => Some(ServerIdentity::Ephemeral),
        };
        let running = match identity {
            Some(identity) => Some(
                ServerBuilder::new(identity)
                    .stretch_deadlines(LOCAL_SLOWNESS)
                    .memory_budget(u64::MAX >> 1)
                    .build_prepared(model.clone())?
                    .spawn(TcpListener::bind("127.0.0.1:0")?)?,
            ),
            None => None,
        };
        Ok(Loopback {
            model,
            link,
            running,
        })
    }

    /// Opens sessions to this loopback: each call is a new channel to the model.
    pub fn connector(&self) -> Connector {
        match (self.link, &self.running) {
            (Link::Shaped(net), _) => {
                let model = self.model.clone();
                Box::new(move || {
                    let (client, server) = shaped_pair(net, Arc::new(RealClock::new()))?;
                    let model = model.clone();
                    std::thread::spawn(move || {
                        if let Err(e) = serve_session(server, &model) {
                            tracing::warn!("the shaped-link server session failed: {e}");
                        }
                    });
                    Ok(Box::new(client) as Box<dyn Channel>)
                })
            }
            (Link::Tcp, Some(running)) => {
                let addr = running.local_addr();
                Box::new(move || Ok(Box::new(TcpChannel::connect(addr)?) as Box<dyn Channel>))
            }
            (Link::Tls, Some(running)) => {
                let (addr, fp) = (running.local_addr(), running.fingerprint());
                Box::new(move || {
                    let fp = fp.ok_or_else(|| {
                        veil_core::Error::Other("the loopback TLS server has no identity".into())
                    })?;
                    let tls = ClientTls {
                        pin: ServerPin::Fingerprint {
                            fp,
                            source: "the in-process server".into(),
                        },
                        identity: None,
                    };
                    let ch = tls.connect(TcpStream::connect(addr)?, Instant::now() + HANDSHAKE)?;
                    Ok(Box::new(ch) as Box<dyn Channel>)
                })
            }
            (_, None) => Box::new(|| {
                Err(veil_core::Error::Other(
                    "the loopback server is not running".into(),
                ))
            }),
        }
    }

    /// Whether it still serves (a shaped link always does).
    pub fn is_running(&self) -> bool {
        self.running.as_ref().is_none_or(RunningServer::is_running)
    }

    /// Stops the TCP server (open sessions get its grace period) and returns how it ended; a
    /// shaped link's sessions end with their clients.
    pub fn stop(self) -> Result<()> {
        self.running.map_or(Ok(()), RunningServer::stop)
    }
}

/// Private runs of a model with both parties in this process: a [`Loopback`] prepared once,
/// and a renewing client, so a run of any length neither meets the server's key limit nor
/// prepares the model again.
pub struct InProcess {
    /// Connected at the first inference: a resumed evaluation may spend a long time on the
    /// examples it already has before it needs one, and an idle session is dropped. Declared
    /// before `server` so that, dropped on an error, the session ends before the server waits
    /// out its grace period for it.
    session: Option<Client<Box<dyn Channel>>>,
    server: Loopback,
    /// The client's half of the model, until the session takes it.
    client: Option<ClientModel>,
    opts: PromptOptions,
}

impl InProcess {
    /// A server prepared from `model` on plain TCP loopback, and `client` (the public half of
    /// the same model, which the caller may have encoded its prompts with) for the session.
    pub fn start(
        model: &veil_model::Model,
        client: ClientModel,
        opts: PromptOptions,
    ) -> Result<Self> {
        let prepared = ServerModel::from_model(model, crate::prepared::DEFAULT_NTT_BUDGET_BYTES)?;
        Ok(InProcess {
            session: None,
            server: Loopback::start(Arc::new(prepared), Link::Tcp)?,
            client: Some(client),
            opts,
        })
    }

    /// The private output of `enc` and its cost (the client embeds with the public tables as
    /// any client does).
    pub fn infer(&mut self, enc: &Encoded) -> Result<(Vec<f64>, CostReport)> {
        let session = match &mut self.session {
            Some(s) => s,
            None => {
                let client = self.client.take().ok_or_else(|| {
                    veil_core::Error::Other("the private session failed to open earlier".into())
                })?;
                self.session.insert(Client::connect_renewing(
                    client,
                    self.server.connector(),
                    self.opts,
                    ClientOptions::default(),
                )?)
            }
        };
        session.infer(enc)
    }

    /// Sessions opened so far.
    pub fn sessions(&self) -> usize {
        self.session.as_ref().map_or(0, Client::sessions)
    }

    /// Ends the session and stops the server.
    pub fn stop(self) -> Result<()> {
        self.session.map(Client::close).transpose()?;
        self.server.stop()
    }
}

#[cfg(test)]
mod tests {
    use veil_model::{folder, random};

    use super::*;
    use crate::client::Input;
    use crate::prepared::DEFAULT_NTT_BUDGET_BYTES;

    /// Sessions one after another reach the same server over every link and get the same
    /// answer; a TCP server stops when asked and then refuses new sessions.
    #[test]
    fn one_model_takes_every_session_of_a_run_over_each_link_and_stops() {
        let tmp = tempfile::tempdir().unwrap();
        random::write_tiny_classifier(tmp.path(), 1, 2, 4).unwrap();
        let model = folder::load(tmp.path()).unwrap();
        let prepared = Arc::new(ServerModel::from_model(&model, DEFAULT_NTT_BUDGET_BYTES).unwrap());
        let mut answers = vec![];
        let links = [Link::Tls, Link::Tcp, Link::Shaped(veil_net::LAN)];
        for link in links {
            let server = Loopback::start(prepared.clone(), link).unwrap();
            let mut connect = server.connector();
            for _ in 0..2 {
                let mut client = Client::connect(
                    ClientModel::open(tmp.path()).unwrap(),
                    connect().unwrap(),
                    PromptOptions::default(),
                    ClientOptions::default(),
                )
                .unwrap();
                let c = client.classify(&[Input::Text("a fine film")]).unwrap();
                answers.push(c[0].probabilities.clone());
                // Only the shaped link's reports are measured on a network.
                let shaped = matches!(link, Link::Shaped(_));
                assert_eq!(c[0].cost.network.is_some(), shaped, "{link:?}");
                client.close().unwrap();
            }
            assert!(server.is_running());
            server.stop().unwrap();
            if !matches!(link, Link::Shaped(_)) {
                assert!(
                    connect().is_err(),
                    "the stopped {link:?} server still accepted"
                );
            }
        }
        assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    }
}
