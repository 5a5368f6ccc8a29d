//! In-memory duplex channel: two ends joined by std mpsc queues, for tests and, shaped
//! ([`crate::shaped_pair`]), for runs on a simulated network.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

use veil_core::{Error, Result};

use crate::shaped::{LinkEnd, NetworkModel};
use crate::{Channel, Meter};

/// A flushed chunk and when it arrives (zero on an unshaped pair).
type Chunk = (Vec<u8>, Duration);

/// One end of an in-memory duplex.
pub struct MemChannel {
    tx: Sender<Chunk>,
    rx: Receiver<Chunk>,
    pending: Vec<u8>,
    inbox: Vec<u8>,
    inbox_pos: usize,
    meter: Meter,
    link: Option<LinkEnd>,
}

/// A connected pair of in-memory channels.
pub fn mem_pair() -> (MemChannel, MemChannel) {
    joined(None, None)
}

/// A connected pair whose ends are shaped by `a` and `b` (both or neither).
pub(crate) fn joined(a: Option<LinkEnd>, b: Option<LinkEnd>) -> (MemChannel, MemChannel) {
    let (tx_a, rx_b) = channel();
    let (tx_b, rx_a) = channel();
    let end = |tx, rx, link| MemChannel {
        tx,
        rx,
        pending: Vec::new(),
        inbox: Vec::new(),
        inbox_pos: 0,
        meter: Meter::new(),
        link,
    };
    (end(tx_a, rx_a, a), end(tx_b, rx_b, b))
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
                let (chunk, arrival) = self.rx.recv().map_err(|_| Error::Disconnected)?;
                if let Some(link) = &self.link {
                    link.wait_for(arrival);
                }
                self.inbox = chunk;
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
            let arrival = self
                .link
                .as_mut()
                .map_or(Duration::ZERO, |l| l.depart(chunk.len()));
            self.tx
                .send((chunk, arrival))
                .map_err(|_| Error::Disconnected)?;
        }
        Ok(())
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }

    fn network(&self) -> Option<NetworkModel> {
        self.link.as_ref().map(LinkEnd::network)
    }
}

impl Drop for MemChannel {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
