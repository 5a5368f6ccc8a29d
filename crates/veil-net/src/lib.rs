//! Transports for two-party protocols.
//!
//! Every protocol in Veil is written against [`Channel`]: buffered sends, exact receives, and an
//! explicit flush (a receive flushes pending output first, so a protocol cannot deadlock by
//! forgetting one). Two transports implement it: [`TcpChannel`] (TCP_NODELAY, buffered) and
//! [`MemChannel`] (an in-memory duplex for tests). Both carry a [`Meter`] that attributes bytes,
//! rounds and wall time to the label of the operator running ("MatMul", "GELU", …).

#![forbid(unsafe_code)]

pub mod channel;
pub mod local;
pub mod mem;
pub mod meter;
pub mod tcp;

pub use channel::{Channel, MAX_MESSAGE_BYTES};
pub use local::{run_two_party, run_two_party_tcp};
pub use mem::{mem_pair, MemChannel};
pub use meter::{LabelGuard, LabelStats, Meter, Role};
pub use tcp::TcpChannel;
