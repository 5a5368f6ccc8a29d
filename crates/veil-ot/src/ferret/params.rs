//! Regular-noise LPN parameter sets for 128-bit security.
//!
//! * **main** — Ferret (Yang, Weng, Lan, Zhang, Wang, CCS 2020, ePrint 2020/924), parameter
//!   table for primal LPN with regular noise at 128-bit security: n = 10,168,320,
//!   k = 588,160, t = 1,270 (bins of 8,006–8,007 outputs, GGM depth 13).
//! * **bootstrap** — the authors' emp-ot implementation (`emp-ot/ferret/constants.h`,
//!   `N_PRE_REG/K_PRE_REG/T_PRE_REG`): n = 649,728, k = 36,288, t = 1,269 (bins of 512, depth 9).
//!
//! An iteration with parameters (n, k, t) consumes `k + t·depth` COTs and produces n; the
//! bootstrap iteration (fed by IKNP: 47,709 COTs) yields the main iteration's first reserve
//! (604,670 COTs) plus 45,058 spare COTs.

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

/// Main iteration (Ferret's regular-noise table, 128-bit security).
pub const MAIN: LpnParams = LpnParams {
    n: 10_168_320,
    k: 588_160,
    t: 1_270,
};

/// Bootstrap iteration (emp-ot's pre-OT set, 128-bit security).
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
        // Each iteration must leave a surplus, and bootstrap must cover main's reserve.
        assert!(MAIN.n > MAIN.base_cots());
        assert!(BOOTSTRAP.n >= MAIN.base_cots());
    }
}
