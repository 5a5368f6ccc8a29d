//! Flight counts of the primitives equal the formulas their docs state. Flights are deterministic
//! (a flight is a maximal run of messages in one direction, counted on the client's meter), so
//! these are exact equalities; a change that deepens a protocol fails here.

use veil_core::approx::Approx;
use veil_core::{Result, RingTensor};
use veil_net::{Channel, MemChannel};
use veil_nonlinear::{AffineParams, Ctx, Narrow, TruncMode};
use veil_test_harness::two_party::*;

/// Flights of `f` on 64 shared values below 2^14, run on its own (nothing before or after it
/// in the same flight), with the OT pools filled beforehand so no refill is counted.
fn flights(f: impl Fn(&mut Ctx<'_, MemChannel>, &[u64]) -> Result<()> + Sync) -> u64 {
    let ax = Approx::new(fp()).unwrap();
    let xs = values_below(fp().ring, 14, 64);
    let pair = share_values(fp().ring, &xs);
    let (client, _) = run_mem(|ot, ch, role| {
        ot.precompute(ch, 200_000)?;
        ch.flush()?;
        let mut cx = Ctx::new(ot, ch, role, ax);
        cx.trunc_mode = TruncMode::OneBitError;
        // A fresh count: the operator's first flight is counted even if it runs in the
        // direction of the refill's last one.
        cx.ch.meter().reset();
        f(&mut cx, pick(role, &pair).data())?;
        cx.ch.flush()?;
        Ok(cx.ch.meter().total().rounds())
    });
    client
}

/// ⌈log2 ⌈k/4⌉⌉: the tree levels of a k-bit comparison (its digits are 3 or 4 bits wide).
fn tree_levels(k: u32) -> u64 {
    let d = k.div_ceil(4);
    (32 - (d - 1).leading_zeros()) as u64
}

#[test]
fn drelu_takes_three_plus_two_per_tree_level() {
    for k in [3u32, 4, 5, 13, 20, 25, 26, 27, 40] {
        let got = flights(|cx, x| cx.drelu(x, Some(k)).map(drop));
        // One digit (k ≤ 4) is its leaf alone: two flights.
        let want = match tree_levels(k) {
            0 => 2,
            levels => 3 + 2 * levels,
        };
        assert_eq!(got, want, "DReLU at k = {k}");
    }
}

#[test]
fn relu_adds_the_multiplexer() {
    let got = flights(|cx, x| cx.relu(x, Some(20)).map(drop));
    assert_eq!(got, 3 + 2 * tree_levels(20) + 2);
}

#[test]
fn products_take_three_flights() {
    assert_eq!(flights(|cx, x| cx.mul(x, x).map(drop)), 3);
    assert_eq!(flights(|cx, x| cx.square(x).map(drop)), 2);
    // Narrow products: the cross terms and the wrap term in one call.
    let nw = Narrow::signed(20);
    assert_eq!(flights(|cx, x| cx.square_narrow(x, nw).map(drop)), 3);
    assert_eq!(flights(|cx, x| cx.mul_narrow(x, nw, x).map(drop)), 3);
}

#[test]
fn conversions_and_truncation_take_two_or_three() {
    let bits = |x: &[u64]| x.iter().map(|v| v & 1 == 1).collect::<Vec<_>>();
    assert_eq!(flights(|cx, x| cx.b2a(&bits(x)).map(drop)), 2);
    assert_eq!(flights(|cx, x| cx.mux(&bits(x), x).map(drop)), 3);
    assert_eq!(flights(|cx, x| cx.trunc(x, 13).map(drop)), 2);
    let narrow = veil_core::Ring::narrow(20).unwrap();
    let small = |x: &[u64]| x.iter().map(|&v| narrow.reduce(v)).collect::<Vec<_>>();
    assert_eq!(flights(|cx, x| cx.extend(narrow, &small(x)).map(drop)), 2);
}

#[test]
fn faithful_truncation_adds_the_carry_comparison() {
    let got = flights(|cx, x| {
        cx.trunc_mode = TruncMode::Faithful;
        cx.trunc(x, 13).map(drop)
    });
    assert_eq!(got, 4 + 2 * tree_levels(13));
}

#[test]
fn fused_product_and_truncation_take_four() {
    let nw = Narrow::signed(16);
    let got = flights(|cx, x| cx.mul_narrow_trunc(x, nw, x, 13, 20).map(drop));
    assert_eq!(got, 4);
}

/// Flights of a layer operator on a [rows, cols] tensor of values below 2^12 (1-bit-error mode,
/// pools filled first). The server passes γ = 1, β = 0 where the operator takes them.
fn layer_flights(
    rows: usize,
    cols: usize,
    f: impl Fn(&mut Ctx<'_, MemChannel>, &RingTensor, Option<&AffineParams>) -> Result<RingTensor>
        + Sync,
) -> u64 {
    let ax = Approx::new(fp()).unwrap();
    let ring = fp().ring;
    let x = RingTensor::from_vec(
        ring,
        &[rows, cols],
        values_below(ring, 12, rows * cols)[..rows * cols].to_vec(),
    )
    .unwrap();
    let pair = veil_core::share(&x, &mut veil_core::Prg::from_os_entropy()).unwrap();
    let gamma = vec![fp().encode(1.0); cols];
    let beta = vec![0u64; cols];
    let params = AffineParams {
        gamma: &gamma,
        beta: &beta,
    };
    let (client, _) = run_mem(|ot, ch, role| {
        ot.precompute(ch, 1 << 20)?;
        ch.flush()?;
        let mut cx = Ctx::new(ot, ch, role, ax);
        cx.trunc_mode = TruncMode::OneBitError;
        cx.ch.meter().reset();
        let p = (role == veil_net::Role::Server).then_some(&params);
        f(&mut cx, pick(role, &pair), p)?;
        cx.ch.flush()?;
        Ok(cx.ch.meter().total().rounds())
    });
    client
}

/// The layer operators' flights at the default format, as the layers' docs state them (on these
/// small shapes; a tensor of more than 2^22 / ℓ values splits its products into more calls).
#[test]
fn layer_operators_take_their_documented_flights() {
    let valid = vec![true; 8];
    let got = [
        layer_flights(16, 8, |cx, x, _| {
            let k = cx.ax.relu_bound_bits();
            cx.relu_normalise(x, &valid, Some(k))
        }),
        layer_flights(16, 8, |cx, x, _| cx.softmax(x, &valid)),
        layer_flights(8, 64, |cx, x, p| cx.layer_norm(x, p, 1e-12)),
        layer_flights(8, 64, |cx, x, p| cx.centre_affine(x, p)),
        layer_flights(8, 64, |cx, x, _| {
            cx.trunc_mode = TruncMode::Faithful; // GELU stays exact in the models
            cx.gelu(x, None)
        }),
        layer_flights(8, 64, |cx, x, _| {
            cx.trunc_mode = TruncMode::Faithful;
            cx.gelu(x, Some(21))
        }),
        layer_flights(8, 64, |cx, x, _| {
            let k = cx.ax.relu_bound_bits();
            cx.relu_tensor(x, Some(k))
        }),
        layer_flights(8, 64, |cx, x, p| {
            let dev = veil_core::approx::LAYER_NORM_DEV_BITS;
            cx.rms_norm(x, p.map(|p| p.gamma), 1e-5, dev)
        }),
        layer_flights(8, 64, |cx, x, _| {
            let y = cx.silu(x.data(), None)?;
            RingTensor::from_vec(x.ring(), x.shape(), y)
        }),
        layer_flights(8, 64, |cx, x, _| {
            cx.trunc_mode = TruncMode::Faithful;
            let y = cx.silu(x.data(), None)?;
            RingTensor::from_vec(x.ring(), x.shape(), y)
        }),
        layer_flights(8, 64, |cx, x, _| {
            let y = cx.silu(x.data(), Some(21))?;
            RingTensor::from_vec(x.ring(), x.shape(), y)
        }),
        layer_flights(8, 64, |cx, x, _| {
            cx.trunc_mode = TruncMode::Faithful;
            let y = cx.silu(x.data(), Some(21))?;
            RingTensor::from_vec(x.ring(), x.shape(), y)
        }),
        layer_flights(8, 64, |cx, x, _| {
            let k = cx.ax.relu_bound_bits();
            let y = cx.hard_swish_gated(x.data(), x.data(), Some(k))?;
            RingTensor::from_vec(x.ring(), x.shape(), y)
        }),
        layer_flights(8, 64, |cx, x, _| {
            cx.trunc_mode = TruncMode::Faithful;
            let k = cx.ax.relu_bound_bits();
            let y = cx.hard_swish_gated(x.data(), x.data(), Some(k))?;
            RingTensor::from_vec(x.ring(), x.shape(), y)
        }),
    ];
    println!(
        "relu_normalise softmax layer_norm centre_affine gelu gelu<2^21 relu rms_norm silu \
         silu-faithful silu<2^21 silu<2^21-faithful hard-swish·u hard-swish·u-faithful: {got:?}"
    );
    assert_eq!(got, [44, 88, 46, 8, 64, 60, 11, 42, 46, 66, 42, 62, 18, 32]);
}

/// Softmax's row max in a small batch takes one round of all pairs per factor of 16 in the row's
/// length: 16 flights more for rows of 17 to 256 values (a decoder's step at a 41-token
/// context), 16 more again beyond (the rounds' first and last flights merge with their
/// neighbours'); a batch of more than 2^12 values takes the tree, 12 flights a doubling. The
/// rest of Softmax does not depend on the length.
#[test]
fn softmax_max_rounds_follow_the_row_length_and_the_batch() {
    let small = [16, 17, 41, 256, 257].map(|cols| {
        let valid = vec![true; cols];
        layer_flights(2, cols, |cx, x, _| cx.softmax(x, &valid))
    });
    assert_eq!(small, [88, 104, 104, 104, 120]);
    let large = [32, 257].map(|cols| {
        let valid = vec![true; cols];
        layer_flights(8192 / cols + 1, cols, |cx, x, _| cx.softmax(x, &valid))
    });
    assert_eq!(large, [132, 180]);
}

/// Where a decode step's flights go (n = 1, the 1-bit-error mode, ℓ = 48): the flights, bytes
/// and COTs consumed (both directions; the OT extension that makes them costs bytes too) of
/// RMSNorm on one 576-row, the causal Softmax of 9 heads over 10 keys and SiLU on 1,536 values,
/// by the innermost label of each flight, printed (run with `--nocapture`). The sum is the
/// operator's total, which the layer test above pins at the default format.
#[test]
fn decode_step_flights_by_label() {
    let fp48 = veil_core::FixedPoint::new(48, 13).unwrap();
    let ax = Approx::new(fp48).unwrap();
    let ring = fp48.ring;
    let run = |rows: usize, cols: usize, op: &str| {
        let x = RingTensor::from_vec(
            ring,
            &[rows, cols],
            values_below(ring, 12, rows * cols)[..rows * cols].to_vec(),
        )
        .unwrap();
        let pair = veil_core::share(&x, &mut veil_core::Prg::from_os_entropy()).unwrap();
        let gamma = vec![fp48.encode(1.0); cols];
        let (client, _) = run_mem(|ot, ch, role| {
            ot.precompute(ch, 1 << 20)?;
            ch.flush()?;
            let mut cx = Ctx::new(ot, ch, role, ax);
            cx.trunc_mode = TruncMode::OneBitError;
            cx.ch.meter().reset();
            let before = cx.ot.consumed();
            let x = pick(role, &pair);
            let server = role == veil_net::Role::Server;
            match op {
                "rms_norm" => {
                    cx.rms_norm(x, server.then_some(&gamma[..]), 1e-5, 16)?;
                }
                "softmax" => {
                    let mask: Vec<bool> = (0..rows * cols).map(|i| i % cols < 8).collect();
                    cx.softmax_masked(x, &mask)?;
                }
                _ => {
                    cx.silu(x.data(), None)?;
                }
            }
            cx.ch.flush()?;
            let after = cx.ot.consumed();
            let cots = after.0 - before.0 + after.1 - before.1;
            Ok((cx.ch.meter().snapshot(), cots))
        });
        let (client, cots) = client;
        let (mut total, mut bytes) = (0, 0);
        let mut parts = Vec::new();
        for (label, s) in client {
            let fl = s.flights_sent + s.flights_received;
            total += fl;
            bytes += s.bytes_sent + s.bytes_received;
            if fl > 0 || s.bytes_sent > 0 {
                parts.push(format!(
                    "{label:?} {fl} ({} B sent, {} B received)",
                    s.bytes_sent, s.bytes_received
                ));
            }
        }
        println!(
            "{op} [{rows}, {cols}]: {total} flights, {bytes} B, {cots} COTs: {}",
            parts.join(", ")
        );
        total
    };
    assert!(run(1, 576, "rms_norm") > 0);
    assert!(run(9, 10, "softmax") > 0);
    assert!(run(1, 1536, "silu") > 0);
}
