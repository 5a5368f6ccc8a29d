//! What `veil generate`, `veil chat` and `veil proxy` share: the engine that turns tokens into
//! logits (chosen once per command by [`EngineArgs`]), the prompt of a conversation, and one
//! generation streamed as text pieces.

use std::time::Duration;

use clap::Args;
use veil_core::{Error, Result};
use veil_model::decoder::{
    ChatMessage, DecoderBundle, DecoderConfig, DecoderTokenizer, DecoderWeights,
};
use veil_model::{generate_text, GenerateOptions, GeneratedToken, NextLogits};
use veil_model::{DecoderFormat, DecoderTables, F32Model, FixedDecoder};
use veil_private::{default_generation_context, ClientTables, ClientTransport, GenerationClient};

/// How the logits are computed.
#[derive(Args)]
pub(crate) struct EngineArgs {
    /// Run the fixed-point simulator (ℓ = 48, f = 13) on this machine: what the private pass must
    /// equal. Not private: the model runs here in the clear.
    #[arg(long, conflicts_with_all = ["f32", "connect"])]
    pub(crate) simulate: bool,
    /// Run plain f32 on this machine. Not private.
    #[arg(long, conflicts_with = "connect")]
    pub(crate) f32: bool,
    /// Generate privately with the `veil serve` at this address, which holds the weights: this
    /// machine keeps the prompt and the tokens, and needs only the model's configuration,
    /// tokenizer and (unless --private-tables) public tables: `--model` may be the client bundle
    /// `veil export-client` writes, or any form of the model (only those parts are used). The
    /// server's digest check compares the tables with its own.
    #[arg(long)]
    pub(crate) connect: Option<String>,
    /// With --connect: the positions one private session holds (prompt, answers and, in a
    /// conversation, every earlier turn), at most the model's. The server reserves memory for
    /// them when the session starts. Default: 512, or the model's context if smaller.
    #[arg(long, requires = "connect")]
    pub(crate) context: Option<usize>,
    /// With --connect: run every one of the --max-new-tokens steps even when the answer ends
    /// sooner, so that the server cannot see where it ended (it sees the number of steps).
    /// The answer is the same; a conversation's next turn then runs from its start again.
    #[arg(long, requires = "connect")]
    pub(crate) fixed_length: bool,
    /// With --connect: run each decode step as an offline phase (its FC masks, attention
    /// triples and OT pool fill) and then its online part, once the previous token has been
    /// printed, so the online part moves fewer bytes. The two run back to back: a token takes as
    /// long as without (overlapping them with the printing is not built). The tokens are the
    /// same. The server may refuse it (its memory); that step then runs without.
    #[arg(long, requires = "connect")]
    pub(crate) preprocess: bool,
    /// With --connect: the server keeps the model's token embedding and output table private
    /// (`veil serve --private-tables`): this machine uses only the model's configuration and
    /// tokenizer, and each step pays for a private lookup and an HE head.
    #[arg(long, requires = "connect", conflicts_with = "preprocess")]
    pub(crate) private_tables: bool,
    /// With --connect: pad a shorter prompt to N positions with tokens that no real position
    /// attends to, so that the server sees N, not the prompt's length (a longer prompt is
    /// refused). The answer is the same (for Llama-family models up to the rounding of the
    /// rotary tables at the shifted positions). In a conversation only the first turn is
    /// padded: the server sees each later turn's length.
    #[arg(long, requires = "connect", value_name = "N")]
    pub(crate) pad_to: Option<usize>,
    #[command(flatten)]
    pub(crate) net: crate::ClientNetArgs,
}

/// The decoder a command runs: its public part always, its weights only when it runs on this
/// machine.
pub(crate) struct CommandModel {
    /// The configuration, the tokenizer and, for a private generation of an open model, the
    /// public tables.
    pub(crate) public: DecoderBundle,
    /// `--simulate`, `--f32`: the weights. A private generation's client holds none.
    weights: Option<DecoderWeights>,
}

impl CommandModel {
    /// What the engine `args` asks for needs of `spec`: with --connect the public part alone (a
    /// client bundle, or the public part of any form of the model, its tables dropped with
    /// --private-tables), otherwise the whole model. `chat`: the model must have a chat template
    /// (`veil chat`, `veil proxy`).
    pub(crate) fn load(spec: &str, args: &EngineArgs, chat: bool) -> Result<Self> {
        let (public, weights) = match args.connect {
            Some(_) => (DecoderBundle::open(spec, !args.private_tables)?, None),
            None => {
                let m = veil_model::decoder::load(spec)?;
                let public = DecoderBundle {
                    config: m.weights.config.clone(),
                    tokenizer: m.tokenizer,
                    tables: None,
                };
                (public, Some(m.weights))
            }
        };
        if chat && !public.tokenizer.has_chat_template() {
            return Err(Error::Unsupported(format!(
                "{spec} has no chat template: use `veil generate` with a plain prompt"
            )));
        }
        Ok(CommandModel { public, weights })
    }

    /// The shape and operators.
    pub(crate) fn config(&self) -> &DecoderConfig {
        &self.public.config
    }

    /// The tokenizer and chat template.
    pub(crate) fn tokenizer(&self) -> &DecoderTokenizer {
        &self.public.tokenizer
    }

    /// The weights, which a model loaded for a private generation does not hold.
    fn weights(&self) -> Result<&DecoderWeights> {
        self.weights.as_ref().ok_or_else(|| {
            Error::InvalidArgument("a model loaded for --connect holds no weights".into())
        })
    }
}

/// A decoder prepared for one engine; [`Engine::session`] starts an empty KV cache.
pub(crate) enum Engine<'w> {
    F32(F32Model<'w>),
    Simulate(Box<FixedDecoder>),
    Private(Box<Remote>),
}

/// The private engine: where the server is and how to reach it, and the model's public tables.
pub(crate) struct Remote {
    addr: String,
    transport: ClientTransport,
    /// The open model's tables; None when the server keeps them private.
    tables: Option<DecoderTables>,
    config: DecoderConfig,
    context: usize,
    fixed_length: bool,
    preprocess: bool,
    pad_to: Option<usize>,
    step_timeout: Duration,
}

impl<'w> Engine<'w> {
    /// The engine `args` asks for: private (`--connect`), or on this machine in the clear
    /// (`--simulate`, `--f32`). Asking for none is refused: the command would not know where to
    /// compute.
    pub(crate) fn new(args: EngineArgs, model: &'w CommandModel) -> Result<Self> {
        // clap's `requires` lets these through beside --simulate or --f32 (which conflict with
        // --connect), where they would be silently ignored: --preprocess would change nothing
        // there (a model run in the clear has no offline part).
        if args.connect.is_none()
            && (args.fixed_length
                || args.preprocess
                || args.context.is_some()
                || args.pad_to.is_some())
        {
            return Err(Error::InvalidArgument(
                "--fixed-length, --preprocess, --pad-to and --context are about a private \
                 session: they need --connect"
                    .into(),
            ));
        }
        if let Some(addr) = args.connect {
            let max = model.config().max_positions;
            let context = args
                .context
                .unwrap_or(default_generation_context(model.config()));
            if !(1..=max).contains(&context) {
                return Err(Error::InvalidArgument(format!(
                    "--context {context}: this model holds 1 to {max} positions"
                )));
            }
            if let Some(n) = args.pad_to {
                if !(1..context).contains(&n) {
                    return Err(Error::InvalidArgument(format!(
                        "--pad-to {n}: a session of --context {context} positions takes 1 to {} \
                         (at least one for the answer)",
                        context - 1
                    )));
                }
            }
            return Ok(Engine::Private(Box::new(Remote {
                addr,
                transport: args.net.transport()?,
                step_timeout: crate::secs(args.net.timeout, "--timeout")?,
                tables: match args.private_tables {
                    true => None,
                    false => Some(model.public.decoder_tables(DecoderFormat::default())?),
                },
                config: model.config().clone(),
                context,
                fixed_length: args.fixed_length,
                preprocess: args.preprocess,
                pad_to: args.pad_to,
            })));
        }
        match (args.simulate, args.f32) {
            (true, _) => Ok(Engine::Simulate(Box::new(FixedDecoder::encode(
                model.weights()?,
                DecoderFormat::default(),
            )?))),
            (_, true) => Ok(Engine::F32(F32Model::new(model.weights()?)?)),
            _ => Err(Error::InvalidArgument(
                "say where the model runs: --connect ADDR (private generation with a `veil \
                 serve` of this model), or --simulate (fixed-point simulator) or --f32 to run \
                 it on this machine, in the clear"
                    .into(),
            )),
        }
    }

    /// Whether generations must run every step they may (`--fixed-length`, private only).
    pub(crate) fn fixed_length(&self) -> bool {
        matches!(self, Engine::Private(r) if r.fixed_length)
    }

    /// The length a generation's first prompt is padded to (`--pad-to`, private only).
    pub(crate) fn pad_to(&self) -> Option<usize> {
        match self {
            Engine::Private(r) => r.pad_to,
            _ => None,
        }
    }

    /// `private`, `simulate` or `f32`, as reports name the mode.
    pub(crate) fn mode(&self) -> &'static str {
        match self {
            Engine::F32(_) => "f32",
            Engine::Simulate(_) => "simulate",
            Engine::Private(_) => "private",
        }
    }

    /// A session with an empty KV cache: for the private engine, a new connection, its key
    /// set-up and a generation of `--context` positions on the server (each step followed by
    /// the next one's preprocessing with `--preprocess`).
    pub(crate) fn session(&self) -> Result<Box<dyn NextLogits + Send + '_>> {
        Ok(match self {
            Engine::F32(m) => Box::new(m.session()),
            Engine::Simulate(m) => Box::new(m.session()),
            Engine::Private(r) => {
                let ch = r.transport.connect(&r.addr)?;
                let tables = ClientTables::held(r.tables.as_ref(), &r.config);
                let mut client =
                    GenerationClient::connect(ch, tables, r.context, Some(r.step_timeout))?;
                client.set_preprocessing(r.preprocess);
                Box::new(client.into_generation(r.context)?)
            }
        })
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The model chose a stop token.
    Stop,
    /// The token limit was reached.
    Length,
}

impl Finish {
    /// As OpenAI's `finish_reason` spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// One generation after `prompt` in `session`, each complete piece of text passed to `on_text`
/// as soon as its tokens are chosen; returns the tokens and why it ended.
pub(crate) fn stream_text(
    session: &mut (impl NextLogits + ?Sized),
    tokenizer: &DecoderTokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: impl FnMut(&str) -> Result<()>,
) -> Result<(Vec<GeneratedToken>, Finish)> {
    let (tokens, stopped) = generate_text(session, tokenizer, prompt, opts, on_text)?;
    let finish = if stopped {
        Finish::Stop
    } else {
        Finish::Length
    };
    Ok((tokens, finish))
}

/// A session whose KV cache outlives one generation: a conversation's next prompt, which
/// repeats every earlier turn, runs only the tokens the cache does not hold yet.
pub(crate) struct CachedSession<'e> {
    engine: &'e Engine<'e>,
    /// None until the next generation needs it (a private one is a connection).
    session: Option<Box<dyn NextLogits + Send + 'e>>,
    /// The token ids the cache holds, in order.
    held: Vec<u32>,
    /// Padding positions the cache holds before them (`--pad-to`).
    padding: usize,
}

impl<'e> CachedSession<'e> {
    pub(crate) fn new(engine: &'e Engine<'e>) -> Self {
        CachedSession {
            engine,
            session: None,
            held: Vec::new(),
            padding: 0,
        }
    }

    /// The ids of the conversation `messages` in the model's chat template: the ids the cache
    /// holds followed by those of the rest of the text when the rendered text continues the
    /// cache's own (so an answer whose text would encode to other ids than the ones generated
    /// keeps its cache, and the model reads its answer as it wrote it); otherwise the rendered
    /// text's ids (the next generation then starts a fresh cache).
    pub(crate) fn chat_prompt(
        &self,
        tokenizer: &DecoderTokenizer,
        messages: &[ChatMessage],
    ) -> Result<Vec<u32>> {
        chat_prompt_after(tokenizer, &self.held, messages)
    }

    /// Empties the cache.
    pub(crate) fn reset(&mut self) {
        self.session = None;
        self.held.clear();
        self.padding = 0;
    }

    /// One generation after the whole conversation `prompt`; returns the tokens, why it ended,
    /// and how many prompt tokens the cache already held. A prompt that does not extend what the
    /// cache holds starts a fresh cache; one whose tokens and `opts.max_new_tokens` exceed the
    /// model's context is refused before anything runs.
    pub(crate) fn generate(
        &mut self,
        model: &CommandModel,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_text: impl FnMut(&str) -> Result<()>,
    ) -> Result<(Vec<GeneratedToken>, Finish, usize)> {
        if opts.max_new_tokens == 0 {
            return Err(Error::InvalidArgument(
                "at least one new token must be asked for".into(),
            ));
        }
        let reuse = prompt.len() > self.held.len() && prompt.starts_with(&self.held);
        // The padding the cache holds before the prompt: what it holds already, or what a
        // fresh cache's first prompt gets.
        let padding = if reuse && !self.held.is_empty() {
            self.padding
        } else {
            opts.pad_to.unwrap_or(0).saturating_sub(prompt.len())
        };
        let context = model.config().max_positions;
        if padding + prompt.len() + opts.max_new_tokens > context {
            return Err(Error::InvalidArgument(format!(
                "{} prompt positions and up to {} new ones exceed the model's context of \
                 {context} tokens",
                padding + prompt.len(),
                opts.max_new_tokens
            )));
        }
        if !reuse {
            self.reset();
        }
        let reused = self.held.len();
        // Padding goes before a session's first prompt only (the cache holds it after that).
        let padded;
        let opts = if reused > 0 && opts.pad_to.is_some() {
            padded = GenerateOptions {
                pad_to: None,
                ..opts.clone()
            };
            &padded
        } else {
            opts
        };
        let session = match &mut self.session {
            Some(s) => s,
            None => self.session.insert(self.engine.session()?),
        };
        match stream_text(
            session.as_mut(),
            model.tokenizer(),
            &prompt[reused..],
            opts,
            on_text,
        ) {
            Ok((tokens, finish)) => {
                // The last token is fed to the model only when another step follows it.
                let fed = match finish {
                    Finish::Stop => tokens.len(),
                    Finish::Length => tokens.len().saturating_sub(1),
                };
                self.held = prompt.to_vec();
                self.held.extend(tokens[..fed].iter().map(|t| t.id));
                self.padding = padding;
                if opts.fixed_length && finish == Finish::Stop {
                    // The cache holds the padding steps after the stop token too.
                    self.reset();
                }
                Ok((tokens, finish, reused))
            }
            Err(e) => {
                // A failed step leaves the cache inconsistent.
                self.reset();
                Err(e)
            }
        }
    }

    /// What the engine noticed (the simulator's domain warnings).
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.session.as_ref().map_or(Vec::new(), |s| s.warnings())
    }
}

/// [`CachedSession::chat_prompt`] for a cache holding `held`.
fn chat_prompt_after(
    tokenizer: &DecoderTokenizer,
    held: &[u32],
    messages: &[ChatMessage],
) -> Result<Vec<u32>> {
    let text = tokenizer.render_chat(messages, true)?;
    if !held.is_empty() {
        let held_text = tokenizer.decode(held)?;
        if let Some(rest) = text
            .strip_prefix(held_text.as_str())
            .filter(|r| !r.is_empty())
        {
            let mut ids = held.to_vec();
            ids.extend(tokenizer.encode(rest)?);
            return Ok(ids);
        }
    }
    tokenizer.encode(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_model::decoder::random::{write_tiny_llama, TinyShape};

    /// A conversation's next prompt keeps the ids the cache holds even when its answer's text
    /// encodes to other ids (here the answer written one byte per token, as a model may
    /// generate it), then adds the ids of the rest; a cache whose text the conversation does not
    /// continue gives the rendered text's own ids.
    #[test]
    fn the_next_prompt_keeps_the_generated_ids() {
        let tmp = tempfile::tempdir().unwrap();
        let shape = TinyShape {
            max_positions: 256,
            ..TinyShape::default()
        };
        write_tiny_llama(tmp.path(), 7, &shape).unwrap();
        let model = veil_model::decoder::load(tmp.path().to_str().unwrap()).unwrap();
        let tok = &model.tokenizer;
        let first = vec![ChatMessage::new("user", "good")];
        let answer = "a fine film";
        let mut held = model.chat_prompt(&first).unwrap();
        let canonical = tok.encode(answer).unwrap();
        let bytewise: Vec<u32> = answer
            .chars()
            .map(|c| tok.encode(&c.to_string()).unwrap())
            .collect::<Vec<_>>()
            .concat();
        assert_ne!(
            bytewise, canonical,
            "the answer's ids must differ from its encoding"
        );
        assert_eq!(tok.decode(&bytewise).unwrap(), answer);
        held.extend(&bytewise);
        let mut next = first.clone();
        next.push(ChatMessage::new("assistant", answer));
        next.push(ChatMessage::new("user", "bad"));
        let ids = chat_prompt_after(tok, &held, &next).unwrap();
        assert!(ids.len() > held.len() && ids.starts_with(&held));
        let text = tok.render_chat(&next, true).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
        let fresh = model.chat_prompt(&next).unwrap();
        assert_ne!(ids, fresh);
        assert_eq!(chat_prompt_after(tok, &[], &next).unwrap(), fresh);
        let other = tok.encode("something else").unwrap();
        assert_eq!(chat_prompt_after(tok, &other, &next).unwrap(), fresh);
    }
}
