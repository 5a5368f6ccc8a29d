//! AdamW with a linear warm-up/decay schedule and global-norm gradient clipping.
//!
//! Written here rather than taken from `candle_nn::AdamW` because a resumable run must save and
//! restore the moment estimates and the step count, which candle's optimiser keeps private.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};

use veil_model::candle_error;

/// AdamW hyper-parameters. `weight_decay` is the *decoupled* decay of AdamW; the paper's decay
/// term lives in the loss ([`crate::loss`]), so it defaults to 0 to avoid decaying twice.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Decay of the first-moment estimate.
    pub beta1: f64,
    /// Decay of the second-moment estimate.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay per update (times the learning rate).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Linear warm-up from 0 to `peak` over `warmup` steps, then linear decay to 0 at `total`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct LinearSchedule {
    /// Largest learning rate.
    pub(crate) peak: f64,
    /// Updates of the warm-up.
    pub(crate) warmup: u64,
    /// Update at which the rate reaches 0.
    pub(crate) total: u64,
}

impl LinearSchedule {
    /// Learning rate for the update with 0-based index `step` (the first update already moves:
    /// with warm-up w it uses peak/w, not 0).
    pub(crate) fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            self.peak * (step + 1) as f64 / self.warmup as f64
        } else if step >= self.total {
            0.0
        } else {
            let remaining = (self.total - step) as f64;
            self.peak * remaining / (self.total - self.warmup).max(1) as f64
        }
    }
}

/// AdamW over a named set of variables, with its state exportable for checkpoints.
pub(crate) struct AdamW {
    config: AdamWConfig,
    params: Vec<(String, Var)>,
    first: Vec<Tensor>,
    second: Vec<Tensor>,
    steps_taken: u64,
}

impl AdamW {
    /// An optimiser of `params` with zero moments.
    pub(crate) fn new(params: Vec<(String, Var)>, config: AdamWConfig) -> Result<Self> {
        let zeros = |v: &Var| v.zeros_like().map_err(candle_error("optimizer step"));
        let first = params
            .iter()
            .map(|(_, v)| zeros(v))
            .collect::<Result<_>>()?;
        let second = params
            .iter()
            .map(|(_, v)| zeros(v))
            .collect::<Result<_>>()?;
        Ok(AdamW {
            config,
            params,
            first,
            second,
            steps_taken: 0,
        })
    }

    /// Updates made so far.
    #[cfg(test)]
    pub(crate) fn steps_taken(&self) -> u64 {
        self.steps_taken
    }

    /// One update with learning rate `lr`. Parameters without a gradient (not reached by the
    /// loss) are left alone.
    pub(crate) fn step(&mut self, grads: &GradStore, lr: f64) -> Result<()> {
        self.steps_taken += 1;
        let c = self.config;
        let t = self.steps_taken as i32;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        for (i, (_, var)) in self.params.iter().enumerate() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            // A parameter's gradient still carries the autograd history of the forward pass it
            // came from (candle detaches only the gradients of intermediate nodes); moments
            // built from it would keep every step's graph alive, ~50–90 MB per MiniLM step.
            let g = g.detach();
            let g = &g;
            let update = (|| {
                let m = ((&self.first[i] * c.beta1)? + (g * (1.0 - c.beta1))?)?;
                let v = ((&self.second[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
                let direction = ((&m / bias1)? / ((&v / bias2)?.sqrt()? + c.eps)?)?;
                let decayed = (var.as_tensor() * (1.0 - lr * c.weight_decay))?;
                let next = (decayed - (direction * lr)?)?;
                var.set(&next)?;
                Ok::<_, candle_core::Error>((m, v))
            })()
            .map_err(candle_error("optimizer step"))?;
            self.first[i] = update.0;
            self.second[i] = update.1;
        }
        Ok(())
    }

    /// Moment estimates keyed `m.<name>` / `v.<name>`, for a checkpoint.
    pub(crate) fn state_tensors(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.insert(format!("m.{name}"), self.first[i].clone());
            out.insert(format!("v.{name}"), self.second[i].clone());
        }
        out
    }

    /// Restores what [`Self::state_tensors`] saved; every parameter must be present with its shape.
    pub(crate) fn load_state(
        &mut self,
        tensors: &HashMap<String, Tensor>,
        steps_taken: u64,
    ) -> Result<()> {
        for (i, (name, var)) in self.params.iter().enumerate() {
            for (prefix, slot) in [("m", &mut self.first[i]), ("v", &mut self.second[i])] {
                let key = format!("{prefix}.{name}");
                let t = tensors.get(&key).ok_or_else(|| {
                    Error::Malformed(format!("optimizer state has no tensor {key:?}"))
                })?;
                ensure!(
                    t.dims() == var.dims(),
                    Malformed,
                    "optimizer state {key:?} has shape {:?}, parameter has {:?}",
                    t.dims(),
                    var.dims()
                );
                *slot = t
                    .to_dtype(var.dtype())
                    .map_err(candle_error("optimizer step"))?;
            }
        }
        self.steps_taken = steps_taken;
        Ok(())
    }
}

/// Scales the gradients of `vars` so their global L2 norm is at most `max_norm`; returns the
/// norm before clipping.
pub(crate) fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    let mut sum_sq = 0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            let s = g
                .sqr()
                .and_then(|s| s.sum_all())
                .and_then(|s| s.to_scalar::<f32>());
            sum_sq += s.map_err(candle_error("optimizer step"))? as f64;
        }
    }
    let norm = sum_sq.sqrt();
    ensure!(
        norm.is_finite(),
        Other,
        "gradient norm is not finite ({norm}): training diverged"
    );
    if norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(
                    v.as_tensor(),
                    (g * scale).map_err(candle_error("optimizer step"))?,
                );
            }
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn schedule_shape() {
        let s = LinearSchedule {
            peak: 1.0,
            warmup: 4,
            total: 12,
        };
        let lrs: Vec<f64> = (0..13).map(|i| s.lr(i)).collect();
        assert_eq!(&lrs[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert_eq!(lrs[4], 1.0);
        assert_eq!(lrs[8], 0.5);
        assert_eq!(lrs[11], 0.125);
        assert_eq!(lrs[12], 0.0);
        let no_warmup = LinearSchedule {
            peak: 2.0,
            warmup: 0,
            total: 2,
        };
        assert_eq!((no_warmup.lr(0), no_warmup.lr(1)), (2.0, 1.0));
    }

    /// Minimises (x − 3)² from x = 0; AdamW's first step moves by exactly lr (m̂/√v̂ = sign g).
    #[test]
    fn adamw_converges_on_a_quadratic() {
        let x = Var::new(&[0f32], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(vec![("x".into(), x.clone())], AdamWConfig::default()).unwrap();
        let loss = |x: &Var| {
            x.as_tensor()
                .affine(1.0, -3.0)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
        };
        opt.step(&loss(&x).unwrap().backward().unwrap(), 0.1)
            .unwrap();
        let after_one: Vec<f32> = x.as_tensor().to_vec1().unwrap();
        assert!((after_one[0] - 0.1).abs() < 1e-5);
        for _ in 0..300 {
            opt.step(&loss(&x).unwrap().backward().unwrap(), 0.05)
                .unwrap();
        }
        let v: Vec<f32> = x.as_tensor().to_vec1().unwrap();
        assert!((v[0] - 3.0).abs() < 0.05, "{v:?}");
    }

    /// The moments must not hold on to the graph the gradient came from: otherwise every step's
    /// forward pass stays alive through them (the run grows by the size of its activations).
    #[test]
    fn moments_do_not_keep_the_autograd_graph() {
        let w = Var::new(&[[0.5f32, -1.0], [2.0, 0.25]], &Device::Cpu).unwrap();
        // An activation computed from another parameter, as every hidden state is.
        let u = Var::new(&[[1f32, 2.0]], &Device::Cpu).unwrap();
        let x = u.as_tensor().affine(2.0, 1.0).unwrap();
        let loss = x
            .matmul(w.as_tensor())
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        assert!(
            grads.get(w.as_tensor()).unwrap().track_op(),
            "candle's parameter gradients carry their graph (if this changes, the detach is moot)"
        );
        let mut opt = AdamW::new(vec![("w".into(), w.clone())], AdamWConfig::default()).unwrap();
        opt.step(&grads, 0.1).unwrap();
        assert!(!opt.first[0].track_op() && !opt.second[0].track_op());
    }

    #[test]
    fn decoupled_weight_decay_is_applied_on_top_of_the_adam_step() {
        // Same start, same gradient: with decay λ the result is lower by exactly lr·λ·x.
        let run = |weight_decay: f64| {
            let x = Var::new(&[2f32], &Device::Cpu).unwrap();
            let cfg = AdamWConfig {
                weight_decay,
                ..Default::default()
            };
            let mut opt = AdamW::new(vec![("x".into(), x.clone())], cfg).unwrap();
            let g = x
                .as_tensor()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            opt.step(&g, 0.1).unwrap();
            x.as_tensor().to_vec1::<f32>().unwrap()[0]
        };
        assert!((run(0.0) - run(0.5) - 0.1 * 0.5 * 2.0).abs() < 1e-6);
    }

    #[test]
    fn state_round_trip_and_validation() {
        let x = Var::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(vec![("x".into(), x.clone())], AdamWConfig::default()).unwrap();
        let g = x
            .as_tensor()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&g, 0.1).unwrap();
        let state = opt.state_tensors();
        let mut fresh = AdamW::new(vec![("x".into(), x.clone())], AdamWConfig::default()).unwrap();
        fresh.load_state(&state, opt.steps_taken()).unwrap();
        assert_eq!(fresh.steps_taken(), 1);
        let m: Vec<f32> = fresh.state_tensors()["m.x"].to_vec1().unwrap();
        assert_eq!(m, state["m.x"].to_vec1::<f32>().unwrap());

        let mut wrong = state.clone();
        wrong.insert(
            "v.x".into(),
            Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
        assert!(fresh
            .load_state(&wrong, 1)
            .unwrap_err()
            .to_string()
            .contains("shape"));
        wrong.remove("v.x");
        assert!(fresh
            .load_state(&wrong, 1)
            .unwrap_err()
            .to_string()
            .contains("v.x"));
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let x = Var::new(&[0f32, 0.0], &Device::Cpu).unwrap();
        // Gradient of 3a + 4b is (3, 4), norm 5.
        let w = Tensor::new(&[3f32, 4.0], &Device::Cpu).unwrap();
        let mut g = (x.as_tensor() * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let norm = clip_grad_norm(&mut g, std::slice::from_ref(&x), 1.0).unwrap();
        assert!((norm - 5.0).abs() < 1e-6);
        let clipped: Vec<f32> = g.get(x.as_tensor()).unwrap().to_vec1().unwrap();
        assert!((clipped[0] - 0.6).abs() < 1e-5 && (clipped[1] - 0.8).abs() < 1e-5);
        // Below the limit nothing changes.
        let mut g = (x.as_tensor() * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        clip_grad_norm(&mut g, std::slice::from_ref(&x), 10.0).unwrap();
        assert_eq!(
            g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap(),
            [3.0, 4.0]
        );
    }
}
