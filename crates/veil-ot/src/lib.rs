//! Oblivious transfer for Veil: base OT, IKNP and Ferret-style silent correlated OT, and the
//! derived flavours the non-linear protocols consume through [`OtSession`].
//!
//! Layers, bottom up:
//! * `aes_prims` — fixed-key AES hashes (TCCR, CCR), AES-CTR column PRG;
//! * [`base_ot`] — Chou–Orlandi OT on Ristretto, for the 128 IKNP seeds;
//! * [`iknp`] + `transpose` — IKNP extension producing Δ-correlated OT (128 bits/COT);
//! * [`ferret`] — silent COT: Half-Tree single-point COTs, regular-noise LPN, bootstrap loop
//!   (≈ 0.39 bits/COT);
//! * `session` — COT pools per direction, refilled on demand, and the flavours the
//!   non-linear protocols draw from them: `one_of_n` (1-of-2^k with XOR-shared output, the
//!   millionaire's leaves) and `arith` (additive COT in Z_{2^k}, one width or a cycling
//!   pattern of widths, and binary COT with an XOR correlation).
//!
//! The benchmark over TCP loopback is `veil_bench::ot` (`veil bench ot`).
//!
//! Security model everywhere: semi-honest parties, 128-bit computational security; every
//! protocol module states its own assumptions. Side channels: values derived from a party's
//! secrets (Δ, choice bits, punctured indices) go through masks or `subtle` selection, never
//! branches or secret-dependent addresses (helpers in `ct`); secret buffers are zeroized,
//! also on early returns.

#![warn(unreachable_pub, missing_docs)]

mod aes_prims;
#[cfg(target_arch = "x86_64")]
mod aes_wide;
mod arith;
pub mod base_ot;
mod ct;
mod derand;
pub mod ferret;
pub mod iknp;
mod one_of_n;
mod session;
mod transpose;

pub use one_of_n::OneOfN;
pub use session::{Backend, OtSession};
