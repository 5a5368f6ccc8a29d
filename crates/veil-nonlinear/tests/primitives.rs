//! Comparison, DReLU, ReLU, truncation and multiplication against exact plaintext oracles, both
//! parties in threads over the in-memory duplex (and a sample over TCP).

mod common;

use common::*;
use proptest::prelude::*;
use veil_core::{approx::Approx, Prg, Ring, RingTensor};
use veil_net::Role;
use veil_nonlinear::mul::{
    mul_narrow_high_values, mul_narrow_values, mul_server_row_narrow, square_narrow_values, Narrow,
};
use veil_nonlinear::trunc::extend_values;
use veil_nonlinear::{
    drelu, millionaire::greater_than, mul, mul_server_row, relu, square, truncate, Ctx, TruncMode,
};

#[test]
fn millionaire_matches_integer_comparison() {
    let mut prg = Prg::from_os_entropy();
    for bits in [1u32, 3, 4, 5, 13, 40, 64] {
        let m = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let mut a: Vec<u64> = (0..40).map(|_| prg.u64() & m).collect();
        let mut b: Vec<u64> = (0..40).map(|_| prg.u64() & m).collect();
        // Edges: equal values, extremes, off by one.
        a.extend([0, m, m, 0, 5 & m, m]);
        b.extend([0, m, 0, m, 5 & m, m.saturating_sub(1)]);
        let got = open_bits(run_mem(|ot, ch, role| {
            let mine = if role == Role::Client { &a } else { &b };
            greater_than(ot, ch, role, mine, bits)
        }));
        for i in 0..a.len() {
            assert_eq!(got[i], a[i] > b[i], "bits {bits}: {} > {}", a[i], b[i]);
        }
    }
}

#[test]
fn drelu_and_relu_exact_over_the_whole_ring() {
    let ring = fp().ring;
    let l = ring.bits();
    let mut vals = values_below(ring, l - 1, 300);
    vals.extend([1u64 << (l - 1), (1u64 << (l - 1)) - 1, ring.mask()]);
    let x = share_values(ring, &vals);
    let (d, r) = {
        let out = run_mem(|ot, ch, role| {
            let d = drelu(ot, ch, role, pick(role, &x), None)?;
            let r = relu(ot, ch, role, pick(role, &x), None)?;
            Ok((d, r))
        });
        (open_bits((out.0 .0, out.1 .0)), open((out.0 .1, out.1 .1)))
    };
    let ax = Approx::new(fp()).unwrap();
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
            drelu(ot, ch, role, pick(role, &x), Some(k))
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
            Ok(drelu(&mut ot, c, Role::Client, &x.0, Some(41)).is_err())
        },
        |s| {
            let mut ot = veil_ot::OtSession::setup_with(s, Role::Server, veil_ot::Backend::Iknp)?;
            Ok(drelu(&mut ot, s, Role::Server, &x.1, Some(0)).is_err())
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
        let out = run_mem(|ot, ch, role| {
            let y = extend_values(ot, ch, role, from, to, pick(role, &x).data())?;
            RingTensor::from_vec(to, &[vals.len()], y)
        });
        let got = open(out);
        for (i, &v) in signed.iter().enumerate() {
            assert_eq!(to.to_signed(got[i]), v, "extension {k} -> {l} of {v}");
        }
    }
}

#[test]
fn faithful_truncation_is_floor_and_cheap_is_within_one() {
    let ring = fp().ring;
    let ax = Approx::new(fp()).unwrap();
    let vals = values_below(ring, ring.bits() - 2, 300);
    let x = share_values(ring, &vals);
    for s in [1u32, 13, 26] {
        let out = run_mem(|ot, ch, role| {
            let a = truncate(ot, ch, role, pick(role, &x), s, TruncMode::Faithful)?;
            let b = truncate(ot, ch, role, pick(role, &x), s, TruncMode::OneBitError)?;
            Ok((a, b))
        });
        let exact = open((out.0 .0, out.1 .0));
        let cheap = open((out.0 .1, out.1 .1));
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

fn check_products(ring: Ring, a: Vec<u64>, b: Vec<u64>) {
    let n = a.len();
    let x = share_values(ring, &a);
    let y = share_values(ring, &b);
    let gamma = b.clone();
    let out = run_mem(|ot, ch, role| {
        let p = mul(ot, ch, role, pick(role, &x), pick(role, &y))?;
        let q = square(ot, ch, role, pick(role, &x))?;
        let g = (role == Role::Server).then_some(gamma.as_slice());
        let xr = pick(role, &x).clone().reshape(&[1, n])?;
        let r = mul_server_row(ot, ch, role, &xr, g)?;
        Ok((p, q, r))
    });
    let p = open((out.0 .0, out.1 .0));
    let q = open((out.0 .1, out.1 .1));
    let r = open((out.0 .2, out.1 .2));
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
        let (xs, ys) = (pick(role, &x).data(), pick(role, &y).data());
        let p = mul_narrow_values(ot, ch, role, ring, xs, nw, ys)?;
        let q = square_narrow_values(ot, ch, role, ring, xs, nw)?;
        let n = p.len();
        Ok((
            RingTensor::from_vec(ring, &[n], p)?,
            RingTensor::from_vec(ring, &[n], q)?,
        ))
    });
    let p = open((out.0 .0, out.1 .0));
    let q = open((out.0 .1, out.1 .1));
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

/// The high part of a narrow product is a·b / 2^t + e mod 2^n with |e| ≤ min(m+1, t) + 1, and
/// the fused product-truncation of the 1-bit-error mode is ⌊a·b / 2^s⌋ + {−3, …, 2} (the
/// faithful mode exactly ⌊a·b / 2^s⌋), for operands at the edges of their promises.
#[test]
fn fused_product_truncation_is_within_its_bound() {
    let mut prg = Prg::from_os_entropy();
    let ring = fp().ring;
    let ax = Approx::new(fp()).unwrap();
    // (m, s, out): ReLU-normalise's, Softmax's and LayerNorm's shapes.
    // Unsigned: ReLU-normalise's ReLU outputs 0 ≤ r < 2^24.
    for (signed, m, s, out) in [
        (true, 25u32, 24u32, 16u32),
        (false, 24, 24, 15),
        (true, 15, 24, 16),
        (true, 24, 19, 22),
        (true, 24, 19, 19),
    ] {
        let nw = if signed {
            Narrow::signed(m)
        } else {
            Narrow::unsigned(m)
        };
        // |a| < 2^mag; b reaches the contract's edge |a·b| / 2^s → 2^(out−1) − 3 (and |a·b| < 2^39).
        let mag = if signed { m - 1 } else { m };
        let lim = 1i64 << mag;
        let blim = ((((1i64 << (out - 1)) - 3) << s) >> mag).min(1i64 << (39 - mag));
        let (mut sa, mut sb): (Vec<i64>, Vec<i64>) = if signed {
            (
                vec![0, 1, -1, lim - 1, -lim + 1, lim - 1, -lim + 1, 0],
                vec![blim - 1, blim - 1, -blim + 1, blim - 1, blim - 1, 0, 1, -1],
            )
        } else {
            (
                vec![0, 1, lim - 1, lim - 1, lim - 2, 0],
                vec![blim - 1, -blim + 1, blim - 1, -blim + 1, 1, -1],
            )
        };
        for _ in 0..200 {
            sa.push(if signed {
                (prg.u64() % (2 * lim as u64)) as i64 - lim
            } else {
                (prg.u64() % lim as u64) as i64
            });
            sb.push((prg.u64() % (2 * blim as u64)) as i64 - blim);
        }
        let a: Vec<u64> = sa.iter().map(|&v| ring.from_signed(v)).collect();
        let b: Vec<u64> = sb.iter().map(|&v| ring.from_signed(v)).collect();
        let (x, y) = (share_values(ring, &a), share_values(ring, &b));
        let g = (32 - ((m + 1).min(s) + 1).leading_zeros()) - 1;
        let (t, n) = (s - g, (out + g + 1).min(ring.bits() - (s - g)));
        let out2 = run_mem(|ot, ch, role| {
            let (xs, ys) = (pick(role, &x).data(), pick(role, &y).data());
            let hi = mul_narrow_high_values(ot, ch, role, ring, xs, nw, ys, t, n)?;
            let mut cx = Ctx::new(ot, ch, role, ax);
            let exact = cx.mul_narrow_trunc(xs, nw, ys, s, out)?;
            cx.trunc_mode = TruncMode::OneBitError;
            let cheap = cx.mul_narrow_trunc(xs, nw, ys, s, out)?;
            Ok((hi, exact, cheap))
        });
        let (c, sv) = out2;
        for i in 0..a.len() {
            let p = sa[i] as i128 * sb[i] as i128;
            // got − ⌊a·b / 2^t⌋ = e + frac(a·b / 2^t), as a signed n-bit value.
            let want_hi = (p >> t) as i64;
            let diff = c.0[i].wrapping_add(sv.0[i]).wrapping_sub(want_hi as u64) << (64 - n);
            let e = (diff as i64) >> (64 - n);
            let bound = (m + 1).min(t) as i64 + 1;
            assert!(
                (-bound..=bound).contains(&e),
                "m={m} t={t}: high part of {}·{} off by {e}",
                sa[i],
                sb[i]
            );
            let want = (p >> s) as i64;
            assert_eq!(
                ring.to_signed(ring.add(c.1[i], sv.1[i])),
                want,
                "faithful {}·{} >> {s}",
                sa[i],
                sb[i]
            );
            let d = want - ring.to_signed(ring.add(c.2[i], sv.2[i]));
            assert!(
                (-2..=3).contains(&d),
                "fused {}·{} >> {s} off by {d}",
                sa[i],
                sb[i]
            );
        }
    }
}

/// The fused product-truncation by the server's γ (LayerNorm's affine step): ⌊x·γ / 2^13⌋ +
/// {−3, …, 2} in the 1-bit-error mode, exact in the faithful one, for x and γ at the edges of their ranges.
#[test]
fn fused_server_row_truncation_is_within_its_bound() {
    let mut prg = Prg::from_os_entropy();
    let ring = fp().ring;
    let ax = Approx::new(fp()).unwrap();
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
        let xr = pick(role, &x).clone().reshape(&[3, n])?;
        let gm = (role == Role::Server).then_some(gamma.as_slice());
        mul_server_row_narrow(ot, ch, role, &xr, gm, g)
    });
    let got = open(out);
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(got[i], ring.mul(v, gamma[i % n]));
    }
    let wide = vec![ring.from_signed(lim)];
    let xw = share_values(ring, &[5]);
    let (c, s) = run_mem(|ot, ch, role| {
        let xr = pick(role, &xw).clone().reshape(&[1, 1])?;
        let gm = (role == Role::Server).then_some(wide.as_slice());
        Ok(mul_server_row_narrow(ot, ch, role, &xr, gm, g).is_err())
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
fn shape_mismatch_and_missing_gamma_are_errors() {
    let ring = fp().ring;
    let x = RingTensor::zeros(ring, &[2, 3]).unwrap();
    let y = RingTensor::zeros(ring, &[3, 2]).unwrap();
    let (a, b) = run_mem(|ot, ch, role| {
        let e1 = mul(ot, ch, role, &x, &y).is_err();
        let e2 =
            mul_server_row(ot, ch, role, &x, Some(&[1, 2, 3])).is_err() || role == Role::Server;
        Ok(e1 && e2)
    });
    assert!(a && b);
}

#[test]
fn relu_over_tcp_loopback() {
    let ring = fp().ring;
    let vals = values_below(ring, 30, 64);
    let x = share_values(ring, &vals);
    let r = open(run_tcp(|ot, ch, role| {
        relu(ot, ch, role, pick(role, &x), Some(30))
    }));
    let ax = Approx::new(fp()).unwrap();
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
            relu(&mut ot, c, Role::Client, &x.0, None).map(|_| ())
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
        let r = relu(ot, ch, role, pick(role, &x), None)?;
        let t = truncate(ot, ch, role, pick(role, &x), 13, TruncMode::Faithful)?;
        let m = mul(ot, ch, role, pick(role, &x), pick(role, &x))?;
        Ok(r.len() + t.len() + m.len())
    });
    assert_eq!(out, (0, 0));
}

/// Bit decomposition of a + b mod 2^k for private a, b (carries across every position, the
/// extremes, k = 1 and 64), and suffix ORs of the bits, against plain integer arithmetic.
#[test]
fn sum_bits_and_suffix_or_match_integers() {
    let mut prg = Prg::from_os_entropy();
    for k in [1u32, 2, 7, 24, 41, 64] {
        let m = if k == 64 { u64::MAX } else { (1u64 << k) - 1 };
        let mut a: Vec<u64> = vec![0, m, m, 1, 0, m >> 1];
        let mut b: Vec<u64> = vec![0, 1, m, m, m, 1];
        for _ in 0..100 {
            a.push(prg.u64() & m);
            b.push(prg.u64() & m);
        }
        let (ac, bc) = (a.clone(), b.clone());
        let out = run_mem(move |ot, ch, role| {
            let mine = if role == Role::Client { &ac } else { &bc };
            let bits = veil_nonlinear::bits::sum_bits(ot, ch, role, mine, k)?;
            let any = veil_nonlinear::bits::suffix_or(ot, ch, role, &bits, k as usize)?;
            Ok((bits, any))
        });
        let bits = open_bits((out.0 .0, out.1 .0));
        let any = open_bits((out.0 .1, out.1 .1));
        let ku = k as usize;
        for i in 0..a.len() {
            let s = a[i].wrapping_add(b[i]) & m;
            for j in 0..ku {
                assert_eq!(
                    bits[i * ku + j],
                    s >> j & 1 == 1,
                    "k={k} {}+{} bit {j}",
                    a[i],
                    b[i]
                );
                assert_eq!(
                    any[i * ku + j],
                    s >> j != 0,
                    "k={k} {}+{} OR from {j}",
                    a[i],
                    b[i]
                );
            }
        }
    }
}

#[test]
fn sum_bits_rejects_wide_inputs() {
    let out = run_mem(|ot, ch, role| {
        let mine = if role == Role::Client {
            vec![1u64 << 5]
        } else {
            vec![0]
        };
        Ok(veil_nonlinear::bits::sum_bits(ot, ch, role, &mine, 5).is_err())
    });
    assert!(out.0, "an input above 2^k is refused before any traffic");
}
