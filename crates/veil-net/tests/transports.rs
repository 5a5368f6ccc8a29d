use veil_core::{CostClass, Error};
use veil_net::{mem_pair, run_two_party, run_two_party_tcp, Channel, Role};

fn ping_pong<C: Channel>(ch: &mut C, first: bool) -> veil_core::Result<Vec<u8>> {
    if first {
        ch.send_msg(b"hello")?;
        ch.recv_msg(100)
    } else {
        let m = ch.recv_msg(100)?;
        ch.send_msg(&[m.as_slice(), b" back"].concat())?;
        Ok(m)
    }
}

#[test]
fn memory_duplex_round_trip_and_metering() {
    let (c, s) = run_two_party(
        |ch| {
            let _g = ch.meter().enter(CostClass::Setup);
            let r = ping_pong(ch, true)?;
            Ok((r, ch.meter().snapshot()))
        },
        |ch| ping_pong(ch, false),
    )
    .unwrap();
    assert_eq!(c.0, b"hello back");
    assert_eq!(s, b"hello");
    let stats = &c.1[&CostClass::Setup];
    assert_eq!(stats.client_to_server(Role::Client), 4 + 5);
    assert_eq!(stats.server_to_client(Role::Client), 4 + 10);
    assert_eq!(stats.rounds(), 2);
}

#[test]
fn tcp_round_trip() {
    let (c, s) = run_two_party_tcp(|ch| ping_pong(ch, true), |ch| ping_pong(ch, false)).unwrap();
    assert_eq!(c, b"hello back");
    assert_eq!(s, b"hello");
}

#[test]
fn large_messages_cross_intact() {
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let d2 = data.clone();
    let (_, got) =
        run_two_party_tcp(move |ch| ch.send_msg(&d2), |ch| ch.recv_msg(10_000_000)).unwrap();
    assert_eq!(got, data);
}

#[test]
fn oversized_prefix_is_rejected_before_allocation() {
    let (mut a, mut b) = mem_pair();
    a.send(&u32::MAX.to_le_bytes()).unwrap();
    a.flush().unwrap();
    assert!(matches!(b.recv_msg(1024), Err(Error::TooLarge { .. })));
}

#[test]
fn hang_up_is_disconnected_not_panic() {
    let (a, mut b) = mem_pair();
    drop(a);
    assert!(matches!(b.recv_msg(16), Err(Error::Disconnected)));

    let r = run_two_party_tcp(
        |ch| {
            ch.send(&[1, 0])?; // half a length prefix, then hang up
            Ok(())
        },
        |ch| ch.recv_msg(16),
    );
    assert!(matches!(r, Err(Error::Disconnected)), "got {:?}", r.err());
}

/// Records on both ends (a session after its admission): a message each way, then the server
/// closes with a reason while the client is sending 3 MiB it never reads; the client's next
/// receive is that reason, whatever it was waiting for. Returns the client's error, the
/// server's received message, and both meters' totals.
/// One end's view of [`close_mid_flight`]: its error text (the client's), the message it
/// received, the data bytes metered.
type Seen = (String, Vec<u8>, u64);

fn close_mid_flight<C: Channel>(ch: &mut C, client: bool) -> veil_core::Result<Seen> {
    ch.start_records()?;
    let got = ping_pong(ch, client)?;
    if client {
        // The send itself may find the server gone (its end dropped, or a reset): then it
        // reports the reason.
        let mut busy = || {
            ch.send(&vec![7u8; 3 << 20])?;
            ch.flush()?;
            ch.recv_msg(100)
        };
        let e = busy().unwrap_err();
        assert!(matches!(e, Error::PeerClosed(_)), "{e}");
        // Every later receive says the same.
        assert_eq!(
            ch.recv(&mut [0u8; 1]).unwrap_err().to_string(),
            e.to_string()
        );
        Ok((e.to_string(), got, ch.meter().total().bytes_received))
    } else {
        let bytes = ch.meter().total().bytes_sent;
        // A step whose deadline passed is the usual reason to close: the close still leaves.
        ch.set_deadline(Some(std::time::Instant::now()))?;
        ch.close_with(&format!("shutting down\x1b[2J{}", "x".repeat(600)))?;
        Ok((String::new(), got, bytes))
    }
}

fn check_close((c, s): (Seen, Seen)) {
    assert!(
        c.0.starts_with("the peer closed the session: shutting down\\u{1b}[2Jxxx"),
        "{}",
        c.0
    );
    assert_eq!(c.0.matches('x').count(), veil_net::MAX_REASON_BYTES - 17);
    assert_eq!(
        (c.1.as_slice(), s.1.as_slice()),
        (&b"hello back"[..], &b"hello"[..])
    );
    // The meters count the data, not the records' headers.
    assert_eq!((c.2, s.2), (4 + 10, 4 + 10));
}

#[test]
fn a_close_with_a_reason_reaches_a_busy_peer_on_every_transport() {
    let (c, s) = (
        |ch: &mut _| close_mid_flight(ch, true),
        |ch: &mut _| close_mid_flight(ch, false),
    );
    check_close(run_two_party(c, s).unwrap());
    let (c, s) = (
        |ch: &mut _| close_mid_flight(ch, true),
        |ch: &mut _| close_mid_flight(ch, false),
    );
    check_close(veil_net::run_two_party_tcp(c, s).unwrap());
    let (c, s) = (
        |ch: &mut _| close_mid_flight(ch, true),
        |ch: &mut _| close_mid_flight(ch, false),
    );
    check_close(veil_net::run_two_party_tls(c, s).unwrap());
    let clock = std::sync::Arc::new(veil_net::RealClock::new());
    let shaped = veil_net::shaped_pair(veil_net::LAN, clock).unwrap();
    let (c, s) = (
        |ch: &mut _| close_mid_flight(ch, true),
        |ch: &mut _| close_mid_flight(ch, false),
    );
    check_close(veil_net::run_two_party_on(shaped, c, s).unwrap());
}

/// Without records a socket cannot tell a reason from data: nothing is sent, the peer sees
/// the hang-up.
#[test]
fn a_close_before_records_is_a_plain_hang_up() {
    let (c, _) = run_two_party_tcp(
        |ch| Ok(ch.recv(&mut [0u8; 1]).unwrap_err()),
        |ch| ch.close_with("why"),
    )
    .unwrap();
    assert!(matches!(c, Error::Disconnected), "{c}");
}

/// A read stopped from another thread (a server ending its sessions) returns within a poll
/// while the peer is silent.
#[test]
fn a_stopped_read_returns_while_the_peer_is_silent() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let (e, _) = run_two_party_tcp(
        |ch| {
            let stop = std::sync::Arc::new(AtomicBool::new(false));
            ch.stop_reads_on(stop.clone());
            let setter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::SeqCst);
            });
            let start = Instant::now();
            let e = ch.recv(&mut [0u8; 1]).unwrap_err();
            setter.join().unwrap();
            let took = start.elapsed();
            assert!(took < Duration::from_millis(1500), "{took:?}");
            Ok(e)
        },
        |_| {
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        },
    )
    .unwrap();
    assert!(e.to_string().contains("reading stopped"), "{e}");
}
