//! Non-linear two-party protocols on additive shares in Z_{2^ℓ}, built on the OT engine
//! (`veil-ot`) and, for LayerNorm's row products, on BFV (`veil-he`). Client = party 0, server =
//! party 1; both parties call the same operation with their own share and get their share of
//! the result.
//!
//! The public surface is [`Ctx`], one party's handle on the computation (OT session, channel,
//! role, fixed-point format, optionally [`HeKeys`]); every protocol is one of its methods:
//! * primitives on share slices: products ([`Ctx::mul`], [`Ctx::square`], their narrow
//!   variants under a [`Narrow`] promise, products by a server-private row
//!   [`Ctx::mul_server`], products fused with their truncation [`Ctx::mul_narrow_trunc`]),
//!   truncation ([`Ctx::trunc`], mode [`TruncMode`]), sign extension ([`Ctx::extend`]), DReLU,
//!   ReLU, max, multiplexer and bit → arithmetic conversion;
//! * elementary functions on share slices: [`Ctx::exp_neg`], [`Ctx::recip_at`],
//!   [`Ctx::rsqrt_at`], [`Ctx::tanh`], [`Ctx::silu`] (the decoders' gated MLP);
//! * the transformer's layers on tensors, row-wise over the last dimension: [`Ctx::gelu`],
//!   [`Ctx::softmax`] (and [`Ctx::softmax_masked`], a mask per row: causal attention),
//!   [`Ctx::layer_norm`] (the server's γ, β in [`AffineParams`]), [`Ctx::rms_norm`] (decoders) and their
//!   friendly substitutes [`Ctx::relu_tensor`], [`Ctx::relu_normalise`], [`Ctx::centre_affine`].
//!
//! Operations on slices of raw shares are named after their function (`relu`, `mul`, `trunc`);
//! a suffix `_in` takes the shares' ring explicitly, and the one layer that shares its name with
//! a primitive, ReLU on a tensor, is [`Ctx::relu_tensor`].
//!
//! Inside, the modules bottom up (private; each protocol's method lives beside its algorithm):
//! * `two_way_cot` — COTs in both directions in a fixed order, under every gate and product;
//! * `boolean` — AND/select on XOR-shared bits, bit → arithmetic conversion, multiplexer;
//! * `millionaire` — \[a > b\] for privately held a, b (1-of-8 OT digits + AND tree);
//! * `compare` — DReLU (optionally on fewer bits when |x| is bounded);
//! * `trunc` — faithful and 1-bit-error truncation, sign extension from a narrow ring;
//! * `mul` — secret × secret, square, secret × server-private row (COT per bit), their narrow
//!   variants for an operand of promised small magnitude, and high parts for fused truncation;
//! * `he_rows` — per-row inner products and row × per-row-scalar products on BFV;
//! * `ctx` — [`Ctx`] itself and the primitives on share slices;
//! * `elementary` — exp (x ≤ 0), reciprocal, rsqrt, tanh, SiLU, LayerNorm's rsqrt;
//! * `layer_norm_he` — LayerNorm's sum of squares and d·r on `he_rows`, in the 1-bit-error mode
//!   when the context has HE keys;
//! * `layers` — GELU, Softmax (masked), LayerNorm, and the substitutes ReLU, ReLU-normalise,
//!   centre + affine.
//!
//! The plaintext semantics of every function are those of `veil_core::approx`.
//!
//! Security model everywhere: semi-honest client and server, 128-bit computational security
//! from the OT engine; shares are uniformly masked, so each party's view is simulatable from its
//! input and output.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod boolean;
mod compare;
mod ctx;
mod elementary;
mod he_rows;
mod layer_norm_he;
mod layers;
mod millionaire;
mod mul;
mod trunc;
mod two_way_cot;

/// The two-party test fixtures, shared with the integration tests and the other protocol crates.
#[cfg(test)]
use veil_test_harness::two_party as test_harness;

pub use ctx::{Ctx, HeKeys};
pub use layers::AffineParams;
pub use mul::Narrow;
pub use trunc::TruncMode;
pub use veil_net::Role;
pub use veil_ot::{Backend, OtSession};
