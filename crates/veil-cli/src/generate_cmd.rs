//! `veil generate`: text from a decoder LLM, privately with a `veil serve` of it (`--connect`),
//! or on this machine in f32 (`--f32`) or in the fixed-point simulator (`--simulate`, the
//! integers the private pass must produce), printed as the tokens come.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use veil_core::{Error, Result};
use veil_model::decoder::sample::SamplingParams;
use veil_model::decoder::{ChatMessage, DecoderTokenizer};
use veil_model::{GenerateOptions, GeneratedToken, NextLogits};

use crate::decoding::{stream_text, CommandModel, Engine, EngineArgs, Finish};

#[derive(Args)]
pub(crate) struct GenerateArgs {
    /// A decoder: `smollm2-135m-instruct`, a `.gguf` file, a Hugging Face folder or a model id in
    /// the local Hugging Face cache; with --connect also a client bundle (`veil export-client`).
    #[arg(long)]
    model: String,
    #[command(flatten)]
    engine: EngineArgs,
    /// Wrap the prompt in the model's chat template (its default system line, one user turn,
    /// the generation prompt).
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0: greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// 0: all tokens.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object at the end (token ids, text, per-step top-1/top-2 logit margins) instead
    /// of streamed text.
    #[arg(long)]
    json: bool,
    prompt: String,
}

#[derive(Serialize)]
struct Report<'a> {
    model: &'a str,
    mode: &'a str,
    prompt_tokens: usize,
    token_ids: Vec<u32>,
    text: String,
    margins: Vec<f32>,
    stopped: bool,
    prefill_seconds: f64,
    decode_seconds: f64,
    warnings: Vec<String>,
}

/// The prompt's token ids: one user turn in the chat template, or the plain text.
fn ids_of(tokenizer: &DecoderTokenizer, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    if chat {
        return tokenizer.chat_ids(&[ChatMessage::new("user", prompt)]);
    }
    tokenizer.encode(prompt)
}

pub(crate) fn generate_cmd(a: GenerateArgs) -> Result<()> {
    let model = CommandModel::load(&a.model, &a.engine, false)?;
    let engine = Engine::new(a.engine, &model)?;
    let mode = engine.mode();
    let ids = ids_of(model.tokenizer(), &a.prompt, a.chat)?;
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop: model.config().eos_token_ids.clone(),
        fixed_length: engine.fixed_length(),
        pad_to: engine.pad_to(),
    };
    let mut session = engine.session()?;
    let (tokens, stopped, times) =
        stream_timed(session.as_mut(), model.tokenizer(), &ids, &opts, a.json)?;
    let warnings = session.warnings();
    for w in &warnings {
        eprintln!("veil generate: simulator warning: {w}");
    }
    let token_ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
    if a.json {
        let report = Report {
            model: &a.model,
            mode,
            prompt_tokens: ids.len(),
            text: model.tokenizer().decode(&token_ids)?,
            token_ids,
            margins: tokens.iter().map(|t| t.margin).collect(),
            stopped,
            prefill_seconds: times.0,
            decode_seconds: times.1,
            warnings,
        };
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::Malformed(format!("JSON output: {e}")))?;
        println!("{text}");
    } else {
        println!();
        let decode_rate = if tokens.len() > 1 {
            (tokens.len() - 1) as f64 / times.1
        } else {
            0.0
        };
        eprintln!(
            "veil generate ({mode}): {} prompt tokens in {:.2} s ({:.1} tokens/s), {} new tokens, {:.2} tokens/s decoding{}",
            ids.len(),
            times.0,
            ids.len() as f64 / times.0,
            tokens.len(),
            decode_rate,
            if stopped { ", stopped at the stop token" } else { "" }
        );
    }
    Ok(())
}

/// Generates, streaming the text to stdout unless `quiet`; returns the tokens, whether a stop
/// token ended them, and the seconds of prefill (prompt + first token) and of the decode steps.
/// (`veil demo` of a decoder streams its answer with it too.)
pub(crate) fn stream_timed(
    session: &mut dyn NextLogits,
    tokenizer: &DecoderTokenizer,
    ids: &[u32],
    opts: &GenerateOptions,
    quiet: bool,
) -> Result<(Vec<GeneratedToken>, bool, (f64, f64))> {
    let start = Instant::now();
    let mut first: Option<f64> = None;
    let mut out = std::io::stdout();
    let (tokens, finish) = stream_text(session, tokenizer, ids, opts, |piece| {
        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
        if !quiet {
            write!(out, "{piece}")
                .and_then(|_| out.flush())
                .map_err(Error::Io)?;
        }
        Ok(())
    })?;
    let total = start.elapsed().as_secs_f64();
    let prefill = first.unwrap_or(total);
    Ok((tokens, finish == Finish::Stop, (prefill, total - prefill)))
}
