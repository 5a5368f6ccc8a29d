//! The fine-tuning loop: shuffled mini-batches, the bound loss, AdamW with a linear schedule,
//! gradient clipping, checkpoints and a progress bar; and evaluation (accuracy plus the largest
//! |hidden state| of every block, which decides whether fixed-point inference overflows).
//!
//! Determinism: the example order of epoch `e` is a shuffle seeded by (`seed`, `e`), so a run
//! resumed from a checkpoint at step `s` sees exactly the batches the uninterrupted run would.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var, D};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};

use crate::batch::{Batch, EncodedExample, SequenceClassifier};
use crate::checkpoint::{self, TrainState};
use crate::loss::{combined_loss, LossWeights};
use crate::optim::{clip_grad_norm, AdamW, AdamWConfig, LinearSchedule};
use veil_model::candle_error;

/// Settings of one fine-tuning run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Passes over the training set.
    pub epochs: u32,
    /// Examples per update.
    pub batch_size: usize,
    /// Peak learning rate of the linear schedule.
    pub learning_rate: f64,
    /// Fraction of all updates spent warming up.
    pub warmup_fraction: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Seed of the shuffling and of new parameters.
    pub seed: u64,
    /// The loss's weights.
    pub loss: LossWeights,
    /// The optimiser's settings.
    pub adamw: AdamWConfig,
    /// Save a checkpoint every this many updates (and when the run ends or stops).
    pub checkpoint_every: u64,
    /// Cap on the number of updates (the schedule warms up and decays over the capped run):
    /// a time budget for long data sets, e.g. each stage of the substitution workflow.
    #[serde(default)]
    pub max_steps: Option<u64>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 3,
            batch_size: 32,
            learning_rate: 5e-5,
            warmup_fraction: 0.1,
            max_grad_norm: 1.0,
            seed: 42,
            loss: LossWeights::paper(None),
            adamw: AdamWConfig::default(),
            checkpoint_every: 200,
            max_steps: None,
        }
    }
}

impl TrainConfig {
    /// Refuses settings that cannot train (empty batches, rates or fractions out of range).
    pub fn validate(&self) -> Result<()> {
        self.loss.validate()?;
        ensure!(self.epochs > 0, InvalidArgument, "epochs must be > 0");
        ensure!(
            self.batch_size > 0,
            InvalidArgument,
            "batch size must be > 0"
        );
        ensure!(
            self.learning_rate > 0.0 && self.learning_rate.is_finite(),
            InvalidArgument,
            "learning rate must be > 0"
        );
        ensure!(
            (0.0..1.0).contains(&self.warmup_fraction),
            InvalidArgument,
            "warm-up fraction must be in [0, 1)"
        );
        ensure!(
            self.max_grad_norm > 0.0,
            InvalidArgument,
            "gradient clip must be > 0"
        );
        ensure!(
            self.max_steps != Some(0),
            InvalidArgument,
            "max steps must be > 0"
        );
        ensure!(
            self.checkpoint_every > 0,
            InvalidArgument,
            "checkpoint interval must be > 0"
        );
        Ok(())
    }

    /// Updates of a run over `examples` training examples.
    pub fn total_steps(&self, examples: usize) -> u64 {
        let per_epoch = examples.div_ceil(self.batch_size.max(1)) as u64;
        (per_epoch * self.epochs as u64).min(self.max_steps.unwrap_or(u64::MAX))
    }

    /// This config with `factor` times its updates over `examples` examples (rounded up; the
    /// schedule stretches over the longer run): the budget of a retried substitution step.
    pub fn scaled(&self, examples: usize, factor: f64) -> Result<TrainConfig> {
        self.validate()?;
        ensure!(examples > 0, InvalidArgument, "no training examples");
        ensure!(
            factor.is_finite() && factor >= 1.0,
            InvalidArgument,
            "update budget factor must be ≥ 1, got {factor}"
        );
        if factor == 1.0 {
            return Ok(self.clone());
        }
        let updates = (self.total_steps(examples) as f64 * factor).ceil();
        let per_epoch = examples.div_ceil(self.batch_size) as u64;
        let epochs = (updates / per_epoch as f64).ceil();
        ensure!(
            epochs <= u32::MAX as f64,
            InvalidArgument,
            "{factor} × the updates of {} epochs is too many",
            self.epochs
        );
        Ok(TrainConfig {
            epochs: epochs as u32,
            max_steps: Some(updates as u64),
            ..self.clone()
        })
    }
}

/// How the run should behave around its own lifetime (not part of what is being trained, so
/// not compared on resume).
#[derive(Clone, Debug, Default)]
pub struct RunControl<'a> {
    /// Folder for checkpoints; an existing checkpoint there is resumed.
    pub checkpoint_dir: Option<&'a Path>,
    /// Stop (after checkpointing) once this many updates are done — for time-boxed runs.
    pub stop_after: Option<u64>,
    /// Whether to show a progress bar.
    pub progress: bool,
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    /// Updates done, including those of earlier invocations.
    pub steps_done: u64,
    /// Updates the whole run makes.
    pub total_steps: u64,
    /// Step the run resumed from, if it did.
    pub resumed_from: Option<u64>,
    /// Mean total loss and training accuracy over the updates this invocation ran.
    pub mean_loss: f64,
    /// Training accuracy over those updates.
    pub train_accuracy: f64,
    /// Wall time of this invocation.
    pub seconds: f64,
}

impl TrainSummary {
    /// Whether every update is done.
    pub fn finished(&self) -> bool {
        self.steps_done >= self.total_steps
    }
}

/// FNV-1a: a cheap hash under which any change of the input changes the value.
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf29ce484222325)
    }

    pub(crate) fn eat(&mut self, x: u32) {
        for b in x.to_le_bytes() {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
}

/// Fingerprint of the token ids and labels.
pub(crate) fn fingerprint(data: &[EncodedExample]) -> u64 {
    let mut h = Fnv::new();
    for e in data {
        h.eat(e.ids.len() as u32);
        e.ids.iter().chain(&e.type_ids).for_each(|&x| h.eat(x));
        h.eat(e.label);
    }
    h.0
}

/// Batches sorted together by length: a window of this many batches is sorted by sequence
/// length before it is cut into batches, so each batch pads to a similar length.
const BUCKET_BATCHES: usize = 50;

/// The example order of one epoch: a seeded shuffle, then length bucketing (each window of
/// [`BUCKET_BATCHES`] batches sorted by length and cut into batches), then the full batches
/// shuffled again so lengths do not trend through the epoch. Padding to the batch's longest
/// example then wastes far less work (on SST-2 about a third of the tokens otherwise). A
/// partial batch stays last, so batch `b` always starts at `b · batch_size`.
fn epoch_order(data: &[EncodedExample], batch_size: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9e3779b97f4a7c15));
    order.shuffle(&mut rng);
    for window in order.chunks_mut(batch_size * BUCKET_BATCHES) {
        window.sort_by_key(|&i| data[i].ids.len());
    }
    let full = data.len() / batch_size;
    let mut batches: Vec<&[usize]> = order.chunks(batch_size).collect();
    batches[..full].shuffle(&mut rng);
    batches.concat()
}

/// Number of correct argmax predictions in a batch.
fn correct(logits: &Tensor, labels: &Tensor) -> candle_core::Result<usize> {
    let hits = logits
        .argmax(D::Minus1)?
        .eq(labels)?
        .to_dtype(DType::U32)?
        .sum_all()?;
    Ok(hits.to_scalar::<u32>()? as usize)
}

/// Fine-tunes `trainable` (the unfrozen parameters of `model`) on `data`.
pub fn train<M: SequenceClassifier>(
    model: &M,
    trainable: Vec<(String, Var)>,
    data: &[EncodedExample],
    config: &TrainConfig,
    control: &RunControl<'_>,
) -> Result<TrainSummary> {
    train_with_teacher(model, None, trainable, data, config, control)
}

/// [`train`] with a frozen `teacher` for the distillation term of `config.loss` (needed when
/// its weight is > 0). The teacher only runs forward; it is never updated.
pub fn train_with_teacher<M: SequenceClassifier>(
    model: &M,
    teacher: Option<&dyn SequenceClassifier>,
    trainable: Vec<(String, Var)>,
    data: &[EncodedExample],
    config: &TrainConfig,
    control: &RunControl<'_>,
) -> Result<TrainSummary> {
    config.validate()?;
    ensure!(
        config.loss.distill == 0.0 || teacher.is_some(),
        InvalidArgument,
        "the distillation weight is set but there is no teacher model"
    );
    ensure!(!data.is_empty(), InvalidArgument, "no training examples");
    ensure!(
        !trainable.is_empty(),
        InvalidArgument,
        "no trainable parameters"
    );
    let device = Device::Cpu;
    let batches_per_epoch = data.len().div_ceil(config.batch_size) as u64;
    let total_steps = config.total_steps(data.len());
    let schedule = LinearSchedule {
        peak: config.learning_rate,
        warmup: (total_steps as f64 * config.warmup_fraction) as u64,
        total: total_steps,
    };
    let vars: Vec<Var> = trainable.iter().map(|(_, v)| v.clone()).collect();
    let mut opt = AdamW::new(trainable.clone(), config.adamw)?;
    let state_template = TrainState {
        step: 0,
        total_steps,
        config: serde_json::to_value(config).map_err(|e| Error::Other(e.to_string()))?,
        data_fingerprint: fingerprint(data),
    };

    let mut resumed_from = None;
    if let Some(dir) = control.checkpoint_dir {
        if let Some(saved) = checkpoint::load_state(dir)? {
            ensure!(
                saved.config == state_template.config
                    && saved.data_fingerprint == state_template.data_fingerprint
                    && saved.total_steps == total_steps,
                InvalidArgument,
                "checkpoint in {} belongs to a run with other settings or data; \
                 remove it or use another folder",
                dir.display()
            );
            checkpoint::restore(dir, &saved, &trainable, &mut opt)?;
            resumed_from = Some(saved.step);
        }
    }
    let first_step = resumed_from.unwrap_or(0);
    let last_step = control
        .stop_after
        .map_or(total_steps, |s| s.min(total_steps));

    let bar = if control.progress {
        let bar = ProgressBar::new(total_steps);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg} ETA {eta}",
            )
            .map_err(|e| Error::Other(e.to_string()))?
            .progress_chars("=> "),
        );
        bar.set_position(first_step);
        bar
    } else {
        ProgressBar::hidden()
    };

    let started = Instant::now();
    let (mut loss_sum, mut seen, mut hits) = (0f64, 0usize, 0usize);
    let mut order = Vec::new();
    let mut order_epoch = u64::MAX;
    for step in first_step..last_step {
        let epoch = step / batches_per_epoch;
        if epoch != order_epoch {
            order = epoch_order(data, config.batch_size, config.seed, epoch);
            order_epoch = epoch;
        }
        let at = (step % batches_per_epoch) as usize * config.batch_size;
        let members: Vec<&EncodedExample> = order[at..(at + config.batch_size).min(data.len())]
            .iter()
            .map(|&i| &data[i])
            .collect();
        let batch = Batch::new(&members, &device)?;
        // The teacher first, detached at once, so its graph is gone before the student's.
        let teacher_out = match teacher {
            Some(t) if config.loss.distill > 0.0 => Some(
                t.forward(&batch)
                    .map_err(candle_error("training"))?
                    .detach(),
            ),
            _ => None,
        };
        let out = model.forward(&batch).map_err(candle_error("training"))?;
        let terms = combined_loss(
            &config.loss,
            &out,
            &batch.labels,
            &batch.attention_mask,
            &vars,
            teacher_out.as_ref(),
        )?;
        let total: f32 = terms.total.to_scalar().map_err(candle_error("training"))?;
        ensure!(
            total.is_finite(),
            Other,
            "loss is not finite at step {step}: training diverged"
        );
        let mut grads = terms.total.backward().map_err(candle_error("training"))?;
        clip_grad_norm(&mut grads, &vars, config.max_grad_norm)?;
        opt.step(&grads, schedule.lr(step))?;

        loss_sum += total as f64;
        seen += batch.len();
        hits += correct(&out.logits, &batch.labels).map_err(candle_error("training"))?;
        let done = step + 1;
        bar.set_position(done);
        bar.set_message(format!(
            "epoch {} loss {:.4} (task {:.4} decay {:.4} bound {:.3}{}) acc {:.1}%",
            epoch + 1,
            loss_sum / (done - first_step) as f64,
            terms.task,
            terms.decay,
            terms.bound,
            if teacher_out.is_some() {
                format!(" distill {:.4}", terms.distill)
            } else {
                String::new()
            },
            100.0 * hits as f64 / seen as f64
        ));
        if let Some(dir) = control.checkpoint_dir {
            if done % config.checkpoint_every == 0 || done == last_step {
                let state = TrainState {
                    step: done,
                    ..state_template.clone()
                };
                checkpoint::save(dir, &trainable, &opt, &state)?;
            }
        }
    }
    bar.finish_and_clear();
    let ran = last_step.saturating_sub(first_step);
    Ok(TrainSummary {
        steps_done: last_step.max(first_step),
        total_steps,
        resumed_from,
        mean_loss: if ran > 0 { loss_sum / ran as f64 } else { 0.0 },
        train_accuracy: if seen > 0 {
            hits as f64 / seen as f64
        } else {
            0.0
        },
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Accuracy on a labelled set, and the largest |value| each block's output reached on it
/// (real tokens only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Fraction of examples classified correctly.
    pub accuracy: f64,
    /// Examples evaluated.
    pub examples: usize,
    /// Largest |value| of each block's output.
    pub max_abs_hidden: Vec<f32>,
    /// F1 of class 1 on a two-class task (MRPC's metric, class 1 = "equivalent"); `None` for
    /// more classes (and in records written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    /// Perplexity of a language model on held-out text (`None` for classifiers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
}

/// F1 of class 1: 2·TP / (2·TP + FP + FN) over (predicted, label) pairs (0 when class 1 is
/// neither predicted nor present).
pub(crate) fn f1_of_class_one(pairs: impl IntoIterator<Item = (u32, u32)>) -> f64 {
    let (mut tp, mut fp, mut fn_) = (0usize, 0usize, 0usize);
    for (p, l) in pairs {
        tp += (p == 1 && l == 1) as usize;
        fp += (p == 1 && l != 1) as usize;
        fn_ += (p != 1 && l == 1) as usize;
    }
    (2 * tp) as f64 / (2 * tp + fp + fn_).max(1) as f64
}

/// Evaluates `model` on `examples` in batches of `batch_size`.
pub fn evaluate<M: SequenceClassifier>(
    model: &M,
    data: &[EncodedExample],
    batch_size: usize,
) -> Result<Evaluation> {
    ensure!(!data.is_empty(), InvalidArgument, "no evaluation examples");
    ensure!(batch_size > 0, InvalidArgument, "batch size must be > 0");
    let mut hits = 0usize;
    let mut max_abs: Vec<f32> = Vec::new();
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(data.len());
    let mut classes = 0;
    for chunk in data.chunks(batch_size) {
        let members: Vec<&EncodedExample> = chunk.iter().collect();
        let batch = Batch::new(&members, &Device::Cpu)?;
        let out = model.forward(&batch).map_err(candle_error("evaluation"))?;
        hits += correct(&out.logits, &batch.labels).map_err(candle_error("evaluation"))?;
        classes = out
            .logits
            .dim(D::Minus1)
            .map_err(candle_error("evaluation"))?;
        let predicted = (|| out.logits.argmax(D::Minus1)?.to_vec1::<u32>())()
            .map_err(candle_error("evaluation"))?;
        let labels = batch
            .labels
            .to_vec1::<u32>()
            .map_err(candle_error("evaluation"))?;
        pairs.extend(predicted.into_iter().zip(labels));
        let mask = batch
            .attention_mask
            .unsqueeze(D::Minus1)
            .map_err(candle_error("evaluation"))?;
        if max_abs.is_empty() {
            max_abs = vec![0.0; out.hidden_states.len()];
        }
        ensure!(
            max_abs.len() == out.hidden_states.len(),
            Other,
            "model returned a varying number of hidden states"
        );
        for (m, h) in max_abs.iter_mut().zip(&out.hidden_states) {
            let block_max = (|| {
                h.detach()
                    .abs()?
                    .broadcast_mul(&mask)?
                    .max_all()?
                    .to_scalar::<f32>()
            })()
            .map_err(candle_error("evaluation"))?;
            *m = m.max(block_max);
        }
    }
    Ok(Evaluation {
        accuracy: hits as f64 / data.len() as f64,
        examples: data.len(),
        f1: (classes == 2).then(|| f1_of_class_one(pairs)),
        max_abs_hidden: max_abs,
        perplexity: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny::{inflate, synthetic_task, TinyClassifier};

    fn quick_config() -> TrainConfig {
        TrainConfig {
            epochs: 3,
            batch_size: 16,
            learning_rate: 2e-2,
            warmup_fraction: 0.1,
            loss: LossWeights::task_only(),
            checkpoint_every: 3,
            ..Default::default()
        }
    }

    #[test]
    fn epoch_order_is_a_seeded_permutation_with_length_buckets() {
        let data: Vec<EncodedExample> = (0..1000)
            .map(|i| EncodedExample {
                ids: vec![1; 1 + (i * 7919) % 60],
                type_ids: vec![0; 1 + (i * 7919) % 60],
                label: 0,
            })
            .collect();
        let order = epoch_order(&data, 8, 1, 0);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(order, epoch_order(&data, 8, 1, 0));
        assert_ne!(order, epoch_order(&data, 8, 1, 1));
        // Padding work: with buckets, far fewer padded tokens than with a plain shuffle.
        let padded = |order: &[usize]| -> usize {
            order
                .chunks(8)
                .map(|b| b.len() * b.iter().map(|&i| data[i].ids.len()).max().unwrap())
                .sum()
        };
        let mut plain: Vec<usize> = (0..1000).collect();
        plain.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
        assert!(padded(&order) * 10 < padded(&plain) * 7);
    }

    #[test]
    fn training_reduces_loss_and_learns_the_task() {
        let model = TinyClassifier::new(16, 1);
        let data = synthetic_task(256, 2);
        let dev = synthetic_task(128, 3);
        let before = evaluate(&model, &dev, 64).unwrap();
        let first = train(
            &model,
            model.named_vars(),
            &data,
            &quick_config(),
            &RunControl::default(),
        )
        .unwrap();
        let second = train(
            &model,
            model.named_vars(),
            &data,
            &quick_config(),
            &RunControl::default(),
        )
        .unwrap();
        assert!(
            second.mean_loss < first.mean_loss,
            "{first:?} then {second:?}"
        );
        assert!(first.finished() && first.steps_done == 48);
        let after = evaluate(&model, &dev, 64).unwrap();
        assert!(
            after.accuracy > 0.9,
            "dev accuracy {} (before {})",
            after.accuracy,
            before.accuracy
        );
        assert_eq!(after.examples, 128);
        assert_eq!(after.max_abs_hidden.len(), 2);
        // A two-class task: F1 of class 1 beside accuracy.
        let f1 = after.f1.expect("F1 on a two-class task");
        assert!(f1 > 0.85, "F1 {f1}");
    }

    #[test]
    fn f1_counts_class_one() {
        // TP 2, FP 1, FN 1, TN 1: 4 / 6.
        let pairs = [(1, 1), (1, 1), (1, 0), (0, 1), (0, 0)];
        assert!((f1_of_class_one(pairs) - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(f1_of_class_one([(0, 0), (0, 0)]), 0.0);
        assert_eq!(f1_of_class_one([(1, 1)]), 1.0);
    }

    #[test]
    fn frozen_parameters_do_not_move() {
        let model = TinyClassifier::new(8, 4);
        let data = synthetic_task(64, 5);
        let trainable: Vec<_> = model
            .named_vars()
            .into_iter()
            .filter(|(n, _)| !n.starts_with("embed"))
            .collect();
        let before = model.snapshot();
        train(
            &model,
            trainable,
            &data,
            &quick_config(),
            &RunControl::default(),
        )
        .unwrap();
        let after = model.snapshot();
        for ((name, b), (_, a)) in before.iter().zip(&after) {
            assert_eq!(name.starts_with("embed"), a == b, "{name}");
        }
    }

    #[test]
    fn bound_term_shrinks_hidden_states() {
        let data = synthetic_task(128, 6);
        let run = |loss: LossWeights| {
            let model = TinyClassifier::new(8, 7);
            inflate(&model, 4.0);
            let config = TrainConfig {
                loss,
                epochs: 4,
                ..quick_config()
            };
            train(
                &model,
                model.named_vars(),
                &data,
                &config,
                &RunControl::default(),
            )
            .unwrap();
            let e = evaluate(&model, &data, 64).unwrap();
            e.max_abs_hidden.iter().cloned().fold(0f32, f32::max)
        };
        let free = run(LossWeights::task_only());
        let bounded = run(LossWeights {
            alpha2: 0.5,
            bound: Some(2.0),
            ..LossWeights::task_only()
        });
        assert!(
            bounded < 0.5 * free,
            "bounded max |h| {bounded} vs unbounded {free}"
        );
    }

    /// Mean distillation term of `student` against `teacher` over `data`.
    fn distill_term(
        student: &TinyClassifier,
        teacher: &TinyClassifier,
        data: &[EncodedExample],
    ) -> f32 {
        let members: Vec<&EncodedExample> = data.iter().collect();
        let batch = Batch::new(&members, &Device::Cpu).unwrap();
        let (s, t) = (
            student.forward(&batch).unwrap(),
            teacher.forward(&batch).unwrap(),
        );
        crate::loss::distill_loss(&s, &t, &batch.attention_mask)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn distillation_pulls_the_student_towards_a_frozen_teacher() {
        let data = synthetic_task(128, 16);
        let teacher = TinyClassifier::new(8, 17);
        train(
            &teacher,
            teacher.named_vars(),
            &data,
            &quick_config(),
            &RunControl::default(),
        )
        .unwrap();
        let teacher_weights = teacher.snapshot();
        assert!(distill_term(&teacher, &teacher, &data).abs() < 1e-6);
        let twin = TinyClassifier::new(8, 17);
        for ((_, a), (_, b)) in twin.named_vars().iter().zip(teacher.named_vars()) {
            a.set(b.as_tensor()).unwrap();
        }
        assert!(
            distill_term(&twin, &teacher, &data).abs() < 1e-6,
            "student = teacher"
        );

        // Same start, trained with and without the term.
        let student = TinyClassifier::new(8, 18);
        let plain = TinyClassifier::new(8, 18);
        let config = TrainConfig {
            loss: LossWeights {
                distill: 1.0,
                ..LossWeights::task_only()
            },
            ..quick_config()
        };
        let before = distill_term(&student, &teacher, &data);
        assert!(before > 0.05, "{before}");
        let control = RunControl::default();
        let vars = student.named_vars();
        train_with_teacher(&student, Some(&teacher), vars, &data, &config, &control).unwrap();
        let plain_config = TrainConfig {
            loss: LossWeights::task_only(),
            ..quick_config()
        };
        train(&plain, plain.named_vars(), &data, &plain_config, &control).unwrap();
        let (after, without) = (
            distill_term(&student, &teacher, &data),
            distill_term(&plain, &teacher, &data),
        );
        assert!(
            after < 0.7 * before && after < 0.7 * without,
            "before {before}, after {after}, trained without the term {without}"
        );
        assert_eq!(teacher.snapshot(), teacher_weights, "the teacher moved");
        let err = train(
            &student,
            student.named_vars(),
            &data,
            &config,
            &RunControl::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("teacher"), "{err}");
    }

    #[test]
    fn interrupted_run_resumes_to_the_same_weights() {
        let data = synthetic_task(96, 8);
        let config = quick_config(); // 6 batches × 3 epochs = 18 updates, checkpoints every 3
        let straight = TinyClassifier::new(8, 9);
        train(
            &straight,
            straight.named_vars(),
            &data,
            &config,
            &RunControl::default(),
        )
        .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let interrupted = TinyClassifier::new(8, 9);
        let stop = RunControl {
            checkpoint_dir: Some(dir.path()),
            stop_after: Some(7),
            progress: false,
        };
        let part = train(
            &interrupted,
            interrupted.named_vars(),
            &data,
            &config,
            &stop,
        )
        .unwrap();
        assert_eq!((part.steps_done, part.finished()), (7, false));
        assert_eq!(
            crate::checkpoint::load_state(dir.path())
                .unwrap()
                .unwrap()
                .step,
            7
        );
        // Only the latest checkpoint's tensor files remain.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);

        // A fresh process: new model object from the same initial weights, resumes at step 7.
        let resumed = TinyClassifier::new(8, 9);
        let go_on = RunControl {
            checkpoint_dir: Some(dir.path()),
            ..Default::default()
        };
        let rest = train(&resumed, resumed.named_vars(), &data, &config, &go_on).unwrap();
        assert_eq!(rest.resumed_from, Some(7));
        assert!(rest.finished());
        for ((name, a), (_, b)) in straight.snapshot().iter().zip(&resumed.snapshot()) {
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "{name} differs by {diff}");
        }

        // Other settings must not silently continue this checkpoint.
        let other = TrainConfig {
            learning_rate: 1e-3,
            ..config
        };
        let err = train(&resumed, resumed.named_vars(), &data, &other, &go_on).unwrap_err();
        assert!(err.to_string().contains("other settings"), "{err}");
    }

    #[test]
    fn corrupt_checkpoint_is_an_error() {
        let data = synthetic_task(32, 10);
        let dir = tempfile::tempdir().unwrap();
        let model = TinyClassifier::new(8, 11);
        let control = RunControl {
            checkpoint_dir: Some(dir.path()),
            stop_after: Some(1),
            progress: false,
        };
        train(&model, model.named_vars(), &data, &quick_config(), &control).unwrap();
        std::fs::write(dir.path().join("params-1.safetensors"), b"garbage").unwrap();
        assert!(train(&model, model.named_vars(), &data, &quick_config(), &control).is_err());
        std::fs::write(dir.path().join("state.json"), b"{").unwrap();
        let err = train(&model, model.named_vars(), &data, &quick_config(), &control).unwrap_err();
        assert!(err.to_string().contains("state.json"), "{err}");
    }

    #[test]
    fn scaled_budgets_multiply_the_updates() {
        let config = quick_config(); // 3 epochs of 16
        assert_eq!(config.total_steps(100), 21); // 7 batches per epoch
        assert_eq!(config.scaled(100, 1.0).unwrap(), config);
        let twice = config.scaled(100, 2.0).unwrap();
        assert_eq!((twice.epochs, twice.max_steps), (6, Some(42)));
        assert_eq!(twice.total_steps(100), 42);
        let odd = config.scaled(100, 1.5).unwrap(); // 31.5 → 32 updates, 5 epochs
        assert_eq!((odd.epochs, odd.total_steps(100)), (5, 32));
        let capped = TrainConfig {
            max_steps: Some(10),
            ..config.clone()
        };
        assert_eq!(capped.scaled(100, 4.0).unwrap().total_steps(100), 40);
        // The scaled run really makes that many updates.
        let data = synthetic_task(32, 14);
        let model = TinyClassifier::new(4, 15);
        let run = train(
            &model,
            model.named_vars(),
            &data,
            &capped.scaled(32, 3.0).unwrap(),
            &RunControl::default(),
        )
        .unwrap();
        assert_eq!(run.steps_done, 18); // 3 × min(2 × 3, 10)
        for bad in [0.5, f64::NAN, f64::INFINITY, 1e12] {
            assert!(config.scaled(100, bad).is_err(), "{bad}");
        }
        assert!(config.scaled(0, 2.0).is_err());
    }

    #[test]
    fn invalid_configs_rejected() {
        let model = TinyClassifier::new(4, 12);
        let data = synthetic_task(8, 13);
        for bad in [
            TrainConfig {
                batch_size: 0,
                ..quick_config()
            },
            TrainConfig {
                epochs: 0,
                ..quick_config()
            },
            TrainConfig {
                warmup_fraction: 1.0,
                ..quick_config()
            },
            TrainConfig {
                learning_rate: f64::NAN,
                ..quick_config()
            },
        ] {
            assert!(train(
                &model,
                model.named_vars(),
                &data,
                &bad,
                &RunControl::default()
            )
            .is_err());
        }
        assert!(train(
            &model,
            model.named_vars(),
            &[],
            &quick_config(),
            &RunControl::default()
        )
        .is_err());
        assert!(train(
            &model,
            vec![],
            &data,
            &quick_config(),
            &RunControl::default()
        )
        .is_err());
    }
}
