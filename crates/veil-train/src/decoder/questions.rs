//! Quality on a question set: greedy answers (chat template, a few new tokens) of a substituted
//! decoder against the original's, scored as exact match of the answer text and agreement of
//! the first answer token.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};
use veil_model::decoder::{argmax, ChatMessage, DecoderTokenizer};

use super::model::{KvCache, TrainableDecoder};
use super::stage::{apply_stage, read_stage_info};
use super::workflow::load_trainable;

/// The questions of a file: one per line; blank lines and `#` comments skipped.
pub fn read_questions(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::InvalidArgument(format!("cannot read {}: {e}", path.display())))?;
    let qs: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    ensure!(
        !qs.is_empty(),
        InvalidArgument,
        "{} has no questions",
        path.display()
    );
    Ok(qs)
}

/// A decoder to score: a stage folder of the substitution workflow (its base plus the changed
/// tensors), or anything `--model` takes (a Hugging Face folder with its `"veil"` variants, a
/// GGUF file, a built-in name). Returns the model, its tokenizer, and the stage's base.
pub fn load_scored(spec: &str) -> Result<(TrainableDecoder, DecoderTokenizer, Option<String>)> {
    let dir = Path::new(spec);
    if dir.is_dir() {
        if let Some(info) = read_stage_info(dir)? {
            let (mut model, tokenizer) = load_trainable(&info.base)?;
            apply_stage(dir, &mut model)?;
            return Ok((model, tokenizer, Some(info.base)));
        }
    }
    let (model, tokenizer) = load_trainable(spec)?;
    Ok((model, tokenizer, None))
}

/// Greedy continuation of `prompt`: at most `max_new` tokens, stopping after an EOS id.
pub fn greedy(model: &TrainableDecoder, prompt: &[u32], max_new: usize) -> Result<Vec<u32>> {
    let mut cache = KvCache::default();
    let mut out = Vec::new();
    let mut logits = model.step(prompt, &mut cache)?;
    let eos = &model.config().eos_token_ids;
    while out.len() < max_new {
        let next = argmax(&logits)?;
        out.push(next);
        if eos.contains(&next) || out.len() == max_new {
            break;
        }
        if cache.len() + 1 > model.config().max_positions {
            break;
        }
        logits = model.step(&[next], &mut cache)?;
    }
    Ok(out)
}

/// One question's answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionScore {
    /// The question.
    pub question: String,
    /// The original model's answer.
    pub original: String,
    /// The scored model's answer.
    pub student: String,
    /// Whether the answer texts are equal (trimmed).
    pub exact: bool,
    /// Whether the first answer tokens are equal.
    pub first_token: bool,
    /// Whether the answers' first sentences say the same ([`first_sentence`]).
    #[serde(default)]
    pub same_first_sentence: bool,
}

/// The first sentence of an answer, normalised for comparison: the text up to the first line
/// break or the first '.', '!' or '?' followed by a space or the end (so "3.14" does not end
/// one), lower-cased, with runs of anything but letters and digits made one space.
///
/// Why this is the question set's main score: a short factual answer's content is its first
/// sentence ("The capital of France is Paris."); whole greedy answers of 24 tokens drift apart
/// in their later, optional sentences even when the answer is the same, and a first token
/// ("The") says nothing about the content.
pub fn first_sentence(answer: &str) -> String {
    let chars: Vec<char> = answer.trim().chars().collect();
    let end = (0..chars.len())
        .find(|&i| {
            chars[i] == '\n'
                || (matches!(chars[i], '.' | '!' | '?')
                    && chars.get(i + 1).is_none_or(|c| c.is_whitespace()))
        })
        .unwrap_or(chars.len());
    let mut out = String::new();
    for c in chars[..end].iter().flat_map(|c| c.to_lowercase()) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with(' ') {
            out.push(' ');
        }
    }
    out.trim_end().to_string()
}

/// Scores of a question set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionReport {
    /// The scored model.
    pub model: String,
    /// The original it is compared with.
    pub original: String,
    /// New tokens per answer at most.
    pub max_new_tokens: usize,
    /// Fraction of exact matches.
    pub exact_match: f64,
    /// Fraction of equal first tokens.
    pub first_token_agreement: f64,
    /// Fraction of answers whose first sentences say the same ([`first_sentence`]).
    #[serde(default)]
    pub first_sentence_match: f64,
    /// Every question.
    pub questions: Vec<QuestionScore>,
    /// Wall time.
    pub seconds: f64,
}

impl QuestionReport {
    /// A Markdown table.
    pub fn markdown(&self) -> String {
        let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        let mut s = format!(
            "# Questions: {} vs {}\n\nSame first sentence {:.3}, exact match {:.3}, first-token \
             agreement {:.3} over {} questions (greedy, ≤ {} new tokens).\n\n\
             | question | original | scored | same first sentence | exact |\n\
             |---|---|---|---|---|\n",
            self.model,
            self.original,
            self.first_sentence_match,
            self.exact_match,
            self.first_token_agreement,
            self.questions.len(),
            self.max_new_tokens
        );
        for q in &self.questions {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                cell(&q.question),
                cell(&q.original),
                cell(&q.student),
                if q.same_first_sentence { "yes" } else { "no" },
                if q.exact { "yes" } else { "no" }
            ));
        }
        s
    }
}

fn prompt(tokenizer: &DecoderTokenizer, question: &str) -> Result<Vec<u32>> {
    let text = tokenizer.render_chat(&[ChatMessage::new("user", question)], true)?;
    tokenizer.encode(&text)
}

/// Answers every question with both models and compares them.
pub fn score_questions(
    scored: (&TrainableDecoder, &str),
    original: (&TrainableDecoder, &str),
    tokenizer: &DecoderTokenizer,
    questions: &[String],
    max_new_tokens: usize,
) -> Result<QuestionReport> {
    ensure!(
        max_new_tokens > 0,
        InvalidArgument,
        "max new tokens must be > 0"
    );
    let started = Instant::now();
    let mut out = Vec::with_capacity(questions.len());
    for q in questions {
        let ids = prompt(tokenizer, q)?;
        let a = greedy(original.0, &ids, max_new_tokens)?;
        let b = greedy(scored.0, &ids, max_new_tokens)?;
        let text = |ids: &[u32]| -> Result<String> {
            let eos = &original.0.config().eos_token_ids;
            let kept: Vec<u32> = ids.iter().copied().filter(|t| !eos.contains(t)).collect();
            Ok(tokenizer.decode(&kept)?.trim().to_string())
        };
        let (ta, tb) = (text(&a)?, text(&b)?);
        out.push(QuestionScore {
            question: q.clone(),
            exact: ta == tb,
            first_token: a.first() == b.first(),
            same_first_sentence: first_sentence(&ta) == first_sentence(&tb),
            original: ta,
            student: tb,
        });
    }
    let n = out.len().max(1) as f64;
    Ok(QuestionReport {
        model: scored.1.to_string(),
        original: original.1.to_string(),
        max_new_tokens,
        exact_match: out.iter().filter(|q| q.exact).count() as f64 / n,
        first_token_agreement: out.iter().filter(|q| q.first_token).count() as f64 / n,
        first_sentence_match: out.iter().filter(|q| q.same_first_sentence).count() as f64 / n,
        questions: out,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::first_sentence;

    #[test]
    fn first_sentences_compare_the_content() {
        let paris = first_sentence("The capital of France is Paris. It is known for the Eiffel");
        assert_eq!(paris, "the capital of france is paris");
        assert_eq!(
            first_sentence("  the capital of France is  PARIS!\nMore"),
            paris
        );
        assert_ne!(first_sentence("The capital of France is Lyon."), paris);
        assert_eq!(first_sentence("Pi is 3.14. Roughly."), "pi is 3 14");
        assert_eq!(first_sentence("7 × 8 = 56"), "7 8 56");
        assert_eq!(
            first_sentence("Bonjour, le monde\nHello"),
            "bonjour le monde"
        );
        assert_eq!(first_sentence("Why? Because."), "why");
        assert_eq!(first_sentence(""), "");
        assert_eq!(first_sentence("..."), "");
    }
}
