//! TCP transport: TCP_NODELAY (protocol messages are latency-bound), 1 MiB buffers, optional
//! deadlines ([`Channel::set_deadline`]) and idle limit ([`TcpChannel::set_timeout`]), records
//! and a close with a reason once started ([`crate::records`]).
//! Plain TCP carries no authentication or encryption: `veil` uses it only behind
//! `--insecure-plaintext` (and for in-process loopback); see [`crate::tls`].

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use veil_core::{Error, Result};

use crate::records::{Inbox, Outbox};
use crate::timed::{hang_up, TimedStream, LINGER};
use crate::{Channel, Meter};

pub(crate) const BUF_BYTES: usize = 1 << 20;

/// A [`Channel`](crate::Channel) over plain TCP (buffered, Nagle off).
pub struct TcpChannel {
    reader: BufReader<TimedStream>,
    writer: BufWriter<TimedStream>,
    out: Outbox,
    inbox: Inbox,
    meter: Meter,
}

impl TcpChannel {
    /// Connects to `addr`.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Self::from_stream(TcpStream::connect(addr)?)
    }

    /// Connects within `timeout` to the first address `addr` resolves to that answers.
    pub fn connect_timeout(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self> {
        Self::from_stream(connect_timeout(addr, timeout)?)
    }

    /// Wraps an accepted or connected stream.
    pub fn from_stream(stream: TcpStream) -> Result<Self> {
        stream.set_nodelay(true)?;
        let stream = TimedStream::new(stream);
        let reader = BufReader::with_capacity(BUF_BYTES, stream.try_clone()?);
        let writer = BufWriter::with_capacity(BUF_BYTES, stream);
        Ok(TcpChannel {
            reader,
            writer,
            out: Outbox::default(),
            inbox: Inbox::default(),
            meter: Meter::new(),
        })
    }

    /// A peer silent for longer than `t` makes one receive (or send) fail with
    /// `Error::TimedOut` instead of hanging forever.
    pub fn set_timeout(&mut self, t: Option<Duration>) -> Result<()> {
        self.reader.get_mut().set_idle(t);
        self.writer.get_mut().set_idle(t);
        Ok(())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.writer.get_ref().get_ref().peer_addr()?)
    }

    /// A send that failed with `e`: the peer's reason if it closed with one (read for at most
    /// [`LINGER`]), else `e`.
    fn last_word(&mut self, e: Error) -> Error {
        self.reader
            .get_mut()
            .set_deadline(Some(Instant::now() + LINGER));
        let r = &mut self.reader;
        self.inbox.last_word(e, &mut |b| Ok(r.read_exact(b)?))
    }

    /// Receives fail within 0.1 s once `stop` is set, even while the peer keeps sending (a
    /// server ending its sessions at shutdown); sends are bounded by their deadlines.
    pub fn stop_reads_on(&mut self, stop: Arc<AtomicBool>) {
        self.reader.get_mut().stop_reads_on(stop);
    }
}

/// `TcpStream::connect_timeout` over every address `addr` resolves to; the last error if none
/// answers (a timeout as `Error::TimedOut`, naming the address).
pub fn connect_timeout(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpStream> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => {
                last = Some(match e.kind() {
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                        Error::TimedOut(format!(
                            "no answer from {a} within {:.1} s (--connect-timeout)",
                            timeout.as_secs_f64()
                        ))
                    }
                    _ => Error::Io(std::io::Error::new(e.kind(), format!("{a}: {e}"))),
                })
            }
        }
    }
    Err(last.unwrap_or_else(|| Error::InvalidArgument("the address resolves to nothing".into())))
}

impl Channel for TcpChannel {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.meter.on_send(data.len());
        let w = &mut self.writer;
        let sent = self.out.push(data, &mut |b| Ok(w.write_all(b)?));
        sent.map_err(|e| self.last_word(e))
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.flush()?;
        let r = &mut self.reader;
        self.inbox.recv(buf, &mut |b| Ok(r.read_exact(b)?))?;
        self.meter.on_recv(buf.len());
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let w = &mut self.writer;
        let sent = self.out.emit(&mut |b| Ok(w.write_all(b)?));
        let sent = sent.and_then(|()| Ok(self.writer.flush()?));
        sent.map_err(|e| self.last_word(e))
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }

    fn set_deadline(&mut self, deadline: Option<Instant>) -> Result<()> {
        self.reader.get_mut().set_deadline(deadline);
        self.writer.get_mut().set_deadline(deadline);
        Ok(())
    }

    fn start_records(&mut self) -> Result<()> {
        let w = &mut self.writer;
        self.out.start_records(&mut |b| Ok(w.write_all(b)?))?;
        self.inbox.start_records();
        Ok(())
    }

    fn close_with(&mut self, reason: &str) -> Result<()> {
        // The step's deadline may be what passed: the reason gets its own time.
        self.set_deadline(Some(Instant::now() + LINGER))?;
        let w = &mut self.writer;
        let sent = self.out.close(reason, &mut |b| Ok(w.write_all(b)?));
        let sent = sent.and_then(|()| Ok(self.writer.flush()?));
        hang_up(&mut self.reader);
        sent
    }
}

impl Drop for TcpChannel {
    /// Sends what is still queued (as the buffered writer did before records), best effort.
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
