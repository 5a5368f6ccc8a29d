//! Private-embedding mode end to end: tiny random models whose config says
//! `EmbeddingMode::Private`, the client holding only token ids and the server the tables. The
//! logits the client reconstructs must equal the fixed-point simulator's (`FixedModel::forward`,
//! which looks the rows up in fixed point and runs the embedding LayerNorm) exactly, for both
//! lookup methods, and the cost report must show the embedding on its own line.

use veil_core::{CostClass, Error, FixedPoint, RingTensor};
use veil_linear::LookupMethod;
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{
    Activation, Architecture, BlockVariant, EmbeddingMode, ModelConfig, ProductTruncation,
};
use veil_net::run_two_party;
use veil_private::ServerEmbedding;
use veil_private::Tokens;
use veil_private::{serve_session_with, ClientConnection, ServerModel};

fn tiny(arch: Architecture, variant: BlockVariant) -> ModelConfig {
    // Vocabulary 60 > 2 × the sequence lengths below, so the batched method hashes the table.
    let mut cfg = ModelConfig::builder(arch)
        .vocab(60)
        .positions(24)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![variant; 2];
    cfg.veil.product_truncation = ProductTruncation::Faithful;
    cfg.veil.embedding = EmbeddingMode::Private;
    cfg
}

fn models(cfg: &ModelConfig, seed: u8) -> (FixedModel, ServerModel) {
    let fp = FixedPoint::default_format();
    let t = random_transformer_with_std(cfg, [seed; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, fp).unwrap();
    (fixed.clone(), ServerModel::new(fixed).unwrap())
}

/// Both methods (the batched one on two inputs, one of them with repeated ids), BERT with two
/// token types and RoBERTa (offset positions); one session per case.
#[test]
fn private_embedding_matches_the_simulator_exactly() {
    let a = (vec![0u32, 59, 7, 7, 31], vec![0u32, 0, 0, 1, 1]);
    let b = (vec![12u32, 3, 59, 40, 0, 1, 58, 20, 20, 5], vec![0u32; 10]);
    let cases = [
        (
            Architecture::Bert,
            BlockVariant::exact(Activation::Gelu),
            LookupMethod::OneHot,
            vec![a.clone()],
        ),
        (
            Architecture::Bert,
            BlockVariant::exact(Activation::Gelu),
            LookupMethod::Batched,
            vec![a, b.clone()],
        ),
        (
            Architecture::Roberta,
            BlockVariant::friendly(),
            LookupMethod::Batched,
            vec![b],
        ),
    ];
    for (arch, variant, method, inputs) in cases {
        let cfg = tiny(arch, variant);
        let (sim, server) = models(&cfg, 1);
        let want: Vec<Vec<f64>> = inputs
            .iter()
            .map(|(ids, t)| {
                sim.forward(ids, t)
                    .unwrap()
                    .logits
                    .unwrap()
                    .decode(sim.fp())
            })
            .collect();
        let emb = ServerEmbedding::new(server.fixed(), method).unwrap();
        let (got, ()) = run_two_party(
            |ch| {
                let mut c = ClientConnection::connect(ch, 16)?;
                let mut out = Vec::new();
                for (ids, t) in &inputs {
                    out.push(c.infer(Tokens::Ids(ids, t), None)?);
                }
                c.close()?;
                Ok(out)
            },
            |ch| serve_session_with(ch, &server, Some(&emb)),
        )
        .unwrap();
        for ((y, report), w) in got.iter().zip(&want) {
            assert_eq!(y, w, "{arch:?} {method:?}");
            let e = &report.online.per_op[&CostClass::Embedding];
            assert!(e.bytes_sent > 0 && e.bytes_received > 0);
        }
    }
}

/// Padding in private mode: the server sees only the padded length, the output equals the
/// unpadded simulation.
#[test]
fn padded_private_embedding_keeps_the_output() {
    let cfg = tiny(Architecture::Bert, BlockVariant::friendly());
    let (sim, server) = models(&cfg, 3);
    let ids = [4u32, 9, 2];
    let want = sim
        .forward(&ids, &[0; 3])
        .unwrap()
        .logits
        .unwrap()
        .decode(sim.fp());
    let padded = [4u32, 9, 2, 0, 0, 0];
    let emb = ServerEmbedding::new(server.fixed(), LookupMethod::Batched).unwrap();
    let (got, ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, 16)?;
            let (y, _) = c.infer(Tokens::Ids(&padded, &[0; 6]), Some(3))?;
            c.close()?;
            Ok(y)
        },
        |ch| serve_session_with(ch, &server, Some(&emb)),
    )
    .unwrap();
    assert_eq!(got, want);
}

/// Wrong calls are refused before anything is sent, so the session stays usable: an embedding
/// instead of ids, out-of-range ids, a mismatched type-id count. A server given no embedding
/// layer for a private model refuses to start.
#[test]
fn bad_private_inputs_are_errors_and_the_session_survives() {
    let cfg = tiny(Architecture::Bert, BlockVariant::friendly());
    let (sim, server) = models(&cfg, 4);
    let want = sim
        .forward(&[1, 2], &[0, 0])
        .unwrap()
        .logits
        .unwrap()
        .decode(sim.fp());
    let emb = ServerEmbedding::new(server.fixed(), LookupMethod::Batched).unwrap();
    let x = RingTensor::zeros(sim.fp().ring, &[2, 16]).unwrap();
    let (got, ()) = run_two_party(
        |ch| {
            let mut c = ClientConnection::connect(ch, 16)?;
            let e1 = c.infer(&x, None).unwrap_err();
            let e2 = c.infer(Tokens::Ids(&[1, 60], &[0, 0]), None).unwrap_err();
            let e3 = c.infer(Tokens::Ids(&[1, 2], &[0]), None).unwrap_err();
            let e4 = c.infer(Tokens::Ids(&[1, 2], &[0, 2]), None).unwrap_err();
            let (y, _) = c.infer(Tokens::Ids(&[1, 2], &[0, 0]), None)?;
            c.close()?;
            Ok((vec![e1, e2, e3, e4], y))
        },
        |ch| serve_session_with(ch, &server, Some(&emb)),
    )
    .unwrap();
    assert!(matches!(got.0[0], Error::Unsupported(_)), "{}", got.0[0]);
    for e in &got.0[1..] {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    assert_eq!(got.1, want);
    let (c, s) = veil_net::mem_pair();
    drop(c);
    assert!(serve_session_with(s, &server, None).is_err());
}

/// The server keeps the lookup of a bounded number of recent lengths, whatever number of
/// lengths it has prepared, most recent first.
#[test]
fn prepared_lookups_are_bounded_in_number() {
    use veil_private::PREPARED_LENGTHS_KEPT;
    let cfg = tiny(Architecture::Bert, BlockVariant::friendly());
    let (fixed, _) = models(&cfg, 9);
    let emb = ServerEmbedding::new(&fixed, LookupMethod::OneHot).unwrap();
    for seq in 1..=PREPARED_LENGTHS_KEPT + 3 {
        emb.prepared(seq).unwrap();
    }
    emb.prepared(5).unwrap();
    let kept = emb.kept_lengths();
    assert_eq!(kept.len(), PREPARED_LENGTHS_KEPT);
    assert_eq!(kept[0], 5);
    assert!(!kept.contains(&1));
}

/// A preparation a session is using is not evicted: a new length waits until one is free
/// (so no more than the kept lengths and the one being prepared exist), while sessions at kept
/// lengths go on without waiting for it.
#[test]
fn a_preparation_in_use_is_not_evicted() {
    use std::sync::mpsc;
    use std::time::Duration;
    use veil_private::PREPARED_LENGTHS_KEPT;
    let cfg = tiny(Architecture::Bert, BlockVariant::friendly());
    let (fixed, _) = models(&cfg, 9);
    let emb = ServerEmbedding::new(&fixed, LookupMethod::OneHot).unwrap();
    let lengths: Vec<usize> = (1..=PREPARED_LENGTHS_KEPT).collect();
    let mut in_use: Vec<_> = lengths.iter().map(|&n| emb.prepared(n).unwrap()).collect();
    let new_length = PREPARED_LENGTHS_KEPT + 1;
    std::thread::scope(|s| {
        let (done, finished) = mpsc::channel();
        let emb = &emb;
        s.spawn(move || {
            let p = emb.prepared(new_length).unwrap();
            done.send(p.shape().queries).unwrap();
        });
        assert!(
            finished.recv_timeout(Duration::from_millis(300)).is_err(),
            "a length was evicted while in use"
        );
        // A kept length is served while the new one waits for room.
        assert_eq!(emb.prepared(1).unwrap().shape().queries, 1);
        drop(in_use.remove(1)); // length 2, now the only one free
        assert_eq!(finished.recv().unwrap(), new_length);
    });
    let kept = emb.kept_lengths();
    assert_eq!(kept.len(), PREPARED_LENGTHS_KEPT);
    assert_eq!(kept[0], new_length);
    assert!(!kept.contains(&2), "{kept:?}");
}

/// The lookups' memory ([`cache_bytes`]: the kept lengths and the one being prepared) is
/// reserved from the server's budget: a budget that leaves nothing for sessions beside it is
/// refused at start, and a public-embedding model reserves nothing.
#[test]
fn the_lookups_memory_is_reserved_from_the_servers_budget() {
    use std::sync::Arc;
    use veil_private::{cache_bytes, preparation_bytes, PREPARED_LENGTHS_KEPT};
    use veil_private::{ServeOptions, Server, Transport};
    let cfg = tiny(Architecture::Bert, BlockVariant::friendly());
    let reserved = cache_bytes(&cfg);
    assert_eq!(
        reserved,
        (PREPARED_LENGTHS_KEPT as u64 + 1) * preparation_bytes(&cfg)
    );
    let (_, server) = models(&cfg, 9);
    let server = Arc::new(server);
    let mut opts = ServeOptions::for_model(&server, Transport::Plaintext);
    opts.memory_budget = reserved;
    let err = Server::new(server.clone(), opts).err().unwrap().to_string();
    assert!(err.contains("leaves nothing for sessions"), "{err}");
    let mut opts = ServeOptions::for_model(&server, Transport::Plaintext);
    opts.memory_budget = reserved + 1;
    Server::new(server, opts).unwrap();

    let mut public = cfg.clone();
    public.veil.embedding = EmbeddingMode::Public;
    assert_eq!(cache_bytes(&public), 0);
}
