//! `veil finetune` and `veil substitute`: the command-line faces of veil-train's workflows, and
//! the dataset-format options they share with `veil eval` ([`crate::eval_cmd`]).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use veil_core::{ensure, Result};
use veil_model::data::{Columns, DatasetFormat};
use veil_train::{DataOptions, FinetuneOptions, LossWeights, SubstituteOptions, TrainConfig};

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// `LABEL SENTENCE` per line (the SST-2 files of this project).
    Lines,
    /// GLUE TSV with a header (single sentences and pairs).
    Glue,
    /// CSV with a header; name the columns with --text-column/--pair-column/--label-column.
    Csv,
}

/// How to read a dataset file.
#[derive(Args, Clone)]
pub struct FormatArgs {
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
pub struct DataArgs {
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
pub struct TrainArgs {
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
pub struct FinetuneArgs {
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

pub fn finetune(a: FinetuneArgs, quiet: bool) -> Result<()> {
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
                "train_accuracy": s.train_accuracy, "dev_accuracy": dev.accuracy,
                "dev_examples": dev.examples, "max_abs_hidden": dev.max_abs_hidden,
                "seconds": started.elapsed().as_secs_f64(),
            })
        ),
    }
    Ok(())
}

#[derive(Args)]
pub struct SubstituteArgs {
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
}

pub fn substitute(a: SubstituteArgs, quiet: bool) -> Result<()> {
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
    o.progress = !quiet;
    let out = veil_train::substitute(&o)?;
    let r = &out.report.substitution;
    println!(
        "{}",
        serde_json::json!({
            "out": a.out,
            "original_accuracy": r.original.accuracy,
            "final_accuracy": r.final_evaluation.accuracy,
            "replaced": veil_train::Operator::ALL.map(|op| (op.label(), r.replaced(op))),
            "reports": ["substitution.json", "substitution.md", "accuracy.svg"],
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}
