//! In-memory duplex channel for tests: two ends joined by std mpsc queues.

use std::sync::mpsc::{channel, Receiver, Sender};

use veil_core::{Error, Result};

use crate::{Channel, Meter};

/// One end of an in-memory duplex.
pub struct MemChannel {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    pending: Vec<u8>,
    inbox: Vec<u8>,
    inbox_pos: usize,
    meter: Meter,
}

/// A connected pair of in-memory channels.
pub fn mem_pair() -> (MemChannel, MemChannel) {
    let (tx_a, rx_b) = channel();
    let (tx_b, rx_a) = channel();
    let end = |tx, rx| MemChannel {
        tx,
        rx,
        pending: Vec::new(),
        inbox: Vec::new(),
        inbox_pos: 0,
        meter: Meter::new(),
    };
    (end(tx_a, rx_a), end(tx_b, rx_b))
}

/// Buffered output is pushed once it reaches this size, bounding memory held per end.
const FLUSH_AT: usize = 1 << 20;

impl Channel for MemChannel {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.meter.on_send(data.len());
        self.pending.extend_from_slice(data);
        if self.pending.len() >= FLUSH_AT {
            self.flush()?;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.flush()?;
        let mut off = 0;
        while off < buf.len() {
            if self.inbox_pos == self.inbox.len() {
                self.inbox = self.rx.recv().map_err(|_| Error::Disconnected)?;
                self.inbox_pos = 0;
                continue;
            }
            let n = (self.inbox.len() - self.inbox_pos).min(buf.len() - off);
            buf[off..off + n].copy_from_slice(&self.inbox[self.inbox_pos..self.inbox_pos + n]);
            self.inbox_pos += n;
            off += n;
        }
        self.meter.on_recv(buf.len());
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            let chunk = std::mem::take(&mut self.pending);
            self.tx.send(chunk).map_err(|_| Error::Disconnected)?;
        }
        Ok(())
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }
}

impl Drop for MemChannel {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
