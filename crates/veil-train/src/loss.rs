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
//!
//! Beyond the paper, an optional distillation term (as MPCFormer does) pulls a substituted
//! model towards the original one, whose outputs say more per example than the labels do:
//! L += W·L_distill, L_distill = KL(p_teacher ‖ p_student) of the class distributions at
//! temperature 1, plus the mean over blocks of the mean squared difference of the hidden
//! states over real tokens. W = 0 (the default) is the paper's loss.

use candle_core::{DType, Tensor, Var, D};
use serde::{Deserialize, Serialize};
use veil_core::{bail, ensure, Result};

use crate::batch::ClassifierOutput;
use veil_model::candle_error;

/// Keeps the gradient of the L2 norm finite at zero: ‖x‖ ≈ sqrt(‖x‖² + ε²) − ε, off by < ε.
const NORM_EPS: f64 = 1e-6;

/// α1, α2 and the bound B of Eq. 1, and the weight W of the distillation term. `bound: None`
/// is B = ∞ (no bound control).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossWeights {
    /// α1, the weight of the decay term.
    pub alpha1: f64,
    /// α2, the weight of the hidden-state bound term.
    pub alpha2: f64,
    /// B, the bound on hidden values (`None`: ∞).
    pub bound: Option<f64>,
    /// W; 0 turns distillation off. Left out of the JSON when 0, so settings saved before it
    /// existed (checkpoints, fingerprints) still compare equal.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub distill: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl LossWeights {
    /// The paper's weights (α1 = 0.1, α2 = 0.2) with the given bound.
    pub fn paper(bound: Option<f64>) -> Self {
        LossWeights {
            alpha1: 0.1,
            alpha2: 0.2,
            bound,
            distill: 0.0,
        }
    }

    /// Plain cross-entropy: no decay, no bound.
    pub fn task_only() -> Self {
        LossWeights {
            alpha1: 0.0,
            alpha2: 0.0,
            bound: None,
            distill: 0.0,
        }
    }

    /// Refuses weights outside the loss's domain (α1, α2 ≥ 0, α1 + α2 < 1, B > 0, W ≥ 0).
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
        ensure!(
            self.distill.is_finite() && self.distill >= 0.0,
            InvalidArgument,
            "distillation weight must be ≥ 0, got {}",
            self.distill
        );
        Ok(())
    }
}

/// The total loss (for backpropagation) and its terms (for logging).
pub(crate) struct LossTerms {
    /// The loss to backpropagate.
    pub(crate) total: Tensor,
    /// The task (cross-entropy) term.
    pub(crate) task: f32,
    /// The weight-decay term.
    pub(crate) decay: f32,
    /// The hidden-state bound term.
    pub(crate) bound: f32,
    /// The distillation term (0 without a teacher).
    pub(crate) distill: f32,
}

/// Mean cross-entropy of `logits` (batch × classes) against `labels` (batch, u32).
pub(crate) fn task_loss(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    candle_nn::loss::cross_entropy(logits, labels).map_err(candle_error("loss"))
}

/// ½ Σ ‖W‖² / P over the rank ≥ 2 tensors among `params` (P: their number of entries).
pub(crate) fn decay_loss(params: &[Var]) -> Result<Tensor> {
    let mut total: Option<Tensor> = None;
    let mut entries = 0usize;
    for p in params.iter().filter(|p| p.rank() >= 2) {
        entries += p.elem_count();
        let sq = p
            .as_tensor()
            .sqr()
            .and_then(|s| s.sum_all())
            .map_err(candle_error("loss"))?;
        total = Some(match total {
            None => sq,
            Some(t) => (t + sq).map_err(candle_error("loss"))?,
        });
    }
    match total {
        Some(t) => (t * (0.5 / entries as f64)).map_err(candle_error("loss")),
        None => Tensor::new(0f32, &candle_core::Device::Cpu).map_err(candle_error("loss")),
    }
}

/// Σ_i ‖max(|h_i| − B, 0)‖₂, averaged over the batch. Each `h_i` is batch × seq × hidden;
/// `mask` (batch × seq, 1 = real token, 0 = padding) keeps padding out of the norm.
pub(crate) fn bound_loss(hidden_states: &[Tensor], mask: &Tensor, bound: f64) -> Result<Tensor> {
    ensure!(
        !hidden_states.is_empty(),
        InvalidArgument,
        "bound loss needs hidden states"
    );
    let mask = mask
        .to_dtype(DType::F32)
        .and_then(|m| m.unsqueeze(D::Minus1))
        .map_err(candle_error("loss"))?;
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
        .map_err(candle_error("loss"))?;
        total = Some(match total {
            None => per_example,
            Some(t) => (t + per_example).map_err(candle_error("loss"))?,
        });
    }
    total
        .expect("non-empty")
        .mean_all()
        .map_err(candle_error("loss"))
}

/// KL(teacher ‖ student) of the distributions softmax(logits) over the last dimension, one value
/// per row; the teacher is detached, so no gradient reaches it.
pub(crate) fn kl_rows(student: &Tensor, teacher: &Tensor) -> candle_core::Result<Tensor> {
    let log_s = candle_nn::ops::log_softmax(student, D::Minus1)?;
    let log_t = candle_nn::ops::log_softmax(&teacher.detach(), D::Minus1)?;
    (log_t.exp()? * (log_t - log_s)?)?.sum(D::Minus1)
}

/// L_distill of the module docs for one batch (`mask` as for [`bound_loss`]). The teacher's
/// outputs are detached here, so no gradient ever reaches the teacher.
pub(crate) fn distill_loss(
    student: &ClassifierOutput,
    teacher: &ClassifierOutput,
    mask: &Tensor,
) -> Result<Tensor> {
    let blocks = student.hidden_states.len();
    ensure!(
        blocks > 0 && blocks == teacher.hidden_states.len(),
        InvalidArgument,
        "distillation needs the hidden states of every block of both models (student {blocks}, \
         teacher {})",
        teacher.hidden_states.len()
    );
    ensure!(
        student.logits.dims() == teacher.logits.dims(),
        InvalidArgument,
        "student logits {:?} and teacher logits {:?} differ in shape",
        student.logits.dims(),
        teacher.logits.dims()
    );
    for (s, t) in student.hidden_states.iter().zip(&teacher.hidden_states) {
        ensure!(
            s.rank() == 3 && s.dims() == t.dims(),
            InvalidArgument,
            "hidden states {:?} and {:?}: need equal batch × seq × hidden",
            s.dims(),
            t.dims()
        );
    }
    (|| {
        let kl = kl_rows(&student.logits, &teacher.logits)?.mean_all()?;
        let mask = mask.to_dtype(DType::F32)?;
        let hidden = student.hidden_states[0].dim(2)?;
        // Real-token entries per block, ≥ 1 for any batch of non-empty examples.
        let entries = (mask.sum_all()? * hidden as f64)?;
        let mask = mask.unsqueeze(D::Minus1)?;
        let mut squares: Option<Tensor> = None;
        for (s, t) in student.hidden_states.iter().zip(&teacher.hidden_states) {
            let sq = (s - t.detach())?.broadcast_mul(&mask)?.sqr()?.sum_all()?;
            squares = Some(match squares {
                None => sq,
                Some(acc) => (acc + sq)?,
            });
        }
        let mse = match squares {
            Some(sq) => (sq / entries)? / blocks as f64,
            None => candle_core::bail!("no hidden states"),
        }?;
        kl + mse
    })()
    .map_err(candle_error("loss"))
}

/// Eq. 1 for one batch, plus the distillation term towards `teacher`'s outputs on the same
/// batch when `weights.distill` > 0. `trainable` are the parameters the decay term applies to.
pub(crate) fn combined_loss(
    weights: &LossWeights,
    out: &ClassifierOutput,
    labels: &Tensor,
    mask: &Tensor,
    trainable: &[Var],
    teacher: Option<&ClassifierOutput>,
) -> Result<LossTerms> {
    weights.validate()?;
    let task = task_loss(&out.logits, labels)?;
    let mut total =
        (&task * (1.0 - weights.alpha1 - weights.alpha2)).map_err(candle_error("loss"))?;
    let scalar = |t: &Tensor| t.to_dtype(DType::F32).and_then(|t| t.to_scalar::<f32>());
    let mut terms = (scalar(&task).map_err(candle_error("loss"))?, 0.0, 0.0, 0.0);
    if weights.alpha1 > 0.0 {
        let decay = decay_loss(trainable)?;
        terms.1 = scalar(&decay).map_err(candle_error("loss"))?;
        total = (total + (decay * weights.alpha1).map_err(candle_error("loss"))?)
            .map_err(candle_error("loss"))?;
    }
    if let (Some(b), true) = (weights.bound, weights.alpha2 > 0.0) {
        let bound = bound_loss(&out.hidden_states, mask, b)?;
        terms.2 = scalar(&bound).map_err(candle_error("loss"))?;
        total = (total + (bound * weights.alpha2).map_err(candle_error("loss"))?)
            .map_err(candle_error("loss"))?;
    }
    if weights.distill > 0.0 {
        let Some(teacher) = teacher else {
            bail!(
                InvalidArgument,
                "the distillation weight is set but there is no teacher model"
            )
        };
        let distill = distill_loss(out, teacher, mask)?;
        terms.3 = scalar(&distill).map_err(candle_error("loss"))?;
        total = (total + (distill * weights.distill).map_err(candle_error("loss"))?)
            .map_err(candle_error("loss"))?;
    }
    Ok(LossTerms {
        total,
        task: terms.0,
        decay: terms.1,
        bound: terms.2,
        distill: terms.3,
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
        let out = ClassifierOutput {
            logits: logits.clone(),
            hidden_states: vec![h],
        };
        let terms = combined_loss(
            &weights,
            &out,
            &labels,
            &mask,
            std::slice::from_ref(&w),
            None,
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
            &out,
            &labels,
            &mask,
            std::slice::from_ref(&w),
            None,
        )
        .unwrap();
        assert!((val(&terms.total) - (0.7 * 2f32.ln() + 0.1 * 0.5)).abs() < 1e-6);
        assert_eq!(terms.bound, 0.0);
        // W adds W · L_distill on top (here KL of (½, ½) against (1/4, 3/4), and ½ (4² + 0²)
        // for the hidden state against zeros); without a teacher it is an error.
        let teacher = ClassifierOutput {
            logits: t(&[0.0, 3f32.ln()], &[1, 2]),
            hidden_states: vec![t(&[0.0, 0.0], &[1, 1, 2])],
        };
        let distilled = LossWeights {
            distill: 0.5,
            ..LossWeights::paper(None)
        };
        let terms = combined_loss(
            &distilled,
            &out,
            &labels,
            &mask,
            std::slice::from_ref(&w),
            Some(&teacher),
        )
        .unwrap();
        let kl = 0.25 * (0.25f32 / 0.5).ln() + 0.75 * (0.75f32 / 0.5).ln();
        assert!(
            (terms.distill - (kl + 8.0)).abs() < 1e-5,
            "{}",
            terms.distill
        );
        let want = 0.7 * 2f32.ln() + 0.1 * 0.5 + 0.5 * (kl + 8.0);
        assert!((val(&terms.total) - want).abs() < 1e-5);
        let Err(err) = combined_loss(&distilled, &out, &labels, &mask, &[w], None) else {
            panic!("distillation without a teacher")
        };
        assert!(err.to_string().contains("teacher"), "{err}");
    }

    #[test]
    fn distill_by_hand_and_no_gradient_to_the_teacher() {
        // Batch 2: example 0 has one real token of two, example 1 two. Hidden 2, two blocks.
        let mask = t(&[1.0, 0.0, 1.0, 1.0], &[2, 2]);
        let student = ClassifierOutput {
            logits: t(&[0.0, 0.0, 1.0, 1.0], &[2, 2]),
            hidden_states: vec![
                t(&[1.0, 2.0, 9.0, 9.0, 0.0, 0.0, 0.0, 1.0], &[2, 2, 2]),
                t(&[0.0; 8], &[2, 2, 2]),
            ],
        };
        let teacher_logits = Var::from_tensor(&t(&[0.0, 3f32.ln(), 1.0, 1.0], &[2, 2])).unwrap();
        let teacher_h = Var::from_tensor(&t(&[0.0; 8], &[2, 2, 2])).unwrap();
        let teacher = ClassifierOutput {
            logits: teacher_logits.as_tensor().clone(),
            hidden_states: vec![teacher_h.as_tensor().clone(), teacher_h.as_tensor().clone()],
        };
        let loss = distill_loss(&student, &teacher, &mask).unwrap();
        // KL: row 0 as above, row 1 equal distributions → 0; mean over rows.
        let kl = (0.25 * (0.5f32).ln() + 0.75 * (1.5f32).ln()) / 2.0;
        // Block 0: real entries (1, 2) and (0, 0), (0, 1) → (1 + 4 + 1) / 6; block 1: 0.
        let mse = (6.0 / 6.0 + 0.0) / 2.0;
        assert!((val(&loss) - (kl + mse)).abs() < 1e-6, "{}", val(&loss));
        let grads = loss.backward().unwrap();
        assert!(grads.get(teacher_logits.as_tensor()).is_none());
        assert!(grads.get(teacher_h.as_tensor()).is_none());
        // Against itself it is zero.
        assert!(val(&distill_loss(&student, &student, &mask).unwrap()).abs() < 1e-7);
        // Mismatched models are an error, not a panic.
        let one_block = ClassifierOutput {
            logits: student.logits.clone(),
            hidden_states: vec![student.hidden_states[0].clone()],
        };
        assert!(distill_loss(&student, &one_block, &mask).is_err());
    }

    #[test]
    fn invalid_weights_rejected() {
        assert!(LossWeights {
            alpha1: 0.5,
            alpha2: 0.5,
            ..LossWeights::task_only()
        }
        .validate()
        .is_err());
        assert!(LossWeights {
            alpha1: -0.1,
            ..LossWeights::task_only()
        }
        .validate()
        .is_err());
        for distill in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(LossWeights {
                distill,
                ..LossWeights::task_only()
            }
            .validate()
            .is_err());
        }
        assert!(LossWeights::paper(Some(0.0)).validate().is_err());
        assert!(LossWeights::paper(Some(f64::NAN)).validate().is_err());
        assert!(LossWeights::paper(Some(16.0)).validate().is_ok());
    }
}
