//! The bound-controlling fine-tuning loss of the paper (§3.3, Eq. 1):
//!
//! L = (1 − α1 − α2)·L_task + α1·L_decay + α2·L_bound,
//! L_bound = Σ_i ‖max(|h_i| − B, 0)‖₂ over the hidden states h_i of every encoder block.
//!
//! Why the bound term: private inference encodes reals with f fractional bits in Z_{2^ℓ}, and
//! hidden states that grow block after block overflow the ring. The term only penalises the part
//! of each value *above* B, so states are kept bounded without being pushed towards zero (which
//! would inflate the relative fixed-point error).
//!
//! Conventions fixed here (the paper leaves them open):
//! * L_task is the mean cross-entropy over the batch;
//! * L_decay = ½ Σ ‖W‖² / P over the trainable weight matrices (rank ≥ 2: linear and embedding
//!   tables; biases and LayerNorm γ/β are not decayed, as usual for BERT fine-tuning), P their
//!   number of entries: half the mean squared weight. Why the 1/P: the raw sum grows with the
//!   model (≈ 7,000 for a 2-block MiniLM cut, against ≈ 0.7 for the task loss), so at the paper's
//!   α1 = 0.1 it dominated Adam's update direction and mostly shrank weights. Normalised, α1 means
//!   the same for every model size and the term acts as a mild L2 pull towards zero.
//! * L_bound is computed per example (the paper's "for some sample x") over its non-padding
//!   positions and averaged over the batch.

use candle_core::{DType, Tensor, Var, D};
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Result};

use crate::candle_err;

/// Keeps the gradient of the L2 norm finite at zero: ‖x‖ ≈ sqrt(‖x‖² + ε²) − ε, off by < ε.
const NORM_EPS: f64 = 1e-6;

/// α1, α2 and the bound B of Eq. 1. `bound: None` is B = ∞ (no bound control).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossWeights {
    pub alpha1: f64,
    pub alpha2: f64,
    pub bound: Option<f64>,
}

impl LossWeights {
    /// The paper's weights (α1 = 0.1, α2 = 0.2) with the given bound.
    pub fn paper(bound: Option<f64>) -> Self {
        LossWeights {
            alpha1: 0.1,
            alpha2: 0.2,
            bound,
        }
    }

    /// Plain cross-entropy: no decay, no bound.
    pub fn task_only() -> Self {
        LossWeights {
            alpha1: 0.0,
            alpha2: 0.0,
            bound: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.alpha1 >= 0.0 && self.alpha2 >= 0.0 && self.alpha1 + self.alpha2 < 1.0,
            InvalidArgument,
            "loss weights need α1, α2 ≥ 0 and α1 + α2 < 1 (got {}, {})",
            self.alpha1,
            self.alpha2
        );
        if let Some(b) = self.bound {
            ensure!(
                b.is_finite() && b > 0.0,
                InvalidArgument,
                "bound B must be > 0, got {b}"
            );
        }
        Ok(())
    }
}

/// The total loss (for backpropagation) and its three terms (for logging).
pub struct LossTerms {
    pub total: Tensor,
    pub task: f32,
    pub decay: f32,
    pub bound: f32,
}

/// Mean cross-entropy of `logits` (batch × classes) against `labels` (batch, u32).
pub fn task_loss(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    candle_nn::loss::cross_entropy(logits, labels).map_err(candle_err)
}

/// ½ Σ ‖W‖² / P over the rank ≥ 2 tensors among `params` (P: their number of entries).
pub fn decay_loss(params: &[Var]) -> Result<Tensor> {
    let mut total: Option<Tensor> = None;
    let mut entries = 0usize;
    for p in params.iter().filter(|p| p.rank() >= 2) {
        entries += p.elem_count();
        let sq = p
            .as_tensor()
            .sqr()
            .and_then(|s| s.sum_all())
            .map_err(candle_err)?;
        total = Some(match total {
            None => sq,
            Some(t) => (t + sq).map_err(candle_err)?,
        });
    }
    match total {
        Some(t) => (t * (0.5 / entries as f64)).map_err(candle_err),
        None => Tensor::new(0f32, &candle_core::Device::Cpu).map_err(candle_err),
    }
}

/// Σ_i ‖max(|h_i| − B, 0)‖₂, averaged over the batch. Each `h_i` is batch × seq × hidden;
/// `mask` (batch × seq, 1 = real token, 0 = padding) keeps padding out of the norm.
pub fn bound_loss(hidden_states: &[Tensor], mask: &Tensor, bound: f64) -> Result<Tensor> {
    ensure!(
        !hidden_states.is_empty(),
        InvalidArgument,
        "bound loss needs hidden states"
    );
    let mask = mask
        .to_dtype(DType::F32)
        .and_then(|m| m.unsqueeze(D::Minus1))
        .map_err(candle_err)?;
    let mut total: Option<Tensor> = None;
    for h in hidden_states {
        ensure!(
            h.rank() == 3,
            InvalidArgument,
            "hidden state must be batch × seq × hidden"
        );
        let per_example = (|| {
            let excess = h.abs()?.affine(1.0, -bound)?.relu()?.broadcast_mul(&mask)?;
            let sq = excess.sqr()?.sum((1, 2))?;
            (sq + NORM_EPS * NORM_EPS)?.sqrt()? - NORM_EPS
        })()
        .map_err(candle_err)?;
        total = Some(match total {
            None => per_example,
            Some(t) => (t + per_example).map_err(candle_err)?,
        });
    }
    total.expect("non-empty").mean_all().map_err(candle_err)
}

/// Eq. 1 for one batch. `trainable` are the parameters the decay term applies to.
pub fn combined_loss(
    weights: &LossWeights,
    logits: &Tensor,
    labels: &Tensor,
    hidden_states: &[Tensor],
    mask: &Tensor,
    trainable: &[Var],
) -> Result<LossTerms> {
    weights.validate()?;
    let task = task_loss(logits, labels)?;
    let mut total = (&task * (1.0 - weights.alpha1 - weights.alpha2)).map_err(candle_err)?;
    let scalar = |t: &Tensor| t.to_dtype(DType::F32).and_then(|t| t.to_scalar::<f32>());
    let mut terms = (scalar(&task).map_err(candle_err)?, 0.0, 0.0);
    if weights.alpha1 > 0.0 {
        let decay = decay_loss(trainable)?;
        terms.1 = scalar(&decay).map_err(candle_err)?;
        total = (total + (decay * weights.alpha1).map_err(candle_err)?).map_err(candle_err)?;
    }
    if let (Some(b), true) = (weights.bound, weights.alpha2 > 0.0) {
        let bound = bound_loss(hidden_states, mask, b)?;
        terms.2 = scalar(&bound).map_err(candle_err)?;
        total = (total + (bound * weights.alpha2).map_err(candle_err)?).map_err(candle_err)?;
    }
    Ok(LossTerms {
        total,
        task: terms.0,
        decay: terms.1,
        bound: terms.2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
    }

    fn val(x: &Tensor) -> f32 {
        x.to_scalar::<f32>().unwrap()
    }

    #[test]
    fn cross_entropy_by_hand() {
        // Row 0: logits (0, ln 3) with label 1 → −ln(3/4); row 1: (0, 0) with label 0 → ln 2.
        let logits = t(&[0.0, 3f32.ln(), 0.0, 0.0], &[2, 2]);
        let labels = Tensor::new(&[1u32, 0], &Device::Cpu).unwrap();
        let want = (-(0.75f32).ln() + 2f32.ln()) / 2.0;
        assert!((val(&task_loss(&logits, &labels).unwrap()) - want).abs() < 1e-6);
    }

    #[test]
    fn decay_skips_vectors() {
        let w = Var::from_tensor(&t(&[1.0, 2.0, 3.0, 4.0], &[2, 2])).unwrap();
        let b = Var::from_tensor(&t(&[10.0, 10.0], &[2])).unwrap();
        assert_eq!(val(&decay_loss(&[w, b]).unwrap()), 3.75); // ½ (1+4+9+16) / 4
        assert_eq!(val(&decay_loss(&[]).unwrap()), 0.0);
    }

    #[test]
    fn bound_by_hand() {
        // Two blocks, batch 2, seq 2, hidden 2, B = 1.
        // Example 0 block 0: (3, −0.5 | 0, −5): excess (2, 0 | 0, 4) → ‖·‖ = √20.
        // Example 1 block 0: (1, 1 | 9, 9) but position 1 is padding: excess 0.
        // Block 1 = block 0 scaled by ½: ex 0 (1.5, .25 | 0, 2.5): excess (.5, 0 | 0, 1.5) → √2.5.
        let h0 = t(&[3.0, -0.5, 0.0, -5.0, 1.0, 1.0, 9.0, 9.0], &[2, 2, 2]);
        let h1 = (&h0 * 0.5).unwrap();
        let mask = t(&[1.0, 1.0, 1.0, 0.0], &[2, 2]);
        let got = val(&bound_loss(&[h0, h1], &mask, 1.0).unwrap());
        let want = (20f32.sqrt() + 2.5f32.sqrt() + 0.0) / 2.0;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    }

    #[test]
    fn bound_gradient_is_finite_inside_the_bound() {
        let h = Var::from_tensor(&t(&[0.1, -0.2, 0.3, 0.0], &[1, 2, 2])).unwrap();
        let mask = t(&[1.0, 1.0], &[1, 2]);
        let loss = bound_loss(&[h.as_tensor().clone()], &mask, 1.0).unwrap();
        assert!(val(&loss).abs() < 1e-6);
        let g = loss.backward().unwrap();
        let grad: Vec<f32> = g
            .get(h.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(
            grad.iter().all(|x| x.is_finite() && x.abs() < 1e-6),
            "{grad:?}"
        );
    }

    #[test]
    fn combined_weights_terms() {
        let logits = t(&[0.0, 0.0], &[1, 2]);
        let labels = Tensor::new(&[0u32], &Device::Cpu).unwrap();
        let h = t(&[4.0, 0.0], &[1, 1, 2]);
        let mask = t(&[1.0], &[1, 1]);
        let w = Var::from_tensor(&t(&[2.0, 0.0, 0.0, 0.0], &[2, 2])).unwrap();
        let weights = LossWeights::paper(Some(1.0));
        let terms = combined_loss(
            &weights,
            &logits,
            &labels,
            std::slice::from_ref(&h),
            &mask,
            std::slice::from_ref(&w),
        )
        .unwrap();
        // task ln 2, decay ½·4/4 = 0.5, bound |4 − 1| = 3.
        assert!((terms.task - 2f32.ln()).abs() < 1e-6);
        assert_eq!(terms.decay, 0.5);
        assert!((terms.bound - 3.0).abs() < 1e-5);
        let want = 0.7 * 2f32.ln() + 0.1 * 0.5 + 0.2 * 3.0;
        assert!((val(&terms.total) - want).abs() < 1e-5);
        // B = ∞ drops the bound term but keeps the task weight at 1 − α1 − α2.
        let terms = combined_loss(
            &LossWeights::paper(None),
            &logits,
            &labels,
            &[h],
            &mask,
            &[w],
        )
        .unwrap();
        assert!((val(&terms.total) - (0.7 * 2f32.ln() + 0.1 * 0.5)).abs() < 1e-6);
        assert_eq!(terms.bound, 0.0);
    }

    #[test]
    fn invalid_weights_rejected() {
        assert!(LossWeights {
            alpha1: 0.5,
            alpha2: 0.5,
            bound: None
        }
        .validate()
        .is_err());
        assert!(LossWeights {
            alpha1: -0.1,
            alpha2: 0.0,
            bound: None
        }
        .validate()
        .is_err());
        assert!(LossWeights::paper(Some(0.0)).validate().is_err());
        assert!(LossWeights::paper(Some(f64::NAN)).validate().is_err());
        assert!(LossWeights::paper(Some(16.0)).validate().is_ok());
    }
}
