//! What `veil eval` and `veil embed` share when they set one model's f32 run, its fixed-point
//! simulation and its private run (`veil_private::InProcess`) side by side: the f32 output in
//! f64 and the largest difference between two outputs.

use veil_core::Result;
use veil_model::Model;

/// The f32 model's logits (or pooled vector when it has no classifier), widened to f64 so it
/// compares with the decoded fixed-point outputs.
pub fn f32_output(model: &Model, ids: &[u32], type_ids: &[u32]) -> Result<Vec<f64>> {
    Ok(model
        .transformer
        .output_f32(ids, type_ids)
        .map_err(veil_model::candle_error("f32 forward pass"))?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The largest |a_i − b_i|.
pub fn max_abs_difference(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_difference() {
        assert_eq!(max_abs_difference(&[1.0, -2.0], &[1.5, 1.0]), 3.0);
        assert_eq!(max_abs_difference(&[], &[]), 0.0);
    }
}
