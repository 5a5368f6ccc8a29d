//! Soak test of the TLS server, loopback only, bounded in time and count: 8 honest clients at
//! once, next to one sending garbage, one dripping bytes, one pinning a wrong fingerprint and one
//! hanging mid-session. Every honest client gets the simulator's logits bit for bit (faithful
//! truncation), the bad ones are dropped with the right error on both sides (the server's
//! structured log says why), and the server's thread count returns to its idle level.
//! One test in this file: the thread count is the process's.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::Error;
use veil_net::{Channel, Identity, ServerTls};
use veil_private::protocol::{Admission, Message};
use veil_private::{ClientConnection, ClientOptions, ServeOptions, Server, Transport};

use common::{threads, tls_to, Log};

const HONEST: usize = 8;

#[test]
fn eight_honest_clients_and_four_bad_ones_over_tls() {
    let test_start = Instant::now();
    let log = Log::capture();

    let (fixed, model) = common::friendly_model(31);

    let id = Identity::generate().unwrap();
    let server_fp = id.fingerprint();
    let mut opts =
        ServeOptions::for_model(&model, Transport::Tls(ServerTls::new(&id, None).unwrap()));
    opts.max_sessions = HONEST + 4;
    opts.queue = 4;
    opts.deadlines.handshake = Duration::from_secs(2);
    opts.deadlines.idle = Duration::from_secs(3);
    let shutdown = opts.shutdown.clone();
    let server = Arc::new(Server::new(model, opts).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let srv = server.clone();
    let accept = std::thread::spawn(move || srv.run(listener));

    // The worker pool exists from here on; this is the idle level.
    veil_core::parallel::pool().install(|| ());
    std::thread::sleep(Duration::from_millis(100));
    let idle = threads();

    let prompts: [&[u32]; 2] = [&[5, 6, 7], &[9, 1, 4, 4, 2, 8]];
    let expected: Vec<(veil_core::RingTensor, Vec<f64>)> = prompts
        .iter()
        .map(|ids| common::simulated(&fixed, ids))
        .collect();

    let honest: Vec<_> = (0..HONEST)
        .map(|i| {
            let (x, want) = expected[i % 2].clone();
            let addr = addr.clone();
            std::thread::spawn(move || {
                let ch = tls_to(&addr, server_fp).unwrap();
                let opts = ClientOptions {
                    max_tokens: Some(8),
                    step_timeout: Some(Duration::from_secs(120)),
                };
                let mut c = ClientConnection::connect_with(ch, opts, |_| Ok(())).unwrap();
                let (y, _) = c.infer(&x, None).unwrap();
                c.close().unwrap();
                assert_eq!(y, want, "client {i}");
            })
        })
        .collect();

    // Garbage after a good TLS handshake: refused as not a Veil client, and told so.
    let garbage = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut ch = tls_to(&addr, server_fp).unwrap();
            ch.send_msg(b"GET / HTTP/1.1\r\n").unwrap();
            let answer = Admission::recv(&mut ch).unwrap();
            (answer, ch.recv_msg(1 << 20).unwrap_err())
        })
    };
    // Garbage instead of TLS.
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.write_all(b"\x16\x03\x01\xff\xffnot a client hello")
        .unwrap();
    // Drips its hello one byte every 300 ms: dropped at the 2 s handshake deadline.
    let dripper = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut ch = tls_to(&addr, server_fp).unwrap();
            let mut hello = 12u32.to_le_bytes().to_vec();
            hello.extend_from_slice(b"VEIL");
            hello.extend_from_slice(&2u32.to_le_bytes());
            hello.extend_from_slice(&0u32.to_le_bytes());
            for b in hello {
                if ch.send(&[b]).and_then(|_| ch.flush()).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            ch.recv_msg(1 << 20).unwrap_err()
        })
    };
    // Pins another fingerprint: the client refuses the server.
    let wrong = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let other = Identity::generate().unwrap().fingerprint();
            tls_to(&addr, other).expect_err("a wrong pin must fail")
        })
    };
    // Completes the set-up, then hangs: dropped after the 3 s idle deadline. It sleeps well past
    // it, as the server's idle clock starts when its own set-up ends, which on a loaded machine
    // can be seconds after the client's.
    let hanger = {
        let addr = addr.clone();
        let (x, _) = expected[0].clone();
        std::thread::spawn(move || {
            let ch = tls_to(&addr, server_fp).unwrap();
            let opts = ClientOptions {
                max_tokens: Some(8),
                ..ClientOptions::default()
            };
            let mut c = ClientConnection::connect_with(ch, opts, |_| Ok(())).unwrap();
            std::thread::sleep(Duration::from_secs(10));
            c.infer(&x, None)
                .expect_err("the server dropped the hanging session")
        })
    };

    for h in honest {
        h.join().unwrap();
    }
    let (answer, e) = garbage.join().unwrap();
    assert!(
        matches!(&answer, Admission::Refused(why) if why.contains("not a Veil client")),
        "garbage client: {answer:?}"
    );
    assert!(
        matches!(e, Error::Disconnected | Error::Insecure(_)),
        "garbage client: {e}"
    );
    let e = dripper.join().unwrap();
    assert!(
        matches!(e, Error::Disconnected | Error::Insecure(_)),
        "dripping client: {e}"
    );
    let e = wrong.join().unwrap();
    assert!(
        matches!(e, Error::Insecure(_)) && e.to_string().contains(&server_fp.to_string()),
        "wrong pin: {e}"
    );
    // Back after the server's linger: the reason still reaches it (its send finds the
    // connection reset, and it reads what the server said last).
    let e = hanger.join().unwrap();
    assert!(
        matches!(e, Error::PeerClosed(_)) && e.to_string().contains("(the idle deadline)"),
        "hanging client: {e}"
    );
    drop(raw);

    // Every connection thread ends; the process is back at its idle thread count.
    let until = Instant::now() + Duration::from_secs(15);
    while (server.connections() > 0 || threads() > idle) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.connections(), 0);
    assert!(threads() <= idle, "{} threads, {idle} when idle", threads());

    let text = log.text();
    let count = |s: &str| text.lines().filter(|l| l.contains(s)).count();
    assert_eq!(count("session ended"), HONEST, "{text}");
    assert_eq!(count(": inference tokens="), HONEST, "{text}");
    assert!(count("not a Veil client") >= 1, "{text}");
    // The dripper was dropped at its 2 s deadline, although it never paused for long.
    let drip = text
        .lines()
        .find(|l| l.contains("waiting for the hello"))
        .unwrap_or_else(|| panic!("no timeout for the dripper: {text}"));
    assert!(drip.contains("timed out"), "{drip}");
    let secs: f64 = drip
        .split("seconds=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no duration: {drip}"));
    assert!(
        (1.9..3.0).contains(&secs),
        "dripper held its session {secs} s: {drip}"
    );
    assert!(count("waiting for the next request") >= 1, "{text}");
    assert!(count("TLS") >= 2, "raw garbage and the wrong pin: {text}");
    assert!(text.contains("session{id="), "structured spans: {text}");

    shutdown.store(true, std::sync::atomic::Ordering::SeqCst);
    accept.join().unwrap().unwrap();
    // The soak test is bounded in time by its deadlines; this says so if one stops working.
    assert!(test_start.elapsed() < Duration::from_secs(120));
}
