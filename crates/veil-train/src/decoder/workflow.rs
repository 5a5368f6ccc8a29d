//! Algorithm 5 for decoders: `substitute_decoder` end to end.
//!
//! **Order.** Stages in the order of [`Operator::DECODER`] restricted to the requested ones:
//! SiLU → ReLU first (the mildest change: the MLP's gate keeps its sign pattern; the paper also
//! starts with the activation), then Softmax → ReLU-normalise (it changes every attention row,
//! harder), then the norms (RMSNorm → x·γ leaves the residual stream's scale to fine-tuning, the
//! hardest; opt-in). Within a stage the blocks go top-down by default, as the paper's: a step's
//! blocks below are still as trained before, and the step's fine-tuning runs only the blocks at
//! and above the replaced one.
//! With `blocks_per_step` = k (per stage) a step replaces k neighbouring blocks and fine-tunes
//! once for them (k ≥ the block count: a whole stage in one step, then one distillation): a
//! SmolLM2 step costs 12–20 minutes here, so 60 one-block steps outlast any session.
//!
//! **Acceptance.** A step is kept when the held-out top-1 agreement with the original is at
//! least the threshold (`SubstitutionConfig::min_accuracy`), else rolled back (after the
//! optional retries with more updates).
//!
//! **Resuming.** The progress folder `out/progress` holds the accepted stage after every step
//! and each running step's training checkpoint; running the same command again continues. The
//! per-step reports `out/steps.{json,md}` are rewritten after every step; the finished run
//! writes `out/substitution.{json,md}` and the model (a stage folder plus a Hugging Face folder,
//! [`super::stage`]).
//!
//! **Cost.** The measured seconds per update and per evaluation that chose the trainable
//! parameters and the run's budget are in [`super::distill`]'s docs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};
use veil_model::decoder::{
    DecoderActivation, DecoderBlockVariant, DecoderNormKind, DecoderTokenizer,
};
use veil_model::AttentionNorm;

use super::answers::{answer_all, chat_prompts};
use super::data::{read_all, sequences};
use super::distill::{finetune, sequences_fingerprint, DistillSettings, FinetuneJob, HeldOut};
use super::model::TrainableDecoder;
use super::stage::{apply_stage, save_stage, write_hf_folder};
use crate::checkpoint::{io_err, write_json_atomically};
use crate::substitute::{
    run_substitution, BlockOrder, FinetuneRequest, Finetuned, Operator, Resume, RunOutcome, Stage,
    StepRecord, SubstitutionConfig, SubstitutionReport, SubstitutionTarget,
};
use crate::train::{Evaluation, Fnv};

/// Replaces `op` in a decoder block's `variant` by its privacy-friendly substitute; SiLU by
/// `silu_to` (ReLU or hard-swish).
pub fn substituted_decoder(
    variant: DecoderBlockVariant,
    op: Operator,
    silu_to: DecoderActivation,
) -> Result<DecoderBlockVariant> {
    Ok(match op {
        Operator::Silu => {
            ensure!(
                silu_to != DecoderActivation::Original,
                InvalidArgument,
                "SiLU's substitute must be ReLU or hard-swish, not the original"
            );
            DecoderBlockVariant {
                activation: silu_to,
                ..variant
            }
        }
        Operator::Softmax => DecoderBlockVariant {
            attention: AttentionNorm::ReluNormalise,
            ..variant
        },
        Operator::RmsNorm1 => DecoderBlockVariant {
            attn_norm: DecoderNormKind::Scale,
            ..variant
        },
        Operator::RmsNorm2 => DecoderBlockVariant {
            mlp_norm: DecoderNormKind::Scale,
            ..variant
        },
        Operator::Gelu | Operator::LayerNorm1 | Operator::LayerNorm2 => {
            return Err(Error::InvalidArgument(format!(
                "{} is an encoder operator: a decoder has SiLU, Softmax, RMS1 and RMS2",
                op.label()
            )))
        }
    })
}

/// The text a run distils on and is judged by, made from the dataset files' sentences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecoderText {
    /// Chat prompts answered by the original ([`super::answers`]); the evaluation scores the
    /// answer positions.
    Answers,
    /// Unanswered chat prompts and plain running text ([`super::data::sequences`]); the
    /// evaluation scores every position.
    Mix,
}

/// Options of [`substitute_decoder`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DecoderSubstituteOptions {
    /// The original model, as `--model` takes it (built-in name, GGUF file, HF folder).
    pub model: String,
    /// Output folder (progress, reports, model).
    pub out: PathBuf,
    /// Text for training (dataset files; labels ignored).
    pub train_files: Vec<PathBuf>,
    /// Held-out text for the evaluation.
    pub held_out_files: Vec<PathBuf>,
    /// The kind of text.
    pub text: DecoderText,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Training sequences kept (0: all).
    pub train_sequences: usize,
    /// Held-out sequences.
    pub held_out_sequences: usize,
    /// Held-out sequences per evaluation batch.
    pub eval_batch_size: usize,
    /// The fine-tuning of every step.
    pub settings: DistillSettings,
    /// Operators to replace, in stage order.
    pub operators: Vec<Operator>,
    /// What SiLU becomes: hard-swish (the default: untrained in all 30 SmolLM2 blocks it keeps
    /// 80 % next-token agreement where ReLU keeps 6 %) or ReLU (cheaper: no products).
    pub silu_substitute: DecoderActivation,
    /// Block order within a stage.
    pub block_order: BlockOrder,
    /// Blocks a step replaces and fine-tunes together: one value for every stage, or one per
    /// operator of `operators`.
    pub blocks_per_step: Vec<usize>,
    /// Accept a step when its top-1 agreement is ≥ this.
    pub threshold: f64,
    /// Retries of a rejected step.
    pub retries: u32,
    /// Update growth per retry.
    pub retry_factor: f64,
    /// Seed of the data shuffles.
    pub seed: u64,
    /// Stop after this many steps (the run continues when started again).
    #[serde(skip)]
    pub stop_after_steps: Option<usize>,
    /// Progress on stderr.
    #[serde(skip)]
    pub progress: bool,
}

impl DecoderSubstituteOptions {
    /// Defaults for `model` into `out` with the given text files.
    pub fn new(
        model: impl Into<String>,
        out: impl Into<PathBuf>,
        train_files: Vec<PathBuf>,
        held_out_files: Vec<PathBuf>,
    ) -> Self {
        DecoderSubstituteOptions {
            model: model.into(),
            out: out.into(),
            train_files,
            held_out_files,
            text: DecoderText::Answers,
            seq_len: 128,
            train_sequences: 1024,
            held_out_sequences: 48,
            eval_batch_size: 8,
            settings: DistillSettings::default(),
            operators: vec![Operator::Silu, Operator::Softmax],
            silu_substitute: DecoderActivation::HardSwish,
            block_order: BlockOrder::Down,
            blocks_per_step: vec![1],
            threshold: 0.9,
            retries: 0,
            retry_factor: 2.0,
            seed: 0,
            stop_after_steps: None,
            progress: false,
        }
    }

    fn substitution_config(&self) -> Result<SubstitutionConfig> {
        ensure!(
            !self.operators.is_empty(),
            InvalidArgument,
            "no operators to replace"
        );
        ensure!(
            self.blocks_per_step.len() == 1 || self.blocks_per_step.len() == self.operators.len(),
            InvalidArgument,
            "blocks per step: one value, or one per operator ({} given for {} operators)",
            self.blocks_per_step.len(),
            self.operators.len()
        );
        let mut stages: Vec<Stage> = Vec::new();
        for (i, &op) in self.operators.iter().enumerate() {
            substituted_decoder(DecoderBlockVariant::ORIGINAL, op, self.silu_substitute)?;
            ensure!(
                !stages.iter().any(|s| s.operator == op),
                InvalidArgument,
                "operator {} given twice",
                op.label()
            );
            stages.push(Stage {
                operator: op,
                bound: None,
                learning_rate: None,
                blocks_per_step: self.blocks_per_step[i.min(self.blocks_per_step.len() - 1)],
            });
        }
        ensure!(
            (0.0..=1.0).contains(&self.threshold),
            InvalidArgument,
            "the agreement threshold must be in [0, 1], got {}",
            self.threshold
        );
        Ok(SubstitutionConfig {
            stages,
            max_accuracy_drop: 0.0,
            retries: self.retries,
            retry_factor: self.retry_factor,
            block_order: self.block_order,
            min_accuracy: Some(self.threshold),
        })
    }
}

/// The decoder as a [`SubstitutionTarget`].
struct DecoderTarget<'a> {
    student: TrainableDecoder,
    teacher: &'a TrainableDecoder,
    base: String,
    changed: BTreeSet<usize>,
    train: &'a [Vec<u32>],
    held_out: &'a HeldOut,
    settings: &'a DistillSettings,
    silu_to: DecoderActivation,
    pad: u32,
    progress: bool,
}

fn is_block_param(name: &str) -> bool {
    name.starts_with("layers.")
}

impl SubstitutionTarget for DecoderTarget<'_> {
    type Snapshot = (
        Vec<DecoderBlockVariant>,
        BTreeSet<usize>,
        Vec<(String, Tensor)>,
    );

    fn num_blocks(&self) -> usize {
        self.student.num_blocks()
    }

    fn snapshot(&self) -> Result<Self::Snapshot> {
        Ok((
            self.student.variants().to_vec(),
            self.changed.clone(),
            self.student.values(is_block_param)?,
        ))
    }

    fn restore(&mut self, (variants, changed, values): &Self::Snapshot) -> Result<()> {
        for (i, v) in variants.iter().enumerate() {
            self.student.set_variant(i, *v)?;
        }
        self.changed = changed.clone();
        self.student.set_values(values.iter().map(|(n, t)| (n, t)))
    }

    fn save(&self, dir: &Path) -> Result<()> {
        save_stage(dir, &self.student, &self.base, &self.changed)
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        // Back to the base, then the stage's changes.
        let base = self.teacher.values(is_block_param)?;
        self.student.set_values(base.iter().map(|(n, t)| (n, t)))?;
        let info = apply_stage(dir, &mut self.student)?;
        self.changed = info.changed_blocks.into_iter().collect();
        Ok(())
    }

    fn substitute(&mut self, op: Operator, block: usize) -> Result<()> {
        let current = self.student.variants()[block];
        self.student
            .set_variant(block, substituted_decoder(current, op, self.silu_to)?)
    }

    fn finetune(&mut self, request: &FinetuneRequest<'_>) -> Result<Finetuned> {
        let op_index = Operator::DECODER
            .iter()
            .position(|&o| o == request.operator)
            .unwrap_or(Operator::DECODER.len()) as u64;
        let n = self.student.num_blocks() as u64;
        let job = FinetuneJob {
            blocks: request.blocks.clone(),
            budget: request.budget,
            learning_rate: request.learning_rate,
            bound: request.bound,
            checkpoint_dir: request.checkpoint_dir,
            // Each step starts at its own place in the data.
            data_offset: (op_index * n + request.blocks.start as u64) * 1_000_003,
            below_unchanged: (0..request.blocks.start)
                .all(|b| !self.changed.contains(&b) && self.student.variants()[b].is_original()),
            progress: self.progress,
        };
        let r = finetune(
            &mut self.student,
            self.teacher,
            self.train,
            self.settings,
            &job,
            self.pad,
        )?;
        let end = match self.settings.scope {
            super::distill::Scope::Block => request.blocks.end,
            super::distill::Scope::Above => self.student.num_blocks(),
        };
        self.changed.extend(request.blocks.start..end);
        Ok(Finetuned {
            mean_loss: r.mean_loss,
            updates: r.updates,
            resumed_from: r.resumed_from,
        })
    }

    fn evaluate(&mut self) -> Result<Evaluation> {
        self.held_out.evaluate(&self.student)
    }
}

/// The per-step report written after every step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepsReport {
    /// The original model.
    pub model: String,
    /// The original's held-out perplexity (its agreement with itself is 1).
    pub original_perplexity: f64,
    /// The acceptance threshold on top-1 agreement.
    pub threshold: f64,
    /// What SiLU becomes.
    pub silu_substitute: DecoderActivation,
    /// Steps so far.
    pub steps: Vec<StepRecord>,
}

fn steps_markdown(r: &StepsReport) -> String {
    let mut s = format!(
        "# Decoder substitution of {}\n\nOriginal held-out perplexity {:.3}; a step is accepted \
         when its top-1 agreement with the original is ≥ {:.3}; SiLU becomes {:?}.\n\n\
         | # | operator | block | agreement | perplexity | train loss | accepted | seconds |\n\
         |---|---|---|---|---|---|---|---|\n",
        r.model, r.original_perplexity, r.threshold, r.silu_substitute
    );
    for (k, st) in r.steps.iter().enumerate() {
        s.push_str(&format!(
            "| {} | {} | {} | {:.4} | {} | {:.4} | {} | {:.0}{} |\n",
            k,
            st.operator.label(),
            st.blocks_label(),
            st.accuracy,
            st.perplexity.map_or("–".into(), |p| format!("{p:.3}")),
            st.train_loss,
            if st.accepted { "yes" } else { "no" },
            st.seconds,
            if st.resumed { " (resumed)" } else { "" },
        ));
    }
    s
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| io_err("cannot write", path, e))
}

/// How [`substitute_decoder`] ended.
#[derive(Clone, Debug)]
pub enum DecoderOutcome {
    /// Every step done.
    Finished(Box<SubstitutionReport>),
    /// Stopped after `--max-steps`; running again continues.
    Stopped {
        /// Steps done so far.
        steps_done: usize,
        /// Steps of the whole run.
        total_steps: usize,
    },
}

/// A decoder loaded for training: its candle model and tokenizer.
pub fn load_trainable(spec: &str) -> Result<(TrainableDecoder, DecoderTokenizer)> {
    let m = veil_model::decoder::load(spec)?;
    Ok((TrainableDecoder::from_weights(&m.weights)?, m.tokenizer))
}

/// The id padding fills batches with (never scored).
pub fn pad_id(model: &TrainableDecoder) -> u32 {
    model.config().eos_token_ids.first().copied().unwrap_or(0)
}

/// How `spec` is recorded: a built-in name as is, a path made absolute.
pub fn base_name(spec: &str) -> String {
    let p = Path::new(spec);
    match p.exists() {
        true => std::fs::canonicalize(p).map_or(spec.to_string(), |a| a.display().to_string()),
        false => spec.to_string(),
    }
}

fn hash_weights(model: &TrainableDecoder) -> Result<u64> {
    let mut h = Fnv::new();
    for (name, var) in model.params() {
        name.bytes().for_each(|b| h.eat(b as u32));
        let values = var
            .as_tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(veil_model::candle_error("hashing the weights"))?;
        values.iter().for_each(|v| h.eat(v.to_bits()));
    }
    Ok(h.0)
}

/// Runs Algorithm 5 on a decoder (module docs); resumable from `opts.out/progress`.
pub fn substitute_decoder(opts: &DecoderSubstituteOptions) -> Result<DecoderOutcome> {
    opts.settings.validate()?;
    let config = opts.substitution_config()?;
    ensure!(
        opts.seq_len >= 2,
        InvalidArgument,
        "sequences need at least 2 tokens"
    );
    ensure!(
        opts.held_out_sequences > 0 && opts.eval_batch_size > 0,
        InvalidArgument,
        "the evaluation needs held-out sequences and a batch size > 0"
    );
    ensure!(
        opts.text == DecoderText::Mix || opts.train_sequences > 0,
        InvalidArgument,
        "answered text is generated sequence by sequence: give a number of training sequences"
    );
    ensure!(
        !opts.train_files.is_empty() && !opts.held_out_files.is_empty(),
        InvalidArgument,
        "training and held-out text files are needed"
    );
    let started = Instant::now();
    let (teacher, tokenizer) = load_trainable(&opts.model)?;
    ensure!(
        opts.seq_len <= teacher.config().max_positions,
        InvalidArgument,
        "sequence length {} exceeds the model's {} positions",
        opts.seq_len,
        teacher.config().max_positions
    );
    let pad = pad_id(&teacher);
    std::fs::create_dir_all(&opts.out).map_err(|e| io_err("cannot create", &opts.out, e))?;
    let weights_hash = hash_weights(&teacher)?;
    let text = |files: &[PathBuf], seed: u64, limit: usize, kind: &str| match opts.text {
        DecoderText::Mix => Ok((
            sequences(&tokenizer, &read_all(files)?, opts.seq_len, seed, limit)?,
            Vec::new(),
        )),
        DecoderText::Answers => {
            // A prompt takes at most half the length: the rest is the answer's.
            let prompts =
                chat_prompts(&tokenizer, &read_all(files)?, seed, limit, opts.seq_len / 2)?;
            let cache = opts.out.join(format!("answers-{kind}.json"));
            let answered = answer_all(
                &teacher,
                weights_hash,
                &prompts,
                opts.seq_len,
                &cache,
                opts.progress,
            )?;
            let from = answered.iter().map(|a| a.prompt_len - 1).collect();
            Ok::<_, Error>((answered.into_iter().map(|a| a.ids).collect(), from))
        }
    };
    // Held-out first: an evaluation set is needed whatever the training text's size.
    let (held, held_from) = text(
        &opts.held_out_files,
        opts.seed.wrapping_add(1),
        opts.held_out_sequences,
        "held-out",
    )?;
    let (train, _) = text(&opts.train_files, opts.seed, opts.train_sequences, "train")?;
    if opts.progress {
        eprintln!(
            "{} training and {} held-out sequences of ≤ {} tokens ({:.1} s to load)",
            train.len(),
            held.len(),
            opts.seq_len,
            started.elapsed().as_secs_f64()
        );
    }
    let held_out = HeldOut::new(&teacher, &held, &held_from, opts.eval_batch_size, pad)?;
    if opts.progress {
        eprintln!(
            "original held-out perplexity {:.3} ({:.1} s so far)",
            held_out.teacher_perplexity,
            started.elapsed().as_secs_f64()
        );
    }
    let base = base_name(&opts.model);
    let json_err = |e: serde_json::Error| Error::Other(e.to_string());
    let mut fingerprint = serde_json::Map::new();
    fingerprint.insert("model".into(), base.clone().into());
    fingerprint.insert(
        "model_weights".into(),
        format!("{weights_hash:016x}").into(),
    );
    fingerprint.insert(
        "train_data".into(),
        format!("{:016x}", sequences_fingerprint(&train)).into(),
    );
    fingerprint.insert(
        "held_out_data".into(),
        format!("{:016x}", sequences_fingerprint(&held)).into(),
    );
    fingerprint.insert("held_out_scored_from".into(), held_from.clone().into());
    fingerprint.insert(
        "settings".into(),
        serde_json::to_value(&opts.settings).map_err(json_err)?,
    );
    fingerprint.insert("eval_batch_size".into(), opts.eval_batch_size.into());
    fingerprint.insert(
        "silu_substitute".into(),
        serde_json::to_value(opts.silu_substitute).map_err(json_err)?,
    );
    let (student, _) = load_trainable(&opts.model)?;
    let mut target = DecoderTarget {
        student,
        teacher: &teacher,
        base: base.clone(),
        changed: BTreeSet::new(),
        train: &train,
        held_out: &held_out,
        settings: &opts.settings,
        silu_to: opts.silu_substitute,
        pad,
        progress: opts.progress,
    };
    let progress_dir = opts.out.join("progress");
    let resume = Resume {
        dir: &progress_dir,
        fingerprint,
        stop_after: opts.stop_after_steps,
    };
    let mut report = StepsReport {
        model: opts.model.clone(),
        original_perplexity: held_out.teacher_perplexity,
        threshold: opts.threshold,
        silu_substitute: opts.silu_substitute,
        steps: vec![],
    };
    let mut write_error: Option<Error> = None;
    let out = opts.out.clone();
    let progress = opts.progress;
    let outcome = run_substitution(&mut target, &config, Some(&resume), |step| {
        if progress {
            eprintln!(
                "{} block {}: agreement {:.4}, perplexity {} → {}{} ({:.0} s)",
                step.operator.label(),
                step.blocks_label(),
                step.accuracy,
                step.perplexity.map_or("–".into(), |p| format!("{p:.3}")),
                if step.accepted {
                    "accepted"
                } else {
                    "rejected"
                },
                if step.resumed { " (resumed)" } else { "" },
                step.seconds
            );
        }
        report.steps.push(step.clone());
        let written = write_json_atomically(&out.join("steps.json"), &report)
            .and_then(|_| write_text(&out.join("steps.md"), &steps_markdown(&report)));
        if let Err(e) = written {
            write_error.get_or_insert(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e);
    }
    let report = match outcome {
        RunOutcome::Finished(r) => r,
        RunOutcome::Stopped {
            steps_done,
            total_steps,
        } => {
            return Ok(DecoderOutcome::Stopped {
                steps_done,
                total_steps,
            })
        }
    };
    save_stage(&opts.out, &target.student, &base, &target.changed)?;
    write_hf_folder(&opts.out, &target.student, &tokenizer)?;
    write_json_atomically(&opts.out.join("substitution.json"), &report)?;
    let mut md = steps_markdown(&StepsReport {
        model: opts.model.clone(),
        original_perplexity: held_out.teacher_perplexity,
        threshold: opts.threshold,
        silu_substitute: opts.silu_substitute,
        steps: report.steps.clone(),
    });
    md.push_str(&format!(
        "\nFinal: agreement {:.4}, perplexity {}; replaced {}.\n",
        report.final_evaluation.accuracy,
        report
            .final_evaluation
            .perplexity
            .map_or("–".into(), |p| format!("{p:.3}")),
        config
            .stages
            .iter()
            .map(|s| format!(
                "{} {}/{}",
                s.operator.label(),
                report.replaced(s.operator),
                report.num_blocks
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    write_text(&opts.out.join("substitution.md"), &md)?;
    Ok(DecoderOutcome::Finished(Box::new(report)))
}
