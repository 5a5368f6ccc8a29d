//! Comparison, DReLU, ReLU, truncation, sign extension and multiplication through [`Ctx`]
//! against exact plaintext oracles, both parties in threads over the in-memory duplex (and a
//! sample over TCP). The crate-internal steps (millionaire, bit decomposition, the high part of
//! a narrow product) are tested by the crate's unit tests.

use proptest::prelude::*;
use veil_core::{approx::Approx, FixedPoint, Prg, Ring};
use veil_net::Role;
use veil_nonlinear::{Ctx, Narrow, TruncMode};
use veil_test_harness::two_party::*;

#[test]
fn drelu_and_relu_exact_over_the_whole_ring() {
    let ring = fp().ring;
    let l = ring.bits();
    let mut vals = values_below(ring, l - 1, 300);
    vals.extend([1u64 << (l - 1), (1u64 << (l - 1)) - 1, ring.mask()]);
    let x = share_values(ring, &vals);
    let (d, r) = {
        let out = run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, approx());
            let d = cx.drelu(pick(role, &x).data(), None)?;
            let r = cx.relu(pick(role, &x).data(), None)?;
            Ok((d, r))
        });
        (
            open_bits((out.0 .0, out.1 .0)),
            open_raw(ring, (out.0 .1, out.1 .1)),
        )
    };
    let ax = approx();
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(d[i], !ring.msb(v), "DReLU of {}", ring.to_signed(v));
        assert_eq!(r[i], ax.relu(v));
    }
}

#[test]
fn bounded_drelu_is_exact_within_its_bound() {
    let ring = fp().ring;
    for k in [1u32, 12, 20, 39] {
        let vals = values_below(ring, k, 120);
        let x = share_values(ring, &vals);
        let d = open_bits(run_mem(|ot, ch, role| {
            Ctx::new(ot, ch, role, approx()).drelu(pick(role, &x).data(), Some(k))
        }));
        for (i, &v) in vals.iter().enumerate() {
            assert_eq!(
                d[i],
                ring.to_signed(v) >= 0,
                "k={k}, x={}",
                ring.to_signed(v)
            );
        }
    }
}

#[test]
fn bound_outside_ring_is_an_error() {
    let ring = fp().ring;
    let x = share_values(ring, &[1, 2]);
    let (a, b) = veil_net::run_two_party(
        |c| {
            let mut ot = veil_ot::OtSession::setup_with(c, Role::Client, veil_ot::Backend::Iknp)?;
            let mut cx = Ctx::new(&mut ot, c, Role::Client, approx());
            Ok(cx.drelu(x.0.data(), Some(41)).is_err())
        },
        |s| {
            let mut ot = veil_ot::OtSession::setup_with(s, Role::Server, veil_ot::Backend::Iknp)?;
            let mut cx = Ctx::new(&mut ot, s, Role::Server, approx());
            Ok(cx.drelu(x.1.data(), Some(0)).is_err())
        },
    )
    .unwrap();
    assert!(a && b);
}

#[test]
fn extension_to_a_wider_ring_is_exact() {
    for (k, l) in [(32u32, 41u32), (35, 41), (35, 64), (40, 41)] {
        let (from, to) = (Ring::new(k).unwrap(), Ring::new(l).unwrap());
        let lim = 1i64 << (k - 2);
        let mut signed: Vec<i64> = vec![0, 1, -1, lim - 1, -lim + 1, -lim];
        let mut prg = Prg::from_os_entropy();
        signed.extend((0..200).map(|_| (prg.u64() % (2 * lim as u64)) as i64 - lim));
        let vals: Vec<u64> = signed.iter().map(|&v| from.from_signed(v)).collect();
        let x = share_values(from, &vals);
        let got = open_raw(
            to,
            run_mem(|ot, ch, role| {
                Ctx::new(ot, ch, role, approx()).extend_to(from, to, pick(role, &x).data())
            }),
        );
        for (i, &v) in signed.iter().enumerate() {
            assert_eq!(to.to_signed(got[i]), v, "extension {k} -> {l} of {v}");
        }
    }
}

#[test]
fn faithful_truncation_is_floor_and_cheap_is_within_one() {
    let ring = fp().ring;
    let ax = approx();
    let vals = values_below(ring, ring.bits() - 2, 300);
    let x = share_values(ring, &vals);
    for s in [1u32, 13, 26] {
        let out = run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, ax);
            let a = cx.trunc(pick(role, &x).data(), s)?;
            cx.trunc_mode = TruncMode::OneBitError;
            let b = cx.trunc(pick(role, &x).data(), s)?;
            Ok((a, b))
        });
        let exact = open_raw(ring, (out.0 .0, out.1 .0));
        let cheap = open_raw(ring, (out.0 .1, out.1 .1));
        for (i, &v) in vals.iter().enumerate() {
            let want = ax.trunc(v, s);
            assert_eq!(
                exact[i],
                want,
                "faithful trunc of {} by {s}",
                ring.to_signed(v)
            );
            let diff = ring.to_signed(ring.sub(want, cheap[i]));
            assert!(diff == 0 || diff == 1, "cheap trunc off by {diff}");
        }
    }
}

/// x·y, x² and x·γ (γ the server's) in a context over `ring` (8 fractional bits: the products
/// do not depend on the scale).
fn check_products(ring: Ring, a: Vec<u64>, b: Vec<u64>) {
    let n = a.len();
    let ax = Approx::new(FixedPoint::new(ring.bits(), 8).unwrap()).unwrap();
    let x = share_values(ring, &a);
    let y = share_values(ring, &b);
    let gamma = b.clone();
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, ax);
        let (xs, ys) = (pick(role, &x).data(), pick(role, &y).data());
        let p = cx.mul(xs, ys)?;
        let q = cx.square(xs)?;
        let g = (role == Role::Server).then_some(gamma.as_slice());
        let r = cx.mul_server(xs, n, g)?;
        Ok((p, q, r))
    });
    let p = open_raw(ring, (out.0 .0, out.1 .0));
    let q = open_raw(ring, (out.0 .1, out.1 .1));
    let r = open_raw(ring, (out.0 .2, out.1 .2));
    for i in 0..n {
        assert_eq!(p[i], ring.mul(a[i], b[i]));
        assert_eq!(q[i], ring.mul(a[i], a[i]));
        assert_eq!(r[i], ring.mul(a[i], b[i]));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]
    #[test]
    fn products_are_exact_mod_2l(bits in prop::sample::select(vec![32u32, 41, 64]),
                                 a in prop::collection::vec(any::<u64>(), 1..40),
                                 seed in any::<u64>()) {
        let ring = Ring::new(bits).unwrap();
        let a: Vec<u64> = a.into_iter().map(|v| ring.reduce(v)).collect();
        let b: Vec<u64> = a.iter().map(|&v| ring.reduce(v.rotate_left(7) ^ seed)).collect();
        check_products(ring, a, b);
    }
}

/// Narrow products and squares are exact over the whole promised range, any b: |a| < 2^(m−1)
/// for a signed promise, 0 ≤ a < 2^(m−1) for an unsigned one of m − 1 bits (same share ring).
#[test]
fn narrow_products_are_exact_within_the_promise() {
    let mut prg = Prg::from_os_entropy();
    for (bits, m) in [(41u32, 15u32), (41, 24), (35, 17), (64, 40), (32, 3)] {
        let ring = Ring::new(bits).unwrap();
        let lim = 1i64 << (m - 1);
        let mut signed: Vec<i64> = vec![0, 1, -1, lim - 1, -lim + 1, -lim];
        signed.extend((0..60).map(|_| (prg.u64() % (2 * lim as u64)) as i64 - lim));
        let mut unsigned: Vec<i64> = vec![0, 1, lim - 1, lim - 2];
        unsigned.extend((0..60).map(|_| (prg.u64() % lim as u64) as i64));
        for (nw, vals) in [
            (Narrow::signed(m), signed.clone()),
            (Narrow::unsigned(m - 1), unsigned),
        ] {
            check_narrow_product(&mut prg, ring, nw, &vals);
        }
    }
}

fn check_narrow_product(prg: &mut Prg, ring: Ring, nw: Narrow, vals: &[i64]) {
    let a: Vec<u64> = vals.iter().map(|&v| ring.from_signed(v)).collect();
    let mut b: Vec<u64> = a.iter().map(|_| ring.reduce(prg.u64())).collect();
    b[0] = ring.mask();
    b[1] = 0;
    let x = share_values(ring, &a);
    let y = share_values(ring, &b);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, approx());
        let (xs, ys) = (pick(role, &x).data(), pick(role, &y).data());
        let p = cx.mul_narrow_in(ring, xs, nw, ys)?;
        let q = cx.square_narrow_in(ring, xs, nw)?;
        Ok((p, q))
    });
    let p = open_raw(ring, (out.0 .0, out.1 .0));
    let q = open_raw(ring, (out.0 .1, out.1 .1));
    for i in 0..a.len() {
        assert_eq!(
            p[i],
            ring.mul(a[i], b[i]),
            "{ring:?} {nw:?}: {} · b",
            vals[i]
        );
        assert_eq!(q[i], ring.mul(a[i], a[i]), "{ring:?} {nw:?}: {}²", vals[i]);
    }
}

/// The fused product-truncation by the server's γ (LayerNorm's affine step): ⌊x·γ / 2^13⌋ +
/// {−3, …, 2} in the 1-bit-error mode, exact in the faithful one, for x and γ at the edges of their ranges.
#[test]
fn fused_server_row_truncation_is_within_its_bound() {
    let mut prg = Prg::from_os_entropy();
    let ring = fp().ring;
    let ax = approx();
    let (g, s, cols) = (24u32, 13u32, 16usize);
    let glim = 1i64 << (g - 1);
    let xlim = 1i64 << (ring.bits() - 2 - (g - 1));
    let mut sg: Vec<i64> = vec![glim - 1, -glim, 0, 1, -1, glim - 1];
    sg.extend((sg.len()..cols).map(|_| (prg.u64() % (2 * glim as u64)) as i64 - glim));
    let mut sx: Vec<i64> = vec![xlim - 1, xlim - 1, -xlim + 1, 7, -7, -xlim + 1];
    sx.extend((sx.len()..cols * 12).map(|_| (prg.u64() % (2 * xlim as u64)) as i64 - xlim));
    let gamma: Vec<u64> = sg.iter().map(|&v| ring.from_signed(v)).collect();
    let a: Vec<u64> = sx.iter().map(|&v| ring.from_signed(v)).collect();
    let x = share_values(ring, &a);
    let (c, sv) = run_mem(|ot, ch, role| {
        let xs = pick(role, &x).data();
        let gm = (role == Role::Server).then_some(gamma.as_slice());
        let mut cx = Ctx::new(ot, ch, role, ax);
        let exact = cx.mul_server_trunc(xs, cols, gm, g, s, ring.bits() - s)?;
        cx.trunc_mode = TruncMode::OneBitError;
        let cheap = cx.mul_server_trunc(xs, cols, gm, g, s, ring.bits() - s)?;
        Ok((exact, cheap))
    });
    for i in 0..a.len() {
        let want = ((sx[i] as i128 * sg[i % cols] as i128) >> s) as i64;
        assert_eq!(ring.to_signed(ring.add(c.0[i], sv.0[i])), want, "faithful");
        let d = want - ring.to_signed(ring.add(c.1[i], sv.1[i]));
        assert!(
            (-2..=3).contains(&d),
            "fused {}·{} off by {d}",
            sx[i],
            sg[i % cols]
        );
    }
}

#[test]
fn narrow_server_row_is_exact_and_rejects_a_wide_gamma() {
    let ring = fp().ring;
    let g = 24u32;
    let lim = 1i64 << (g - 1);
    let gamma: Vec<u64> = [0i64, 1, -1, lim - 1, -lim, 12345, -8192]
        .iter()
        .map(|&v| ring.from_signed(v))
        .collect();
    let n = gamma.len();
    let vals: Vec<u64> = (0..3 * n as u64)
        .map(|i| ring.reduce(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let x = share_values(ring, &vals);
    let out = run_mem(|ot, ch, role| {
        let gm = (role == Role::Server).then_some(gamma.as_slice());
        Ctx::new(ot, ch, role, approx()).mul_server_narrow(pick(role, &x).data(), n, gm, g)
    });
    let got = open_raw(ring, out);
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(got[i], ring.mul(v, gamma[i % n]));
    }
    let wide = vec![ring.from_signed(lim)];
    let xw = share_values(ring, &[5]);
    let (c, s) = run_mem(|ot, ch, role| {
        let gm = (role == Role::Server).then_some(wide.as_slice());
        let mut cx = Ctx::new(ot, ch, role, approx());
        Ok(cx
            .mul_server_narrow(pick(role, &xw).data(), 1, gm, g)
            .is_err())
    });
    assert!(s, "a γ outside ±2^(g−1) must be refused by the server");
    let _ = c;
}

#[test]
fn products_of_edge_values() {
    let ring = fp().ring;
    let e = [0u64, 1, ring.mask(), 1 << 40, (1 << 40) - 1, 8192];
    let a: Vec<u64> = e.iter().flat_map(|&u| e.iter().map(move |_| u)).collect();
    let b: Vec<u64> = e.iter().flat_map(|_| e.iter().copied()).collect();
    check_products(ring, a, b);
}

#[test]
fn length_mismatch_and_missing_gamma_are_errors() {
    let (x, y) = ([0u64; 6], [0u64; 4]);
    let (a, b) = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, approx());
        let e1 = cx.mul(&x, &y).is_err();
        // The client supplying γ: refused (the server, with rows of 3, then loses its peer).
        let e2 = cx.mul_server(&x, 3, Some(&[1, 2, 3])).is_err() || role == Role::Server;
        Ok(e1 && e2)
    });
    assert!(a && b);
}

#[test]
fn relu_over_tcp_loopback() {
    let ring = fp().ring;
    let vals = values_below(ring, 30, 64);
    let x = share_values(ring, &vals);
    let r = open_raw(
        ring,
        run_tcp(|ot, ch, role| {
            Ctx::new(ot, ch, role, approx()).relu(pick(role, &x).data(), Some(30))
        }),
    );
    let ax = approx();
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(r[i], ax.relu(v));
    }
}

#[test]
fn peer_hang_up_is_an_error() {
    let ring = fp().ring;
    let x = share_values(ring, &[1, 2, 3]);
    let res = veil_net::run_two_party(
        |c| {
            let mut ot = veil_ot::OtSession::setup_with(c, Role::Client, veil_ot::Backend::Iknp)?;
            let mut cx = Ctx::new(&mut ot, c, Role::Client, approx());
            cx.relu(x.0.data(), None).map(|_| ())
        },
        |s| {
            let _ot = veil_ot::OtSession::setup_with(s, Role::Server, veil_ot::Backend::Iknp)?;
            Ok(()) // server leaves without running its half
        },
    );
    assert!(res.is_err());
}

#[test]
fn empty_inputs_give_empty_outputs() {
    let ring = fp().ring;
    let x = share_values(ring, &[]);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, approx());
        let xs = pick(role, &x).data();
        let r = cx.relu(xs, None)?;
        let t = cx.trunc(xs, 13)?;
        let m = cx.mul(xs, xs)?;
        Ok(r.len() + t.len() + m.len())
    });
    assert_eq!(out, (0, 0));
}
