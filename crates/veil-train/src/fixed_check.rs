//! Runs a model through veil-model's fixed-point simulator (the integers private inference
//! computes) and summarises, per block, whether anything overflowed the ring and how far the
//! fixed-point hidden states are from the f32 ones. This is the check that bound-controlled
//! fine-tuning did its job.

use candle_core::Device;
use veil_core::{ensure, FixedPoint, Result};
use veil_model::FixedModel;
use veil_model::Transformer;

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
    let fixed = FixedModel::encode(model, fp)?;
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
        let sim = fixed.forward(&e.ids, &e.type_ids)?;
        let batch = veil_model::Batch::single(&e.ids, &e.type_ids, &Device::Cpu)
            .map_err(candle_error("f32 forward pass"))?;
        let float = model
            .forward(&batch)
            .map_err(candle_error("f32 forward pass"))?;
        // Entry 0 of both is the embedding output; blocks follow.
        for (i, summary) in per_block.iter_mut().enumerate() {
            let report = &sim.reports[i + 1];
            summary.max_abs = summary.max_abs.max(report.max_abs_hidden);
            summary.wrapped += report.wrapped;
            summary.out_of_domain += report.out_of_domain;
            let reference: Vec<f32> = float.hidden_states[i + 1]
                .flatten_all()
                .and_then(|t| t.to_vec1())
                .map_err(candle_error("f32 forward pass"))?;
            let simulated = sim.hidden_states[i + 1].decode(fp);
            ensure!(
                reference.len() == simulated.len(),
                Other,
                "simulator and f32 disagree on the shape of block {i}"
            );
            let err = reference
                .iter()
                .zip(&simulated)
                .map(|(&r, &s)| (r as f64 - s).abs())
                .fold(0.0, f64::max);
            summary.max_error = summary.max_error.max(err);
        }
        if let (Some(sim_logits), Some(float_logits)) = (sim.logits_f64(fp), float.logits) {
            let float_logits: Vec<f32> = float_logits
                .flatten_all()
                .and_then(|t| t.to_vec1())
                .map_err(candle_error("f32 forward pass"))?;
            let float_logits: Vec<f64> = float_logits.iter().map(|&x| x as f64).collect();
            agree += (argmax(&sim_logits) == argmax(&float_logits)) as usize;
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
