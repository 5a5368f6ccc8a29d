//! The ring Z_{2^ℓ}: elements are `u64` values kept reduced below 2^ℓ.

use crate::{ensure, Result};

/// Bit width ℓ of the share ring, validated to 32..=64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingBits(u32);

impl RingBits {
    /// The narrowest ring the protocols support.
    pub const MIN: u32 = 32;
    /// The widest ring (one `u64` per element).
    pub const MAX: u32 = 64;

    /// ℓ, refused outside [`RingBits::MIN`]..=[`RingBits::MAX`].
    pub fn new(bits: u32) -> Result<Self> {
        ensure!(
            (Self::MIN..=Self::MAX).contains(&bits),
            InvalidArgument,
            "ring bit width {bits} outside {}..={}",
            Self::MIN,
            Self::MAX
        );
        Ok(RingBits(bits))
    }

    /// ℓ.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// Z_{2^ℓ}. Arithmetic wraps in u64 and masks, so every ℓ ≤ 64 shares one code path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ring {
    bits: u32,
    mask: u64,
}

impl Ring {
    /// Z_{2^bits}, refused outside 32..=64.
    pub fn new(bits: u32) -> Result<Self> {
        Ok(Self::from_bits(RingBits::new(bits)?))
    }

    /// A protocol-internal ring of 1..=64 bits (narrow shares, e.g. a multiplexer whose values
    /// are known to be small). The share format itself is always a [`RingBits`] ring.
    pub fn narrow(bits: u32) -> Result<Self> {
        ensure!(
            (1..=RingBits::MAX).contains(&bits),
            InvalidArgument,
            "narrow ring bit width {bits} outside 1..={}",
            RingBits::MAX
        );
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        Ok(Ring { bits, mask })
    }

    /// Z_{2^bits} of an already validated width.
    pub fn from_bits(bits: RingBits) -> Self {
        let b = bits.get();
        let mask = if b == 64 { u64::MAX } else { (1u64 << b) - 1 };
        Ring { bits: b, mask }
    }

    /// ℓ.
    #[inline]
    pub fn bits(self) -> u32 {
        self.bits
    }

    /// 2^ℓ − 1.
    #[inline]
    pub fn mask(self) -> u64 {
        self.mask
    }

    /// Number of bytes an element takes on the wire (⌈ℓ/8⌉).
    #[inline]
    pub fn byte_len(self) -> usize {
        self.bits.div_ceil(8) as usize
    }

    #[inline]
    /// x mod 2^ℓ.
    pub fn reduce(self, x: u64) -> u64 {
        x & self.mask
    }

    #[inline]
    /// Whether x is a reduced element (< 2^ℓ).
    pub fn contains(self, x: u64) -> bool {
        x & !self.mask == 0
    }

    #[inline]
    /// a + b mod 2^ℓ.
    pub fn add(self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b) & self.mask
    }

    #[inline]
    /// a − b mod 2^ℓ.
    pub fn sub(self, a: u64, b: u64) -> u64 {
        a.wrapping_sub(b) & self.mask
    }

    #[inline]
    /// −a mod 2^ℓ.
    pub fn neg(self, a: u64) -> u64 {
        a.wrapping_neg() & self.mask
    }

    #[inline]
    /// a·b mod 2^ℓ.
    pub fn mul(self, a: u64, b: u64) -> u64 {
        a.wrapping_mul(b) & self.mask
    }

    /// Two's-complement interpretation in [−2^{ℓ−1}, 2^{ℓ−1}).
    #[inline]
    pub fn to_signed(self, x: u64) -> i64 {
        let shift = 64 - self.bits;
        ((x << shift) as i64) >> shift
    }

    /// Embeds a signed integer (reduced mod 2^ℓ).
    #[inline]
    pub fn from_signed(self, x: i64) -> u64 {
        (x as u64) & self.mask
    }

    /// Most significant bit (1 for negative values in the signed view).
    #[inline]
    pub fn msb(self, x: u64) -> bool {
        (x >> (self.bits - 1)) & 1 == 1
    }

    /// Largest positive signed value 2^{ℓ−1} − 1.
    #[inline]
    pub fn max_signed(self) -> i64 {
        (self.mask >> 1) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_out_of_range_widths() {
        assert!(Ring::new(31).is_err());
        assert!(Ring::new(65).is_err());
        assert!(Ring::new(32).is_ok());
        assert!(Ring::new(64).is_ok());
        assert!(Ring::narrow(0).is_err());
        assert!(Ring::narrow(65).is_err());
        assert_eq!(Ring::narrow(7).unwrap().mask(), 127);
    }

    #[test]
    fn extremes_of_the_signed_view() {
        let r = Ring::new(41).unwrap();
        assert_eq!(r.to_signed(r.mask()), -1);
        assert_eq!(r.to_signed(1 << 40), -(1i64 << 40));
        assert_eq!(r.to_signed((1 << 40) - 1), (1i64 << 40) - 1);
        let r64 = Ring::new(64).unwrap();
        assert_eq!(r64.to_signed(u64::MAX), -1);
        assert_eq!(r64.max_signed(), i64::MAX);
    }

    proptest! {
        #[test]
        fn arithmetic_matches_i128_mod_2l(bits in 32u32..=64, a: i64, b: i64) {
            let r = Ring::new(bits).unwrap();
            let m: i128 = 1i128 << bits;
            let (x, y) = (r.from_signed(a), r.from_signed(b));
            let modp = |v: i128| (v.rem_euclid(m)) as u64;
            prop_assert_eq!(r.add(x, y), modp(a as i128 + b as i128));
            prop_assert_eq!(r.sub(x, y), modp(a as i128 - b as i128));
            prop_assert_eq!(r.mul(x, y), modp(a as i128 * b as i128));
            prop_assert_eq!(r.add(x, r.neg(x)), 0);
            prop_assert_eq!(r.from_signed(r.to_signed(x)), x);
        }
    }
}
