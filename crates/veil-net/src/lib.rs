//! Transports for two-party protocols.
//!
//! Every protocol in Veil is written against [`Channel`]: buffered sends, exact receives, and an
//! explicit flush (a receive flushes pending output first, so a protocol cannot deadlock by
//! forgetting one). Two transports implement it: [`TcpChannel`] (TCP_NODELAY, buffered) and
//! [`MemChannel`] (an in-memory duplex for tests). Both carry a [`Meter`] that attributes bytes,
//! rounds and wall time to the label of the operator running ("MatMul", "GELU", …).
//! [`shaped_pair`] is an in-memory pair delayed as over a network of a given bandwidth and
//! round-trip time ([`NetworkModel`], such as [`LAN`] and [`WAN`]), so two parties in one process
//! measure their time on that network (see [`shaped`]).

#![forbid(unsafe_code)]

pub mod channel;
pub mod local;
pub mod mem;
pub mod meter;
pub mod shaped;
pub mod tcp;

pub use channel::{Channel, MAX_MESSAGE_BYTES};
pub use local::{run_two_party, run_two_party_on, run_two_party_tcp};
pub use mem::{mem_pair, MemChannel};
pub use meter::{LabelGuard, LabelStats, Meter, Role};
pub use shaped::{shaped_pair, Clock, NetworkModel, RealClock, SimClock, LAN, WAN};
pub use tcp::TcpChannel;
