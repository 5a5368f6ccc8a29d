//! Private generation over a session: the server's handler of a decoder session
//! ([`serve_generation`]) and the client's end ([`GenerationClient`], whose generations
//! implement `veil_model::NextLogits`, so `veil_model::generate` drives them unchanged).
//!
//! **Flow.** The client's hello names the longest context it will ask for (the session's cap).
//! The server answers with [`DecoderAdmission`]: the format, the truncation mode, its model's
//! activation bound (`veil_model::FixedDecoder::activation_bits`, which the client's comparisons
//! follow) and the digest
//! of its public tables (`veil_model::DecoderTables::digest`, covering the configuration), or,
//! when it keeps them private, the digest of the configuration and format alone
//! (`DecoderTables::shape_digest`); the client refuses a mismatch with what it holds (or the
//! other kind of tables) before any key material moves. Then the BFV
//! keys (at the format's ring: `N8192Q4L48` at ℓ = 48) and the OT session are set up, and the
//! client sends [`GenerationRequest`]s: `GenerateStart { context_limit }` (answered by
//! [`GenerateReply`]), then `Step { tokens }` per step, whose flights
//! ([`crate::decoder`]'s module docs) follow at once, then `GenerateEnd` or another start.
//! Between steps the client may send `PreprocessStep { tokens }` (answered by
//! [`PreprocessReply`]: accepted with the COTs to put in the pools, then the offline flights of
//! `crate::decoder`'s preprocessing; or refused, and the session goes on), then run that step
//! as `PreprocessedStep { tokens }` on the material both sides hold; a plain `Step` drops it.
//! A server with private tables refuses every preprocessing (the session goes on; a client
//! with private tables does not ask).
//!
//! **What the server learns.** The session's cap, each generation's context limit, each
//! step's token count (the prompt's length, or the length it is padded to with
//! `GenerateOptions::pad_to`; then 1 per generated token: the number of steps). Never a token,
//! a hidden value, a logit, or which positions are padding ([`crate::decoder`]'s security
//! model).
//!
//! **What the server spends.** A generation's KV cache ([`Generation::cache_bytes`]) plus a
//! step's working set at its limit ([`step_bytes`]) plus, with private tables, a prompt
//! lookup's copy of the token table (`ServerDecoder::prompt_lookup_bytes`) is taken from the server's session memory
//! before anything is allocated and given back when the generation ends, however it ends
//! (`GenerateEnd`, a new start, an error, a disconnect). A preprocessed step's material (the
//! server's masks and triples, `step_material_bytes`) and the COTs its pools are filled with
//! (`OtSession::pool_bytes_for`; no fill when only the material fits) are taken from the same
//! memory when it is asked for, refused when the material does not fit, and given back when the
//! step has run or the
//! material is dropped (a plain step, a new preprocessing, the generation's end however it
//! ends); one step's material at most is held. A preprocessed step without material, or on
//! material made for another step, ends the session with an error naming it. A limit of 0, above the session's cap
//! or above the model's positions is refused and the session goes on; a step without a
//! generation, of 0 tokens or beyond the limit ends the session with an error naming it. With
//! deadlines, each step has one scaled by the model's blocks and its tokens.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use veil_core::{bail, ensure, Result};
use veil_linear::{ClientSession, ServerSession};
use veil_model::decoder::DecoderConfig;
use veil_model::NextLogits;
use veil_model::{generate, padded_prompt, DecoderTables, GenerateOptions, GeneratedToken};
use veil_model::{BundleDigest, ProductTruncation};
use veil_net::{Channel, Role};
use veil_nonlinear::OtSession;

use super::preprocess::pool_fill;
use super::{plan_step, step_material_bytes, StepMaterial};
use super::{ClientTables, DecoderParty, DecoderSide, Generation, ServerDecoder};
use crate::deadlines::in_step;
use crate::handler::told;
use crate::protocol::{
    AnnouncedTables, DecoderAdmission, DecoderAnnounced, GenerateReply, GenerationRequest, Hello,
    Message, PoolFill, PreprocessReply,
};
use crate::reserve::SessionMemory;

/// Bytes a step's working set may take at `limit` positions, beyond the cache: the widest
/// rows of the block (the MLP's, the residual's and the attention's projections) for up to
/// `limit` new positions, and every head's scores against the whole context. An upper
/// estimate, reserved with the cache so that a prefill of the whole context fits too.
pub fn step_bytes(cfg: &DecoderConfig, limit: usize) -> usize {
    let rows = 4 * cfg.hidden + 3 * cfg.intermediate + 3 * cfg.heads * cfg.head_dim;
    let scores = cfg.heads * limit;
    // Each value is a u64 share, held two or three times over while a protocol runs.
    3 * 8 * limit * (rows + scores)
}

/// Memory shared by a server's generation sessions, with a gauge of what is taken.
#[derive(Debug)]
pub struct SessionMemoryPool {
    capacity: u64,
    used: AtomicU64,
}

impl SessionMemoryPool {
    /// A pool of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        SessionMemoryPool {
            capacity,
            used: AtomicU64::new(0),
        }
    }

    /// Bytes taken now (0 once every generation has ended).
    pub fn in_use(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

impl SessionMemory for SessionMemoryPool {
    fn take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(bytes).filter(|&t| t <= self.capacity)
            })
            .is_ok()
    }

    fn give(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// How a decoder server runs its sessions.
#[derive(Clone, Copy, Debug)]
pub struct GenerationOptions {
    /// The truncation mode every session runs (announced; the client follows it).
    pub truncation: ProductTruncation,
    /// The hello, then the admission and key set-up, each (none: wait for ever).
    pub setup: Option<Duration>,
    /// Between two requests (none: wait for ever).
    pub idle: Option<Duration>,
    /// A step's deadline per block and token, beyond a fixed minute (none: no deadline).
    pub per_block_token: Option<Duration>,
}

impl Default for GenerationOptions {
    /// The decoder's default truncations ([`crate::DEFAULT_DECODER_TRUNCATION`]), two minutes
    /// for the hello and set-up (as an encoder session's), five minutes' idle, 2 s per block and
    /// token.
    fn default() -> Self {
        GenerationOptions {
            truncation: super::model::DEFAULT_DECODER_TRUNCATION,
            setup: Some(Duration::from_secs(120)),
            idle: Some(crate::IDLE_TIMEOUT),
            per_block_token: Some(Duration::from_secs(2)),
        }
    }
}

/// Memory taken for one generation, given back when dropped (however the generation ends).
struct Taken<'a> {
    memory: &'a dyn SessionMemory,
    bytes: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.memory.give(self.bytes);
    }
}

/// A generation on the server: its cache, the next step's material when the client had it
/// preprocessed, and the memory they hold. Field order: the cache and the material are freed
/// before the memory is given back.
struct Current<'a> {
    generation: Generation,
    material: Option<Held<'a>>,
    /// The COTs the last step drew (the larger direction) and its tokens: the next step of as
    /// many tokens draws about as many, which its preprocessing puts in the pools.
    last_draw: Option<(usize, u64)>,
    _taken: Taken<'a>,
}

/// A step's preprocessed material and the memory it holds (given back when it is used or
/// dropped).
struct Held<'a> {
    material: StepMaterial,
    _taken: Taken<'a>,
}

/// Serves one decoder session on `ch` until the client says goodbye, disconnects or fails
/// (the error names what failed). Memory for each generation comes from `memory`.
pub fn serve_generation<C: Channel>(
    mut ch: C,
    model: &ServerDecoder,
    opts: &GenerationOptions,
    memory: &SessionMemoryPool,
) -> Result<()> {
    // A silent peer cannot hold the thread.
    set_deadline(&mut ch, opts.setup)?;
    let hello = match Hello::recv(&mut ch) {
        Ok(h) => h,
        Err(e @ (veil_core::Error::Malformed(_) | veil_core::Error::Unsupported(_))) => {
            // A stranger or another version hears why, as an encoder server's would.
            let _ = DecoderAdmission::Refused(e.to_string()).send(&mut ch);
            let _ = ch.flush();
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    serve_generation_admitted(ch, model, opts, hello, memory, &|| None)
}

/// [`serve_generation`] after the hello, with memory from any of the server's pools (a
/// server's admission reads the hello itself). A session ended early is closed telling the
/// client why, as an encoder session is (`crate::handler`'s `told`): the malformed or
/// refused step, the deadline that passed, or `ended`'s reason (the server's shutdown grace
/// passed and cut the channel's reads).
pub(crate) fn serve_generation_admitted<C: Channel>(
    mut ch: C,
    model: &ServerDecoder,
    opts: &GenerationOptions,
    hello: Hello,
    memory: &dyn SessionMemory,
    ended: &dyn Fn() -> Option<String>,
) -> Result<()> {
    let res = generation_session(&mut ch, model, opts, hello, memory);
    let res = match (ended(), res) {
        (Some(why), Err(_)) => Err(veil_core::Error::TimedOut(why)),
        (_, res) => res,
    };
    if let Some(why) = res.as_ref().err().and_then(told) {
        let _ = ch.close_with(&why);
    }
    res
}

/// The session itself: admission, set-up, then requests until goodbye or an error.
fn generation_session<C: Channel>(
    ch: &mut C,
    model: &ServerDecoder,
    opts: &GenerationOptions,
    hello: Hello,
    memory: &dyn SessionMemory,
) -> Result<()> {
    let mut ch = ch;
    let cfg = model.config();
    let format = model.fixed().format;
    let cap = hello.max_tokens as usize;
    set_deadline(&mut ch, opts.setup)?;
    if !(1..=cfg.max_positions).contains(&cap) {
        let why = format!(
            "a context of {cap} positions: this model takes 1..={}",
            cfg.max_positions
        );
        DecoderAdmission::Refused(why.clone()).send(&mut ch)?;
        ch.flush()?;
        bail!(Refused, "refused: {why}");
    }
    DecoderAdmission::Admitted(DecoderAnnounced {
        format,
        truncation: opts.truncation,
        activation_bits: model.fixed().activation_bits(),
        tables: model.announced_tables(),
    })
    .send(&mut ch)?;
    // From here on a close can tell the client why (the answer above left unframed).
    ch.start_records()?;
    let (lin, mut ot) = (|| {
        let lin = ServerSession::setup(&mut ch, format.fp.ring)?;
        Ok((lin, OtSession::setup(&mut ch, Role::Server)?))
    })()
    .map_err(|e| in_step(e, "set-up", opts.setup.unwrap_or(Duration::MAX)))?;
    let mut current: Option<Current<'_>> = None;
    loop {
        set_deadline(&mut ch, opts.idle)?;
        let req = match ch.recv_msg(GenerationRequest::MAX_BYTES) {
            Ok(m) => GenerationRequest::decode(&m)?,
            Err(veil_core::Error::Disconnected) => return Ok(()),
            Err(e) => {
                let step = "waiting for the next request (the idle deadline)";
                return Err(in_step(e, step, opts.idle.unwrap_or(Duration::MAX)));
            }
        };
        match req {
            GenerationRequest::Goodbye => return Ok(()),
            GenerationRequest::GenerateEnd => current = None,
            GenerationRequest::PreprocessStep { tokens } => {
                let Some(c) = current.as_mut() else {
                    bail!(
                        Malformed,
                        "preprocessing a step of {tokens} tokens without a generation \
                         (GenerateStart first)"
                    );
                };
                // Any material held goes (its memory given back) before the new is reserved.
                c.material = None;
                if model.tables_private() {
                    let why = "the model's tables are private: its steps run single-phase";
                    PreprocessReply::Refused(why.into()).send(&mut ch)?;
                    ch.flush()?;
                    continue;
                }
                let tokens = tokens as usize;
                let (taken, pool_cots) =
                    match admit_material(cfg, format.fp.ring, c, tokens, &ot, memory) {
                        Ok(a) => a,
                        Err(why) => {
                            tracing::info!(tokens, why, "step preprocessing refused");
                            PreprocessReply::Refused(why).send(&mut ch)?;
                            ch.flush()?;
                            continue;
                        }
                    };
                PreprocessReply::Accepted(PoolFill::built(pool_cots)).send(&mut ch)?;
                ch.flush()?;
                let allowed = step_allowance(opts, cfg.layers, tokens);
                set_deadline(&mut ch, allowed)?;
                let side = DecoderSide::Server(&lin, model);
                let material = DecoderParty::new(&mut ch, &mut ot, side, &mut c.generation)?
                    .preprocess(tokens, pool_cots)
                    .map_err(|e| {
                        let what = format!("preprocessing a step of {tokens} tokens");
                        in_step(e, &what, allowed.unwrap_or(Duration::MAX))
                    })?;
                c.material = Some(Held {
                    material,
                    _taken: taken,
                });
            }
            GenerationRequest::GenerateStart { context_limit } => {
                // The old cache goes before the new one is reserved.
                current = None;
                let limit = context_limit as usize;
                let tables = model.prompt_lookup_bytes();
                let arithmetic = (opts.truncation, model.fixed().activation_bits());
                match start(cfg, arithmetic, (limit, tables), cap, memory) {
                    Ok(c) => {
                        current = Some(c);
                        GenerateReply::Accepted.send(&mut ch)?;
                    }
                    Err(why) => {
                        tracing::info!(limit, why, "generation refused");
                        GenerateReply::Refused(why).send(&mut ch)?;
                    }
                }
                ch.flush()?;
            }
            GenerationRequest::Step { tokens } | GenerationRequest::PreprocessedStep { tokens } => {
                let preprocessed = matches!(req, GenerationRequest::PreprocessedStep { .. });
                let Some(c) = current.as_mut() else {
                    bail!(
                        Malformed,
                        "a step of {tokens} tokens without a generation (GenerateStart first)"
                    );
                };
                let tokens = tokens as usize;
                // The client's request, not the server, is at fault: said so in the close.
                let clients_fault = |e| match e {
                    veil_core::Error::InvalidArgument(m) => veil_core::Error::Malformed(m),
                    e => e,
                };
                c.generation.check_room(tokens).map_err(clients_fault)?;
                // A plain step drops any material held (its memory given back after the step).
                let held = c.material.take();
                let (material, _taken) = match (preprocessed, held) {
                    (true, Some(h)) => {
                        let start = c.generation.positions();
                        ensure!(
                            h.material.is_for(start, tokens),
                            Malformed,
                            "a preprocessed step of {tokens} tokens after {start} positions, on \
                             material made for {} tokens after {}",
                            h.material.tokens(),
                            h.material.start()
                        );
                        (Some(h.material), Some(h._taken))
                    }
                    (true, None) => bail!(
                        Malformed,
                        "a preprocessed step of {tokens} tokens without preprocessed material"
                    ),
                    (false, _) => (None, None),
                };
                let allowed = step_allowance(opts, cfg.layers, tokens);
                set_deadline(&mut ch, allowed)?;
                let started = Instant::now();
                let before = ot.consumed();
                let side = DecoderSide::Server(&lin, model);
                {
                    let mut party = DecoderParty::new(&mut ch, &mut ot, side, &mut c.generation)?;
                    match material {
                        Some(m) => party.server_step_with(tokens, m),
                        None => party.server_step(tokens),
                    }
                }
                .map_err(|e| {
                    in_step(
                        e,
                        &format!("a step of {tokens} tokens"),
                        allowed.unwrap_or(Duration::MAX),
                    )
                })?;
                let after = ot.consumed();
                let drawn = (after.0 - before.0).max(after.1 - before.1);
                c.last_draw = Some((tokens, drawn));
                tracing::debug!(
                    tokens,
                    preprocessed,
                    seconds = started.elapsed().as_secs_f64(),
                    "generation step"
                );
            }
        }
    }
}

/// A new generation of `limit` positions, or why not (the session goes on).
/// `(limit, tables)`: the context limit and the bytes private tables' lookups take beyond it.
fn start<'a>(
    cfg: &DecoderConfig,
    (truncation, activation_bits): (ProductTruncation, Option<u32>),
    (limit, tables): (usize, usize),
    cap: usize,
    memory: &'a dyn SessionMemory,
) -> std::result::Result<Current<'a>, String> {
    if !(1..=cap).contains(&limit) {
        return Err(format!(
            "a context limit of {limit} positions (this session takes 1..={cap}, as its hello \
             announced)"
        ));
    }
    let bytes = (Generation::cache_bytes(cfg, limit) + step_bytes(cfg, limit) + tables) as u64;
    if !memory.take(bytes) {
        return Err(format!(
            "the server's memory for sessions cannot hold a context of {limit} positions \
             ({bytes} bytes) now"
        ));
    }
    let taken = Taken { memory, bytes };
    let generation =
        Generation::new(cfg, (truncation, activation_bits), limit).map_err(|e| e.to_string())?;
    Ok(Current {
        generation,
        material: None,
        last_draw: None,
        _taken: taken,
    })
}

/// A step's deadline: a fixed minute plus the per-block-and-token allowance (none: no
/// deadline). Preprocessing a step gets the step's own.
fn step_allowance(opts: &GenerationOptions, layers: usize, tokens: usize) -> Option<Duration> {
    opts.per_block_token
        .map(|d| Duration::from_secs(60) + d.mul_f64((layers * tokens) as f64))
}

/// The memory for the material of `c`'s next step of `tokens` tokens and for the COTs to put
/// in the pools ([`pool_fill`], [`OtSession::pool_bytes_for`]), taken from `memory`, and that
/// fill; or why not (the session goes on). When the memory holds the material but not the
/// pools' fill, the fill is 0 and the step refills online as without preprocessing.
fn admit_material<'a>(
    cfg: &DecoderConfig,
    ring: veil_core::Ring,
    c: &Current<'_>,
    tokens: usize,
    ot: &OtSession,
    memory: &'a dyn SessionMemory,
) -> std::result::Result<(Taken<'a>, usize), String> {
    c.generation.check_room(tokens).map_err(|e| e.to_string())?;
    let start = c.generation.positions();
    let bytes = plan_step(cfg, ring, start, tokens)
        .and_then(|steps| step_material_bytes(cfg, &steps, false))
        .map_err(|e| e.to_string())? as u64;
    if !memory.take(bytes) {
        return Err(format!(
            "the server's memory for sessions cannot hold a preprocessed step of {tokens} \
             tokens ({bytes} bytes) now"
        ));
    }
    let fill = pool_fill(c.last_draw, tokens);
    let pools = ot.pool_bytes_for(fill) as u64;
    if memory.take(pools) {
        Ok((
            Taken {
                memory,
                bytes: bytes + pools,
            },
            fill,
        ))
    } else {
        Ok((Taken { memory, bytes }, 0))
    }
}

fn set_deadline<C: Channel>(ch: &mut C, d: Option<Duration>) -> Result<()> {
    ch.set_deadline(d.map(|d| Instant::now() + d))
}

/// The positions a client's session asks for when its user names none: 512, or the model's
/// context if smaller (the server reserves memory for them: a longer default would be refused
/// by small servers).
pub fn default_generation_context(cfg: &DecoderConfig) -> usize {
    512.min(cfg.max_positions)
}

/// The client's end of a decoder session: its keys, its OT session and what it holds of the
/// model's tables (never the server's weights). Generations run one at a time
/// ([`Self::start`]).
pub struct GenerationClient<'t, C: Channel> {
    ch: C,
    lin: ClientSession,
    ot: OtSession,
    tables: ClientTables<'t>,
    truncation: ProductTruncation,
    /// The server's announced activation bound (its weights'; the client cannot check it).
    activation_bits: Option<u32>,
    cap: usize,
    /// Each exchange's allowance: the set-up, each start, each step; None: no deadline.
    step_timeout: Option<Duration>,
    /// Whether each step is followed by the next one's preprocessing ([`Self::set_preprocessing`]).
    preprocess: bool,
}

impl<'t, C: Channel> GenerationClient<'t, C> {
    /// Opens a session for contexts of up to `max_context` positions with a server of the
    /// model whose tables are `tables`: an open model's ([`ClientTables::Open`],
    /// `veil_model::DecoderTables::encode` from its matrices) or, for a server that keeps them
    /// private, its configuration and format ([`ClientTables::Private`]). Refuses, before any
    /// key material moves, a server that serves an encoder, announces another format, other
    /// tables (both digests named) or the other kind of tables. The hello and set-up, then
    /// each start and each step, must finish within `step_timeout` (replacing whatever
    /// deadline the channel had, such as its handshake's).
    pub fn connect(
        mut ch: C,
        tables: ClientTables<'t>,
        max_context: usize,
        step_timeout: Option<Duration>,
    ) -> Result<Self> {
        let cfg = tables.config();
        ensure!(
            (1..=cfg.max_positions).contains(&max_context) && max_context <= u32::MAX as usize,
            InvalidArgument,
            "a context of {max_context} positions (the model takes 1..={})",
            cfg.max_positions
        );
        set_deadline(&mut ch, step_timeout)?;
        Hello {
            max_tokens: max_context as u32,
        }
        .send(&mut ch)?;
        ch.flush()?;
        let announced = match DecoderAdmission::recv(&mut ch)? {
            DecoderAdmission::Admitted(a) => a,
            DecoderAdmission::Refused(why) => bail!(Refused, "the server refused: {why}"),
        };
        // As the server after its answer: a close can now tell this client why.
        ch.start_records()?;
        ensure!(
            announced.format == tables.format(),
            Unsupported,
            "the server computes at {:?}, these tables are at {:?}",
            announced.format,
            tables.format()
        );
        match (announced.tables, tables) {
            (AnnouncedTables::Public(theirs), ClientTables::Open(t)) => {
                let ours: BundleDigest = t.digest();
                ensure!(
                    theirs == ours,
                    Unsupported,
                    "the server's public tables (digest {theirs}) are not this client's \
                     ({ours}): another model or another version of it"
                );
            }
            (AnnouncedTables::Private(theirs), ClientTables::Private(cfg, format)) => {
                let ours = DecoderTables::shape_digest(cfg, format);
                ensure!(
                    theirs == ours,
                    Unsupported,
                    "the server's model (shape digest {theirs}) is not this client's ({ours}): \
                     another configuration"
                );
            }
            (AnnouncedTables::Private(_), ClientTables::Open(_)) => bail!(
                Unsupported,
                "the server keeps its model's tables private: connect with private tables \
                 (`--private-tables`)"
            ),
            (AnnouncedTables::Public(_), ClientTables::Private(..)) => bail!(
                Unsupported,
                "the server's tables are public: connect with the open model's tables"
            ),
        }
        let lin = ClientSession::setup(&mut ch, tables.format().fp.ring)?;
        let ot = OtSession::setup(&mut ch, Role::Client)?;
        Ok(GenerationClient {
            ch,
            lin,
            ot,
            tables,
            truncation: announced.truncation,
            activation_bits: announced.activation_bits,
            cap: max_context,
            step_timeout,
            preprocess: false,
        })
    }

    /// Has every one-token step of this session's generations run through `NextLogits` (what
    /// [`Self::generate`] and the CLI use) preceded by its preprocessing (`crate::decoder`'s;
    /// off by default): its FC masks, attention triples and OT pools made as an offline phase,
    /// then the step's online part. The two run back to back on the one connection, after the
    /// caller has the previous token: the step's online part moves fewer bytes, its total does
    /// not fall (overlapping the offline phase with the caller's handling of a token is not
    /// built). A refusal (the server's memory) leaves the step single-phase.
    pub fn set_preprocessing(&mut self, on: bool) {
        self.preprocess = on;
    }

    /// The truncation mode the server announced.
    pub fn truncation(&self) -> ProductTruncation {
        self.truncation
    }

    /// Starts a generation whose context may hold `context_limit` positions (any current one
    /// ends first, on both sides). A refusal comes back as `Error::Refused` and the session
    /// goes on.
    pub fn start(&mut self, context_limit: usize) -> Result<PrivateGeneration<'_, 't, C>> {
        let generation = self.request_start(context_limit)?;
        Ok(PrivateGeneration {
            client: self,
            generation,
            material: None,
        })
    }

    /// [`Self::start`] keeping the session: the generation then owns its session (one
    /// connection per generation), so it can be handed out as a `NextLogits + Send` of its own,
    /// as the CLI's engines hand out sessions.
    pub fn into_generation(mut self, context_limit: usize) -> Result<OwnedGeneration<'t, C>> {
        let generation = self.request_start(context_limit)?;
        Ok(OwnedGeneration {
            client: self,
            generation,
            material: None,
        })
    }

    /// Asks the server for a generation of `context_limit` positions; the client's half of it.
    fn request_start(&mut self, context_limit: usize) -> Result<Generation> {
        let cfg = self.tables.config();
        ensure!(
            (1..=self.cap).contains(&context_limit),
            InvalidArgument,
            "a context limit of {context_limit} positions (this session takes 1..={})",
            self.cap
        );
        // Made before the request so that a local refusal sends nothing.
        let arithmetic = (self.truncation, self.activation_bits);
        let generation = Generation::new(cfg, arithmetic, context_limit)?;
        set_deadline(&mut self.ch, self.step_timeout)?;
        GenerationRequest::GenerateStart {
            context_limit: context_limit as u32,
        }
        .send(&mut self.ch)?;
        self.ch.flush()?;
        match GenerateReply::recv(&mut self.ch)? {
            GenerateReply::Accepted => Ok(generation),
            GenerateReply::Refused(why) => bail!(Refused, "the server refused: {why}"),
        }
    }

    /// One step of `generation` on this session: `ids` after its cached positions, on the
    /// material in `material` when it was made for this step (else it is dropped, and the
    /// server drops its own at the plain step); the last one's logits as ring values at f bits.
    /// With preprocessing on, the next decode step is then preprocessed.
    fn step(
        &mut self,
        generation: &mut Generation,
        material: &mut Option<StepMaterial>,
        ids: &[u32],
    ) -> Result<veil_core::RingTensor> {
        // Refused before the request: the server would end the session on it.
        generation.check_room(ids.len())?;
        let start = generation.positions();
        let material = material.take().filter(|m| m.is_for(start, ids.len()));
        set_deadline(&mut self.ch, self.step_timeout)?;
        let tokens = ids.len() as u32;
        match material {
            Some(_) => GenerationRequest::PreprocessedStep { tokens },
            None => GenerationRequest::Step { tokens },
        }
        .send(&mut self.ch)?;
        let side = DecoderSide::Client(&self.lin, self.tables);
        let logits = {
            let mut party = DecoderParty::new(&mut self.ch, &mut self.ot, side, generation)?;
            match material {
                Some(m) => party.client_step_with(ids, m)?,
                None => party.client_step(ids)?,
            }
        };
        Ok(logits)
    }

    /// Preprocesses `generation`'s next step of one token into `material` when preprocessing
    /// is on and the context has room for it; whether material was made (the server may
    /// refuse: its memory).
    fn preprocess_next(
        &mut self,
        generation: &mut Generation,
        material: &mut Option<StepMaterial>,
    ) -> Result<bool> {
        // Any old material goes first, as the server's does.
        *material = None;
        let private = matches!(self.tables, ClientTables::Private(..));
        if !self.preprocess || private || generation.check_room(1).is_err() {
            return Ok(false);
        }
        set_deadline(&mut self.ch, self.step_timeout)?;
        GenerationRequest::PreprocessStep { tokens: 1 }.send(&mut self.ch)?;
        self.ch.flush()?;
        let pool_cots = match PreprocessReply::recv(&mut self.ch)? {
            // A decoder step's pools are built ahead whole (the step's draw is small).
            PreprocessReply::Accepted(fill) => {
                ensure!(
                    fill == PoolFill::built(fill.built as usize),
                    Malformed,
                    "a step's pools refilled beyond what is built ahead ({fill:?})"
                );
                fill.built as usize
            }
            PreprocessReply::Refused(why) => {
                tracing::info!(why, "the server refused to preprocess the next step");
                return Ok(false);
            }
        };
        let side = DecoderSide::Client(&self.lin, self.tables);
        let made = DecoderParty::new(&mut self.ch, &mut self.ot, side, generation)?
            .preprocess(1, pool_cots)?;
        *material = Some(made);
        Ok(true)
    }

    /// [`Self::step`] decoded to f32 as the simulator's `step_f64` (then `as f32`) does, so
    /// equal integers give equal tokens. With preprocessing on, a one-token step is first
    /// preprocessed (when no material for it is held): once the caller asks for it, so the
    /// token before it was already returned and no step after a generation's last token is
    /// preprocessed for nothing.
    fn step_f32(
        &mut self,
        generation: &mut Generation,
        material: &mut Option<StepMaterial>,
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        let fp = self.tables.format().fp;
        let held = material
            .as_ref()
            .is_some_and(|m| m.is_for(generation.positions(), ids.len()));
        if ids.len() == 1 && !held {
            self.preprocess_next(generation, material)?;
        }
        let logits = self.step(generation, material, ids)?;
        Ok(logits.decode(fp).iter().map(|&v| v as f32).collect())
    }

    /// Generates from `prompt` with `veil_model::generate` (its sampling and stop tokens) in a
    /// new generation whose limit is the prompt plus `opts.max_new_tokens`, calling `on_token`
    /// with each token as it comes; the tokens, and whether a stop token ended it.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: impl FnMut(&GeneratedToken) -> Result<()>,
    ) -> Result<(Vec<GeneratedToken>, bool)> {
        ensure!(!prompt.is_empty(), InvalidArgument, "an empty prompt");
        // Refused before anything is sent: a prompt longer than it is padded to.
        let run = padded_prompt(prompt, opts.pad_to)?.len();
        // The last token is picked, never run: the (padded) prompt + max_new − 1 positions at
        // most.
        let limit = run + opts.max_new_tokens.saturating_sub(1);
        let mut g = self.start(limit)?;
        let out = generate(&mut g, prompt, opts, on_token)?;
        g.end()?;
        Ok(out)
    }

    /// Ends the session (goodbye).
    pub fn close(mut self) -> Result<()> {
        GenerationRequest::Goodbye.send(&mut self.ch)?;
        self.ch.flush()
    }

    /// The channel, for tests that send what a well-behaved client would not.
    pub fn channel(&mut self) -> &mut C {
        &mut self.ch
    }
}

/// One private generation: each [`NextLogits::next_logits`] is one step (the server told only
/// its token count). Dropping it without [`Self::end`] leaves the server's cache until the
/// next start or the session's end.
pub struct PrivateGeneration<'c, 't, C: Channel> {
    client: &'c mut GenerationClient<'t, C>,
    generation: Generation,
    /// The next step's material, when it was preprocessed.
    material: Option<StepMaterial>,
}

impl<C: Channel> PrivateGeneration<'_, '_, C> {
    /// Runs `ids` after the cached positions (on the material [`Self::preprocess_next`] made,
    /// when it was made for this step); the last one's logits as ring values at f bits. Does
    /// not preprocess the next step itself: the caller measures each phase apart.
    pub fn step(&mut self, ids: &[u32]) -> Result<veil_core::RingTensor> {
        self.client
            .step(&mut self.generation, &mut self.material, ids)
    }

    /// Preprocesses the next step of one token when the session's preprocessing is on
    /// ([`GenerationClient::set_preprocessing`]) and the context has room; whether material
    /// was made (the server may refuse it: its memory).
    pub fn preprocess_next(&mut self) -> Result<bool> {
        self.client
            .preprocess_next(&mut self.generation, &mut self.material)
    }

    /// Positions cached so far.
    pub fn positions(&self) -> usize {
        self.generation.positions()
    }

    /// Ends the generation: the server frees its cache.
    pub fn end(self) -> Result<()> {
        GenerationRequest::GenerateEnd.send(&mut self.client.ch)?;
        self.client.ch.flush()
    }
}

impl<C: Channel> NextLogits for PrivateGeneration<'_, '_, C> {
    /// The step's logits decoded to f32 as the simulator's `step_f64` (then `as f32`) does,
    /// so equal integers give equal tokens.
    fn next_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.client
            .step_f32(&mut self.generation, &mut self.material, ids)
    }

    /// The padding stays on this side ([`Generation::hide_padding`]): the server sees the
    /// padded length.
    fn hide_padding(&mut self, padding: usize) -> Result<()> {
        self.generation.hide_padding(padding)
    }
}

/// A private generation that owns its session ([`GenerationClient::into_generation`]):
/// dropping it closes the connection, which ends the generation and the session on the server
/// (its cache and memory freed).
pub struct OwnedGeneration<'t, C: Channel> {
    client: GenerationClient<'t, C>,
    generation: Generation,
    material: Option<StepMaterial>,
}

impl<C: Channel> NextLogits for OwnedGeneration<'_, C> {
    /// As [`PrivateGeneration`]'s.
    fn next_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.client
            .step_f32(&mut self.generation, &mut self.material, ids)
    }

    /// The padding stays on this side ([`Generation::hide_padding`]): the server sees the
    /// padded length.
    fn hide_padding(&mut self, padding: usize) -> Result<()> {
        self.generation.hide_padding(padding)
    }
}
