//! What a server session may hold for its preprocessed inferences: its own budget
//! ([`preprocess_budget`]) and the server's memory shared by all sessions ([`SessionMemory`]),
//! against which [`Reserve`] takes the material's and the silent-OT pools' bytes.

use veil_nonlinear::OtSession;

use crate::pool_size::Draw;
use crate::protocol::PoolFill;

/// What a server keeps for one session's preprocessed inferences (its masks and triples, and
/// the silent-OT pools filled for them): `VEIL_PREPROCESS_BUDGET_MIB`, 1024 MiB when unset, so
/// that a BERT-Base inference of 128 tokens (160 MB of material, 0.53 GB of its COTs in seed
/// form) runs its online phase without refilling. Requests beyond it are refused with a
/// message; the session goes on.
pub fn preprocess_budget() -> usize {
    const DEFAULT_MIB: usize = 1024;
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
/// and the COTs reserved for the preprocessed inferences not yet run, per direction
/// (the server's sending and receiving: one party's sending count is the other's receiving
/// count; [`crate::pool_size::CotCounts`] knows them from the shape). Preprocessing refills
/// both parties' pools to the reservation in seed form and builds the first COTs ahead
/// ([`PoolFill`], named by the server), as far as the budget's rest allows, so the online phase
/// refills only when the budget is spent; its refills are reported as "OT refill". Everything
/// taken is given back when the session ends, however it ends.
pub(crate) struct Reserve<'a> {
    memory: &'a dyn SessionMemory,
    budget: usize,
    /// Material bytes of the preprocessed inferences not yet run.
    held: usize,
    /// Bytes of the pools as filled so far (they do not shrink during the session).
    pools: usize,
    reserved: Draw,
}

impl<'a> Reserve<'a> {
    pub(crate) fn new(budget: usize, memory: &'a dyn SessionMemory) -> Self {
        Reserve {
            memory,
            budget,
            held: 0,
            pools: 0,
            reserved: (0, 0),
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

    /// Takes one inference drawing `cots` (the server's sending, receiving) with `bytes` of
    /// server material; returns how far to fill the pools, or why it cannot. `pool_bytes(ready,
    /// built)`: the bytes the pools need to hold `ready` COTs in seed form with `built` of them
    /// built ahead ([`OtSession::pool_bytes_for_ready`]), nondecreasing in both, 0 at 0. The
    /// refill covers the reservation first (a fifteenth of the bytes a COT built ahead takes),
    /// then as many as the rest holds are built ahead in both directions (the quieter one
    /// refilled further when that takes more than it draws, as `pool_bytes` counts).
    pub(crate) fn take(
        &mut self,
        cots: Draw,
        bytes: usize,
        pool_bytes: impl Fn((usize, usize), usize) -> usize,
    ) -> std::result::Result<PoolFill, String> {
        let mib = |b: usize| b >> 20;
        self.room_for(bytes)?;
        let reserved = (self.reserved.0 + cots.0, self.reserved.1 + cots.1);
        let room = self.budget - self.held - bytes;
        let cap = |c: u64| c.min(OtSession::MAX_READY as u64) as usize;
        let want = (cap(reserved.0), cap(reserved.1));
        let ready_up_to = |limit: usize| (want.0.min(limit), want.1.min(limit));
        let limit = largest(want.0.max(want.1), |l| {
            pool_bytes(ready_up_to(l), 0) <= room
        });
        let ready = ready_up_to(limit);
        let most = ready.0.max(ready.1).min(OtSession::MAX_PRECOMPUTE);
        let built = largest(most, |b| pool_bytes(ready, b) <= room);
        let pools = self.pools.max(pool_bytes(ready, built));
        let more = bytes + (pools - self.pools);
        if !self.memory.take(more as u64) {
            return Err(format!(
                "this preprocessing needs {} MiB, and the server's session memory is in use by \
                 other sessions: try again later",
                mib(more)
            ));
        }
        (self.held, self.pools, self.reserved) = (self.held + bytes, pools, reserved);
        Ok(PoolFill {
            ready: (ready.0 as u64, ready.1 as u64),
            built: built as u64,
        })
    }

    /// The inference that used material taken with (`cots`, `bytes`) ran.
    pub(crate) fn ran(&mut self, (cots, bytes): (Draw, usize)) {
        self.reserved = (self.reserved.0 - cots.0, self.reserved.1 - cots.1);
        self.held -= bytes;
        self.memory.give(bytes as u64);
    }
}

/// The largest x in 0..=hi with `fits(x)`, for `fits` true at 0 and monotone.
fn largest(hi: usize, fits: impl Fn(usize) -> bool) -> usize {
    if fits(hi) {
        return hi;
    }
    let (mut lo, mut hi) = (0, hi);
    while lo < hi {
        let mid = hi - (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

impl Drop for Reserve<'_> {
    fn drop(&mut self) {
        self.memory.give((self.held + self.pools) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Preprocessing charges the pools' memory as the pools will hold it: each direction
    /// refilled to its reservation in seed form first, then as many built ahead as the
    /// budget's rest holds, both cut to what fits.
    #[test]
    fn preprocessing_charges_what_the_pools_hold() {
        // Pools that hold 1,000 COTs a direction in 4,000 bytes of seed form (building ahead
        // in both directions refills the quieter one further), and 10 bytes a COT built ahead.
        let pool_bytes = |(s, r): (usize, usize), b: usize| {
            (s.max(b).div_ceil(1_000) + r.max(b).div_ceil(1_000)) * 4_000 + b * 10
        };
        let fill = |s: u64, r: u64, built: u64| PoolFill {
            ready: (s, r),
            built,
        };
        let mut r = Reserve::new(100 + 40_000, &UnsharedMemory);
        assert_eq!(r.take((800, 300), 100, pool_bytes), Ok(fill(800, 300, 800)));
        assert_eq!(r.pools, 8_000 + 8_000);
        assert_eq!(
            r.take((800, 300), 0, pool_bytes),
            Ok(fill(1_600, 600, 1_600))
        );
        assert_eq!(r.pools, 16_000 + 16_000);
        // 2,400 and 900 in seed form take 16,000 bytes; the 24,000 left build 2,000 ahead
        // (the quieter direction then holds 2,000).
        assert_eq!(
            r.take((800, 300), 0, pool_bytes),
            Ok(fill(2_400, 900, 2_000))
        );
        assert_eq!(r.pools, 40_000);
        // Beyond the budget: the refill to 7,200 and 2,700 would need 44,000 bytes, so the
        // busier direction is cut to the 7,000 that fit, and no room is left to build ahead.
        assert_eq!(
            r.take((4_800, 1_800), 0, pool_bytes),
            Ok(fill(7_000, 2_700, 0))
        );
        assert_eq!(r.pools, 40_000);
        // Material beyond the budget is refused before anything else.
        assert!(r
            .room_for(1)
            .unwrap_err()
            .contains("use what is preprocessed first"));
        r.ran(((800, 300), 100));
        assert_eq!((r.reserved, r.held), ((6_400, 2_400), 0));
    }
}
