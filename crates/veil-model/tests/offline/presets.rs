//! The benchmark shapes and the seeded random-weight constructor.

use candle_core::Device;
use veil_model::random::{random_transformer, Preset};
use veil_model::{Architecture, Batch};

#[test]
fn preset_shapes_match_the_paper() {
    let shape = |p: Preset| {
        let c = p.config();
        (
            c.architecture,
            c.num_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_heads,
        )
    };
    assert_eq!(
        shape(Preset::BertTiny),
        (Architecture::Bert, 2, 128, 512, 2)
    );
    assert_eq!(
        shape(Preset::BertMedium),
        (Architecture::Bert, 8, 512, 2048, 8)
    );
    assert_eq!(
        shape(Preset::RobertaBase),
        (Architecture::Roberta, 12, 768, 3072, 12)
    );
}

#[test]
fn random_weights_are_seeded() {
    let cfg = Preset::BertTiny.config();
    let a = random_transformer(&cfg, [1; 16]).unwrap();
    let b = random_transformer(&cfg, [1; 16]).unwrap();
    let c = random_transformer(&cfg, [2; 16]).unwrap();
    let batch = Batch::single(&[101, 2023, 3185, 102], &[0; 4], &Device::Cpu).unwrap();
    let logits = |m: &veil_model::Transformer| -> Vec<f32> {
        m.forward(&batch)
            .unwrap()
            .logits
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    assert_eq!(logits(&a), logits(&b));
    assert_ne!(logits(&a), logits(&c));
    // Every parameter of the 2×128 shape is present: embeddings, 2 blocks of 16, pooler, classifier.
    assert_eq!(a.named.len(), 5 + 2 * 16 + 2 + 2);
    let std = {
        let w = &a
            .named
            .iter()
            .find(|(n, _)| n == "encoder.layer.0.intermediate.dense.weight")
            .unwrap()
            .1;
        let v: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        (v.iter().map(|x| (x * x) as f64).sum::<f64>() / v.len() as f64).sqrt()
    };
    assert!((std - 0.02).abs() < 0.001, "weight std {std}");
}
