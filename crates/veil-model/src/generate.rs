//! Text generation with any decoder engine: prefill the prompt in one step, then one token per
//! step against the KV cache, each chosen by [`crate::decoder::sample::Sampler`] from the f32 logits,
//! until a stop token or the token limit.

use veil_core::Result;

use crate::decode_f32::F32Decoder;
use crate::decode_sim::DecoderSim;
use crate::decoder::sample::{Sampler, SamplingParams};
use crate::decoder::DecoderTokenizer;
use crate::engine::decoder::LogitRows;

/// A decoder session that turns the next tokens into the logits of the last one.
pub trait NextLogits {
    /// Runs `ids` after everything run so far; the logits of the last of them.
    fn next_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>>;

    /// What the session noticed that a user should hear (the simulator's domain warnings).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

impl NextLogits for F32Decoder<'_, '_> {
    fn next_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self.step(ids, LogitRows::Last)?.data)
    }
}

impl NextLogits for DecoderSim<'_> {
    fn next_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self
            .step_f64(ids, LogitRows::Last)?
            .concat()
            .iter()
            .map(|&v| v as f32)
            .collect())
    }

    fn warnings(&self) -> Vec<String> {
        DecoderSim::warnings(self)
    }
}

/// What generation does.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Generation ends after this many tokens if no stop token came first.
    pub max_new_tokens: usize,
    /// How each token is picked from the logits.
    pub sampling: SamplingParams,
    /// Generation ends when one of these is chosen (it is not part of the output).
    pub stop: Vec<u32>,
    /// Run all `max_new_tokens` steps even after a stop token (the steps after it are fed the
    /// stop token and their logits dropped), so that a private session's server, which sees
    /// every step, cannot tell where the answer ended. The output is the same either way.
    pub fixed_length: bool,
}

/// One generated token and how sure the model was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratedToken {
    /// The token id.
    pub id: u32,
    /// Largest logit minus the second largest: how close greedy decoding was to another choice.
    pub margin: f32,
}

/// The tokens generated after `prompt` (the stop token excluded), each passed to `on_token` as
/// soon as it is chosen; the bool says whether a stop token ended it.
pub fn generate(
    session: &mut (impl NextLogits + ?Sized),
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(&GeneratedToken) -> Result<()>,
) -> Result<(Vec<GeneratedToken>, bool)> {
    let mut sampler = Sampler::new(opts.sampling)?;
    let mut out = Vec::new();
    if opts.max_new_tokens == 0 {
        return Ok((out, false));
    }
    let mut logits = session.next_logits(prompt)?;
    loop {
        let id = sampler.sample(&logits)?;
        if opts.stop.contains(&id) {
            if opts.fixed_length {
                // As many model runs as an answer of max_new_tokens: one per token but the last.
                for _ in out.len() + 1..opts.max_new_tokens {
                    session.next_logits(&[id])?;
                }
            }
            return Ok((out, true));
        }
        let t = GeneratedToken {
            id,
            margin: top2_margin(&logits),
        };
        on_token(&t)?;
        out.push(t);
        if out.len() == opts.max_new_tokens {
            return Ok((out, false));
        }
        logits = session.next_logits(&[id])?;
    }
}

/// [`generate`] with each complete piece of text passed to `on_text` as soon as its tokens are
/// chosen (a character split across tokens waits for its last byte).
pub fn generate_text(
    session: &mut (impl NextLogits + ?Sized),
    tokenizer: &DecoderTokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str) -> Result<()>,
) -> Result<(Vec<GeneratedToken>, bool)> {
    let mut stream = tokenizer.stream();
    let out = generate(session, prompt, opts, |t| {
        let piece = stream.push(t.id)?;
        if piece.is_empty() {
            return Ok(());
        }
        on_text(&piece)
    })?;
    let rest = stream.finish()?;
    if !rest.is_empty() {
        on_text(&rest)?;
    }
    Ok(out)
}

/// Largest minus second-largest logit (0 for fewer than two).
pub(crate) fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    if b.is_finite() {
        a - b
    } else {
        0.0
    }
}
