//! Seeded random decoders of real models' shapes, built in memory, for cost benchmarks: the cost
//! of private generation depends on the shapes, never on the weights' values.

use veil_core::{Prg, Result, Seed};

use super::config::{DecoderConfig, DecoderFamily};
use super::weights::{DecoderBlock, DecoderWeights, Linear, Matrix, Mlp, Norm};

/// The decoder shapes `veil bench generate` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderShape {
    /// SmolLM2-135M: 30 Llama blocks of width 576, 9 query and 3 key/value heads of 64, gated
    /// MLP 1,536, vocabulary 49,152, tied head.
    SmolLm2,
    /// GPT-2 small: 12 blocks of width 768, 12 heads of 64, MLP 3,072, vocabulary 50,257,
    /// 1,024 learned positions, tied head.
    Gpt2,
}

impl DecoderShape {
    /// As `--shape` names it.
    pub fn name(self) -> &'static str {
        match self {
            DecoderShape::SmolLm2 => "smollm2",
            DecoderShape::Gpt2 => "gpt2",
        }
    }

    /// The activation bound (`FixedDecoder::activation_bits`) of the pretrained model of this
    /// shape that Veil ships, which a benchmark on random weights widens its own to: SmolLM2's
    /// 21 bits (|gate| < 256; checked against the real weights by a resources test). GPT-2's
    /// weights are not shipped: None, its random weights' own bound.
    pub fn pretrained_activation_bits(self) -> Option<u32> {
        match self {
            DecoderShape::SmolLm2 => Some(21),
            DecoderShape::Gpt2 => None,
        }
    }

    /// The shape `name` names.
    pub fn from_name(name: &str) -> Option<Self> {
        [DecoderShape::SmolLm2, DecoderShape::Gpt2]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// The model's configuration (as its Hugging Face `config.json` gives it).
    pub fn config(self) -> DecoderConfig {
        match self {
            DecoderShape::SmolLm2 => DecoderConfig {
                family: DecoderFamily::Llama,
                vocab_size: 49_152,
                hidden: 576,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                intermediate: 1_536,
                norm_eps: 1e-5,
                rope_theta: 100_000.0,
                rope_scaling: None,
                max_positions: 8_192,
                attention_bias: false,
                mlp_bias: false,
                tie_word_embeddings: true,
                bos_token_id: Some(1),
                eos_token_ids: vec![2],
                variants: Vec::new(),
            },
            DecoderShape::Gpt2 => DecoderConfig {
                family: DecoderFamily::Gpt2,
                vocab_size: 50_257,
                hidden: 768,
                layers: 12,
                heads: 12,
                kv_heads: 12,
                head_dim: 64,
                intermediate: 3_072,
                norm_eps: 1e-5,
                rope_theta: 0.0,
                rope_scaling: None,
                max_positions: 1_024,
                attention_bias: true,
                mlp_bias: true,
                tie_word_embeddings: true,
                bos_token_id: None,
                eos_token_ids: vec![50_256],
                variants: Vec::new(),
            },
        }
    }

    /// Weights of this shape drawn uniformly from ±0.02·√3 (standard deviation 0.02, like a
    /// fresh model's; uniform because it is cheap to draw 135 M of them), norms' γ = 1, β and
    /// biases 0, from `seed`.
    pub fn random_weights(self, seed: u8) -> Result<DecoderWeights> {
        let c = self.config();
        let mut prg = Prg::from_seed(&Seed([seed; 16]));
        let mut matrix = |rows: usize, cols: usize| {
            let half_width = 0.02 * 3f64.sqrt() / (1u64 << 63) as f64;
            let data = (0..rows * cols)
                .map(|_| (prg.u64() as i64 as f64 * half_width) as f32)
                .collect();
            Matrix::new(rows, cols, data)
        };
        let norm = |width: usize, bias: bool| Norm {
            weight: vec![1.0; width],
            bias: bias.then(|| vec![0.0; width]),
        };
        let gpt2 = c.family == DecoderFamily::Gpt2;
        let linear = |weight: Matrix, bias: bool| Linear {
            bias: bias.then(|| vec![0.0; weight.rows]),
            weight,
        };
        let (q_out, kv_out) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let token_embedding = matrix(c.vocab_size, c.hidden)?;
        let position_embedding = if gpt2 {
            Some(matrix(c.max_positions, c.hidden)?)
        } else {
            None
        };
        let mut blocks = Vec::with_capacity(c.layers);
        for _ in 0..c.layers {
            let (ab, mb) = (c.attention_bias, c.mlp_bias);
            let q = linear(matrix(q_out, c.hidden)?, ab);
            let k = linear(matrix(kv_out, c.hidden)?, ab);
            let v = linear(matrix(kv_out, c.hidden)?, ab);
            let o = linear(matrix(c.hidden, q_out)?, ab);
            let mlp = if gpt2 {
                Mlp::Plain {
                    up: linear(matrix(c.intermediate, c.hidden)?, mb),
                    down: linear(matrix(c.hidden, c.intermediate)?, mb),
                }
            } else {
                Mlp::Gated {
                    gate: linear(matrix(c.intermediate, c.hidden)?, mb),
                    up: linear(matrix(c.intermediate, c.hidden)?, mb),
                    down: linear(matrix(c.hidden, c.intermediate)?, mb),
                }
            };
            blocks.push(DecoderBlock {
                attn_norm: norm(c.hidden, gpt2),
                q,
                k,
                v,
                o,
                mlp_norm: norm(c.hidden, gpt2),
                mlp,
            });
        }
        let w = DecoderWeights {
            final_norm: norm(c.hidden, gpt2),
            config: c,
            token_embedding,
            position_embedding,
            blocks,
            lm_head: None,
        };
        w.validate(self.name())?;
        Ok(w)
    }
}
