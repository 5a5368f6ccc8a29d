//! exp, recip, rsqrt, tanh, SiLU, hard-swish on shares open to exactly the integers of `veil_core::approx` (which
//! the approx tests check against f64 over the whole domain); also spot-checked against f64 here.

use veil_core::{approx::Approx, Prg, Ring};
use veil_nonlinear::Ctx;
use veil_test_harness::two_party::*;

/// Random raw values in [lo, hi] plus the given edges.
fn sample(ring: Ring, lo: i64, hi: i64, n: usize, edges: &[i64]) -> Vec<u64> {
    let mut prg = Prg::from_os_entropy();
    let span = (hi - lo + 1) as u64;
    edges
        .iter()
        .copied()
        .chain((0..n).map(|_| lo + (prg.u64() % span) as i64))
        .map(|v| ring.from_signed(v))
        .collect()
}

#[test]
fn exp_matches_approx_exactly() {
    let a = approx();
    let ring = a.fp.ring;
    let one = 1i64 << 13;
    let vals = sample(
        ring,
        -20 * one,
        0,
        60,
        &[0, -1, -16 * one, -16 * one - 1, -(1 << 39)],
    );
    let x = share_values(ring, &vals);
    let got = open(run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let y = cx.exp_neg(pick(role, &x).data(), None)?;
        veil_core::RingTensor::from_vec(ring, &[y.len()], y)
    }));
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(got[i], a.exp_neg(v), "exp({})", a.fp.decode(v));
        assert!((a.fp.decode(got[i]) - a.fp.decode(v).exp()).abs() < 2.2e-4);
    }
}

#[test]
fn recip_and_rsqrt_match_approx_exactly() {
    let a = approx();
    let ring = a.fp.ring;
    let k = a.norm_bits() as i64;
    // 2^K: Softmax's sum over 2048 equal scores (the top of the domain, clamped to class K).
    let mut edges = vec![1i64, 2, 3, (1 << k) - 1, 1 << k, 8192];
    for j in [5i64, 13, 20] {
        edges.extend([(1 << j) - 1, 1 << j, (1 << j) + 1]);
    }
    let vals = sample(ring, 1, (1 << k) - 1, 30, &edges);
    let x = share_values(ring, &vals);
    let w = a.wide_recip_frac();
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let s = pick(role, &x).data();
        let r = cx.recip_at(s, ring, 0, a.fp.frac_bits())?;
        let rw = cx.recip_at(s, ring, 0, w)?;
        // The same sums shared in the narrowest ring the reciprocal takes (ReLU-normalise's).
        let narrow = Ring::narrow(a.norm_bits() + 2)?;
        let sn: Vec<u64> = s.iter().map(|&v| narrow.reduce(v)).collect();
        let rn = cx.recip_at(&sn, narrow, 0, w)?;
        let q = cx.rsqrt_at(s, a.fp.frac_bits())?;
        let t = |v: Vec<u64>| veil_core::RingTensor::from_vec(ring, &[v.len()], v);
        Ok((t(r)?, t(rw)?, t(q)?, t(rn)?))
    });
    let r = open((out.0 .0, out.1 .0));
    let rw = open((out.0 .1, out.1 .1));
    let q = open((out.0 .2, out.1 .2));
    let rn = open((out.0 .3, out.1 .3));
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(r[i], a.recip(v), "recip({})", a.fp.decode(v));
        assert_eq!(rw[i], a.recip_at(v, w), "wide recip({})", a.fp.decode(v));
        assert_eq!(
            rn[i],
            a.recip_at(v, w),
            "recip of narrow sums ({})",
            a.fp.decode(v)
        );
        assert_eq!(q[i], a.rsqrt(v), "rsqrt({})", a.fp.decode(v));
    }
}

/// A promised floor s ≥ 2^p drops the thresholds below it and changes nothing else: equal to
/// `approx` from the floor itself up to the top of the domain (Softmax's floor 2^(f−1) and
/// ReLU-normalise's 2^3).
#[test]
fn recip_above_a_floor_matches_approx_exactly() {
    let a = approx();
    let ring = a.fp.ring;
    let k = a.norm_bits() as i64;
    let w = a.wide_recip_frac();
    for floor in [3u32, a.fp.frac_bits() - 1] {
        let p = 1i64 << floor;
        let edges = [p, p + 1, 2 * p - 1, 2 * p, 2 * p + 1, (1 << k) - 1, 1 << k];
        let vals = sample(ring, p, 1 << k, 30, &edges);
        let x = share_values(ring, &vals);
        let got = open(run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, a);
            let r = cx.recip_at(pick(role, &x).data(), ring, floor, w)?;
            veil_core::RingTensor::from_vec(ring, &[r.len()], r)
        }));
        for (i, &v) in vals.iter().enumerate() {
            assert_eq!(got[i], a.recip_at(v, w), "floor {floor}: recip({v})");
        }
    }
}

/// The reciprocal in the 1-bit-error mode (fused Newton products, rounded high parts) stays
/// within 2^-11 relative (+ 4 ulp) of 1/s over its whole domain [1, 2^K], edges included.
#[test]
fn recip_in_the_one_bit_mode_stays_close_to_the_exact_value() {
    let a = approx();
    let ring = a.fp.ring;
    let k = a.norm_bits() as i64;
    let mut edges = vec![1i64, 2, 3, (1 << k) - 1, 1 << k];
    for j in [5i64, 13, 20] {
        edges.extend([(1 << j) - 1, 1 << j, (1 << j) + 1]);
    }
    let vals = sample(ring, 1, 1 << k, 60, &edges);
    let x = share_values(ring, &vals);
    let w = a.wide_recip_frac();
    let got = open(run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        let r = cx.recip_at(pick(role, &x).data(), ring, 0, w)?;
        veil_core::RingTensor::from_vec(ring, &[r.len()], r)
    }));
    let scale = (1u64 << w) as f64;
    for (i, &v) in vals.iter().enumerate() {
        let want = (1u64 << a.fp.frac_bits()) as f64 / v as f64;
        let have = ring.to_signed(got[i]) as f64 / scale;
        assert!(
            (have - want).abs() <= want * 2f64.powi(-11) + 4.0 / scale,
            "1/{} = {want}, got {have}",
            a.fp.decode(v)
        );
    }
}

#[test]
fn tanh_matches_approx_exactly() {
    let a = approx();
    let ring = a.fp.ring;
    let one = 1i64 << 13;
    let vals = sample(
        ring,
        -12 * one,
        12 * one,
        40,
        &[0, 1, -1, 20 * one, -20 * one],
    );
    let x = share_values(ring, &vals);
    let got = open(run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let y = cx.tanh(pick(role, &x).data())?;
        veil_core::RingTensor::from_vec(ring, &[y.len()], y)
    }));
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(got[i], a.tanh(v), "tanh({})", a.fp.decode(v));
    }
}

/// tanh in the 1-bit-error mode (exp's squarings and the Newton quotient truncated one-sided)
/// stays within 1e-3 of tanh over its domain (measured: 3.8e-4 at worst in 400 samples), edges and the clamp included; the pooler runs it
/// so when the model's product truncation is the 1-bit one.
#[test]
fn tanh_in_the_one_bit_mode_stays_close_to_tanh() {
    let a = approx();
    let ring = a.fp.ring;
    let one = 1i64 << 13;
    let vals = sample(
        ring,
        -12 * one,
        12 * one,
        400,
        &[0, 1, -1, one / 8, -one / 8, one, -one, 20 * one, -20 * one],
    );
    let x = share_values(ring, &vals);
    let got = open(run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        let y = cx.tanh(pick(role, &x).data())?;
        veil_core::RingTensor::from_vec(ring, &[y.len()], y)
    }));
    let mut worst = 0f64;
    for (i, &v) in vals.iter().enumerate() {
        let want = a.fp.decode(v).tanh();
        let err = (a.fp.decode(got[i]) - want).abs();
        worst = worst.max(err);
        assert!(
            err <= 1e-3,
            "tanh({}) = {want}, got error {err}",
            a.fp.decode(v)
        );
    }
    println!("worst 1-bit tanh error {worst:.2e}");
}

/// SiLU inputs: the whole useful range, the tail at |x| = 12 and every segment break (±1 ulp,
/// both signs), and the ring's extremes (where |x| wraps).
fn silu_inputs(a: &Approx, n: usize) -> Vec<u64> {
    let ring = a.fp.ring;
    let one = 1i64 << a.fp.frac_bits();
    let top = (1i64 << (ring.bits() - 1)) - 1;
    let plan = a.silu_plan();
    let k = plan.ring;
    let mut edges = vec![
        0,
        1,
        -1,
        100 * one,
        -100 * one,
        top,
        -top,
        -top - 1,
        top - 1,
    ];
    let tail = ring.to_signed(plan.tail);
    for t in plan.breaks().iter().map(|&t| k.to_signed(t)).chain([tail]) {
        for d in -1..=1 {
            edges.extend([t + d, -(t + d)]);
        }
    }
    sample(ring, -20 * one, 20 * one, n, &edges)
}

/// SiLU on shares opens to exactly `approx::silu` (faithful truncations), at the encoder's
/// (41, 13) and the decoder's (48, 13) formats.
#[test]
fn silu_matches_approx_exactly() {
    for a in [
        approx(),
        Approx::new(veil_core::FixedPoint::new(48, 13).unwrap()).unwrap(),
    ] {
        let ring = a.fp.ring;
        let vals = silu_inputs(&a, 60);
        let x = share_values(ring, &vals);
        let got = open(run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, a);
            let y = cx.silu(pick(role, &x).data(), None)?;
            veil_core::RingTensor::from_vec(ring, &[y.len()], y)
        }));
        for (i, &v) in vals.iter().enumerate() {
            assert_eq!(
                got[i],
                a.silu(v),
                "silu({}) at ℓ = {}",
                a.fp.decode(v),
                ring.bits()
            );
        }
    }
}

/// SiLU with a bound on its input (a decoder's provable gate bound) opens to exactly
/// `approx::silu_within` at that bound, and to SiLU, for every input inside the promise; GELU's
/// split likewise. Outside it the output is unspecified (a misread sign can leave the clamped
/// value outside the narrow products' promise, and the result then depends on the shares), as
/// other operators' outside their domains: the simulator counts such an input as a domain
/// violation. It must still not be SiLU there (the comparisons do run on k bits).
#[test]
fn bounded_silu_and_gelu_match_approx_exactly_inside_and_outside_the_bound() {
    let a = Approx::new(veil_core::FixedPoint::new(48, 13).unwrap()).unwrap();
    let ring = a.fp.ring;
    let k = 21;
    let mut vals = silu_inputs(&a, 40);
    for x in [(1i64 << k) - 1, (1 << k) + 5, 1 << (k + 3), 3 << 40] {
        vals.extend([ring.from_signed(x), ring.from_signed(-x)]);
    }
    let x = share_values(ring, &vals);
    let (silu, gelu) = {
        let got = run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, a);
            let s = cx.silu(pick(role, &x).data(), Some(k))?;
            let g = cx.gelu(pick(role, &x), Some(k))?;
            let n = s.len();
            veil_core::RingTensor::from_vec(ring, &[2 * n], [s, g.data().to_vec()].concat())
        });
        let both = open(got);
        let n = vals.len();
        (both[..n].to_vec(), both[n..].to_vec())
    };
    let mut outside_differs = false;
    for (i, &v) in vals.iter().enumerate() {
        let x = ring.to_signed(v);
        if x.unsigned_abs() < 1 << k {
            assert_eq!(silu[i], a.silu_within(v, Some(k)), "silu({x}) at k = {k}");
            assert_eq!(gelu[i], a.gelu_within(v, Some(k)), "gelu({x}) at k = {k}");
            assert_eq!(silu[i], a.silu(v), "silu({x}) inside the bound");
            assert_eq!(gelu[i], a.gelu(v), "gelu({x}) inside the bound");
        } else {
            outside_differs |= silu[i] != a.silu(v);
        }
    }
    assert!(outside_differs, "the bound changed nothing outside it");
}

/// SiLU in the 1-bit-error mode stays within the approximation's bound plus 4 ulps of f64's
/// SiLU below 2^(ℓ−2) (far beyond any activation): a² may land one unit low, a³ then up to
/// a_c + 1 units (times |C_3| ≤ 0.05), the rounding of V one unit of 2^-(f+26).
#[test]
fn silu_in_the_one_bit_mode_stays_close_to_silu() {
    let a = Approx::new(veil_core::FixedPoint::new(48, 13).unwrap()).unwrap();
    let ring = a.fp.ring;
    // Below 2^(ℓ−2): at the ring's last values a ψ a few ulps below 0 would wrap y.
    let vals: Vec<u64> = silu_inputs(&a, 300)
        .into_iter()
        .filter(|&v| ring.to_signed(v).unsigned_abs() < 1 << (ring.bits() - 2))
        .collect();
    let x = share_values(ring, &vals);
    let got = open(run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        let y = cx.silu(pick(role, &x).data(), None)?;
        veil_core::RingTensor::from_vec(ring, &[y.len()], y)
    }));
    let ulp = 1.0 / a.fp.scale();
    let mut worst = 0f64;
    for (i, &v) in vals.iter().enumerate() {
        let xv = a.fp.decode(v);
        let want = veil_core::approx::decoder::reference::silu(xv);
        let err = (a.fp.decode(got[i]) - want).abs();
        worst = worst.max(err);
        let bound = veil_core::approx::SILU_MAX_ERROR + 4.0 * ulp;
        assert!(err <= bound, "silu({xv}) = {want}, got error {err}");
    }
    println!("worst 1-bit SiLU error {worst:.2e}");
}

/// Hard-swish gate inputs at the decoder format: ±3 and 0 (±1 ulp), random values across the
/// domain's useful range, and the ReLU domain's edge; `up` values of both signs.
fn hard_swish_inputs(a: &Approx, n: usize) -> (Vec<u64>, Vec<u64>) {
    let ring = a.fp.ring;
    let one = 1i64 << a.fp.frac_bits();
    let edge = (1i64 << (a.relu_bound_bits() - 1)) - 4 * one;
    let mut edges = vec![edge, -edge, 40 * one, -40 * one];
    for t in [-3 * one, 0, 3 * one] {
        edges.extend([t - 1, t, t + 1]);
    }
    let x = sample(ring, -12 * one, 12 * one, n, &edges);
    let mut u = sample(ring, -30 * one, 30 * one, x.len(), &[]);
    u.truncate(x.len());
    // Keep x·u inside the promised |x·u| < 2^15 at the domain's edge.
    u[0] = ring.from_signed(one / 2);
    u[1] = ring.from_signed(-one / 2);
    (x, u)
}

/// hard-swish(x)·u on shares opens to exactly `approx::hard_swish_gated` (faithful truncations),
/// and within 3 ulps + |x·u|·2^-18 of it in the 1-bit-error mode (each truncation may land a
/// unit low: the factor's, worth |x·u|·2^-18, x·u's and the output's).
#[test]
fn hard_swish_gated_matches_approx() {
    let a = Approx::new(veil_core::FixedPoint::new(48, 13).unwrap()).unwrap();
    let ring = a.fp.ring;
    let (vals, ups) = hard_swish_inputs(&a, 200);
    let (x, u) = (share_values(ring, &vals), share_values(ring, &ups));
    for faithful in [true, false] {
        let got = open(run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, a);
            if !faithful {
                cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
            }
            let k = cx.ax.relu_bound_bits();
            let y = cx.hard_swish_gated(pick(role, &x).data(), pick(role, &u).data(), Some(k))?;
            veil_core::RingTensor::from_vec(ring, &[y.len()], y)
        }));
        for (i, (&v, &w)) in vals.iter().zip(&ups).enumerate() {
            let want = a.hard_swish_gated(v, w);
            let (xv, uv) = (a.fp.decode(v), a.fp.decode(w));
            if faithful {
                assert_eq!(got[i], want, "hard_swish({xv})·{uv}");
            } else {
                let diff = ring.to_signed(ring.sub(got[i], want)).unsigned_abs() as f64;
                let bound = 3.0 + (xv * uv).abs() * a.fp.scale() / f64::from(1u32 << 18);
                assert!(diff <= bound, "hard_swish({xv})·{uv}: {diff} ulps off");
            }
        }
    }
}
