//! Private transformer inference: the whole forward pass of a BERT-class model on secret
//! shares, between a client holding the prompt and a server holding the weights.
//!
//! * [`prepared`] — the server's model with its linear layers prepared for HE once, for every
//!   sequence length;
//! * [`embedding`] — private-embedding mode: HE lookup of the server's tables by the client's
//!   token ids, position rows added by the server, embedding LayerNorm on shares;
//! * [`forward`] — every encoder block and the head on shares, one code path for both parties,
//!   computing exactly the integers of `veil_model::sim` (the fixed-point simulator);
//! * [`preprocess`] — the linear layers' work for a future inference of a given length, done
//!   before the prompt (FC masks, Beaver triples), which the forward pass then consumes;
//! * [`pool_size`] — the silent-OT COTs an inference of a given length draws, from the public
//!   shape alone (preprocessing fills the pools with them); [`pool_size::CotCounts`] keeps them
//!   per length for a server;
//! * [`protocol`] — the session's wire contract: one type per message, one encoder and one
//!   decoder each, used by both ends;
//! * [`connection`] — the client's end of a session; [`handler`] — the server's, a handler
//!   over the client's typed requests; [`deadlines`] — each step's allowance;
//! * [`reserve`] — what a server session may hold for preprocessed inferences;
//! * [`admission`] — what a connection may hold before it has shown it is a Veil client;
//!   [`limits`] — what the machine can hold (open files, memory), capping a server's limits;
//! * [`server`] — the multi-client server: TLS or explicit plain TCP, bounded sessions and
//!   queue, memory estimate per session, accept back-off, structured logs, graceful shutdown,
//!   in the caller's thread ([`Server::run`]) or in the background ([`Server::spawn`]);
//! * [`builder`] — [`ServerBuilder`], the one assembly of a server (identity, limits, process
//!   settings) that the CLI, Python and [`loopback`] use;
//! * [`loopback`] — both parties in one process;
//! * [`report`] — cost reports per operator class with LAN/WAN times, measured over a shaped
//!   link ([`shaped_channel`], `bench::run_model` with a network) or modelled;
//! * [`client`] — the client as a library: its bundle, prompts checked and embedded before
//!   anything is sent, a [`Client`] session classifying batches of texts or token ids, and its
//!   transport to a server (TLS with a pinned fingerprint).
//!
//! Security model: semi-honest client and server; 128-bit computational security (BFV, OT) and
//! 40-bit statistical security (noise flooding), from the protocols of veil-linear and
//! veil-nonlinear, composed sequentially on uniformly masked shares. The server learns the
//! sequence length; the client learns the output. Error: none beyond the fixed-point
//! simulator's — the private output equals the simulator's integers.

#![forbid(unsafe_code)]

pub mod admission;
pub mod bench;
pub mod builder;
pub mod client;
pub mod connection;
pub mod deadlines;
pub mod embedding;
pub mod forward;
pub mod handler;
pub mod key_budget;
pub mod limits;
pub mod loopback;
pub mod pool_size;
pub mod prepared;
pub mod preprocess;
pub mod protocol;
pub mod report;
pub mod reserve;
pub mod server;

pub use builder::{ServerBuilder, ServerIdentity};
pub use client::{
    Ahead, Classification, Client, ClientModel, ClientTransport, Input, PromptOptions,
};
pub use connection::{ClientConnection, ClientOptions, Tokens};
pub use deadlines::{Deadlines, IDLE_TIMEOUT};
pub use handler::{serve_session, serve_session_with};
pub use loopback::{shaped_channel, InProcess, LoopbackServer};
pub use prepared::ServerModel;
pub use report::CostReport;
pub use server::{serve, serve_with, RunningServer, ServeOptions, Server, Transport};
