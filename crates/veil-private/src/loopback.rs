//! Both parties in one process (`veil demo`, `veil eval`, `veil embed`): a [`Server`] on a
//! thread of this process, listening on a TCP loopback port, and the channels this process's
//! client opens to it. A renewing client ([`crate::Client::connect_renewing`]) opens a session
//! per key it spends; they all reach the one server, prepared once, which stops when the
//! [`LoopbackServer`] is stopped or dropped, so no accepting thread outlives its run.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::Result;
use veil_net::{ClientTls, Fingerprint, Identity, ServerPin, ServerTls, TcpChannel, TlsChannel};

use crate::server::{RunningServer, ServeOptions, Server, Transport};
use crate::ServerModel;

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
    /// The fingerprint of the fresh in-memory identity the server presents over TLS.
    tls_pin: Option<Fingerprint>,
}

impl LoopbackServer {
    /// Plain TCP: the bytes never leave this machine and both ends are this process.
    pub fn plain(model: Arc<ServerModel>) -> Result<Self> {
        Self::start(model, Transport::Plaintext, None)
    }

    /// TLS 1.3 as `veil serve` / `veil classify` run it (to measure what TLS costs): a fresh
    /// in-memory server identity, the client pinning its fingerprint.
    pub fn tls(model: Arc<ServerModel>) -> Result<Self> {
        let id = Identity::generate()?;
        let tls = ServerTls::new(&id, None)?;
        Self::start(model, Transport::Tls(tls), Some(id.fingerprint()))
    }

    fn start(
        model: Arc<ServerModel>,
        transport: Transport,
        tls_pin: Option<Fingerprint>,
    ) -> Result<Self> {
        let mut opts = ServeOptions::for_model(&model, transport);
        opts.deadlines = opts.deadlines.stretched(LOCAL_SLOWNESS);
        let running = Server::new(model, opts)?.spawn(TcpListener::bind("127.0.0.1:0")?)?;
        Ok(LoopbackServer { running, tls_pin })
    }

    /// Opens plain-TCP sessions (a server started with [`Self::plain`]).
    pub fn plain_connector(&self) -> impl FnMut() -> Result<TcpChannel> + Send + 'static {
        let addr = self.addr();
        move || TcpChannel::connect(addr)
    }

    /// Opens TLS sessions, pinning this server's identity (a server started with
    /// [`Self::tls`]; one started plain refuses the handshake).
    pub fn tls_connector(&self) -> impl FnMut() -> Result<TlsChannel> + Send + 'static {
        let (addr, pin) = (self.addr(), self.tls_pin);
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

#[cfg(test)]
mod tests {
    use veil_model::{folder, random};

    use super::*;
    use crate::prepared::DEFAULT_NTT_BUDGET_BYTES;
    use crate::{Client, ClientModel, ClientOptions, PromptOptions};

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
                client.classify(&["a fine film"]).unwrap()[0]
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
