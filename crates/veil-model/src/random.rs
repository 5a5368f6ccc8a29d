//! Seeded random weights for the model shapes of the paper's cost tables.
//!
//! Private-inference cost depends on shapes, not on weight values, so BERT-Tiny, BERT-Medium
//! and RoBERTa-Base (no public weights reachable here) are benchmarked with random weights.
//! Values are N(0, 0.02²) as HF's `initializer_range`, LayerNorm γ = 1, drawn from the AES-CTR
//! [`Prg`] in construction order, so a seed fixes the model on every machine.

use crate::candle_error;
use crate::config::{Architecture, ModelConfig};
use crate::nn::Transformer;
use crate::variants::HeadKind;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use std::sync::Mutex;
use veil_core::{Prg, Result, Seed};

/// Standard deviation of the random weights.
pub const INIT_STD: f64 = 0.02;

/// The benchmark shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// 2 layers × 128, FFN 512, 2 heads.
    BertTiny,
    /// 8 layers × 512, FFN 2048, 8 heads.
    BertMedium,
    /// 12 layers × 768, FFN 3072, 12 heads, RoBERTa vocabulary and positions.
    RobertaBase,
}

impl Preset {
    /// Every preset, for listings and benchmarks.
    pub const ALL: [Preset; 3] = [Preset::BertTiny, Preset::BertMedium, Preset::RobertaBase];

    /// The preset's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::BertTiny => "bert-tiny",
            Preset::BertMedium => "bert-medium",
            Preset::RobertaBase => "roberta-base",
        }
    }

    /// The GELU bound (`FixedModel::activation_bits`) of a pretrained model of this class, so
    /// that a benchmark on random weights (whose bound is narrower: 16–18 bits) pays a real
    /// model's comparisons: all-mpnet-base-v2 (Base shape) proves 21 bits, all-MiniLM-L6-v2
    /// (the only real small BERT reachable here) 20, at the default format.
    pub fn pretrained_activation_bits(self) -> u32 {
        match self {
            Preset::BertTiny | Preset::BertMedium => 20,
            Preset::RobertaBase => 21,
        }
    }

    /// The shape as a config with the original operators and a 2-label pooler classifier.
    pub fn config(self) -> ModelConfig {
        let (arch, vocab, layers, hidden, heads, ffn, positions) = match self {
            Preset::BertTiny => (Architecture::Bert, 30522, 2, 128, 2, 512, 512),
            Preset::BertMedium => (Architecture::Bert, 30522, 8, 512, 8, 2048, 512),
            Preset::RobertaBase => (Architecture::Roberta, 50265, 12, 768, 12, 3072, 514),
        };
        let mut cfg = ModelConfig::builder(arch)
            .vocab(vocab)
            .hidden(hidden)
            .layers(layers)
            .heads(heads)
            .ffn(ffn)
            .positions(positions)
            .head(HeadKind::Pooler)
            .labels(2)
            .build()
            .expect("preset shapes are valid");
        if arch == Architecture::Roberta {
            cfg.type_vocab_size = 1;
            cfg.layer_norm_eps = 1e-5;
        }
        cfg
    }
}

/// A model of shape `config` with N(0, [`INIT_STD`]²) weights drawn from `seed`.
pub fn random_transformer(config: &ModelConfig, seed: [u8; 16]) -> Result<Transformer> {
    random_transformer_with_std(config, seed, INIT_STD)
}

/// As [`random_transformer`] with another standard deviation (tests use larger weights so that
/// tiny models produce non-trivial attention and logits).
pub fn random_transformer_with_std(
    config: &ModelConfig,
    seed: [u8; 16],
    std: f64,
) -> Result<Transformer> {
    let backend = SeededWeights {
        prg: Mutex::new(Prg::from_seed(&Seed(seed))),
        std,
    };
    let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, Device::Cpu);
    Transformer::new(config, vb).map_err(candle_error("building a random model"))
}

/// The vocabulary of [`write_tiny_classifier`]: BERT's special tokens and six words.
pub const TINY_WORDS: [&str; 11] = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "great", "bad", "awful", "the", "film",
];

/// Writes a tiny random BERT classifier into `dir`: `blocks` blocks of width 16, 2 heads, 16
/// positions, the [`TINY_WORDS`] vocabulary (`vocab.txt`), `labels` outputs, weights of
/// standard deviation 0.2 from `seed`, and faithful truncation (so that a private pass equals
/// the simulator bit for bit). For tests and examples of the whole client-server path.
pub fn write_tiny_classifier(
    dir: &std::path::Path,
    blocks: usize,
    labels: usize,
    seed: u8,
) -> Result<()> {
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .vocab(TINY_WORDS.len())
        .layers(blocks)
        .labels(labels)
        .build()?;
    cfg.veil.product_truncation = crate::variants::ProductTruncation::Faithful;
    let t = random_transformer_with_std(&cfg, [seed; 16], 0.2)?;
    crate::folder::save(dir, &t, None)?;
    std::fs::write(dir.join("vocab.txt"), TINY_WORDS.join("\n"))?;
    Ok(())
}

/// Hands out fresh seeded tensors for every requested name.
struct SeededWeights {
    prg: Mutex<Prg>,
    std: f64,
}

impl SimpleBackend for SeededWeights {
    fn get(
        &self,
        s: Shape,
        _name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let n = s.elem_count();
        let values: Vec<f32> = match h {
            Init::Const(c) => vec![c as f32; n],
            _ => {
                let mut prg = self.prg.lock().expect("prg lock");
                (0..n)
                    .map(|_| (gaussian(&mut prg) * self.std) as f32)
                    .collect()
            }
        };
        Tensor::from_vec(values, s, dev)?.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("random weights need a shape for {name}")
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        true
    }
}

/// A standard normal sample (Box–Muller on two 53-bit uniforms).
pub(crate) fn gaussian(prg: &mut Prg) -> f64 {
    let unit = |x: u64| ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (u, v) = (unit(prg.u64()), unit(prg.u64()));
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}
