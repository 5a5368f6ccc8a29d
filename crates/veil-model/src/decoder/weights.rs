//! A decoder's weights as plain f32 arrays, in Hugging Face layout whatever the source file.

use veil_core::{Error, Result};

use super::config::{DecoderConfig, DecoderFamily};

/// Row-major f32 matrix; linear weights are `[out, in]` (HF `nn.Linear` order; GPT-2's Conv1D
/// is transposed at load).
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Rows (outputs, for a linear weight).
    pub rows: usize,
    /// Columns (inputs, for a linear weight).
    pub cols: usize,
    /// `rows × cols` values, row by row.
    pub data: Vec<f32>,
}

impl Matrix {
    /// Checks that `data` holds `rows × cols` values.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(Error::InvalidArgument(format!(
                "matrix {rows}x{cols} given {} values",
                data.len()
            )));
        }
        Ok(Matrix { rows, cols, data })
    }

    /// Row `r` (panics when out of range, like slice indexing).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// `y = W x + b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    /// W `[out, in]`.
    pub weight: Matrix,
    /// b `[out]`, when the layer has one.
    pub bias: Option<Vec<f32>>,
}

/// RMSNorm: bias `None`. LayerNorm (GPT-2): bias `Some`.
#[derive(Clone, Debug, PartialEq)]
pub struct Norm {
    /// γ.
    pub weight: Vec<f32>,
    /// β (LayerNorm only).
    pub bias: Option<Vec<f32>>,
}

/// Gated (Llama): `down(silu(gate·x) ⊙ up·x)`. Plain (GPT-2): `down(gelu_tanh(up·x))`.
#[derive(Clone, Debug, PartialEq)]
pub enum Mlp {
    /// The Llama family's SwiGLU.
    Gated {
        /// The projection SiLU applies to.
        gate: Linear,
        /// The projection the gate multiplies.
        up: Linear,
        /// Back to the residual width.
        down: Linear,
    },
    /// GPT-2's two layers with GELU-tanh between.
    Plain {
        /// To the MLP width.
        up: Linear,
        /// Back to the residual width.
        down: Linear,
    },
}

/// One pre-norm block. q/k rows are in the Hugging Face rotary order (rotate_half: first and
/// second half of each head); llama.cpp's GGUF permutation is undone at load. GPT-2's fused
/// `c_attn` is split into q, k, v.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderBlock {
    /// The norm before attention.
    pub attn_norm: Norm,
    /// Q projection.
    pub q: Linear,
    /// K projection (`kv_heads` heads).
    pub k: Linear,
    /// V projection (`kv_heads` heads).
    pub v: Linear,
    /// The attention output projection.
    pub o: Linear,
    /// The norm before the MLP.
    pub mlp_norm: Norm,
    /// The MLP.
    pub mlp: Mlp,
}

/// A whole decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderWeights {
    /// The shape and family.
    pub config: DecoderConfig,
    /// `[vocab, hidden]`.
    pub token_embedding: Matrix,
    /// GPT-2: `[max_positions, hidden]`.
    pub position_embedding: Option<Matrix>,
    /// The blocks in order.
    pub blocks: Vec<DecoderBlock>,
    /// The norm before the LM head.
    pub final_norm: Norm,
    /// `[vocab, hidden]`; `None`: tied to `token_embedding`.
    pub lm_head: Option<Matrix>,
}

impl DecoderWeights {
    /// The output projection, `[vocab, hidden]`.
    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.token_embedding)
    }

    /// Checks every shape against the config (and the config itself), naming `source` and the
    /// tensor at fault: loaders call it once so the composition may index freely.
    pub fn validate(&self, source: &str) -> Result<()> {
        let c = &self.config;
        c.validate(source)?;
        let (h, q_out, kv_out) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let bad = |what: String| Err(Error::Malformed(format!("{source}: {what}")));
        let matrix = |name: &str, m: &Matrix, rows: usize, cols: usize| -> Result<()> {
            if (m.rows, m.cols) != (rows, cols) || m.data.len() != rows * cols {
                return bad(format!(
                    "{name} is {}x{} ({} values), expected {rows}x{cols}",
                    m.rows,
                    m.cols,
                    m.data.len()
                ));
            }
            Ok(())
        };
        let vector = |name: &str, v: &[f32], len: usize| -> Result<()> {
            if v.len() != len {
                return bad(format!("{name} has {} values, expected {len}", v.len()));
            }
            Ok(())
        };
        let linear = |name: &str, l: &Linear, out: usize, inp: usize, bias: bool| -> Result<()> {
            matrix(name, &l.weight, out, inp)?;
            match (&l.bias, bias) {
                (Some(b), true) => vector(&format!("{name} bias"), b, out),
                (None, false) => Ok(()),
                (Some(_), false) => bad(format!("{name} has a bias the config does not declare")),
                (None, true) => bad(format!("{name} lacks the bias the config declares")),
            }
        };
        let layer_norm = c.family == DecoderFamily::Gpt2;
        let norm = |name: &str, n: &Norm| -> Result<()> {
            vector(name, &n.weight, h)?;
            match (&n.bias, layer_norm) {
                (Some(b), true) => vector(&format!("{name} bias"), b, h),
                (None, false) => Ok(()),
                (Some(_), false) => bad(format!("{name} has a bias but RMSNorm has none")),
                (None, true) => bad(format!("{name} lacks its LayerNorm bias")),
            }
        };
        matrix("token embedding", &self.token_embedding, c.vocab_size, h)?;
        match (&self.position_embedding, c.family) {
            (Some(p), DecoderFamily::Gpt2) => matrix("position embedding", p, c.max_positions, h)?,
            (None, DecoderFamily::Llama) => {}
            (Some(_), DecoderFamily::Llama) => {
                return bad("a rotary model has a position table".into())
            }
            (None, DecoderFamily::Gpt2) => return bad("the position table is missing".into()),
        }
        if self.blocks.len() != c.layers {
            return bad(format!(
                "{} blocks, the config says {}",
                self.blocks.len(),
                c.layers
            ));
        }
        for (i, b) in self.blocks.iter().enumerate() {
            let n = |part: &str| format!("block {i} {part}");
            norm(&n("attention norm"), &b.attn_norm)?;
            linear(&n("q"), &b.q, q_out, h, c.attention_bias)?;
            linear(&n("k"), &b.k, kv_out, h, c.attention_bias)?;
            linear(&n("v"), &b.v, kv_out, h, c.attention_bias)?;
            // HF Llama puts the attention bias on q/k/v and o alike; Qwen2 on q/k/v only.
            matrix(&n("o"), &b.o.weight, h, q_out)?;
            if let Some(bias) = &b.o.bias {
                vector(&n("o bias"), bias, h)?;
            }
            norm(&n("MLP norm"), &b.mlp_norm)?;
            match (&b.mlp, c.family) {
                (Mlp::Gated { gate, up, down }, DecoderFamily::Llama) => {
                    linear(&n("gate"), gate, c.intermediate, h, c.mlp_bias)?;
                    linear(&n("up"), up, c.intermediate, h, c.mlp_bias)?;
                    linear(&n("down"), down, h, c.intermediate, c.mlp_bias)?;
                }
                (Mlp::Plain { up, down }, DecoderFamily::Gpt2) => {
                    linear(&n("up"), up, c.intermediate, h, c.mlp_bias)?;
                    linear(&n("down"), down, h, c.intermediate, c.mlp_bias)?;
                }
                _ => return bad(n("MLP kind does not match the family")),
            }
        }
        norm("final norm", &self.final_norm)?;
        match (&self.lm_head, c.tie_word_embeddings) {
            (Some(m), false) => matrix("lm head", m, c.vocab_size, h)?,
            (None, true) => {}
            (Some(_), true) => return bad("tied embeddings but a separate lm head".into()),
            (None, false) => return bad("the lm head is missing (embeddings not tied)".into()),
        }
        Ok(())
    }
}
