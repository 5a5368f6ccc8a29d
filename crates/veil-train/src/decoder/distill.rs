//! Distillation of a substituted decoder towards the original, and its held-out evaluation.
//!
//! **Loss.** KL(teacher ‖ student) of the next-token distributions at every real position,
//! averaged over positions; the teacher is the original model (the same candle code with the
//! original operators, never trained). Optional terms: a hidden-state term, the mean squared
//! difference of the last block's outputs relative to the teacher's mean square
//! (`hidden_weight`), and the paper's bound term Σ‖max(|h| − B, 0)‖₂ on the outputs of the
//! trained blocks when the stage has a bound B. Teacher outputs are recomputed per batch rather
//! than cached: a cache of full next-token distributions (49,152 floats per position for
//! SmolLM2) would take ~200 kB per token.
//!
//! **Trainable parameters.** [`Scope::Block`] (the default) trains only the blocks whose
//! operator was replaced; [`Scope::Above`] trains them and every block above. Blocks below are
//! always frozen, so their forward runs without an autograd graph (and, while they are still
//! the original's, the student reuses the teacher's hidden state there). Either way the loss is
//! at the output, so backward runs through every block above the replaced one; `Above` adds
//! the weight gradients and AdamW state of those blocks. Measured on SmolLM2-135M, batch 4 × 64
//! tokens, this project's 2-core machine: release build, quiet machine, 3.0 s per update for
//! the top block (reusing the teacher's hidden state below) and 6.8 s for block 0; the held-out
//! evaluation ~0.27 s per 64-token sequence (8.5 s for 32). Dev profile (dependencies
//! optimised as release) with another build on the same cores: 14.8 s for the top block, 23.0 s
//! for block 0 with `Block` and 31.7 s with `Above` (+38 %). `Above` costs a third more per
//! update and did not recover block 0 better in that short test (agreement 0.76 vs 0.79 after 3
//! updates), hence `Block`: 60 steps (SiLU and Softmax over 30 blocks) of 32 updates are about
//! 2–4 hours when none is retried.

//! **Evaluation** on held-out sequences: top-1 agreement of the student's next-token choice
//! with the original's at every scored position (every real one, or an answered chat
//! sequence's answer positions; the original's choices are computed once), the
//! student's perplexity on the actual next tokens, and the largest |hidden value| per block.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use candle_core::{Device, Tensor, D};
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};
use veil_model::candle_error;

use super::data::{batch_at, PaddedBatch};
use super::model::{ids_tensor, TrainableDecoder};
use crate::checkpoint::{self, TrainState};
use crate::loss::kl_rows;
use crate::optim::{clip_grad_norm, AdamW, AdamWConfig, LinearSchedule};
use crate::train::{Evaluation, Fnv};

type CResult<T> = candle_core::Result<T>;

/// Which parameters a step fine-tunes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Only the blocks whose operator the step replaced.
    #[default]
    Block,
    /// That block and every block above it.
    Above,
}

/// Settings of one step's fine-tuning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistillSettings {
    /// Updates of a step's first attempt (retries multiply it).
    pub updates: u64,
    /// Sequences per update.
    pub batch_size: usize,
    /// Peak learning rate (AdamW, linear warm-up then decay to 0).
    pub learning_rate: f64,
    /// Fraction of the updates spent warming up.
    pub warmup_fraction: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// A training checkpoint every this many updates (0: none).
    pub checkpoint_every: u64,
    /// Weight of the relative hidden-state term (0: KL only).
    pub hidden_weight: f64,
    /// Weight of the bound term when a stage has a bound.
    pub bound_weight: f64,
    /// The trainable parameters.
    pub scope: Scope,
}

impl Default for DistillSettings {
    fn default() -> Self {
        DistillSettings {
            updates: 60,
            batch_size: 4,
            learning_rate: 1e-4,
            warmup_fraction: 0.1,
            max_grad_norm: 1.0,
            checkpoint_every: 10,
            hidden_weight: 0.0,
            bound_weight: 1.0,
            scope: Scope::Block,
        }
    }
}

impl DistillSettings {
    /// Rejects settings no run can use.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.updates > 0, InvalidArgument, "updates must be > 0");
        ensure!(
            self.batch_size > 0,
            InvalidArgument,
            "batch size must be > 0"
        );
        ensure!(
            self.learning_rate.is_finite() && self.learning_rate > 0.0,
            InvalidArgument,
            "learning rate must be > 0, got {}",
            self.learning_rate
        );
        ensure!(
            (0.0..1.0).contains(&self.warmup_fraction),
            InvalidArgument,
            "warm-up fraction must be in [0, 1), got {}",
            self.warmup_fraction
        );
        ensure!(
            self.max_grad_norm > 0.0,
            InvalidArgument,
            "gradient clip must be > 0"
        );
        for (name, w) in [("hidden", self.hidden_weight), ("bound", self.bound_weight)] {
            ensure!(
                w.is_finite() && w >= 0.0,
                InvalidArgument,
                "{name} weight must be ≥ 0, got {w}"
            );
        }
        Ok(())
    }
}

/// Mean over real positions of KL(teacher ‖ student); `mask` `[B, T]`.
pub fn kl_loss(student: &Tensor, teacher: &Tensor, mask: &Tensor) -> Result<Tensor> {
    (|| {
        let per = kl_rows(student, teacher)?;
        let n = mask.sum_all()?.to_scalar::<f32>()?.max(1.0) as f64;
        (per * mask)?.sum_all()? / n
    })()
    .map_err(candle_error("distillation loss"))
}

/// What one update computed.
pub(crate) struct Forward {
    pub(crate) loss: Tensor,
    pub(crate) kl: f64,
}

/// The loss of one batch. With `below_unchanged` (the student's blocks below `first_trained`
/// are the original's, as throughout the first stage of a top-down run) the student starts
/// from the teacher's hidden state at `first_trained` instead of recomputing it.
pub(crate) fn distill_forward(
    student: &TrainableDecoder,
    teacher: &TrainableDecoder,
    batch: &PaddedBatch,
    first_trained: usize,
    below_unchanged: bool,
    settings: &DistillSettings,
    bound: Option<f64>,
) -> Result<Forward> {
    let ids = ids_tensor(&batch.ids)?;
    let (b, t) = (batch.ids.len(), batch.ids[0].len());
    let mask = Tensor::from_vec(batch.mask(), (b, t), &Device::Cpu)
        .map_err(candle_error("distillation"))?;
    let n = student.num_blocks();
    let tx = teacher.embed(&ids)?;
    let mut shared: Option<Tensor> = None;
    let t_hidden = teacher.run_blocks(tx, 0..n, 0, None, |i, h| {
        if below_unchanged && i + 1 == first_trained {
            shared = Some(h.clone());
        }
        Ok(())
    })?;
    let t_logits = teacher.head(&t_hidden)?;
    // Frozen blocks below: no parameter is a variable, so no graph is built.
    let x = match shared {
        Some(h) => h,
        None => {
            let x = student.embed(&ids)?;
            student.run_blocks(x, 0..first_trained, 0, None, |_, _| Ok(()))?
        }
    };
    let mut trained_outputs = Vec::new();
    let collect = bound.is_some() && settings.bound_weight > 0.0;
    let s_hidden = student.run_blocks(x, first_trained..n, 0, None, |_, h| {
        if collect {
            trained_outputs.push(h.clone());
        }
        Ok(())
    })?;
    let s_logits = student.head(&s_hidden)?;
    let kl = kl_loss(&s_logits, &t_logits, &mask)?;
    let kl_value = kl
        .to_scalar::<f32>()
        .map_err(candle_error("distillation loss"))? as f64;
    let mut loss = kl;
    if settings.hidden_weight > 0.0 {
        let term = (|| {
            let m3 = mask.unsqueeze(D::Minus1)?;
            let diff = (s_hidden.broadcast_mul(&m3)? - t_hidden.broadcast_mul(&m3)?)?;
            let scale = t_hidden
                .broadcast_mul(&m3)?
                .sqr()?
                .mean_all()?
                .to_scalar::<f32>()?;
            diff.sqr()?.mean_all()? / (scale.max(1e-12) as f64)
        })()
        .map_err(candle_error("hidden-state loss"))?;
        loss = (loss + (term * settings.hidden_weight).map_err(candle_error("loss"))?)
            .map_err(candle_error("loss"))?;
    }
    if let Some(b) = bound.filter(|_| collect) {
        // Keep only the trainable blocks' outputs (the first is the replaced block's).
        let outputs: Vec<Tensor> = trained_outputs;
        let term = crate::loss::bound_loss(&outputs, &mask, b)?;
        loss = (loss + (term * settings.bound_weight).map_err(candle_error("loss"))?)
            .map_err(candle_error("loss"))?;
    }
    Ok(Forward { loss, kl: kl_value })
}

/// One fine-tuning run of a step.
pub struct FinetuneJob<'a> {
    /// The blocks whose operator was replaced; blocks below stay frozen.
    pub blocks: Range<usize>,
    /// Multiple of `settings.updates`.
    pub budget: f64,
    /// Peak learning rate, when the stage has its own.
    pub learning_rate: Option<f64>,
    /// Hidden-state bound of the stage.
    pub bound: Option<f64>,
    /// Where the training checkpoint lives (continued when found).
    pub checkpoint_dir: Option<&'a Path>,
    /// First batch index of this step's data (steps see different batches).
    pub data_offset: u64,
    /// Whether the blocks below `block` are the original's (parameters and operators): the
    /// student then reuses the teacher's hidden state there.
    pub below_unchanged: bool,
    /// Print progress to stderr.
    pub progress: bool,
}

/// What a fine-tuning run did.
#[derive(Clone, Debug, PartialEq)]
pub struct FinetuneResult {
    /// Mean loss over the updates this invocation ran.
    pub mean_loss: f64,
    /// Mean KL over those updates.
    pub mean_kl: f64,
    /// Updates of the whole run.
    pub updates: u64,
    /// The update a resumed run continued from.
    pub resumed_from: Option<u64>,
    /// Seconds per update in this invocation.
    pub seconds_per_update: f64,
}

/// Fingerprint of token sequences.
pub fn sequences_fingerprint(seqs: &[Vec<u32>]) -> u64 {
    let mut h = Fnv::new();
    for s in seqs {
        h.eat(s.len() as u32);
        s.iter().for_each(|&x| h.eat(x));
    }
    h.0
}

/// Fine-tunes `student` towards `teacher` on `train` as `job` says.
pub fn finetune(
    student: &mut TrainableDecoder,
    teacher: &TrainableDecoder,
    train: &[Vec<u32>],
    settings: &DistillSettings,
    job: &FinetuneJob<'_>,
    pad: u32,
) -> Result<FinetuneResult> {
    settings.validate()?;
    ensure!(!train.is_empty(), InvalidArgument, "no training sequences");
    let n = student.num_blocks();
    ensure!(
        !job.blocks.is_empty() && job.blocks.end <= n,
        InvalidArgument,
        "blocks {:?} of {n}",
        job.blocks
    );
    let blocks = match settings.scope {
        Scope::Block => job.blocks.clone(),
        Scope::Above => job.blocks.start..n,
    };
    let total = ((settings.updates as f64) * job.budget).round().max(1.0) as u64;
    let peak = job.learning_rate.unwrap_or(settings.learning_rate);
    let schedule = LinearSchedule {
        peak,
        warmup: ((total as f64) * settings.warmup_fraction).ceil() as u64,
        total,
    };
    let params = student.set_trainable(blocks.clone());
    let result = run_updates(
        student, teacher, train, settings, job, pad, &params, &blocks, schedule,
    );
    // Whatever happened, later forwards (evaluation) build no graph.
    student.set_trainable(0..0);
    result
}

#[allow(clippy::too_many_arguments)]
fn run_updates(
    student: &TrainableDecoder,
    teacher: &TrainableDecoder,
    train: &[Vec<u32>],
    settings: &DistillSettings,
    job: &FinetuneJob<'_>,
    pad: u32,
    params: &[(String, candle_core::Var)],
    blocks: &Range<usize>,
    schedule: LinearSchedule,
) -> Result<FinetuneResult> {
    let mut opt = AdamW::new(params.to_vec(), AdamWConfig::default())?;
    let config = serde_json::json!({
        "settings": settings,
        "replaced": [job.blocks.start, job.blocks.end],
        "blocks": [blocks.start, blocks.end],
        "schedule": schedule,
        "bound": job.bound,
        "data_offset": job.data_offset,
    });
    let data_fingerprint = sequences_fingerprint(train);
    let mut start = 0;
    let mut resumed_from = None;
    if let Some(dir) = job.checkpoint_dir {
        if let Some(state) = checkpoint::load_state(dir)? {
            ensure!(
                state.config == config && state.data_fingerprint == data_fingerprint,
                InvalidArgument,
                "the training checkpoint in {} was made with other settings or data; remove \
                 it to start this step's fine-tuning over",
                dir.display()
            );
            checkpoint::restore(dir, &state, params, &mut opt)?;
            start = state.step;
            resumed_from = Some(state.step);
        }
    }
    let vars: Vec<candle_core::Var> = params.iter().map(|(_, v)| v.clone()).collect();
    let (mut loss_sum, mut kl_sum, mut count) = (0.0, 0.0, 0u64);
    let started = Instant::now();
    for u in start..schedule.total {
        let batch = batch_at(train, settings.batch_size, job.data_offset + u, pad);
        let f = distill_forward(
            student,
            teacher,
            &batch,
            blocks.start,
            job.below_unchanged,
            settings,
            job.bound,
        )?;
        let loss_value = f
            .loss
            .to_scalar::<f32>()
            .map_err(candle_error("distillation loss"))? as f64;
        ensure!(
            loss_value.is_finite(),
            Other,
            "the distillation loss is not finite at update {u}: training diverged"
        );
        let mut grads = f.loss.backward().map_err(candle_error("backward"))?;
        clip_grad_norm(&mut grads, &vars, settings.max_grad_norm)?;
        opt.step(&grads, schedule.lr(u))?;
        loss_sum += loss_value;
        kl_sum += f.kl;
        count += 1;
        let done = u + 1;
        if let Some(dir) = job.checkpoint_dir {
            if settings.checkpoint_every > 0
                && done % settings.checkpoint_every == 0
                && done < schedule.total
            {
                checkpoint::save(
                    dir,
                    params,
                    &opt,
                    &TrainState {
                        step: done,
                        total_steps: schedule.total,
                        config: config.clone(),
                        data_fingerprint,
                    },
                )?;
            }
        }
        if job.progress && (done % 10 == 0 || done == schedule.total) {
            eprintln!(
                "  update {done}/{}: loss {loss_value:.4} (KL {:.4}), {:.1} s/update",
                schedule.total,
                f.kl,
                started.elapsed().as_secs_f64() / count as f64
            );
        }
    }
    let c = count.max(1) as f64;
    Ok(FinetuneResult {
        mean_loss: loss_sum / c,
        mean_kl: kl_sum / c,
        updates: schedule.total,
        resumed_from,
        seconds_per_update: started.elapsed().as_secs_f64() / c,
    })
}

/// Held-out sequences with the original model's next-token choices.
pub struct HeldOut {
    batches: Vec<PaddedBatch>,
    /// Per batch, each row's first scored position (0: all of it; an answered chat sequence
    /// scores only the positions that predict its answer).
    scored_from: Vec<Vec<usize>>,
    teacher_top1: Vec<Vec<u32>>,
    /// The original model's perplexity on the held-out text.
    pub teacher_perplexity: f64,
}

/// What one model does on a held-out batch.
struct BatchScore {
    top1: Vec<u32>,
    nll: f64,
    predicted: usize,
    max_abs: Vec<f32>,
}

fn score_batch(
    model: &TrainableDecoder,
    batch: &PaddedBatch,
    scored_from: &[usize],
) -> Result<BatchScore> {
    let ids = ids_tensor(&batch.ids)?;
    let mut max_abs = vec![0f32; model.num_blocks()];
    let x = model.embed(&ids)?;
    let x = model.run_blocks(x, 0..model.num_blocks(), 0, None, |i, h| {
        let m = h
            .abs()
            .and_then(|a| a.max_all())
            .and_then(|m| m.to_scalar::<f32>())
            .map_err(candle_error("evaluation"))?;
        max_abs[i] = max_abs[i].max(m);
        Ok(())
    })?;
    let logits = model.head(&x)?;
    let (b, t) = (batch.ids.len(), batch.ids[0].len());
    let (top1, nll, predicted) = (|| -> CResult<(Vec<u32>, f64, usize)> {
        let top1 = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?;
        let ls = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        // Position p predicts token p + 1 (scored real positions before the last of each row).
        let mut next = vec![0u32; b * t];
        let mut weight = vec![0f32; b * t];
        for (r, row) in batch.ids.iter().enumerate() {
            for p in scored_from[r]..batch.lengths[r].saturating_sub(1) {
                next[r * t + p] = row[p + 1];
                weight[r * t + p] = 1.0;
            }
        }
        let predicted = weight.iter().filter(|&&w| w > 0.0).count();
        let next = Tensor::from_vec(next, (b, t, 1), &Device::Cpu)?;
        let weight = Tensor::from_vec(weight, (b, t), &Device::Cpu)?;
        let picked = ls.gather(&next, D::Minus1)?.squeeze(D::Minus1)?;
        let nll = -((picked * weight)?.sum_all()?.to_scalar::<f32>()? as f64);
        Ok((top1, nll, predicted))
    })()
    .map_err(candle_error("evaluation"))?;
    Ok(BatchScore {
        top1,
        nll,
        predicted,
        max_abs,
    })
}

impl HeldOut {
    /// Batches of `sequences` (of `batch_size`), scored once by `teacher`; sequence i is
    /// scored from position `scored_from[i]` on (empty: every position of every sequence).
    pub fn new(
        teacher: &TrainableDecoder,
        sequences: &[Vec<u32>],
        scored_from: &[usize],
        batch_size: usize,
        pad: u32,
    ) -> Result<Self> {
        ensure!(
            !sequences.is_empty() && batch_size > 0,
            InvalidArgument,
            "no held-out sequences"
        );
        let from = match scored_from.is_empty() {
            true => vec![0; sequences.len()],
            false => scored_from.to_vec(),
        };
        ensure!(
            from.len() == sequences.len()
                && from.iter().zip(sequences).all(|(&f, s)| f + 1 < s.len()),
            InvalidArgument,
            "each held-out sequence needs a scored position before its last"
        );
        let batches: Vec<PaddedBatch> = sequences
            .chunks(batch_size)
            .map(|c| PaddedBatch::new(&c.iter().collect::<Vec<_>>(), pad))
            .collect();
        let scored_from: Vec<Vec<usize>> = from.chunks(batch_size).map(<[usize]>::to_vec).collect();
        let (mut nll, mut predicted) = (0.0, 0usize);
        let mut teacher_top1 = Vec::with_capacity(batches.len());
        for (b, from) in batches.iter().zip(&scored_from) {
            let s = score_batch(teacher, b, from)?;
            nll += s.nll;
            predicted += s.predicted;
            teacher_top1.push(s.top1);
        }
        Ok(HeldOut {
            batches,
            scored_from,
            teacher_top1,
            teacher_perplexity: (nll / predicted.max(1) as f64).exp(),
        })
    }

    /// Top-1 agreement with the original (as `accuracy`), perplexity, largest |hidden|.
    pub fn evaluate(&self, model: &TrainableDecoder) -> Result<Evaluation> {
        let (mut agree, mut positions, mut nll, mut predicted) = (0usize, 0usize, 0.0, 0usize);
        let mut max_abs = vec![0f32; model.num_blocks()];
        for ((b, from), reference) in self
            .batches
            .iter()
            .zip(&self.scored_from)
            .zip(&self.teacher_top1)
        {
            let s = score_batch(model, b, from)?;
            let t = b.ids[0].len();
            for (r, &len) in b.lengths.iter().enumerate() {
                for p in from[r]..len {
                    agree += (s.top1[r * t + p] == reference[r * t + p]) as usize;
                }
                positions += len - from[r];
            }
            nll += s.nll;
            predicted += s.predicted;
            for (m, v) in max_abs.iter_mut().zip(s.max_abs) {
                *m = m.max(v);
            }
        }
        if positions == 0 {
            return Err(Error::InvalidArgument("no held-out positions".into()));
        }
        Ok(Evaluation {
            accuracy: agree as f64 / positions as f64,
            examples: positions,
            max_abs_hidden: max_abs,
            f1: None,
            perplexity: Some((nll / predicted.max(1) as f64).exp()),
        })
    }
}
