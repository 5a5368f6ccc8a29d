//! Admission under attack, loopback only, bounded in time and count: honest TLS clients are
//! served (each equal to the simulator bit for bit, each within its deadline) while a bounded
//! mix of hostile connections stays open, each reconnecting as soon as it is dropped: idle TCP
//! connections, half TLS handshakes, clients that send a hello and go quiet, clients dripping
//! their hello, and a flood of connections opened and closed at once. No slot is held longer
//! than the fixed set-up deadline, and the server's threads return to idle.
//! One test in this file: the thread count is the process's.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_net::Channel;
use veil_private::protocol::{Hello, Message};
use veil_private::{ClientConnection, ClientOptions, ServerBuilder, ServerIdentity};

use common::{threads, tls_to, Log};

const HONEST: usize = 4;
const IDLE: usize = 10;
const HALF: usize = 3;
const SILENT: usize = 3;
const DRIPPERS: usize = 2;
const SETUP: Duration = Duration::from_secs(8);

/// Waits until the server closes `s` (or `stop` is set).
fn until_closed(mut s: TcpStream, stop: &AtomicBool) {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::SeqCst) {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// Runs `attack` again each time it returns, until `stop`.
fn hostile(
    stop: &Arc<AtomicBool>,
    attack: impl Fn(&AtomicBool) + Send + 'static,
) -> std::thread::JoinHandle<usize> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut rounds = 0;
        while !stop.load(Ordering::SeqCst) {
            attack(&stop);
            rounds += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        rounds
    })
}

#[test]
fn honest_clients_are_served_while_hostile_connections_reconnect() {
    let test_start = Instant::now();
    let log = Log::capture();

    let (fixed, model) = common::friendly_model(41);

    // The worker pool exists from here on; this is the idle level.
    veil_core::parallel::pool().install(|| ());
    std::thread::sleep(Duration::from_millis(100));
    let idle = threads();

    let server = ServerBuilder::new(ServerIdentity::Ephemeral)
        .max_sessions(Some(4))
        .queue(Some(8))
        .queue_wait(Duration::from_secs(30))
        .handshake_timeout(Duration::from_secs(2))
        .setup_timeout(SETUP)
        .idle_timeout(Duration::from_secs(2))
        .max_handshakes(48)
        .per_address(40)
        .build_prepared(model)
        .unwrap();
    let server_fp = server.fingerprint().unwrap();
    let running = server
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let addr = running.local_addr().to_string();

    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = vec![];
    for _ in 0..IDLE {
        let addr = addr.clone();
        attackers.push(hostile(&stop, move |stop| {
            if let Ok(s) = TcpStream::connect(&addr) {
                until_closed(s, stop);
            }
        }));
    }
    for _ in 0..HALF {
        let addr = addr.clone();
        attackers.push(hostile(&stop, move |stop| {
            if let Ok(mut s) = TcpStream::connect(&addr) {
                // The start of a TLS record carrying a ClientHello, never finished.
                let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc]);
                until_closed(s, stop);
            }
        }));
    }
    for _ in 0..SILENT {
        let addr = addr.clone();
        attackers.push(hostile(&stop, move |stop| {
            if let Ok(mut ch) = tls_to(&addr, server_fp) {
                let _ = Hello { max_tokens: 8 }.send(&mut ch);
                let _ = ch.flush();
                let _ = ch.set_deadline(Some(Instant::now() + Duration::from_secs(60)));
                while !stop.load(Ordering::SeqCst) && ch.recv_msg(1 << 20).is_ok() {}
            }
        }));
    }
    for _ in 0..DRIPPERS {
        let addr = addr.clone();
        attackers.push(hostile(&stop, move |stop| {
            if let Ok(mut ch) = tls_to(&addr, server_fp) {
                let mut hello = 12u32.to_le_bytes().to_vec();
                hello.extend_from_slice(&Hello { max_tokens: 8 }.encode());
                for b in hello {
                    if stop.load(Ordering::SeqCst)
                        || ch.send(&[b]).and_then(|_| ch.flush()).is_err()
                    {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        }));
    }
    {
        let addr = addr.clone();
        attackers.push(hostile(&stop, move |_| drop(TcpStream::connect(&addr))));
    }
    // Let the hostile mix fill its places first.
    std::thread::sleep(Duration::from_millis(1500));

    let prompts: [&[u32]; 2] = [&[5, 6, 7], &[9, 1, 4, 4, 2, 8]];
    let step = Duration::from_secs(90);
    let honest: Vec<_> = (0..HONEST)
        .map(|i| {
            let (x, want) = common::simulated(&fixed, prompts[i % 2]);
            let addr = addr.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let ch = tls_to(&addr, server_fp).unwrap();
                let opts = ClientOptions {
                    max_tokens: Some(8),
                    step_timeout: Some(step),
                };
                let mut c = ClientConnection::connect_with(ch, opts, |_| Ok(()))
                    .unwrap_or_else(|e| panic!("honest client {i}: {e}"));
                let (y, _) = c.infer(&x, None).unwrap();
                c.close().unwrap();
                assert_eq!(y, want, "client {i}");
                start.elapsed()
            })
        })
        .collect();
    let took: Vec<Duration> = honest.into_iter().map(|h| h.join().unwrap()).collect();
    for t in &took {
        assert!(*t < step, "an honest client took {t:?}");
    }

    stop.store(true, Ordering::SeqCst);
    let rounds: usize = attackers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        rounds > IDLE + HALF + SILENT,
        "the attackers reconnected: {rounds} rounds"
    );

    // Every connection thread ends (hostile ones at their deadlines); back to idle.
    let until = Instant::now() + Duration::from_secs(20);
    while (running.connections() > 0 || threads() > idle + 1) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(running.connections(), 0);
    // The accepting thread is the one beyond the idle level.
    assert!(
        threads() <= idle + 1,
        "{} threads, {idle} when idle",
        threads()
    );

    let text = log.text();
    let lines = |s: &str| text.lines().filter(|l| l.contains(s)).collect::<Vec<_>>();
    assert_eq!(lines("session ended").len(), HONEST, "{text}");
    // Silent sessions were dropped at the set-up deadline, never later.
    let setups = lines("set-up did not finish");
    assert!(!setups.is_empty(), "no silent session timed out: {text}");
    for l in setups {
        let secs: f64 = l
            .split("seconds=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no duration: {l}"));
        assert!(
            secs < SETUP.as_secs_f64() + 2.0,
            "a slot held {secs} s: {l}"
        );
    }
    // Connections that showed nothing were dropped at the 2 s handshake deadline.
    assert!(!lines("TLS handshake").is_empty(), "{text}");
    assert!(!lines("waiting for the hello").is_empty(), "{text}");

    running.stop().unwrap();
    assert!(test_start.elapsed() < Duration::from_secs(120));
}
