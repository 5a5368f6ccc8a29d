//! The [`Channel`] trait and length-prefixed messages on top of it.

use std::time::Instant;

use veil_core::{ensure, Result};

use crate::{Meter, NetworkModel};

/// Hard upper bound on one framed message (1 GiB); callers pass tighter per-message limits.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// A reliable, ordered, metered byte stream to the other party.
pub trait Channel: Send {
    /// Queues bytes for sending (they may stay buffered until [`Channel::flush`] or a receive).
    fn send(&mut self, data: &[u8]) -> Result<()>;
    /// Fills `buf` exactly, flushing pending output first. A closed peer is `Error::Disconnected`.
    fn recv(&mut self, buf: &mut [u8]) -> Result<()>;
    /// Pushes buffered output to the peer.
    fn flush(&mut self) -> Result<()>;
    /// The meter recording this channel's traffic.
    fn meter(&self) -> &Meter;
    /// The simulated network this channel's traffic is delayed by ([`crate::shaped_pair`]), if
    /// any: its metered time then includes that network, so reports show it as measured.
    fn network(&self) -> Option<NetworkModel> {
        None
    }
    /// Every following send and receive must complete before `deadline` (`None`: no deadline);
    /// past it they fail with `Error::TimedOut`. The whole step counts, not each read: a peer
    /// dripping bytes cannot stretch it. In-memory transports have no socket and ignore it.
    fn set_deadline(&mut self, _deadline: Option<Instant>) -> Result<()> {
        Ok(())
    }
    /// From here on, carry this end's bytes in records and read the peer's as records
    /// ([`crate::records`]), so that [`Channel::close_with`] can end the session at any point.
    /// Both ends switch at the same point of their protocol (a session: right after the
    /// admission). In-memory transports keep a close apart from data anyway and ignore it.
    fn start_records(&mut self) -> Result<()> {
        Ok(())
    }
    /// Ends this end's side of the session telling the peer why: whatever the peer is waiting
    /// for, its next receive fails with `Error::PeerClosed(reason)` (cut to
    /// [`crate::MAX_REASON_BYTES`]). Socket transports send it within [`crate::LINGER`] of their
    /// own (the step's deadline may be what passed), then stop sending and read what the peer
    /// still sends, for at most [`crate::LINGER`], so the reason is not lost to a reset. Before
    /// records ([`Channel::start_records`]) a socket cannot tell a reason from data: nothing is
    /// sent. Best effort: the session is over either way.
    fn close_with(&mut self, _reason: &str) -> Result<()> {
        self.flush()
    }

    /// Sends a message with a 4-byte little-endian length prefix.
    fn send_msg(&mut self, data: &[u8]) -> Result<()> {
        ensure!(
            data.len() <= MAX_MESSAGE_BYTES,
            InvalidArgument,
            "message of {} bytes exceeds the frame limit",
            data.len()
        );
        self.send(&(data.len() as u32).to_le_bytes())?;
        self.send(data)
    }

    /// Receives a length-prefixed message of at most `max` bytes. The length is checked before
    /// anything is allocated, so a hostile prefix cannot exhaust memory.
    fn recv_msg(&mut self, max: usize) -> Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.recv(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > max.min(MAX_MESSAGE_BYTES) {
            return Err(veil_core::Error::TooLarge {
                what: "message",
                len,
                max,
            });
        }
        let mut buf = vec![0u8; len];
        self.recv(&mut buf)?;
        Ok(buf)
    }

    /// Receives a message that must be exactly `len` bytes long.
    fn recv_msg_exact(&mut self, len: usize) -> Result<Vec<u8>> {
        let m = self.recv_msg(len)?;
        ensure!(
            m.len() == len,
            Malformed,
            "expected a {len}-byte message, got {}",
            m.len()
        );
        Ok(m)
    }
}

/// A channel behind a reference or a box is that channel.
macro_rules! forward_channel {
    ($($wrapper:ty),*) => {$(
        impl<C: Channel + ?Sized> Channel for $wrapper {
            fn send(&mut self, data: &[u8]) -> Result<()> {
                (**self).send(data)
            }
            fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
                (**self).recv(buf)
            }
            fn flush(&mut self) -> Result<()> {
                (**self).flush()
            }
            fn meter(&self) -> &Meter {
                (**self).meter()
            }
            fn network(&self) -> Option<NetworkModel> {
                (**self).network()
            }
            fn set_deadline(&mut self, deadline: Option<Instant>) -> Result<()> {
                (**self).set_deadline(deadline)
            }
            fn start_records(&mut self) -> Result<()> {
                (**self).start_records()
            }
            fn close_with(&mut self, reason: &str) -> Result<()> {
                (**self).close_with(reason)
            }
        }
    )*};
}

forward_channel!(&mut C, Box<C>);
