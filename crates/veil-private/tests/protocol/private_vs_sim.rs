//! The private forward pass against its oracle, the fixed-point simulator: for tiny random models
//! of every variant (BERT and MPNet blocks), the logits the client reconstructs must equal the
//! simulator's integers exactly when every truncation is the faithful one, and stay within the
//! stated bound with the default one-bit-error truncation after products.

use std::net::TcpListener;
use std::sync::Arc;

use veil_core::{CostClass, FixedPoint, RingTensor};
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{
    Activation, Architecture, BlockVariant, HeadKind, ModelConfig, ProductTruncation,
};
use veil_net::{run_two_party, Channel, TcpChannel};
use veil_private::{serve_session, ClientConnection, Cuts, ServerModel};

fn tiny_of(
    arch: Architecture,
    variant: BlockVariant,
    head: HeadKind,
    labels: usize,
) -> ModelConfig {
    let mut cfg = ModelConfig::builder(arch)
        .head(head)
        .labels(labels)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![variant; 2];
    cfg.veil.product_truncation = ProductTruncation::Faithful;
    cfg
}

/// A two-block BERT whose private pass is exact (faithful truncations).
fn tiny(variant: BlockVariant, head: HeadKind, labels: usize) -> ModelConfig {
    tiny_of(Architecture::Bert, variant, head, labels)
}

/// One substituted BERT block with faithful truncations and room for `positions` tokens.
fn one_friendly_block(positions: usize) -> ModelConfig {
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .layers(1)
        .positions(positions)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::friendly()];
    cfg.veil.product_truncation = ProductTruncation::Faithful;
    cfg
}

fn models(cfg: &ModelConfig, seed: u8) -> (FixedModel, ServerModel) {
    let fp = FixedPoint::default_format();
    let t = random_transformer_with_std(cfg, [seed; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, fp).unwrap();
    (fixed.clone(), ServerModel::new(fixed).unwrap())
}

/// The simulator's raw output (logits, or the pooled vector of a model without a classifier)
/// for `ids` (segment 0), and the embedding the client starts from.
fn simulated(sim_model: &FixedModel, ids: &[u32]) -> (Vec<f64>, RingTensor) {
    let types = vec![0u32; ids.len()];
    let sim = sim_model.forward(ids, &types).unwrap();
    let expected = match &sim.logits {
        Some(l) => l.decode(sim_model.fp()),
        None => sim.pooled.decode(sim_model.fp()),
    };
    (expected, sim_model.embed(ids, &types).unwrap().0)
}

/// One private inference of `x` against `server` over the in-memory duplex.
fn infer(
    cfg: &ModelConfig,
    server: &ServerModel,
    x: &RingTensor,
) -> (Vec<f64>, veil_private::CostReport) {
    let (r, ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, cfg.max_sequence_len())?;
            let r = c.infer(x, None)?;
            c.close()?;
            Ok(r)
        },
        |ch| serve_session(ch, server),
    )
    .unwrap();
    r
}

/// Runs one private inference over the in-memory duplex; returns (private, simulated) raw outputs.
fn run(cfg: &ModelConfig, ids: &[u32], seed: u8) -> (Vec<f64>, Vec<f64>, veil_private::CostReport) {
    let (sim_model, server) = models(cfg, seed);
    let (expected, x) = simulated(&sim_model, ids);
    let (got, report) = infer(cfg, &server, &x);
    (got, expected, report)
}

#[test]
fn original_operators_match_the_simulator_exactly() {
    let cfg = tiny(BlockVariant::exact(Activation::Gelu), HeadKind::Pooler, 2);
    // The server announces its GELU bound and both parties compare on it (a client that did
    // not would speak other flights).
    let k = models(&cfg, 1).0.activation_bits();
    assert!(k.is_some_and(|k| k < 20), "{k:?}");
    let (got, want, report) = run(&cfg, &[1, 7, 3, 9, 2], 1);
    assert_eq!(got, want);
    for op in [
        CostClass::MatMul,
        CostClass::Truncation,
        CostClass::Gelu,
        CostClass::Softmax,
        CostClass::LayerNorm,
        CostClass::Head,
    ] {
        assert!(
            report.online.per_op.contains_key(&op),
            "no cost line for {op}"
        );
    }
    assert!(report.online.total().bytes_sent > 0 && report.setup.total().bytes_received > 0);
}

/// Pads `ids` with `pad` more tokens (the server sees only the padded length) and returns the
/// private output next to the simulator's on the unpadded sequence.
fn run_padded(cfg: &ModelConfig, ids: &[u32], pad: usize, seed: u8) -> (Vec<f64>, Vec<f64>) {
    let (sim_model, server) = models(cfg, seed);
    let types = vec![0u32; ids.len()];
    let want = sim_model
        .forward(ids, &types)
        .unwrap()
        .logits
        .unwrap()
        .decode(sim_model.fp());
    let padded: Vec<u32> = ids
        .iter()
        .copied()
        .chain(std::iter::repeat_n(0, pad))
        .collect();
    let (x, _) = sim_model.embed(&padded, &vec![0; padded.len()]).unwrap();
    let ((got, seen_len), ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, cfg.max_sequence_len())?;
            let (y, _) = c.infer(&x, Some(ids.len()))?;
            c.close()?;
            Ok((y, padded.len()))
        },
        |ch| serve_session(ch, &server),
    )
    .unwrap();
    assert_eq!(seen_len, ids.len() + pad);
    (got, want)
}

#[test]
fn padding_hides_the_length_and_keeps_the_output_exact() {
    for (variant, seed) in [
        (BlockVariant::exact(Activation::Gelu), 6),
        (BlockVariant::friendly(), 7),
    ] {
        let cfg = tiny(variant, HeadKind::Pooler, 2);
        let (got, want) = run_padded(&cfg, &[5, 9, 2], 5, seed);
        assert_eq!(got, want, "{variant:?}");
    }
}

#[test]
fn padding_is_refused_for_mean_pooling() {
    let cfg = tiny(BlockVariant::friendly(), HeadKind::MeanPool, 2);
    let (sim_model, server) = models(&cfg, 8);
    let (x, _) = sim_model.embed(&[1, 2, 0, 0], &[0; 4]).unwrap();
    let (err, ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, cfg.max_sequence_len())?;
            let err = c.infer(&x, Some(2)).unwrap_err();
            c.close()?;
            Ok(err)
        },
        |ch| serve_session(ch, &server),
    )
    .unwrap();
    assert!(matches!(err, veil_core::Error::Unsupported(_)), "{err}");
}

#[test]
fn friendly_operators_match_the_simulator_exactly() {
    let cfg = tiny(BlockVariant::friendly(), HeadKind::Pooler, 3);
    let (got, want, report) = run(&cfg, &[4, 4, 11, 0, 5, 6, 8], 2);
    assert_eq!(got, want);
    for op in [
        CostClass::Relu,
        CostClass::ReluNormalise,
        CostClass::Centring,
    ] {
        assert!(
            report.online.per_op.contains_key(&op),
            "no cost line for {op}"
        );
    }
}

#[test]
fn mpnet_relative_position_bias_matches_the_simulator_exactly() {
    for (variant, head, seed) in [
        (
            BlockVariant::exact(Activation::Gelu),
            HeadKind::MeanPool,
            11,
        ),
        (BlockVariant::friendly(), HeadKind::Pooler, 12),
    ] {
        let cfg = tiny_of(Architecture::MpNet, variant, head, 2);
        let (sim_model, _) = models(&cfg, seed);
        assert!(
            sim_model.relative_attention_bias.is_some(),
            "the random MPNet has no bias table: the test would not test it"
        );
        let (got, want, _) = run(&cfg, &[2, 9, 4, 4, 7, 1], seed);
        assert_eq!(got, want, "{variant:?}");
    }
}

/// The stated bound of one-bit-error truncation, in output units: each product output may be
/// one ulp (2^-13) low; through two random blocks the logits move by far less than this.
const ONE_BIT_ERROR_BOUND: f64 = 0.02;

#[test]
fn one_bit_error_truncation_stays_within_its_bound() {
    for (variant, seed) in [
        (BlockVariant::exact(Activation::Gelu), 13),
        (BlockVariant::friendly(), 14),
    ] {
        let mut cfg = tiny(variant, HeadKind::Pooler, 3);
        cfg.veil.product_truncation = ProductTruncation::OneBitError;
        let (got, want, report) = run(&cfg, &[3, 8, 1, 12, 40, 2, 2, 9], seed);
        assert_eq!(got.len(), want.len());
        let dev = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(dev <= ONE_BIT_ERROR_BOUND, "{variant:?}: deviation {dev}");
        let faithful = {
            let mut c = cfg.clone();
            c.veil.product_truncation = ProductTruncation::Faithful;
            run(&c, &[3, 8, 1, 12, 40, 2, 2, 9], seed).2
        };
        let cost =
            |r: &veil_private::CostReport| r.online.per_op[&CostClass::Truncation].bytes_sent;
        assert!(
            cost(&report) < cost(&faithful),
            "one-bit-error truncation is not cheaper: {} vs {} bytes",
            cost(&report),
            cost(&faithful)
        );
    }
}

/// Rows of 512 values take LayerNorm's HE path (veil-nonlinear's `he_rows`) in the 1-bit mode: the
/// session's share-product keys reach it, and the logits stay within the same bound.
#[test]
fn layer_norm_on_he_rows_stays_within_its_bound() {
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .hidden(512)
        .layers(1)
        .ffn(64)
        .labels(3)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::exact(Activation::Gelu)];
    cfg.veil.product_truncation = ProductTruncation::OneBitError;
    let (got, want, _) = run(&cfg, &[3, 8, 1, 12], 21);
    let dev = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(dev <= ONE_BIT_ERROR_BOUND, "deviation {dev}");
}

#[test]
fn mixed_variants_mean_pooling_and_single_token() {
    let mut cfg = tiny(BlockVariant::exact(Activation::Relu), HeadKind::MeanPool, 2);
    cfg.veil.blocks[1] = BlockVariant::friendly();
    let (got, want, _) = run(&cfg, &[3], 3);
    assert_eq!(got, want);
    let (got, want, _) = run(&cfg, &[3, 1, 4, 1, 5, 9, 2, 6], 4);
    assert_eq!(got, want);
}

#[test]
fn embedding_model_without_classifier_returns_the_pooled_vector() {
    let cfg = tiny(BlockVariant::friendly(), HeadKind::MeanPool, 0);
    let (got, want, _) = run(&cfg, &[2, 3, 5], 5);
    assert_eq!(got.len(), 16);
    assert_eq!(got, want);
}

#[test]
fn tcp_server_serves_two_clients_and_survives_garbage() {
    let cfg = tiny(BlockVariant::friendly(), HeadKind::Pooler, 2);
    let (sim_model, server) = models(&cfg, 6);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Arc::new(server);
    std::thread::spawn(move || veil_private::serve(listener, server));

    // A client that sends garbage, one that hangs up mid-set-up, one with an oversized length.
    let mut bad = TcpChannel::connect(addr).unwrap();
    bad.send_msg(b"hello, world").unwrap();
    bad.flush().unwrap();
    let mut quitter = TcpChannel::connect(addr).unwrap();
    quitter.send(&[8, 0]).unwrap();
    quitter.flush().unwrap();
    drop(quitter);
    let mut huge = TcpChannel::connect(addr).unwrap();
    huge.send(&u32::MAX.to_le_bytes()).unwrap();
    huge.flush().unwrap();

    let (want, x) = simulated(&sim_model, &[5, 6, 7]);
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let x: RingTensor = x.clone();
            std::thread::spawn(move || {
                let mut c =
                    ClientConnection::connect(TcpChannel::connect(addr).unwrap(), 16).unwrap();
                let (y, _) = c.infer(&x, None).unwrap();
                let (y2, _) = c.infer(&x, None).unwrap();
                c.close().unwrap();
                (y, y2)
            })
        })
        .collect();
    for c in clients {
        let (y, y2) = c.join().unwrap();
        assert_eq!(y, want);
        assert_eq!(y2, want);
    }
    // The garbage client is told why, then its connection is closed, not left hanging.
    let why = String::from_utf8_lossy(&bad.recv_msg(1 << 20).unwrap()).into_owned();
    assert!(why.contains("not a Veil client"), "{why}");
    assert!(bad.recv_msg(1 << 20).is_err());
}

#[test]
fn client_gets_a_clear_error_when_the_server_hangs_up() {
    let r = run_two_party(
        |ch| ClientConnection::connect(ch, 16).map(|_| ()),
        |ch| {
            let _hello = ch.recv_msg(8)?;
            Ok(())
        },
    );
    assert!(
        matches!(r, Err(veil_core::Error::Disconnected)),
        "got {:?}",
        r.err()
    );
}

/// One prepared model serves prompts of 1, 7, 128 and 512 tokens in one session, each equal to
/// the simulator bit for bit, and the server's prepared weights do not grow with the number of
/// distinct lengths it has served (the structure's size, not the process's memory).
#[test]
fn one_prepared_model_serves_every_length_exactly() {
    let cfg = one_friendly_block(512);
    let (sim_model, server) = models(&cfg, 21);
    let before = server.prepared().prepared_bytes();
    let lengths = [1usize, 7, 128, 512];
    let prompts: Vec<Vec<u32>> = lengths
        .iter()
        .map(|&n| (0..n as u32).map(|i| (i * 7 + 3) % 50).collect())
        .collect();
    let mut want = Vec::new();
    let mut inputs = Vec::new();
    for ids in &prompts {
        let (w, x) = simulated(&sim_model, ids);
        want.push(w);
        inputs.push(x);
    }
    let (got, ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, 512)?;
            let mut out = Vec::new();
            for x in &inputs {
                out.push(c.infer(x, None)?.0);
            }
            c.close()?;
            Ok(out)
        },
        |ch| serve_session(ch, &server),
    )
    .unwrap();
    for ((g, w), n) in got.iter().zip(&want).zip(lengths) {
        assert_eq!(g, w, "{n} tokens");
    }
    assert_eq!(server.prepared().prepared_bytes(), before);
}

/// A server announces which cuts its linear layers take, and both kinds serve exactly: one
/// without an NTT cache cuts each request for its own length (`Cuts::PerLength`), one caching
/// every kept cut serves from those (`Cuts::Kept`); at lengths inside and between the kept cuts'
/// reference rows both open to the simulator's integers, with different layouts at one length
/// at least.
#[test]
fn both_kinds_of_cuts_match_the_simulator_exactly() {
    let cfg = one_friendly_block(128);
    let (sim_model, per_length) = models(&cfg, 23);
    let kept = ServerModel::with_ntt_budget(sim_model.clone(), usize::MAX).unwrap();
    assert_eq!(per_length.cuts(), Cuts::PerLength);
    assert_eq!(kept.cuts(), Cuts::Kept);
    let mut differs = false;
    for n in [5usize, 20, 40] {
        let ids: Vec<u32> = (0..n as u32).map(|i| (i * 11 + 5) % 50).collect();
        let (want, x) = simulated(&sim_model, &ids);
        let mut traffic = Vec::new();
        for server in [&per_length, &kept] {
            let (got, report) = infer(&cfg, server, &x);
            assert_eq!(got, want, "{n} tokens, {:?}", server.cuts());
            traffic.push(report.online.per_op[&CostClass::MatMul].bytes_sent);
        }
        differs |= traffic[0] != traffic[1];
    }
    assert!(
        differs,
        "the two kinds of cuts took the same layouts at every length"
    );
}
