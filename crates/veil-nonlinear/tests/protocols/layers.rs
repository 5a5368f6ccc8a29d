//! GELU, Softmax, LayerNorm and the friendly substitutes on BERT-shaped rows (fewer rows than the
//! benchmark): equal to the `veil_core::approx` simulator row by row, and within the stated
//! error of the f64 definitions.

use veil_core::{
    approx::{reference, Approx},
    share, Prg, RingTensor,
};
use veil_net::Role;
use veil_nonlinear::{AffineParams, Ctx};
use veil_test_harness::two_party::*;

/// Uniform values in [−scale, scale], encoded.
fn random_tensor(shape: &[usize], scale: f64) -> RingTensor {
    let mut prg = Prg::from_os_entropy();
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| (prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale)
        .collect();
    RingTensor::encode(fp(), shape, &v).unwrap()
}

fn split(x: &RingTensor) -> (RingTensor, RingTensor) {
    share(x, &mut Prg::from_os_entropy()).unwrap()
}

#[test]
fn gelu_and_relu_on_bert_intermediate_rows() {
    let a = approx();
    let r = a.fp.ring;
    let x = random_tensor(&[1, 3072], 6.0);
    let mut xd = x.data().to_vec();
    // Segment and clamp boundaries (±1 ulp), large values, the ring's extremes.
    let plan = a.gelu_plan();
    let mut special: Vec<u64> = vec![0, 1, r.neg(1), plan.tail, plan.tail - 1, plan.tail + 1];
    special.push(r.neg(plan.tail));
    for &t in plan.breaks() {
        special.extend([t - 1, t, t + 1, r.neg(t)]);
    }
    for v in [50.0, -50.0, 24.5, -17.2, 2000.0, -1e6] {
        special.push(a.fp.encode(v));
    }
    special.extend([r.from_signed(-(1 << 40)), (1 << 40) - 1]);
    xd[..special.len()].copy_from_slice(&special);
    let x = RingTensor::from_vec(a.fp.ring, x.shape(), xd).unwrap();
    let sh = split(&x);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let g = cx.gelu(pick(role, &sh), None)?;
        let r = cx.relu_tensor(pick(role, &sh), Some(20))?;
        Ok((g, r))
    });
    let g = open((out.0 .0, out.1 .0));
    let rl = open((out.0 .1, out.1 .1));
    for (i, &v) in x.data().iter().enumerate() {
        assert_eq!(g[i], a.gelu(v), "GELU of {}", r.to_signed(v));
        if a.fp.decode(v).abs() < 128.0 {
            assert_eq!(rl[i], a.relu(v));
        }
        let err = (a.fp.decode(g[i]) - reference::gelu(a.fp.decode(v))).abs();
        assert!(err <= veil_core::approx::GELU_MAX_ERROR, "GELU error {err}");
    }
}

#[test]
fn softmax_and_relu_normalise_on_attention_rows_with_padding() {
    let a = approx();
    let cols = 128;
    let x = random_tensor(&[2, cols], 8.0);
    let valid: Vec<bool> = (0..cols).map(|j| j < 100).collect();
    let sh = split(&x);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let s = cx.softmax(pick(role, &sh), &valid)?;
        let r = cx.relu_normalise(pick(role, &sh), &valid, Some(20))?;
        Ok((s, r))
    });
    let s = open((out.0 .0, out.1 .0));
    let r = open((out.0 .1, out.1 .1));
    let eps = a.fp.decode(a.relu_normalise_eps());
    for (row, raw) in x.data().chunks(cols).enumerate() {
        let sim_s = a.softmax_row(raw, &valid);
        let sim_r = a.relu_normalise_row(raw, &valid);
        assert_eq!(&s[row * cols..(row + 1) * cols], &sim_s[..]);
        assert_eq!(&r[row * cols..(row + 1) * cols], &sim_r[..]);
        let q: Vec<f64> = raw.iter().map(|&v| a.fp.decode(v)).collect();
        let ws = reference::softmax(&q, &valid);
        let wr = reference::relu_normalise(&q, &valid, eps);
        for j in 0..cols {
            assert!((a.fp.decode(sim_s[j]) - ws[j]).abs() <= 8e-4);
            assert!((a.fp.decode(sim_r[j]) - wr[j]).abs() <= 3e-4);
        }
    }
}

/// A decoder's causal attention on shares, at its (48, 13) format: 3 heads × 4 new query rows
/// against 6 cached keys + the 4 new ones; query row r sees the keys up to position 6 + r.
/// Softmax and ReLU-normalise with the per-row mask equal the simulator's rows bit for bit
/// (faithful truncations), masked entries exactly 0; a one-key row is exactly 1 (Softmax).
#[test]
fn causal_softmax_and_relu_normalise_equal_the_simulator_per_row() {
    let a = Approx::new(veil_core::FixedPoint::new(48, 13).unwrap()).unwrap();
    let (heads, new, start) = (3, 4, 6);
    let total = start + new;
    let mut prg = Prg::from_os_entropy();
    let v: Vec<u64> = (0..heads * new * total)
        .map(|_| {
            a.fp.encode((prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * 9.0)
        })
        .collect();
    let x = RingTensor::from_vec(a.fp.ring, &[heads * new, total], v).unwrap();
    let mask: Vec<bool> = (0..heads * new)
        .flat_map(|r| (0..total).map(move |c| c <= start + r % new))
        .collect();
    let sh = split(&x);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let s = cx.softmax_masked(pick(role, &sh), &mask)?;
        let n = cx.relu_normalise_masked(pick(role, &sh), &mask, None)?;
        Ok((s, n))
    });
    let s = open((out.0 .0, out.1 .0));
    let n = open((out.0 .1, out.1 .1));
    for r in 0..heads * new {
        let span = r * total..(r + 1) * total;
        let (raw, visible) = (&x.data()[span.clone()], &mask[span.clone()]);
        assert_eq!(
            &s[span.clone()],
            &a.softmax_row(raw, visible)[..],
            "Softmax row {r}"
        );
        assert_eq!(
            &n[span.clone()],
            &a.relu_normalise_row(raw, visible)[..],
            "row {r}"
        );
        assert!(s[span.clone()][start + r % new + 1..]
            .iter()
            .all(|&v| v == 0));
    }
    // A single visible key: its probability is exactly 1.
    let one = RingTensor::from_vec(a.fp.ring, &[1, 3], vec![a.fp.encode(-3.5), 7, 9]).unwrap();
    let sh = split(&one);
    let got = open(run_mem(|ot, ch, role| {
        Ctx::new(ot, ch, role, a).softmax_masked(pick(role, &sh), &[true, false, false])
    }));
    assert_eq!(got, vec![a.fp.encode(1.0), 0, 0]);
}

#[test]
fn layer_norm_and_centre_affine_on_hidden_rows() {
    let a = approx();
    let cols = 768;
    let x = random_tensor(&[1, cols], 4.0);
    let gamma = random_tensor(&[cols], 2.0);
    let beta = random_tensor(&[cols], 1.0);
    let sh = split(&x);
    let eps = 1e-5;
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let p = AffineParams {
            gamma: gamma.data(),
            beta: beta.data(),
        };
        let params = (role == Role::Server).then_some(&p);
        let l = cx.layer_norm(pick(role, &sh), params, eps)?;
        let c = cx.centre_affine(pick(role, &sh), params)?;
        Ok((l, c))
    });
    let l = open((out.0 .0, out.1 .0));
    let c = open((out.0 .1, out.1 .1));
    let gq = gamma.decode(a.fp);
    let bq = beta.decode(a.fp);
    for (row, raw) in x.data().chunks(cols).enumerate() {
        let sim_l = a.layer_norm_row(raw, gamma.data(), beta.data(), eps);
        let sim_c = a.centre_affine_row(raw, gamma.data(), beta.data());
        assert_eq!(&l[row * cols..(row + 1) * cols], &sim_l[..]);
        assert_eq!(&c[row * cols..(row + 1) * cols], &sim_c[..]);
        let q: Vec<f64> = raw.iter().map(|&v| a.fp.decode(v)).collect();
        let wl = reference::layer_norm(&q, &gq, &bq, eps);
        for j in 0..cols {
            assert!((a.fp.decode(sim_l[j]) - wl[j]).abs() <= 2e-3 * (1.0 + gq[j].abs()));
        }
    }
}

/// Rows of real LayerNorm inputs' shape: a bulk of spread `std` plus a few outliers at
/// ±`outlier` (MiniLM-L6 reaches |x − mean| ≈ 221), and near the variance floor.
fn layer_norm_input(cols: usize, rows: &[(f64, usize, f64)]) -> RingTensor {
    let mut prg = Prg::from_os_entropy();
    let mut v = Vec::with_capacity(rows.len() * cols);
    for &(std, outliers, outlier) in rows {
        for j in 0..cols {
            let u = (prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * std * 1.7;
            v.push(if j < outliers {
                if j % 2 == 0 {
                    outlier
                } else {
                    -outlier
                }
            } else {
                u
            });
        }
    }
    RingTensor::encode(fp(), &[rows.len(), cols], &v).unwrap()
}

#[test]
fn layer_norm_with_large_deviations_equals_simulator() {
    let a = approx();
    let cols = 768;
    // Coarse path (outliers up to ±2000, |x − mean| < 2048: all-mpnet-base-v2 reaches 1,254)
    // and fine path (small variances); with 1-bit-error truncation (one 64-bit square for both
    // sums) within the bound + 3 ulp.
    let x = layer_norm_input(
        cols,
        &[
            (1.0, 1, 221.0),
            (2.0, 3, 1000.0),
            (2.0, 2, 2000.0),
            (300.0, 0, 0.0),
            (0.02, 0, 0.0),
            (3.0, 0, 0.0),
        ],
    );
    let gamma = random_tensor(&[cols], 2.0);
    let beta = random_tensor(&[cols], 1.0);
    let sh = split(&x);
    let eps = 1e-12;
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let p = AffineParams {
            gamma: gamma.data(),
            beta: beta.data(),
        };
        let params = (role == Role::Server).then_some(&p);
        let exact = cx.layer_norm(pick(role, &sh), params, eps)?;
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        let cheap = cx.layer_norm(pick(role, &sh), params, eps)?;
        Ok((exact, cheap))
    });
    let l = open((out.0 .0, out.1 .0));
    let lc = open((out.0 .1, out.1 .1));
    let ulp = 1.0 / (1u64 << a.fp.frac_bits()) as f64;
    let gq = gamma.decode(a.fp);
    let bq = beta.decode(a.fp);
    for (row, raw) in x.data().chunks(cols).enumerate() {
        let sim = a.layer_norm_row(raw, gamma.data(), beta.data(), eps);
        assert_eq!(&l[row * cols..(row + 1) * cols], &sim[..], "row {row}");
        let q: Vec<f64> = raw.iter().map(|&v| a.fp.decode(v)).collect();
        let mu = q.iter().sum::<f64>() / cols as f64;
        let var = q.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / cols as f64;
        let bound = veil_core::approx::layer_norm_error_bound(var + eps);
        let want = reference::layer_norm(&q, &gq, &bq, eps);
        for j in 0..cols {
            let err = (a.fp.decode(sim[j]) - want[j]).abs();
            assert!(
                err <= bound * gq[j].abs() + 2.5e-4,
                "row {row}: error {err}"
            );
            let err = (a.fp.decode(lc[row * cols + j]) - want[j]).abs();
            // The 1-bit-error mean may be 2 ulp low: every d_i is, amplified by 1/σ.
            let mean_err = 2.0 * ulp * gq[j].abs() / (var + eps).sqrt();
            assert!(
                err <= bound * gq[j].abs() + 2.5e-4 + 3.0 * ulp * (1.0 + gq[j].abs()) + mean_err,
                "row {row}, 1-bit-error truncation: error {err}"
            );
        }
    }
}

/// Rows below LayerNorm's variance floor (constant rows, a one-ulp ripple) and RMSNorm's zero
/// row: outside the error domain, but the rsqrt's pieces keep their narrow promises down to a
/// sum of squares of 0, so the shares still open to the simulator's integers (faithful mode).
#[test]
fn norms_below_the_variance_floor_equal_the_simulator() {
    let a = approx();
    let cols = 64;
    let mut v: Vec<u64> = vec![a.fp.encode(0.75); cols];
    v.extend((0..cols).map(|j| a.fp.encode(-2.0) + (j % 2) as u64));
    v.extend(vec![0u64; cols]);
    let x = RingTensor::from_vec(a.fp.ring, &[3, cols], v).unwrap();
    let gamma = random_tensor(&[cols], 2.0);
    let beta = random_tensor(&[cols], 1.0);
    let sh = split(&x);
    let (eps, dev) = (1e-12, veil_core::approx::LAYER_NORM_DEV_BITS);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let p = AffineParams {
            gamma: gamma.data(),
            beta: beta.data(),
        };
        let server = role == Role::Server;
        let ln = cx.layer_norm(pick(role, &sh), server.then_some(&p), eps)?;
        let rms = cx.rms_norm(pick(role, &sh), server.then_some(gamma.data()), eps, dev)?;
        Ok((ln, rms))
    });
    let ln = open((out.0 .0, out.1 .0));
    let rms = open((out.0 .1, out.1 .1));
    for (row, raw) in x.data().chunks(cols).enumerate() {
        let want = a.layer_norm_row(raw, gamma.data(), beta.data(), eps);
        assert_eq!(
            &ln[row * cols..(row + 1) * cols],
            &want[..],
            "LayerNorm row {row}"
        );
        let want = a.rms_norm_row(raw, gamma.data(), eps, dev);
        assert_eq!(
            &rms[row * cols..(row + 1) * cols],
            &want[..],
            "RMSNorm row {row}"
        );
    }
}

/// RMSNorm at the decoder's format (48, 13) on rows of 576 (SmolLM2's width) with |x| < 2^16:
/// small, typical and massive rows and one outlier near the domain's edge, as the Llama family's
/// residual streams have. Faithful: the simulator's integers exactly (and LayerNorm on the same
/// domain, GPT-2's); 1-bit-error mode: within RMS_NORM_ERROR of f64 plus a few ulps (times |γ|).
#[test]
fn decoder_norms_on_wide_rows_equal_the_simulator() {
    let a = Approx::new(veil_core::FixedPoint::new(48, 13).unwrap()).unwrap();
    let (cols, dev_bits, eps) = (576, 16, 1e-5);
    let mut prg = Prg::from_os_entropy();
    let mut v = Vec::new();
    for (scale, outlier) in [
        (0.05, None),
        (1.0, None),
        (1000.0, None),
        (30.0, Some(60_000.0)),
    ] {
        let mut row: Vec<f64> = (0..cols)
            .map(|_| (prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale)
            .collect();
        if let Some(o) = outlier {
            row[7] = o;
        }
        v.extend(row.iter().map(|&x| a.fp.encode(x)));
    }
    let rows = v.len() / cols;
    let x = RingTensor::from_vec(a.fp.ring, &[rows, cols], v).unwrap();
    let gamma: Vec<u64> = (0..cols)
        .map(|_| a.fp.encode(prg.u64() as f64 / u64::MAX as f64 * 3.0))
        .collect();
    let sh = split(&x);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let g = (role == Role::Server).then_some(gamma.as_slice());
        let exact = cx.rms_norm(pick(role, &sh), g, eps, dev_bits)?;
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        let cheap = cx.rms_norm(pick(role, &sh), g, eps, dev_bits)?;
        Ok((exact, cheap))
    });
    let exact = open((out.0 .0, out.1 .0));
    let cheap = open((out.0 .1, out.1 .1));
    // GPT-2's LayerNorm on the same wide domain (centred, with β).
    let beta: Vec<u64> = (0..cols).map(|j| a.fp.encode(j as f64 / 300.0)).collect();
    let layer = open(run_mem(|ot, ch, role| {
        let p = AffineParams {
            gamma: &gamma,
            beta: &beta,
        };
        let p = (role == Role::Server).then_some(&p);
        Ctx::new(ot, ch, role, a).layer_norm_at(pick(role, &sh), p, eps, dev_bits)
    }));
    let ulp = 1.0 / a.fp.scale();
    let gq: Vec<f64> = gamma.iter().map(|&g| a.fp.decode(g)).collect();
    let (ea, eb) = veil_core::approx::RMS_NORM_ERROR;
    for (r, raw) in x.data().chunks(cols).enumerate() {
        let sim = a.rms_norm_row(raw, &gamma, eps, dev_bits);
        assert_eq!(&exact[r * cols..(r + 1) * cols], &sim[..], "row {r}");
        let sim = a.layer_norm_row_at(raw, &gamma, &beta, eps, dev_bits);
        assert_eq!(
            &layer[r * cols..(r + 1) * cols],
            &sim[..],
            "LayerNorm row {r}"
        );
        let q: Vec<f64> = raw.iter().map(|&v| a.fp.decode(v)).collect();
        let ones = vec![1.0; cols];
        let nrm = veil_core::approx::decoder::reference::rms_norm(&q, &ones, eps);
        for j in 0..cols {
            let want = nrm[j] * gq[j];
            let err = (a.fp.decode(cheap[r * cols + j]) - want).abs();
            let bound = (ea + eb * nrm[j].abs()) * gq[j].abs() + 4.0 * ulp * (1.0 + gq[j].abs());
            assert!(err <= bound, "row {r}, column {j}: error {err} > {bound}");
        }
    }
}

#[test]
fn wrong_mask_or_weights_are_errors() {
    let a = approx();
    let x = random_tensor(&[2, 8], 1.0);
    let sh = split(&x);
    let (c, s) = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        let e1 = cx.softmax(pick(role, &sh), &[true; 7]).is_err()
            && cx.softmax_masked(pick(role, &sh), &[true; 8]).is_err()
            && (cx.relu_normalise_masked(pick(role, &sh), &[true; 17], None)).is_err()
            // 8 values of 2^20 do not square into a 41-bit ring.
            && cx.rms_norm(pick(role, &sh), None, 1e-5, 20).is_err();
        let g = [0u64; 5];
        let p = AffineParams {
            gamma: &g,
            beta: &g,
        };
        // Only the server checks γ/β; the client fails on the missing peer or passes.
        let e2 = role == Role::Client || cx.centre_affine(pick(role, &sh), Some(&p)).is_err();
        Ok(e1 && e2)
    });
    assert!(c && s);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5))]
    /// Random shapes and masks (including all-padded rows): the substitutes and Softmax open to
    /// exactly the simulator's integers.
    #[test]
    fn row_ops_match_the_simulator_on_random_shapes(
        rows in 1usize..4,
        cols in 1usize..40,
        mask_bits in proptest::prelude::any::<u64>(),
        scale in 0.01f64..20.0,
    ) {
        let a = approx();
        let x = random_tensor(&[rows, cols], scale);
        let valid: Vec<bool> = (0..cols).map(|j| mask_bits >> (j % 64) & 1 == 1).collect();
        let g = random_tensor(&[cols], 2.0);
        let sh = split(&x);
        let out = run_mem(|ot, ch, role| {
            let mut cx = Ctx::new(ot, ch, role, a);
            let p = AffineParams { gamma: g.data(), beta: g.data() };
            let params = (role == Role::Server).then_some(&p);
            let s = cx.softmax(pick(role, &sh), &valid)?;
            let r = cx.relu_normalise(pick(role, &sh), &valid, None)?;
            let c = cx.centre_affine(pick(role, &sh), params)?;
            Ok((s, r, c))
        });
        let s = open((out.0 .0, out.1 .0));
        let r = open((out.0 .1, out.1 .1));
        let c = open((out.0 .2, out.1 .2));
        for (i, raw) in x.data().chunks(cols).enumerate() {
            let span = i * cols..(i + 1) * cols;
            proptest::prop_assert_eq!(&s[span.clone()], &a.softmax_row(raw, &valid)[..]);
            proptest::prop_assert_eq!(&r[span.clone()], &a.relu_normalise_row(raw, &valid)[..]);
            proptest::prop_assert_eq!(&c[span], &a.centre_affine_row(raw, g.data(), g.data())[..]);
        }
    }
}

#[test]
fn softmax_over_tcp_loopback() {
    let a = approx();
    let x = random_tensor(&[2, 16], 5.0);
    let valid = vec![true; 16];
    let sh = split(&x);
    let s = open(run_tcp(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        cx.softmax(pick(role, &sh), &valid)
    }));
    for (i, raw) in x.data().chunks(16).enumerate() {
        assert_eq!(&s[i * 16..(i + 1) * 16], &a.softmax_row(raw, &valid)[..]);
    }
}

/// A long row with one dominant score, in the one-bit-error mode: the 2,047 near-zero terms
/// must not pull the row's sum down. (Were each term rounded before the sum with the one-sided
/// rounding, about half of them would land an ulp low, the sum ≈ 0.12 low and the dominant
/// output ≈ 1.14; with the sum rounded once but the rounding one-sided it read 0.956 for 0.953.)
#[test]
fn one_bit_error_softmax_on_a_long_row_keeps_its_sum() {
    let a = approx();
    let ulp = 1.0 / (1u64 << a.fp.frac_bits()) as f64;
    let cols = 2048;
    let mut v = vec![-20.0; cols];
    v[7] = 0.0;
    v[1000] = -3.0;
    let x = RingTensor::encode(fp(), &[1, cols], &v).unwrap();
    let valid = vec![true; cols];
    let sh = split(&x);
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        cx.softmax(pick(role, &sh), &valid)
    });
    let s = open(out);
    let want = reference::softmax(&v, &valid);
    for j in 0..cols {
        let e = (a.fp.decode(s[j]) - want[j]).abs();
        assert!(
            e <= 8e-4 + 8.0 * ulp,
            "column {j}: {} vs {}",
            a.fp.decode(s[j]),
            want[j]
        );
    }
}

/// With 1-bit-error truncation (the whole-model default) the shares no longer open to the
/// simulator, but stay within the stated f64 bounds plus 3 ulp (the fused final products of
/// Softmax, ReLU-normalise and LayerNorm's d·r land up to 2 ulp low, the other truncations 1);
/// Softmax within 8e-4 + 8 ulp, centre-affine within 4 ulp·(1 + |γ|).
#[test]
fn one_bit_error_mode_stays_within_the_f64_bounds() {
    let a = approx();
    let ulp = 1.0 / (1u64 << a.fp.frac_bits()) as f64;
    let cols = 128;
    let mut x = random_tensor(&[3, cols], 8.0);
    // A third row of large scores (s near the top of the domain) and one of tiny ones.
    let big = random_tensor(&[1, cols], 30.0);
    let tiny = random_tensor(&[1, cols], 0.01);
    let mut xd = x.data().to_vec();
    xd[cols..2 * cols].copy_from_slice(big.data());
    xd[2 * cols..].copy_from_slice(tiny.data());
    x = RingTensor::from_vec(a.fp.ring, x.shape(), xd).unwrap();
    let valid: Vec<bool> = (0..cols).map(|j| j < 100).collect();
    // LayerNorm rows: two near the fine/coarse switch (var ≈ 5.3) and one of large deviations,
    // whose variance comes from the coarse (high) part of the wide sum of squares.
    let mut hid = random_tensor(&[3, 768], 4.0);
    let wide = random_tensor(&[1, 768], 300.0);
    let mut hd = hid.data().to_vec();
    hd[2 * 768..].copy_from_slice(wide.data());
    hid = RingTensor::from_vec(a.fp.ring, hid.shape(), hd).unwrap();
    let gamma = random_tensor(&[768], 2.0);
    let beta = random_tensor(&[768], 1.0);
    let (sh, hs) = (split(&x), split(&hid));
    let eps = 1e-5;
    let out = run_mem(|ot, ch, role| {
        let mut cx = Ctx::new(ot, ch, role, a);
        cx.trunc_mode = veil_nonlinear::TruncMode::OneBitError;
        let s = cx.softmax(pick(role, &sh), &valid)?;
        let r = cx.relu_normalise(pick(role, &sh), &valid, None)?;
        let p = AffineParams {
            gamma: gamma.data(),
            beta: beta.data(),
        };
        let params = (role == Role::Server).then_some(&p);
        let l = cx.layer_norm(pick(role, &hs), params, eps)?;
        let c = cx.centre_affine(pick(role, &hs), params)?;
        Ok((s, r, l, c))
    });
    let s = open((out.0 .0, out.1 .0));
    let r = open((out.0 .1, out.1 .1));
    let l = open((out.0 .2, out.1 .2));
    let c = open((out.0 .3, out.1 .3));
    let rn_eps = a.fp.decode(a.relu_normalise_eps());
    for (row, raw) in x.data().chunks(cols).enumerate() {
        let q: Vec<f64> = raw.iter().map(|&v| a.fp.decode(v)).collect();
        let ws = reference::softmax(&q, &valid);
        let wr = reference::relu_normalise(&q, &valid, rn_eps);
        for j in 0..cols {
            let es = (a.fp.decode(s[row * cols + j]) - ws[j]).abs();
            let er = (a.fp.decode(r[row * cols + j]) - wr[j]).abs();
            // The faithful bound plus the mode's low ulps: the entry's and the quotient's
            // roundings, and the sum's, which collects exp's squaring errors (≤ 1 ulp on an
            // entry near 1, 1/32 ulp on a tiny one). 3.5e-4 measured over 40 runs.
            assert!(es <= 8e-4 + 8.0 * ulp, "Softmax row {row}: error {es}");
            assert!(
                er <= 3e-4 + 3.0 * ulp,
                "ReLU-normalise row {row}: error {er}"
            );
        }
    }
    let (gq, bq) = (gamma.decode(a.fp), beta.decode(a.fp));
    for (row, raw) in hid.data().chunks(768).enumerate() {
        let q: Vec<f64> = raw.iter().map(|&v| a.fp.decode(v)).collect();
        let wl = reference::layer_norm(&q, &gq, &bq, eps);
        let wc = reference::centre_affine(&q, &gq, &bq);
        for j in 0..768 {
            let ec = (a.fp.decode(c[row * 768 + j]) - wc[j]).abs();
            assert!(
                ec <= 4.0 * ulp * (1.0 + gq[j].abs()),
                "centre-affine error {ec}"
            );
            let e = (a.fp.decode(l[row * 768 + j]) - wl[j]).abs();
            assert!(
                e <= (2e-3 + 3.0 * ulp) * (1.0 + gq[j].abs()),
                "LayerNorm row {row}: error {e}"
            );
        }
    }
}
