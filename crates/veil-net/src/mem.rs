//! In-memory duplex channel: two ends joined by std mpsc queues, for tests and, shaped
//! ([`crate::shaped_pair`]), for runs on a simulated network. A close with a reason travels as
//! its own item, apart from data, so records are not needed here.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

use veil_core::{Error, Result};

use crate::records;
use crate::shaped::{LinkEnd, NetworkModel};
use crate::{Channel, Meter};

/// What one end sends the other.
enum Chunk {
    /// A flushed chunk and when it arrives (zero on an unshaped pair).
    Data(Vec<u8>, Duration),
    /// The sender closed, saying why ([`Channel::close_with`]).
    Close(String),
}

/// One end of an in-memory duplex.
pub struct MemChannel {
    tx: Sender<Chunk>,
    rx: Receiver<Chunk>,
    pending: Vec<u8>,
    inbox: Vec<u8>,
    inbox_pos: usize,
    /// The peer's reason, once it closed.
    closed: Option<String>,
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
        closed: None,
        meter: Meter::new(),
        link,
    };
    (end(tx_a, rx_a, a), end(tx_b, rx_b, b))
}

impl MemChannel {
    /// After the peer hung up: the reason it closed with, if it left one behind its data
    /// (kept for the receives that follow).
    fn last_word(&mut self) -> Error {
        while self.closed.is_none() {
            match self.rx.try_recv() {
                Ok(Chunk::Close(why)) => self.closed = Some(why),
                Ok(Chunk::Data(..)) => {}
                Err(_) => return Error::Disconnected,
            }
        }
        Error::PeerClosed(self.closed.clone().unwrap_or_default())
    }
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
            if let Some(why) = &self.closed {
                return Err(Error::PeerClosed(why.clone()));
            }
            if self.inbox_pos == self.inbox.len() {
                match self.rx.recv().map_err(|_| Error::Disconnected)? {
                    Chunk::Data(chunk, arrival) => {
                        if let Some(link) = &self.link {
                            link.wait_for(arrival);
                        }
                        self.inbox = chunk;
                        self.inbox_pos = 0;
                    }
                    Chunk::Close(why) => self.closed = Some(why),
                }
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
            if self.tx.send(Chunk::Data(chunk, arrival)).is_err() {
                return Err(self.last_word());
            }
        }
        Ok(())
    }

    fn close_with(&mut self, reason: &str) -> Result<()> {
        self.flush()?;
        self.tx
            .send(Chunk::Close(records::cut(reason).to_string()))
            .map_err(|_| Error::Disconnected)
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
