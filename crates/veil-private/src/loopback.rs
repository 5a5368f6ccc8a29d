//! Both parties in one process (`veil demo`, `veil eval`, `veil embed`): a [`crate::Server`]
//! on a thread of this process, listening on a TCP loopback port, and the channels this
//! process's client opens to it. A renewing client ([`crate::Client::connect_renewing`]) opens
//! a session per key it spends; they all reach the one server, prepared once, which stops when
//! the [`LoopbackServer`] is stopped or dropped, so no accepting thread outlives its run.
//! [`InProcess`] pairs such a server with its client for runs that compare outputs;
//! [`shaped_channel`] runs one session over an in-memory link shaped like a network.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::Result;
use veil_net::{
    shaped_pair, ClientTls, MemChannel, NetworkModel, RealClock, ServerPin, TcpChannel, TlsChannel,
};

use crate::handler::serve_session;
use crate::prepared::ServerModel;
use veil_model::tokenize::Encoded;

use crate::builder::{ServerBuilder, ServerIdentity};
use crate::client::{Client, ClientModel, PromptOptions};
use crate::connection::ClientOptions;
use crate::report::CostReport;
use crate::server::RunningServer;

/// How much longer than a remote client's a step of the in-process client may take. The
/// server's deadlines guard against a remote peer holding its threads, not against this
/// machine being slow (an unoptimised build, or cores busy with other work, takes many times
/// a release build's time), and here both ends are this process.
const LOCAL_SLOWNESS: u32 = 10;

/// How long the client waits for the TLS handshake with its own server.
const HANDSHAKE: Duration = Duration::from_secs(30);

/// A server for one model on a loopback port of this process, plain TCP or TLS 1.3.
pub struct LoopbackServer {
    running: RunningServer,
}

impl LoopbackServer {
    /// Plain TCP: the bytes never leave this machine and both ends are this process.
    pub fn plain(model: Arc<ServerModel>) -> Result<Self> {
        Self::start(model, ServerIdentity::Plaintext)
    }

    /// TLS 1.3 as `veil serve` / `veil classify` run it (to measure what TLS costs): a fresh
    /// in-memory server identity, the client pinning its fingerprint.
    pub fn tls(model: Arc<ServerModel>) -> Result<Self> {
        Self::start(model, ServerIdentity::Ephemeral)
    }

    fn start(model: Arc<ServerModel>, identity: ServerIdentity) -> Result<Self> {
        let running = ServerBuilder::new(identity)
            .stretch_deadlines(LOCAL_SLOWNESS)
            .build_prepared(model)?
            .spawn(TcpListener::bind("127.0.0.1:0")?)?;
        Ok(LoopbackServer { running })
    }

    /// Opens plain-TCP sessions (a server started with [`Self::plain`]).
    pub fn plain_connector(&self) -> impl FnMut() -> Result<TcpChannel> + Send + 'static {
        let addr = self.addr();
        move || TcpChannel::connect(addr)
    }

    /// Opens TLS sessions, pinning this server's identity (a server started with
    /// [`Self::tls`]; one started plain refuses the handshake).
    pub fn tls_connector(&self) -> impl FnMut() -> Result<TlsChannel> + Send + 'static {
        let (addr, pin) = (self.addr(), self.running.fingerprint());
        move || {
            let fp = pin.ok_or_else(|| {
                veil_core::Error::InvalidArgument(
                    "a TLS session to a loopback server started without TLS".into(),
                )
            })?;
            ClientTls {
                pin: ServerPin::Fingerprint {
                    fp,
                    source: "the in-process server".into(),
                },
                identity: None,
            }
            .connect(TcpStream::connect(addr)?, Instant::now() + HANDSHAKE)
        }
    }

    fn addr(&self) -> SocketAddr {
        self.running.local_addr()
    }

    /// Whether its server is still accepting.
    pub fn is_running(&self) -> bool {
        self.running.is_running()
    }

    /// Stops the server (open sessions get its grace period) and returns how it ended.
    pub fn stop(self) -> Result<()> {
        self.running.stop()
    }
}

/// Private runs of a model with both parties in this process: a [`LoopbackServer`] prepared
/// once, and a renewing client, so a run of any length neither meets the server's key limit nor
/// prepares the model again.
pub struct InProcess {
    /// Connected at the first inference: a resumed evaluation may spend a long time on the
    /// examples it already has before it needs one, and an idle session is dropped. Declared
    /// before `server` so that, dropped on an error, the session ends before the server waits
    /// out its grace period for it.
    session: Option<Client<TcpChannel>>,
    server: LoopbackServer,
    /// The client's half of the model, until the session takes it.
    client: Option<ClientModel>,
    opts: PromptOptions,
}

impl InProcess {
    /// A server prepared from `model`, and `client` (the public half of the same model, which
    /// the caller may have encoded its prompts with) for the session.
    pub fn start(
        model: &veil_model::Model,
        client: ClientModel,
        opts: PromptOptions,
    ) -> Result<Self> {
        let prepared = ServerModel::from_model(model, crate::prepared::DEFAULT_NTT_BUDGET_BYTES)?;
        Ok(InProcess {
            session: None,
            server: LoopbackServer::plain(Arc::new(prepared))?,
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
                    self.server.plain_connector(),
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

/// Both parties in one process, as [`LoopbackServer`], but over an in-memory link shaped like
/// `net` (`veil_net::shaped_pair`, on the wall clock), so reports measure the time on `net`.
pub fn shaped_channel(model: Arc<ServerModel>, net: NetworkModel) -> Result<MemChannel> {
    let (client, server) = shaped_pair(net, Arc::new(RealClock::new()))?;
    std::thread::spawn(move || {
        if let Err(e) = serve_session(server, &model) {
            tracing::warn!("the shaped-link server session failed: {e}");
        }
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use veil_model::{folder, random};

    use super::*;
    use crate::client::Input;
    use crate::prepared::DEFAULT_NTT_BUDGET_BYTES;

    /// Sessions one after another reach the same TLS server and get the same answer; the
    /// server stops when asked, and a TLS connector refuses a plain server without a handshake.
    #[test]
    fn one_server_takes_every_session_of_a_run_and_stops() {
        let tmp = tempfile::tempdir().unwrap();
        random::write_tiny_classifier(tmp.path(), 1, 2, 4).unwrap();
        let model = folder::load(tmp.path()).unwrap();
        let prepared = Arc::new(ServerModel::from_model(&model, DEFAULT_NTT_BUDGET_BYTES).unwrap());
        let server = LoopbackServer::tls(prepared.clone()).unwrap();
        let mut connect = server.tls_connector();
        let mut answers = vec![];
        for _ in 0..2 {
            let mut client = Client::connect(
                ClientModel::open(tmp.path()).unwrap(),
                connect().unwrap(),
                PromptOptions::default(),
                ClientOptions::default(),
            )
            .unwrap();
            answers.push(
                client.classify(&[Input::Text("a fine film")]).unwrap()[0]
                    .probabilities
                    .clone(),
            );
            client.close().unwrap();
        }
        assert_eq!(answers[0], answers[1]);
        assert!(server.is_running());
        server.stop().unwrap();
        assert!(connect().is_err(), "the stopped server still accepted");

        let plain = LoopbackServer::plain(prepared).unwrap();
        let err = plain.tls_connector()().err().unwrap().to_string();
        assert!(err.contains("without TLS"), "{err}");
        plain.stop().unwrap();
    }
}
