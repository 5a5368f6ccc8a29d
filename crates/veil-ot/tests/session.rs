//! Every OtSession flavour against its ideal functionality, both parties in threads, both
//! directions, plus TCP loopback and misbehaving peers.

use veil_core::{Error, Prg, Result};
use veil_net::{run_two_party, run_two_party_tcp, Channel, MemChannel, Role};
use veil_ot::{Backend, OneOfN, OtSession};

fn mask(bits: u32) -> u64 {
    if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    }
}

/// Runs `f_client` / `f_server` after a session set-up on both ends.
fn with_sessions<A: Send, B: Send>(
    backend: Backend,
    f_client: impl FnOnce(&mut OtSession, &mut MemChannel) -> Result<A> + Send,
    f_server: impl FnOnce(&mut OtSession, &mut MemChannel) -> Result<B> + Send,
) -> Result<(A, B)> {
    run_two_party(
        move |c| {
            let mut s = OtSession::setup_with(c, Role::Client, backend)?;
            f_client(&mut s, c)
        },
        move |c| {
            let mut s = OtSession::setup_with(c, Role::Server, backend)?;
            f_server(&mut s, c)
        },
    )
}

fn random_bools(n: usize) -> Vec<bool> {
    let mut p = Prg::from_os_entropy();
    (0..n).map(|_| p.bit()).collect()
}

fn random_values(n: usize, bits: u32) -> Vec<u64> {
    let mut p = Prg::from_os_entropy();
    (0..n).map(|_| p.u64() & mask(bits)).collect()
}

/// |ones − n/2| within 6 standard deviations (false alarm ~1e-9).
fn assert_balanced(bits: impl Iterator<Item = bool>, what: &str) {
    let (mut ones, mut n) = (0i64, 0i64);
    for b in bits {
        ones += b as i64;
        n += 1;
    }
    let sd = ((n as f64) / 4.0).sqrt();
    assert!(
        ((ones - n / 2) as f64).abs() < 6.0 * sd,
        "{what}: {ones} ones of {n}"
    );
}

/// Checks 1-of-N against its ideal functionality: the sender's share r_i (< 2^bits) XOR the
/// receiver's output is the chosen message, for every choice including 0 (whose row is never
/// sent).
fn check_1_of_n(backend: Backend, log_n: u32, count: usize, bits: u32) {
    let n = 1usize << log_n;
    let table = random_values(count * n, bits);
    let mut p = Prg::from_os_entropy();
    let mut choices: Vec<u8> = (0..count).map(|_| p.below(n as u64) as u8).collect();
    if count > 0 {
        choices[0] = 0;
    }
    let (t, c) = (table.clone(), choices.clone());
    let group = OneOfN { log_n, count, bits };
    let (mut got, mut shares) = with_sessions(
        backend,
        move |s, ch| s.recv_1_of_n_shared_groups(ch, &[(log_n, bits, &c)]),
        move |s, ch| {
            s.send_1_of_n_shared_groups(ch, &[group], |_, i, row| {
                row.copy_from_slice(&t[i * n..(i + 1) * n])
            })
        },
    )
    .unwrap();
    let (got, shares) = (got.remove(0), shares.remove(0));
    assert_eq!(shares.len(), count);
    for i in 0..count {
        assert_eq!(shares[i] & !mask(bits), 0, "share {i} exceeds {bits} bits");
        assert_eq!(
            got[i] ^ shares[i],
            table[i * n + choices[i] as usize],
            "log_n {log_n} OT {i}"
        );
    }
}

/// The arithmetic (`xor` false) or binary COT against its ideal functionality.
fn check_cot(backend: Backend, n: usize, bits: u32, xor: bool) {
    let deltas = random_values(n, bits);
    let choices = random_bools(n);
    let (d, c) = (deltas.clone(), choices.clone());
    let (y, x) = with_sessions(
        backend,
        move |s, ch| match xor {
            true => s.recv_xor_cot_widths(ch, &c, &[bits]),
            false => s.recv_arith_cot(ch, &c, bits),
        },
        move |s, ch| match xor {
            true => s.send_xor_cot_widths(ch, &d, &[bits]),
            false => s.send_arith_cot(ch, &d, bits),
        },
    )
    .unwrap();
    for i in 0..n {
        let want = match (choices[i], xor) {
            (false, _) => x[i],
            (true, false) => x[i].wrapping_add(deltas[i]) & mask(bits),
            (true, true) => x[i] ^ deltas[i],
        };
        assert_eq!(y[i], want, "COT {i} (xor: {xor})");
        assert_eq!(x[i] & !mask(bits), 0);
    }
    // x must be uniform: its low and top bits are balanced.
    assert_balanced(x.iter().map(|v| v & 1 == 1), "x low bit");
    assert_balanced(x.iter().map(|v| (v >> (bits - 1)) & 1 == 1), "x top bit");
}

#[test]
fn iknp_1_of_n_matches_ideal_functionality_for_every_n() {
    check_1_of_n(Backend::Iknp, 4, 20_000, 2);
    // The millionaire's leaves: rows of one word (packed path) and the widest such row.
    check_1_of_n(Backend::Iknp, 3, 5_000, 1);
    check_1_of_n(Backend::Iknp, 3, 5_000, 2);
    check_1_of_n(Backend::Iknp, 3, 300, 8);
    check_1_of_n(Backend::Iknp, 2, 300, 16);
    check_1_of_n(Backend::Iknp, 2, 0, 16);
    // Every N.
    for log_n in 1..=8 {
        check_1_of_n(
            Backend::Iknp,
            log_n,
            300,
            if log_n % 2 == 0 { 64 } else { 5 },
        );
    }
}

/// Grouped shared 1-of-N (one call, groups of different N, widths and counts, an empty one
/// among them) against its ideal functionality, and its flights: two, like a single group.
#[test]
fn grouped_shared_1_of_n_matches_ideal_functionality_in_two_flights() {
    let groups = [
        OneOfN {
            log_n: 3,
            count: 700,
            bits: 1,
        },
        OneOfN {
            log_n: 2,
            count: 700,
            bits: 2,
        },
        OneOfN {
            log_n: 1,
            count: 0,
            bits: 2,
        },
        OneOfN {
            log_n: 5,
            count: 33,
            bits: 9,
        },
        OneOfN {
            log_n: 3,
            count: 1_500,
            bits: 2,
        },
    ];
    let mut p = Prg::from_os_entropy();
    let tables: Vec<Vec<u64>> = groups
        .iter()
        .map(|g| random_values(g.count << g.log_n, g.bits))
        .collect();
    let choices: Vec<Vec<u8>> = groups
        .iter()
        .map(|g| (0..g.count).map(|_| p.below(1 << g.log_n) as u8).collect())
        .collect();
    let (t, c) = (tables.clone(), choices.clone());
    let ((got, recv_flights), shares) = with_sessions(
        Backend::Iknp,
        move |s, ch| {
            s.precompute(ch, 20_000)?;
            ch.flush()?;
            let before = ch.meter().total().rounds();
            let spec: Vec<(u32, u32, &[u8])> = groups
                .iter()
                .zip(&c)
                .map(|(g, c)| (g.log_n, g.bits, c.as_slice()))
                .collect();
            let got = s.recv_1_of_n_shared_groups(ch, &spec)?;
            ch.flush()?;
            Ok((got, ch.meter().total().rounds() - before))
        },
        move |s, ch| {
            s.precompute(ch, 20_000)?;
            s.send_1_of_n_shared_groups(ch, &groups, |g, i, row| {
                let n = 1 << groups[g].log_n;
                row.copy_from_slice(&t[g][i * n..(i + 1) * n])
            })
        },
    )
    .unwrap();
    assert_eq!(recv_flights, 2, "corrections up, masked rows down");
    for (gi, g) in groups.iter().enumerate() {
        assert_eq!((got[gi].len(), shares[gi].len()), (g.count, g.count));
        for i in 0..g.count {
            let want = tables[gi][(i << g.log_n) + choices[gi][i] as usize];
            assert_eq!(got[gi][i] ^ shares[gi][i], want, "group {gi} OT {i}");
        }
    }
}

/// Arithmetic and binary COTs whose widths cycle through a pattern (a product's bit positions,
/// a comparison tree's gates), for counts that do and do not fill the last cycle.
#[test]
fn cots_with_cycling_widths_match_ideal_functionality() {
    let widths = [41u32, 33, 7, 1, 64];
    for xor in [false, true] {
        for n in [0usize, 3, 5, 10_001] {
            let deltas: Vec<u64> = (0..n)
                .map(|i| random_values(1, widths[i % widths.len()])[0])
                .collect();
            let choices = random_bools(n);
            let (d, c) = (deltas.clone(), choices.clone());
            let (y, x) = with_sessions(
                Backend::Iknp,
                move |s, ch| match xor {
                    false => s.recv_arith_cot_widths(ch, &c, &widths),
                    true => s.recv_xor_cot_widths(ch, &c, &widths),
                },
                move |s, ch| match xor {
                    false => s.send_arith_cot_widths(ch, &d, &widths),
                    true => s.send_xor_cot_widths(ch, &d, &widths),
                },
            )
            .unwrap();
            for i in 0..n {
                let m = mask(widths[i % widths.len()]);
                assert_eq!(x[i] & !m, 0, "x {i} exceeds its width");
                let want = match (choices[i], xor) {
                    (false, _) => x[i],
                    (true, false) => x[i].wrapping_add(deltas[i]) & m,
                    (true, true) => x[i] ^ deltas[i],
                };
                assert_eq!(
                    y[i],
                    want,
                    "COT {i} of width {} (xor {xor})",
                    widths[i % widths.len()]
                );
            }
        }
    }
    // A correlation wider than its slot is refused before any traffic.
    let r = with_sessions(
        Backend::Iknp,
        |_, _| Ok(()),
        |s, ch| {
            s.send_arith_cot_widths(ch, &[1, 1 << 7], &[41, 7])
                .map(drop)
        },
    );
    assert!(r.is_err());
}

#[test]
fn iknp_arith_and_xor_cots_match_ideal_functionality() {
    for xor in [false, true] {
        check_cot(Backend::Iknp, 100_000, 41, xor);
        check_cot(Backend::Iknp, 10_000, 64, xor);
        check_cot(Backend::Iknp, 10_000, 2, xor);
        check_cot(Backend::Iknp, 10_000, 1, xor);
    }
}

/// Records what the wrapped channel receives, to look at ciphertexts on the wire.
struct Recording<'a> {
    inner: &'a mut MemChannel,
    received: Vec<u8>,
}

impl Channel for Recording<'_> {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.inner.send(data)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.inner.recv(buf)?;
        self.received.extend_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        self.inner.flush()
    }
    fn meter(&self) -> &veil_net::Meter {
        self.inner.meter()
    }
}

#[test]
fn ciphertexts_of_constant_messages_look_random() {
    // All messages and correlations are zero, so the wire carries bare pads the receiver must
    // not learn: 1-of-2 rows K_0 ⊕ K_1 (choice 0, K_1 unknown) and COT words pad_0 − pad_1. Both
    // must be unbiased, not constant.
    let n = 40_000;
    for cot in [false, true] {
        let group = OneOfN {
            log_n: 1,
            count: n,
            bits: 8,
        };
        let (wire, ()) = with_sessions(
            Backend::Iknp,
            move |s, ch| {
                s.precompute(ch, n)?;
                let mut rec = Recording {
                    inner: ch,
                    received: Vec::new(),
                };
                if cot {
                    s.recv_arith_cot(&mut rec, &vec![false; n], 8)?;
                } else {
                    s.recv_1_of_n_shared_groups(&mut rec, &[(1, 8, &vec![0; n])])?;
                }
                Ok(rec.received)
            },
            move |s, ch| {
                s.precompute(ch, n)?;
                if cot {
                    s.send_arith_cot(ch, &vec![0; n], 8).map(drop)
                } else {
                    s.send_1_of_n_shared_groups(ch, &[group], |_, _, row| row.fill(0))
                        .map(drop)
                }
            },
        )
        .unwrap();
        let body = &wire[4..]; // skip the length prefix; then one byte per OT
        assert_eq!(body.len(), n);
        assert_balanced(body.iter().map(|b| b & 1 == 1), "pad bit 0");
        assert_balanced(body.iter().map(|b| b >> 7 == 1), "pad bit 7");
    }
}

#[test]
fn precompute_then_consume_over_tcp() {
    let n = 50_000;
    let deltas = random_values(n, 41);
    let choices = random_bools(n);
    let (d, c) = (deltas.clone(), choices.clone());
    let (y, x) = run_two_party_tcp(
        move |ch| {
            let mut s = OtSession::setup(ch, Role::Client)?;
            s.precompute(ch, n)?;
            assert!(s.available().1 >= n);
            s.recv_arith_cot(ch, &c, 41)
        },
        move |ch| {
            let mut s = OtSession::setup(ch, Role::Server)?;
            s.precompute(ch, n)?;
            s.send_arith_cot(ch, &d, 41)
        },
    )
    .unwrap();
    for i in 0..n {
        let want = if choices[i] {
            x[i].wrapping_add(deltas[i]) & mask(41)
        } else {
            x[i]
        };
        assert_eq!(y[i], want);
    }
}

/// A pool filled by several silent iterations in one refill (the later ones appended to the
/// first): every COT of it, to the last, is a correct correlation.
#[test]
fn a_multi_iteration_pool_is_correct_to_its_end() {
    let n = 13_000_000;
    let deltas = random_values(n, 1);
    let choices = random_bools(n);
    let (d, c) = (deltas.clone(), choices.clone());
    let (y, x) = with_sessions(
        Backend::Silent,
        move |s, ch| {
            s.precompute(ch, n)?;
            s.recv_xor_cot_widths(ch, &c, &[1])
        },
        move |s, ch| {
            s.precompute(ch, n)?;
            s.send_xor_cot_widths(ch, &d, &[1])
        },
    )
    .unwrap();
    for i in 0..n {
        assert_eq!(y[i], x[i] ^ (choices[i] as u64 & deltas[i]), "COT {i}");
    }
    assert_balanced(
        x[n - 100_000..].iter().map(|v| v & 1 == 1),
        "x of the last COTs",
    );
}

/// Pools refilled in seed form to what calls will draw, each direction to its own count, hold
/// exactly the bytes `pool_bytes_for_ready` names, and the calls that draw them (more than one
/// iteration one way) refill nothing and get correct correlations; refilling past the limit is
/// an error.
#[test]
fn refilled_pools_draw_without_refilling() {
    use veil_core::CostClass;
    let (down, up) = (7_000_000, 100_000);
    let refill_bytes = |ch: &MemChannel| {
        ch.meter()
            .by_class()
            .get(&CostClass::OtRefill)
            .map_or(0, |r| r.bytes_sent + r.bytes_received)
    };
    let (deltas_down, choices_down) = (random_values(down, 1), random_bools(down));
    let (deltas_up, choices_up) = (random_values(up, 13), random_bools(up));
    let (cd, du, dd, cu) = (
        choices_down.clone(),
        deltas_up.clone(),
        deltas_down.clone(),
        choices_up.clone(),
    );
    let ((y_down, x_up, client_bytes), (x_down, y_up, server_bytes)) = run_two_party(
        move |ch| {
            let mut s = OtSession::setup(ch, Role::Client)?;
            assert!(s.refill(ch, OtSession::MAX_READY + 1, 0).is_err());
            let (before, estimate) = (s.pool_bytes(), s.pool_bytes_for_ready((up, down), 0));
            s.refill(ch, up, down)?;
            let bytes = (s.pool_bytes() - before, estimate);
            let refilled = refill_bytes(ch);
            let y = s.recv_xor_cot_widths(ch, &cd, &[1])?;
            let x = s.send_arith_cot(ch, &du, 41)?;
            assert_eq!(refill_bytes(ch), refilled, "a call refilled");
            Ok((y, x, bytes))
        },
        move |ch| {
            let mut s = OtSession::setup(ch, Role::Server)?;
            let (before, estimate) = (s.pool_bytes(), s.pool_bytes_for_ready((down, up), 0));
            s.refill(ch, down, up)?;
            let bytes = (s.pool_bytes() - before, estimate);
            let refilled = refill_bytes(ch);
            let x = s.send_xor_cot_widths(ch, &dd, &[1])?;
            let y = s.recv_arith_cot(ch, &cu, 41)?;
            assert_eq!(refill_bytes(ch), refilled, "a call refilled");
            Ok((x, y, bytes))
        },
    )
    .unwrap();
    for (held, estimate) in [client_bytes, server_bytes] {
        assert_eq!(held, estimate);
    }
    for i in 0..down {
        assert_eq!(
            y_down[i],
            x_down[i] ^ (choices_down[i] as u64 & deltas_down[i]),
            "COT {i}"
        );
    }
    for i in 0..up {
        let want = if choices_up[i] {
            x_up[i].wrapping_add(deltas_up[i]) & mask(41)
        } else {
            x_up[i]
        };
        assert_eq!(y_up[i], want, "COT {i} up");
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let r = with_sessions(
        Backend::Iknp,
        |s, ch| {
            for (log_n, bits, choice) in [(2, 0, 1u8), (2, 8, 4), (9, 8, 0)] {
                assert!(matches!(
                    s.recv_1_of_n_shared_groups(ch, &[(log_n, bits, &[choice])]),
                    Err(Error::InvalidArgument(_))
                ));
            }
            Ok(())
        },
        |s, ch| {
            let too_big = OneOfN {
                log_n: 9,
                count: 1,
                bits: 8,
            };
            assert!(matches!(
                s.send_1_of_n_shared_groups(ch, &[too_big], |_, _, _| ()),
                Err(Error::InvalidArgument(_))
            ));
            assert!(matches!(
                s.send_arith_cot(ch, &[1 << 41], 41),
                Err(Error::InvalidArgument(_))
            ));
            Ok(())
        },
    );
    r.unwrap();
}

/// A receiver (`recv`, after pre-generating `cots` COTs) facing a sender that reads the choice
/// corrections and replies with `reply` instead of its message (or hangs up if `None`).
fn receiver_against_bad_sender(
    cots: usize,
    recv: impl FnOnce(&mut OtSession, &mut MemChannel) -> Result<Vec<u64>> + Send,
    reply: Option<Vec<u8>>,
) -> Result<Vec<u64>> {
    let (r, ()) = with_sessions(
        Backend::Iknp,
        move |s, ch| {
            s.precompute(ch, cots)?;
            recv(s, ch)
        },
        move |s, ch| {
            s.precompute(ch, cots)?;
            let _corrections = ch.recv_msg(1 << 10)?;
            match reply {
                Some(bytes) => ch.send_msg(&bytes),
                None => Ok(()),
            }
        },
    )?;
    Ok(r)
}

/// The 1-of-4 receiver (3 OTs of 8 bits: 3 × 3 rows = 9 bytes) against a sender that replies
/// with `reply` (or hangs up if `None`).
fn shared_receiver_against_bad_sender(reply: Option<Vec<u8>>) -> Result<Vec<u64>> {
    receiver_against_bad_sender(
        6,
        |s, ch| {
            let mut out = s.recv_1_of_n_shared_groups(ch, &[(2, 8, &[0, 3, 1])])?;
            Ok(out.remove(0))
        },
        reply,
    )
}

#[test]
fn bad_sender_messages_are_errors_not_panics() {
    assert!(matches!(
        shared_receiver_against_bad_sender(Some(vec![0; 8])),
        Err(Error::Malformed(_))
    ));
    // A length with row 0 included is too long.
    assert!(matches!(
        shared_receiver_against_bad_sender(Some(vec![0; 12])),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        shared_receiver_against_bad_sender(None),
        Err(Error::Disconnected)
    ));
    // Garbage of the right length decodes to garbage messages: no error is possible, no panic.
    assert!(shared_receiver_against_bad_sender(Some(vec![0x5a; 9])).is_ok());
}

/// A multi-width COT receiver (widths 7 and 3 for 3 COTs: 17 bits, 3 bytes with 7 zero padding
/// bits) facing a sender's reply of the wrong length or with stray padding bits.
fn widths_receiver_against_bad_sender(reply: Vec<u8>) -> Result<Vec<u64>> {
    receiver_against_bad_sender(
        3,
        |s, ch| s.recv_arith_cot_widths(ch, &[true, false, true], &[7, 3]),
        Some(reply),
    )
}

#[test]
fn bad_multi_width_cot_messages_are_errors_not_panics() {
    assert!(matches!(
        widths_receiver_against_bad_sender(vec![0; 2]),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        widths_receiver_against_bad_sender(vec![0, 0, 0x80]),
        Err(Error::Malformed(_))
    ));
    assert!(widths_receiver_against_bad_sender(vec![0; 4]).is_err());
    assert!(widths_receiver_against_bad_sender(vec![0xff, 0xff, 0x01]).is_ok());
}

#[test]
fn bad_receiver_messages_are_errors_not_panics() {
    // 5 OTs need 5 correction bits: 1 byte with zero padding bits 5..7.
    for reply in [Some(vec![0xffu8; 2]), Some(vec![0xf0]), Some(vec![]), None] {
        let hung_up = reply.is_none();
        let r = with_sessions(
            Backend::Iknp,
            move |s, ch| {
                s.precompute(ch, 5)?;
                if let Some(bytes) = reply {
                    ch.send_msg(&bytes)?;
                }
                Ok(())
            },
            |s, ch| {
                s.precompute(ch, 5)?;
                let group = OneOfN {
                    log_n: 1,
                    count: 5,
                    bits: 8,
                };
                s.send_1_of_n_shared_groups(ch, &[group], |_, _, row| row.fill(0))
                    .map(drop)
            },
        );
        match r {
            Err(Error::Disconnected) => assert!(hung_up),
            Err(Error::Malformed(_)) | Err(Error::TooLarge { .. }) => assert!(!hung_up),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn garbage_during_setup_is_an_error() {
    let r = run_two_party(
        |ch| OtSession::setup(ch, Role::Client).map(|_| ()),
        |ch| {
            ch.send_msg(&[7u8; 32])?;
            ch.recv_msg(1 << 20).map(|_| ())
        },
    );
    assert!(r.is_err());
}

/// Drains each pool to 1000 COTs, then takes 6000: the refill (a second main iteration in each
/// direction) moves the 1000 behind the new batch, and the binary COTs span the seam.
fn drain_then_refill(s: &mut OtSession, ch: &mut MemChannel) -> Result<()> {
    let server = s.role() == Role::Server;
    let (send_left, recv_left) = s.available();
    let n = 6000;
    let mut check = Vec::new();
    // The server's sending direction first; each party's pools mirror the peer's.
    for k in 0..2 {
        let sending = server == (k == 0);
        if sending {
            s.send_xor_cot_widths(ch, &vec![0; send_left - 1000], &[1])?;
            let d = random_values(n, 1);
            let x = s.send_xor_cot_widths(ch, &d, &[1])?;
            let flat: Vec<u8> = x.iter().zip(&d).map(|(x, d)| (x | d << 1) as u8).collect();
            ch.send_msg(&flat)?;
        } else {
            s.recv_xor_cot_widths(ch, &vec![false; recv_left - 1000], &[1])?;
            let c = random_bools(n);
            let y = s.recv_xor_cot_widths(ch, &c, &[1])?;
            let xd = ch.recv_msg(n)?;
            for i in 0..n {
                let (x, d) = (xd[i] as u64 & 1, xd[i] as u64 >> 1);
                check.push(y[i] == x ^ (c[i] as u64 & d));
            }
        }
    }
    assert!(check.iter().all(|&ok| ok), "COTs across the refill seam");
    Ok(())
}

#[test]
fn silent_session_serves_every_flavour_across_a_refill() {
    // The bootstrap leaves ~45k COTs per direction; 60k binary COTs force one main iteration in
    // each direction, and the later calls consume its output.
    let n = 60_000;
    let deltas41 = random_values(n, 41);
    let choices = random_bools(n);
    let table = random_values(1000 * 16, 4);
    let mut p = Prg::from_os_entropy();
    let n_choices: Vec<u8> = (0..1000).map(|_| p.below(16) as u8).collect();
    let deltas = random_values(5000, 64);
    let a_choices = random_bools(5000);
    let (d41_s, d41_c, c_c, c_s) = (
        deltas41.clone(),
        deltas41.clone(),
        choices.clone(),
        choices.clone(),
    );
    let (t_s, nc_c, d_c, ac_s) = (
        table.clone(),
        n_choices.clone(),
        deltas.clone(),
        a_choices.clone(),
    );
    let group = OneOfN {
        log_n: 4,
        count: 1000,
        bits: 4,
    };
    let ((y_c, x_c, got_n, x), (x_s, y_s, shares_n, y)) = with_sessions(
        Backend::Silent,
        move |s, ch| {
            let y_c = s.recv_xor_cot_widths(ch, &c_c, &[41])?;
            let x_c = s.send_xor_cot_widths(ch, &d41_c, &[41])?;
            let b = s.recv_1_of_n_shared_groups(ch, &[(4, 4, &nc_c)])?;
            let x = s.send_arith_cot(ch, &d_c, 64)?;
            drain_then_refill(s, ch)?;
            Ok((y_c, x_c, b, x))
        },
        move |s, ch| {
            let x_s = s.send_xor_cot_widths(ch, &d41_s, &[41])?;
            let y_s = s.recv_xor_cot_widths(ch, &c_s, &[41])?;
            let r = s.send_1_of_n_shared_groups(ch, &[group], |_, i, row| {
                row.copy_from_slice(&t_s[16 * i..16 * (i + 1)])
            })?;
            let y = s.recv_arith_cot(ch, &ac_s, 64)?;
            drain_then_refill(s, ch)?;
            Ok((x_s, y_s, r, y))
        },
    )
    .unwrap();
    for i in 0..n {
        let d = choices[i] as u64 * deltas41[i];
        assert_eq!(y_c[i], x_s[i] ^ d, "server-sent COT {i}");
        assert_eq!(y_s[i], x_c[i] ^ d, "client-sent COT {i}");
    }
    for i in 0..1000 {
        assert_eq!(
            got_n[0][i] ^ shares_n[0][i],
            table[i * 16 + n_choices[i] as usize]
        );
    }
    for i in 0..5000 {
        let want = if a_choices[i] {
            x[i].wrapping_add(deltas[i])
        } else {
            x[i]
        };
        assert_eq!(y[i], want);
    }
    assert_balanced(x.iter().map(|v| v >> 63 == 1), "silent arith x");
}

#[test]
fn silent_refill_against_a_peer_that_hangs_up_or_sends_garbage() {
    // After set-up the server either leaves, or answers the refill's correction flight with
    // a message of the wrong size: the client's refill must fail cleanly.
    for garbage in [false, true] {
        let r = with_sessions(
            Backend::Silent,
            |s, ch| s.precompute(ch, 1_000_000),
            move |_, ch| {
                if garbage {
                    ch.send_msg(&[0u8; 100])?;
                    // Stay connected until the client gives up, so it fails on the garbage
                    // rather than on the hang-up, whatever the threads' timing.
                    while ch.recv_msg(1 << 24).is_ok() {}
                }
                Ok(())
            },
        );
        match r {
            Err(Error::Disconnected) => assert!(!garbage),
            Err(Error::Malformed(_)) | Err(Error::TooLarge { .. }) => assert!(garbage),
            other => panic!("unexpected {other:?}"),
        }
    }
}
