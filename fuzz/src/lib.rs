//! What the fuzz targets share: the server a transcript is replayed to.

use veil_core::FixedPoint;
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{Architecture, BlockVariant, HeadKind, ModelConfig};
use veil_private::ServerModel;

/// A one-block friendly BERT of hidden size 16 (seeded): small enough that a replayed session
/// runs in milliseconds once its set-up is past, with every operator a real model has.
pub fn small_server() -> ServerModel {
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .vocab(40)
        .hidden(16)
        .layers(1)
        .heads(2)
        .ffn(32)
        .positions(16)
        .head(HeadKind::Pooler)
        .labels(2)
        .build()
        .expect("a valid config");
    cfg.veil.blocks = vec![BlockVariant::friendly()];
    let t = random_transformer_with_std(&cfg, [17; 16], 0.2).expect("a random model");
    let fixed = FixedModel::encode(&t, FixedPoint::default_format()).expect("encodable");
    ServerModel::new(fixed).expect("a server model")
}
