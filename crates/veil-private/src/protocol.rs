//! The session's wire contract: one type per message, each with one encoder and one decoder,
//! used by both the client ([`crate::connection`]) and the server ([`crate::handler`]).
//!
//! Every message travels length-prefixed and size-limited (`veil_net::Channel`; each type's
//! [`Message::MAX_BYTES`] is the limit its receiver reads with). Integers are little-endian.
//! Decoders reject trailing bytes and every value outside the field's range, naming the
//! message; they never panic on anything a peer sends (`tests/protocol/mutation.rs`, `fuzz/`).
//!
//! | message | direction | bytes |
//! |---|---|---|
//! | [`Hello`] | client → server | "VEIL" ‖ [`VERSION`] (u32) ‖ longest prompt, tokens (u32; 1 to the model's limit, anything else is refused) |
//! | [`Admission`] | server → client | 0 ‖ bundle flag (u8: 0 none, 1 a digest follows) ‖ the client bundle's SHA-256 digest (32 bytes, if flagged) ‖ activation bound bits (u8: 0 none, else below the session ring's bits − 1) ‖ cuts (u8: 0 kept, 1 per length) ‖ the model's public `config.json`, or 1 ‖ why it refuses (UTF-8) |
//! | [`EmbeddingLookup`] | server → client | the lookup method's tag (u8; private-embedding mode only) |
//! | [`Request`] | client → server | tag (u8) ‖ fields: 0 goodbye; 1 inference ‖ length (u32) ‖ preprocessed (u8: 0 or 1); 2 preprocessing ‖ length (u32) |
//! | [`PreprocessReply`] | server → client | 0 ‖ the COTs to build ahead (u64) ‖ the COTs the server's sending and receiving directions are refilled to hold (u64 each; [`PoolFill`]), or 1 ‖ why it refuses (UTF-8) |
//! | [`OutputShare`] | server → client | the server's share of the output, ring elements at ⌈ℓ/8⌉ bytes |
//! | [`DecoderAdmission`] | server → client | a decoder server's answer to the hello: 2 ‖ ring bits (u8) ‖ fraction bits (u8) ‖ norm domain bits (u8) ‖ truncation (u8: 0 faithful, 1 one-bit error) ‖ activation bound bits (u8: 0 none, else below ring bits − 1) ‖ tables (u8: 0 public, 1 private) ‖ the public tables' digest, or the shape's for private tables (32 bytes), or 1 ‖ why it refuses (UTF-8) |
//! | [`GenerationRequest`] | client → server | tag (u8) ‖ fields: 0 goodbye; 16 generation start ‖ context limit (u32); 17 step ‖ tokens (u32); 18 generation end; 19 preprocess the next step ‖ tokens (u32), answered by [`PreprocessReply`]; 20 preprocessed step ‖ tokens (u32) |
//! | [`GenerateReply`] | server → client | 0 (accepted), or 1 ‖ why it refuses (UTF-8) |
//!
//! A decoder server answers the hello with [`DecoderAdmission`] instead of [`Admission`] and
//! reads [`GenerationRequest`]s instead of [`Request`]s (tags 16–31, [`GENERATION_TAGS`]); each
//! side names the other kind of model when it meets it. A step's own flights
//! (`crate::decoder`) follow its request without a reply message.
//!
//! Between these messages the protocols of veil-linear, veil-nonlinear and veil-ot carry their
//! own (set-up after the admission, the forward pass after an inference request, the
//! preprocessing after its reply). The hello and the admission travel as they are, so that a
//! client of another version still reads why it is refused; everything after the admission
//! travels in records on sockets (`veil_net::records`, [`veil_net::Channel::start_records`]),
//! where the server may end the session with a close record carrying its reason. Request tags
//! [`GENERATION_TAGS`] are a decoder session's (below); an encoder session refuses them, naming
//! the kind of model it serves.

use std::ops::RangeInclusive;

use veil_core::wire::{Reader, Writer};
use veil_core::{bail, ensure, FixedPoint, Result, Ring};
use veil_linear::LookupMethod;
use veil_model::BundleDigest;
use veil_model::ModelConfig;
use veil_model::{DecoderFormat, ProductTruncation};
use veil_net::Channel;
use veil_nonlinear::OtSession;

use crate::prepared::Cuts;

/// The protocol version; 2 added the hello's length and the server's status byte; 3 widened
/// LayerNorm's domain to 2^11 and the FC weight bound to 2^17; 4 added the client bundle's
/// digest to the admission and refuses a hello of 0 tokens; 5 carries everything after the
/// admission in records (`veil_net::records`), so that the server can end a session with its
/// reason at any point; 6 gave the decoder's ℓ = 48 set Galois keys of 9 levels (its single-row
/// products pack responses at strides up to 512, with layouts of their own); 7 announces the
/// decoder's activation bound at admission (its SiLU/GELU comparisons run on that many bits);
/// 8 announces an encoder's GELU bound the same way; 9 has a preprocessing reply name the
/// pools' refill in seed form per direction beside the COTs built ahead ([`PoolFill`]); 10 has
/// an encoder server announce which cuts its linear layers take ([`Announced::cuts`]).
pub const VERSION: u32 = 10;

/// The fixed-point format of every session (the project defaults; training uses the same).
pub fn session_format() -> FixedPoint {
    FixedPoint::default_format()
}

/// Request tags of the generation steps of decoder models ([`GenerationRequest`]); an encoder
/// session refuses them.
pub const GENERATION_TAGS: RangeInclusive<u8> = 16..=31;
const STATUS_DECODER: u8 = 2;
const TAG_GENERATE_START: u8 = 16;
const TAG_STEP: u8 = 17;
const TAG_GENERATE_END: u8 = 18;
const TAG_PREPROCESS_STEP: u8 = 19;
const TAG_PREPROCESSED_STEP: u8 = 20;

const MAGIC: &[u8; 4] = b"VEIL";
const HELLO_BYTES: usize = 12;
const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;
const TAG_GOODBYE: u8 = 0;
const TAG_INFER: u8 = 1;
const TAG_PREPROCESS: u8 = 2;
/// The largest answer to a hello (the model's configuration) or to a preprocessing request.
const MAX_REPLY_BYTES: usize = 1 << 20;

/// A session message that decodes without context: one encoder, one decoder.
pub trait Message: Sized {
    /// Names the message in errors.
    const WHAT: &'static str;
    /// The most bytes its receiver reads.
    const MAX_BYTES: usize;

    /// Writes the message's fields.
    fn write(&self, w: &mut Writer);

    /// Reads the message's fields (the caller rejects what is left over).
    fn read(r: &mut Reader<'_>) -> Result<Self>;

    /// The message's bytes.
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.write(&mut w);
        w.finish()
    }

    /// The message from exactly `bytes`: trailing bytes are refused.
    fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, Self::WHAT);
        let m = Self::read(&mut r)?;
        r.finish()?;
        Ok(m)
    }

    /// Sends the message.
    fn send<C: Channel + ?Sized>(&self, ch: &mut C) -> Result<()> {
        ch.send_msg(&self.encode())
    }

    /// Receives and decodes one message of this type.
    fn recv<C: Channel + ?Sized>(ch: &mut C) -> Result<Self> {
        Self::decode(&ch.recv_msg(Self::MAX_BYTES)?)
    }
}

/// Reads the rest of a message as UTF-8 text.
fn text(r: &mut Reader<'_>, what: &str) -> Result<String> {
    let bytes = r.take(r.remaining())?;
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => bail!(Malformed, "{what} is not UTF-8"),
    }
}

/// An admission's activation bound as its byte: 0 for none.
fn activation_bits_byte(bound: Option<u32>) -> u8 {
    bound.map_or(0, |k| k as u8)
}

/// An admission's activation bound: 0 for none, else a comparison width a `ring_bits`-bit
/// ring has room for (below ℓ − 1).
fn read_activation_bits(r: &mut Reader<'_>, ring_bits: u32) -> Result<Option<u32>> {
    match u32::from(r.u8()?) {
        0 => Ok(None),
        k if k < ring_bits - 1 => Ok(Some(k)),
        k => bail!(
            Malformed,
            "an activation bound of 2^{k} in a {ring_bits}-bit ring"
        ),
    }
}

/// The client's first message: who it is and the longest prompt it will send, so the server
/// checks its memory before the set-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The longest prompt of the session, in tokens (1 to the model's limit: the server
    /// reserves memory for it and refuses anything else).
    pub max_tokens: u32,
}

impl Message for Hello {
    const WHAT: &'static str = "hello";
    /// A little more than a hello, so that a stranger is named as one.
    const MAX_BYTES: usize = 64;

    fn write(&self, w: &mut Writer) {
        w.bytes(MAGIC).u32(VERSION).u32(self.max_tokens);
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        let total = r.remaining();
        ensure!(
            r.take(MAGIC.len()).ok() == Some(MAGIC.as_slice()),
            Malformed,
            "not a Veil client (its first message is not a Veil hello)"
        );
        let v = r.u32()?;
        ensure!(
            v == VERSION,
            Unsupported,
            "client speaks protocol version {v}, server {VERSION}"
        );
        ensure!(
            total == HELLO_BYTES,
            Malformed,
            "a hello of {total} bytes, expected {HELLO_BYTES}"
        );
        Ok(Hello {
            max_tokens: r.u32()?,
        })
    }
}

/// What a server announces when it admits a session, which the client checks against its own
/// bundle before anything secret moves.
#[derive(Clone, Debug, PartialEq)]
pub struct Announced {
    /// The model's public configuration (architecture and operator variants).
    pub config: ModelConfig,
    /// The digest of the client bundle the server would export (`veil_model::manifest`);
    /// `None` from a server that has none (a model without a tokenizer, an in-process server).
    pub bundle: Option<BundleDigest>,
    /// k with every GELU input below 2^k, proved from the server's weights
    /// (`veil_model::FixedModel::activation_bits`): both parties' GELUs compare on k bits.
    /// None: on the whole ring.
    pub activation_bits: Option<u32>,
    /// Which cuts of its weights the linear layers take ([`Cuts`]): the kept ones when the
    /// server caches their NTT forms, else each request's own length's.
    pub cuts: Cuts,
}

/// The server's answer to a hello.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// The session goes on.
    Admitted(Announced),
    /// The session ends: why (busy, shutting down, too long for the server's memory).
    Refused(String),
}

impl Message for Admission {
    const WHAT: &'static str = "the server's answer to the hello";
    const MAX_BYTES: usize = MAX_REPLY_BYTES;

    fn write(&self, w: &mut Writer) {
        match self {
            Admission::Admitted(a) => {
                w.u8(STATUS_OK);
                match &a.bundle {
                    Some(d) => w.u8(1).bytes(&d.0),
                    None => w.u8(0),
                };
                w.u8(activation_bits_byte(a.activation_bits))
                    .u8(match a.cuts {
                        Cuts::Kept => 0,
                        Cuts::PerLength => 1,
                    })
                    .bytes(a.config.to_json().as_bytes())
            }
            Admission::Refused(why) => w.u8(STATUS_REFUSED).bytes(why.as_bytes()),
        };
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        let what = "the server's answer to the hello";
        match r.u8()? {
            STATUS_OK => {
                let bundle = match r.u8()? {
                    0 => None,
                    1 => {
                        let mut d = [0u8; 32];
                        d.copy_from_slice(r.take(32)?);
                        Some(BundleDigest(d))
                    }
                    f => bail!(Malformed, "bundle flag {f} in the server's answer"),
                };
                let activation_bits = read_activation_bits(r, session_format().ring.bits())?;
                let cuts = match r.u8()? {
                    0 => Cuts::Kept,
                    1 => Cuts::PerLength,
                    c => bail!(Malformed, "cuts {c} in the server's answer"),
                };
                let config = ModelConfig::from_json(&text(r, what)?)?;
                Ok(Admission::Admitted(Announced {
                    config,
                    bundle,
                    activation_bits,
                    cuts,
                }))
            }
            STATUS_REFUSED => Ok(Admission::Refused(text(r, what)?)),
            STATUS_DECODER => bail!(
                Unsupported,
                "the server serves a decoder model (private generation), not classification"
            ),
            s => bail!(Malformed, "unknown status {s} in the server's answer"),
        }
    }
}

/// Private-embedding mode: the lookup method the server's tables are prepared for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddingLookup(pub LookupMethod);

impl Message for EmbeddingLookup {
    const WHAT: &'static str = "lookup method";
    const MAX_BYTES: usize = 1;

    fn write(&self, w: &mut Writer) {
        w.u8(self.0.tag());
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        Ok(EmbeddingLookup(LookupMethod::from_tag(r.u8()?)?))
    }
}

/// What the client asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Ends the session.
    Goodbye,
    /// One inference of `tokens` tokens, on the oldest material preprocessed for that length
    /// when `preprocessed` (the server ends a session asking for material it does not hold).
    Infer {
        /// The sequence length (at most the hello's).
        tokens: u32,
        /// Whether to use preprocessed material.
        preprocessed: bool,
    },
    /// The linear layers' work for a future inference of `tokens` tokens.
    Preprocess {
        /// The sequence length (at most the hello's).
        tokens: u32,
    },
}

impl Message for Request {
    const WHAT: &'static str = "request";
    const MAX_BYTES: usize = 6;

    fn write(&self, w: &mut Writer) {
        match *self {
            Request::Goodbye => w.u8(TAG_GOODBYE),
            Request::Infer {
                tokens,
                preprocessed,
            } => w.u8(TAG_INFER).u32(tokens).u8(preprocessed as u8),
            Request::Preprocess { tokens } => w.u8(TAG_PREPROCESS).u32(tokens),
        };
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        match r.u8()? {
            TAG_GOODBYE => Ok(Request::Goodbye),
            TAG_INFER => {
                let tokens = r.u32()?;
                let preprocessed = match r.u8()? {
                    0 => false,
                    1 => true,
                    f => bail!(Malformed, "request flag {f}"),
                };
                Ok(Request::Infer {
                    tokens,
                    preprocessed,
                })
            }
            TAG_PREPROCESS => Ok(Request::Preprocess { tokens: r.u32()? }),
            t if GENERATION_TAGS.contains(&t) => bail!(
                Unsupported,
                "request tag {t} is a generation request, and this session serves an encoder \
                 model (classification), not a decoder"
            ),
            t => bail!(Malformed, "unknown request tag {t}"),
        }
    }
}

/// How far both parties fill their silent-OT pools when they preprocess: refilled to hold
/// `ready` COTs in the server's (sending, receiving) directions, kept in seed form (about 1.1
/// bytes a COT: all an inference draws, so its online phase refills nothing), of which the
/// first `built` of each direction are built ahead (16–17 bytes a COT, so online calls only
/// copy them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolFill {
    /// COTs each direction holds after the refill, at most `OtSession::MAX_READY`.
    pub ready: (u64, u64),
    /// COTs built ahead in each direction (refilling the quieter one further when it draws
    /// fewer), at most `OtSession::MAX_PRECOMPUTE` and at most the busier direction's `ready`.
    pub built: u64,
}

impl PoolFill {
    /// `n` COTs each way, all built ahead.
    pub(crate) fn built(n: usize) -> Self {
        PoolFill {
            ready: (n as u64, n as u64),
            built: n as u64,
        }
    }

    /// Refills and builds this party's pools (the server's directions swapped for the client):
    /// both parties call it at the same point of the offline phase.
    pub(crate) fn apply<C: Channel>(self, ot: &mut OtSession, ch: &mut C) -> Result<()> {
        let (send, recv) = (self.ready.0 as usize, self.ready.1 as usize);
        match ot.role() {
            veil_net::Role::Server => ot.refill(ch, send, recv)?,
            veil_net::Role::Client => ot.refill(ch, recv, send)?,
        }
        ot.precompute(ch, self.built as usize)
    }
}

/// The server's answer to a preprocessing request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreprocessReply {
    /// Both parties preprocess and fill their silent-OT pools so.
    Accepted(PoolFill),
    /// Why not (the session's budget is spent, the server's memory is in use); the session
    /// goes on.
    Refused(String),
}

impl Message for PreprocessReply {
    const WHAT: &'static str = "preprocessing status";
    const MAX_BYTES: usize = MAX_REPLY_BYTES;

    fn write(&self, w: &mut Writer) {
        match self {
            PreprocessReply::Accepted(f) => {
                w.u8(STATUS_OK).u64(f.built).u64(f.ready.0).u64(f.ready.1)
            }
            PreprocessReply::Refused(why) => w.u8(STATUS_REFUSED).bytes(why.as_bytes()),
        };
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        match r.u8()? {
            STATUS_OK => {
                let (built, send, recv) = (r.u64()?, r.u64()?, r.u64()?);
                ensure!(
                    built <= OtSession::MAX_PRECOMPUTE as u64
                        && send.max(recv) <= OtSession::MAX_READY as u64
                        && built <= send.max(recv),
                    Malformed,
                    "pools of {send} and {recv} COTs with {built} built ahead"
                );
                Ok(PreprocessReply::Accepted(PoolFill {
                    ready: (send, recv),
                    built,
                }))
            }
            STATUS_REFUSED => Ok(PreprocessReply::Refused(text(
                r,
                "the preprocessing refusal",
            )?)),
            s => bail!(Malformed, "unknown preprocessing status {s}"),
        }
    }
}

/// The answer to an inference: the server's share of the output, whose length both parties
/// know from the model's shape (so it decodes with that context, not through [`Message`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputShare(pub Vec<u64>);

impl OutputShare {
    const WHAT: &'static str = "output share";

    /// The message's bytes (every element in `ring`).
    pub fn encode(&self, ring: Ring) -> Vec<u8> {
        let mut w = Writer::new();
        w.ring_elems(ring, &self.0);
        w.finish()
    }

    /// Exactly `count` elements of `ring`.
    pub fn decode(bytes: &[u8], ring: Ring, count: usize) -> Result<Self> {
        let mut r = Reader::new(bytes, Self::WHAT);
        let v = r.ring_elems(ring, count)?;
        r.finish()?;
        Ok(OutputShare(v))
    }

    /// Sends the share.
    pub fn send<C: Channel + ?Sized>(&self, ch: &mut C, ring: Ring) -> Result<()> {
        ch.send_msg(&self.encode(ring))
    }

    /// Receives a share of `count` elements of `ring`.
    pub fn recv<C: Channel + ?Sized>(ch: &mut C, ring: Ring, count: usize) -> Result<Self> {
        Self::decode(&ch.recv_msg_exact(count * ring.byte_len())?, ring, count)
    }
}

/// What a decoder server announces at admission: what the client checks it runs the same
/// public model with, before any key material moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderAnnounced {
    /// The fixed-point format both parties compute in (the HE set-up runs at its ring).
    pub format: DecoderFormat,
    /// How every truncation after a product runs (both parties must agree: it decides the
    /// protocol each truncation speaks).
    pub truncation: ProductTruncation,
    /// k with every SiLU/GELU input below 2^k, proved from the server's weights
    /// (`veil_model::FixedDecoder::activation_bits`): both parties' activations compare on k
    /// bits. None: on the whole ring.
    pub activation_bits: Option<u32>,
    /// What the server says of its tables.
    pub tables: AnnouncedTables,
}

/// A decoder server's tables at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnnouncedTables {
    /// Public: `veil_model::DecoderTables::digest` of them, which covers the decoder's
    /// configuration and the format too; the client embeds and applies the head itself.
    Public(BundleDigest),
    /// The server's secret (`ServerDecoder::keep_tables_private`):
    /// `veil_model::DecoderTables::shape_digest` of the configuration and format, all a client
    /// without tables can check.
    Private(BundleDigest),
}

/// A decoder server's answer to a hello.
#[derive(Clone, Debug, PartialEq)]
pub enum DecoderAdmission {
    /// The session goes on.
    Admitted(DecoderAnnounced),
    /// The session ends: why.
    Refused(String),
}

impl Message for DecoderAdmission {
    const WHAT: &'static str = "the decoder server's answer to the hello";
    const MAX_BYTES: usize = MAX_REPLY_BYTES;

    fn write(&self, w: &mut Writer) {
        match self {
            DecoderAdmission::Admitted(a) => {
                let truncation = match a.truncation {
                    ProductTruncation::Faithful => 0,
                    ProductTruncation::OneBitError => 1,
                };
                let fp = a.format.fp;
                w.u8(STATUS_DECODER)
                    .u8(fp.ring.bits() as u8)
                    .u8(fp.frac_bits() as u8)
                    .u8(a.format.norm_dev_bits as u8)
                    .u8(truncation)
                    .u8(activation_bits_byte(a.activation_bits));
                match a.tables {
                    AnnouncedTables::Public(d) => w.u8(0).bytes(&d.0),
                    AnnouncedTables::Private(d) => w.u8(1).bytes(&d.0),
                }
            }
            DecoderAdmission::Refused(why) => w.u8(STATUS_REFUSED).bytes(why.as_bytes()),
        };
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        match r.u8()? {
            STATUS_DECODER => {
                let (ring, frac, norm) = (r.u8()?, r.u8()?, r.u8()?);
                let fp = FixedPoint::new(ring.into(), frac.into())?;
                ensure!(
                    norm < ring,
                    Malformed,
                    "a norm domain of 2^{norm} in a {ring}-bit ring"
                );
                let truncation = match r.u8()? {
                    0 => ProductTruncation::Faithful,
                    1 => ProductTruncation::OneBitError,
                    t => bail!(Malformed, "truncation mode {t}"),
                };
                let activation_bits = read_activation_bits(r, ring.into())?;
                let private = match r.u8()? {
                    0 => false,
                    1 => true,
                    t => bail!(Malformed, "tables kind {t}"),
                };
                let mut d = [0u8; 32];
                d.copy_from_slice(r.take(32)?);
                let d = BundleDigest(d);
                Ok(DecoderAdmission::Admitted(DecoderAnnounced {
                    format: DecoderFormat {
                        fp,
                        norm_dev_bits: norm.into(),
                    },
                    truncation,
                    activation_bits,
                    tables: match private {
                        false => AnnouncedTables::Public(d),
                        true => AnnouncedTables::Private(d),
                    },
                }))
            }
            STATUS_REFUSED => Ok(DecoderAdmission::Refused(text(
                r,
                "the decoder server's refusal",
            )?)),
            STATUS_OK => bail!(
                Unsupported,
                "the server serves an encoder model (classification), not private generation"
            ),
            s => bail!(Malformed, "unknown status {s} in the server's answer"),
        }
    }
}

/// What a generation client asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerationRequest {
    /// Ends the session.
    Goodbye,
    /// A new generation whose KV cache may hold `context_limit` positions (the prompt and every
    /// generated token); any current generation ends first. Answered by [`GenerateReply`].
    GenerateStart {
        /// Positions, 1 to the hello's length and the model's `max_positions`.
        context_limit: u32,
    },
    /// The next `tokens` positions of the current generation (the prompt, then 1 per
    /// generated token); its flights follow at once, no reply.
    Step {
        /// New positions, at least 1, within the context limit.
        tokens: u32,
    },
    /// Ends the current generation and frees its cache; the session goes on.
    GenerateEnd,
    /// Preprocess the current generation's next step of `tokens` positions
    /// (`crate::decoder`'s preprocessing), replacing any material held. Answered by
    /// [`PreprocessReply`]; when accepted, the offline flights follow at once.
    PreprocessStep {
        /// The next step's new positions, at least 1, within the context limit.
        tokens: u32,
    },
    /// As [`GenerationRequest::Step`], on the material the last accepted
    /// [`GenerationRequest::PreprocessStep`] made for this very step.
    PreprocessedStep {
        /// New positions, as the material was made for.
        tokens: u32,
    },
}

impl Message for GenerationRequest {
    const WHAT: &'static str = "generation request";
    const MAX_BYTES: usize = 5;

    fn write(&self, w: &mut Writer) {
        match *self {
            GenerationRequest::Goodbye => w.u8(TAG_GOODBYE),
            GenerationRequest::GenerateStart { context_limit } => {
                w.u8(TAG_GENERATE_START).u32(context_limit)
            }
            GenerationRequest::Step { tokens } => w.u8(TAG_STEP).u32(tokens),
            GenerationRequest::GenerateEnd => w.u8(TAG_GENERATE_END),
            GenerationRequest::PreprocessStep { tokens } => w.u8(TAG_PREPROCESS_STEP).u32(tokens),
            GenerationRequest::PreprocessedStep { tokens } => {
                w.u8(TAG_PREPROCESSED_STEP).u32(tokens)
            }
        };
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        match r.u8()? {
            TAG_GOODBYE => Ok(GenerationRequest::Goodbye),
            TAG_GENERATE_START => Ok(GenerationRequest::GenerateStart {
                context_limit: r.u32()?,
            }),
            TAG_STEP => Ok(GenerationRequest::Step { tokens: r.u32()? }),
            TAG_GENERATE_END => Ok(GenerationRequest::GenerateEnd),
            TAG_PREPROCESS_STEP => Ok(GenerationRequest::PreprocessStep { tokens: r.u32()? }),
            TAG_PREPROCESSED_STEP => Ok(GenerationRequest::PreprocessedStep { tokens: r.u32()? }),
            t @ (TAG_INFER | TAG_PREPROCESS) => bail!(
                Unsupported,
                "request tag {t} is an encoder request, and this session serves a decoder model \
                 (private generation)"
            ),
            t => bail!(Malformed, "unknown generation request tag {t}"),
        }
    }
}

/// The server's answer to [`GenerationRequest::GenerateStart`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenerateReply {
    /// The cache is reserved; steps may follow.
    Accepted,
    /// Why not (a limit above the session's, the server's memory in use); the session goes on
    /// without a generation.
    Refused(String),
}

impl Message for GenerateReply {
    const WHAT: &'static str = "generation status";
    const MAX_BYTES: usize = MAX_REPLY_BYTES;

    fn write(&self, w: &mut Writer) {
        match self {
            GenerateReply::Accepted => w.u8(STATUS_OK),
            GenerateReply::Refused(why) => w.u8(STATUS_REFUSED).bytes(why.as_bytes()),
        };
    }

    fn read(r: &mut Reader<'_>) -> Result<Self> {
        match r.u8()? {
            STATUS_OK => Ok(GenerateReply::Accepted),
            STATUS_REFUSED => Ok(GenerateReply::Refused(text(r, "the generation refusal")?)),
            s => bail!(Malformed, "unknown generation status {s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_model::random::Preset;

    /// Every prefix of a message fails to decode, as does the message with a byte appended.
    fn strict<M: Message + std::fmt::Debug>(m: &M) {
        let bytes = m.encode();
        for cut in 0..bytes.len() {
            assert!(M::decode(&bytes[..cut]).is_err(), "{m:?} cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        let e = M::decode(&long).unwrap_err().to_string();
        assert!(e.contains("trailing") || e.contains("bytes"), "{m:?}: {e}");
        assert!(bytes.len() <= M::MAX_BYTES);
    }

    /// A message of fixed fields decodes to itself and strictly.
    fn round_trip<M: Message + std::fmt::Debug + PartialEq>(m: M) {
        assert_eq!(M::decode(&m.encode()).unwrap(), m);
        strict(&m);
    }

    /// A message ending in free text (a refusal's reason) decodes to itself; its text has no
    /// length to check, but a cut into its fixed part still fails.
    fn round_trip_text<M: Message + std::fmt::Debug + PartialEq>(m: M) {
        let bytes = m.encode();
        assert_eq!(M::decode(&bytes).unwrap(), m);
        assert!(M::decode(&[]).is_err());
    }

    #[test]
    fn generation_messages_round_trip_and_name_the_other_model_kind() {
        for m in [
            GenerationRequest::Goodbye,
            GenerationRequest::GenerateStart { context_limit: 0 },
            GenerationRequest::GenerateStart {
                context_limit: u32::MAX,
            },
            GenerationRequest::Step { tokens: 7 },
            GenerationRequest::GenerateEnd,
            GenerationRequest::PreprocessStep { tokens: 1 },
            GenerationRequest::PreprocessedStep { tokens: u32::MAX },
        ] {
            round_trip(m);
        }
        round_trip(GenerateReply::Accepted);
        round_trip_text(GenerateReply::Refused("busy".into()));
        let a = DecoderAdmission::Admitted(DecoderAnnounced {
            format: DecoderFormat::default(),
            truncation: ProductTruncation::Faithful,
            activation_bits: Some(21),
            tables: AnnouncedTables::Public(BundleDigest([7; 32])),
        });
        round_trip(a.clone());
        round_trip(DecoderAdmission::Admitted(DecoderAnnounced {
            format: DecoderFormat::default(),
            truncation: ProductTruncation::OneBitError,
            activation_bits: None,
            tables: AnnouncedTables::Private(BundleDigest([9; 32])),
        }));
        round_trip_text(DecoderAdmission::Refused("full".into()));
        // An encoder request on a decoder session and the reverse are named, not garbled.
        let infer = Request::Infer {
            tokens: 3,
            preprocessed: false,
        };
        let e = GenerationRequest::decode(&infer.encode()).unwrap_err();
        assert!(e.to_string().contains("encoder request"), "{e}");
        let step = GenerationRequest::Step { tokens: 1 }.encode();
        let e = Request::decode(&step).unwrap_err();
        assert!(e.to_string().contains("serves an encoder"), "{e}");
        let e = Admission::decode(&a.encode()).unwrap_err();
        assert!(e.to_string().contains("decoder model"), "{e}");
        let enc = Admission::Admitted(Announced {
            config: Preset::BertTiny.config().announced(),
            bundle: None,
            activation_bits: None,
            cuts: Cuts::Kept,
        });
        let e = DecoderAdmission::decode(&enc.encode()).unwrap_err();
        assert!(e.to_string().contains("encoder model"), "{e}");
        // Out-of-range fields are refused: a ring the fixed point cannot take, a bad mode.
        let mut bad = a.encode();
        bad[1] = 70;
        assert!(DecoderAdmission::decode(&bad).is_err());
        let mut bad = a.encode();
        bad[4] = 9;
        assert!(DecoderAdmission::decode(&bad).is_err());
        let mut bad = a.encode();
        bad[5] = 47;
        let e = DecoderAdmission::decode(&bad).unwrap_err();
        assert!(e.to_string().contains("activation bound"), "{e}");
        let mut bad = a.encode();
        bad[6] = 2;
        let e = DecoderAdmission::decode(&bad).unwrap_err();
        assert!(e.to_string().contains("tables kind"), "{e}");
        assert!(GenerationRequest::decode(&[99]).is_err());
    }

    #[test]
    fn hello_round_trips_and_names_strangers_and_versions() {
        round_trip(Hello { max_tokens: 0 });
        round_trip(Hello {
            max_tokens: u32::MAX,
        });
        // The bytes of protocol version 10, pinned.
        assert_eq!(
            Hello { max_tokens: 7 }.encode(),
            [b'V', b'E', b'I', b'L', 10, 0, 0, 0, 7, 0, 0, 0]
        );
        let e = Hello::decode(b"GET / HTTP/1.1").unwrap_err().to_string();
        assert!(e.contains("not a Veil client"), "{e}");
        let mut old = Hello { max_tokens: 1 }.encode();
        old[4] = 3;
        old.truncate(8);
        let e = Hello::decode(&old).unwrap_err();
        assert!(matches!(e, veil_core::Error::Unsupported(_)), "{e}");
    }

    #[test]
    fn admission_round_trips_and_refuses_bad_status_and_text() {
        let config = Preset::BertTiny.config().announced();
        let digest = BundleDigest([0xab; 32]);
        for (bundle, activation_bits, cuts) in [
            (None, None, Cuts::Kept),
            (Some(digest), Some(20), Cuts::PerLength),
        ] {
            let a = Admission::Admitted(Announced {
                config: config.clone(),
                bundle,
                activation_bits,
                cuts,
            });
            assert_eq!(Admission::decode(&a.encode()).unwrap(), a);
            strict(&a);
        }
        // The digest's bytes follow the status and the flag, then the bound and the cuts,
        // pinned.
        let with = Admission::Admitted(Announced {
            config: config.clone(),
            bundle: Some(digest),
            activation_bits: Some(20),
            cuts: Cuts::PerLength,
        })
        .encode();
        assert_eq!(
            &with[..36],
            [[0u8, 1].as_slice(), &[0xab; 32], &[20, 1]].concat()
        );
        assert_eq!(&with[36..], config.to_json().as_bytes());
        let mut cuts = with.clone();
        cuts[35] = 2;
        let e = Admission::decode(&cuts).unwrap_err().to_string();
        assert!(e.contains("cuts 2"), "{e}");
        let mut flag = with.clone();
        flag[1] = 2;
        let e = Admission::decode(&flag).unwrap_err().to_string();
        assert!(e.contains("bundle flag 2"), "{e}");
        // A bound the session's 41-bit ring has no room for is refused.
        let mut wide = with.clone();
        wide[34] = 40;
        let e = Admission::decode(&wide).unwrap_err().to_string();
        assert!(e.contains("activation bound of 2^40"), "{e}");
        let admitted = Admission::Admitted(Announced {
            config,
            bundle: None,
            activation_bits: None,
            cuts: Cuts::Kept,
        });
        round_trip_text(Admission::Refused("busy".into()));
        round_trip_text(Admission::Refused(String::new()));
        let mut bad = admitted.encode();
        // Status 2 is a decoder server's (named in the generation messages' test).
        bad[0] = 3;
        assert!(Admission::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("unknown status 3"));
        assert!(Admission::decode(&[STATUS_REFUSED, 0xff]).is_err());
        assert!(Admission::decode(&[]).is_err());
        // A configuration cut short is not a configuration.
        let text = admitted.encode();
        assert!(Admission::decode(&text[..text.len() - 1]).is_err());
    }

    #[test]
    fn lookup_round_trips_and_refuses_unknown_methods() {
        round_trip(EmbeddingLookup(LookupMethod::OneHot));
        round_trip(EmbeddingLookup(LookupMethod::Batched));
        assert!(EmbeddingLookup::decode(&[0]).is_err());
        assert!(EmbeddingLookup::decode(&[3]).is_err());
    }

    #[test]
    fn requests_round_trip_and_refuse_bad_tags_and_flags() {
        round_trip(Request::Goodbye);
        for preprocessed in [false, true] {
            round_trip(Request::Infer {
                tokens: 128,
                preprocessed,
            });
        }
        round_trip(Request::Preprocess { tokens: 1 });
        // The bytes of protocol version 7, pinned.
        assert_eq!(
            Request::Infer {
                tokens: 5,
                preprocessed: true
            }
            .encode(),
            [1, 5, 0, 0, 0, 1]
        );
        assert_eq!(Request::Preprocess { tokens: 5 }.encode(), [2, 5, 0, 0, 0]);
        assert_eq!(Request::Goodbye.encode(), [0]);
        let e = Request::decode(&[1, 5, 0, 0, 0, 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("request flag 2"), "{e}");
        for t in 3..=u8::MAX {
            let e = Request::decode(&[t]).unwrap_err();
            match GENERATION_TAGS.contains(&t) {
                true => assert!(matches!(e, veil_core::Error::Unsupported(_)), "{e}"),
                false => assert!(e.to_string().contains("unknown request tag"), "{e}"),
            }
        }
    }

    #[test]
    fn preprocess_replies_round_trip_and_bound_the_pool() {
        let (most, ready) = (
            OtSession::MAX_PRECOMPUTE as u64,
            OtSession::MAX_READY as u64,
        );
        round_trip(PreprocessReply::Accepted(PoolFill::built(0)));
        round_trip(PreprocessReply::Accepted(PoolFill::built(most as usize)));
        round_trip(PreprocessReply::Accepted(PoolFill {
            ready: (ready, 5),
            built: 5,
        }));
        round_trip_text(PreprocessReply::Refused("over budget".into()));
        // The bytes of protocol version 9, pinned.
        assert_eq!(
            PreprocessReply::Accepted(PoolFill {
                ready: (3, 2),
                built: 1
            })
            .encode(),
            [0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
        for (ready, built) in [
            ((most + 1, most + 1), most + 1),
            ((ready + 1, 1), 1),
            ((4, 2), 5),
        ] {
            let over = PreprocessReply::Accepted(PoolFill { ready, built });
            assert!(
                PreprocessReply::decode(&over.encode()).is_err(),
                "{ready:?} {built}"
            );
        }
        assert!(PreprocessReply::decode(&[0, 1, 0]).is_err());
        assert!(PreprocessReply::decode(&[7]).is_err());
    }

    #[test]
    fn output_shares_round_trip_and_stay_in_the_ring() {
        let ring = session_format().ring;
        let share = OutputShare(vec![0, 1, ring.mask()]);
        let bytes = share.encode(ring);
        assert_eq!(OutputShare::decode(&bytes, ring, 3).unwrap(), share);
        for cut in 0..bytes.len() {
            assert!(OutputShare::decode(&bytes[..cut], ring, 3).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(OutputShare::decode(&long, ring, 3).is_err());
        if !ring.bits().is_multiple_of(8) {
            let outside = vec![0xff; ring.byte_len()];
            assert!(OutputShare::decode(&outside, ring, 1).is_err());
        }
    }
}
