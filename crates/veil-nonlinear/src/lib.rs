//! Non-linear two-party protocols on additive shares in Z_{2^ℓ}, built on the OT engine
//! (`veil-ot`). Client = party 0, server = party 1; every function is called by both parties with
//! their own share and returns their share of the result.
//!
//! Layers, bottom up:
//! * [`boolean`] — AND/select on XOR-shared bits, bit → arithmetic conversion, multiplexer;
//! * [`bits`] — bit decomposition of a sum of private values, suffix ORs (prefix networks);
//! * [`millionaire`] — \[a > b\] for privately held a, b (1-of-16 OT digits + AND tree);
//! * [`compare`] — DReLU, ReLU (optionally on fewer bits when |x| is bounded);
//! * [`trunc`] — faithful and 1-bit-error truncation, sign extension from a narrow ring;
//! * [`mod@mul`] — secret × secret, square, secret × server-private row (COT per bit), and their
//!   narrow variants for an operand of promised small magnitude;
//! * [`rows`] — per-row inner products and row × per-row-scalar products on BFV (`veil-he`),
//!   used by LayerNorm when the context has HE keys ([`ctx::HeKeys`]);
//! * [`ctx`] — [`Ctx`], one party's handle (OT session, channel, role, format) with the
//!   primitives on share slices;
//! * [`functions`] — exp (x ≤ 0), reciprocal, rsqrt, tanh;
//! * [`composite`] — GELU, Softmax (masked), LayerNorm, and the friendly substitutes ReLU,
//!   ReLU-normalise, centre + affine.
//!
//! The plaintext semantics of every function are those of `veil_core::approx`.
//!
//! Security model everywhere: semi-honest client and server, 128-bit computational security
//! from the OT engine; shares are uniformly masked, so each party's view is simulatable from its
//! input and output.

#![forbid(unsafe_code)]

pub mod bits;
pub mod boolean;
pub mod compare;
pub mod composite;
pub mod ctx;
mod exchange;
pub mod functions;
pub mod millionaire;
pub mod mul;
mod norm_he;
pub mod rows;
pub mod trunc;

pub use compare::{drelu, relu};
pub use ctx::Ctx;
pub use mul::{mul, mul_server_row, mul_trunc, square};
pub use trunc::{truncate, TruncMode};
pub use veil_net::Role;
pub use veil_ot::OtSession;
