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

    /// Makes the next `padding` positions padding that hides the prompt's length
    /// (`crate::engine::decoder::hide_padding_keys`), before anything has run. Engines that
    /// cannot refuse.
    fn hide_padding(&mut self, _padding: usize) -> Result<()> {
        Err(veil_core::Error::Unsupported(
            "padding that hides the prompt's length: this engine runs in the clear, where \
             there is nothing to hide (use a private session or the simulator)"
                .into(),
        ))
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

    fn hide_padding(&mut self, padding: usize) -> Result<()> {
        DecoderSim::hide_padding(self, padding)
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
    /// Pad a shorter prompt to this many positions ([`PADDING_ID`] before it, hidden by
    /// [`NextLogits::hide_padding`]), so that a private session's server sees this length, not
    /// the prompt's; a longer prompt is refused. The output is the same (the padding is never
    /// attended to; Llama's rotary rounding aside).
    pub pad_to: Option<usize>,
}

/// The token the padding of [`GenerateOptions::pad_to`] holds: any would do, no real position
/// attends to it.
pub const PADDING_ID: u32 = 0;

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
    let padded = padded_prompt(prompt, opts.pad_to)?;
    if padded.len() > prompt.len() {
        session.hide_padding(padded.len() - prompt.len())?;
    }
    let mut logits = session.next_logits(&padded)?;
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

/// `prompt` after the padding that brings it to `pad_to` positions ([`GenerateOptions::pad_to`]).
pub fn padded_prompt(prompt: &[u32], pad_to: Option<usize>) -> Result<Vec<u32>> {
    let Some(n) = pad_to else {
        return Ok(prompt.to_vec());
    };
    veil_core::ensure!(
        prompt.len() <= n,
        InvalidArgument,
        "the prompt has {} tokens, more than the {n} it is padded to",
        prompt.len()
    );
    let mut out = vec![PADDING_ID; n - prompt.len()];
    out.extend_from_slice(prompt);
    Ok(out)
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
