//! What the client sees when the server is not the one it expects or cannot serve it: a silent
//! server, a server announcing another configuration, a busy server, a server short of memory.
//! Each is a clear error within the client's deadline. Loopback only.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::{Error, FixedPoint};
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{BlockVariant, ModelConfig};
use veil_net::{Channel, ClientTls, Identity, ServerPin, ServerTls};
use veil_private::protocol::{Admission, Announced, Hello, Message};
use veil_private::{
    ClientConnection, ClientOptions, Cuts, ServeOptions, Server, ServerModel, Transport,
};

fn config(layers: usize) -> ModelConfig {
    let mut cfg = ModelConfig::builder(veil_model::Architecture::Bert)
        .layers(layers)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::friendly(); layers];
    cfg
}

fn client(id: &Identity) -> ClientTls {
    ClientTls {
        pin: ServerPin::Fingerprint {
            fp: id.fingerprint(),
            source: "the test".into(),
        },
        identity: None,
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn opts(t: f64) -> ClientOptions {
    ClientOptions {
        max_tokens: Some(4),
        step_timeout: Some(Duration::from_secs_f64(t)),
    }
}

#[test]
fn a_silent_server_times_out_within_the_deadline() {
    // Silent before TLS: the handshake's deadline.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    let err = client(&Identity::generate().unwrap())
        .connect(
            TcpStream::connect(addr).unwrap(),
            start + Duration::from_secs(1),
        )
        .err()
        .unwrap();
    assert!(matches!(err, Error::TimedOut(_)), "{err}");
    // The requirement: the error comes within the deadline (1 s), not after a hang.
    assert!(start.elapsed() < Duration::from_millis(1800));

    // Silent after TLS: the hello's answer never comes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let id = Identity::generate().unwrap();
    let tls = ServerTls::new(&id, None).unwrap();
    let h = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let ch = tls.accept(s, soon()).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(ch);
    });
    let ch = client(&id)
        .connect(TcpStream::connect(addr).unwrap(), soon())
        .unwrap();
    let start = Instant::now();
    let err = ClientConnection::connect_with(ch, opts(1.0), |_| Ok(()))
        .err()
        .unwrap();
    let took = start.elapsed();
    assert!(matches!(err, Error::TimedOut(_)), "{err}");
    assert!(err.to_string().contains("hello"), "{err}");
    assert!(took < Duration::from_millis(1800), "{took:?}");
    h.join().unwrap();
}

/// The client compares the announced configuration before any key material moves: the server
/// receives nothing after the hello.
#[test]
fn another_configuration_is_refused_before_set_up() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let id = Identity::generate().unwrap();
    let tls = ServerTls::new(&id, None).unwrap();
    let theirs = config(2);
    let h = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut ch = tls.accept(s, soon()).unwrap();
        Hello::recv(&mut ch).unwrap();
        Admission::Admitted(Announced {
            config: theirs,
            bundle: None,
            activation_bits: None,
            cuts: Cuts::Kept,
        })
        .send(&mut ch)
        .unwrap();
        ch.flush().unwrap();
        let after = ch.meter().total().bytes_received;
        let next = ch.recv_msg(1 << 20);
        (after, ch.meter().total().bytes_received, next)
    });
    let mine = config(1);
    let ch = client(&id)
        .connect(TcpStream::connect(addr).unwrap(), soon())
        .unwrap();
    let err = ClientConnection::connect_with(ch, opts(10.0), |a| {
        veil_core::ensure!(
            a.config == mine,
            InvalidArgument,
            "the server's model configuration differs from the client's"
        );
        Ok(())
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("differs"), "{err}");
    let (before, after, next) = h.join().unwrap();
    assert_eq!(before, after, "the client sent something after the hello");
    assert!(matches!(next, Err(Error::Disconnected)), "{next:?}");
}

fn served(
    max_sessions: usize,
    budget: Option<u64>,
) -> (String, Identity, Arc<std::sync::atomic::AtomicBool>) {
    let cfg = config(1);
    let t = random_transformer_with_std(&cfg, [3; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, FixedPoint::default_format()).unwrap();
    let model = Arc::new(ServerModel::new(fixed).unwrap());
    let id = Identity::generate().unwrap();
    let mut o = ServeOptions::for_model(&model, Transport::Tls(ServerTls::new(&id, None).unwrap()));
    o.max_sessions = max_sessions;
    o.queue_wait = Duration::from_secs(1);
    if let Some(b) = budget {
        o.memory_budget = b;
    }
    let stop = o.shutdown.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = Server::new(model, o).unwrap();
    std::thread::spawn(move || server.run(listener));
    (addr, id, stop)
}

#[test]
fn a_busy_server_refuses_after_the_queue_wait_with_a_message() {
    let (addr, id, stop) = served(1, None);
    let ch = client(&id)
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .unwrap();
    let first = ClientConnection::connect_with(ch, opts(60.0), |_| Ok(())).unwrap();
    let start = Instant::now();
    let ch = client(&id)
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .unwrap();
    let err = ClientConnection::connect_with(ch, opts(60.0), |_| Ok(()))
        .err()
        .unwrap();
    let took = start.elapsed();
    let m = err.to_string();
    assert!(m.contains("refused") && m.contains("busy"), "{m}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    first.close().unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn a_session_too_large_for_the_servers_memory_is_refused_up_front() {
    let (addr, id, stop) = served(4, Some(100 << 20));
    let ch = client(&id)
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .unwrap();
    let err = ClientConnection::connect_with(ch, opts(60.0), |_| Ok(()))
        .err()
        .unwrap();
    let m = err.to_string();
    assert!(m.contains("refused") && m.contains("MiB"), "{m}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// A server with an allow-list serves an allowed client and refuses a stranger with a message
/// that says what to do.
#[test]
fn mutual_authentication_admits_only_allowed_clients() {
    let cfg = config(1);
    let t = random_transformer_with_std(&cfg, [5; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, FixedPoint::default_format()).unwrap();
    let model = Arc::new(ServerModel::new(fixed.clone()).unwrap());
    let id = Identity::generate().unwrap();
    let allowed = Identity::generate().unwrap();
    let allow = [allowed.fingerprint()].into_iter().collect();
    let o = ServeOptions::for_model(
        &model,
        Transport::Tls(ServerTls::new(&id, Some(allow)).unwrap()),
    );
    let stop = o.shutdown.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = Server::new(model, o).unwrap();
    std::thread::spawn(move || server.run(listener));

    let mut c = client(&id);
    c.identity = Some(allowed);
    let ch = c
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .unwrap();
    let mut conn = ClientConnection::connect_with(ch, opts(60.0), |_| Ok(())).unwrap();
    let x = fixed.embed(&[1, 2, 3], &[0; 3]).unwrap().0;
    conn.infer(&x, None).unwrap();
    conn.close().unwrap();

    let stranger = client(&id);
    let err = stranger
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .and_then(|ch| ClientConnection::connect_with(ch, opts(10.0), |_| Ok(())).map(|_| ()))
        .unwrap_err();
    assert!(err.to_string().contains("--client-identity"), "{err}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
}
