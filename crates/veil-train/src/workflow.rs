//! The two end-to-end workflows behind `veil finetune` and `veil substitute`: read the data,
//! load the model folder, tokenise, train (or run Algorithm 5), evaluate, and write the output
//! folder with a `veil-training.json` record of what was done. Both resume when run again after
//! an interruption: `finetune` from `out/checkpoint`, `substitute` step by step from
//! `out/progress` (see [`crate::substitute`] for its layout).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, FixedPoint, Result};
use veil_model::data::{self, DatasetFormat, Example, LabelSet};
use veil_model::{folder, BlockVariant, EmbeddingMode, Inputs, ModelConfig, TextTokenizer};

use crate::batch::EncodedExample;
use crate::fixed_check::check_fixed_point;
use crate::report::{write_reports, ReportDocument};
use crate::substitute::{
    run_substitution, FinetuneRequest, Finetuned, Operator, Resume, RunOutcome, SubstitutionConfig,
    SubstitutionTarget,
};
use crate::train::{
    evaluate, fingerprint as data_fingerprint, train, train_with_teacher, Evaluation, Fnv,
    RunControl, TrainConfig, TrainSummary,
};
use crate::transformer::{Freeze, LoadInfo, TrainableTransformer};

/// The record written next to the weights of every folder this crate produces.
pub const RECORD_FILE: &str = "veil-training.json";

/// Inputs shared by both workflows.
#[derive(Clone, Debug)]
pub struct DataOptions {
    /// The training set.
    pub train: PathBuf,
    /// The dev set.
    pub dev: PathBuf,
    /// `None`: from the file extension (`.tsv` GLUE, otherwise `LABEL SENTENCE` lines).
    pub format: Option<DatasetFormat>,
    /// Tokens per example after truncation (capped by the model's position table).
    pub max_seq_len: usize,
}

impl DataOptions {
    /// Default format detection and length.
    pub fn new(train: impl Into<PathBuf>, dev: impl Into<PathBuf>) -> Self {
        DataOptions {
            train: train.into(),
            dev: dev.into(),
            format: None,
            max_seq_len: 128,
        }
    }
}

/// The dataset format and maximum length `data` reads its files with, as a record keeps them.
pub fn data_settings(data: &DataOptions) -> String {
    format!("format {:?}, max_seq_len {}", data.format, data.max_seq_len)
}

/// `veil finetune --model DIR --train FILE --dev FILE --out DIR`.
#[derive(Clone, Debug)]
pub struct FinetuneOptions {
    /// The model folder to start from.
    pub model: PathBuf,
    /// The folder the result is written to.
    pub out: PathBuf,
    /// The data.
    pub data: DataOptions,
    /// The fine-tuning settings.
    pub train: TrainConfig,
    /// Keep only the first `num_layers` blocks (e.g. a 2-layer cut); `None` keeps all.
    pub num_layers: Option<usize>,
    /// `None`: freeze when the model's embedding mode is public (the client embeds with the
    /// published tables, so they must not change).
    pub freeze_embeddings: Option<bool>,
    /// Examples per evaluation batch.
    pub eval_batch_size: usize,
    /// Whether to show progress bars.
    pub progress: bool,
    /// Stop after this many updates, keeping the checkpoint in `out/checkpoint` to resume.
    pub stop_after: Option<u64>,
}

impl FinetuneOptions {
    /// Default settings for `model`, `data` and `out`.
    pub fn new(model: impl Into<PathBuf>, data: DataOptions, out: impl Into<PathBuf>) -> Self {
        FinetuneOptions {
            model: model.into(),
            out: out.into(),
            data,
            train: TrainConfig::default(),
            num_layers: None,
            freeze_embeddings: None,
            eval_batch_size: 64,
            progress: true,
            stop_after: None,
        }
    }
}

/// `veil substitute --model DIR --train FILE --dev FILE --out DIR`.
#[derive(Clone, Debug)]
pub struct SubstituteOptions {
    /// A fine-tuned classifier folder (normally the output of `veil finetune`).
    pub model: PathBuf,
    /// The folder the result is written to.
    pub out: PathBuf,
    /// The data.
    pub data: DataOptions,
    /// The substitution's settings.
    pub substitution: SubstitutionConfig,
    /// The fine-tuning after each substitution; its `loss.bound` is replaced by the stage's B.
    /// With `loss.distill` > 0 the model in `model` is also the teacher of every step.
    pub train: TrainConfig,
    /// `None`: freeze when the model's embedding mode is public.
    pub freeze_embeddings: Option<bool>,
    /// Examples per evaluation batch.
    pub eval_batch_size: usize,
    /// Whether to show progress bars.
    pub progress: bool,
    /// Dev examples pushed through the fixed-point simulator at the project's default ℓ and f
    /// for the overflow check of the report; 0 skips the check.
    pub simulate_examples: usize,
    /// Stop once this many steps are done (the progress stays in `out/progress`; running again
    /// with the same options continues).
    pub stop_after_steps: Option<usize>,
}

impl SubstituteOptions {
    /// Default settings for `model`, `data` and `out`.
    pub fn new(model: impl Into<PathBuf>, data: DataOptions, out: impl Into<PathBuf>) -> Self {
        SubstituteOptions {
            model: model.into(),
            out: out.into(),
            data,
            substitution: SubstitutionConfig::default(),
            train: TrainConfig {
                epochs: 1,
                ..TrainConfig::default()
            },
            freeze_embeddings: None,
            eval_batch_size: 64,
            progress: true,
            simulate_examples: 32,
            stop_after_steps: None,
        }
    }
}

/// What a produced folder was made from and with (`veil-training.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingRecord {
    /// `finetune` or `substitute`.
    pub workflow: String,
    /// The model folder started from.
    pub source_model: String,
    /// The training set.
    pub train_file: String,
    /// The dev set.
    pub dev_file: String,
    /// How the files were read ([`data_settings`]); absent in records older than the field.
    #[serde(default)]
    pub data_settings: Option<String>,
    /// Class names, index = class id of the classifier.
    pub labels: LabelSet,
    /// Whether the embeddings were frozen.
    pub freeze_embeddings: bool,
    /// Encoder blocks of the result.
    pub num_layers: usize,
    /// Each block's operator variants.
    pub variants: Vec<BlockVariant>,
    /// The fine-tuning settings.
    pub train_config: TrainConfig,
    /// Parameters the source folder did not have (a new classifier).
    pub initialised: Vec<String>,
    /// The fine-tuning run (`None` for a substitution).
    pub summary: Option<TrainSummary>,
    /// Dev evaluation of the result.
    pub dev: Evaluation,
}

impl TrainingRecord {
    /// The record in `dir`, if there is one.
    pub fn read(dir: &Path) -> Result<Option<TrainingRecord>> {
        let path = dir.join(RECORD_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let bytes = std::fs::read(&path)?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))
    }

    fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Other(e.to_string()))?;
        std::fs::write(dir.join(RECORD_FILE), json)?;
        Ok(())
    }
}

/// Labelled, tokenised train and dev sets.
struct PreparedData {
    labels: LabelSet,
    inputs: Inputs,
    train: Vec<EncodedExample>,
    dev: Vec<EncodedExample>,
}

/// Reads a dataset file in `format`, or in the format its extension implies.
fn read_dataset(path: &Path, format: Option<&DatasetFormat>) -> Result<Vec<Example>> {
    let format = match format {
        Some(f) => f.clone(),
        None => DatasetFormat::from_path(path)?,
    };
    data::read_file(path, &format)
}

/// Gives the examples read from `path` their class ids in `labels` (label errors name the file)
/// and tokenises them.
fn encode_labelled(
    labels: &LabelSet,
    raw: &[Example],
    path: &Path,
    tokenizer: &TextTokenizer,
) -> Result<Vec<EncodedExample>> {
    raw.iter()
        .map(|e| {
            let label = labels.class_of(e).map_err(|e| match e {
                Error::Malformed(m) => Error::Malformed(format!("{}: {m}", path.display())),
                other => other,
            })?;
            let enc = tokenizer.encode(&e.text_a, e.text_b.as_deref())?;
            Ok(EncodedExample {
                ids: enc.ids,
                type_ids: enc.type_ids,
                label,
            })
        })
        .collect()
}

fn prepare(
    opts: &DataOptions,
    labels: Option<LabelSet>,
    tokenizer: &TextTokenizer,
) -> Result<PreparedData> {
    let train_raw = read_dataset(&opts.train, opts.format.as_ref())?;
    let dev_raw = read_dataset(&opts.dev, opts.format.as_ref())?;
    let inputs = inputs_of(&train_raw, &opts.train)?;
    ensure!(
        inputs_of(&dev_raw, &opts.dev)? == inputs,
        InvalidArgument,
        "{} and {} hold different kinds of examples (single texts and sentence pairs)",
        opts.train.display(),
        opts.dev.display()
    );
    let labels = match labels {
        Some(l) => l,
        None => LabelSet::from_examples(&train_raw)?,
    };
    let train = encode_labelled(&labels, &train_raw, &opts.train, tokenizer)?;
    let dev = encode_labelled(&labels, &dev_raw, &opts.dev, tokenizer)?;
    Ok(PreparedData {
        labels,
        inputs,
        train,
        dev,
    })
}

/// Whether a file's examples are single texts or sentence pairs; a file mixing them is refused
/// (a classifier takes one kind).
fn inputs_of(examples: &[Example], file: &Path) -> Result<Inputs> {
    let pairs = examples.iter().filter(|e| e.text_b.is_some()).count();
    ensure!(
        pairs == 0 || pairs == examples.len(),
        InvalidArgument,
        "{}: {pairs} of its {} examples are sentence pairs and the rest single texts; a \
         classifier takes one kind",
        file.display(),
        examples.len()
    );
    Ok(Inputs::of(pairs > 0))
}

/// Refuses examples of the other kind than `config`'s classifier was trained on.
fn check_inputs(config: &ModelConfig, inputs: Inputs, file: &Path) -> Result<()> {
    match Inputs::refusal(config.veil.inputs, inputs) {
        Some(why) => Err(Error::InvalidArgument(format!(
            "{}: {why}; the file holds the other kind",
            file.display()
        ))),
        None => Ok(()),
    }
}

/// A labelled file tokenised for the model folder `dir`, with the label set the model was
/// fine-tuned with (`veil-training.json`), or, for a folder without one, the file's own labels.
/// For `veil eval`.
pub fn labelled_examples(
    dir: &Path,
    file: &Path,
    format: Option<DatasetFormat>,
    max_seq_len: usize,
) -> Result<(LabelSet, Vec<EncodedExample>)> {
    let config = folder::load_config(dir)?;
    labelled_examples_for(&config, dir, Some(dir), file, format, max_seq_len)
}

/// [`labelled_examples`] for a model whose tokenizer files are in `tokenizer_dir` and whose
/// training record (label names), if any, is in `record_dir` (the built-in model and overlays
/// keep them apart; see `veil_model::source`).
pub fn labelled_examples_for(
    config: &ModelConfig,
    tokenizer_dir: &Path,
    record_dir: Option<&Path>,
    file: &Path,
    format: Option<DatasetFormat>,
    max_seq_len: usize,
) -> Result<(LabelSet, Vec<EncodedExample>)> {
    let tokenizer = tokenizer_for(tokenizer_dir, max_seq_len, config.max_sequence_len())?;
    let raw = read_dataset(file, format.as_ref())?;
    if config.veil.inputs.is_some() {
        check_inputs(config, inputs_of(&raw, file)?, file)?;
    }
    let record = match record_dir {
        Some(d) => TrainingRecord::read(d)?,
        None => None,
    };
    let labels = match record {
        Some(r) => r.labels,
        None => LabelSet::from_examples(&raw)?,
    };
    let examples = encode_labelled(&labels, &raw, file, &tokenizer)?;
    Ok((labels, examples))
}

fn tokenizer_for(dir: &Path, max_seq_len: usize, model_limit: usize) -> Result<TextTokenizer> {
    ensure!(
        max_seq_len >= 2,
        InvalidArgument,
        "maximum sequence length must be ≥ 2"
    );
    TextTokenizer::from_folder(dir, max_seq_len.min(model_limit))
}

fn default_freeze(config: &ModelConfig, choice: Option<bool>) -> bool {
    choice.unwrap_or(config.veil.embedding == EmbeddingMode::Public)
}

/// Result of [`finetune`].
#[derive(Clone, Debug)]
pub struct FinetuneOutcome {
    /// The fine-tuning run.
    pub summary: TrainSummary,
    /// `None` when the run stopped early (resume by running again with the same options).
    pub dev: Option<Evaluation>,
    /// `out` already held this run, finished: nothing was trained, the outcome is the recorded one.
    pub already_finished: bool,
}

/// Fine-tunes a model folder on a dataset and writes the classifier folder to `opts.out`.
/// An interrupted run resumes from `out/checkpoint`; a finished one with the same settings is
/// reported, not trained again; a folder holding another finished run is refused.
pub fn finetune(opts: &FinetuneOptions) -> Result<FinetuneOutcome> {
    let config = folder::load_config(&opts.model)?;
    if let Some(outcome) = finished_run(opts, &config)? {
        return Ok(outcome);
    }
    let tokenizer = tokenizer_for(
        &opts.model,
        opts.data.max_seq_len,
        config.max_sequence_len(),
    )?;
    let prior_labels = TrainingRecord::read(&opts.model)?.map(|r| r.labels);
    // A classifier may be fine-tuned on the other kind of prompt: it records the new kind.
    let data = prepare(&opts.data, prior_labels, &tokenizer)?;
    let (mut model, info): (TrainableTransformer, LoadInfo) = TrainableTransformer::load(
        &opts.model,
        data.labels.len(),
        opts.num_layers,
        opts.train.seed,
    )?;
    model.record_inputs(data.inputs);
    let freeze_embeddings = default_freeze(model.config(), opts.freeze_embeddings);
    let freeze = Freeze {
        embeddings: freeze_embeddings,
        blocks_below: 0,
    };
    let trainable = model.trainable(freeze);
    let checkpoint_dir = opts.out.join("checkpoint");
    let control = RunControl {
        checkpoint_dir: Some(&checkpoint_dir),
        stop_after: opts.stop_after,
        progress: opts.progress,
    };
    let summary = train(
        &model.frozen_view(freeze),
        trainable,
        &data.train,
        &opts.train,
        &control,
    )?;
    if !summary.finished() {
        return Ok(FinetuneOutcome {
            summary,
            dev: None,
            already_finished: false,
        });
    }
    let dev = evaluate(&model, &data.dev, opts.eval_batch_size)?;
    model.save(&opts.out, Some(&tokenizer))?;
    TrainingRecord {
        workflow: "finetune".into(),
        source_model: opts.model.display().to_string(),
        train_file: opts.data.train.display().to_string(),
        dev_file: opts.data.dev.display().to_string(),
        data_settings: Some(data_settings(&opts.data)),
        labels: data.labels,
        freeze_embeddings,
        num_layers: model.num_blocks(),
        variants: model.variants(),
        train_config: opts.train.clone(),
        initialised: info.initialised,
        summary: Some(summary.clone()),
        dev: dev.clone(),
    }
    .write(&opts.out)?;
    // The finished model is saved; the checkpoint would only duplicate it.
    std::fs::remove_dir_all(&checkpoint_dir)?;
    Ok(FinetuneOutcome {
        summary,
        dev: Some(dev),
        already_finished: false,
    })
}

/// The recorded outcome when `opts.out` holds a finished fine-tune with `opts`' settings. Running
/// the resume command once more must not train for hours again and overwrite the model; a finished
/// run of other settings (or another workflow) is refused rather than overwritten. The data files
/// are compared by path: edit them and a new run needs a new `out`.
fn finished_run(opts: &FinetuneOptions, source: &ModelConfig) -> Result<Option<FinetuneOutcome>> {
    let Some(record) = TrainingRecord::read(&opts.out)? else {
        return Ok(None);
    };
    // How often checkpoints were written does not change what was trained.
    let train = TrainConfig {
        checkpoint_every: record.train_config.checkpoint_every,
        ..as_recorded(&opts.train)?
    };
    let freeze = default_freeze(source, opts.freeze_embeddings);
    let same = record.workflow == "finetune"
        && record.source_model == opts.model.display().to_string()
        && record.train_file == opts.data.train.display().to_string()
        && record.dev_file == opts.data.dev.display().to_string()
        && (record.data_settings.as_ref()).is_none_or(|d| *d == data_settings(&opts.data))
        && record.train_config == train
        && record.num_layers == opts.num_layers.unwrap_or(source.num_layers)
        && record.freeze_embeddings == freeze;
    ensure!(
        same,
        InvalidArgument,
        "{} already holds a finished {} run with other settings; choose another output folder \
         or remove it",
        opts.out.display(),
        record.workflow
    );
    let summary = record.summary.ok_or_else(|| {
        Error::Malformed(format!(
            "{}: finished fine-tune without its summary",
            opts.out.join(RECORD_FILE).display()
        ))
    })?;
    Ok(Some(FinetuneOutcome {
        summary,
        dev: Some(record.dev),
        already_finished: true,
    }))
}

/// `config` as it reads back from a record (floats through decimal text), so that equal settings
/// compare equal.
fn as_recorded(config: &TrainConfig) -> Result<TrainConfig> {
    let text = serde_json::to_string(config).map_err(|e| Error::Other(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| Error::Other(e.to_string()))
}

/// The real model behind Algorithm 5.
struct TransformerTarget<'a> {
    model: TrainableTransformer,
    /// The original model, for distillation (`train_config.loss.distill` > 0).
    teacher: Option<TrainableTransformer>,
    train: &'a [EncodedExample],
    dev: &'a [EncodedExample],
    train_config: TrainConfig,
    freeze_embeddings: bool,
    eval_batch_size: usize,
    progress: bool,
}

/// Replaces `op` in `variant` by its privacy-friendly substitute; decoder operators are not
/// an encoder's (an error).
pub fn substituted(variant: BlockVariant, op: Operator) -> Result<BlockVariant> {
    let friendly = BlockVariant::friendly();
    Ok(match op {
        Operator::Gelu => BlockVariant {
            activation: friendly.activation,
            ..variant
        },
        Operator::Softmax => BlockVariant {
            attention: friendly.attention,
            ..variant
        },
        Operator::LayerNorm1 => BlockVariant {
            ln1: friendly.ln1,
            ..variant
        },
        Operator::LayerNorm2 => BlockVariant {
            ln2: friendly.ln2,
            ..variant
        },
        Operator::Silu | Operator::RmsNorm1 | Operator::RmsNorm2 => {
            return Err(Error::InvalidArgument(format!(
                "{} is a decoder operator: an encoder has GELU, Softmax, LN1 and LN2",
                op.label()
            )))
        }
    })
}

impl SubstitutionTarget for TransformerTarget<'_> {
    type Snapshot = (Vec<BlockVariant>, Vec<candle_core::Tensor>);

    fn save(&self, dir: &Path) -> Result<()> {
        self.model.write_state(dir)
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        self.model.read_state(dir)
    }

    fn num_blocks(&self) -> usize {
        self.model.num_blocks()
    }

    fn snapshot(&self) -> Result<Self::Snapshot> {
        Ok((self.model.variants(), self.model.parameter_values()?))
    }

    fn restore(&mut self, (variants, values): &Self::Snapshot) -> Result<()> {
        for (i, v) in variants.iter().enumerate() {
            self.model.set_variant(i, *v)?;
        }
        self.model.set_parameter_values(values)
    }

    fn substitute(&mut self, op: Operator, block: usize) -> Result<()> {
        let current = self.model.variants()[block];
        self.model.set_variant(block, substituted(current, op)?)
    }

    /// Blocks `0 .. block` frozen. For Softmax the paper makes the attention input/output
    /// projections of the block trainable; they belong to block `block`, which is trainable
    /// anyway, so every operator uses the same rule.
    fn finetune(&mut self, request: &FinetuneRequest<'_>) -> Result<Finetuned> {
        let scaled = self.train_config.scaled(self.train.len(), request.budget)?;
        let config = TrainConfig {
            loss: crate::LossWeights {
                bound: request.bound,
                ..self.train_config.loss
            },
            learning_rate: request.learning_rate.unwrap_or(scaled.learning_rate),
            ..scaled
        };
        let freeze = Freeze {
            embeddings: self.freeze_embeddings,
            blocks_below: request.blocks.start,
        };
        let trainable = self.model.trainable(freeze);
        let control = RunControl {
            checkpoint_dir: request.checkpoint_dir,
            stop_after: None,
            progress: self.progress,
        };
        let view = self.model.frozen_view(freeze);
        let teacher = self
            .teacher
            .as_ref()
            .map(|t| t as &dyn crate::SequenceClassifier);
        let summary = train_with_teacher(&view, teacher, trainable, self.train, &config, &control)?;
        Ok(Finetuned {
            mean_loss: summary.mean_loss,
            updates: summary.total_steps,
            resumed_from: summary.resumed_from,
        })
    }

    fn evaluate(&mut self) -> Result<Evaluation> {
        evaluate(&self.model, self.dev, self.eval_batch_size)
    }
}

/// Result of [`substitute`].
#[derive(Clone, Debug)]
pub enum SubstituteOutcome {
    /// Every step done: the report.
    Finished(Box<ReportDocument>),
    /// Stopped by `stop_after_steps`; running again with the same options continues.
    Stopped {
        /// Steps done so far.
        steps_done: usize,
        /// Steps of the whole run.
        total_steps: usize,
    },
}

/// Folder of `out` where a substitution run keeps its progress.
pub const PROGRESS_DIR: &str = "progress";

/// What a substitution run depends on besides its [`SubstitutionConfig`]: progress saved under
/// another fingerprint belongs to another run. Data and weights are hashed, not just named, so
/// a file rewritten in place is noticed too.
fn run_fingerprint(
    opts: &SubstituteOptions,
    data: &PreparedData,
    model: &TrainableTransformer,
    freeze_embeddings: bool,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut weights = Fnv::new();
    for (name, var) in model.params() {
        name.bytes().for_each(|b| weights.eat(b as u32));
        let values = var
            .as_tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(veil_model::candle_error("hashing the weights"))?;
        values.iter().for_each(|v| weights.eat(v.to_bits()));
    }
    // Absolute, so the same run started from another directory is still the same run.
    let absolute = |p: &Path| -> Result<serde_json::Value> {
        let p = std::fs::canonicalize(p)
            .map_err(|e| Error::Other(format!("cannot resolve {}: {e}", p.display())))?;
        Ok(p.display().to_string().into())
    };
    let json_err = |e: serde_json::Error| Error::Other(e.to_string());
    let mut map = serde_json::Map::new();
    let mut put = |key: &str, value: serde_json::Value| map.insert(key.into(), value);
    put("model", absolute(&opts.model)?);
    put("model_weights", format!("{:016x}", weights.0).into());
    put("train_file", absolute(&opts.data.train)?);
    put("dev_file", absolute(&opts.data.dev)?);
    put(
        "train_data",
        format!("{:016x}", data_fingerprint(&data.train)).into(),
    );
    put(
        "dev_data",
        format!("{:016x}", data_fingerprint(&data.dev)).into(),
    );
    put(
        "labels",
        serde_json::to_value(&data.labels).map_err(json_err)?,
    );
    put(
        "train_config",
        serde_json::to_value(&opts.train).map_err(json_err)?,
    );
    put("freeze_embeddings", freeze_embeddings.into());
    put("eval_batch_size", opts.eval_batch_size.into());
    Ok(map)
}

/// Runs Algorithm 5 on a fine-tuned classifier folder and writes the accepted model and the
/// reports (`substitution.{json,md}`, `accuracy.svg`) into `opts.out`.
///
/// Progress is kept in `out/progress` after every step, and an interrupted run continues from
/// it when run again with the same options. The folder stays when the run finishes (running
/// again then only rewrites the model and the reports); remove it to start over.
pub fn substitute(opts: &SubstituteOptions) -> Result<SubstituteOutcome> {
    // Bad settings fail now, not after the original model's evaluation.
    opts.train.validate()?;
    let config = folder::load_config(&opts.model)?;
    let tokenizer = tokenizer_for(
        &opts.model,
        opts.data.max_seq_len,
        config.max_sequence_len(),
    )?;
    let prior = TrainingRecord::read(&opts.model)?;
    let data = prepare(
        &opts.data,
        prior.as_ref().map(|r| r.labels.clone()),
        &tokenizer,
    )?;
    check_inputs(&config, data.inputs, &opts.data.train)?;
    let (mut model, info) =
        TrainableTransformer::load(&opts.model, data.labels.len(), None, opts.train.seed)?;
    // A folder fine-tuned before the kind was recorded gets it here.
    model.record_inputs(data.inputs);
    if !info.initialised.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{} has no trained classifier ({} missing); run `veil finetune` first",
            opts.model.display(),
            info.initialised.join(", ")
        )));
    }
    let freeze_embeddings = opts
        .freeze_embeddings
        .or(prior.as_ref().map(|r| r.freeze_embeddings))
        .unwrap_or(default_freeze(model.config(), None));
    let fingerprint = run_fingerprint(opts, &data, &model, freeze_embeddings)?;
    // Loaded once from the source folder and never trained: every step distils towards the
    // original model, also after a resume.
    let teacher = if opts.train.loss.distill > 0.0 {
        let (teacher, _) =
            TrainableTransformer::load(&opts.model, data.labels.len(), None, opts.train.seed)?;
        Some(teacher)
    } else {
        None
    };
    let mut target = TransformerTarget {
        model,
        teacher,
        train: &data.train,
        dev: &data.dev,
        train_config: opts.train.clone(),
        freeze_embeddings,
        eval_batch_size: opts.eval_batch_size,
        progress: opts.progress,
    };
    let progress_dir = opts.out.join(PROGRESS_DIR);
    let resume = Resume {
        dir: &progress_dir,
        fingerprint,
        stop_after: opts.stop_after_steps,
    };
    let progress = opts.progress;
    let outcome = run_substitution(&mut target, &opts.substitution, Some(&resume), |step| {
        if progress {
            eprintln!(
                "{} block {}: dev accuracy {:.2} % → {}{}",
                step.operator.label(),
                step.blocks_label(),
                100.0 * step.accuracy,
                if step.accepted {
                    "accepted"
                } else {
                    "rejected"
                },
                if step.resumed { " (resumed)" } else { "" }
            );
        }
    })?;
    let report = match outcome {
        RunOutcome::Finished(report) => report,
        RunOutcome::Stopped {
            steps_done,
            total_steps,
        } => {
            return Ok(SubstituteOutcome::Stopped {
                steps_done,
                total_steps,
            })
        }
    };
    let model = target.model;
    model.save(&opts.out, Some(&tokenizer))?;
    TrainingRecord {
        workflow: "substitute".into(),
        source_model: opts.model.display().to_string(),
        train_file: opts.data.train.display().to_string(),
        dev_file: opts.data.dev.display().to_string(),
        data_settings: Some(data_settings(&opts.data)),
        labels: data.labels,
        freeze_embeddings,
        num_layers: model.num_blocks(),
        variants: model.variants(),
        train_config: opts.train.clone(),
        initialised: vec![],
        summary: None,
        dev: report.final_evaluation.clone(),
    }
    .write(&opts.out)?;
    let fixed_point = match opts.simulate_examples.min(data.dev.len()) {
        0 => None,
        k => Some(check_fixed_point(
            &model.transformer,
            &data.dev[..k],
            FixedPoint::default_format(),
        )?),
    };
    let doc = ReportDocument {
        model: opts
            .model
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into()),
        task: opts
            .data
            .dev
            .file_name()
            .map_or("dev".into(), |n| n.to_string_lossy().into()),
        substitution: report,
        fixed_point,
    };
    write_reports(&opts.out, &doc)?;
    Ok(SubstituteOutcome::Finished(Box::new(doc)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(pair: Option<&str>) -> Example {
        Example {
            line: 1,
            text_a: "a".into(),
            text_b: pair.map(Into::into),
            label: "0".into(),
        }
    }

    /// A file is single texts or pairs, never both; a classifier that records its kind
    /// refuses the other, one that does not takes either.
    #[test]
    fn data_of_one_kind_and_of_the_model_s_kind() {
        let file = Path::new("d.tsv");
        let (single, pair) = (example(None), example(Some("b")));
        assert_eq!(
            inputs_of(std::slice::from_ref(&single), file).unwrap(),
            Inputs::Single
        );
        assert_eq!(
            inputs_of(std::slice::from_ref(&pair), file).unwrap(),
            Inputs::Pairs
        );
        let err = inputs_of(&[single, pair], file).unwrap_err().to_string();
        assert!(
            err.contains("1 of its 2 examples are sentence pairs"),
            "{err}"
        );

        let mut config = ModelConfig::builder(veil_model::Architecture::Bert)
            .vocab(10)
            .hidden(8)
            .layers(1)
            .ffn(16)
            .head(veil_model::HeadKind::MeanPool)
            .build()
            .unwrap();
        check_inputs(&config, Inputs::Pairs, file).unwrap();
        config.veil.inputs = Some(Inputs::Single);
        check_inputs(&config, Inputs::Single, file).unwrap();
        let err = check_inputs(&config, Inputs::Pairs, file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("classifies single texts"), "{err}");
    }
}
