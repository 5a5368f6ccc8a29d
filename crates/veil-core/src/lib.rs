//! Veil core: the arithmetic every other crate shares.
//!
//! * [`Ring`] — the ring Z_{2^ℓ} (ℓ in 32..=64) that carries every secret share;
//! * [`FixedPoint`] — real numbers as ring elements with `f` fractional bits;
//! * [`RingTensor`] — row-major tensors of ring elements, with additive sharing;
//! * [`Prg`] — AES-128-CTR pseudo-random generator, seeded from the OS or from a shared seed;
//! * [`wire`] — canonical little-endian encoding with strict, bounded decoding;
//! * [`bitpack`] — values of any width 1..=64 packed bit-densely, with strict decoding;
//! * [`Error`] — the error type all Veil crates convert into;
//! * [`CostClass`] — what the meter charges a protocol step's traffic and time to.

#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod approx;
pub mod bitpack;
mod cost;
mod error;
mod fixed;
pub mod parallel;
mod prg;
pub mod process;
mod ring;
mod share;
mod tensor;
pub mod wire;

pub use cost::CostClass;
pub use error::{escape_control, Error, Result};
pub use fixed::{FixedPoint, FracBits};
pub use prg::{Block, Prg, Seed};
pub use ring::{Ring, RingBits};
pub use share::{reconstruct, share};
pub use tensor::RingTensor;

/// Project-wide defaults. Training, the simulator and the protocols all read these, so the
/// fixed-point format used in fine-tuning is the one inference runs at.
pub mod defaults {
    /// ℓ = 41 as in the paper: 2f = 26 bits of scale after a product leaves 15 bits of integer
    /// head-room (|x| < 2^14 before truncation), ample for bound-controlled hidden states (B ≤ 32),
    /// while keeping t = 2^41 small enough for cheap BFV parameters and short comparisons.
    pub const RING_BITS: u32 = 41;
    /// f = 13 fractional bits as in the paper: resolution 1.2e-4.
    pub const FRAC_BITS: u32 = 13;
    /// ε added to the denominator of the ReLU-normalise softmax substitute.
    pub const RELU_NORMALISE_EPS: f64 = 1e-3;
    /// How far below every real attention score the client pushes the scores of padding keys
    /// (padding that hides a prompt's length from the server, which cannot tell the padding
    /// apart): far enough that Softmax's exp clamps them to exactly 0 and ReLU-normalise's
    /// ReLU zeroes them (real scores stay far inside ±4096), small enough to stay clear of the
    /// ring's range (2^25 at f = 13 in a 41-bit ring) and of ReLU's comparison bound.
    pub const PADDING_KEY_OFFSET: f64 = 4096.0;
}
