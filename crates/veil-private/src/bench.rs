//! Whole-model cost benchmark: a seeded random model of a paper shape (private-inference cost
//! does not depend on weight values), both parties in two threads over TCP loopback, one private
//! inference of `seq` random tokens. Returns the cost report (online and set-up apart).

use std::time::Instant;

use serde_json::{json, Value};
use veil_core::{FixedPoint, Prg, Result};
use veil_model::random::{random_transformer, Preset};
use veil_model::sim::FixedModel;
use veil_model::{Activation, BlockVariant, ModelConfig};
use veil_net::run_two_party_tcp;

use crate::{serve_session, ClientConnection, CostReport, ServerModel};

/// Which operators the benchmark model uses in every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// GELU, Softmax, exact LayerNorms.
    Original,
    /// ReLU, ReLU-normalise, centring LayerNorms (the paper's fully substituted model).
    Substituted,
}

impl Variant {
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

/// Runs one private inference of `seq` tokens; returns the report plus the server's one-off
/// weight-preparation time.
pub fn run_model(preset: Preset, variant: Variant, seq: usize) -> Result<(CostReport, f64)> {
    let cfg = config(preset, variant);
    let fp = FixedPoint::default_format();
    let fixed = FixedModel::encode(&random_transformer(&cfg, [7; 16])?, fp)?;
    let mut prg = Prg::from_os_entropy();
    let ids: Vec<u32> = (0..seq)
        .map(|_| prg.below(cfg.vocab_size as u64) as u32)
        .collect();
    let types = vec![0u32; seq];
    let (x, _) = fixed.embed(&ids, &types)?;
    let server = ServerModel::new(fixed)?;
    let t = Instant::now();
    server.prepared(seq)?;
    let prepare_s = t.elapsed().as_secs_f64();
    let ((_, report), ()) = run_two_party_tcp(
        |ch| {
            let mut c = ClientConnection::connect(ch)?;
            let r = c.infer(&x)?;
            c.close()?;
            Ok(r)
        },
        |ch| serve_session(ch, &server),
    )?;
    Ok((report, prepare_s))
}

/// [`run_model`] as the JSON object `veil bench model --json` prints.
pub fn run_model_json(preset: Preset, variant: Variant, seq: usize) -> Result<Value> {
    let (report, prepare_s) = run_model(preset, variant, seq)?;
    let mut v = report.to_json();
    v["model"] = json!(preset.name());
    v["variant"] = json!(variant.name());
    v["seq"] = json!(seq);
    v["weight_preparation_s"] = json!(prepare_s);
    Ok(v)
}
