//! Dense bit packing for OT messages: choice-bit corrections and `bits`-bit payloads are sent
//! with no padding except the last byte's, which must be zero (canonical encoding, so a peer's
//! stray bits are rejected rather than ignored).

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

/// Streaming form of [`pack`], for senders that compute values on the fly.
pub struct BitWriter {
    out: Vec<u8>,
    acc: u128,
    fill: u32,
    bits: u32,
    mask: u64,
}

impl BitWriter {
    /// A writer for `count` values (capacity hint) of `bits` bits.
    pub fn new(count: usize, bits: u32) -> Self {
        assert!((1..=64).contains(&bits), "BitWriter: bits = {bits}");
        BitWriter {
            out: Vec::with_capacity(packed_len(count, bits)),
            acc: 0,
            fill: 0,
            bits,
            mask: mask(bits),
        }
    }

    #[inline]
    pub fn push(&mut self, v: u64) {
        self.acc |= ((v & self.mask) as u128) << self.fill;
        self.fill += self.bits;
        while self.fill >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.fill -= 8;
        }
    }

    pub fn finish(mut self) -> Vec<u8> {
        if self.fill > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// A packed message of `count` values, checked once (length, zero padding) and then read at
/// any index: receivers that need one value out of N need not unpack all of them.
pub struct PackedView<'a> {
    bytes: &'a [u8],
    count: usize,
    bits: u32,
}

impl<'a> PackedView<'a> {
    pub fn new(bytes: &'a [u8], count: usize, bits: u32, what: &str) -> Result<Self> {
        assert!((1..=64).contains(&bits), "PackedView: bits = {bits}");
        ensure!(
            bytes.len() == packed_len(count, bits),
            Malformed,
            "{what}: {} bytes, expected {}",
            bytes.len(),
            packed_len(count, bits)
        );
        let used = (count * bits as usize) % 8;
        if used > 0 {
            ensure!(
                bytes[bytes.len() - 1] >> used == 0,
                Malformed,
                "{what}: non-zero padding bits"
            );
        }
        Ok(PackedView { bytes, count, bits })
    }

    /// Value `i` (< count).
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        assert!(i < self.count, "PackedView index {i} out of {}", self.count);
        let pos = i * self.bits as usize;
        let (start, off) = (pos / 8, pos % 8);
        let end = (start + 9).min(self.bytes.len());
        let mut window = [0u8; 16];
        window[..end - start].copy_from_slice(&self.bytes[start..end]);
        (u128::from_le_bytes(window) >> off) as u64 & mask(self.bits)
    }
}

/// Inverse of [`pack`]: exactly `count` values; the message length and padding are checked.
pub fn unpack(bytes: &[u8], count: usize, bits: u32, what: &str) -> Result<Vec<u64>> {
    assert!((1..=64).contains(&bits), "unpack: bits = {bits}");
    ensure!(
        bytes.len() == packed_len(count, bits),
        Malformed,
        "{what}: {} bytes, expected {}",
        bytes.len(),
        packed_len(count, bits)
    );
    let mask = mask(bits);
    let mut out = Vec::with_capacity(count);
    let (mut acc, mut fill) = (0u128, 0u32);
    let mut it = bytes.iter();
    for _ in 0..count {
        while fill < bits {
            acc |= (*it.next().expect("length checked") as u128) << fill;
            fill += 8;
        }
        out.push(acc as u64 & mask);
        acc >>= bits;
        fill -= bits;
    }
    ensure!(acc == 0, Malformed, "{what}: non-zero padding bits");
    Ok(out)
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
    Ok(unpack(bytes, count, 1, what)?
        .into_iter()
        .map(|b| b as u8)
        .collect())
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
        fn view_reads_every_value(values in proptest::collection::vec(any::<u64>(), 1..60), bits in 1u32..=64) {
            let bytes = pack(&values, bits);
            let view = PackedView::new(&bytes, values.len(), bits, "t").unwrap();
            for (i, v) in values.iter().enumerate() {
                prop_assert_eq!(view.get(i), v & mask(bits));
            }
        }
    }

    #[test]
    fn rejects_bad_length_and_padding() {
        let bytes3 = pack(&[1, 2, 3], 3);
        let mut dirty3 = bytes3.clone();
        *dirty3.last_mut().unwrap() |= 0x80;
        assert!(PackedView::new(&dirty3, 3, 3, "t").is_err());
        assert!(PackedView::new(&bytes3[..1], 3, 3, "t").is_err());
        let bytes = pack(&[1, 2, 3], 3);
        assert!(unpack(&bytes[..1], 3, 3, "t").is_err());
        let mut dirty = bytes.clone();
        *dirty.last_mut().unwrap() |= 0x80;
        assert!(unpack(&dirty, 3, 3, "t").is_err());
        let b = pack_bools([true, false, true].into_iter());
        assert_eq!(unpack_bools(&b, 3, "t").unwrap(), vec![1, 0, 1]);
    }
}
