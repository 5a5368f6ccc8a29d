//! BFV homomorphic encryption (RNS, coefficient encoding, t = 2^ℓ) for Veil's linear layers.
//!
//! (Module docs: see `docs` section below; filled in as the crate grows.)

pub(crate) mod math;
pub mod params;
pub(crate) mod poly;

pub use params::{NoiseBudget, ParamSet, Params, STAT_SECURITY_BITS};
pub mod cipher;
pub mod keys;
pub mod response;

pub use cipher::{Accumulator, EvalCiphertext, NttPlaintext, SeededCiphertext};
pub use keys::{PublicKey, SecretKey};
pub use response::Response;

#[cfg(test)]
mod tests;
pub mod wire;
