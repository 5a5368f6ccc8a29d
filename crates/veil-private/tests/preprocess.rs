//! Preprocessed inferences (veil_private::preprocess) against the simulator: with faithful
//! truncations the private output equals the simulator's integers with and without
//! preprocessing, for the original and the friendly operators, MPNet's position bias and mean
//! pooling, at several lengths; material is used once, by the inference of its length; the
//! server refuses preprocessing over its budget and requests for material it does not hold;
//! the COTs the pools are filled with, known from the shape alone, are what inferences draw.

use veil_core::approx::Approx;
use veil_core::wire::Writer;
use veil_core::{CostClass, FixedPoint, RingTensor};
use veil_linear::{ClientSession, ServerSession};
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{
    Activation, Architecture, BlockVariant, HeadKind, ModelConfig, ProductTruncation,
};
use veil_net::{run_two_party, Channel, Role, TcpChannel};
use veil_nonlinear::OtSession;
use veil_private::CotCounts;
use veil_private::{material_bytes, plan, Step};
use veil_private::{serve_session, ClientConnection, ServerModel};
use veil_private::{ClientOptions, RunningServer, ServeOptions, Server, Transport};
use veil_private::{Party, Side};

fn tiny(arch: Architecture, variant: BlockVariant, head: HeadKind, seq: usize) -> ModelConfig {
    let mut cfg = ModelConfig::builder(arch)
        .positions(seq)
        .head(head)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![variant; 2];
    cfg.veil.product_truncation = ProductTruncation::Faithful;
    cfg
}

/// A running plain-TCP server for `server`, with its session memory set to `memory` if given.
fn spawn(server: ServerModel, memory: Option<u64>) -> RunningServer {
    let server = std::sync::Arc::new(server);
    let mut opts = ServeOptions::for_model(&server, Transport::Plaintext);
    if let Some(m) = memory {
        opts.memory_budget = m;
    }
    Server::new(server, opts)
        .unwrap()
        .spawn(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap()
}

fn models(cfg: &ModelConfig, seed: u8) -> (FixedModel, ServerModel) {
    let fp = FixedPoint::default_format();
    let t = random_transformer_with_std(cfg, [seed; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, fp).unwrap();
    (fixed.clone(), ServerModel::new(fixed).unwrap())
}

/// The simulator's output and the client's embedding of `ids`.
fn expected(sim: &FixedModel, ids: &[u32]) -> (Vec<f64>, RingTensor) {
    let types = vec![0u32; ids.len()];
    let out = sim.forward(ids, &types).unwrap();
    let want = match &out.logits {
        Some(l) => l.decode(sim.fp()),
        None => out.pooled.decode(sim.fp()),
    };
    (want, sim.embed(ids, &types).unwrap().0)
}

/// In one session: a plain inference, two preprocessed lengths (one of them twice), the
/// preprocessed inferences in another order than their preprocessing, and a plain one after
/// the material is used up; every output equals the simulator's, the preprocessed reports carry
/// their offline phase, and their online MatMul traffic is a fraction of the plain one's.
#[test]
fn preprocessed_inferences_equal_the_simulator() {
    let cases = [
        tiny(
            Architecture::Bert,
            BlockVariant::friendly(),
            HeadKind::Pooler,
            16,
        ),
        tiny(
            Architecture::Bert,
            BlockVariant::exact(Activation::Gelu),
            HeadKind::MeanPool,
            16,
        ),
        tiny(
            Architecture::MpNet,
            BlockVariant::friendly(),
            HeadKind::Pooler,
            16,
        ),
    ];
    for (i, cfg) in cases.iter().enumerate() {
        let (sim, server) = models(cfg, 30 + i as u8);
        let a: Vec<u32> = vec![3, 1, 4, 1, 5];
        let b: Vec<u32> = vec![9, 2, 6, 5, 3, 5, 8, 9, 7];
        let (want_a, xa) = expected(&sim, &a);
        let (want_b, xb) = expected(&sim, &b);
        let (got, ()) = run_two_party(
            |ch| {
                let mut c = ClientConnection::connect(ch, b.len())?;
                let plain = c.infer(&xa, None)?;
                c.preprocess(b.len())?;
                c.preprocess(a.len())?;
                c.preprocess(b.len())?;
                assert_eq!((c.preprocessed(a.len()), c.preprocessed(b.len())), (1, 2));
                let pa = c.infer(&xa, None)?;
                let pb = c.infer(&xb, None)?;
                let pb2 = c.infer(&xb, None)?;
                assert_eq!((c.preprocessed(a.len()), c.preprocessed(b.len())), (0, 0));
                let after = c.infer(&xb, None)?;
                c.close()?;
                Ok([plain, pa, pb, pb2, after])
            },
            |ch| serve_session(ch, &server),
        )
        .unwrap();
        let wants = [&want_a, &want_a, &want_b, &want_b, &want_b];
        for (j, ((y, report), want)) in got.iter().zip(wants).enumerate() {
            assert_eq!(y, want, "model {i}, inference {j}");
            assert_eq!(
                report.offline.is_some(),
                (1..=3).contains(&j),
                "inference {j}"
            );
        }
        let matmul = |r: &veil_private::CostReport| {
            let s = &r.online.per_op[&CostClass::MatMul];
            s.bytes_sent + s.bytes_received
        };
        assert!(
            matmul(&got[1].1) * 4 < matmul(&got[0].1),
            "online MatMul {} vs {} bytes",
            matmul(&got[1].1),
            matmul(&got[0].1)
        );
        assert!(got[1]
            .1
            .offline
            .as_ref()
            .unwrap()
            .per_op
            .contains_key(&CostClass::MatMul));
    }
}

/// The plan is the engine's own sequence of linear steps: per block QKV, two product batches
/// (one product per head), O, the two FFN layers; then the head.
#[test]
fn the_plan_follows_the_composition() {
    let cfg = tiny(
        Architecture::Bert,
        BlockVariant::friendly(),
        HeadKind::Pooler,
        16,
    );
    let ring = FixedPoint::default_format().ring;
    let steps = plan(&cfg, ring, 5).unwrap();
    use veil_model::engine::LayerId::*;
    let block = |i| {
        vec![
            Step::Fc(Qkv(i), 5),
            Step::Products(vec![(5, 8, 5); 2]),
            Step::Products(vec![(5, 5, 8); 2]),
            Step::Fc(AttnOut(i), 5),
            Step::Fc(Intermediate(i), 5),
            Step::Fc(Output(i), 5),
        ]
    };
    let mut want = block(0);
    want.extend(block(1));
    want.extend([Step::Fc(Pooler, 1), Step::Fc(Classifier, 1)]);
    assert_eq!(steps, want);
    assert!(material_bytes(&cfg, &steps, true) > material_bytes(&cfg, &steps, false));
}

/// A client that asks for material the server does not hold ends its session with an error
/// on the server; a preprocessing request over the server's budget is refused with a message
/// and the session goes on.
#[test]
fn the_server_refuses_what_it_cannot_honour() {
    let cfg = tiny(
        Architecture::Bert,
        BlockVariant::friendly(),
        HeadKind::Pooler,
        512,
    );
    let (sim, server) = models(&cfg, 40);
    // A budget of 40 MiB: two 512-token preprocessings of this model fit, a third does not.
    // (The other tests of this file, if they run meanwhile, stay far below it.)
    std::env::set_var("VEIL_PREPROCESS_BUDGET_MIB", "40");
    let ring = FixedPoint::default_format().ring;
    let per = material_bytes(&cfg, &plan(&cfg, ring, 512).unwrap(), false);
    let fit = veil_private::preprocess_budget() / per;
    assert_eq!(fit, 2, "{per} bytes per preprocessing");
    let (want, x) = expected(&sim, &[1, 2, 3]);
    let ((refused, y), ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, 512)?;
            let mut refused = None;
            for _ in 0..=fit {
                if let Err(e) = c.preprocess(512) {
                    refused = Some(e.to_string());
                    break;
                }
            }
            let y = c.infer(&x, None)?.0;
            c.close()?;
            Ok((refused, y))
        },
        |ch| serve_session(ch, &server),
    )
    .unwrap();
    let refused = refused.expect("the budget refuses one preprocessing too many");
    assert!(refused.contains("refused to preprocess"), "{refused}");
    assert_eq!(y, want);

    // A raw client asking for preprocessed material that was never made.
    let (_, served) = run_two_party(
        |ch| {
            let c = ClientConnection::connect(&mut *ch, 16)?;
            drop(c);
            let mut w = Writer::new();
            w.u8(1).u32(3).u8(1);
            ch.send_msg(&w.finish())?;
            ch.flush()
        },
        |ch| Ok(serve_session(ch, &server)),
    )
    .unwrap();
    let err = served.unwrap_err().to_string();
    assert!(err.contains("preprocessed material"), "{err}");
}

/// The COTs an inference draws, as `CotCounts::per_inference` derives them from the shape
/// (sampling each operator on one and two rows), equal the COTs real inferences of several
/// lengths draw, in both directions, for the original and the friendly operators, LayerNorm on
/// BFV, MPNet's position bias, the pooler's tanh and mean pooling, in both truncation modes.
#[test]
fn pool_sizes_from_the_shape_are_what_inferences_draw() {
    let mut one_bit = tiny(
        Architecture::Bert,
        BlockVariant::exact(Activation::Gelu),
        HeadKind::Pooler,
        16,
    );
    one_bit.veil.product_truncation = veil_model::ProductTruncation::OneBitError;
    let cases = [
        tiny(
            Architecture::Bert,
            BlockVariant::friendly(),
            HeadKind::Pooler,
            16,
        ),
        one_bit,
        tiny(
            Architecture::MpNet,
            BlockVariant::exact(Activation::Relu),
            HeadKind::MeanPool,
            16,
        ),
    ];
    for (i, cfg) in cases.iter().enumerate() {
        let (sim, server) = models(cfg, 50 + i as u8);
        for seq in [1usize, 6, 13] {
            let ids: Vec<u32> = (0..seq as u32).map(|t| (7 * t + 3) % 50).collect();
            let (_, x) = expected(&sim, &ids);
            let ax = Approx::new(sim.fp()).unwrap();
            let ring = ax.fp.ring;
            let (client, served) = run_two_party(
                |ch| {
                    let lin = ClientSession::setup(ch, ring)?;
                    let mut ot = OtSession::setup(ch, Role::Client)?;
                    let before = ot.consumed();
                    let x0 = RingTensor::zeros(ring, x.shape())?;
                    Party {
                        ch,
                        ot: &mut ot,
                        ax,
                        cfg,
                        activation_bits: server.fixed().activation_bits(),
                        cuts: server.cuts(),
                        side: Side::Client(&lin, seq),
                        pre: None,
                    }
                    .encoder_and_head(&x0)?;
                    let after = ot.consumed();
                    Ok((after.0 - before.0, after.1 - before.1))
                },
                |ch| {
                    let lin = ServerSession::setup(ch, ring)?;
                    let mut ot = OtSession::setup(ch, Role::Server)?;
                    let before = ot.consumed();
                    Party {
                        ch,
                        ot: &mut ot,
                        ax,
                        cfg,
                        activation_bits: server.fixed().activation_bits(),
                        cuts: server.cuts(),
                        side: Side::Server(&lin, &server),
                        pre: None,
                    }
                    .encoder_and_head(&x)?;
                    let after = ot.consumed();
                    Ok((after.0 - before.0, after.1 - before.1))
                },
            )
            .unwrap();
            assert_eq!(client, (served.1, served.0), "model {i}, {seq} tokens");
            assert!(served.0 > 0 && served.1 > 0);
            let predicted = CotCounts::default().per_inference(&server, seq).unwrap();
            assert_eq!(predicted, served, "model {i}, {seq} tokens");
        }
    }
}

/// Bad preprocessing messages end that client's session with an error and lose nothing else:
/// a request for no tokens, one over the announced length, and a request followed by a garbage
/// first message (a wrong-sized encrypted mask), each on its own connection to a running
/// server; an honest client is then served, preprocessed, with the simulator's output.
#[test]
fn malformed_preprocessing_ends_that_session_and_others_are_served() {
    let cfg = tiny(
        Architecture::Bert,
        BlockVariant::friendly(),
        HeadKind::Pooler,
        16,
    );
    let (sim, server) = models(&cfg, 60);
    let running = spawn(server, None);
    let addr = running.local_addr();
    let announce = ClientOptions {
        max_tokens: Some(8),
        ..ClientOptions::default()
    };
    let bad: [&[&[u8]]; 3] = [
        &[&[2, 0, 0, 0, 0]],
        &[&[2, 9, 0, 0, 0]],
        &[&[2, 3, 0, 0, 0], &[0xff; 40]],
    ];
    for (i, messages) in bad.iter().enumerate() {
        let mut ch = TcpChannel::connect(addr).unwrap();
        drop(ClientConnection::connect_with(&mut ch, announce, |_| Ok(())).unwrap());
        for m in *messages {
            ch.send_msg(m).unwrap();
        }
        ch.flush().unwrap();
        // The server answers what it answers (a status, for the third) and hangs up.
        let mut ended = false;
        for _ in 0..4 {
            if ch.recv_msg(1 << 20).is_err() {
                ended = true;
                break;
            }
        }
        assert!(ended, "bad client {i} was not disconnected");
    }
    let ids = [4u32, 8, 15];
    let (want, x) = expected(&sim, &ids);
    let mut c = ClientConnection::connect(TcpChannel::connect(addr).unwrap(), 16).unwrap();
    c.preprocess(ids.len()).unwrap();
    let (y, report) = c.infer(&x, None).unwrap();
    c.close().unwrap();
    assert_eq!(y, want);
    assert!(report.offline.is_some());
    running.stop().unwrap();
}

/// Preprocessing takes its memory from the server's session memory, shared with the other
/// sessions: a server with room for a session's working set and one preprocessing grants the
/// first, refuses the second (saying why; the session goes on and infers), and gets everything
/// back when the session ends with its material unused: the next session can preprocess again.
#[test]
fn preprocessing_is_refused_beyond_the_servers_session_memory() {
    use veil_private::session_memory_estimate;

    let cfg = tiny(
        Architecture::Bert,
        BlockVariant::friendly(),
        HeadKind::Pooler,
        16,
    );
    let (sim, server) = models(&cfg, 61);
    let ids = [4u32, 8, 15, 16];
    let ring = FixedPoint::default_format().ring;
    let material = material_bytes(&cfg, &plan(&cfg, ring, ids.len()).unwrap(), false) as u64;
    let cots = CotCounts::default()
        .per_inference(&server, ids.len())
        .unwrap();
    let one = material + 33 * cots.0.max(cots.1);
    let running = spawn(server, Some(session_memory_estimate(&cfg, 16) + one + 1024));
    let (want, x) = expected(&sim, &ids);
    for session in 0..2 {
        let mut c =
            ClientConnection::connect(TcpChannel::connect(running.local_addr()).unwrap(), 16)
                .unwrap();
        c.preprocess(ids.len()).unwrap();
        let err = c.preprocess(ids.len()).unwrap_err();
        assert!(matches!(err, veil_core::Error::Refused(_)), "{err}");
        assert!(err.to_string().contains("session memory"), "{err}");
        if session == 1 {
            let (y, report) = c.infer(&x, None).unwrap();
            assert_eq!(y, want);
            assert!(report.offline.is_some());
        }
        c.close().unwrap();
    }
    running.stop().unwrap();
}
