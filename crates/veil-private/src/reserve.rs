//! What a server session may hold for its preprocessed inferences: its own budget
//! ([`preprocess_budget`]) and the server's memory shared by all sessions ([`SessionMemory`]),
//! against which [`Reserve`] takes the material's and the silent-OT pools' bytes.

use veil_nonlinear::OtSession;

/// What a server keeps for one session's preprocessed inferences (its masks and triples, and
/// the silent-OT pools filled for them; a BERT-Base inference of 128 tokens needs about 160 MB
/// of material): `VEIL_PREPROCESS_BUDGET_MIB`, 512 MiB when unset. Requests beyond it are
/// refused with a message; the session goes on.
pub fn preprocess_budget() -> usize {
    const DEFAULT_MIB: usize = 512;
    let mib = match std::env::var("VEIL_PREPROCESS_BUDGET_MIB") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                value = v,
                "VEIL_PREPROCESS_BUDGET_MIB is not a number of MiB"
            );
            DEFAULT_MIB
        }),
        Err(_) => DEFAULT_MIB,
    };
    mib << 20
}

/// Where the server's sessions take memory beyond their admitted working set (preprocessed
/// material and filled OT pools): the server's memory for sessions, shared by all of them
/// ([`crate::server`]), so preprocessing cannot push a server past it.
pub(crate) trait SessionMemory {
    /// Takes `bytes` if they are free now (never waits); whether it did.
    fn take(&self, bytes: u64) -> bool;
    /// Gives back bytes taken.
    fn give(&self, bytes: u64);
}

/// No memory shared with other sessions (one session, as in tests and `veil demo`): only the
/// session's own preprocessing budget applies.
pub(crate) struct UnsharedMemory;

impl SessionMemory for UnsharedMemory {
    fn take(&self, _bytes: u64) -> bool {
        true
    }

    fn give(&self, _bytes: u64) {}
}

/// What a server session holds for its preprocessed inferences: the material's bytes and the OT
/// pools' (against its [`preprocess_budget`], and taken from the server's [`SessionMemory`]),
/// and the COTs reserved for the preprocessed inferences not yet run (in each one's busier
/// direction: one party's sending count is the other's receiving count;
/// [`crate::pool_size::CotCounts`] knows them from the shape). Preprocessing fills both
/// parties' pools to the reservation (the server names the size), as far as the budget's rest
/// allows, so the online phase refills only when the budget is spent; its refills are reported
/// as "OT refill". Everything taken is given back when the session ends, however it ends.
pub(crate) struct Reserve<'a> {
    memory: &'a dyn SessionMemory,
    budget: usize,
    /// Material bytes of the preprocessed inferences not yet run.
    held: usize,
    /// Bytes of the pools as filled so far (they do not shrink during the session).
    pools: usize,
    reserved: u64,
}

impl<'a> Reserve<'a> {
    pub(crate) fn new(budget: usize, memory: &'a dyn SessionMemory) -> Self {
        Reserve {
            memory,
            budget,
            held: 0,
            pools: 0,
            reserved: 0,
        }
    }

    /// The bytes held now: material and pools.
    pub(crate) fn bytes(&self) -> usize {
        self.held + self.pools
    }

    /// Whether this session's budget has room for `bytes` more material (checked before the
    /// inference's COT count is worked out, which may take a while the first time).
    pub(crate) fn room_for(&self, bytes: usize) -> std::result::Result<(), String> {
        if self.held + self.pools + bytes > self.budget {
            return Err(format!(
                "this preprocessing needs {} MiB, and this session holds {} MiB of its {} MiB: \
                 use what is preprocessed first",
                bytes >> 20,
                (self.held + self.pools) >> 20,
                self.budget >> 20
            ));
        }
        Ok(())
    }

    /// Takes one inference drawing `cots` with `bytes` of server material; returns the pool size
    /// to precompute, or why it cannot. `pool_bytes(fill)`: the bytes the pools need to hold
    /// `fill` COTs ready ([`OtSession::pool_bytes_for`]), nondecreasing in `fill`, 0 at 0.
    pub(crate) fn take(
        &mut self,
        cots: u64,
        bytes: usize,
        pool_bytes: impl Fn(usize) -> usize,
    ) -> std::result::Result<usize, String> {
        let mib = |b: usize| b >> 20;
        self.room_for(bytes)?;
        let reserved = self.reserved + cots;
        let room = self.budget - self.held - bytes;
        let fits = |fill: usize| pool_bytes(fill) <= room;
        let mut fill = reserved.min(OtSession::MAX_PRECOMPUTE as u64) as usize;
        if !fits(fill) {
            // The largest fill whose pools fit (pool_bytes(0) = 0 always does).
            let (mut lo, mut hi) = (0, fill);
            while lo < hi {
                let mid = hi - (hi - lo) / 2;
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            fill = lo;
        }
        let pools = self.pools.max(pool_bytes(fill));
        let more = bytes + (pools - self.pools);
        if !self.memory.take(more as u64) {
            return Err(format!(
                "this preprocessing needs {} MiB, and the server's session memory is in use by \
                 other sessions: try again later",
                mib(more)
            ));
        }
        (self.held, self.pools, self.reserved) = (self.held + bytes, pools, reserved);
        Ok(fill)
    }

    /// The inference that used material taken with (`cots`, `bytes`) ran.
    pub(crate) fn ran(&mut self, (cots, bytes): (u64, usize)) {
        self.reserved -= cots;
        self.held -= bytes;
        self.memory.give(bytes as u64);
    }
}

impl Drop for Reserve<'_> {
    fn drop(&mut self) {
        self.memory.give((self.held + self.pools) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Preprocessing charges the pools' memory as the pools will hold it, with the fill cut to
    /// what the budget's rest can hold.
    #[test]
    fn preprocessing_charges_what_the_pools_hold() {
        // Pools that hold 1,000 COTs in 4,000 bytes (an iteration in seed form).
        let pool_bytes = |f: usize| f.div_ceil(1_000) * 4_000;
        let mut r = Reserve::new(100 + 12_000, &UnsharedMemory);
        assert_eq!(r.take(800, 100, pool_bytes), Ok(800));
        assert_eq!(r.pools, 4_000);
        assert_eq!(r.take(800, 0, pool_bytes), Ok(1_600));
        assert_eq!(r.pools, 8_000);
        assert_eq!(r.take(800, 0, pool_bytes), Ok(2_400));
        assert_eq!(r.pools, 12_000);
        // 3,200 would need 16,000 bytes of pool: the fill is cut to the 3,000 that fit.
        assert_eq!(r.take(800, 0, pool_bytes), Ok(3_000));
        assert_eq!(r.pools, 12_000);
        // Material beyond the budget is refused before anything else.
        assert!(r
            .room_for(1)
            .unwrap_err()
            .contains("use what is preprocessed first"));
    }
}
