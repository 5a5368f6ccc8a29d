//! `veil finetune` and `veil substitute`: the command-line faces of veil-train's workflows, and
//! the dataset-format options they share with `veil eval` ([`crate::eval_cmd`]).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use veil_core::{ensure, Result};
use veil_model::data::{Columns, DatasetFormat};
use veil_train::{
    BlockOrder, DataOptions, FinetuneOptions, LossWeights, Operator, SubstituteOptions,
    SubstituteOutcome, TrainConfig,
};

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum FormatArg {
    /// `LABEL SENTENCE` per line (the SST-2 files of this project).
    Lines,
    /// GLUE TSV with a header (single sentences and pairs).
    Glue,
    /// CSV with a header; name the columns with --text-column/--pair-column/--label-column.
    Csv,
}

/// How to read a dataset file.
#[derive(Args, Clone)]
pub(crate) struct FormatArgs {
    /// File format; default: `.tsv` → glue, otherwise lines.
    #[arg(long, value_enum)]
    format: Option<FormatArg>,
    /// Text column (CSV; GLUE when its header is not recognised).
    #[arg(long)]
    text_column: Option<String>,
    /// Second-sentence column for pair tasks.
    #[arg(long)]
    pair_column: Option<String>,
    #[arg(long)]
    label_column: Option<String>,
    /// Tokens per example after truncation (capped by the model's position table).
    #[arg(long, default_value_t = 128)]
    pub(crate) max_seq_len: usize,
}

impl FormatArgs {
    fn columns(&self) -> Option<Columns> {
        self.text_column.as_ref().map(|text| Columns {
            text_a: text.clone(),
            text_b: self.pair_column.clone(),
            label: self.label_column.clone().unwrap_or_else(|| "label".into()),
        })
    }

    pub(crate) fn format(&self) -> Result<Option<DatasetFormat>> {
        Ok(match self.format {
            None => None,
            Some(FormatArg::Lines) => Some(DatasetFormat::LabelSentenceLines),
            Some(FormatArg::Glue) => Some(DatasetFormat::GlueTsv(self.columns())),
            Some(FormatArg::Csv) => Some(DatasetFormat::Csv(self.columns().ok_or_else(|| {
                veil_core::Error::InvalidArgument(
                    "--format csv needs --text-column (and --label-column unless it is \"label\")"
                        .into(),
                )
            })?)),
        })
    }
}

/// Training and development files.
#[derive(Args, Clone)]
pub(crate) struct DataArgs {
    #[arg(long)]
    train: PathBuf,
    #[arg(long)]
    dev: PathBuf,
    #[command(flatten)]
    format: FormatArgs,
}

impl DataArgs {
    fn options(&self) -> Result<DataOptions> {
        let mut d = DataOptions::new(&self.train, &self.dev);
        d.format = self.format.format()?;
        d.max_seq_len = self.format.max_seq_len;
        Ok(d)
    }
}

/// Optimiser and loss settings; unset flags keep the workflow's defaults.
#[derive(Args, Clone)]
pub(crate) struct TrainArgs {
    #[arg(long)]
    epochs: Option<u32>,
    #[arg(long)]
    batch_size: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    /// Fraction of the updates spent warming up.
    #[arg(long)]
    warmup: Option<f64>,
    #[arg(long)]
    max_grad_norm: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
    /// Weight α1 of the (size-normalised) decay term of the paper's loss.
    #[arg(long)]
    alpha1: Option<f64>,
    /// Weight α2 of the hidden-state bound term.
    #[arg(long)]
    alpha2: Option<f64>,
    /// Hidden-state bound B of the loss (default ∞; substitute uses the paper's per-stage B).
    #[arg(long)]
    bound: Option<f64>,
    /// Cap on the updates of each run (each stage, for substitute); the schedule follows it.
    #[arg(long)]
    max_steps: Option<u64>,
    #[arg(long)]
    checkpoint_every: Option<u64>,
}

/// Overwrites `dst` when the flag was given.
fn set<T>(dst: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *dst = v;
    }
}

impl TrainArgs {
    fn apply(&self, c: &mut TrainConfig) {
        set(&mut c.epochs, self.epochs);
        set(&mut c.batch_size, self.batch_size);
        set(&mut c.learning_rate, self.lr);
        set(&mut c.warmup_fraction, self.warmup);
        set(&mut c.max_grad_norm, self.max_grad_norm);
        set(&mut c.seed, self.seed);
        set(&mut c.checkpoint_every, self.checkpoint_every);
        let loss: &mut LossWeights = &mut c.loss;
        set(&mut loss.alpha1, self.alpha1);
        set(&mut loss.alpha2, self.alpha2);
        if self.bound.is_some() {
            loss.bound = self.bound;
        }
        if self.max_steps.is_some() {
            c.max_steps = self.max_steps;
        }
    }
}

#[derive(Args)]
pub(crate) struct FinetuneArgs {
    /// Hugging Face model folder (or a Veil model folder) to start from.
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    train: TrainArgs,
    /// Keep only the first N encoder blocks (e.g. 2 for a 2-layer cut).
    #[arg(long)]
    layers: Option<usize>,
    /// Freeze the embedding tables (default: yes for public-embedding models).
    #[arg(long)]
    freeze_embeddings: Option<bool>,
    /// Stop after this many updates; running the same command again resumes.
    #[arg(long)]
    stop_after: Option<u64>,
}

pub(crate) fn finetune(a: FinetuneArgs, quiet: bool) -> Result<()> {
    let started = Instant::now();
    let mut o = FinetuneOptions::new(&a.model, a.data.options()?, &a.out);
    a.train.apply(&mut o.train);
    o.num_layers = a.layers;
    o.freeze_embeddings = a.freeze_embeddings;
    o.stop_after = a.stop_after;
    o.progress = !quiet;
    let out = veil_train::finetune(&o)?;
    let s = &out.summary;
    match &out.dev {
        None => println!(
            "stopped after {} of {} updates; run the same command again to resume",
            s.steps_done, s.total_steps
        ),
        Some(dev) => println!(
            "{}",
            serde_json::json!({
                "out": a.out, "updates": s.steps_done, "mean_loss": s.mean_loss,
                "train_accuracy": s.train_accuracy, "dev_accuracy": dev.accuracy, "dev_f1": dev.f1,
                "dev_examples": dev.examples, "max_abs_hidden": dev.max_abs_hidden,
                "already_finished": out.already_finished,
                "seconds": started.elapsed().as_secs_f64(),
            })
        ),
    }
    Ok(())
}

#[derive(Args)]
pub(crate) struct SubstituteArgs {
    /// A fine-tuned classifier folder (the output of `veil finetune`).
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    train: TrainArgs,
    /// Largest accepted dev-accuracy drop per step, in points (Δα).
    #[arg(long, default_value_t = 2.0)]
    max_drop: f64,
    /// Dev examples run through the fixed-point simulator for the overflow report (0: skip).
    #[arg(long, default_value_t = 32)]
    simulate: usize,
    #[arg(long)]
    freeze_embeddings: Option<bool>,
    /// Stop after this many steps (of 4 × blocks); running the same command again resumes from
    /// OUT/progress, as it does after an interruption.
    #[arg(long)]
    stop_after_steps: Option<usize>,
    /// Retry a rejected step up to N times from the accepted model, each with --retry-factor
    /// times the previous attempt's updates, before rolling it back (0: the paper's one try).
    #[arg(long, default_value_t = 0)]
    retries: u32,
    /// Growth of the updates from one attempt of a step to the next (> 1).
    #[arg(long, default_value_t = 2.0)]
    retry_factor: f64,
    /// Weight W of a distillation term towards --model (KL of the class distributions plus
    /// the hidden states' mean squared difference) added to the loss; 0: off, as in the paper.
    #[arg(long, default_value_t = 0.0)]
    distill: f64,
    /// Order in which each stage visits the blocks: down (n−1 … 0, the paper's) or up.
    #[arg(long, value_enum, default_value_t = BlockOrderArg::Down)]
    block_order: BlockOrderArg,
    /// A stage's own peak learning rate, as OP=LR with OP one of gelu, softmax, ln1, ln2
    /// (repeatable; other stages use --lr).
    #[arg(long, value_name = "OP=LR", value_parser = parse_stage_lr)]
    stage_lr: Vec<(Operator, f64)>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum BlockOrderArg {
    Down,
    Up,
}

/// `OP=LR` of `--stage-lr`.
fn parse_stage_lr(s: &str) -> std::result::Result<(Operator, f64), String> {
    let (op, lr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not OP=LR"))?;
    let op: Operator = op.parse().map_err(|e: veil_core::Error| e.to_string())?;
    let lr: f64 = lr
        .parse()
        .map_err(|_| format!("{lr:?} is not a learning rate"))?;
    Ok((op, lr))
}

pub(crate) fn substitute(a: SubstituteArgs, quiet: bool) -> Result<()> {
    ensure!(
        a.train.bound.is_none(),
        InvalidArgument,
        "substitute sets the bound B per stage (the paper's ∞/32/24/16); --bound does not apply"
    );
    ensure!(
        (0.0..100.0).contains(&a.max_drop),
        InvalidArgument,
        "--max-drop is in accuracy points, in [0, 100)"
    );
    let started = Instant::now();
    let mut o = SubstituteOptions::new(&a.model, a.data.options()?, &a.out);
    a.train.apply(&mut o.train);
    o.substitution.max_accuracy_drop = a.max_drop / 100.0;
    o.simulate_examples = a.simulate;
    o.freeze_embeddings = a.freeze_embeddings;
    o.stop_after_steps = a.stop_after_steps;
    o.substitution.retries = a.retries;
    o.substitution.retry_factor = a.retry_factor;
    o.train.loss.distill = a.distill;
    o.substitution.block_order = match a.block_order {
        BlockOrderArg::Down => BlockOrder::Down,
        BlockOrderArg::Up => BlockOrder::Up,
    };
    for (i, &(op, lr)) in a.stage_lr.iter().enumerate() {
        ensure!(
            op.is_encoder_operator(),
            InvalidArgument,
            "--stage-lr: {} is a decoder operator (see substitute-decoder)",
            op.label()
        );
        ensure!(
            a.stage_lr[..i].iter().all(|&(seen, _)| seen != op),
            InvalidArgument,
            "--stage-lr gives {} twice",
            op.label()
        );
        for stage in o
            .substitution
            .stages
            .iter_mut()
            .filter(|s| s.operator == op)
        {
            stage.learning_rate = Some(lr);
        }
    }
    o.progress = !quiet;
    let doc = match veil_train::substitute(&o)? {
        SubstituteOutcome::Finished(doc) => doc,
        SubstituteOutcome::Stopped {
            steps_done,
            total_steps,
        } => {
            println!(
                "stopped after {steps_done} of {total_steps} steps; run the same command again \
                 to resume"
            );
            return Ok(());
        }
    };
    let r = &doc.substitution;
    println!(
        "{}",
        serde_json::json!({
            "out": a.out,
            "original_accuracy": r.original.accuracy,
            "final_accuracy": r.final_evaluation.accuracy,
            "original_f1": r.original.f1,
            "final_f1": r.final_evaluation.f1,
            "replaced": Operator::ALL.map(|op| (op.label(), r.replaced(op))),
            "resumed_steps": r.resumed_steps(),
            "reports": ["substitution.json", "substitution.md", "accuracy.svg"],
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}
