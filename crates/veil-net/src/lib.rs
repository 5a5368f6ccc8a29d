//! Transports for two-party protocols.
//!
//! Every protocol in Veil is written against [`Channel`]: buffered sends, exact receives, an
//! explicit flush (a receive flushes pending output first, so a protocol cannot deadlock by
//! forgetting one), and a close that tells the peer why ([`Channel::close_with`]; on sockets it
//! travels in [`records`] once both ends have switched to them). Three transports implement it:
//! [`TlsChannel`] (TLS 1.3 with pinned self-signed identities, what `veil serve` /
//! `veil classify` use), [`TcpChannel`] (plain TCP_NODELAY, buffered: in-process loopback and
//! `--insecure-plaintext`) and [`MemChannel`] (an in-memory duplex for tests). Socket transports
//! take a total deadline per step ([`Channel::set_deadline`], [`timed`]). Both carry a [`Meter`]
//! that attributes bytes, rounds and wall time to the label of the operator running ("MatMul",
//! "GELU", …). [`shaped_pair`] is an in-memory pair delayed as over a network of a given
//! bandwidth and round-trip time ([`NetworkModel`], such as [`LAN`] and [`WAN`]), so two parties
//! in one process measure their time on that network (see [`shaped`]).

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod channel;
mod local;
mod mem;
mod meter;
pub mod records;
mod replay;
mod shaped;
mod tcp;
mod timed;
pub mod tls;

pub use channel::{Channel, MAX_MESSAGE_BYTES};
pub use local::{run_two_party, run_two_party_on, run_two_party_tcp, run_two_party_tls};
pub use mem::{mem_pair, MemChannel};
pub use meter::{LabelGuard, LabelStats, Meter, Role};
pub use records::MAX_REASON_BYTES;
pub use replay::{Recording, Replay};
pub use shaped::{shaped_pair, Clock, NetworkModel, RealClock, SimClock, LAN, WAN};
pub use tcp::{connect_timeout, TcpChannel};
pub use timed::LINGER;
pub use tls::{ClientTls, Fingerprint, Identity, KnownServers, ServerPin, ServerTls, TlsChannel};
