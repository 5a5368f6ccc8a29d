//! Private transformer inference: the whole forward pass of a BERT-class model on secret
//! shares, between a client holding the prompt and a server holding the weights.
//!
//! * `prepared` — the server's model ([`ServerModel`]) with its linear layers prepared for HE
//!   once, for every sequence length;
//! * `embedding` — private-embedding mode: HE lookup of the server's tables by the client's
//!   token ids, position rows added by the server, embedding LayerNorm on shares;
//! * `forward` — every encoder block and the head on shares ([`Party`]), one code path for
//!   both parties, computing exactly the integers of `veil_model::FixedModel` (the fixed-point
//!   simulator);
//! * `decoder` — a decoder LLM's steps on shares ([`DecoderParty`]: prefill, then one token per
//!   step against a KV cache held as shares), the twin of `veil_model::DecoderSim`, with the
//!   server's prepared decoder ([`ServerDecoder`]);
//! * `preprocess` — the linear layers' work for a future inference of a given length, done
//!   before the prompt (FC masks, Beaver triples), which the forward pass then consumes;
//! * `pool_size` — the silent-OT COTs an inference of a given length draws, from the public
//!   shape alone (preprocessing fills the pools with them); [`CotCounts`] keeps them per
//!   length for a server;
//! * [`protocol`] — the session's wire contract: one type per message, one encoder and one
//!   decoder each, used by both ends;
//! * `connection` — the client's end of a session ([`ClientConnection`]); `handler` — the
//!   server's, a handler over the client's typed requests ([`serve_session`]); `deadlines` —
//!   each step's allowance;
//! * `reserve` — what a server session may hold for preprocessed inferences;
//! * `admission` — what a connection may hold before it has shown it is a Veil client;
//!   `limits` — what the machine can hold (open files, memory), capping a server's limits;
//! * `server` — the multi-client [`Server`]: TLS or explicit plain TCP, bounded sessions and
//!   queue, memory estimate per session, accept back-off, structured logs, graceful shutdown,
//!   in the caller's thread ([`Server::run`]) or in the background ([`Server::spawn`]);
//! * `builder` — [`ServerBuilder`], the one assembly of a server (identity, limits, process
//!   settings) that the CLI, Python and [`Loopback`] use;
//! * `loopback` — both parties in one process ([`Loopback`] over a [`Link`]: TCP, TLS or a
//!   shaped in-memory link), which the demo, `veil eval`, `veil embed` and [`bench`] use;
//! * `report` — cost reports per operator class ([`CostReport`]) with LAN/WAN times,
//!   measured over a shaped link ([`Link::Shaped`]) or modelled;
//! * `client` — the client as a library: its bundle ([`ClientModel`]), prompts checked and
//!   embedded before anything is sent, a [`Client`] session classifying batches of
//!   [`Input`]s (texts, sentence pairs or token ids), and its transport to a server
//!   ([`ClientTransport`]: TLS with a pinned fingerprint);
//! * [`eval`] — metrics of an evaluation (accuracy, F1, logit gaps) and the resumable journal
//!   of its private results;
//! * [`bench`] — the whole-model cost benchmark on seeded random models of paper shapes.
//!
//! Security model: semi-honest client and server; 128-bit computational security (BFV, OT) and
//! 40-bit statistical security (noise flooding), from the protocols of veil-linear and
//! veil-nonlinear, composed sequentially on uniformly masked shares. The server learns the
//! sequence length; the client learns the output. Error: none beyond the fixed-point
//! simulator's — the private output equals the simulator's integers.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod admission;
pub mod bench;
mod builder;
mod client;
mod connection;
mod deadlines;
mod decoder;
mod embedding;
pub mod eval;
mod forward;
mod generate_bench;
mod handler;
mod key_budget;
mod limits;
mod loopback;
mod pool_size;
mod prepared;
mod preprocess;
pub mod protocol;
mod report;
mod reserve;
mod server;

pub use builder::{ServerBuilder, ServerIdentity};
pub use client::{
    argmax, softmax, Ahead, Classification, Client, ClientModel, ClientTransport, Input,
    PromptOptions,
};
pub use connection::{ClientConnection, ClientOptions, Tokens};
pub use deadlines::{Deadlines, IDLE_TIMEOUT};
pub use decoder::{
    default_generation_context, plan_step, serve_generation, step_bytes, step_material_bytes,
    ClientTables, DecoderParty, DecoderSide, Generation, GenerationClient, GenerationOptions,
    OwnedGeneration, PrivateGeneration, ServerDecoder, SessionMemoryPool, StepMaterial,
    DEFAULT_DECODER_TRUNCATION,
};
pub use embedding::{
    cache_bytes, preparation_bytes, PreparationInUse, ServerEmbedding, PREPARED_LENGTHS_KEPT,
};
pub use forward::{Party, Pre, Side};
pub use generate_bench::{bench_generate, GenerateBench};
pub use handler::{serve_session, serve_session_with};
pub use loopback::{Connector, InProcess, Link, Loopback};
pub use pool_size::{CotCounts, Draw};
pub use prepared::{Cuts, PreparedLayers, ServerModel, DEFAULT_NTT_BUDGET_BYTES};
pub use preprocess::{material_bytes, plan, ClientMaterial, Material, ServerMaterial, Step};
pub use report::{CostReport, PhaseCost};
pub use reserve::preprocess_budget;
pub use server::{
    decoder_memory_estimate, serve, session_memory_estimate, RunningServer, ServeOptions, Server,
    Transport,
};
