//! Runs a model through veil-model's fixed-point simulator (the integers private inference
//! computes) and summarises, per block, whether anything overflowed the ring and how far the
//! fixed-point hidden states are from the f32 ones. This is the check that bound-controlled
//! fine-tuning did its job. [`FixedVsF32`] is the one side-by-side run of the two, which
//! `veil eval` and `veil embed` use as well.

use veil_core::{ensure, FixedPoint, Result};
use veil_model::{FixedModel, ForwardOutput, SimOutput, Transformer};

use crate::batch::EncodedExample;
use crate::report::{BlockFixedPoint, FixedPointCheck};
use veil_model::candle_error;

fn argmax(v: &[f64]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0
}

/// The largest |a_i − b_i| (0 for empty slices).
pub fn max_abs_difference(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()))
}

/// A model's f32 forward pass beside its fixed-point simulation (the integers private inference
/// computes), the simulator's encoding made once: the one comparison of the two that
/// [`check_fixed_point`], `veil eval` and `veil embed` run on each example.
pub struct FixedVsF32<'m> {
    model: &'m Transformer,
    fixed: FixedModel,
    fp: FixedPoint,
}

/// One unpadded example run both ways.
pub struct SideBySide {
    /// The f32 forward pass (a batch of one).
    pub f32: ForwardOutput,
    /// The simulator's run, with its per-block reports and domain warnings.
    pub sim: SimOutput,
    fp: FixedPoint,
}

impl<'m> FixedVsF32<'m> {
    /// `model` in f32 and encoded at format `fp`.
    pub fn new(model: &'m Transformer, fp: FixedPoint) -> Result<Self> {
        Ok(FixedVsF32 {
            model,
            fixed: FixedModel::encode(model, fp)?,
            fp,
        })
    }

    /// Runs `ids` (segment ids `type_ids`, unpadded) through both.
    pub fn run(&self, ids: &[u32], type_ids: &[u32]) -> Result<SideBySide> {
        let sim = self.fixed.forward(ids, type_ids)?;
        let batch = veil_model::Batch::single(ids, type_ids, self.model.device())
            .map_err(candle_error("f32 forward pass"))?;
        let f32 = self
            .model
            .forward(&batch)
            .map_err(candle_error("f32 forward pass"))?;
        Ok(SideBySide {
            f32,
            sim,
            fp: self.fp,
        })
    }
}

impl SideBySide {
    /// What the private pass reveals, in f32 widened to f64 so it compares with decoded
    /// fixed-point outputs: the logits of a classifier, otherwise the pooled vector.
    pub fn f32_output(&self) -> Result<Vec<f64>> {
        let out = self.f32.logits.as_ref().unwrap_or(&self.f32.pooled);
        let v: Vec<f32> = out
            .flatten_all()
            .and_then(|t| t.to_vec1())
            .map_err(candle_error("f32 forward pass"))?;
        Ok(v.into_iter().map(f64::from).collect())
    }

    /// The simulator's logits, decoded (`None` without a classifier).
    pub fn fixed_logits(&self) -> Option<Vec<f64>> {
        self.sim.logits_f64(self.fp)
    }

    /// The simulator's output as [`Self::f32_output`] picks it: logits, otherwise the pooled
    /// vector, decoded.
    pub fn fixed_output(&self) -> Vec<f64> {
        self.fixed_logits()
            .unwrap_or_else(|| self.sim.pooled.decode(self.fp))
    }

    /// The largest |f32 − fixed| over hidden state `k` (0: the embedding output, k: block
    /// k − 1's output).
    pub fn hidden_error(&self, k: usize) -> Result<f64> {
        let reference: Vec<f64> = self.f32.hidden_states[k]
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(candle_error("f32 forward pass"))?
            .into_iter()
            .map(f64::from)
            .collect();
        let simulated = self.sim.hidden_states[k].decode(self.fp);
        ensure!(
            reference.len() == simulated.len(),
            Other,
            "simulator and f32 disagree on the shape of hidden state {k}"
        );
        Ok(max_abs_difference(&reference, &simulated))
    }
}

/// Simulates `examples` (each unpadded) at format `fp` and compares with the f32 forward pass.
pub fn check_fixed_point(
    model: &Transformer,
    examples: &[EncodedExample],
    fp: FixedPoint,
) -> Result<FixedPointCheck> {
    ensure!(
        !examples.is_empty(),
        InvalidArgument,
        "no examples to simulate"
    );
    let compare = FixedVsF32::new(model, fp)?;
    let n = model.blocks.len();
    let mut per_block: Vec<BlockFixedPoint> = (0..n)
        .map(|block| BlockFixedPoint {
            block,
            max_abs: 0.0,
            max_error: 0.0,
            wrapped: 0,
            out_of_domain: 0,
        })
        .collect();
    let mut agree = 0usize;
    for e in examples {
        let side = compare.run(&e.ids, &e.type_ids)?;
        // Entry 0 of both is the embedding output; blocks follow.
        for (i, summary) in per_block.iter_mut().enumerate() {
            let report = &side.sim.reports[i + 1];
            summary.max_abs = summary.max_abs.max(report.max_abs_hidden);
            summary.wrapped += report.wrapped;
            summary.out_of_domain += report.out_of_domain;
            summary.max_error = summary.max_error.max(side.hidden_error(i + 1)?);
        }
        if let (Some(sim_logits), true) = (side.fixed_logits(), side.f32.logits.is_some()) {
            agree += (argmax(&sim_logits) == argmax(&side.f32_output()?)) as usize;
        }
    }
    Ok(FixedPointCheck {
        ring_bits: fp.ring.bits(),
        frac_bits: fp.frac_bits(),
        examples: examples.len(),
        prediction_agreement: agree as f64 / examples.len() as f64,
        per_block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_difference() {
        assert_eq!(max_abs_difference(&[1.0, -2.0], &[1.5, 1.0]), 3.0);
        assert_eq!(max_abs_difference(&[], &[]), 0.0);
    }

    /// On a tiny random classifier: the f32 side is what `Transformer::output_f32` returns, the
    /// fixed side decodes the simulator's logits, and the two (and every hidden state) agree
    /// within the fixed-point format's error.
    #[test]
    fn both_sides_of_one_example() {
        let dir = tempfile::tempdir().unwrap();
        veil_model::random::write_tiny_classifier(dir.path(), 2, 2, 7).unwrap();
        let model = veil_model::folder::load(dir.path()).unwrap();
        let fp = FixedPoint::default_format();
        let (ids, types) = ([2, 5, 7, 3], [0; 4]);
        let side = FixedVsF32::new(&model.transformer, fp)
            .unwrap()
            .run(&ids, &types)
            .unwrap();
        let direct = model.transformer.output_f32(&ids, &types).unwrap();
        let f = side.f32_output().unwrap();
        assert_eq!(f, direct.into_iter().map(f64::from).collect::<Vec<_>>());
        let s = side.fixed_output();
        assert_eq!(Some(s.clone()), side.sim.logits_f64(fp));
        assert!(max_abs_difference(&f, &s) < 0.05, "{f:?} {s:?}");
        for k in 0..3 {
            assert!(side.hidden_error(k).unwrap() < 0.05);
        }
    }
}
