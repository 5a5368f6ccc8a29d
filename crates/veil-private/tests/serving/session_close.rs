//! Each reason a server ends a running session reaches the client named, whatever the client
//! was doing, not as "peer disconnected": a malformed request, the idle deadline, the set-up
//! deadline, the shutdown grace; a reason's control characters are shown escaped; the server
//! goes on serving other clients. Loopback, plain TCP and TLS.

use crate::common;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use veil_core::{Error, Result};
use veil_net::{Channel, Meter, TcpChannel};
use veil_private::protocol::{Admission, Announced, Hello, Message, Request};
use veil_private::{
    ClientConnection, ClientOptions, Cuts, RunningServer, ServerBuilder, ServerIdentity,
};

fn serve(b: ServerBuilder) -> RunningServer {
    let (_, model) = common::friendly_model(3);
    b.build_prepared(model)
        .unwrap()
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap()
}

fn plain() -> ServerBuilder {
    ServerBuilder::new(ServerIdentity::Plaintext)
}

fn opts() -> ClientOptions {
    ClientOptions {
        max_tokens: Some(4),
        step_timeout: Some(Duration::from_secs(120)),
    }
}

fn connect<C: Channel>(ch: C) -> Result<ClientConnection<C>> {
    ClientConnection::connect_with(ch, opts(), |_| Ok(()))
}

/// The text of a close the server sent, which must be one.
fn closed(e: Error) -> String {
    assert!(matches!(e, Error::PeerClosed(_)), "not a close: {e}");
    let m = e.to_string();
    assert!(!m.chars().any(char::is_control), "{m:?}");
    m
}

/// A prompt of 3 tokens' embedding, the client's input.
fn prompt() -> veil_core::RingTensor {
    let (fixed, _) = common::friendly_model(3);
    common::simulated(&fixed, &[5, 6, 7]).0
}

/// Another client is served in full afterwards.
fn serves_another(s: &RunningServer) {
    let mut c = connect(TcpChannel::connect(s.local_addr()).unwrap()).unwrap();
    c.infer(&prompt(), None).unwrap();
    c.close().unwrap();
}

/// A client whose inference requests leave with an unknown tag.
struct UnknownTag<C>(C);

impl<C: Channel> Channel for UnknownTag<C> {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        let infer = Request::Infer {
            tokens: 3,
            preprocessed: false,
        };
        match data == infer.encode() {
            true => self.0.send(&[9, 3, 0, 0, 0, 0]),
            false => self.0.send(data),
        }
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.0.recv(buf)
    }
    fn flush(&mut self) -> Result<()> {
        self.0.flush()
    }
    fn meter(&self) -> &Meter {
        self.0.meter()
    }
    fn set_deadline(&mut self, deadline: Option<Instant>) -> Result<()> {
        self.0.set_deadline(deadline)
    }
    fn start_records(&mut self) -> Result<()> {
        self.0.start_records()
    }
    fn close_with(&mut self, reason: &str) -> Result<()> {
        self.0.close_with(reason)
    }
}

#[test]
fn a_malformed_request_is_named_and_the_server_serves_on() {
    let s = serve(plain());
    let ch = UnknownTag(TcpChannel::connect(s.local_addr()).unwrap());
    let mut c = connect(ch).unwrap();
    let m = closed(c.infer(&prompt(), None).unwrap_err());
    assert!(
        m.starts_with("the peer closed the session: malformed message:")
            && m.contains("unknown request tag 9"),
        "{m}"
    );
    serves_another(&s);
    s.stop().unwrap();
}

/// Over TLS: a client quiet for longer than the idle deadline is told which deadline passed
/// when it comes back, within the server's linger and after it.
#[test]
fn the_idle_deadline_is_named_with_its_length() {
    let server = ServerBuilder::new(ServerIdentity::Ephemeral)
        .idle_timeout(Duration::from_millis(500))
        .build_prepared(common::friendly_model(3).1)
        .unwrap();
    let fp = server.fingerprint().unwrap();
    let s = server
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let addr = s.local_addr().to_string();
    for quiet in [Duration::from_millis(1500), veil_net::LINGER * 2] {
        let mut c = connect(common::tls_to(&addr, fp).unwrap()).unwrap();
        std::thread::sleep(quiet);
        let m = closed(c.infer(&prompt(), None).unwrap_err());
        assert!(
            m.contains(
                "waiting for the next request (the idle deadline) did not finish within 0.5 s"
            ),
            "{m}"
        );
    }
    s.stop().unwrap();
}

/// A client that stalls between the admission and its keys is told the set-up's deadline; an
/// honest client's set-up fits it.
#[test]
fn the_set_up_deadline_is_named_with_its_length() {
    let s = serve(plain().setup_timeout(Duration::from_secs(5)));
    let ch = TcpChannel::connect(s.local_addr()).unwrap();
    let stall = |_: &Announced| {
        std::thread::sleep(Duration::from_secs(6));
        Ok(())
    };
    let e = ClientConnection::connect_with(ch, opts(), stall)
        .err()
        .unwrap();
    let m = closed(e);
    assert!(
        m.contains("timed out: set-up did not finish within 5.0 s"),
        "{m}"
    );
    serves_another(&s);
    s.stop().unwrap();
}

/// A session still open when the shutdown grace ends is cut, and its client told so.
#[test]
fn a_session_cut_by_the_shutdown_grace_is_told_so() {
    let s = serve(plain().shutdown_grace(Duration::from_millis(500)));
    let mut c = connect(TcpChannel::connect(s.local_addr()).unwrap()).unwrap();
    let stopping = std::thread::spawn(move || s.stop());
    std::thread::sleep(Duration::from_millis(1500));
    let m = closed(c.infer(&prompt(), None).unwrap_err());
    assert!(
        m.contains("the server is shutting down: its grace of 0.5 s for open sessions passed"),
        "{m}"
    );
    drop(c);
    stopping.join().unwrap().unwrap();
}

/// A server's close reason reaches the client's terminal with control characters escaped.
#[test]
fn a_close_reason_is_shown_escaped() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = common::friendly_model(3).1.config().announced();
    let fake = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut ch = TcpChannel::from_stream(stream).unwrap();
        Hello::recv(&mut ch).unwrap();
        let bundle = None;
        Admission::Admitted(Announced {
            config,
            bundle,
            activation_bits: None,
            cuts: Cuts::Kept,
        })
        .send(&mut ch)
        .unwrap();
        ch.start_records().unwrap();
        ch.close_with("\x1b[2Jgone\r\n\x07").unwrap();
    });
    let e = connect(TcpChannel::connect(addr).unwrap()).err().unwrap();
    let m = closed(e);
    assert_eq!(m, "the peer closed the session: \\u{1b}[2Jgone\\r\\n\\u{7}");
    fake.join().unwrap();
}
