//! Constant-time helpers: masks instead of branches or secret-dependent addresses, for values
//! derived from a party's secrets (Δ, choice bits, punctured indices).

/// All ones if `a == b`, else zero, computed without a branch.
#[inline]
pub(crate) fn eq_mask(a: usize, b: usize) -> u64 {
    let x = (a ^ b) as u64;
    // `x | -x` has its top bit set exactly when x != 0.
    ((x | x.wrapping_neg()) >> 63).wrapping_sub(1)
}

/// [`eq_mask`] widened to a block.
#[inline]
pub(crate) fn eq_mask_128(a: usize, b: usize) -> u128 {
    0u128.wrapping_sub((eq_mask(a, b) & 1) as u128)
}

/// `bit` (0 or 1) as a mask: all ones for 1, zero for 0.
#[inline]
pub(crate) fn bit_mask_128(bit: u128) -> u128 {
    0u128.wrapping_sub(bit & 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_match_the_comparisons() {
        let probes = [
            0usize,
            1,
            2,
            3,
            255,
            256,
            1 << 20,
            usize::MAX - 1,
            usize::MAX,
        ];
        for &a in &probes {
            for &b in &probes {
                let want = if a == b { u64::MAX } else { 0 };
                assert_eq!(eq_mask(a, b), want, "{a} {b}");
                assert_eq!(eq_mask_128(a, b), want as u128 | (want as u128) << 64);
            }
        }
        assert_eq!(bit_mask_128(1), u128::MAX);
        assert_eq!(bit_mask_128(0), 0);
    }
}
