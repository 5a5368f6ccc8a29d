//! The f32 modules work for training: built from a `VarMap`, every parameter gets a gradient
//! for every operator variant, and an SGD step lowers the loss; the trained model saves and
//! loads back.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
use veil_model::{folder, Architecture, Batch, BlockVariant, ModelConfig, Transformer};

#[test]
fn varmap_backed_model_trains_and_saves() {
    for arch in [Architecture::Bert, Architecture::MpNet] {
        let mut cfg = ModelConfig::builder(arch)
            .vocab(30)
            .positions(20)
            .build()
            .unwrap();
        cfg.veil.blocks[1] = BlockVariant::friendly();
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = Transformer::new(&cfg, vb).unwrap();
        assert_eq!(model.named.len(), varmap.all_vars().len());
        let batch = Batch::single(&[2, 7, 9, 4, 3], &[0, 0, 0, 0, 0], &Device::Cpu).unwrap();
        let target = Tensor::new(&[1u32], &Device::Cpu).unwrap();
        let loss_of = |m: &Transformer| {
            let logits = m.forward(&batch).unwrap().logits.unwrap();
            candle_nn::loss::cross_entropy(&logits, &target).unwrap()
        };
        let loss = loss_of(&model);
        let grads = loss.backward().unwrap();
        for (name, t) in &model.named {
            assert!(grads.get(t).is_some(), "{arch:?}: no gradient for {name}");
        }
        let mut sgd = SGD::new(varmap.all_vars(), 0.1).unwrap();
        let before: f32 = loss.to_scalar().unwrap();
        for _ in 0..5 {
            sgd.backward_step(&loss_of(&model)).unwrap();
        }
        let after: f32 = loss_of(&model).to_scalar().unwrap();
        assert!(after < before, "{arch:?}: loss {before} -> {after}");
        // The recorded tensors share storage with the variables, so saving writes the trained
        // weights.
        let dir =
            std::env::temp_dir().join(format!("veil-model-train-{}-{arch:?}", std::process::id()));
        folder::save(&dir, &model, None).unwrap();
        let back = folder::load(&dir).unwrap();
        let again: f32 = loss_of(&back.transformer).to_scalar().unwrap();
        assert!(
            (again - after).abs() < 1e-6,
            "{arch:?}: saved model gives loss {again}, trained {after}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
