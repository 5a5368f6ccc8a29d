//! Benchmark of the non-linear layers of one BERT-Base encoder layer: both parties in threads of
//! this process over TCP loopback, each with its own OT session (set-up excluded). One JSON object
//! per operator with `op`, `elements`, `time_s`, `bytes_total` (both directions), the split
//! `bytes_client_to_server` / `bytes_server_to_client`, `bits_per_element`, `rounds` (flights
//! in both directions) and `max_abs_error` against the f64 definition.
//!
//! The totals include generating the correlated OTs the protocols consume (the session's default
//! engine: Ferret silent COT, under 0.5 bit per COT; IKNP costs 128). To separate the protocols' own cost from the OT engine's, each operator is also run
//! on a slice of its input after pre-generating enough COTs: `online_bits_per_element` is the
//! traffic of that run and `cots_per_element` the COTs it consumed (both directions), so the cost
//! under any COT engine is online + cots × (engine bits per COT).
//!
//! `he_keys` says whether the context carried the share-product BFV keys (set up outside the
//! measurement, like the OT session): LayerNorm's 1-bit-error rows use them for the sum of
//! squares and d·r; its HE traffic is in the totals (label "LayerNorm").

use std::time::Instant;

use serde_json::{json, Value};
use veil_core::{
    approx::{reference, Approx},
    share, FixedPoint, Prg, Result, RingTensor,
};
use veil_net::{run_two_party_tcp, Channel, LabelStats, Role, TcpChannel};
use veil_ot::OtSession;

use veil_he::session::{ClientSession, ServerSession};
use veil_nonlinear::{AffineParams, Ctx, HeKeys, TruncMode};

/// Forwards each result as it arrives (the long full-size runs show progress), running only the
/// operators whose name contains `only` (all when `None`).
struct Reporter<'a> {
    report: &'a mut dyn FnMut(&Value),
    only: Option<&'a str>,
}

impl Reporter<'_> {
    fn wants(&self, name: &str) -> bool {
        self.only.is_none_or(|o| name.contains(o))
    }
}

/// Problem sizes: `Full` is one BERT-Base layer; `Quick` divides the row counts by 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// One BERT-Base layer's rows.
    Full,
    /// A sixteenth of the rows, for a quick look.
    Quick,
}

type Op<'a> = dyn Fn(&mut Ctx<TcpChannel>, &RingTensor) -> Result<RingTensor> + Sync + 'a;

struct Measured {
    out: RingTensor,
    seconds: f64,
    stats: LabelStats,
    /// Per innermost label.
    labels: std::collections::BTreeMap<veil_core::CostClass, LabelStats>,
    /// COTs consumed (sending + receiving), valid when no pool refill happened during the run.
    cots: usize,
}

/// Runs `op` on shares of `x`; with `precompute = Some(n)` the COT pools are filled with n per
/// direction first (outside the measurement).
/// With `he`, the parties also set up the BFV keys of share products (set-up excluded too) and
/// the context carries them.
fn run_op(
    x: &RingTensor,
    op: &Op,
    precompute: Option<usize>,
    he: bool,
) -> Result<(Measured, Measured)> {
    let ax = Approx::new(FixedPoint::default_format())?;
    let (x0, x1) = share(x, &mut Prg::from_os_entropy())?;
    let party = |ch: &mut TcpChannel, role: Role, xs: &RingTensor| -> Result<Measured> {
        let mut ot = OtSession::setup(ch, role)?;
        if let Some(n) = precompute {
            ot.precompute(ch, n)?;
        }
        let sets = [veil_he::session::SHARED_SET];
        let (client, server) = match (he, role) {
            (false, _) => (None, None),
            (true, Role::Client) => (Some(ClientSession::setup_for(ch, x.ring(), &sets)?), None),
            (true, Role::Server) => (None, Some(ServerSession::setup_for(ch, x.ring(), &sets)?)),
        };
        let before = ot.available();
        ch.meter().reset();
        let t = Instant::now();
        let out = {
            let mut cx = Ctx::new(&mut ot, ch, role, ax);
            if let Some(s) = &client {
                cx = cx.with_he(HeKeys::client(s, x.ring())?)?;
            }
            if let Some(s) = &server {
                cx = cx.with_he(HeKeys::server(s, x.ring())?)?;
            }
            op(&mut cx, xs)?
        };
        ch.flush()?;
        let seconds = t.elapsed().as_secs_f64();
        let after = ot.available();
        Ok(Measured {
            out,
            seconds,
            stats: ch.meter().total(),
            labels: ch.meter().snapshot(),
            cots: before.0.saturating_sub(after.0) + before.1.saturating_sub(after.1),
        })
    };
    run_two_party_tcp(
        |ch| party(ch, Role::Client, &x0),
        |ch| party(ch, Role::Server, &x1),
    )
}

/// Online traffic and COT consumption per element on `slice`: the op runs after pre-generating
/// n and then 4n COTs per direction; a refill during a run would add traffic, so equal traffic
/// and consumption in both runs prove neither refilled. Otherwise n grows.
fn online_cost(slice: &RingTensor, op: &Op, he: bool) -> Result<(f64, f64)> {
    let mut n = 1usize << 20;
    loop {
        let (a, _) = run_op(slice, op, Some(n), he)?;
        let (b, _) = run_op(slice, op, Some(4 * n), he)?;
        let bytes = |m: &Measured| m.stats.bytes_sent + m.stats.bytes_received;
        if bytes(&a) == bytes(&b) && a.cots == b.cots {
            let m = slice.len() as f64;
            return Ok((bytes(&a) as f64 * 8.0 / m, a.cots as f64 / m));
        }
        n *= 4;
    }
}

fn measure(
    out: &mut Reporter,
    name: &str,
    x: &RingTensor,
    slice: &RingTensor,
    op: &Op,
    reference: &dyn Fn(&[f64]) -> Vec<f64>,
) -> Result<()> {
    measure_in(out, name, (x, slice), op, reference, false)
}

/// [`measure`], with the share-product BFV keys in the context when `he`.
fn measure_in(
    out: &mut Reporter,
    name: &str,
    (x, slice): (&RingTensor, &RingTensor),
    op: &Op,
    reference: &dyn Fn(&[f64]) -> Vec<f64>,
    he: bool,
) -> Result<()> {
    if !out.wants(name) {
        return Ok(());
    }
    let fp = FixedPoint::default_format();
    let (c, s) = run_op(x, op, None, he)?;
    let y = c.out.add(&s.out)?.decode(fp);
    let want = reference(&x.decode(fp));
    let err = y
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let bytes = c.stats.bytes_sent + c.stats.bytes_received;
    let n = x.len();
    // Where the bits go: the innermost label of each byte (the client's meter sees both directions).
    let split: serde_json::Map<String, Value> = c
        .labels
        .iter()
        .map(|(k, v)| {
            let bits = (v.bytes_sent + v.bytes_received) as f64 * 8.0 / n as f64;
            (k.to_string(), json!((bits * 10.0).round() / 10.0))
        })
        .collect();
    let (online, cots) = online_cost(slice, op, he)?;
    (out.report)(&json!({
        "op": name,
        "elements": n,
        "time_s": c.seconds.max(s.seconds),
        "bytes_total": bytes,
        "bytes_client_to_server": c.stats.client_to_server(Role::Client),
        "bytes_server_to_client": c.stats.server_to_client(Role::Client),
        "bits_per_element": bytes as f64 * 8.0 / n as f64,
        "rounds": c.stats.rounds(),
        "max_abs_error": err,
        "online_bits_per_element": online,
        "cots_per_element": cots,
        "split_bits_per_element": split,
        "he_keys": he,
    }));
    Ok(())
}

/// The first `rows` rows of a 2-D tensor (or the first `rows` elements of a 1-D one).
fn head(x: &RingTensor, rows: usize) -> Result<RingTensor> {
    let cols = if x.shape().len() == 2 {
        x.shape()[1]
    } else {
        1
    };
    let mut shape = x.shape().to_vec();
    shape[0] = rows;
    RingTensor::from_vec(x.ring(), &shape, x.data()[..rows * cols].to_vec())
}

fn random(shape: &[usize], scale: f64) -> Result<RingTensor> {
    let mut prg = Prg::from_os_entropy();
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| (prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale)
        .collect();
    RingTensor::encode(FixedPoint::default_format(), shape, &v)
}

/// `x` with two outlier columns per row at ±221 (MiniLM-L6's largest LayerNorm deviation) and
/// ±900 (near the domain edge |x − mean| < 1024), alternating in sign by row.
fn with_outliers(x: &RingTensor) -> Result<RingTensor> {
    let fp = FixedPoint::default_format();
    let cols = *x.shape().last().unwrap_or(&1);
    let mut v = x.data().to_vec();
    for (r, row) in v.chunks_mut(cols).enumerate() {
        let s = if r % 2 == 0 { 1.0 } else { -1.0 };
        row[r % cols] = fp.encode(221.0 * s);
        row[(r + cols / 2) % cols] = fp.encode(-900.0 * s);
    }
    RingTensor::from_vec(x.ring(), x.shape(), v)
}

/// `op` with the 1-bit-error truncation inside (the cheaper, not bit-exact variant).
fn cheap<'a>(
    op: &'a Op<'a>,
) -> impl Fn(&mut Ctx<TcpChannel>, &RingTensor) -> Result<RingTensor> + Sync + 'a {
    move |cx, x| {
        cx.trunc_mode = TruncMode::OneBitError;
        op(cx, x)
    }
}

fn rowwise(cols: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> impl Fn(&[f64]) -> Vec<f64> {
    move |x: &[f64]| x.chunks(cols).flat_map(&f).collect()
}

/// Runs every operator of the benchmark and returns one JSON object each.
pub fn run(scale: Scale) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    run_streaming(scale, None, &mut |v| all.push(v.clone()))?;
    Ok(all)
}

/// [`run`], handing each operator's result to `report` as soon as it is measured; `only` keeps
/// the operators whose name contains it.
pub fn run_streaming(
    scale: Scale,
    only: Option<&str>,
    report: &mut dyn FnMut(&Value),
) -> Result<()> {
    let div = if scale == Scale::Full { 1 } else { 16 };
    let fp = FixedPoint::default_format();
    let one = 1u64 << fp.frac_bits();
    let mut out = Reporter { report, only };
    let drelu_op = |bound: Option<u32>| {
        move |cx: &mut Ctx<TcpChannel>, x: &RingTensor| {
            let b = cx.drelu(x.data(), bound)?;
            let v = cx.b2a(&b)?;
            // Scale the bit to fixed-point 1.0 so the error is measured in real units.
            Ok(RingTensor::from_vec(x.ring(), x.shape(), v)?.scale(one))
        }
    };
    let step = |x: &[f64]| {
        x.iter()
            .map(|&v| (v >= 0.0) as u8 as f64)
            .collect::<Vec<_>>()
    };
    let relus = |x: &[f64]| x.iter().map(|&v| reference::relu(v)).collect::<Vec<_>>();

    let d = random(&[(1 << 20) / div], 1000.0)?;
    let d_small = random(&[(1 << 20) / div], 100.0)?;
    measure(
        &mut out,
        "DReLU",
        &d,
        &head(&d, 4096)?,
        &drelu_op(None),
        &step,
    )?;
    measure(
        &mut out,
        "DReLU (|x| < 2^20)",
        &d_small,
        &head(&d_small, 4096)?,
        &drelu_op(Some(20)),
        &step,
    )?;
    let relu_full = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.relu_tensor(x, None);
    let relu_20 = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.relu_tensor(x, Some(20));
    measure(
        &mut out,
        "ReLU (2^20)",
        &d,
        &head(&d, 4096)?,
        &relu_full,
        &relus,
    )?;

    let h = random(&[128 / div, 3072], 6.0)?;
    let h_slice = RingTensor::from_vec(h.ring(), &[1, 256], h.data()[..256].to_vec())?;
    measure(&mut out, "ReLU", &h, &h_slice, &relu_full, &relus)?;
    measure(
        &mut out,
        "ReLU (|x| < 2^20)",
        &h,
        &h_slice,
        &relu_20,
        &relus,
    )?;
    let gelu = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.gelu(x, None);
    let gelus = |x: &[f64]| x.iter().map(|&v| reference::gelu(v)).collect::<Vec<_>>();
    measure(&mut out, "GELU", &h, &h_slice, &gelu, &gelus)?;
    measure(
        &mut out,
        "GELU (1-bit trunc)",
        &h,
        &h_slice,
        &cheap(&gelu),
        &gelus,
    )?;
    // The bound a Base-class model proves from its weights (all-mpnet-base-v2: 21 bits).
    let gelu_21 = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.gelu(x, Some(21));
    measure(
        &mut out,
        "GELU (|x| < 2^21)",
        &h,
        &h_slice,
        &gelu_21,
        &gelus,
    )?;

    let cols = 128;
    let att = random(&[12 * 128 / div, cols], 8.0)?;
    let valid = vec![true; cols];
    let eps = fp.decode(Approx::new(fp)?.relu_normalise_eps());
    let sm = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.softmax(x, &valid);
    let sm_ref = rowwise(cols, |r| reference::softmax(r, &valid));
    measure(&mut out, "Softmax", &att, &head(&att, 2)?, &sm, &sm_ref)?;
    measure(
        &mut out,
        "Softmax (1-bit trunc)",
        &att,
        &head(&att, 2)?,
        &cheap(&sm),
        &sm_ref,
    )?;
    let rn = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.relu_normalise(x, &valid, None);
    let rn20 = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.relu_normalise(x, &valid, Some(20));
    let rn_ref = rowwise(cols, |r| reference::relu_normalise(r, &valid, eps));
    // The whole-model pass's configuration: ReLU inputs promised |x| < 2^RELU_DOMAIN_BITS.
    let model_bound = Approx::new(fp)?.relu_bound_bits();
    let rn_model =
        |cx: &mut Ctx<TcpChannel>, x: &RingTensor| cx.relu_normalise(x, &valid, Some(model_bound));
    measure(
        &mut out,
        "ReLU-normalise",
        &att,
        &head(&att, 2)?,
        &rn,
        &rn_ref,
    )?;
    measure(
        &mut out,
        "ReLU-normalise (1-bit trunc)",
        &att,
        &head(&att, 2)?,
        &cheap(&rn),
        &rn_ref,
    )?;
    measure(
        &mut out,
        "ReLU-normalise (|x| < 2^20, 1-bit trunc)",
        &att,
        &head(&att, 2)?,
        &cheap(&rn20),
        &rn_ref,
    )?;
    measure(
        &mut out,
        "ReLU-normalise (whole-model: |x| < 2^13, 1-bit trunc)",
        &att,
        &head(&att, 2)?,
        &cheap(&rn_model),
        &rn_ref,
    )?;

    let e = 768;
    let hid = random(&[128 / div, e], 4.0)?;
    let gamma = random(&[e], 2.0)?;
    let beta = random(&[e], 1.0)?;
    let (gq, bq) = (gamma.decode(fp), beta.decode(fp));
    let params = AffineParams {
        gamma: gamma.data(),
        beta: beta.data(),
    };
    let ln_eps = 1e-12;
    let ln = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| {
        let p = (cx.role == Role::Server).then_some(&params);
        cx.layer_norm(x, p, ln_eps)
    };
    let ln_ref = rowwise(e, |r| reference::layer_norm(r, &gq, &bq, ln_eps));
    measure(&mut out, "LayerNorm", &hid, &head(&hid, 1)?, &ln, &ln_ref)?;
    let outl = with_outliers(&hid)?;
    measure(
        &mut out,
        "LayerNorm (outliers ±221, ±900)",
        &outl,
        &head(&outl, 1)?,
        &ln,
        &ln_ref,
    )?;
    let he = true;
    measure_in(
        &mut out,
        "LayerNorm (1-bit trunc)",
        (&hid, &head(&hid, 8)?),
        &cheap(&ln),
        &ln_ref,
        he,
    )?;
    measure_in(
        &mut out,
        "LayerNorm (outliers ±221, ±900, 1-bit trunc)",
        (&outl, &head(&outl, 8)?),
        &cheap(&ln),
        &ln_ref,
        he,
    )?;
    measure(
        &mut out,
        "LayerNorm (1-bit trunc, COTs only)",
        &hid,
        &head(&hid, 1)?,
        &cheap(&ln),
        &ln_ref,
    )?;
    let ca = |cx: &mut Ctx<TcpChannel>, x: &RingTensor| {
        let p = (cx.role == Role::Server).then_some(&params);
        cx.centre_affine(x, p)
    };
    let ca_ref = rowwise(e, |r| reference::centre_affine(r, &gq, &bq));
    measure(
        &mut out,
        "Centre-affine",
        &hid,
        &head(&hid, 1)?,
        &ca,
        &ca_ref,
    )?;
    measure(
        &mut out,
        "Centre-affine (1-bit trunc)",
        &hid,
        &head(&hid, 1)?,
        &cheap(&ca),
        &ca_ref,
    )?;
    Ok(())
}
