//! Transcripts: [`Recording`] keeps what passes through a channel both ways, and [`Replay`] plays
//! recorded bytes back as the peer's and drops what this side sends, so one party can be run
//! against a (mutated) transcript: the transcript scans, the mutation tests and the fuzz targets
//! use them.

use veil_core::{Error, Result};

use crate::{Channel, Meter};

/// Records what passes through `inner`, both ways.
pub struct Recording<C> {
    /// The channel recorded.
    pub inner: C,
    /// Every byte this side sent, in order.
    pub sent: Vec<u8>,
    /// Every byte this side received, in order.
    pub received: Vec<u8>,
}

impl<C> Recording<C> {
    /// Records everything that passes through `inner`.
    pub fn new(inner: C) -> Self {
        Recording {
            inner,
            sent: Vec::new(),
            received: Vec::new(),
        }
    }
}

impl<C: Channel> Channel for Recording<C> {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.sent.extend_from_slice(data);
        self.inner.send(data)
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.inner.recv(buf)?;
        self.received.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.inner.flush()
    }

    fn start_records(&mut self) -> Result<()> {
        self.inner.start_records()
    }

    fn close_with(&mut self, reason: &str) -> Result<()> {
        self.inner.close_with(reason)
    }

    fn meter(&self) -> &Meter {
        self.inner.meter()
    }
}

/// Plays back `input` as everything the peer sends; a read past its end is a hang-up.
pub struct Replay {
    input: Vec<u8>,
    pos: usize,
    meter: Meter,
}

impl Replay {
    /// A peer that sends `input` (a recorded transcript) and swallows what it is sent.
    pub fn new(input: Vec<u8>) -> Self {
        Replay {
            input,
            pos: 0,
            meter: Meter::new(),
        }
    }
}

impl Channel for Replay {
    fn send(&mut self, _data: &[u8]) -> Result<()> {
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        let end = self.pos.saturating_add(buf.len());
        if end > self.input.len() {
            return Err(Error::Disconnected);
        }
        buf.copy_from_slice(&self.input[self.pos..end]);
        self.pos = end;
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }
}
