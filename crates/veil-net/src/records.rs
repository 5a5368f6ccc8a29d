//! Records: how a session's bytes travel on a socket once both ends have switched to them
//! ([`Channel::start_records`]), so that a close with a reason ([`Channel::close_with`]) can
//! arrive at any point of a protocol and never be read as its data.
//!
//! A data record is a 4-byte little-endian header, its length (1 to 2^31 − 1), then that many
//! bytes: one per flush (and per 1 MiB buffered). A close record is a header with the top bit
//! set whose low bits are the reason's length (at most [`MAX_REASON_BYTES`]), then the reason
//! in UTF-8; nothing follows it. The receiver reads data records straight into the caller's
//! buffer, so the only allocation a peer can cause is one reason of at most
//! [`MAX_REASON_BYTES`]. Meters count the data, not the headers: a protocol's metered bytes and
//! flights are the same with or without records; the wire carries 4 more bytes per flush.
//!
//! [`Channel::start_records`]: crate::Channel::start_records
//! [`Channel::close_with`]: crate::Channel::close_with

use veil_core::{bail, Error, Result};

use crate::tcp::BUF_BYTES;

/// The longest reason a close record carries; a longer one is cut (at a character boundary).
pub const MAX_REASON_BYTES: usize = 512;

/// The header bit that makes a record a close.
const CLOSE: u32 = 1 << 31;

/// `reason`, cut to at most [`MAX_REASON_BYTES`] at a character boundary.
pub(crate) fn cut(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Bytes queued for the peer: emitted at each flush as they are (before records) or as one
/// data record, its header written into the space kept at the front of the buffer.
#[derive(Default)]
pub(crate) struct Outbox {
    buf: Vec<u8>,
    records: bool,
}

impl Outbox {
    /// Queues `data`, emitting with `emit` whenever 1 MiB is buffered (so a record stays far
    /// below 2^31 bytes).
    pub(crate) fn push(
        &mut self,
        data: &[u8],
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        for chunk in data.chunks(BUF_BYTES) {
            if self.buf.is_empty() && self.records {
                self.buf.extend_from_slice(&[0; 4]);
            }
            self.buf.extend_from_slice(chunk);
            if self.buf.len() >= BUF_BYTES {
                self.emit(emit)?;
            }
        }
        Ok(())
    }

    /// Emits what is queued, as one record when records are on.
    pub(crate) fn emit(&mut self, emit: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.records {
            let len = (self.buf.len() - 4) as u32;
            self.buf[..4].copy_from_slice(&len.to_le_bytes());
        }
        emit(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Emits what was queued before (as it is), then frames everything after.
    pub(crate) fn start_records(
        &mut self,
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.emit(emit)?;
        self.records = true;
        Ok(())
    }

    /// Emits what is queued, then a close record carrying `reason` (nothing more without
    /// records: the peer could not tell it from data).
    pub(crate) fn close(
        &mut self,
        reason: &str,
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.emit(emit)?;
        if !self.records {
            return Ok(());
        }
        let reason = cut(reason);
        let mut record = (CLOSE | reason.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(reason.as_bytes());
        emit(&record)
    }
}

/// The receiving side: how much of the current data record is left, and the peer's reason
/// once it closed.
#[derive(Default)]
pub(crate) struct Inbox {
    records: bool,
    left: usize,
    closed: Option<String>,
}

impl Inbox {
    /// Everything received from here on is in records.
    pub(crate) fn start_records(&mut self) {
        self.records = true;
    }

    /// Fills `buf` with data, reading the stream with `raw` (which fills its argument exactly).
    /// A close record (now or earlier) is `Error::PeerClosed` with its reason.
    pub(crate) fn recv(
        &mut self,
        buf: &mut [u8],
        raw: &mut dyn FnMut(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if !self.records {
            return raw(buf);
        }
        let mut off = 0;
        while off < buf.len() {
            if let Some(why) = &self.closed {
                return Err(Error::PeerClosed(why.clone()));
            }
            if self.left == 0 {
                let mut header = [0u8; 4];
                raw(&mut header)?;
                let header = u32::from_le_bytes(header);
                let len = (header & !CLOSE) as usize;
                match (header & CLOSE != 0, len) {
                    (false, 0) => bail!(Malformed, "an empty data record"),
                    (false, n) => self.left = n,
                    (true, n) if n > MAX_REASON_BYTES => bail!(
                        Malformed,
                        "a close record of {n} bytes (at most {MAX_REASON_BYTES})"
                    ),
                    (true, n) => {
                        let mut why = vec![0u8; n];
                        raw(&mut why)?;
                        self.closed = Some(String::from_utf8_lossy(&why).into_owned());
                    }
                }
                continue;
            }
            let n = self.left.min(buf.len() - off);
            raw(&mut buf[off..off + n])?;
            self.left -= n;
            off += n;
        }
        Ok(())
    }

    /// After a send failed with `e`: when the peer hung up, the reason it closed with, read
    /// from what it sent last (data skipped; the caller bounds `raw` by a deadline), else `e`.
    pub(crate) fn last_word(
        &mut self,
        e: Error,
        raw: &mut dyn FnMut(&mut [u8]) -> Result<()>,
    ) -> Error {
        if !self.records || !matches!(e, Error::Disconnected) {
            return e;
        }
        let mut sink = [0u8; 4096];
        loop {
            match self.recv(&mut sink, raw) {
                Ok(()) => {}
                Err(closed @ Error::PeerClosed(_)) => return closed,
                Err(_) => return e,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `out` emits, read back through an inbox.
    fn wire(out: impl FnOnce(&mut Outbox, &mut dyn FnMut(&[u8]) -> Result<()>)) -> Vec<u8> {
        let mut bytes = vec![];
        let mut o = Outbox::default();
        out(&mut o, &mut |b| {
            bytes.extend_from_slice(b);
            Ok(())
        });
        bytes
    }

    fn reader(bytes: &[u8]) -> impl FnMut(&mut [u8]) -> Result<()> + '_ {
        let mut pos = 0;
        move |buf: &mut [u8]| {
            let end = pos + buf.len();
            if end > bytes.len() {
                return Err(Error::Disconnected);
            }
            buf.copy_from_slice(&bytes[pos..end]);
            pos = end;
            Ok(())
        }
    }

    #[test]
    fn data_then_a_close_reads_back_and_the_close_stays() {
        let bytes = wire(|o, e| {
            o.push(b"raw", e).unwrap();
            o.start_records(e).unwrap();
            o.push(b"hello ", e).unwrap();
            o.push(b"world", e).unwrap();
            o.emit(e).unwrap();
            o.push(b"!", e).unwrap();
            o.close("idle \x1b[2J", e).unwrap();
        });
        assert_eq!(&bytes[..7], b"raw\x0b\0\0\0");
        let mut raw = reader(&bytes);
        let mut inbox = Inbox::default();
        let mut buf = [0u8; 3];
        inbox.recv(&mut buf, &mut raw).unwrap();
        inbox.start_records();
        let mut buf = [0u8; 12];
        inbox.recv(&mut buf, &mut raw).unwrap();
        assert_eq!(&buf, b"hello world!");
        for _ in 0..2 {
            match inbox.recv(&mut [0u8; 1], &mut raw) {
                Err(Error::PeerClosed(why)) => assert_eq!(why, "idle \x1b[2J"),
                r => panic!("{r:?}"),
            }
        }
    }

    #[test]
    fn reasons_are_cut_at_the_limit_and_bad_headers_refused() {
        let long = "é".repeat(MAX_REASON_BYTES);
        let bytes = wire(|o, e| {
            o.start_records(e).unwrap();
            o.close(&long, e).unwrap();
        });
        assert_eq!(bytes.len(), 4 + MAX_REASON_BYTES);
        let mut inbox = Inbox::default();
        inbox.start_records();
        match inbox.recv(&mut [0u8; 1], &mut reader(&bytes)) {
            Err(Error::PeerClosed(why)) => assert_eq!(why, "é".repeat(MAX_REASON_BYTES / 2)),
            r => panic!("{r:?}"),
        }
        for header in [0u32, CLOSE | (MAX_REASON_BYTES as u32 + 1), u32::MAX] {
            let mut inbox = Inbox::default();
            inbox.start_records();
            let bytes = header.to_le_bytes();
            let e = inbox.recv(&mut [0u8; 1], &mut reader(&bytes)).unwrap_err();
            assert!(matches!(e, Error::Malformed(_)), "{header:#x}: {e}");
        }
    }

    #[test]
    fn a_close_without_records_sends_no_record() {
        let bytes = wire(|o, e| {
            o.push(b"x", e).unwrap();
            o.close("why", e).unwrap();
        });
        assert_eq!(bytes, b"x");
    }
}
