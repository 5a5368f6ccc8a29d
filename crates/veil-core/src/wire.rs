//! Canonical little-endian wire encoding.
//!
//! [`Writer`] appends fixed-width integers and length-prefixed sequences; [`Reader`] decodes them
//! with every check a hostile peer needs: bounded lengths, values inside their range, and no
//! trailing bytes ([`Reader::finish`]). Every protocol message in Veil is built on these two.

use crate::{bail, bitpack, ensure, Error, Result, Ring};

#[derive(Default)]
/// Builds a message in the canonical encoding (little-endian integers, length-prefixed bytes).
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty message.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty message with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }
    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends raw bytes (no length prefix).
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Integers of `width` bytes each (low bytes of each value), no length prefix.
    pub fn packed(&mut self, values: &[u64], width: usize) -> &mut Self {
        for v in values {
            self.buf.extend_from_slice(&v.to_le_bytes()[..width]);
        }
        self
    }
    /// Values of `bits` bits each, bit-packed ([`bitpack`]), no length prefix.
    pub fn bit_packed(&mut self, values: &[u64], bits: u32) -> &mut Self {
        self.bytes(&bitpack::pack(values, bits))
    }
    /// Ring elements packed at ⌈ℓ/8⌉ bytes each.
    pub fn ring_elems(&mut self, ring: Ring, values: &[u64]) -> &mut Self {
        self.packed(values, ring.byte_len())
    }
    /// The message.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Reads a message in the canonical encoding: every read checks the bytes left, and
/// [`Reader::finish`] refuses trailing bytes.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the message in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    /// The next `n` bytes; `Error::Malformed` when fewer are left.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                Error::Malformed(format!(
                    "{}: truncated (need {n} bytes at offset {}, have {})",
                    self.what,
                    self.pos,
                    self.buf.len() - self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    /// The next byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    /// A `u32` length that must not exceed `max`.
    pub fn len_at_most(&mut self, max: usize, field: &str) -> Result<usize> {
        let n = self.u32()? as usize;
        ensure!(
            n <= max,
            Malformed,
            "{}: {field} = {n} exceeds limit {max}",
            self.what
        );
        Ok(n)
    }
    /// `count` integers of `width` bytes, each checked to be `< bound` (exclusive).
    pub fn packed_below(&mut self, count: usize, width: usize, bound: u64) -> Result<Vec<u64>> {
        let raw = self.take(
            count
                .checked_mul(width)
                .ok_or_else(|| Error::Malformed(format!("{}: length overflow", self.what)))?,
        )?;
        let mut out = Vec::with_capacity(count);
        for chunk in raw.chunks_exact(width) {
            let mut b = [0u8; 8];
            b[..width].copy_from_slice(chunk);
            let v = u64::from_le_bytes(b);
            ensure!(
                v < bound,
                Malformed,
                "{}: value {v} out of range (< {bound})",
                self.what
            );
            out.push(v);
        }
        Ok(out)
    }
    /// `count` values of `bits` bits, bit-packed ([`bitpack`]: zero padding checked), each checked
    /// to be `< bound` (exclusive).
    pub fn bit_packed_below(&mut self, count: usize, bits: u32, bound: u64) -> Result<Vec<u64>> {
        let len = bitpack::total_bits(count, bits, self.what)?.div_ceil(8);
        let values = bitpack::unpack(self.take(len)?, count, bits, self.what)?;
        if let Some(v) = values.iter().find(|&&v| v >= bound) {
            bail!(
                Malformed,
                "{}: value {v} out of range (< {bound})",
                self.what
            );
        }
        Ok(values)
    }
    /// `count` ring elements packed at ⌈ℓ/8⌉ bytes, each checked to lie in Z_{2^ℓ}.
    pub fn ring_elems(&mut self, ring: Ring, count: usize) -> Result<Vec<u64>> {
        let raw = self.take(
            count
                .checked_mul(ring.byte_len())
                .ok_or_else(|| Error::Malformed(format!("{}: length overflow", self.what)))?,
        )?;
        let w = ring.byte_len();
        let mut out = Vec::with_capacity(count);
        for chunk in raw.chunks_exact(w) {
            let mut b = [0u8; 8];
            b[..w].copy_from_slice(chunk);
            let v = u64::from_le_bytes(b);
            ensure!(
                ring.contains(v),
                Malformed,
                "{}: element outside Z_2^{}",
                self.what,
                ring.bits()
            );
            out.push(v);
        }
        Ok(out)
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Rejects trailing bytes.
    pub fn finish(self) -> Result<()> {
        ensure!(
            self.pos == self.buf.len(),
            Malformed,
            "{}: {} trailing bytes",
            self.what,
            self.buf.len() - self.pos
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_strictness() {
        let ring = Ring::new(41).unwrap();
        let mut w = Writer::new();
        w.u32(3).ring_elems(ring, &[1, ring.mask(), 0]).u8(9);
        let bytes = w.finish();
        let mut r = Reader::new(&bytes, "test");
        let n = r.len_at_most(3, "count").unwrap();
        assert_eq!(r.ring_elems(ring, n).unwrap(), vec![1, ring.mask(), 0]);
        assert_eq!(r.u8().unwrap(), 9);
        r.finish().unwrap();

        // Trailing byte.
        let mut extra = bytes.clone();
        extra.push(0);
        let mut r = Reader::new(&extra, "test");
        let n = r.len_at_most(3, "count").unwrap();
        r.ring_elems(ring, n).unwrap();
        r.u8().unwrap();
        assert!(matches!(r.finish(), Err(Error::Malformed(_))));

        // Truncated.
        let mut r = Reader::new(&bytes[..5], "test");
        let n = r.len_at_most(3, "count").unwrap();
        assert!(r.ring_elems(ring, n).is_err());

        // Over the limit.
        assert!(Reader::new(&bytes, "test").len_at_most(2, "count").is_err());

        // Out-of-range element: 6 bytes with a bit above 2^41 set.
        let bad = [0xff; 6];
        assert!(Reader::new(&bad, "test").ring_elems(ring, 1).is_err());
        assert!(Reader::new(&bad, "test").packed_below(1, 6, 10).is_err());
    }

    #[test]
    fn bit_packed_values_are_bounded_and_consume_exactly_their_bytes() {
        let mut w = Writer::new();
        w.bit_packed(&[5, 6, 0], 3).u8(7);
        let bytes = w.finish();
        assert_eq!(bytes.len(), 3);
        let mut r = Reader::new(&bytes, "test");
        assert_eq!(r.bit_packed_below(3, 3, 7).unwrap(), vec![5, 6, 0]);
        assert_eq!(r.u8().unwrap(), 7);
        r.finish().unwrap();
        let too_big = Reader::new(&bytes, "test").bit_packed_below(3, 3, 6);
        assert!(matches!(too_big, Err(Error::Malformed(_))));
        let padding_set = [0b0111_0101, 0b1000_0001];
        assert!(Reader::new(&padding_set, "test")
            .bit_packed_below(3, 3, 8)
            .is_err());
        assert!(Reader::new(&bytes[..1], "test")
            .bit_packed_below(3, 3, 8)
            .is_err());
    }
}
