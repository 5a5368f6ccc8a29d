//! The substitution workflow (paper Algorithm 5, §3.3 and §4.2).
//!
//! For each operator type in turn (GELU → ReLU, Softmax → ReLU-normalise, LN1 and LN2 →
//! centring plus affine), with that stage's hidden-state bound B (and optionally its own
//! learning rate), and for block i = n−1 down to 0 (or, with [`BlockOrder::Up`], 0 up to
//! n−1): replace the operator in block i of the accepted model, fine-tune with blocks 0 … i−1
//! frozen, evaluate on dev, and keep the change only if accuracy > α − Δα, where α is the
//! original model's accuracy. With [`Stage::blocks_per_step`] = k > 1 a step of that stage
//! replaces k neighbouring blocks at once (in the same order, the last group smaller when k
//! does not divide n) and fine-tunes once for them, frozen below the lowest: n/k fine-tunings
//! a stage instead of n, for models whose per-step training is too slow to visit every block.
//! A rejected change is rolled back to the accepted model's parameters and variants; with
//! [`SubstitutionConfig::retries`] it is first tried again from the accepted model with F×,
//! F²×, … the updates.
//!
//! Runs take hours on a small machine and may be killed at any moment, so with a [`Resume`]
//! folder the loop persists its progress after every step: the accepted model's state (through
//! [`SubstitutionTarget::save`]) and the step records so far. Running again with the same
//! fingerprint skips the completed steps (their records are reloaded) and the fine-tuning of
//! the interrupted step continues from its own training checkpoint. Folder layout:
//!
//! * `progress.json` — a [`SavedProgress`]: fingerprint, original and accepted evaluations,
//!   completed steps, rejected attempts of the step in progress, and the name of the state
//!   folder. Written last and atomically (temporary file + rename), so it always names a
//!   complete state: a crash leaves the previous step's progress valid.
//! * `state-<k>/` — the accepted model after step k (whatever the target's `save` writes; for
//!   the transformer `params.safetensors` and `variants.json`). Absent until a step is
//!   accepted: the starting model is the state then. Older states are removed once superseded.
//! * `step-<k>-attempt-<r>/` — the training checkpoint of attempt r of step k while it runs;
//!   removed once the attempt's outcome is in `progress.json`.
//!
//! The loop is written against [`SubstitutionTarget`] so it can be tested with scripted
//! accuracies and run on the real model through an adapter.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use veil_core::{bail, ensure, Error, Result};

use crate::checkpoint::{io_err, write_json_atomically};
use crate::train::Evaluation;

/// The operator types the workflow replaces, in the paper's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operator {
    /// GELU of the feed-forward network → ReLU.
    Gelu,
    /// Attention softmax → ReLU(x) / (Σ ReLU(x) + ε).
    Softmax,
    /// LayerNorm after attention → (x − mean)·γ + β.
    LayerNorm1,
    /// LayerNorm after the feed-forward network → (x − mean)·γ + β.
    LayerNorm2,
    /// SiLU of a decoder's gated MLP → ReLU.
    Silu,
    /// A decoder's RMSNorm before attention → x·γ.
    RmsNorm1,
    /// A decoder's RMSNorm before the MLP → x·γ.
    RmsNorm2,
}

impl Operator {
    /// Every operator, in the paper's stage order.
    pub const ALL: [Operator; 4] = [
        Operator::Gelu,
        Operator::Softmax,
        Operator::LayerNorm1,
        Operator::LayerNorm2,
    ];

    /// A decoder's operators, in the decoder workflow's default stage order (see
    /// `crate::decoder::workflow`): Softmax is shared with encoders (causal there).
    pub const DECODER: [Operator; 4] = [
        Operator::Silu,
        Operator::Softmax,
        Operator::RmsNorm1,
        Operator::RmsNorm2,
    ];

    /// The paper's column name.
    pub fn label(self) -> &'static str {
        match self {
            Operator::Gelu => "GELU",
            Operator::Softmax => "Softmax",
            Operator::LayerNorm1 => "LN1",
            Operator::LayerNorm2 => "LN2",
            Operator::Silu => "SiLU",
            Operator::RmsNorm1 => "RMS1",
            Operator::RmsNorm2 => "RMS2",
        }
    }

    /// Whether an encoder block has this operator.
    pub fn is_encoder_operator(self) -> bool {
        Operator::ALL.contains(&self)
    }
}

impl std::str::FromStr for Operator {
    type Err = Error;

    /// The label, in any case (`gelu`, `softmax`, `ln1`, `ln2`; decoders: `silu`, `rms1`,
    /// `rms2`).
    fn from_str(s: &str) -> Result<Operator> {
        Operator::ALL
            .into_iter()
            .chain(Operator::DECODER)
            .find(|op| op.label().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown operator {s:?}: expected GELU, Softmax, LN1 or LN2 (encoders), \
                     SiLU, Softmax, RMS1 or RMS2 (decoders)"
                ))
            })
    }
}

/// One pass over all blocks for one operator type.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// The operator replaced.
    pub operator: Operator,
    /// Hidden-state bound B for the fine-tuning of this stage (`None` = ∞).
    pub bound: Option<f64>,
    /// Peak learning rate of this stage's fine-tuning (`None`: the training settings' own);
    /// some operators recover with gentler or bolder steps than others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
    /// Blocks a step of this stage replaces together (1: the paper's one block a step); an
    /// operator the model tolerates everywhere untrained can go in a few steps.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub blocks_per_step: usize,
}

/// The paper's schedule: GELU (B = ∞), Softmax (32), LN1 (24), LN2 (16).
pub fn paper_stages() -> Vec<Stage> {
    let bounds = [None, Some(32.0), Some(24.0), Some(16.0)];
    Operator::ALL
        .into_iter()
        .zip(bounds)
        .map(|(operator, bound)| Stage {
            operator,
            bound,
            learning_rate: None,
            blocks_per_step: 1,
        })
        .collect()
}

/// The order in which a stage visits the blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockOrder {
    /// n−1 down to 0, as the paper: each step trains only the blocks at and above the
    /// replaced one, which were changed least by the stage so far.
    #[default]
    Down,
    /// 0 up to n−1: each step can still adapt every block above the replaced one, including
    /// the ones replaced later. Blocks below the replaced one stay frozen either way.
    Up,
}

/// Settings of the workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubstitutionConfig {
    /// The stages, in order.
    pub stages: Vec<Stage>,
    /// Δα, as a fraction (0.02 = two accuracy points).
    pub max_accuracy_drop: f64,
    /// How often a rejected step is tried again, from the accepted model, with a larger
    /// budget before it is rolled back for good (0: the paper's single attempt). A step that
    /// only needed more training to recover is then kept.
    pub retries: u32,
    /// Budget growth per retry: retry r fine-tunes with `retry_factor`^r times the updates.
    pub retry_factor: f64,
    /// The order blocks are visited in within a stage.
    pub block_order: BlockOrder,
    /// An absolute acceptance floor: when set, a step is kept iff its accuracy is ≥ this
    /// (the decoder workflow's top-1 agreement with the original), instead of > α − Δα.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_accuracy: Option<f64>,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// Far more retries than any budget allows (each one multiplies the updates).
const MAX_RETRIES: u32 = 64;

impl Default for SubstitutionConfig {
    fn default() -> Self {
        SubstitutionConfig {
            stages: paper_stages(),
            max_accuracy_drop: 0.02,
            retries: 0,
            retry_factor: 2.0,
            block_order: BlockOrder::Down,
            min_accuracy: None,
        }
    }
}

impl SubstitutionConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            (0.0..1.0).contains(&self.max_accuracy_drop),
            InvalidArgument,
            "Δα must be a fraction in [0, 1), got {}",
            self.max_accuracy_drop
        );
        if let Some(m) = self.min_accuracy {
            ensure!(
                (0.0..=1.0).contains(&m),
                InvalidArgument,
                "the acceptance threshold must be a fraction in [0, 1], got {m}"
            );
        }
        ensure!(
            !self.stages.is_empty(),
            InvalidArgument,
            "no substitution stages"
        );
        ensure!(
            self.retries <= MAX_RETRIES,
            InvalidArgument,
            "at most {MAX_RETRIES} retries, got {}",
            self.retries
        );
        // Retrying with the same budget would repeat the same seeded run.
        ensure!(
            self.retry_factor > 1.0 && self.retry_factor.powi(self.retries as i32).is_finite(),
            InvalidArgument,
            "the retry factor must be > 1 (and its power per retry finite), got {}",
            self.retry_factor
        );
        for stage in &self.stages {
            ensure!(
                stage.blocks_per_step > 0,
                InvalidArgument,
                "a {} step replaces at least one block",
                stage.operator.label()
            );
            if let Some(b) = stage.bound {
                ensure!(
                    b.is_finite() && b > 0.0,
                    InvalidArgument,
                    "stage bound must be > 0, got {b}"
                );
            }
            if let Some(lr) = stage.learning_rate {
                ensure!(
                    lr.is_finite() && lr > 0.0,
                    InvalidArgument,
                    "{} stage learning rate must be > 0, got {lr}",
                    stage.operator.label()
                );
            }
        }
        Ok(())
    }

    /// The groups of blocks `stage` visits, in order; each a range of neighbours.
    fn groups(&self, stage: &Stage, blocks: usize) -> Vec<Range<usize>> {
        let order: Vec<usize> = match self.block_order {
            BlockOrder::Down => (0..blocks).rev().collect(),
            BlockOrder::Up => (0..blocks).collect(),
        };
        order
            .chunks(stage.blocks_per_step.max(1))
            .map(|g| {
                let (lo, hi) = (g.iter().min(), g.iter().max());
                lo.copied().unwrap_or(0)..hi.map_or(0, |h| h + 1)
            })
            .collect()
    }

    /// Every step in order: (stage, its blocks).
    fn schedule(&self, blocks: usize) -> Vec<(Stage, Range<usize>)> {
        self.stages
            .iter()
            .flat_map(|&stage| {
                self.groups(&stage, blocks)
                    .into_iter()
                    .map(move |g| (stage, g))
            })
            .collect()
    }
}

/// One fine-tuning run of a step.
#[derive(Clone, Debug)]
pub struct FinetuneRequest<'a> {
    /// The operator replaced.
    pub operator: Operator,
    /// The blocks it was replaced in; blocks `0 .. blocks.start` stay frozen.
    pub blocks: Range<usize>,
    /// Hidden-state bound B (`None` = ∞).
    pub bound: Option<f64>,
    /// Multiple of the configured number of updates: 1 for a step's first attempt, F^r for
    /// its r-th retry.
    pub budget: f64,
    /// The stage's learning rate, if it has its own.
    pub learning_rate: Option<f64>,
    /// Where the run keeps its training checkpoint; one found there is continued (the run was
    /// interrupted). `None`: no checkpoints.
    pub checkpoint_dir: Option<&'a Path>,
}

/// What a fine-tuning run did.
#[derive(Clone, Debug, PartialEq)]
pub struct Finetuned {
    /// Mean training loss over the updates this invocation ran.
    pub mean_loss: f64,
    /// Updates of the whole run.
    pub updates: u64,
    /// The update an interrupted run was continued from, if it was.
    pub resumed_from: Option<u64>,
}

/// What the workflow needs from a model: swap an operator, fine-tune, evaluate, roll back, and
/// persist its state for a later process.
pub trait SubstitutionTarget {
    /// Enough state to undo a rejected step (parameters and operator variants).
    type Snapshot;

    /// Encoder blocks of the model.
    fn num_blocks(&self) -> usize;
    /// The current state, to roll back to.
    fn snapshot(&self) -> Result<Self::Snapshot>;
    /// Rolls back to a snapshot.
    fn restore(&mut self, snapshot: &Self::Snapshot) -> Result<()>;
    /// Writes the current state (what a snapshot holds) into the new folder `dir`.
    fn save(&self, dir: &Path) -> Result<()>;
    /// Replaces the current state by what [`Self::save`] wrote into `dir`.
    fn load(&mut self, dir: &Path) -> Result<()>;
    /// Replaces `operator` in `block` by its privacy-friendly substitute.
    fn substitute(&mut self, operator: Operator, block: usize) -> Result<()>;
    /// Fine-tunes as `request` says.
    fn finetune(&mut self, request: &FinetuneRequest<'_>) -> Result<Finetuned>;
    /// Accuracy on the dev set and the largest |hidden state| per block.
    fn evaluate(&mut self) -> Result<Evaluation>;
}

/// One substitution step: an operator in a block (or a group of neighbours), kept or rolled
/// back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The operator replaced.
    pub operator: Operator,
    /// The block, or the lowest of the step's group.
    pub block: usize,
    /// How many blocks from `block` up the step replaced.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub span: usize,
    /// The stage's hidden-state bound B (`None`: ∞).
    pub bound: Option<f64>,
    /// Mean training loss of the fine-tuning.
    pub train_loss: f64,
    /// Dev accuracy after the step.
    pub accuracy: f64,
    /// Dev F1 of class 1 on a two-class task ([`Evaluation::f1`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    /// Held-out perplexity of a language model ([`Evaluation::perplexity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// Whether the step was kept.
    pub accepted: bool,
    /// Largest |hidden value| per block on the dev set.
    pub max_abs_hidden: Vec<f32>,
    /// Time this step took in the invocation that finished it.
    pub seconds: f64,
    /// Whether an earlier, interrupted invocation did (some of) this step's work: the step was
    /// finished before and its record reloaded, or some of its attempts were, or its
    /// fine-tuning continued a checkpoint.
    #[serde(default)]
    pub resumed: bool,
    /// Every fine-tuning of the step: the first, then the retries of a rejected one. The
    /// fields above are the last attempt's.
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
}

impl StepRecord {
    /// The blocks the step replaced.
    pub fn blocks(&self) -> Range<usize> {
        self.block..self.block + self.span
    }

    /// `7`, or `25–29` for a group.
    pub fn blocks_label(&self) -> String {
        match self.span {
            1 => self.block.to_string(),
            _ => format!("{}–{}", self.block, self.block + self.span - 1),
        }
    }
}

/// One fine-tuning and evaluation of a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 0 for the first, r for the r-th retry.
    pub attempt: u32,
    /// Updates of the fine-tuning run.
    pub updates: u64,
    /// Mean training loss over the updates the invocation that finished the attempt ran.
    pub train_loss: f64,
    /// Dev accuracy after the step.
    pub accuracy: f64,
    /// Held-out perplexity of a language model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// Largest |hidden value| per block on the dev set.
    pub max_abs_hidden: Vec<f32>,
    /// The update an interrupted fine-tuning was continued from.
    pub resumed_from: Option<u64>,
    /// Wall time of the attempt.
    pub seconds: f64,
}

/// The accepted model at the end of a stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    /// The operator replaced.
    pub operator: Operator,
    /// The stage's hidden-state bound B (`None`: ∞).
    pub bound: Option<f64>,
    /// Blocks whose operator of this type was replaced and kept.
    pub replaced_blocks: Vec<usize>,
    /// Dev accuracy of the accepted model after the stage.
    pub accuracy: f64,
    /// Its dev F1 on a two-class task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
}

/// Everything the workflow did, for the JSON/Markdown/SVG reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubstitutionReport {
    /// Blocks of the model.
    pub num_blocks: usize,
    /// Δα, the accuracy drop a step may cause.
    pub max_accuracy_drop: f64,
    /// Evaluation of the model before any substitution.
    pub original: Evaluation,
    /// α − Δα: a step is accepted when its accuracy is strictly above this (or, with
    /// [`SubstitutionConfig::min_accuracy`], that floor: accepted when at least this).
    pub threshold: f64,
    /// Every step, in order.
    pub steps: Vec<StepRecord>,
    /// Every stage's result.
    pub stages: Vec<StageRecord>,
    /// Evaluation of the final accepted model.
    pub final_evaluation: Evaluation,
    /// Time of every invocation that worked on the run.
    pub seconds: f64,
}

impl SubstitutionReport {
    /// How many operators of `op` the final model has replaced (a row of the paper's Table 3).
    pub fn replaced(&self, op: Operator) -> usize {
        self.stages
            .iter()
            .filter(|s| s.operator == op)
            .map(|s| s.replaced_blocks.len())
            .sum()
    }

    /// Steps an earlier, interrupted invocation worked on.
    pub fn resumed_steps(&self) -> usize {
        self.steps.iter().filter(|s| s.resumed).count()
    }
}

/// Where a run keeps its progress (see the module docs for the layout), and what it depends on.
#[derive(Clone, Debug)]
pub struct Resume<'a> {
    /// The progress folder; created if missing, continued if it holds progress.
    pub dir: &'a Path,
    /// What the run depends on besides the [`SubstitutionConfig`] (model, data, training
    /// settings). Progress saved under another fingerprint is refused: continuing it would mix
    /// two different runs.
    pub fingerprint: Map<String, Value>,
    /// Stop once this many steps are done (counting earlier invocations), for time-boxed runs.
    pub stop_after: Option<usize>,
}

const PROGRESS_FILE: &str = "progress.json";
/// Version of `progress.json`'s layout.
const PROGRESS_VERSION: u32 = 1;

/// `progress.json`: the run so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedProgress {
    /// Layout version of the file.
    pub version: u32,
    /// The [`Resume`] fingerprint plus the substitution settings and the number of blocks.
    pub fingerprint: Map<String, Value>,
    /// Evaluation of the model before any substitution.
    pub original: Evaluation,
    /// Evaluation of the accepted model.
    pub accepted: Evaluation,
    /// Folder (in the progress folder) with the accepted model's state; `None` while it is the
    /// starting model.
    pub state: Option<String>,
    /// Completed steps, in order.
    pub steps: Vec<StepRecord>,
    /// The rejected attempts so far of the step in progress.
    pub pending: Vec<AttemptRecord>,
    /// Time of the invocations so far.
    pub seconds: f64,
}

/// The progress folder of a run.
struct Store<'a> {
    dir: &'a Path,
    /// Normalised through JSON text, as the saved one is, so equal settings compare equal.
    fingerprint: Map<String, Value>,
}

impl<'a> Store<'a> {
    fn new(resume: &Resume<'a>, config: &SubstitutionConfig, blocks: usize) -> Result<Self> {
        let json_err = |e: serde_json::Error| Error::Other(e.to_string());
        let mut fingerprint = resume.fingerprint.clone();
        fingerprint.insert(
            "substitution".into(),
            serde_json::to_value(config).map_err(json_err)?,
        );
        fingerprint.insert("num_blocks".into(), blocks.into());
        let text = serde_json::to_string(&fingerprint).map_err(json_err)?;
        Ok(Store {
            dir: resume.dir,
            fingerprint: serde_json::from_str(&text).map_err(json_err)?,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(PROGRESS_FILE)
    }

    /// Saved progress, checked against this run's fingerprint and schedule.
    fn load(
        &self,
        schedule: &[(Stage, Range<usize>)],
        retries: u32,
    ) -> Result<Option<SavedProgress>> {
        let path = self.path();
        if !path.exists() {
            return Ok(None);
        }
        let bytes = std::fs::read(&path).map_err(|e| io_err("cannot read", &path, e))?;
        let saved: SavedProgress = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Malformed(format!(
                "{}: {e}; remove {} to start the run over",
                path.display(),
                self.dir.display()
            ))
        })?;
        ensure!(
            saved.version == PROGRESS_VERSION,
            Malformed,
            "{} has layout version {}, this build reads {PROGRESS_VERSION}",
            path.display(),
            saved.version
        );
        if saved.fingerprint != self.fingerprint {
            let mut keys: Vec<&String> = saved
                .fingerprint
                .keys()
                .chain(self.fingerprint.keys())
                .filter(|k| saved.fingerprint.get(*k) != self.fingerprint.get(*k))
                .collect();
            keys.sort();
            keys.dedup();
            let keys: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
            bail!(
                InvalidArgument,
                "the progress in {} was made with other options (differing: {}); run with the \
                 same options to resume, or remove it (or use another output folder) to start over",
                self.dir.display(),
                keys.join(", ")
            );
        }
        ensure!(
            saved.steps.len() <= schedule.len()
                && saved
                    .steps
                    .iter()
                    .zip(schedule)
                    .all(|(s, (stage, blocks))| s.operator == stage.operator
                        && s.blocks() == *blocks),
            Malformed,
            "{}: its steps do not follow the schedule",
            path.display()
        );
        // Pending attempts belong to an unfinished step and are all retried but the last.
        ensure!(
            saved.pending.is_empty()
                || (saved.steps.len() < schedule.len()
                    && saved.pending.len() <= retries as usize
                    && saved
                        .pending
                        .iter()
                        .enumerate()
                        .all(|(i, a)| a.attempt as usize == i)),
            Malformed,
            "{}: its pending attempts do not fit the run",
            path.display()
        );
        if let Some(state) = &saved.state {
            ensure!(
                is_state_name(state) && self.dir.join(state).is_dir(),
                Malformed,
                "{}: state folder {state:?} is missing",
                path.display()
            );
        }
        Ok(Some(saved))
    }

    fn commit(&self, progress: &SavedProgress) -> Result<()> {
        write_json_atomically(&self.path(), progress)
    }

    /// The training checkpoint folder of attempt `attempt` of step `k`.
    fn checkpoint_dir(&self, k: usize, attempt: u32) -> PathBuf {
        self.dir.join(format!("step-{k}-attempt-{attempt}"))
    }

    /// Saves the target's current state as the state after step `k`; returns its name.
    fn save_state<T: SubstitutionTarget>(&self, target: &T, k: usize) -> Result<String> {
        let name = format!("state-{k}");
        let (dir, tmp) = (self.dir.join(&name), self.dir.join(format!("{name}.tmp")));
        // Leftovers of a save that was interrupted; progress.json never names them.
        for stale in [&dir, &tmp] {
            if stale.exists() {
                std::fs::remove_dir_all(stale).map_err(|e| io_err("cannot remove", stale, e))?;
            }
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io_err("cannot create", &tmp, e))?;
        target.save(&tmp)?;
        std::fs::rename(&tmp, &dir).map_err(|e| io_err("cannot commit", &dir, e))?;
        Ok(name)
    }
}

/// Whether `name` is a state folder name this module writes (so a corrupt progress file cannot
/// point the loader outside the progress folder).
fn is_state_name(name: &str) -> bool {
    name.strip_prefix("state-")
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// The accepted model at the end of each stage, from the steps in schedule order.
fn stage_records(
    config: &SubstitutionConfig,
    blocks: usize,
    original: &Evaluation,
    steps: &[StepRecord],
) -> Vec<StageRecord> {
    let (mut accuracy, mut f1) = (original.accuracy, original.f1);
    let mut rest = steps;
    config
        .stages
        .iter()
        .map(|stage| {
            let (chunk, later) = rest.split_at(config.groups(stage, blocks).len().min(rest.len()));
            rest = later;
            let mut replaced_blocks = Vec::new();
            for s in chunk.iter().filter(|s| s.accepted) {
                replaced_blocks.extend(s.blocks());
                (accuracy, f1) = (s.accuracy, s.f1);
            }
            StageRecord {
                operator: stage.operator,
                bound: stage.bound,
                replaced_blocks,
                accuracy,
                f1,
            }
        })
        .collect()
}

/// How [`run_substitution`] ended.
#[derive(Clone, Debug, PartialEq)]
// Returned once per run: boxing the report would only make every caller unwrap it.
#[allow(clippy::large_enum_variant)]
pub enum RunOutcome {
    /// Every step done.
    Finished(SubstitutionReport),
    /// Stopped by [`Resume::stop_after`]; running again continues.
    Stopped {
        /// Steps done so far.
        steps_done: usize,
        /// Steps of the whole run.
        total_steps: usize,
    },
}

impl RunOutcome {
    /// The report of a finished run.
    pub fn finished(self) -> Option<SubstitutionReport> {
        match self {
            RunOutcome::Finished(report) => Some(report),
            RunOutcome::Stopped { .. } => None,
        }
    }
}

/// Runs Algorithm 5 for every stage of `config`. `on_step` sees each step as it finishes (and
/// each step reloaded from `resume`'s folder first), for logging and progress.
pub fn run_substitution<T: SubstitutionTarget>(
    target: &mut T,
    config: &SubstitutionConfig,
    resume: Option<&Resume<'_>>,
    mut on_step: impl FnMut(&StepRecord),
) -> Result<RunOutcome> {
    config.validate()?;
    let n = target.num_blocks();
    ensure!(n > 0, InvalidArgument, "model has no blocks");
    let started = Instant::now();
    let schedule = config.schedule(n);
    let store = resume.map(|r| Store::new(r, config, n)).transpose()?;
    let saved = match &store {
        Some(store) => store.load(&schedule, config.retries)?,
        None => None,
    };
    let mut progress = match (saved, &store) {
        (Some(mut saved), Some(store)) => {
            if let Some(state) = &saved.state {
                target.load(&store.dir.join(state))?;
            }
            for step in &mut saved.steps {
                step.resumed = true;
                on_step(step);
            }
            saved
        }
        _ => {
            let original = target.evaluate()?;
            let fresh = SavedProgress {
                version: PROGRESS_VERSION,
                fingerprint: store
                    .as_ref()
                    .map_or_else(Map::new, |s| s.fingerprint.clone()),
                accepted: original.clone(),
                original,
                state: None,
                steps: vec![],
                pending: vec![],
                seconds: 0.0,
            };
            if let Some(store) = &store {
                std::fs::create_dir_all(store.dir)
                    .map_err(|e| io_err("cannot create", store.dir, e))?;
                store.commit(&fresh)?;
            }
            fresh
        }
    };
    let earlier_seconds = progress.seconds;
    let threshold = config
        .min_accuracy
        .unwrap_or(progress.original.accuracy - config.max_accuracy_drop);
    let stop_after = resume.and_then(|r| r.stop_after);
    for (k, (stage, blocks)) in schedule.iter().enumerate().skip(progress.steps.len()) {
        let stage = *stage;
        if stop_after.is_some_and(|s| k >= s) {
            return Ok(RunOutcome::Stopped {
                steps_done: k,
                total_steps: schedule.len(),
            });
        }
        let step_started = Instant::now();
        let accepted_state = target.snapshot()?;
        // Attempts an earlier invocation made (all rejected) are not made again.
        let mut resumed = !progress.pending.is_empty();
        loop {
            let attempt = progress.pending.len() as u32;
            let attempt_started = Instant::now();
            for block in blocks.clone() {
                target.substitute(stage.operator, block)?;
            }
            let checkpoint = store.as_ref().map(|s| s.checkpoint_dir(k, attempt));
            let tuned = target.finetune(&FinetuneRequest {
                operator: stage.operator,
                blocks: blocks.clone(),
                bound: stage.bound,
                budget: config.retry_factor.powi(attempt as i32),
                learning_rate: stage.learning_rate,
                checkpoint_dir: checkpoint.as_deref(),
            })?;
            let eval = target.evaluate()?;
            let accepted = match config.min_accuracy {
                Some(floor) => eval.accuracy >= floor,
                None => eval.accuracy > threshold,
            };
            let superseded = if accepted {
                progress.accepted = eval.clone();
                match &store {
                    Some(store) => progress.state.replace(store.save_state(target, k)?),
                    None => None,
                }
            } else {
                // The next attempt, or the next step, starts from the accepted model.
                target.restore(&accepted_state)?;
                None
            };
            resumed |= tuned.resumed_from.is_some();
            progress.pending.push(AttemptRecord {
                attempt,
                updates: tuned.updates,
                train_loss: tuned.mean_loss,
                accuracy: eval.accuracy,
                perplexity: eval.perplexity,
                max_abs_hidden: eval.max_abs_hidden.clone(),
                resumed_from: tuned.resumed_from,
                seconds: attempt_started.elapsed().as_secs_f64(),
            });
            let done = accepted || attempt >= config.retries;
            if done {
                progress.steps.push(StepRecord {
                    operator: stage.operator,
                    block: blocks.start,
                    span: blocks.len(),
                    bound: stage.bound,
                    train_loss: tuned.mean_loss,
                    accuracy: eval.accuracy,
                    f1: eval.f1,
                    perplexity: eval.perplexity,
                    accepted,
                    max_abs_hidden: eval.max_abs_hidden,
                    seconds: step_started.elapsed().as_secs_f64(),
                    resumed,
                    attempts: std::mem::take(&mut progress.pending),
                });
            }
            if let Some(store) = &store {
                progress.seconds = earlier_seconds + started.elapsed().as_secs_f64();
                store.commit(&progress)?;
                // Best effort: progress.json no longer needs either.
                if let Some(dir) = &checkpoint {
                    let _ = std::fs::remove_dir_all(dir);
                }
                if let Some(old) = superseded {
                    let _ = std::fs::remove_dir_all(store.dir.join(old));
                }
            }
            if done {
                break;
            }
        }
        if let Some(step) = progress.steps.last() {
            on_step(step);
        }
    }
    Ok(RunOutcome::Finished(SubstitutionReport {
        num_blocks: n,
        max_accuracy_drop: config.max_accuracy_drop,
        stages: stage_records(config, n, &progress.original, &progress.steps),
        original: progress.original,
        threshold,
        steps: progress.steps,
        final_evaluation: progress.accepted,
        seconds: earlier_seconds + started.elapsed().as_secs_f64(),
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};
    use std::path::PathBuf;

    /// A stand-in model: its "state" is the set of replaced (operator, block) pairs; evaluation
    /// returns scripted accuracies in order and records which state each call saw. Fine-tuning
    /// with a checkpoint folder writes a marker there, and continues one it finds.
    pub(crate) struct ScriptedTarget {
        pub blocks: usize,
        pub replaced: Vec<(Operator, usize)>,
        pub accuracies: VecDeque<f64>,
        pub finetuned: Vec<(Operator, usize, Option<f64>)>,
        /// The budget and learning rate of every fine-tuning.
        pub budgets: Vec<f64>,
        pub learning_rates: Vec<Option<f64>>,
        pub evaluated_states: Vec<Vec<(Operator, usize)>>,
        /// The fine-tuning call (0-based) in which "the process is killed": it fails after
        /// writing its checkpoint.
        pub kill_at_finetune: Option<usize>,
        /// Checkpoint folders whose fine-tuning was continued.
        pub continued: Vec<PathBuf>,
    }

    impl ScriptedTarget {
        pub(crate) fn new(blocks: usize, accuracies: &[f64]) -> Self {
            ScriptedTarget {
                blocks,
                replaced: vec![],
                accuracies: accuracies.iter().copied().collect(),
                finetuned: vec![],
                budgets: vec![],
                learning_rates: vec![],
                evaluated_states: vec![],
                kill_at_finetune: None,
                continued: vec![],
            }
        }
    }

    impl SubstitutionTarget for ScriptedTarget {
        type Snapshot = Vec<(Operator, usize)>;
        fn num_blocks(&self) -> usize {
            self.blocks
        }
        fn snapshot(&self) -> Result<Self::Snapshot> {
            Ok(self.replaced.clone())
        }
        fn restore(&mut self, s: &Self::Snapshot) -> Result<()> {
            self.replaced = s.clone();
            Ok(())
        }
        fn save(&self, dir: &Path) -> Result<()> {
            std::fs::write(
                dir.join("replaced.json"),
                serde_json::to_vec(&self.replaced).unwrap(),
            )?;
            Ok(())
        }
        fn load(&mut self, dir: &Path) -> Result<()> {
            let bytes = std::fs::read(dir.join("replaced.json"))?;
            self.replaced =
                serde_json::from_slice(&bytes).map_err(|e| Error::Malformed(e.to_string()))?;
            Ok(())
        }
        fn substitute(&mut self, op: Operator, block: usize) -> Result<()> {
            assert!(!self.replaced.contains(&(op, block)), "substituted twice");
            self.replaced.push((op, block));
            Ok(())
        }
        fn finetune(&mut self, r: &FinetuneRequest<'_>) -> Result<Finetuned> {
            self.finetuned.push((r.operator, r.blocks.start, r.bound));
            self.budgets.push(r.budget);
            self.learning_rates.push(r.learning_rate);
            let mut resumed_from = None;
            if let Some(dir) = r.checkpoint_dir {
                if dir.join("marker").exists() {
                    self.continued.push(dir.to_path_buf());
                    resumed_from = Some(5);
                } else {
                    std::fs::create_dir_all(dir)?;
                    std::fs::write(dir.join("marker"), b"5")?;
                }
            }
            if self.kill_at_finetune == Some(self.finetuned.len() - 1) {
                return Err(Error::Other("killed".into()));
            }
            Ok(Finetuned {
                mean_loss: 0.5,
                updates: (10.0 * r.budget).round() as u64,
                resumed_from,
            })
        }
        fn evaluate(&mut self) -> Result<Evaluation> {
            self.evaluated_states.push(self.replaced.clone());
            let accuracy = self
                .accuracies
                .pop_front()
                .expect("script ran out of accuracies");
            Ok(Evaluation {
                accuracy,
                examples: 100,
                max_abs_hidden: vec![accuracy as f32; 2],
                f1: None,
                perplexity: None,
            })
        }
    }

    #[test]
    fn accepts_and_rejects_against_the_threshold() {
        use Operator::*;
        // Original 0.90, Δα 0.02 → accept iff accuracy > 0.88.
        let script = [
            0.90, // original
            0.91, 0.89, // GELU block 1, 0: accepted, accepted
            0.88, 0.95, // Softmax block 1 rejected (not strictly above), block 0 accepted
            0.10, 0.87, // LN1: both rejected
            0.889, 0.5, // LN2: block 1 accepted, block 0 rejected
        ];
        let mut target = ScriptedTarget::new(2, &script);
        let mut seen = 0;
        let report = run_substitution(&mut target, &SubstitutionConfig::default(), None, |_| {
            seen += 1
        })
        .unwrap()
        .finished()
        .unwrap();
        assert_eq!(seen, 8);
        let accepted: Vec<bool> = report.steps.iter().map(|s| s.accepted).collect();
        assert_eq!(
            accepted,
            [true, true, false, true, false, false, true, false]
        );
        let order: Vec<(Operator, usize)> =
            report.steps.iter().map(|s| (s.operator, s.block)).collect();
        assert_eq!(order[..2], [(Gelu, 1), (Gelu, 0)]);
        assert_eq!(order[6..], [(LayerNorm2, 1), (LayerNorm2, 0)]);
        // The final model carries exactly the accepted replacements.
        assert_eq!(
            target.replaced,
            [(Gelu, 1), (Gelu, 0), (Softmax, 0), (LayerNorm2, 1)]
        );
        // A rejected step is rolled back before the next one starts.
        assert_eq!(
            target.evaluated_states[5],
            [(Gelu, 1), (Gelu, 0), (Softmax, 0), (LayerNorm1, 1)]
        );
        assert_eq!(
            target.evaluated_states[6],
            [(Gelu, 1), (Gelu, 0), (Softmax, 0), (LayerNorm1, 0)]
        );
        // Fine-tuning used each stage's bound.
        let bounds: HashMap<Operator, Option<f64>> =
            target.finetuned.iter().map(|&(op, _, b)| (op, b)).collect();
        assert_eq!(bounds[&Gelu], None);
        assert_eq!(bounds[&Softmax], Some(32.0));
        assert_eq!(bounds[&LayerNorm1], Some(24.0));
        assert_eq!(bounds[&LayerNorm2], Some(16.0));
        // Table 3 counts and per-stage accuracy of the accepted model.
        let counts: Vec<usize> = Operator::ALL
            .iter()
            .map(|&op| report.replaced(op))
            .collect();
        assert_eq!(counts, [2, 1, 0, 1]);
        let stage_acc: Vec<f64> = report.stages.iter().map(|s| s.accuracy).collect();
        assert_eq!(stage_acc, [0.89, 0.95, 0.95, 0.889]);
        assert_eq!(report.final_evaluation.accuracy, 0.889);
        assert!((report.threshold - 0.88).abs() < 1e-12);
    }

    #[test]
    fn rejects_bad_settings() {
        let mut target = ScriptedTarget::new(2, &[0.9]);
        let bad_drop = SubstitutionConfig {
            max_accuracy_drop: -0.1,
            ..Default::default()
        };
        assert!(run_substitution(&mut target, &bad_drop, None, |_| {}).is_err());
        let no_stages = SubstitutionConfig {
            stages: vec![],
            ..Default::default()
        };
        assert!(run_substitution(&mut target, &no_stages, None, |_| {}).is_err());
        for (retries, retry_factor) in [(1, 1.0), (1, 0.5), (1, f64::NAN), (60, 1e10)] {
            let bad_retry = SubstitutionConfig {
                retries,
                retry_factor,
                ..Default::default()
            };
            let err = run_substitution(&mut target, &bad_retry, None, |_| {}).unwrap_err();
            assert!(err.to_string().contains("retry factor"), "{err}");
        }
        let too_many = SubstitutionConfig {
            retries: u32::MAX,
            retry_factor: 1.000001,
            ..Default::default()
        };
        let err = run_substitution(&mut target, &too_many, None, |_| {}).unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        assert!(target.finetuned.is_empty());
        let mut empty = ScriptedTarget::new(0, &[0.9]);
        assert!(
            run_substitution(&mut empty, &SubstitutionConfig::default(), None, |_| {}).is_err()
        );
    }

    /// The accuracies of the test above: original, then two steps per stage.
    const SCRIPT: [f64; 9] = [0.90, 0.91, 0.89, 0.88, 0.95, 0.10, 0.87, 0.889, 0.5];

    fn resume(dir: &Path) -> Resume<'_> {
        let mut fingerprint = Map::new();
        fingerprint.insert("model".into(), "tiny".into());
        Resume {
            dir,
            fingerprint,
            stop_after: None,
        }
    }

    /// A record without what legitimately differs between an interrupted and a straight run.
    fn comparable(step: &StepRecord) -> StepRecord {
        StepRecord {
            seconds: 0.0,
            resumed: false,
            attempts: step
                .attempts
                .iter()
                .map(|a| AttemptRecord {
                    seconds: 0.0,
                    resumed_from: None,
                    ..a.clone()
                })
                .collect(),
            ..step.clone()
        }
    }

    fn read_progress(dir: &Path) -> SavedProgress {
        serde_json::from_slice(&std::fs::read(dir.join(PROGRESS_FILE)).unwrap()).unwrap()
    }

    fn folder_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Kills a run in each of its fine-tunings in turn, runs it again in a new "process", and
    /// checks that nothing finished is redone and that the outcome is the uninterrupted run's.
    fn assert_resumes_after_every_kill(config: &SubstitutionConfig, script: &[f64]) {
        let straight_dir = tempfile::tempdir().unwrap();
        let mut straight = ScriptedTarget::new(2, script);
        let want = run_substitution(
            &mut straight,
            config,
            Some(&resume(straight_dir.path())),
            |_| {},
        )
        .unwrap()
        .finished()
        .unwrap();
        assert!(straight.accuracies.is_empty(), "script not used up");
        // Persisting does not change what the run does.
        let mut plain = ScriptedTarget::new(2, script);
        let plain = run_substitution(&mut plain, config, None, |_| {})
            .unwrap()
            .finished()
            .unwrap();
        assert_eq!(
            plain.steps.iter().map(comparable).collect::<Vec<_>>(),
            want.steps.iter().map(comparable).collect::<Vec<_>>()
        );
        let left = folder_names(straight_dir.path());
        assert_eq!(left.len(), 2, "the progress and one state: {left:?}");
        // Step of each fine-tuning call, and its attempt.
        let calls: Vec<(usize, u32)> = want
            .steps
            .iter()
            .enumerate()
            .flat_map(|(k, s)| s.attempts.iter().map(move |a| (k, a.attempt)))
            .collect();
        assert_eq!(calls.len(), straight.finetuned.len());

        for (kill, &(step, attempt)) in calls.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let mut first = ScriptedTarget::new(2, script);
            first.kill_at_finetune = Some(kill);
            let err = run_substitution(&mut first, config, Some(&resume(dir.path())), |_| {})
                .unwrap_err();
            assert!(err.to_string().contains("killed"), "{err}");
            let saved = read_progress(dir.path());
            assert_eq!(
                (saved.steps.len(), saved.pending.len() as u32),
                (step, attempt)
            );
            let checkpoint = dir.path().join(format!("step-{step}-attempt-{attempt}"));
            assert!(checkpoint.join("marker").exists());

            // A new process: the starting model again, and only the accuracies of the
            // evaluations still to come (the original and the finished attempts are not redone).
            let mut second = ScriptedTarget::new(2, &script[1 + kill..]);
            let mut seen = 0;
            let got = run_substitution(&mut second, config, Some(&resume(dir.path())), |_| {
                seen += 1
            })
            .unwrap()
            .finished()
            .unwrap();
            assert_eq!(seen, want.steps.len(), "reloaded steps are reported too");
            assert_eq!(first.finetuned, straight.finetuned[..=kill]);
            assert_eq!(
                second.finetuned,
                straight.finetuned[kill..],
                "kill at {kill}"
            );
            assert_eq!(second.budgets, straight.budgets[kill..]);
            assert_eq!(second.continued, [checkpoint]);
            assert_eq!(second.replaced, straight.replaced);
            for (i, (g, w)) in got.steps.iter().zip(&want.steps).enumerate() {
                assert_eq!(g.resumed, i <= step, "step {i} after a kill at {kill}");
                assert_eq!(comparable(g), comparable(w));
            }
            assert_eq!(got.resumed_steps(), step + 1);
            assert_eq!(
                (&got.original, &got.stages, &got.final_evaluation),
                (&want.original, &want.stages, &want.final_evaluation)
            );
            assert_eq!(folder_names(dir.path()), left);
        }
    }

    #[test]
    fn an_interrupted_run_resumes_where_it_stopped() {
        assert_resumes_after_every_kill(&SubstitutionConfig::default(), &SCRIPT);
    }

    /// Original 0.90 and threshold 0.88, two blocks, GELU and Softmax, two retries at 3×.
    fn retrying() -> (SubstitutionConfig, [f64; 8]) {
        let config = SubstitutionConfig {
            stages: paper_stages()[..2].to_vec(),
            retries: 2,
            retry_factor: 3.0,
            ..SubstitutionConfig::default()
        };
        let script = [
            0.90, // original
            0.95, // GELU 1: accepted at once
            0.5, 0.89, // GELU 0: rejected, accepted on the first retry
            0.1, 0.2, 0.3,  // Softmax 1: rejected three times, rolled back
            0.93, // Softmax 0: accepted
        ];
        (config, script)
    }

    #[test]
    fn a_rejected_step_is_retried_with_a_growing_budget() {
        use Operator::*;
        let (config, script) = retrying();
        let mut target = ScriptedTarget::new(2, &script);
        let report = run_substitution(&mut target, &config, None, |_| {})
            .unwrap()
            .finished()
            .unwrap();
        let attempts: Vec<Vec<(u32, u64, f64)>> = report
            .steps
            .iter()
            .map(|s| {
                s.attempts
                    .iter()
                    .map(|a| (a.attempt, a.updates, a.accuracy))
                    .collect()
            })
            .collect();
        assert_eq!(
            attempts,
            [
                vec![(0, 10, 0.95)],
                vec![(0, 10, 0.5), (1, 30, 0.89)],
                vec![(0, 10, 0.1), (1, 30, 0.2), (2, 90, 0.3)],
                vec![(0, 10, 0.93)],
            ]
        );
        assert_eq!(target.budgets, [1.0, 1.0, 3.0, 1.0, 3.0, 9.0, 1.0]);
        let decided: Vec<(bool, f64)> = report
            .steps
            .iter()
            .map(|s| (s.accepted, s.accuracy))
            .collect();
        assert_eq!(
            decided,
            [(true, 0.95), (true, 0.89), (false, 0.3), (true, 0.93)]
        );
        // Every attempt starts from the accepted model plus this step's replacement.
        let softmax_1 = vec![(Gelu, 1), (Gelu, 0), (Softmax, 1)];
        assert_eq!(target.evaluated_states[2], [(Gelu, 1), (Gelu, 0)]);
        assert_eq!(target.evaluated_states[3], [(Gelu, 1), (Gelu, 0)]);
        assert_eq!(
            target.evaluated_states[4..7],
            [softmax_1.clone(), softmax_1.clone(), softmax_1]
        );
        assert_eq!(target.replaced, [(Gelu, 1), (Gelu, 0), (Softmax, 0)]);
        assert_eq!(report.replaced(Gelu), 2);
        assert_eq!(report.stages[1].accuracy, 0.93);

        // The default is the paper's single attempt.
        let once = SubstitutionConfig {
            retries: 0,
            ..config
        };
        let mut target = ScriptedTarget::new(2, &[0.90, 0.95, 0.5, 0.1, 0.93]);
        let report = run_substitution(&mut target, &once, None, |_| {})
            .unwrap()
            .finished()
            .unwrap();
        assert!(report.steps.iter().all(|s| s.attempts.len() == 1));
        assert_eq!(target.budgets, [1.0; 4]);
        assert_eq!(SubstitutionConfig::default().retries, 0);
    }

    #[test]
    fn blocks_upwards_and_stage_learning_rates() {
        use Operator::*;
        let mut stages = paper_stages();
        stages[1].learning_rate = Some(1e-4);
        let config = SubstitutionConfig {
            stages,
            block_order: BlockOrder::Up,
            ..SubstitutionConfig::default()
        };
        let mut target = ScriptedTarget::new(2, &SCRIPT);
        let report = run_substitution(&mut target, &config, None, |_| {})
            .unwrap()
            .finished()
            .unwrap();
        let order: Vec<(Operator, usize)> =
            report.steps.iter().map(|s| (s.operator, s.block)).collect();
        assert_eq!(
            order[..4],
            [(Gelu, 0), (Gelu, 1), (Softmax, 0), (Softmax, 1)]
        );
        // Same script as the downward test: the same decisions, now on the other blocks.
        assert_eq!(
            target.replaced,
            [(Gelu, 0), (Gelu, 1), (Softmax, 1), (LayerNorm2, 0)]
        );
        assert_eq!(report.stages[1].replaced_blocks, [1]);
        assert_eq!(
            target.learning_rates,
            [None, None, Some(1e-4), Some(1e-4), None, None, None, None]
        );
        let bad = SubstitutionConfig {
            stages: vec![Stage {
                learning_rate: Some(0.0),
                ..paper_stages()[0]
            }],
            ..SubstitutionConfig::default()
        };
        let err = run_substitution(&mut target, &bad, None, |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("GELU stage learning rate"),
            "{err}"
        );
    }

    /// The paper's first two stages, `k` blocks a step each.
    fn grouped(gelu: usize, softmax: usize) -> SubstitutionConfig {
        let mut stages = paper_stages()[..2].to_vec();
        stages[0].blocks_per_step = gelu;
        stages[1].blocks_per_step = softmax;
        SubstitutionConfig {
            stages,
            ..SubstitutionConfig::default()
        }
    }

    #[test]
    fn groups_of_blocks_are_replaced_and_tuned_together() {
        use Operator::*;
        let config = grouped(2, 2);
        // Original, then GELU on {3, 4}, {1, 2}, {0}; Softmax on the same groups.
        let script = [0.90, 0.95, 0.5, 0.93, 0.94, 0.92, 0.1];
        let mut target = ScriptedTarget::new(5, &script);
        let report = run_substitution(&mut target, &config, None, |_| {})
            .unwrap()
            .finished()
            .unwrap();
        let steps: Vec<(Operator, usize, usize, String)> = report
            .steps
            .iter()
            .map(|s| (s.operator, s.block, s.span, s.blocks_label()))
            .collect();
        let want: Vec<(Operator, usize, usize, String)> = [
            (Gelu, 3, 2, "3–4"),
            (Gelu, 1, 2, "1–2"),
            (Gelu, 0, 1, "0"),
            (Softmax, 3, 2, "3–4"),
            (Softmax, 1, 2, "1–2"),
            (Softmax, 0, 1, "0"),
        ]
        .into_iter()
        .map(|(o, b, n, l)| (o, b, n, l.to_string()))
        .collect();
        assert_eq!(steps, want);
        // One fine-tuning a group, frozen below its lowest block.
        let tuned: Vec<(Operator, usize)> =
            target.finetuned.iter().map(|&(o, b, _)| (o, b)).collect();
        assert_eq!(
            tuned,
            [
                (Gelu, 3),
                (Gelu, 1),
                (Gelu, 0),
                (Softmax, 3),
                (Softmax, 1),
                (Softmax, 0)
            ]
        );
        // The rejected group {1, 2} was rolled back as a whole.
        assert_eq!(
            target.replaced,
            [
                (Gelu, 3),
                (Gelu, 4),
                (Gelu, 0),
                (Softmax, 3),
                (Softmax, 4),
                (Softmax, 1),
                (Softmax, 2)
            ]
        );
        assert_eq!(report.stages[0].replaced_blocks, [3, 4, 0]);
        assert_eq!(report.stages[1].replaced_blocks, [3, 4, 1, 2]);
        assert_eq!((report.replaced(Gelu), report.replaced(Softmax)), (3, 4));
        assert_eq!(report.final_evaluation.accuracy, 0.92);
        // Each stage its own size; more than the blocks: the whole model in one step.
        let mixed = grouped(9, 2);
        let schedule: Vec<(Operator, Range<usize>)> = mixed
            .schedule(5)
            .into_iter()
            .map(|(s, g)| (s.operator, g))
            .collect();
        assert_eq!(
            schedule,
            [
                (Gelu, 0..5),
                (Softmax, 3..5),
                (Softmax, 1..3),
                (Softmax, 0..1)
            ]
        );
        let mut target = ScriptedTarget::new(5, &[0.90, 0.93, 0.95, 0.5, 0.91]);
        let report = run_substitution(&mut target, &mixed, None, |_| {})
            .unwrap()
            .finished()
            .unwrap();
        assert_eq!(report.stages[0].replaced_blocks, [0, 1, 2, 3, 4]);
        assert_eq!(report.stages[1].replaced_blocks, [3, 4, 0]);
        assert_eq!(report.stages[1].accuracy, 0.91);
        let up = SubstitutionConfig {
            block_order: BlockOrder::Up,
            ..config.clone()
        };
        assert_eq!(up.groups(&up.stages[0], 5), [0..2, 2..4, 4..5]);
        let mut target = ScriptedTarget::new(5, &script);
        let err = run_substitution(&mut target, &grouped(1, 0), None, |_| {}).unwrap_err();
        assert!(err.to_string().contains("Softmax step"), "{err}");
        // Interrupted anywhere, a grouped run resumes to the same outcome (two blocks: one
        // group a stage).
        assert_resumes_after_every_kill(&config, &[0.90, 0.95, 0.1]);
        // One block a step keeps the old layout of progress and reports (nothing written).
        let text = serde_json::to_string(&SubstitutionConfig::default()).unwrap();
        assert!(!text.contains("blocks_per_step"), "{text}");
    }

    #[test]
    fn operators_parse_from_their_labels() {
        for op in Operator::ALL {
            assert_eq!(op.label().parse::<Operator>().unwrap(), op);
            assert_eq!(op.label().to_lowercase().parse::<Operator>().unwrap(), op);
        }
        assert!("layernorm".parse::<Operator>().is_err());
    }

    #[test]
    fn an_interrupted_retry_resumes_without_redoing_attempts() {
        let (config, script) = retrying();
        assert_resumes_after_every_kill(&config, &script);
    }

    #[test]
    fn progress_of_other_options_or_a_corrupt_file_is_refused() {
        let config = SubstitutionConfig::default();
        let dir = tempfile::tempdir().unwrap();
        let mut part = resume(dir.path());
        part.stop_after = Some(3);
        let mut target = ScriptedTarget::new(2, &SCRIPT);
        assert_eq!(
            run_substitution(&mut target, &config, Some(&part), |_| {}).unwrap(),
            RunOutcome::Stopped {
                steps_done: 3,
                total_steps: 8
            }
        );
        assert_eq!(target.finetuned.len(), 3);
        let saved = read_progress(dir.path());
        assert_eq!(saved.steps.len(), 3);
        assert_eq!(saved.state.as_deref(), Some("state-1"));

        let mut other_model = resume(dir.path());
        other_model
            .fingerprint
            .insert("model".into(), "another".into());
        let mut fresh = ScriptedTarget::new(2, &SCRIPT[4..]);
        let err = run_substitution(&mut fresh, &config, Some(&other_model), |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("other options (differing: model)"),
            "{err}"
        );
        let other_drop = SubstitutionConfig {
            max_accuracy_drop: 0.01,
            ..SubstitutionConfig::default()
        };
        let err = run_substitution(&mut fresh, &other_drop, Some(&resume(dir.path())), |_| {})
            .unwrap_err();
        assert!(
            err.to_string().contains("(differing: substitution)"),
            "{err}"
        );
        assert!(fresh.finetuned.is_empty() && fresh.replaced.is_empty());

        // Corrupt files: clear errors naming the file, never a panic.
        let path = dir.path().join(PROGRESS_FILE);
        let good = std::fs::read_to_string(&path).unwrap();
        for (bad, says) in [
            ("{".to_string(), "remove"),
            (good.replace("\"state-1\"", "\"../../etc\""), "state folder"),
            (good.replace("\"state-1\"", "\"state-2\""), "state folder"),
            (good.replace("\"block\": 0", "\"block\": 7"), "schedule"),
            (good.replace("\"version\": 1", "\"version\": 9"), "version"),
            (
                good.replace(
                    "\"pending\": []",
                    r#""pending": [{"attempt": 0, "updates": 1, "train_loss": 0.5, "accuracy": 0.1,
                        "max_abs_hidden": [], "resumed_from": null, "seconds": 0.0}]"#,
                ),
                "pending attempts",
            ),
        ] {
            assert_ne!(bad, good);
            std::fs::write(&path, &bad).unwrap();
            let err = run_substitution(&mut fresh, &config, Some(&resume(dir.path())), |_| {})
                .unwrap_err()
                .to_string();
            assert!(err.contains(says) && err.contains("progress.json"), "{err}");
        }
        std::fs::remove_dir_all(dir.path().join("state-1")).unwrap();
        std::fs::write(&path, &good).unwrap();
        let err =
            run_substitution(&mut fresh, &config, Some(&resume(dir.path())), |_| {}).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
