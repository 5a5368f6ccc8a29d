//! Fixed-point simulator vs the f32 forward pass on every operator variant, plus its overflow
//! reporting.

use candle_core::Device;
use veil_core::FixedPoint;
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{
    Activation, Architecture, AttentionNorm, Batch, BlockVariant, EmbeddingMode, HeadKind,
    LayerNormKind, ModelConfig,
};

/// Every combination of the four per-block choices.
fn all_variants() -> Vec<BlockVariant> {
    let mut out = Vec::new();
    for activation in [Activation::Gelu, Activation::Relu] {
        for attention in [AttentionNorm::Softmax, AttentionNorm::ReluNormalise] {
            for ln1 in [LayerNormKind::Exact, LayerNormKind::Centring] {
                for ln2 in [LayerNormKind::Exact, LayerNormKind::Centring] {
                    out.push(BlockVariant {
                        activation,
                        attention,
                        ln1,
                        ln2,
                    });
                }
            }
        }
    }
    out
}

/// Absolute tolerance on logits of magnitude ~1 (the fixed-point error measured here is
/// ≤ 5e-3; GELU's tanh form vs f32's erf form alone contributes up to ~1e-3 per activation).
const LOGIT_TOLERANCE: f64 = 0.03;

/// A sentence pair of `seq` tokens (type ids 0 then 1; all 0 for MPNet, which has no types).
fn input(seq: usize, seed: u32, arch: Architecture) -> (Vec<u32>, Vec<u32>) {
    let ids = (0..seq as u32)
        .map(|i| (i * 7 + seed * 13 + 3) % 50)
        .collect();
    let pair = arch != Architecture::MpNet;
    let types = (0..seq).map(|i| u32::from(pair && i >= seq / 2)).collect();
    (ids, types)
}

#[test]
fn simulator_agrees_with_f32_for_every_variant_and_architecture() {
    let fp = FixedPoint::default_format();
    let mut worst: f64 = 0.0;
    for arch in [
        Architecture::Bert,
        Architecture::Roberta,
        Architecture::MpNet,
    ] {
        for (k, variant) in all_variants().into_iter().enumerate() {
            let mut cfg = ModelConfig::builder(arch)
                .hidden(32)
                .heads(4)
                .ffn(64)
                .positions(40)
                .labels(3)
                .build()
                .unwrap();
            // Block 0 keeps the original operators so the variant under test sees realistic inputs.
            cfg.veil.blocks[1] = variant;
            if k % 2 == 1 {
                cfg.veil.head = HeadKind::MeanPool;
            }
            if k % 3 == 0 {
                cfg.veil.embedding = EmbeddingMode::Private;
            }
            let model = random_transformer_with_std(&cfg, [k as u8; 16], 0.15).unwrap();
            let fixed = FixedModel::encode(&model, fp).unwrap();
            for seed in 0..2 {
                let (ids, types) = input(9 + 4 * seed as usize, seed, arch);
                let f32_logits: Vec<f32> = model
                    .forward(&Batch::single(&ids, &types, &Device::Cpu).unwrap())
                    .unwrap()
                    .logits
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let sim = fixed.forward(&ids, &types).unwrap();
                let got = sim.logits_f64(fp).unwrap();
                assert!(sim.warnings.is_empty(), "{:?}", sim.warnings);
                assert_eq!(sim.hidden_states.len(), 3);
                let err = f32_logits
                    .iter()
                    .zip(&got)
                    .map(|(&a, &b)| (a as f64 - b).abs())
                    .fold(0.0, f64::max);
                worst = worst.max(err);
                assert!(
                    err <= LOGIT_TOLERANCE,
                    "{arch:?} {variant:?}: logits differ by {err}"
                );
                // The argmax agrees whenever the f32 margin exceeds twice the tolerance.
                let mut sorted: Vec<(usize, f32)> =
                    f32_logits.iter().copied().enumerate().collect();
                sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
                if (sorted[0].1 - sorted[1].1) as f64 > 2.0 * LOGIT_TOLERANCE {
                    let sim_arg = (0..got.len())
                        .max_by(|&a, &b| got[a].total_cmp(&got[b]))
                        .unwrap();
                    assert_eq!(sim_arg, sorted[0].0, "{arch:?} {variant:?}: argmax differs");
                }
            }
        }
    }
    println!("largest f32-vs-fixed logit difference over all variants: {worst:.2e}");
}

#[test]
fn simulator_reports_wrapping_values() {
    // Centring LayerNorms without normalisation and large weights let hidden states grow until
    // products no longer fit 2f + 15 bits: the simulator must say so.
    let fp = FixedPoint::default_format();
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .hidden(32)
        .heads(4)
        .ffn(64)
        .positions(40)
        .head(HeadKind::MeanPool)
        .labels(0)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::friendly(); 2];
    let model = random_transformer_with_std(&cfg, [9; 16], 3.0).unwrap();
    let fixed = FixedModel::encode(&model, fp).unwrap();
    let (ids, types) = input(12, 1, Architecture::Bert);
    let sim = fixed.forward(&ids, &types).unwrap();
    assert!(
        sim.reports.iter().any(|r| r.wrapped > 0),
        "{:?}",
        sim.reports
    );
    assert!(!sim.warnings.is_empty());
    assert!(sim.warnings.iter().any(|w| w.contains("wrapped")));
    assert_eq!(sim.reports[1].accumulator_bound, 16384.0);
    // The blocks are friendly (no GELU, no exact LayerNorm): an out-of-domain count can only be
    // a ReLU-normalise row whose sum left the reciprocal's exact domain.
    assert!(
        sim.reports.iter().any(|r| r.out_of_domain > 0),
        "{:?}",
        sim.reports
    );
}

#[test]
fn simulator_rejects_bad_inputs() {
    let fp = FixedPoint::default_format();
    let cfg = ModelConfig::builder(Architecture::Bert)
        .hidden(32)
        .heads(4)
        .ffn(64)
        .positions(40)
        .build()
        .unwrap();
    let model = random_transformer_with_std(&cfg, [1; 16], 0.1).unwrap();
    let fixed = FixedModel::encode(&model, fp).unwrap();
    assert!(fixed.forward(&[], &[]).is_err());
    assert!(fixed.forward(&[1, 2], &[0]).is_err());
    assert!(
        fixed.forward(&[1, 50], &[0, 0]).is_err(),
        "token id beyond the vocabulary"
    );
    assert!(
        fixed.forward(&[1, 2], &[0, 2]).is_err(),
        "type id beyond the table"
    );
    assert!(
        fixed.forward(&[1; 41], &[0; 41]).is_err(),
        "longer than the position table"
    );
    // A ring too narrow for LayerNorm rows of 512 (ℓ = 32 holds 256): refused, not a panic.
    let wide = ModelConfig::builder(Architecture::Bert)
        .hidden(512)
        .layers(1)
        .heads(4)
        .ffn(64)
        .positions(40)
        .build()
        .unwrap();
    let wide = random_transformer_with_std(&wide, [1; 16], 0.1).unwrap();
    let narrow = FixedPoint::new(32, 8).unwrap();
    let err = FixedModel::encode(&wide, narrow).err().unwrap().to_string();
    assert!(err.contains("hidden size 512"), "{err}");
    assert!(FixedModel::encode(&wide, fp).is_ok());
}
