//! Seeded parameter initialisation. candle cannot seed its CPU generator, and a fine-tuning run
//! must be reproducible from its seed, so new parameters (e.g. a fresh classifier) are drawn here.

use candle_core::{Tensor, Var};
use rand::rngs::StdRng;
use rand::Rng;
use veil_core::Result;

use veil_model::candle_error;

/// Overwrites `var` with N(0, std²) samples (Box–Muller over `rng`).
pub(crate) fn fill_normal(var: &Var, std: f64, rng: &mut StdRng) -> Result<()> {
    let n = var.elem_count();
    let samples: Vec<f32> = (0..n)
        .map(|_| {
            let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.gen();
            (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect();
    let t = Tensor::from_vec(samples, var.shape(), var.device())
        .and_then(|t| t.to_dtype(var.dtype()))
        .map_err(candle_error("initialising weights"))?;
    var.set(&t).map_err(candle_error("initialising weights"))
}

/// Overwrites `var` with zeros.
pub(crate) fn fill_zeros(var: &Var) -> Result<()> {
    var.set(
        &var.zeros_like()
            .map_err(candle_error("initialising weights"))?,
    )
    .map_err(candle_error("initialising weights"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use rand::SeedableRng;

    #[test]
    fn normal_moments_and_reproducibility() {
        let var = Var::zeros((100, 100), DType::F32, &Device::Cpu).unwrap();
        fill_normal(&var, 0.5, &mut StdRng::seed_from_u64(1)).unwrap();
        let v: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32).sqrt();
        assert!(
            mean.abs() < 0.02 && (std - 0.5).abs() < 0.02,
            "{mean} {std}"
        );
        let again = Var::zeros((100, 100), DType::F32, &Device::Cpu).unwrap();
        fill_normal(&again, 0.5, &mut StdRng::seed_from_u64(1)).unwrap();
        assert_eq!(
            again
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            v
        );
        fill_zeros(&again).unwrap();
        assert_eq!(
            again
                .as_tensor()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
}
