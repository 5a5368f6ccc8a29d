//! The benchmark: BERT-Tiny and BERT-Base linear layers, both parties in this process
//! over TCP loopback. Each entry reports the online cost (`time_s` = client wall time from
//! sending its ciphertexts to holding its share; bytes each way; rounds = flights) and, apart,
//! the one-off costs: key set-up (`setup_s`, `setup_bytes`) and weight preparation (`prepare_s`).
//! Every result is also checked exactly against the plaintext product (`exact`).

use std::sync::{Barrier, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use veil_core::{reconstruct, share, CostClass, Prg, Result, Ring, RingTensor};
use veil_he::ParamSet;
use veil_net::{run_two_party_tcp, Channel, Role};

use veil_linear::fc::{fc_online_server, fc_premask_client, fc_premask_server};
use veil_linear::matmul::{client_receive, client_send};
use veil_linear::premask::online_client;
use veil_linear::{
    fc_server, shared_matmul_client, shared_matmul_server, ClientSession, FcLayer, PreparedFc,
    ServerSession,
};

const LABEL: CostClass = CostClass::MatMul;
const SETUP: CostClass = CostClass::HeSetup;

/// Fixed-point weights like a trained BERT's: ≈ N(0, 0.05²) at f = 13 (sum of uniforms).
fn model_weights(ring: Ring, shape: &[usize], prg: &mut Prg) -> Result<RingTensor> {
    let n: usize = shape.iter().product();
    let scale = 0.05 * 8192.0;
    let data = (0..n)
        .map(|_| {
            let u: f64 = (0..4)
                .map(|_| prg.below(1 << 20) as f64 / (1 << 20) as f64)
                .sum();
            ring.from_signed(((u - 2.0) * (3.0f64).sqrt() * scale).round() as i64)
        })
        .collect();
    RingTensor::from_vec(ring, shape, data)
}

struct Measured {
    time_s: f64,
    c2s: u64,
    s2c: u64,
    rounds: u64,
    setup_s: f64,
    setup_bytes: u64,
}

/// Runs the key set-up, records its cost, then resets the meter so the online flights are
/// counted on their own (otherwise the first online flight would continue the set-up flight).
fn setup_metered<C: Channel + ?Sized, S>(
    ch: &mut C,
    f: impl FnOnce(&mut C) -> Result<S>,
) -> Result<(S, veil_net::LabelStats)> {
    let s = {
        let _g = ch.meter().enter(SETUP);
        f(ch)?
    };
    let stats = ch
        .meter()
        .snapshot()
        .get(&SETUP)
        .cloned()
        .unwrap_or_default();
    ch.meter().reset();
    Ok((s, stats))
}

fn measure<C: Channel + ?Sized>(ch: &C, online_s: f64, su: &veil_net::LabelStats) -> Measured {
    let snap = ch.meter().snapshot();
    let on = snap.get(&LABEL).cloned().unwrap_or_default();
    Measured {
        time_s: online_s,
        c2s: on.client_to_server(Role::Client),
        s2c: on.server_to_client(Role::Client),
        rounds: on.rounds(),
        setup_s: su.seconds,
        setup_bytes: su.bytes_sent + su.bytes_received,
    }
}

fn entry(shape: &str, m: &Measured, extra: Value) -> Value {
    let mut v = json!({
        "shape": shape,
        "time_s": m.time_s,
        "bytes_client_to_server": m.c2s,
        "bytes_server_to_client": m.s2c,
        "rounds": m.rounds,
        "setup_s": m.setup_s,
        "setup_bytes": m.setup_bytes,
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

/// The layout's operation counts and the cost model's single-thread ms per operation type
/// (`veil_linear::cost`), weight NTTs zero when cached: where the time goes.
fn modelled(p: &veil_he::Params, layout: &veil_linear::Layout, cached: bool) -> Value {
    let mut counts = layout.counts();
    if cached {
        counts.weight_ntts = 0;
    }
    let ms: serde_json::Map<String, Value> = counts
        .breakdown(p)
        .iter()
        .map(|(op, us)| (op.to_string(), json!((us / 100.0).round() / 10.0)))
        .collect();
    json!({ "counts": format!("{counts:?}"), "single_thread_ms": ms })
}

/// The sequence limit the benchmark's layers are prepared for (BERT's 512).
const BENCH_MAX_SEQ: usize = 512;

/// A benchmarked matrix keeps its NTT-domain weights when they take at most this much (as a
/// server with a budget of a few GB would for one layer; BERT-Base's larger matrices do not).
const BENCH_NTT_CACHE_BYTES: usize = 256 << 20;

/// A benchmarked FC layer: random X shared, model-sized W and a bias, prepared as a server
/// with a modest budget would (NTT forms kept up to [`BENCH_NTT_CACHE_BYTES`]).
struct FcFixture {
    ring: Ring,
    x: RingTensor,
    w: RingTensor,
    b: RingTensor,
    x0: RingTensor,
    x1: RingTensor,
    layer: FcLayer,
    fc: PreparedFc,
    prepare_s: f64,
}

impl FcFixture {
    fn new(seq: usize, inp: usize, out: usize) -> Result<Self> {
        let ring = Ring::new(veil_core::defaults::RING_BITS)?;
        let mut g = Prg::from_os_entropy();
        let x = RingTensor::random(ring, &[seq, inp], &mut g)?;
        let w = model_weights(ring, &[out, inp], &mut g)?;
        let b = RingTensor::random(ring, &[out], &mut g)?;
        let (x0, x1) = share(&x, &mut g)?;
        let prep = Instant::now();
        let layer = FcLayer {
            seq,
            max_seq: BENCH_MAX_SEQ,
            in_features: inp,
            out_features: out,
            set: ParamSet::N8192,
        };
        let mut fc = PreparedFc::new(layer, &w, Some(&b))?;
        for (cut, bytes) in fc.ntt_bytes()? {
            if bytes <= BENCH_NTT_CACHE_BYTES {
                fc.cache_ntt(cut)?;
            }
        }
        let prepare_s = prep.elapsed().as_secs_f64();
        Ok(FcFixture {
            ring,
            x,
            w,
            b,
            x0,
            x1,
            layer,
            fc,
            prepare_s,
        })
    }

    /// Whether the shares open to X·Wᵀ + b.
    fn exact(&self, y0: &RingTensor, y1: &RingTensor) -> Result<bool> {
        let out = self.layer.out_features;
        let mut want = self.x.matmul(&self.w.transpose()?)?;
        for (i, v) in want.data_mut().iter_mut().enumerate() {
            *v = self.ring.add(*v, self.b.data()[i % out]);
        }
        Ok(reconstruct(y0, y1)? == want)
    }
}

/// FC with X shared between the parties, W and b the server's.
pub fn bench_fc(seq: usize, inp: usize, out: usize) -> Result<Value> {
    let f = FcFixture::new(seq, inp, out)?;
    let (ring, layer, prepare_s, fc) = (f.ring, f.layer, f.prepare_s, &f.fc);
    let layout = layer.layout(fc.matrix().params())?;
    let blocking = layout.blocks;
    let cpu0 = veil_core::process::cpu_seconds();
    // CPU per party: the online flow is sequential (client encrypts while the server waits,
    // server computes while the client waits, client decodes after the server is done), so
    // process CPU sampled at the phase boundaries splits by party (to within the hand-over).
    let start = Barrier::new(2);
    let server_done = Mutex::new(None);
    let (client, y1) = run_two_party_tcp(
        |ch| {
            let (s, su) = setup_metered(ch, |ch| ClientSession::setup(ch, ring))?;
            start.wait();
            let _g = ch.meter().enter(LABEL);
            let t = Instant::now();
            let sk = s.key(layer.set)?;
            let lay = layer.layout(sk.params())?;
            let c0 = veil_core::process::cpu_seconds();
            client_send(ch, sk, &[lay], &[&f.x0])?;
            let c1 = veil_core::process::cpu_seconds();
            let y0 = client_receive(ch, sk, &[lay])?.remove(0);
            let c3 = veil_core::process::cpu_seconds();
            let dt = t.elapsed().as_secs_f64();
            drop(_g);
            Ok((y0, measure(ch, dt, &su), [c0, c1, c3]))
        },
        |ch| {
            let (s, _) = setup_metered(ch, |ch| ServerSession::setup(ch, ring))?;
            start.wait();
            let _g = ch.meter().enter(LABEL);
            let y1 = fc_server(ch, &s, fc, &f.x1);
            *server_done.lock().expect("no panics while held") = veil_core::process::cpu_seconds();
            y1
        },
    )?;
    let (y0, m, [c0, c1, c3]) = client;
    let c2 = server_done.into_inner().ok().flatten();
    let diff =
        |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| ((b - a) * 100.0).round() / 100.0);
    let cpu_parties = json!({
        "client_encrypt": diff(c0, c1),
        "server": diff(c1, c2),
        "client_decrypt": diff(c2, c3),
    });
    let cpu_s = cpu0
        .zip(veil_core::process::cpu_seconds())
        .map(|(a, b)| b - a);
    let exact = f.exact(&y0, &y1)?;
    Ok(entry(
        &format!("FC {seq}x{inp}·{inp}x{out}"),
        &m,
        json!({
            "prepare_s": prepare_s,
            "cpu_s_both_parties_incl_setup": cpu_s,
            "cpu_s_online_by_party": cpu_parties,
            "param_set": format!("{:?}", layer.set),
            "blocking": format!("{:?}", blocking),
            "ntt_weights_cached": fc.matrix().is_ntt_cached(blocking.into()),
            "prepared_bytes": fc.prepared_bytes(),
            "modelled": modelled(fc.matrix().params(), &layout, fc.matrix().is_ntt_cached(blocking.into())),
            "exact": exact,
        }),
    ))
}

/// FC as [`bench_fc`], preprocessed (`veil_linear::premask`): the offline Π_MatMul on the
/// client's mask, then the online message and plaintext product, each timed and metered apart.
pub fn bench_fc_preprocessed(seq: usize, inp: usize, out: usize) -> Result<Value> {
    let f = FcFixture::new(seq, inp, out)?;
    let (ring, layer, fc) = (f.ring, f.layer, &f.fc);
    let start = Barrier::new(2);
    let (client, y1) = run_two_party_tcp(
        |ch| {
            let (s, su) = setup_metered(ch, |ch| ClientSession::setup(ch, ring))?;
            start.wait();
            let t = Instant::now();
            let masks = {
                let _g = ch.meter().enter(LABEL);
                fc_premask_client(ch, &s, &[layer])?
            };
            let offline = measure(ch, t.elapsed().as_secs_f64(), &su);
            ch.meter().reset();
            start.wait();
            let t = Instant::now();
            let _g = ch.meter().enter(LABEL);
            let y0 = online_client(ch, masks, &[&f.x0])?.remove(0);
            let dt = t.elapsed().as_secs_f64();
            drop(_g);
            Ok((y0, offline, measure(ch, dt, &su)))
        },
        |ch| {
            let (s, _) = setup_metered(ch, |ch| ServerSession::setup(ch, ring))?;
            start.wait();
            let mut masks = {
                let _g = ch.meter().enter(LABEL);
                fc_premask_server(ch, &s, &[(fc, seq)])?
            };
            start.wait();
            let t = Instant::now();
            let _g = ch.meter().enter(LABEL);
            let y1 = fc_online_server(ch, vec![(fc, masks.remove(0), &f.x1)])?.remove(0);
            Ok((y1, t.elapsed().as_secs_f64()))
        },
    )?;
    let (y0, offline, mut online) = client;
    // The client is done once it has sent; the product is ready when the server is.
    let (y1, server_s) = y1;
    online.time_s = online.time_s.max(server_s);
    let exact = f.exact(&y0, &y1)?;
    Ok(entry(
        &format!("FC {seq}x{inp}·{inp}x{out} preprocessed"),
        &online,
        json!({
            "offline": {
                "time_s": offline.time_s,
                "bytes_client_to_server": offline.c2s,
                "bytes_server_to_client": offline.s2c,
                "rounds": offline.rounds,
            },
            "exact": exact,
        }),
    ))
}

/// `heads` products (n×k)·(k×m) with both operands shared.
pub fn bench_shared(heads: usize, n: usize, k: usize, m: usize, name: &str) -> Result<Value> {
    let ring = Ring::new(veil_core::defaults::RING_BITS)?;
    let mut g = Prg::from_os_entropy();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..heads {
        a.push(RingTensor::random(ring, &[n, k], &mut g)?);
        b.push(RingTensor::random(ring, &[k, m], &mut g)?);
    }
    let (a0, a1): (Vec<_>, Vec<_>) = a
        .iter()
        .map(|t| share(t, &mut g))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let (b0, b1): (Vec<_>, Vec<_>) = b
        .iter()
        .map(|t| share(t, &mut g))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let p = veil_he::Params::new(veil_linear::cross::SHARED_SET, ring)?;
    let layouts = veil_linear::cross::layouts(&p, &vec![(n, k, m); heads])?;
    let cpu0 = veil_core::process::cpu_seconds();
    let (client, c1) = run_two_party_tcp(
        |ch| {
            let (s, su) = setup_metered(ch, |ch| ClientSession::setup(ch, ring))?;
            let _g = ch.meter().enter(LABEL);
            let t = Instant::now();
            let c0 = shared_matmul_client(ch, &s, &a0, &b0)?;
            let dt = t.elapsed().as_secs_f64();
            drop(_g);
            Ok((c0, measure(ch, dt, &su)))
        },
        |ch| {
            let (s, _) = setup_metered(ch, |ch| ServerSession::setup(ch, ring))?;
            let _g = ch.meter().enter(LABEL);
            shared_matmul_server(ch, &s, &a1, &b1)
        },
    )?;
    let cpu_s = cpu0
        .zip(veil_core::process::cpu_seconds())
        .map(|(a, b)| b - a);
    let (c0, m_) = client;
    let mut exact = true;
    for h in 0..heads {
        exact &= reconstruct(&c0[h], &c1[h])? == a[h].matmul(&b[h])?;
    }
    Ok(entry(
        &format!("{name} {heads}x({n}x{k}·{k}x{m}) shared"),
        &m_,
        json!({
            "param_set": "N8192Q4",
            "cpu_s_both_parties_incl_setup": cpu_s,
            "exact": exact,
            "blockings": layouts.iter().map(|l| format!("{:?}", l.blocks)).collect::<Vec<_>>(),
            "modelled": layouts.iter().map(|l| modelled(&p, l, false)).collect::<Vec<_>>(),
        }),
    ))
}

/// Runs every shape of the issue and a per-layer BERT-Base total; one JSON object each.
pub fn run() -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (s, i, o) in [
        (128, 128, 384),
        (128, 128, 128),
        (128, 128, 512),
        (128, 512, 128),
    ] {
        out.push(bench_fc(s, i, o)?);
    }
    let mut layer = Vec::new();
    for (s, i, o) in [(128, 768, 768), (128, 768, 3072), (128, 3072, 768)] {
        let v = bench_fc(s, i, o)?;
        layer.push(v.clone());
        out.push(v);
    }
    // A short prompt against the same prepared form.
    out.push(bench_fc(16, 768, 768)?);
    // The same products preprocessed: what remains online once the masks exist.
    for (s, i, o) in [
        (128, 768, 2304),
        (128, 768, 768),
        (128, 768, 3072),
        (128, 3072, 768),
    ] {
        out.push(bench_fc_preprocessed(s, i, o)?);
    }
    let qk = bench_shared(12, 128, 64, 128, "Q·Kᵀ")?;
    layer.push(qk.clone());
    out.push(qk);
    // The rest of one BERT-Base encoder layer: fused Q/K/V projection and A·V.
    let qkv = bench_fc(128, 768, 2304)?;
    layer.push(qkv.clone());
    out.push(qkv);
    let av = bench_shared(12, 128, 128, 64, "A·V")?;
    layer.push(av.clone());
    out.push(av);
    // Encoder layer = QKV(fused) + O (768²) + FFN1 + FFN2 + Q·Kᵀ + A·V.
    let pick = |name: &str| {
        layer
            .iter()
            .find(|v| v["shape"].as_str().is_some_and(|s| s.starts_with(name)))
    };
    let parts = [
        pick("FC 128x768·768x2304"),
        pick("FC 128x768·768x768"),
        pick("FC 128x768·768x3072"),
        pick("FC 128x3072·3072x768"),
        pick("Q·Kᵀ"),
        pick("A·V"),
    ];
    let sum = |k: &str| {
        parts
            .iter()
            .flatten()
            .map(|v| v[k].as_f64().unwrap_or(0.0))
            .sum::<f64>()
    };
    out.push(json!({
        "shape": "BERT-Base encoder layer, all linear layers (QKV fused, O, FFN1, FFN2, Q·Kᵀ, A·V)",
        "time_s": sum("time_s"),
        "bytes_client_to_server": sum("bytes_client_to_server") as u64,
        "bytes_server_to_client": sum("bytes_server_to_client") as u64,
        "rounds": sum("rounds") as u64,
    }));
    Ok(out)
}
