//! [`Replay`]: a channel that plays recorded bytes back as the peer's and drops what this side
//! sends, so one party can be run against a (mutated) transcript: the mutation tests and the
//! fuzz targets feed every message decoder of a session through it.

use veil_core::{Error, Result};

use crate::{Channel, Meter};

/// Plays back `input` as everything the peer sends; a read past its end is a hang-up.
pub struct Replay {
    input: Vec<u8>,
    pos: usize,
    meter: Meter,
}

impl Replay {
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
