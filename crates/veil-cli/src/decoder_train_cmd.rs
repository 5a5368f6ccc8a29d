//! `veil substitute-decoder` and `veil eval-decoder`: the command-line faces of veil-train's
//! decoder workflow (issue #38).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use veil_core::{ensure, Result};
use veil_model::decoder::DecoderActivation;
use veil_train::decoder::questions::load_scored;
use veil_train::decoder::{
    read_questions, score_questions, substitute_decoder, DecoderOutcome, DecoderSubstituteOptions,
    DecoderText, Scope,
};
use veil_train::{BlockOrder, Operator};

use crate::train_cmd::BlockOrderArg;

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ScopeArg {
    /// Only the block whose operator was replaced.
    Block,
    /// That block and every block above it.
    Above,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum SiluSubstituteArg {
    /// x·min(max(x + 3, 0), 6)/6: SiLU's shape, a ReLU call on x ± 3 and two products.
    HardSwish,
    /// max(x, 0): cheapest (no products), furthest from SiLU.
    Relu,
}

impl SiluSubstituteArg {
    pub(crate) fn activation(self) -> DecoderActivation {
        match self {
            SiluSubstituteArg::HardSwish => DecoderActivation::HardSwish,
            SiluSubstituteArg::Relu => DecoderActivation::Relu,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum TextArg {
    /// Chat prompts answered by the original.
    Answers,
    /// Unanswered chat prompts and plain running text.
    Mix,
}

#[derive(Args)]
pub(crate) struct SubstituteDecoderArgs {
    /// The original decoder: a built-in name (smollm2-135m-instruct), a .gguf file or a Hugging
    /// Face Llama folder.
    #[arg(long)]
    model: String,
    /// Output folder: progress (resumable), per-step reports, and the final model.
    #[arg(long)]
    out: PathBuf,
    /// Training text, a dataset file whose labels are ignored (repeatable; default: the shared
    /// SST-2 and MRPC train files).
    #[arg(long)]
    train: Vec<PathBuf>,
    /// Held-out text (repeatable; default: the shared SST-2 and MRPC dev files).
    #[arg(long)]
    held_out: Vec<PathBuf>,
    /// The text: `answers` (each sentence in a chat prompt, answered by the original; the
    /// evaluation scores the answers) or `mix` (unanswered prompts and plain running text).
    #[arg(long, value_enum, default_value_t = TextArg::Answers)]
    text: TextArg,
    /// Tokens per sequence (an answered prompt takes at most half).
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Training sequences kept (0: all the text makes; `answers` needs a number, as each is
    /// generated).
    #[arg(long, default_value_t = 1024)]
    train_sequences: usize,
    /// Held-out sequences of the evaluation.
    #[arg(long, default_value_t = 48)]
    held_out_sequences: usize,
    /// Held-out sequences per evaluation batch.
    #[arg(long, default_value_t = 8)]
    eval_batch_size: usize,
    /// Updates of each step's fine-tuning.
    #[arg(long)]
    updates: Option<u64>,
    /// Sequences per update.
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
    /// A training checkpoint every N updates (0: none).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Weight of the hidden-state term (last block's outputs vs the original's) next to the KL.
    #[arg(long)]
    hidden_weight: Option<f64>,
    /// What a step fine-tunes: the replaced block, or it and every block above.
    #[arg(long, value_enum)]
    trainable: Option<ScopeArg>,
    /// Operators to replace, in stage order: silu, softmax, rms1, rms2.
    #[arg(long, value_delimiter = ',', default_value = "silu,softmax")]
    operators: Vec<Operator>,
    /// What SiLU becomes.
    #[arg(long, value_enum, default_value_t = SiluSubstituteArg::HardSwish)]
    silu_substitute: SiluSubstituteArg,
    /// Order in which each stage visits the blocks: down (n−1 … 0, the paper's) or up.
    #[arg(long, value_enum, default_value_t = BlockOrderArg::Down)]
    block_order: BlockOrderArg,
    /// Blocks a step replaces together, fine-tuned once for the group (1: one block a step;
    /// the model's block count or more: a stage in one step): one value for every stage, or
    /// one per operator of --operators (`30,5`).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    blocks_per_step: Vec<usize>,
    /// Keep a step when its held-out top-1 agreement with the original is at least this.
    #[arg(long, default_value_t = 0.9)]
    threshold: f64,
    /// Retry a rejected step up to N times with --retry-factor times the updates.
    #[arg(long, default_value_t = 0)]
    retries: u32,
    #[arg(long, default_value_t = 2.0)]
    retry_factor: f64,
    /// Seed of the data shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop after this many steps (counting earlier runs); the same command again resumes
    /// from OUT/progress, as it does after an interruption.
    #[arg(long)]
    max_steps: Option<usize>,
}

fn shared(name: &str, file: &str) -> Result<PathBuf> {
    Ok(veil_model::data::shared_dataset(name)?.join(file))
}

fn set<T>(dst: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *dst = v;
    }
}

pub(crate) fn substitute_decoder_cmd(a: SubstituteDecoderArgs, quiet: bool) -> Result<()> {
    let started = Instant::now();
    let train = match a.train.is_empty() {
        false => a.train.clone(),
        true => vec![
            shared("sst2", "stsa.binary.train")?,
            shared("mrpc", "train.tsv")?,
        ],
    };
    let held_out = match a.held_out.is_empty() {
        false => a.held_out.clone(),
        true => vec![
            shared("sst2", "stsa.binary.dev")?,
            shared("mrpc", "dev.tsv")?,
        ],
    };
    let mut o = DecoderSubstituteOptions::new(&a.model, &a.out, train, held_out);
    o.text = match a.text {
        TextArg::Answers => DecoderText::Answers,
        TextArg::Mix => DecoderText::Mix,
    };
    o.seq_len = a.seq_len;
    o.train_sequences = a.train_sequences;
    o.held_out_sequences = a.held_out_sequences;
    o.eval_batch_size = a.eval_batch_size;
    let s = &mut o.settings;
    set(&mut s.updates, a.updates);
    set(&mut s.batch_size, a.batch_size);
    set(&mut s.learning_rate, a.lr);
    set(&mut s.warmup_fraction, a.warmup);
    set(&mut s.max_grad_norm, a.max_grad_norm);
    set(&mut s.checkpoint_every, a.checkpoint_every);
    set(&mut s.hidden_weight, a.hidden_weight);
    set(
        &mut s.scope,
        a.trainable.map(|t| match t {
            ScopeArg::Block => Scope::Block,
            ScopeArg::Above => Scope::Above,
        }),
    );
    o.operators = a.operators.clone();
    o.silu_substitute = a.silu_substitute.activation();
    o.block_order = match a.block_order {
        BlockOrderArg::Down => BlockOrder::Down,
        BlockOrderArg::Up => BlockOrder::Up,
    };
    o.blocks_per_step = a.blocks_per_step.clone();
    o.threshold = a.threshold;
    o.retries = a.retries;
    o.retry_factor = a.retry_factor;
    o.seed = a.seed;
    o.stop_after_steps = a.max_steps;
    o.progress = !quiet;
    let report = match substitute_decoder(&o)? {
        DecoderOutcome::Finished(r) => r,
        DecoderOutcome::Stopped {
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
    println!(
        "{}",
        serde_json::json!({
            "out": a.out,
            "original_perplexity": report.original.perplexity,
            "final_agreement": report.final_evaluation.accuracy,
            "final_perplexity": report.final_evaluation.perplexity,
            "replaced": a.operators.iter().map(|&op| (op.label(), report.replaced(op))).collect::<Vec<_>>(),
            "resumed_steps": report.resumed_steps(),
            "reports": ["steps.json", "steps.md", "substitution.json", "substitution.md"],
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

#[derive(Args)]
pub(crate) struct EvalDecoderArgs {
    /// The decoder to score: a stage folder of substitute-decoder (its output or a
    /// progress/state-K folder), a Hugging Face folder, a .gguf file or a built-in name.
    #[arg(long)]
    model: String,
    /// The original to compare with (default: the stage's base model).
    #[arg(long)]
    original: Option<String>,
    /// Questions, one per line (`#` comments and blank lines skipped).
    #[arg(long)]
    questions: PathBuf,
    /// New tokens per answer at most.
    #[arg(long, default_value_t = 24)]
    max_new_tokens: usize,
    /// Also write questions.json and questions.md (every answer) into this folder.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub(crate) fn eval_decoder_cmd(a: EvalDecoderArgs) -> Result<()> {
    let questions = read_questions(&a.questions)?;
    let (scored, tokenizer, base) = load_scored(&a.model)?;
    let original_spec = match (a.original.clone(), base) {
        (Some(o), _) => o,
        (None, Some(b)) => b,
        (None, None) => {
            return Err(veil_core::Error::InvalidArgument(format!(
                "{} is not a stage folder of substitute-decoder: name the model to compare \
                 with by --original",
                a.model
            )))
        }
    };
    let (original, _, _) = load_scored(&original_spec)?;
    ensure!(
        original.config().vocab_size == scored.config().vocab_size,
        InvalidArgument,
        "{} and {} have different vocabularies",
        a.model,
        original_spec
    );
    let report = score_questions(
        (&scored, &a.model),
        (&original, &original_spec),
        &tokenizer,
        &questions,
        a.max_new_tokens,
    )?;
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_vec_pretty(&report)
            .map_err(|e| veil_core::Error::Other(e.to_string()))?;
        std::fs::write(dir.join("questions.json"), json)?;
        std::fs::write(dir.join("questions.md"), report.markdown())?;
    }
    println!(
        "{}",
        serde_json::json!({
            "model": a.model,
            "original": original_spec,
            "questions": report.questions.len(),
            "first_sentence_match": report.first_sentence_match,
            "exact_match": report.exact_match,
            "first_token_agreement": report.first_token_agreement,
            "seconds": report.seconds,
        })
    );
    Ok(())
}
