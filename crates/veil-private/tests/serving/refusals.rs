//! Each reason a server turns a connection away reaches the client as an error naming it: busy,
//! shutting down, another protocol version, not a Veil hello, a zero or too long announcement;
//! a peer's refusal text is shown with its control characters escaped; one address cannot take
//! every handshake place. Loopback, plain TCP (the reasons travel the same way over TLS).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::{Error, FixedPoint};
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{BlockVariant, ModelConfig};
use veil_net::{Channel, TcpChannel};
use veil_private::protocol::{Admission, Hello, Message};
use veil_private::{
    ClientConnection, ClientOptions, RunningServer, ServerBuilder, ServerIdentity, ServerModel,
};

fn model() -> Arc<ServerModel> {
    let mut cfg = ModelConfig::builder(veil_model::Architecture::Bert)
        .layers(1)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::friendly()];
    let t = random_transformer_with_std(&cfg, [7; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, FixedPoint::default_format()).unwrap();
    Arc::new(ServerModel::new(fixed).unwrap())
}

fn serve(b: ServerBuilder) -> RunningServer {
    b.build_prepared(model())
        .unwrap()
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap()
}

fn plain() -> ServerBuilder {
    ServerBuilder::new(ServerIdentity::Plaintext)
}

fn opts(tokens: usize) -> ClientOptions {
    ClientOptions {
        max_tokens: Some(tokens),
        step_timeout: Some(Duration::from_secs(60)),
    }
}

fn connect(s: &RunningServer, tokens: usize) -> veil_core::Result<ClientConnection<TcpChannel>> {
    ClientConnection::connect_with(TcpChannel::connect(s.local_addr())?, opts(tokens), |_| {
        Ok(())
    })
}

/// The server's answer to a hello sent as raw bytes.
fn answer(s: &RunningServer, hello: &[u8]) -> Admission {
    let mut ch = TcpChannel::connect(s.local_addr()).unwrap();
    ch.set_deadline(Some(Instant::now() + Duration::from_secs(30)))
        .unwrap();
    ch.send_msg(hello).unwrap();
    ch.flush().unwrap();
    Admission::recv(&mut ch).unwrap()
}

fn refused(e: Error) -> String {
    assert!(matches!(e, Error::Refused(_)), "not a refusal: {e}");
    e.to_string()
}

#[test]
fn a_full_server_says_busy_at_once_when_its_queue_is_full() {
    let s = serve(plain().max_sessions(Some(1)).queue(Some(0)));
    let first = connect(&s, 4).unwrap();
    let start = Instant::now();
    let m = refused(connect(&s, 4).err().unwrap());
    assert!(m.contains("busy") && m.contains("at most 1"), "{m}");
    assert!(start.elapsed() < Duration::from_secs(5));
    first.close().unwrap();
    s.stop().unwrap();
}

#[test]
fn a_queued_client_is_told_the_server_is_shutting_down() {
    let s = serve(
        plain()
            .max_sessions(Some(1))
            .queue(Some(1))
            .queue_wait(Duration::from_secs(60))
            .shutdown_grace(Duration::from_millis(500)),
    );
    let first = connect(&s, 4).unwrap();
    let addr = s.local_addr();
    let queued = std::thread::spawn(move || {
        ClientConnection::connect_with(TcpChannel::connect(addr).unwrap(), opts(4), |_| Ok(()))
            .err()
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(500));
    s.stop().unwrap();
    let m = refused(queued.join().unwrap());
    assert!(m.contains("shutting down"), "{m}");
    drop(first);
}

#[test]
fn version_strangers_and_bad_announcements_are_refused_with_the_reason() {
    let s = serve(plain());
    let mut old = Hello { max_tokens: 4 }.encode();
    old[4] = 2;
    let why = |a: Admission| match a {
        Admission::Refused(why) => why,
        a => panic!("admitted: {a:?}"),
    };
    let m = why(answer(&s, &old));
    assert!(m.contains("protocol version 2"), "{m}");
    let m = why(answer(&s, b"GET / HTTP/1.1\r\n"));
    assert!(m.contains("not a Veil client"), "{m}");
    let m = why(answer(&s, &Hello { max_tokens: 0 }.encode()));
    assert!(
        m.contains("announces 0 tokens") && m.contains("1 to 16"),
        "{m}"
    );
    // Through the client: a length beyond the model is the server's refusal, named.
    let m = refused(connect(&s, 1000).err().unwrap());
    assert!(
        m.contains("1000 tokens") && m.contains("16 this model takes"),
        "{m}"
    );
    // A client that announces nothing is stopped before it sends anything.
    let none = ClientOptions {
        max_tokens: None,
        ..opts(1)
    };
    let e =
        ClientConnection::connect_with(TcpChannel::connect(s.local_addr()).unwrap(), none, |_| {
            Ok(())
        })
        .err()
        .unwrap();
    assert!(e.to_string().contains("announce the longest prompt"), "{e}");
    s.stop().unwrap();
}

/// A server's refusal text reaches the client's terminal with control characters escaped.
#[test]
fn a_peers_refusal_text_is_shown_escaped() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut ch = TcpChannel::from_stream(stream).unwrap();
        Hello::recv(&mut ch).unwrap();
        Admission::Refused("\x1b[2Jgone\r\n\x07".into())
            .send(&mut ch)
            .unwrap();
        ch.flush().unwrap();
    });
    let e = ClientConnection::connect_with(TcpChannel::connect(addr).unwrap(), opts(4), |_| Ok(()))
        .err()
        .unwrap();
    let m = refused(e);
    assert!(!m.chars().any(char::is_control), "{m:?}");
    assert!(m.contains("\\u{1b}[2Jgone\\r\\n\\u{7}"), "{m}");
    fake.join().unwrap();
}

/// Connections from one address beyond its cap are closed at once; those it holds still wait
/// for their handshake deadline.
#[test]
fn one_address_cannot_take_every_handshake_place() {
    let s = serve(
        plain()
            .per_address(2)
            .handshake_timeout(Duration::from_secs(20)),
    );
    let held: Vec<_> = (0..2)
        .map(|_| TcpStream::connect(s.local_addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut third = TcpStream::connect(s.local_addr()).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = Instant::now();
    assert_eq!(third.read(&mut [0u8; 8]).unwrap_or(0), 0);
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(held);
    // Once they are gone, the address is served again.
    std::thread::sleep(Duration::from_millis(300));
    connect(&s, 4).unwrap().close().unwrap();
    s.stop().unwrap();
}
