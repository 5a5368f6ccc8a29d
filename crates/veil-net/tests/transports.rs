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
