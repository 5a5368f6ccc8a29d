//! [`OtSession`]: one party's end of a bidirectional OT session.
//!
//! Each party holds a COT *sender* pool (for OTs it sends; it knows Δ) and a COT *receiver*
//! pool (for OTs it receives), each fed by its own engine. Every derived flavour consumes random
//! COTs from the front of a pool; both parties consume and refill in lock-step, because refills
//! are a deterministic function of the request size and of the pool level, which are the same on
//! both sides. A refill adds the engine's flights (IKNP: one flight receiver → sender; silent
//! COT: see [`crate::ferret`]) before the call's own flights, reported as the cost class
//! [`REFILL_CLASS`].
//!
//! Every consumed COT has a per-direction index that both parties know; flavours derive their
//! hash tweaks from it, so no tweak is ever reused within a session.

use veil_core::{ensure, Prg, Result};
use veil_net::{Channel, Role};
use zeroize::{Zeroize, Zeroizing};

use crate::ferret::table::PoolBuf;
use crate::ferret::{FerretReceiver, FerretSender};
use crate::iknp::{IknpReceiver, IknpSender};

/// Which extension produces the COTs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// IKNP: 128 bits of traffic per COT, no set-up beyond 128 base OTs; refills by the
    /// amount needed (at least 2^16), one flight each.
    Iknp,
    /// Ferret silent COT (bootstrapped from IKNP): under 0.5 bit per COT; refills by one main
    /// iteration (5,945,536 COTs, one flight). Set-up costs one bootstrap iteration.
    Silent,
}

/// IKNP refills by at least this many COTs, so small calls do not each pay a flight.
const IKNP_MIN_REFILL: usize = 1 << 16;

/// The cost-report class of pool refills: traffic every operator shares, reported on its own
/// line rather than charged to whichever operator happened to drain a pool.
pub const REFILL_CLASS: &str = "OT refill";

/// Upper bound on COTs requested in one call (bounds allocations from caller mistakes).
pub const MAX_COTS_PER_CALL: usize = 1 << 26;

enum SendEngine {
    Iknp(IknpSender),
    Silent(Box<FerretSender>),
}

enum RecvEngine {
    Iknp(IknpReceiver),
    Silent(Box<FerretReceiver>),
}

/// COTs this party sends: `q_i`, with the receiver holding `q_i ⊕ r_i·Δ`. The unconsumed ones
/// are `q[pos..end]`.
struct SenderPool {
    engine: SendEngine,
    delta: u128,
    q: PoolBuf<u128>,
    pos: usize,
    end: usize,
    consumed: u64,
}

/// COTs this party receives: choice bits `r_i` and `t_i = q_i ⊕ r_i·Δ`.
/// The unconsumed ones are `t[pos..end]`, `bits[pos..end]`.
struct ReceiverPool {
    engine: RecvEngine,
    t: PoolBuf<u128>,
    bits: PoolBuf<u8>,
    pos: usize,
    end: usize,
    consumed: u64,
    prg: Prg,
}

/// A run of random COTs handed to a flavour (sender side).
pub(crate) struct SenderBatch<'a> {
    pub delta: u128,
    pub q: &'a [u128],
    /// Session-wide index of `q[0]` in this direction (hash tweak base).
    pub index: u64,
}

/// A run of random COTs handed to a flavour (receiver side).
pub(crate) struct ReceiverBatch<'a> {
    pub t: &'a [u128],
    pub bits: &'a [u8],
    pub index: u64,
}

fn refill_size(available: usize, need: usize) -> usize {
    (need - available).max(IKNP_MIN_REFILL)
}

/// Capacity of a silent pool buffer that must hold `need` COTs: the iteration plus room for a
/// leftover of a quarter iteration, so calls of up to ~1.5 M OTs never grow the buffer a second
/// time, and at least `need` plus two iterations (the first iteration's place and the last
/// appended one), so a call needing several iterations grows it once, not at every iteration (each fresh buffer costs the kernel page clearing: ~0.1 s per
/// 100 MB).
fn silent_capacity(iteration_len: usize, need: usize) -> usize {
    (iteration_len + iteration_len / 4).max(need + 2 * iteration_len)
}

/// Capacity of a grown IKNP pool buffer (geometric growth: repeated refills rarely allocate).
fn iknp_capacity(len: usize) -> usize {
    2 * len
}

/// The COTs a pool holding `available` may hold after it is made to hold `need`: `need` when
/// it already does (nothing is allocated), else the capacity its refill gives the new buffer
/// (`iteration`: the silent engine's iteration length; `None` for IKNP).
fn capacity_after(available: usize, need: usize, iteration: Option<usize>) -> usize {
    match iteration {
        _ if need <= available => need,
        Some(n) => silent_capacity(n, need),
        None => iknp_capacity(available + refill_size(available, need)),
    }
}

impl SenderPool {
    fn setup<C: Channel>(ch: &mut C, backend: Backend) -> Result<Self> {
        let mut iknp = IknpSender::setup(ch)?;
        let delta = iknp.delta();
        let (engine, q, pos) = match backend {
            Backend::Iknp => (SendEngine::Iknp(iknp), Vec::new(), 0),
            Backend::Silent => {
                let (ferret, q, start) = FerretSender::setup(ch, &mut iknp)?;
                (SendEngine::Silent(Box::new(ferret)), q, start)
            }
        };
        Ok(SenderPool {
            engine,
            delta,
            end: q.len(),
            q: PoolBuf::from_vec(q),
            pos,
            consumed: 0,
        })
    }

    fn available(&self) -> usize {
        self.end - self.pos
    }

    /// The COTs this pool may hold after `ensure(need)` (see [`capacity_after`]).
    fn capacity_after(&self, need: usize) -> usize {
        let iteration = match &self.engine {
            SendEngine::Iknp(_) => None,
            SendEngine::Silent(e) => Some(e.iteration_len()),
        };
        capacity_after(self.available(), need, iteration)
    }

    fn ensure<C: Channel>(&mut self, ch: &mut C, need: usize) -> Result<()> {
        if self.available() >= need {
            return Ok(());
        }
        let _g = ch.meter().enter_class(REFILL_CLASS);
        match &mut self.engine {
            SendEngine::Iknp(e) => {
                let left = self.end - self.pos;
                let more = Zeroizing::new(e.extend(ch, refill_size(left, need))?);
                let len = left + more.len();
                let live = self.pos..self.end;
                let out = self.q.make_room(live, 0, len, iknp_capacity(len));
                out[left..].copy_from_slice(&more);
                (self.pos, self.end) = (0, len);
            }
            SendEngine::Silent(e) => {
                let (n, cap) = (e.iteration_len(), silent_capacity(e.iteration_len(), need));
                let mut first = true;
                while self.end - self.pos < need {
                    let live = self.pos..self.end;
                    let start = if first {
                        // The leftover moves behind the iteration's place in the same buffer,
                        // the iteration overwrites the consumed COTs, and its usable part
                        // followed by the leftover is the new pool (both parties lay it out the
                        // same way).
                        let left = live.len();
                        let out = self.q.make_room(live, n, n + left, cap);
                        (self.pos, self.end) = (n, n + left);
                        e.extend_into(ch, &mut out[..n])?
                    } else {
                        // Further iterations of one refill are appended, their usable part
                        // moved down over their reserve prefix: each COT is copied once, so a
                        // large preprocessing pool costs linear, not quadratic, copying.
                        let end = self.end;
                        let out = self.q.make_room(live.clone(), live.start, end + n, cap);
                        let start = e.extend_into(ch, &mut out[end..end + n])?;
                        out.copy_within(end + start..end + n, end);
                        self.end = end + n - start;
                        start
                    };
                    assert_eq!(start, e.reserve_len(), "silent OT reserve length");
                    if first {
                        self.pos = start;
                    }
                    first = false;
                }
            }
        }
        Ok(())
    }

    fn take<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<SenderBatch<'_>> {
        ensure!(
            n <= MAX_COTS_PER_CALL,
            InvalidArgument,
            "{n} OTs in one call exceed {MAX_COTS_PER_CALL}"
        );
        self.ensure(ch, n)?;
        let start = self.pos;
        self.pos += n;
        let index = self.consumed;
        self.consumed += n as u64;
        Ok(SenderBatch {
            delta: self.delta,
            q: &self.q.as_slice()[start..start + n],
            index,
        })
    }
}

impl ReceiverPool {
    fn setup<C: Channel>(ch: &mut C, backend: Backend) -> Result<Self> {
        let mut iknp = IknpReceiver::setup(ch)?;
        let (engine, t, bits, pos) = match backend {
            Backend::Iknp => (RecvEngine::Iknp(iknp), Vec::new(), Vec::new(), 0),
            Backend::Silent => {
                let (ferret, t, bits, start) = FerretReceiver::setup(ch, &mut iknp)?;
                (RecvEngine::Silent(Box::new(ferret)), t, bits, start)
            }
        };
        Ok(ReceiverPool {
            engine,
            end: t.len(),
            t: PoolBuf::from_vec(t),
            bits: PoolBuf::from_vec(bits),
            pos,
            consumed: 0,
            prg: Prg::from_os_entropy(),
        })
    }

    fn available(&self) -> usize {
        self.end - self.pos
    }

    /// The COTs this pool may hold after `ensure(need)` (see [`capacity_after`]).
    fn capacity_after(&self, need: usize) -> usize {
        let iteration = match &self.engine {
            RecvEngine::Iknp(_) => None,
            RecvEngine::Silent(e) => Some(e.iteration_len()),
        };
        capacity_after(self.available(), need, iteration)
    }

    fn ensure<C: Channel>(&mut self, ch: &mut C, need: usize) -> Result<()> {
        if self.available() >= need {
            return Ok(());
        }
        let _g = ch.meter().enter_class(REFILL_CLASS);
        match &mut self.engine {
            RecvEngine::Iknp(e) => {
                let left = self.end - self.pos;
                let m = refill_size(left, need);
                let choices: Zeroizing<Vec<u8>> =
                    Zeroizing::new((0..m).map(|_| self.prg.bit() as u8).collect());
                let more = Zeroizing::new(e.extend(ch, &choices)?);
                let (len, live) = (left + m, self.pos..self.end);
                let t = self.t.make_room(live.clone(), 0, len, iknp_capacity(len));
                t[left..].copy_from_slice(&more);
                let bits = self.bits.make_room(live, 0, len, iknp_capacity(len));
                bits[left..].copy_from_slice(&choices);
                (self.pos, self.end) = (0, len);
            }
            RecvEngine::Silent(e) => {
                let (n, cap) = (e.iteration_len(), silent_capacity(e.iteration_len(), need));
                let mut first = true;
                while self.end - self.pos < need {
                    // As for the sender, with the choice bits alongside.
                    let live = self.pos..self.end;
                    let start = if first {
                        let left = live.len();
                        let t = self.t.make_room(live.clone(), n, n + left, cap);
                        let bits = self.bits.make_room(live, n, n + left, cap);
                        (self.pos, self.end) = (n, n + left);
                        e.extend_into(ch, &mut t[..n], &mut bits[..n])?
                    } else {
                        let end = self.end;
                        let t = self.t.make_room(live.clone(), live.start, end + n, cap);
                        let bits = self.bits.make_room(live.clone(), live.start, end + n, cap);
                        let start =
                            e.extend_into(ch, &mut t[end..end + n], &mut bits[end..end + n])?;
                        t.copy_within(end + start..end + n, end);
                        bits.copy_within(end + start..end + n, end);
                        self.end = end + n - start;
                        start
                    };
                    assert_eq!(start, e.reserve_len(), "silent OT reserve length");
                    if first {
                        self.pos = start;
                    }
                    first = false;
                }
            }
        }
        Ok(())
    }

    fn take<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<ReceiverBatch<'_>> {
        ensure!(
            n <= MAX_COTS_PER_CALL,
            InvalidArgument,
            "{n} OTs in one call exceed {MAX_COTS_PER_CALL}"
        );
        self.ensure(ch, n)?;
        let start = self.pos;
        self.pos += n;
        let index = self.consumed;
        self.consumed += n as u64;
        Ok(ReceiverBatch {
            t: &self.t.as_slice()[start..start + n],
            bits: &self.bits.as_slice()[start..start + n],
            index,
        })
    }
}

/// The pool buffers wipe themselves ([`PoolBuf`]).
impl Drop for SenderPool {
    fn drop(&mut self) {
        self.delta.zeroize();
    }
}

/// One party's end of an OT session with the peer (see the module doc).
pub struct OtSession {
    role: Role,
    sender: SenderPool,
    receiver: ReceiverPool,
}

impl OtSession {
    /// Sets up both directions with the default backend, silent COT. Both parties call this at
    /// the same time. Flights: 2 base-OT flights, 1 IKNP flight and 3 bootstrap flights per
    /// direction.
    pub fn setup<C: Channel>(ch: &mut C, role: Role) -> Result<OtSession> {
        Self::setup_with(ch, role, Backend::Silent)
    }

    /// Sets up both directions with an explicit backend (both parties must pick the same).
    /// The server's sending direction is set up first.
    pub fn setup_with<C: Channel>(ch: &mut C, role: Role, backend: Backend) -> Result<OtSession> {
        let (sender, receiver) = match role {
            Role::Server => {
                let s = SenderPool::setup(ch, backend)?;
                (s, ReceiverPool::setup(ch, backend)?)
            }
            Role::Client => {
                let r = ReceiverPool::setup(ch, backend)?;
                (SenderPool::setup(ch, backend)?, r)
            }
        };
        Ok(OtSession {
            role,
            sender,
            receiver,
        })
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The most COTs one [`OtSession::precompute`] (or one call) may ask for.
    pub const MAX_PRECOMPUTE: usize = MAX_COTS_PER_CALL;

    /// Pre-generates at least `n` COTs in each direction (offline phase), so later calls only
    /// consume. Flights: those of the refills, server's sending direction first.
    pub fn precompute<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<()> {
        ensure!(
            n <= MAX_COTS_PER_CALL,
            InvalidArgument,
            "precompute({n}) exceeds {MAX_COTS_PER_CALL}"
        );
        match self.role {
            Role::Server => {
                self.sender.ensure(ch, n)?;
                self.receiver.ensure(ch, n)
            }
            Role::Client => {
                self.receiver.ensure(ch, n)?;
                self.sender.ensure(ch, n)
            }
        }
    }

    /// COTs ready in (sending, receiving) direction.
    pub fn available(&self) -> (usize, usize) {
        (self.sender.available(), self.receiver.available())
    }

    /// The COTs the larger pool may hold after [`OtSession::precompute`]`(n)`: `n` when both
    /// already hold that many, else what a growing pool allocates (its refill's iterations
    /// beside the leftover), so preprocessing budgets the memory it really takes.
    pub fn pool_capacity_after(&self, n: usize) -> usize {
        self.sender
            .capacity_after(n)
            .max(self.receiver.capacity_after(n))
    }

    /// COTs used so far in (sending, receiving) direction: one party's sending count is the
    /// other's receiving count, so both can size a later [`OtSession::precompute`] alike.
    pub fn consumed(&self) -> (u64, u64) {
        (self.sender.consumed, self.receiver.consumed)
    }

    pub(crate) fn take_send<C: Channel>(
        &mut self,
        ch: &mut C,
        n: usize,
    ) -> Result<SenderBatch<'_>> {
        self.sender.take(ch, n)
    }

    pub(crate) fn take_recv<C: Channel>(
        &mut self,
        ch: &mut C,
        n: usize,
    ) -> Result<ReceiverBatch<'_>> {
        self.receiver.take(ch, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool that holds the need allocates nothing; a growing silent pool gets the need and
    /// two iterations (at least 1.25 of one), an IKNP pool twice what its refill leaves.
    #[test]
    fn the_capacity_after_a_refill_is_what_the_refill_allocates() {
        assert_eq!(capacity_after(500, 500, Some(1_000)), 500);
        assert_eq!(capacity_after(0, 1, Some(1_000)), 2_001);
        assert_eq!(capacity_after(10, 5_000, Some(1_000)), 7_000);
        assert_eq!(capacity_after(0, 10, None), 2 * IKNP_MIN_REFILL);
        assert_eq!(capacity_after(10, 1 << 20, None), 2 << 20);
    }
}
