//! Linear protocols on additive shares mod 2^ℓ, built on BFV ([`veil_he`]): Π_MatMul, fully
//! connected layers, and shared × shared products (attention).
//!
//! * [`session`]: the client generates one key per [`veil_he::ParamSet`] and sends the public
//!   keys once ([`ClientSession::setup`] / [`ServerSession::setup`]).
//! * [`layout`]: Cheetah coefficient packing and the traffic-minimising choice of blocks.
//! * [`matmul`]: the batched protocol core (one round trip for any number of products) and
//!   [`PreparedMatrix`], the server's packed and noise-checked plaintext operand.
//! * [`fc`]: Y = X·Wᵀ + b on shares for a whole sequence ([`PreparedFc`] is prepared once per
//!   model); output at scale 2^{2f}, truncation is the caller's next step.
//! * [`cross`]: per-head products of two shared matrices (Q·Kᵀ, A·V) via cross terms.
//! * [`mod@bench`]: the benchmark of the issue (`cargo run --release -p veil-linear --example bench`).
//!
//! Every protocol is metered on whatever label the caller has entered on the channel.

pub mod layout;
pub mod matmul;
pub mod session;

pub use layout::{Blocking, Layout};
pub use matmul::{PreparedMatrix, ServerJob};
pub use session::{ClientSession, ServerSession};
pub mod cross;
pub mod fc;

pub use cross::{shared_matmul_client, shared_matmul_server};
pub use fc::{fc_client, fc_server, FcLayer, PreparedFc};
pub mod bench;
