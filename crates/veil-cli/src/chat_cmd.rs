//! `veil chat`: a multi-turn conversation with a decoder in its chat template, one line of input
//! per turn. The KV cache carries across turns: each turn runs only the tokens the cache lacks
//! (the new user line and the template around it).

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;
use veil_core::{Error, Result};
use veil_model::decoder::sample::SamplingParams;
use veil_model::decoder::ChatMessage;
use veil_model::GenerateOptions;

use crate::decoding::{CachedSession, CommandModel, Engine, EngineArgs, Finish};

#[derive(Args)]
pub(crate) struct ChatArgs {
    /// A decoder with a chat template: `smollm2-135m-instruct`, a `.gguf` file or a Hugging Face
    /// folder.
    #[arg(long)]
    model: String,
    #[command(flatten)]
    engine: EngineArgs,
    /// The system line (default: the template's own).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// 0: greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Reads turns from standard input until end of input or an empty line; `/reset` forgets the
/// conversation.
pub(crate) fn chat_cmd(a: ChatArgs) -> Result<()> {
    let model = CommandModel::load(&a.model, &a.engine, true)?;
    let engine = Engine::new(a.engine, &model)?;
    let mut session = CachedSession::new(&engine);
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: 0,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop: model.config().eos_token_ids.clone(),
        fixed_length: engine.fixed_length(),
        pad_to: engine.pad_to(),
    };
    let opening: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s))
        .collect();
    let mut messages = opening.clone();
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "veil chat ({}, {}): an empty line or end of input ends, /reset forgets",
            a.model,
            engine.mode()
        );
    }
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(Error::Io)?;
        let line = line.trim();
        if line.is_empty() {
            break;
        }
        if line == "/reset" {
            messages = opening.clone();
            session.reset();
            continue;
        }
        messages.push(ChatMessage::new("user", line));
        let ids = session.chat_prompt(model.tokenizer(), &messages)?;
        let mut answer = String::new();
        let (tokens, finish, reused) = session.generate(&model, &ids, &opts, |piece| {
            answer.push_str(piece);
            write!(out, "{piece}")
                .and_then(|_| out.flush())
                .map_err(Error::Io)
        })?;
        writeln!(out).map_err(Error::Io)?;
        eprintln!(
            "[{} new tokens{}; {} of {} prompt tokens from the cache]",
            tokens.len(),
            if finish == Finish::Length {
                ", cut at --max-new-tokens"
            } else {
                ""
            },
            reused,
            ids.len()
        );
        messages.push(ChatMessage::new("assistant", &answer));
    }
    for w in session.warnings() {
        eprintln!("veil chat: simulator warning: {w}");
    }
    Ok(())
}
