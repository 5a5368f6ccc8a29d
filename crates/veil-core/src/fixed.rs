//! Fixed-point codec: a real x is the ring element round(x · 2^f) (two's complement mod 2^ℓ).

use crate::{ensure, Result, Ring};

/// Number of fractional bits f, validated against the ring: 2f must leave at least 2 integer bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FracBits(u32);

impl FracBits {
    /// The count `f`, refused when 2f + 2 exceeds the ring's bits.
    pub fn new(f: u32, ring: Ring) -> Result<Self> {
        ensure!(
            f >= 1 && 2 * f + 2 <= ring.bits(),
            InvalidArgument,
            "{f} fractional bits do not fit a {}-bit ring (need 1 <= f and 2f+2 <= l)",
            ring.bits()
        );
        Ok(FracBits(f))
    }

    /// The number of fractional bits.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// A fixed-point format: the ring and the scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedPoint {
    /// The ring the values live in.
    pub ring: Ring,
    frac: FracBits,
}

impl FixedPoint {
    /// The format (ℓ, f), refused when either is out of range.
    pub fn new(ring_bits: u32, frac_bits: u32) -> Result<Self> {
        let ring = Ring::new(ring_bits)?;
        Ok(FixedPoint {
            ring,
            frac: FracBits::new(frac_bits, ring)?,
        })
    }

    /// The project default (ℓ, f) = (41, 13).
    pub fn default_format() -> Self {
        Self::new(crate::defaults::RING_BITS, crate::defaults::FRAC_BITS)
            .expect("defaults are valid")
    }

    #[inline]
    /// f, the number of fractional bits.
    pub fn frac_bits(self) -> u32 {
        self.frac.get()
    }

    #[inline]
    /// 2^f, the value of one unit in the last place.
    pub fn scale(self) -> f64 {
        (1u64 << self.frac.get()) as f64
    }

    /// Largest |x| that encodes without wrapping.
    pub fn max_abs(self) -> f64 {
        self.ring.max_signed() as f64 / self.scale()
    }

    /// Encodes with round-to-nearest; values beyond the range saturate (callers that must not
    /// saturate check [`FixedPoint::max_abs`] first). NaN encodes as 0.
    #[inline]
    pub fn encode(self, x: f64) -> u64 {
        let v = (x * self.scale()).round();
        let lim = self.ring.max_signed() as f64;
        let v = if v.is_nan() {
            0.0
        } else {
            v.clamp(-lim - 1.0, lim)
        };
        self.ring.from_signed(v as i64)
    }

    #[inline]
    /// The real a ring element stands for (two's complement, divided by 2^f).
    pub fn decode(self, x: u64) -> f64 {
        self.ring.to_signed(x) as f64 / self.scale()
    }

    /// Encodes with the given number of fractional bits instead of f (e.g. 2f for a bias added
    /// before truncation).
    #[inline]
    pub fn encode_at(self, x: f64, frac_bits: u32) -> u64 {
        let v = (x * (2f64).powi(frac_bits as i32)).round();
        let lim = self.ring.max_signed() as f64;
        self.ring.from_signed(v.clamp(-lim - 1.0, lim) as i64)
    }

    /// Arithmetic shift right by f of a signed value: the plaintext semantics of truncation.
    #[inline]
    pub fn truncate_plain(self, x: u64) -> u64 {
        self.ring
            .from_signed(self.ring.to_signed(x) >> self.frac.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_too_many_fractional_bits() {
        let r = Ring::new(32).unwrap();
        assert!(FracBits::new(15, r).is_ok());
        assert!(FracBits::new(16, r).is_err());
        assert!(FracBits::new(0, r).is_err());
    }

    #[test]
    fn saturates_and_handles_nan() {
        let fp = FixedPoint::default_format();
        assert_eq!(fp.decode(fp.encode(f64::NAN)), 0.0);
        assert!(fp.decode(fp.encode(1e30)) > 0.0);
        assert!(fp.decode(fp.encode(-1e30)) < 0.0);
    }

    proptest! {
        #[test]
        fn round_trip_within_half_ulp(x in -1.0e4f64..1.0e4) {
            let fp = FixedPoint::default_format();
            let y = fp.decode(fp.encode(x));
            prop_assert!((x - y).abs() <= 0.5 / fp.scale() + 1e-12);
        }

        #[test]
        fn truncation_is_floor_division(x in -(1i64 << 39)..(1i64 << 39)) {
            let fp = FixedPoint::default_format();
            let t = fp.ring.to_signed(fp.truncate_plain(fp.ring.from_signed(x)));
            prop_assert_eq!(t, x.div_euclid(1 << 13));
        }
    }
}
