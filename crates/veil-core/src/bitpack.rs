//! Dense bit packing, the one bit-level wire format of Veil: OT messages (choice-bit
//! corrections, `bits`-bit payloads) and BFV residues at the width of their modulus. Values go
//! least-significant bit first, with no padding except the last byte's, which must be zero
//! (canonical encoding, so a peer's stray bits are rejected rather than ignored). Readers and
//! writers move 64 bits at a time. Decoders return [`Error::Malformed`](crate::Error) on a
//! wrong length or non-zero padding; [`crate::wire::Reader::bit_packed_below`] adds a range check per
//! value.

use crate::{ensure, Error, Result};

/// Bytes needed for `count` values of `bits` bits.
pub fn packed_len(count: usize, bits: u32) -> usize {
    (count * bits as usize).div_ceil(8)
}

/// Payload bits of `count` values of `bits` bits, or [`Error::Malformed`] when a count (perhaps
/// read from a peer) makes it overflow.
pub fn total_bits(count: usize, bits: u32, what: &str) -> Result<usize> {
    count
        .checked_mul(bits as usize)
        .ok_or_else(|| Error::Malformed(format!("{what}: length overflow")))
}

/// Packs the low `bits` bits of every value, little-endian bit order.
pub fn pack(values: &[u64], bits: u32) -> Vec<u8> {
    let mut w = BitWriter::new(values.len(), bits);
    for &v in values {
        w.push(v);
    }
    w.finish()
}

/// Streaming form of [`pack`], for senders that compute values on the fly. Bits gather in a
/// 128-bit accumulator and leave it 64 at a time.
pub struct BitWriter {
    out: Vec<u8>,
    acc: u128,
    /// Bits pending in `acc`; below 64 between calls.
    fill: u32,
    bits: u32,
    mask: u64,
}

impl BitWriter {
    /// A writer for `count` values (capacity hint) of `bits` bits.
    pub fn new(count: usize, bits: u32) -> Self {
        assert!((1..=64).contains(&bits), "BitWriter: bits = {bits}");
        BitWriter {
            out: Vec::with_capacity(packed_len(count, bits) + 8),
            acc: 0,
            fill: 0,
            bits,
            mask: mask(bits),
        }
    }

    /// Appends the low bits of v at the writer's width.
    #[inline]
    pub fn push(&mut self, v: u64) {
        self.push_bits(v & self.mask, self.bits);
    }

    /// Appends the low `bits` bits of v (1 ≤ bits ≤ 64), whatever the writer's own width: for
    /// messages whose values have different widths.
    #[inline]
    pub fn push_bits(&mut self, v: u64, bits: u32) {
        self.acc |= ((v & mask(bits)) as u128) << self.fill;
        self.fill += bits;
        if self.fill >= 64 {
            self.out.extend_from_slice(&(self.acc as u64).to_le_bytes());
            self.acc >>= 64;
            self.fill -= 64;
        }
    }

    /// Appends everything `other` holds, bit for bit, wherever this writer stands: a message
    /// written in parts (the lanes of a parallel step) is the one message written in order.
    fn append(&mut self, other: BitWriter) {
        for word in other.out.chunks_exact(8) {
            self.push_bits(u64::from_le_bytes(word.try_into().expect("8 bytes")), 64);
        }
        if other.fill > 0 {
            self.push_bits(other.acc as u64, other.fill);
        }
    }

    /// The message of `parts` written one after the other (lanes' messages, in order), grown
    /// from the first part's buffer: one part (most calls) is finished as it is. No parts: an
    /// empty message.
    pub fn joined(parts: impl IntoIterator<Item = BitWriter>) -> Vec<u8> {
        let mut parts = parts.into_iter();
        let Some(mut all) = parts.next() else {
            return Vec::new();
        };
        parts.for_each(|p| all.append(p));
        all.finish()
    }

    /// The message: whole bytes, the last one padded with zero bits.
    pub fn finish(mut self) -> Vec<u8> {
        let tail = self.fill.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..tail]);
        self.out
    }
}

/// Sequential reader of a packed message of `count` values, checked once up front (length,
/// zero padding), then read value by value with no further checks that could fail.
pub struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    acc: u128,
    fill: u32,
    bits: u32,
    /// Payload bits not yet read.
    left: usize,
}

impl<'a> BitReader<'a> {
    /// A reader of `count` values of `bits` bits; `Malformed` unless `bytes` is exactly that
    /// message with zero padding.
    pub fn new(bytes: &'a [u8], count: usize, bits: u32, what: &str) -> Result<Self> {
        assert!((1..=64).contains(&bits), "BitReader: bits = {bits}");
        let mut r = Self::with_total_bits(bytes, total_bits(count, bits, what)?, what)?;
        r.bits = bits;
        Ok(r)
    }

    /// A reader of a message of `total` payload bits, read with [`BitReader::next_bits`].
    pub fn with_total_bits(bytes: &'a [u8], total: usize, what: &str) -> Result<Self> {
        ensure!(
            bytes.len() == total.div_ceil(8),
            Malformed,
            "{what}: {} bytes, expected {}",
            bytes.len(),
            total.div_ceil(8)
        );
        let used = total % 8;
        if used > 0 {
            ensure!(
                bytes[bytes.len() - 1] >> used == 0,
                Malformed,
                "{what}: non-zero padding bits"
            );
        }
        Ok(BitReader {
            bytes,
            pos: 0,
            acc: 0,
            fill: 0,
            bits: 0,
            left: total,
        })
    }

    /// The next value of the reader's width; panics when called more than `count` times (a
    /// caller bug).
    #[inline]
    pub fn next_value(&mut self) -> u64 {
        self.next_bits(self.bits)
    }

    /// The next `bits` bits (1 ≤ bits ≤ 64); panics past the end of the message (a caller bug).
    #[inline]
    pub fn next_bits(&mut self, bits: u32) -> u64 {
        assert!(
            (1..=64).contains(&bits) && self.left >= bits as usize,
            "BitReader read past its last value"
        );
        self.left -= bits as usize;
        if self.fill < bits {
            // fill < 64 here, so 64 more bits fit in the accumulator.
            if let Some(word) = self.bytes.get(self.pos..self.pos + 8) {
                let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                self.acc |= (w as u128) << self.fill;
                self.fill += 64;
                self.pos += 8;
            } else {
                while self.fill < bits {
                    self.acc |= (self.bytes[self.pos] as u128) << self.fill;
                    self.fill += 8;
                    self.pos += 1;
                }
            }
        }
        let v = self.acc as u64 & mask(bits);
        self.acc >>= bits;
        self.fill -= bits;
        v
    }
}

/// Inverse of [`pack`]: exactly `count` values; the message length and padding are checked.
pub fn unpack(bytes: &[u8], count: usize, bits: u32, what: &str) -> Result<Vec<u64>> {
    let mut r = BitReader::new(bytes, count, bits, what)?;
    Ok((0..count).map(|_| r.next_value()).collect())
}

/// Packs booleans one bit each.
pub fn pack_bools(bits: impl ExactSizeIterator<Item = bool>) -> Vec<u8> {
    let mut out = vec![0u8; bits.len().div_ceil(8)];
    for (i, b) in bits.enumerate() {
        out[i / 8] |= (b as u8) << (i % 8);
    }
    out
}

/// Inverse of [`pack_bools`], as 0/1 bytes.
pub fn unpack_bools(bytes: &[u8], count: usize, what: &str) -> Result<Vec<u8>> {
    let mut r = BitReader::new(bytes, count, 1, what)?;
    Ok((0..count).map(|_| r.next_value() as u8).collect())
}

/// The low `bits` bits set (`bits` ≥ 64: all of them).
pub fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The format spelled out bit by bit: bit j of value i is bit i·bits + j of the message,
    /// bit k of the message is bit k % 8 of byte k / 8.
    fn reference_pack(values: &[u64], bits: u32) -> Vec<u8> {
        let mut out = vec![0u8; packed_len(values.len(), bits)];
        for (i, &v) in values.iter().enumerate() {
            for j in 0..bits as usize {
                let k = i * bits as usize + j;
                out[k / 8] |= (((v >> j) & 1) as u8) << (k % 8);
            }
        }
        out
    }

    fn is_malformed<T>(r: Result<T>) -> bool {
        matches!(r, Err(Error::Malformed(_)))
    }

    proptest! {
        #[test]
        fn round_trip_in_the_reference_format(values in proptest::collection::vec(any::<u64>(), 0..100), bits in 1u32..=64) {
            let masked: Vec<u64> = values.iter().map(|v| v & mask(bits)).collect();
            let bytes = pack(&values, bits);
            prop_assert_eq!(&bytes, &reference_pack(&masked, bits));
            prop_assert_eq!(bytes.len(), packed_len(values.len(), bits));
            prop_assert_eq!(unpack(&bytes, values.len(), bits, "t").unwrap(), masked);
        }

        /// A missing byte, an extra byte and (when the last byte has padding) any padding bit
        /// set are all `Malformed`.
        #[test]
        fn rejects_length_and_padding(values in proptest::collection::vec(any::<u64>(), 1..40), bits in 1u32..=64, pad in 0u32..8) {
            let n = values.len();
            let bytes = pack(&values, bits);
            prop_assert!(is_malformed(unpack(&bytes[..bytes.len() - 1], n, bits, "t")));
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert!(is_malformed(unpack(&longer, n, bits, "t")));
            let used = (n * bits as usize % 8) as u32;
            if used > 0 && pad >= used {
                let mut dirty = bytes.clone();
                *dirty.last_mut().unwrap() |= 1 << pad;
                prop_assert!(is_malformed(unpack(&dirty, n, bits, "t")));
                prop_assert!(is_malformed(BitReader::with_total_bits(&dirty, n * bits as usize, "t")));
            }
        }

        #[test]
        fn writer_and_reader_agree(values in proptest::collection::vec(any::<u64>(), 1..300), bits in 1u32..=64) {
            let mut w = BitWriter::new(0, bits);
            values.iter().for_each(|&v| w.push(v));
            let bytes = w.finish();
            prop_assert_eq!(&bytes, &pack(&values, bits));
            let mut r = BitReader::new(&bytes, values.len(), bits, "t").unwrap();
            for v in &values {
                prop_assert_eq!(r.next_value(), v & mask(bits));
            }
        }

        #[test]
        fn mixed_widths_round_trip(values in proptest::collection::vec((any::<u64>(), 1u32..=64), 1..300)) {
            let mut w = BitWriter::new(0, 1);
            values.iter().for_each(|&(v, b)| w.push_bits(v, b));
            let bytes = w.finish();
            let total: usize = values.iter().map(|&(_, b)| b as usize).sum();
            let mut r = BitReader::with_total_bits(&bytes, total, "t").unwrap();
            for &(v, b) in &values {
                prop_assert_eq!(r.next_bits(b), v & mask(b));
            }
            prop_assert!(is_malformed(BitReader::with_total_bits(&bytes, total + 8, "t")));
        }

        /// A message written in parts and joined is the message written in one go, wherever
        /// the cuts fall (byte-aligned or not).
        #[test]
        fn appended_parts_are_the_whole(values in proptest::collection::vec((any::<u64>(), 1u32..=64), 0..300), cuts in proptest::collection::vec(0usize..300, 0..6)) {
            let mut whole = BitWriter::new(0, 1);
            values.iter().for_each(|&(v, b)| whole.push_bits(v, b));
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(values.len())).collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut from = 0;
            for to in cuts.into_iter().chain([values.len()]) {
                let mut part = BitWriter::new(0, 1);
                values[from..to].iter().for_each(|&(v, b)| part.push_bits(v, b));
                parts.push(part);
                from = to;
            }
            prop_assert_eq!(BitWriter::joined(parts), whole.finish());
        }

        #[test]
        fn bools_round_trip(bools in proptest::collection::vec(any::<bool>(), 0..200)) {
            let bytes = pack_bools(bools.iter().copied());
            let as_words: Vec<u64> = bools.iter().map(|&b| b as u64).collect();
            prop_assert_eq!(&bytes, &pack(&as_words, 1));
            let back = unpack_bools(&bytes, bools.len(), "t").unwrap();
            prop_assert_eq!(back, as_words.iter().map(|&b| b as u8).collect::<Vec<_>>());
        }
    }

    #[test]
    fn known_answer() {
        // 1, 2, 3 at 3 bits: 001 010 011 from the least significant bit up.
        assert_eq!(pack(&[1, 2, 3], 3), vec![0b1101_0001, 0b0000_0000]);
        assert_eq!(pack(&[u64::MAX], 64), vec![0xff; 8]);
        assert!(BitWriter::joined([]).is_empty());
        assert_eq!(pack_bools([true, false, true].into_iter()), vec![0b101]);
    }

    #[test]
    fn rejects_overflowing_counts_and_bool_padding() {
        assert!(is_malformed(BitReader::new(&[], usize::MAX, 2, "t")));
        assert!(is_malformed(unpack(&[], usize::MAX / 8, 64, "t")));
        assert!(is_malformed(unpack_bools(&[0b1000], 3, "t")));
    }
}
