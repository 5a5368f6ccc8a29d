//! A tiny candle classifier and a synthetic task, for testing the trainer without a BERT:
//! embeddings → two residual ReLU blocks (whose outputs are the "hidden states") → mean pool →
//! linear head. Label = whether token 3 occurs in the sequence.

use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{Embedding, Linear, Module, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};

use crate::batch::{Batch, ClassifierOutput, EncodedExample, SequenceClassifier};

pub const VOCAB: usize = 12;

pub struct TinyClassifier {
    pub varmap: VarMap,
    embed: Embedding,
    blocks: Vec<Linear>,
    head: Linear,
}

impl TinyClassifier {
    pub fn new(hidden: usize, seed: u64) -> Self {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let embed = candle_nn::embedding(VOCAB, hidden, vb.pp("embed")).unwrap();
        let blocks = (0..2)
            .map(|i| candle_nn::linear(hidden, hidden, vb.pp(format!("block.{i}"))).unwrap())
            .collect();
        let head = candle_nn::linear(hidden, 2, vb.pp("head")).unwrap();
        let model = TinyClassifier {
            varmap,
            embed,
            blocks,
            head,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for (_, v) in model.named_vars() {
            crate::init::fill_normal(&v, 0.3, &mut rng).unwrap();
        }
        model
    }

    /// All parameters, sorted by name so runs are reproducible.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let mut v: Vec<(String, Var)> = self
            .varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn snapshot(&self) -> Vec<(String, Vec<f32>)> {
        self.named_vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()))
            .collect()
    }
}

impl SequenceClassifier for TinyClassifier {
    fn forward(&self, batch: &Batch) -> candle_core::Result<ClassifierOutput> {
        let mut h = self.embed.forward(&batch.input_ids)?;
        let mut hidden_states = Vec::new();
        for block in &self.blocks {
            h = (block.forward(&h)?.relu()? + &h)?;
            hidden_states.push(h.clone());
        }
        let mask = batch.attention_mask.unsqueeze(D::Minus1)?;
        let pooled = h
            .broadcast_mul(&mask)?
            .sum(1)?
            .broadcast_div(&mask.sum(1)?)?;
        Ok(ClassifierOutput {
            logits: self.head.forward(&pooled)?,
            hidden_states,
        })
    }
}

/// `n` random sequences of length 2..8 over tokens 1..VOCAB; label 1 iff token 3 occurs.
pub fn synthetic_task(n: usize, seed: u64) -> Vec<EncodedExample> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = rng.gen_range(2..8);
            let ids: Vec<u32> = (0..len).map(|_| rng.gen_range(1..VOCAB as u32)).collect();
            let label = ids.contains(&3) as u32;
            EncodedExample {
                type_ids: vec![0; ids.len()],
                ids,
                label,
            }
        })
        .collect()
}

/// Scales every parameter so the hidden states start large (for bound-control tests).
pub fn inflate(model: &TinyClassifier, factor: f64) {
    for (_, v) in model.named_vars() {
        let t: Tensor = (v.as_tensor() * factor).unwrap();
        v.set(&t).unwrap();
    }
}
