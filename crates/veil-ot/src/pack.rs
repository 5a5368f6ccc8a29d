//! Dense bit packing for OT messages: choice-bit corrections and `bits`-bit payloads are sent
//! with no padding except the last byte's, which must be zero (canonical encoding, so a peer's
//! stray bits are rejected rather than ignored). Readers and writers move 64 bits at a time.

use veil_core::{ensure, Result};

/// Bytes needed for `count` values of `bits` bits.
pub fn packed_len(count: usize, bits: u32) -> usize {
    (count * bits as usize).div_ceil(8)
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
    pub fn new(bytes: &'a [u8], count: usize, bits: u32, what: &str) -> Result<Self> {
        assert!((1..=64).contains(&bits), "BitReader: bits = {bits}");
        let mut r = Self::with_total_bits(bytes, count * bits as usize, what)?;
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

    proptest! {
        #[test]
        fn round_trip(values in proptest::collection::vec(any::<u64>(), 0..100), bits in 1u32..=64) {
            let masked: Vec<u64> = values.iter().map(|v| v & mask(bits)).collect();
            let bytes = pack(&values, bits);
            prop_assert_eq!(bytes.len(), packed_len(values.len(), bits));
            prop_assert_eq!(unpack(&bytes, values.len(), bits, "t").unwrap(), masked);
        }
    }

    proptest! {
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
    }

    proptest! {
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
            prop_assert!(BitReader::with_total_bits(&bytes, total + 8, "t").is_err());
        }
    }

    #[test]
    fn rejects_bad_length_and_padding() {
        let bytes3 = pack(&[1, 2, 3], 3);
        let mut dirty3 = bytes3.clone();
        *dirty3.last_mut().unwrap() |= 0x80;
        assert!(BitReader::new(&dirty3, 3, 3, "t").is_err());
        assert!(BitReader::new(&bytes3[..1], 3, 3, "t").is_err());
        let bytes = pack(&[1, 2, 3], 3);
        assert!(unpack(&bytes[..1], 3, 3, "t").is_err());
        let mut dirty = bytes.clone();
        *dirty.last_mut().unwrap() |= 0x80;
        assert!(unpack(&dirty, 3, 3, "t").is_err());
        let b = pack_bools([true, false, true].into_iter());
        assert_eq!(unpack_bools(&b, 3, "t").unwrap(), vec![1, 0, 1]);
    }
}
