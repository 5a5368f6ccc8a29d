//! Chat text the original model answers itself: the distillation text closest to how a chat
//! model is used, and the held-out text whose top-1 agreement matters for generation.
//!
//! Review snippets read as running text are high-entropy (SmolLM2's perplexity on them is
//! ≈ 143): many positions are near-ties between tokens, so top-1 agreement there mostly measures
//! which side of a tie a student falls on. A generated answer is what the private model will
//! actually produce, token after token. So each sentence of a dataset file becomes a user turn
//! through one of [`TEMPLATES`] (questions, instructions, translation, the sentence alone), the
//! original answers it greedily in its chat template, and the sequence is the prompt followed by
//! that answer. Training (KL at every position) sees both; the evaluation scores only the
//! positions that predict answer tokens ([`Answered::prompt_len`]), i.e. whether the student
//! would have chosen the original's next token along the original's own greedy answer.
//!
//! Answers are greedy, hence deterministic for a model and a prompt; generating them takes a
//! while (one cached decoding step per token), so they are kept in a JSON file beside the run
//! (`answers-<kind>.json`, with a fingerprint of the model, the prompts and the length) and
//! the generation resumes from it.

use std::path::Path;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Result};
use veil_model::decoder::{ChatMessage, DecoderTokenizer};

use super::distill::sequences_fingerprint;
use super::model::TrainableDecoder;
use super::questions::greedy;
use crate::checkpoint::{io_err, write_json_atomically};
use crate::train::Fnv;

/// The user turns made of a sentence `{}`: requests of the kinds a chat model gets, all of
/// which the original answers in a few sentences.
pub const TEMPLATES: &[&str] = &[
    "{}",
    "What is the sentiment of this sentence? \"{}\"",
    "Summarize in one sentence: {}",
    "Translate into French: {}",
    "Rewrite this more formally: {}",
    "Explain what this means: {}",
    "Give this text a short title: {}",
    "Is this statement positive or negative, and why? {}",
];

/// A sentence's chat sequence: the rendered prompt and the original's answer after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// Prompt then answer.
    pub ids: Vec<u32>,
    /// Tokens of the prompt; position `prompt_len − 1` predicts the answer's first token.
    pub prompt_len: usize,
}

/// Chat prompts of at most `max_prompt` tokens from `sentences` (shuffled with `seed`, the
/// templates dealt in turn), at most `limit` of them (0: every sentence that fits).
pub fn chat_prompts(
    tokenizer: &DecoderTokenizer,
    sentences: &[String],
    seed: u64,
    limit: usize,
    max_prompt: usize,
) -> Result<Vec<Vec<u32>>> {
    ensure!(
        tokenizer.has_chat_template(),
        InvalidArgument,
        "answered chat text needs a model with a chat template"
    );
    let mut order: Vec<&String> = sentences.iter().collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    let mut out = Vec::new();
    for s in order {
        if limit > 0 && out.len() == limit {
            break;
        }
        let user = TEMPLATES[out.len() % TEMPLATES.len()].replace("{}", s.trim());
        let text = tokenizer.render_chat(&[ChatMessage::new("user", &user)], true)?;
        let ids = tokenizer.encode(&text)?;
        if ids.len() <= max_prompt {
            out.push(ids);
        }
    }
    ensure!(
        !out.is_empty(),
        InvalidArgument,
        "no prompt of at most {max_prompt} tokens could be made from the text"
    );
    Ok(out)
}

#[derive(Serialize, Deserialize)]
struct AnswerFile {
    fingerprint: String,
    /// The answers so far, in prompt order.
    answers: Vec<Vec<u32>>,
}

/// Answers saved after every this many new ones.
const SAVE_EVERY: usize = 16;

/// Every prompt followed by `teacher`'s greedy answer, each sequence at most `len` tokens
/// (prompts must be shorter than `len`). Kept in `cache` and resumed from it when its
/// fingerprint (the teacher's `weights_hash`, the prompts, `len`) matches; a file for other
/// inputs is replaced.
pub fn answer_all(
    teacher: &TrainableDecoder,
    weights_hash: u64,
    prompts: &[Vec<u32>],
    len: usize,
    cache: &Path,
    progress: bool,
) -> Result<Vec<Answered>> {
    ensure!(
        prompts.iter().all(|p| !p.is_empty() && p.len() < len),
        InvalidArgument,
        "every prompt must have between 1 and {} tokens to leave room for an answer",
        len - 1
    );
    let prompts_hash = sequences_fingerprint(prompts);
    let mut h = Fnv::new();
    for x in [
        weights_hash as u32,
        (weights_hash >> 32) as u32,
        prompts_hash as u32,
        (prompts_hash >> 32) as u32,
        len as u32,
    ] {
        h.eat(x);
    }
    let fingerprint = format!("{:016x}", h.0);
    let mut file = match std::fs::read(cache) {
        Ok(bytes) => serde_json::from_slice::<AnswerFile>(&bytes)
            .ok()
            .filter(|f| f.fingerprint == fingerprint && f.answers.len() <= prompts.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("cannot read", cache, e)),
    }
    .unwrap_or(AnswerFile {
        fingerprint,
        answers: Vec::new(),
    });
    let started = Instant::now();
    let resumed = file.answers.len();
    while file.answers.len() < prompts.len() {
        let prompt = &prompts[file.answers.len()];
        file.answers
            .push(greedy(teacher, prompt, len - prompt.len())?);
        let done = file.answers.len();
        if done % SAVE_EVERY == 0 || done == prompts.len() {
            write_json_atomically(cache, &file)?;
            if progress {
                let rate = started.elapsed().as_secs_f64() / (done - resumed) as f64;
                eprintln!(
                    "answers {done}/{} ({rate:.2} s each) in {}",
                    prompts.len(),
                    cache.display()
                );
            }
        }
    }
    Ok(prompts
        .iter()
        .zip(file.answers)
        .map(|(p, a)| Answered {
            prompt_len: p.len(),
            ids: p.iter().chain(&a).copied().collect(),
        })
        .collect())
}
