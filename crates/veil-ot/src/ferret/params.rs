//! Regular-noise LPN parameter sets for 128-bit security (LPN over F_2, D = 10 non-zeros per
//! row of the public matrix, noise with exactly one 1 per bin).
//!
//! Both sets come from one file, the Ferret authors' implementation:
//! `emp-toolkit/emp-ot`, `emp-ot/ferret/constants.h`, as introduced in commit c19691e
//! ("Deal with parameters", 2020-09-28) and unchanged up to 3b21d63 (2021-05-24):
//! * **main** — `N_REG/K_REG/T_REG/BIN_SZ_REG`: n = 10,608,640, k = 589,824, t = 1,295,
//!   bins of 2^13 = 8,192 outputs (n = t·2^13 exactly, full GGM trees of depth 13);
//! * **bootstrap** — `N_PRE_REG/K_PRE_REG/T_PRE_REG/BIN_SZ_PRE_REG`: n = 649,728,
//!   k = 36,288, t = 1,269, bins of 2^9 = 512 (depth 9).
//!
//! Not used, and why: the sets with k = 588,160 (e.g. n = 10,616,092, t = 1,324, which mpz's
//! `mpz-ot-core/src/ferret/mod.rs` cites as Ferret's Table 2) are for *uniform* (exact)
//! noise; regular noise needs its own set. The set (n = 10,805,248, k = 589,760, t = 1,319),
//! also in Wolverine and swanky (`ocelot/src/svole/svole_ext/lpn_params.rs`,
//! `LPN_EXTEND_LARGE` in `ocelot/src/svole/wykw/svole.rs`), is emp-ot's first Ferret main set
//! (commit 66567cf, 2020-09-05, with the same bootstrap set); the Ferret authors replaced it by
//! the one above in c19691e, so this crate follows their later choice. Both are regular-noise
//! sets published for 128-bit security and both bootstrap from the same set.
//!
//! Cross-check against later attacks (an indication, not an estimate for this exact set):
//! emp-ot's commit 7a7e8c7 (2026, `emp-ot/ot_extension/ferret/constants.h`) reports, with the
//! regular-LPN estimator and the hybrid / ISD / algebraic attacks, 138.5 bits for k = 2^19,
//! t = 1,280, n = 10,485,760; the main set here has a larger k (security grows with k) and
//! an n only 1.2% larger (the binding hybrid attack gets easier as n grows at fixed k).
//!
//! An iteration with parameters (n, k, t) consumes `k + t·depth` COTs and produces n: the
//! main iteration needs 589,824 + 1,295·13 = 606,659 (emp-ot adds 128 more for the malicious
//! consistency check, which this semi-honest version omits) and hands out 10,001,981; the
//! bootstrap iteration (fed by IKNP: 36,288 + 1,269·9 = 47,709 COTs) yields the main
//! iteration's first reserve plus 43,069 spare COTs.

/// One LPN parameter set with regular noise: n outputs split into t bins, one noise bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LpnParams {
    /// Number of output COTs (LPN samples).
    pub n: usize,
    /// LPN secret length (COTs consumed by the LPN step).
    pub k: usize,
    /// Noise weight = number of bins = number of GGM trees.
    pub t: usize,
}

/// Main iteration (emp-ot `N_REG/K_REG/T_REG`, regular noise, 128-bit security).
pub const MAIN: LpnParams = LpnParams {
    n: 10_608_640,
    k: 589_824,
    t: 1_295,
};

/// Bootstrap iteration (emp-ot `N_PRE_REG/K_PRE_REG/T_PRE_REG`, regular noise, 128-bit).
pub const BOOTSTRAP: LpnParams = LpnParams {
    n: 649_728,
    k: 36_288,
    t: 1_269,
};

impl LpnParams {
    /// Output range `[start, start + len)` of bin `i`: bins differ in size by at most one.
    pub fn bin(&self, i: usize) -> (usize, usize) {
        let start = i * self.n / self.t;
        (start, (i + 1) * self.n / self.t - start)
    }

    /// GGM tree depth: enough leaves for the largest bin.
    pub fn depth(&self) -> usize {
        let largest = self.n.div_ceil(self.t);
        largest.next_power_of_two().trailing_zeros() as usize
    }

    /// COTs one iteration consumes: k for LPN, one per tree level for the SPCOTs.
    pub fn base_cots(&self) -> usize {
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
        assert_eq!(MAIN.depth(), 13);
        assert_eq!(BOOTSTRAP.depth(), 9);
        // Regular noise as published: every bin is a full tree of 2^depth leaves.
        for p in [MAIN, BOOTSTRAP] {
            assert_eq!(p.n, p.t << p.depth());
        }
        assert_eq!(MAIN.base_cots(), 606_659);
        assert_eq!(BOOTSTRAP.base_cots(), 47_709);
        // Each iteration must leave a surplus, and bootstrap must cover main's reserve.
        assert!(MAIN.n > MAIN.base_cots());
        assert!(BOOTSTRAP.n >= MAIN.base_cots());
    }
}
