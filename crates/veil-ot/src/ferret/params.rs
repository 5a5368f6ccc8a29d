//! Regular-noise LPN parameter sets for 128-bit security (LPN over F_2, D = 10 non-zeros per
//! row of the public matrix, noise with exactly one 1 per bin of 2^depth outputs).
//!
//! Both sets are the Ferret authors' current ones: `emp-toolkit/emp-ot`, `emp-ot/tuning.h`
//! (`ferret_b12` and `ferret_b10`, given there as (t, log2 k, depth)), introduced in commit
//! dcbafff (2026-05-09) with this justification: k is a power of two and t "the largest value
//! clearing 128-bit security across all 11 attacks in the regular-LPN-over-F_2 estimator"
//! (the hybrid attack is the binding one):
//! * **main** — `ferret_b12`: t = 1,520, k = 2^18 = 262,144, depth 12, n = t·2^12 = 6,225,920;
//! * **bootstrap** — `ferret_b10`: t = 850, k = 2^16 = 65,536, depth 10, n = 870,400.
//!
//! Why b12 and not b13 (n = 15.6 M, k = 2^19, the default there): the LPN step reads k-entry
//! tables at random, and a 4 MiB table (k = 2^18) stays in cache where a larger one does not
//! (measured in docs/BENCHMARKS.md, "Moved from code comments"); a 6.2 M-COT iteration also
//! wastes less at the end of a short session. With the Half-Tree trees ([`super::spcot`]: one
//! block per level) b12 costs t·depth·128 / (n − k − t·depth) ≈ 0.39 bit per usable COT.
//!
//! An iteration with parameters (n, k, t) consumes `k + t·depth` COTs and produces n: the
//! main iteration needs 262,144 + 1,520·12 = 280,384 (emp-ot adds 128 more for the malicious
//! consistency check, which this semi-honest version omits) and hands out 5,945,536; the
//! bootstrap iteration (fed by IKNP: 65,536 + 850·10 = 74,036 COTs) yields the main
//! iteration's first reserve plus 590,016 spare COTs.

/// One LPN parameter set with regular noise: n outputs split into t bins, one noise bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LpnParams {
    /// Number of output COTs (LPN samples).
    pub n: usize,
    /// LPN secret length (COTs consumed by the LPN step).
    pub k: usize,
    /// Noise weight = number of bins = number of GGM trees.
    pub t: usize,
}

/// Main iteration (emp-ot `ferret_b12`, regular noise, 128-bit security).
pub(crate) const MAIN: LpnParams = LpnParams {
    n: 1_520 << 12,
    k: 1 << 18,
    t: 1_520,
};

/// Bootstrap iteration (emp-ot `ferret_b10`, regular noise, 128-bit security).
pub(crate) const BOOTSTRAP: LpnParams = LpnParams {
    n: 850 << 10,
    k: 1 << 16,
    t: 850,
};

/// Small, insecure sets that exercise every code path (several main iterations) quickly.
#[cfg(test)]
pub(crate) const TEST_BOOT: LpnParams = LpnParams {
    n: 4096,
    k: 512,
    t: 16,
};

/// See [`TEST_BOOT`]: 50 trees of 512 leaves, 23,150 COTs handed out per iteration.
#[cfg(test)]
pub(crate) const TEST_MAIN: LpnParams = LpnParams {
    n: 50 << 9,
    k: 2_000,
    t: 50,
};

impl LpnParams {
    #[cfg(test)]
    /// Output range `[start, start + len)` of bin `i`: bins differ in size by at most one.
    pub(crate) fn bin(&self, i: usize) -> (usize, usize) {
        let start = i * self.n / self.t;
        (start, (i + 1) * self.n / self.t - start)
    }

    /// GGM tree depth: enough leaves for the largest bin.
    pub(crate) fn depth(&self) -> usize {
        let largest = self.n.div_ceil(self.t);
        largest.next_power_of_two().trailing_zeros() as usize
    }

    /// COTs one iteration consumes: k for LPN, one per tree level for the SPCOTs.
    pub(crate) fn base_cots(&self) -> usize {
        self.k + self.t * self.depth()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_tile_the_output_and_fit_the_trees() {
        for p in [MAIN, BOOTSTRAP] {
            let mut next = 0;
            for i in 0..p.t {
                let (s, l) = p.bin(i);
                assert_eq!(s, next);
                assert!(l >= 2 && l <= 1 << p.depth());
                next = s + l;
            }
            assert_eq!(next, p.n);
        }
        assert_eq!(MAIN.depth(), 12);
        assert_eq!(BOOTSTRAP.depth(), 10);
        // Regular noise as published: every bin is a full tree of 2^depth leaves.
        for p in [MAIN, BOOTSTRAP] {
            assert_eq!(p.n, p.t << p.depth());
        }
        assert_eq!((MAIN.n, MAIN.base_cots()), (6_225_920, 280_384));
        assert_eq!((BOOTSTRAP.n, BOOTSTRAP.base_cots()), (870_400, 74_036));
        // Each iteration must leave a surplus, and bootstrap must cover main's reserve.
        assert!(MAIN.n > MAIN.base_cots());
        assert!(BOOTSTRAP.n >= MAIN.base_cots());
    }
}
