//! Whole-model cost benchmark: a seeded random model of a paper shape (private-inference cost
//! does not depend on weight values), both parties in one process ([`crate::Loopback`]: TCP
//! loopback, or a link shaped like a given network, whose time is then measured), one private
//! inference of
//! `seq` random tokens. Returns the cost report (online and set-up apart).
//! [`bench_embedding`]: the extra cost of private-embedding mode at the BERT vocabulary.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use veil_core::approx::Approx;
use veil_core::{CostClass, RingTensor};
use veil_core::{FixedPoint, Prg, Result};
use veil_linear::{ClientSession, LookupMethod, ServerSession};
use veil_model::random::{random_transformer, Preset};
use veil_model::FixedModel;
use veil_model::{Activation, BlockVariant, ModelConfig};
use veil_net::{run_two_party_tcp, Channel, NetworkModel, Role};
use veil_nonlinear::OtSession;

use crate::connection::ClientConnection;
use crate::embedding::{embed_client, embed_server, ServerEmbedding};
use crate::loopback::{Link, Loopback};
use crate::prepared::ServerModel;
use crate::report::CostReport;

/// Which operators the benchmark model uses in every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// GELU, Softmax, exact LayerNorms.
    Original,
    /// ReLU, ReLU-normalise, centring LayerNorms (the paper's fully substituted model).
    Substituted,
}

impl Variant {
    /// As `--variant` names it.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Original => "original",
            Variant::Substituted => "substituted",
        }
    }

    fn block(self) -> BlockVariant {
        match self {
            Variant::Original => BlockVariant::exact(Activation::Gelu),
            Variant::Substituted => BlockVariant::friendly(),
        }
    }
}

/// The config of `preset` with `variant` in every block.
pub fn config(preset: Preset, variant: Variant) -> ModelConfig {
    let mut cfg = preset.config();
    cfg.veil.blocks = vec![variant.block(); cfg.num_layers];
    cfg
}

/// What [`run_model`] measured.
pub struct ModelRun {
    /// The client's cost report.
    pub report: CostReport,
    /// The server's one-off weight preparation, seconds.
    pub prepare_s: f64,
    /// The GELU bound both parties compared on (None: the whole ring, or no GELU).
    pub activation_bits: Option<u32>,
}

/// Runs one private inference of `seq` tokens, over TCP loopback (TLS 1.3 on it if `tls`) or
/// (`net`) a link shaped like that network, after preprocessing it when `preprocess` (the
/// report then has the offline phase apart), with `ntt_budget` bytes for the server's NTT-domain
/// weights ([`ServerModel::with_ntt_budget`]). The model's GELU bound is widened to a
/// pretrained model's of its class (`Preset::pretrained_activation_bits`).
pub fn run_model(
    preset: Preset,
    variant: Variant,
    seq: usize,
    net: Option<NetworkModel>,
    tls: bool,
    preprocess: bool,
    ntt_budget: usize,
) -> Result<ModelRun> {
    let link = Link::new(net, tls)?;
    let cfg = config(preset, variant);
    let fp = FixedPoint::default_format();
    let mut fixed = FixedModel::encode(&random_transformer(&cfg, [7; 16])?, fp)?;
    fixed.widen_activation_bound(preset.pretrained_activation_bits());
    let mut prg = Prg::from_os_entropy();
    let ids: Vec<u32> = (0..seq)
        .map(|_| prg.below(cfg.vocab_size as u64) as u32)
        .collect();
    let types = vec![0u32; seq];
    let (x, _) = fixed.embed(&ids, &types)?;
    let activation_bits = fixed.activation_bits();
    let t = Instant::now();
    let server = ServerModel::with_ntt_budget(fixed, ntt_budget)?;
    let prepare_s = t.elapsed().as_secs_f64();
    let parties = Loopback::start(Arc::new(server), link)?;
    let report = parties.connector()().and_then(|ch| infer_once(ch, &x, preprocess));
    parties.stop()?;
    Ok(ModelRun {
        report: report?,
        prepare_s,
        activation_bits,
    })
}

/// The client's side of [`run_model`]: a session with one inference of `x`, preprocessed first
/// if asked.
fn infer_once<C: Channel>(ch: C, x: &RingTensor, preprocess: bool) -> Result<CostReport> {
    let mut c = ClientConnection::connect(ch, x.shape()[0])?;
    if preprocess {
        c.preprocess(x.shape()[0])?;
    }
    let (_, report) = c.infer(x, None)?;
    c.close()?;
    Ok(report)
}

/// [`run_model`] as the JSON object `veil bench model --json` prints.
pub fn run_model_json(
    preset: Preset,
    variant: Variant,
    seq: usize,
    net: Option<NetworkModel>,
    tls: bool,
    preprocess: bool,
    ntt_budget: usize,
) -> Result<Value> {
    let run = run_model(preset, variant, seq, net, tls, preprocess, ntt_budget)?;
    let mut v = run.report.to_json();
    v["model"] = json!(preset.name());
    v["variant"] = json!(variant.name());
    v["seq"] = json!(seq);
    v["tls"] = json!(tls);
    v["preprocessed"] = json!(preprocess);
    v["ntt_budget_mib"] = json!(ntt_budget >> 20);
    v["weight_preparation_s"] = json!(run.prepare_s);
    v["activation_bits"] = json!(run.activation_bits);
    Ok(v)
}

/// The extra online cost of private-embedding mode: the embedding layer (lookup of `seq`
/// random ids of a `vocab`-row word table and a 2-row type table at `width`, position rows, the
/// embedding LayerNorm on shares) with `method`, both parties over TCP loopback, on a seeded
/// random model (one encoder layer, which is not run). JSON: the "Embedding" line (`time_s`,
/// bytes each way, `rounds`), its lookup and LayerNorm parts, and the one-off table
/// preparation apart. The result is checked exactly against the simulator's embedding.
pub fn bench_embedding(
    vocab: usize,
    width: usize,
    seq: usize,
    method: LookupMethod,
) -> Result<Value> {
    use veil_model::{Architecture, EmbeddingMode};
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .vocab(vocab)
        .hidden(width)
        .layers(1)
        .heads((width / 64).max(1))
        .ffn(4 * width)
        .positions(seq.max(512))
        .build()?;
    cfg.veil.embedding = EmbeddingMode::Private;
    let fp = FixedPoint::default_format();
    let fixed = FixedModel::encode(&random_transformer(&cfg, [9; 16])?, fp)?;
    let mut prg = Prg::from_os_entropy();
    let ids: Vec<u32> = (0..seq).map(|_| prg.below(vocab as u64) as u32).collect();
    let types: Vec<u32> = (0..seq).map(|_| prg.below(2) as u32).collect();
    let t = Instant::now();
    let emb = ServerEmbedding::new(&fixed, method)?;
    let prepared = emb.prepared(seq)?;
    let prepare_s = t.elapsed().as_secs_f64();
    let ax = Approx::new(fp)?;
    let ring = fp.ring;
    let ((y0, stats, time_s), y1) = run_two_party_tcp(
        |ch| {
            let lin = ClientSession::setup(ch, ring)?;
            let mut ot = OtSession::setup(ch, Role::Client)?;
            ch.meter().reset();
            let t = Instant::now();
            let y = embed_client(ch, &mut ot, ax, &cfg, &lin, method, &ids, &types)?;
            let dt = t.elapsed().as_secs_f64();
            Ok((y, (ch.meter().by_class(), ch.meter().snapshot()), dt))
        },
        |ch| {
            let lin = ServerSession::setup(ch, ring)?;
            let mut ot = OtSession::setup(ch, Role::Server)?;
            embed_server(ch, &mut ot, ax, &lin, &fixed, &emb, seq)
        },
    )?;
    let (want, _) = fixed.embed(&ids, &types)?;
    let exact = y0.add(&y1)? == want;
    let line = |s: &veil_net::LabelStats| {
        json!({
            "time_s": s.seconds,
            "bytes_client_to_server": s.client_to_server(Role::Client),
            "bytes_server_to_client": s.server_to_client(Role::Client),
            "rounds": s.rounds(),
        })
    };
    let (classes, labels) = stats;
    let total = classes
        .get(&CostClass::Embedding)
        .cloned()
        .unwrap_or_default();
    // The lookup is metered directly under the label; everything nested is the LayerNorm.
    let lookup = labels
        .get(&CostClass::Embedding)
        .cloned()
        .unwrap_or_default();
    let norm = veil_net::LabelStats {
        bytes_sent: total.bytes_sent - lookup.bytes_sent,
        bytes_received: total.bytes_received - lookup.bytes_received,
        flights_sent: total.flights_sent - lookup.flights_sent,
        flights_received: total.flights_received - lookup.flights_received,
        seconds: total.seconds - lookup.seconds,
    };
    let mut v = line(&total);
    v["time_s"] = json!(time_s);
    v["lookup"] = line(&lookup);
    v["layer_norm"] = line(&norm);
    v["method"] = json!(method.name());
    v["vocab"] = json!(vocab);
    v["width"] = json!(width);
    v["seq"] = json!(seq);
    v["batch_plan"] = json!(prepared
        .batch_plans()
        .iter()
        .map(|p| format!("{} parts × {} slots", p.parts, p.slots))
        .collect::<Vec<_>>());
    v["table_preparation_s"] = json!(prepare_s);
    v["ntt_tables_cached"] = json!(prepared.is_ntt_cached());
    v["exact"] = json!(exact);
    Ok(v)
}
