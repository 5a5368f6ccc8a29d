//! Benchmarks of the protocol crates, both parties in threads of one process over TCP loopback,
//! each result a JSON record. They live apart from the protocols so that the protocol crates do
//! not depend on a JSON library.
//!
//! * [`ot`] — base OT, IKNP, silent COT and the derived OT flavours (`veil bench ot`);
//! * [`linear`] — HE linear layers of BERT-Tiny and BERT-Base shapes (`veil bench linear`);
//! * [`nonlinear`] — the non-linear layers of one BERT-Base encoder layer (`veil bench nonlinear`).
//!
//! The examples (`cargo run --release -p veil-bench --example ot|linear|nonlinear`) also run a
//! chosen part: single protocols, shapes or operators.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod linear;
pub mod nonlinear;
pub mod ot;
