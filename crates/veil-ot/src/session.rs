//! [`OtSession`]: one party's end of a bidirectional OT session.
//!
//! Each party holds a COT *sender* pool (for OTs it sends; it knows Δ) and a COT *receiver*
//! pool (for OTs it receives), each fed by its own engine. Every derived flavour consumes random
//! COTs from the front of a pool; both parties consume and refill in lock-step, because refills
//! are a deterministic function of the request size and of the pool level, which are the same on
//! both sides. A refill adds the engine's flights (IKNP: one flight receiver → sender; silent
//! COT: see [`crate::ferret`]) before the call's own flights, reported as the cost class
//! [`CostClass::OtRefill`]: traffic every operator shares, reported on its own line rather than
//! charged to whichever operator happened to drain a pool.
//!
//! Every consumed COT has a per-direction index that both parties know; flavours derive their
//! hash tweaks from it, so no tweak is ever reused within a session.

use std::ops::Range;

use veil_core::{ensure, CostClass, Prg, Result};
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

/// Upper bound on COTs requested in one call (bounds allocations from caller mistakes).
pub(crate) const MAX_COTS_PER_CALL: usize = 1 << 26;

/// One direction's engine: IKNP, or silent COT bootstrapped from it.
enum Engine<I, S> {
    Iknp(I),
    Silent(Box<S>),
}

/// Where a silent refill puts a pool's entries: the `live` ones move to `at` in buffers of
/// `len` (a new one of at least `cap` when they grow).
struct Room {
    live: Range<usize>,
    at: usize,
    len: usize,
    cap: usize,
}

/// One direction's COT storage, and how each engine writes into it: the sender's `q`, or the
/// receiver's `t` with its choice bits. The refill logic ([`Pool::ensure`]) is the same for both.
trait Lanes {
    type Iknp;
    type Silent;

    /// IKNP: extends by `m` COTs and stores them after the `live` ones, which move to the front.
    fn iknp_refill<C: Channel>(
        &mut self,
        e: &mut Self::Iknp,
        ch: &mut C,
        live: Range<usize>,
        m: usize,
    ) -> Result<()>;

    /// Silent: makes `room`, then runs one iteration into `slot`; returns its reserve prefix
    /// length.
    fn silent_iteration<C: Channel>(
        &mut self,
        e: &mut Self::Silent,
        ch: &mut C,
        room: Room,
        slot: Range<usize>,
    ) -> Result<usize>;

    /// Moves the entries `src` down to `dest`.
    fn copy_within(&mut self, src: Range<usize>, dest: usize);

    /// The silent engine's iteration length and reserve prefix length.
    fn silent_lens(e: &Self::Silent) -> (usize, usize);

    /// Bytes of the entries the buffers have written (see [`OtSession::pool_bytes`]).
    fn written_bytes(&self) -> usize;
}

/// COTs this party sends: `q_i`, with the receiver holding `q_i ⊕ r_i·Δ`.
struct Sending {
    delta: u128,
    q: PoolBuf<u128>,
}

/// COTs this party receives: choice bits `r_i` and `t_i = q_i ⊕ r_i·Δ`; `prg` draws the IKNP
/// engine's choices.
struct Receiving {
    t: PoolBuf<u128>,
    bits: PoolBuf<u8>,
    prg: Prg,
}

/// A pool of one direction: the unconsumed COTs are entries `pos..end` of its lanes.
struct Pool<L: Lanes> {
    engine: Engine<L::Iknp, L::Silent>,
    lanes: L,
    pos: usize,
    end: usize,
    consumed: u64,
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
/// appended one), so a call needing several iterations grows it once, not at every iteration
/// (each fresh buffer costs the kernel's page clearing).
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

impl Lanes for Sending {
    type Iknp = IknpSender;
    type Silent = FerretSender;

    fn iknp_refill<C: Channel>(
        &mut self,
        e: &mut IknpSender,
        ch: &mut C,
        live: Range<usize>,
        m: usize,
    ) -> Result<()> {
        let left = live.len();
        let more = Zeroizing::new(e.extend(ch, m)?);
        let len = left + more.len();
        let out = self.q.make_room(live, 0, len, iknp_capacity(len));
        out[left..].copy_from_slice(&more);
        Ok(())
    }

    fn silent_iteration<C: Channel>(
        &mut self,
        e: &mut FerretSender,
        ch: &mut C,
        room: Room,
        slot: Range<usize>,
    ) -> Result<usize> {
        let out = self.q.make_room(room.live, room.at, room.len, room.cap);
        e.extend_into(ch, &mut out[slot])
    }

    fn copy_within(&mut self, src: Range<usize>, dest: usize) {
        self.q.copy_within(src, dest);
    }

    fn silent_lens(e: &FerretSender) -> (usize, usize) {
        (e.iteration_len(), e.reserve_len())
    }

    fn written_bytes(&self) -> usize {
        self.q.written_bytes()
    }
}

impl Lanes for Receiving {
    type Iknp = IknpReceiver;
    type Silent = FerretReceiver;

    fn iknp_refill<C: Channel>(
        &mut self,
        e: &mut IknpReceiver,
        ch: &mut C,
        live: Range<usize>,
        m: usize,
    ) -> Result<()> {
        let left = live.len();
        let choices: Zeroizing<Vec<u8>> =
            Zeroizing::new((0..m).map(|_| self.prg.bit() as u8).collect());
        let more = Zeroizing::new(e.extend(ch, &choices)?);
        let len = left + m;
        let t = self.t.make_room(live.clone(), 0, len, iknp_capacity(len));
        t[left..].copy_from_slice(&more);
        let bits = self.bits.make_room(live, 0, len, iknp_capacity(len));
        bits[left..].copy_from_slice(&choices);
        Ok(())
    }

    fn silent_iteration<C: Channel>(
        &mut self,
        e: &mut FerretReceiver,
        ch: &mut C,
        room: Room,
        slot: Range<usize>,
    ) -> Result<usize> {
        let Room { live, at, len, cap } = room;
        let t = self.t.make_room(live.clone(), at, len, cap);
        let bits = self.bits.make_room(live, at, len, cap);
        e.extend_into(ch, &mut t[slot.clone()], &mut bits[slot])
    }

    fn copy_within(&mut self, src: Range<usize>, dest: usize) {
        self.t.copy_within(src.clone(), dest);
        self.bits.copy_within(src, dest);
    }

    fn silent_lens(e: &FerretReceiver) -> (usize, usize) {
        (e.iteration_len(), e.reserve_len())
    }

    fn written_bytes(&self) -> usize {
        self.t.written_bytes() + self.bits.written_bytes()
    }
}

impl<L: Lanes> Pool<L> {
    fn new(engine: Engine<L::Iknp, L::Silent>, lanes: L, pos: usize, end: usize) -> Self {
        Pool {
            engine,
            lanes,
            pos,
            end,
            consumed: 0,
        }
    }

    fn available(&self) -> usize {
        self.end - self.pos
    }

    /// The COTs this pool may hold after `ensure(need)` (see [`capacity_after`]).
    fn capacity_after(&self, need: usize) -> usize {
        let iteration = match &self.engine {
            Engine::Iknp(_) => None,
            Engine::Silent(e) => Some(L::silent_lens(e).0),
        };
        capacity_after(self.available(), need, iteration)
    }

    /// Refills until the pool holds `need` COTs (both parties run the same refills).
    fn ensure<C: Channel>(&mut self, ch: &mut C, need: usize) -> Result<()> {
        if self.available() >= need {
            return Ok(());
        }
        let _g = ch.meter().enter_class(CostClass::OtRefill);
        let left = self.available();
        match &mut self.engine {
            Engine::Iknp(e) => {
                let m = refill_size(left, need);
                self.lanes.iknp_refill(e, ch, self.pos..self.end, m)?;
                (self.pos, self.end) = (0, left + m);
            }
            Engine::Silent(e) => {
                let (n, reserve) = L::silent_lens(e);
                let cap = silent_capacity(n, need);
                let mut first = true;
                while self.end - self.pos < need {
                    let live = self.pos..self.end;
                    let start = if first {
                        // The leftover moves behind the iteration's place in the same buffer,
                        // the iteration overwrites the consumed COTs, and its usable part
                        // followed by the leftover is the new pool (both parties lay it out the
                        // same way).
                        let left = live.len();
                        (self.pos, self.end) = (n, n + left);
                        let room = Room {
                            live,
                            at: n,
                            len: n + left,
                            cap,
                        };
                        self.lanes.silent_iteration(e, ch, room, 0..n)?
                    } else {
                        // Further iterations of one refill are appended, their usable part
                        // moved down over their reserve prefix: each COT is copied once, so a
                        // large preprocessing pool costs linear, not quadratic, copying.
                        let end = self.end;
                        let room = Room {
                            at: live.start,
                            live,
                            len: end + n,
                            cap,
                        };
                        let start = self.lanes.silent_iteration(e, ch, room, end..end + n)?;
                        self.lanes.copy_within(end + start..end + n, end);
                        self.end = end + n - start;
                        start
                    };
                    assert_eq!(start, reserve, "silent OT reserve length");
                    if first {
                        self.pos = start;
                    }
                    first = false;
                }
            }
        }
        Ok(())
    }

    /// Takes `n` COTs from the front (refilling first when needed): their first entry and their
    /// session-wide index.
    fn take<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<(usize, u64)> {
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
        Ok((start, index))
    }
}

impl Pool<Sending> {
    fn setup<C: Channel>(ch: &mut C, backend: Backend) -> Result<Self> {
        let mut iknp = IknpSender::setup(ch)?;
        let delta = iknp.delta();
        let (engine, q, pos) = match backend {
            Backend::Iknp => (Engine::Iknp(iknp), Vec::new(), 0),
            Backend::Silent => {
                let (ferret, q, start) = FerretSender::setup(ch, &mut iknp)?;
                (Engine::Silent(Box::new(ferret)), q, start)
            }
        };
        let end = q.len();
        let lanes = Sending {
            delta,
            q: PoolBuf::from_vec(q),
        };
        Ok(Pool::new(engine, lanes, pos, end))
    }
}

impl Pool<Receiving> {
    fn setup<C: Channel>(ch: &mut C, backend: Backend) -> Result<Self> {
        let mut iknp = IknpReceiver::setup(ch)?;
        let (engine, t, bits, pos) = match backend {
            Backend::Iknp => (Engine::Iknp(iknp), Vec::new(), Vec::new(), 0),
            Backend::Silent => {
                let (ferret, t, bits, start) = FerretReceiver::setup(ch, &mut iknp)?;
                (Engine::Silent(Box::new(ferret)), t, bits, start)
            }
        };
        let end = t.len();
        let lanes = Receiving {
            t: PoolBuf::from_vec(t),
            bits: PoolBuf::from_vec(bits),
            prg: Prg::from_os_entropy(),
        };
        Ok(Pool::new(engine, lanes, pos, end))
    }
}

/// The pool buffers wipe themselves ([`PoolBuf`]).
impl Drop for Sending {
    fn drop(&mut self) {
        self.delta.zeroize();
    }
}

/// One party's end of an OT session with the peer (see the module doc).
pub struct OtSession {
    role: Role,
    sender: Pool<Sending>,
    receiver: Pool<Receiving>,
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
                let s = Pool::<Sending>::setup(ch, backend)?;
                (s, Pool::<Receiving>::setup(ch, backend)?)
            }
            Role::Client => {
                let r = Pool::<Receiving>::setup(ch, backend)?;
                (Pool::<Sending>::setup(ch, backend)?, r)
            }
        };
        Ok(OtSession {
            role,
            sender,
            receiver,
        })
    }

    /// Which party this is.
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

    /// Bytes the two pools' buffers keep resident: every entry they have written (16 per COT
    /// sent, 17 per COT received). A silent session's first main refill writes one iteration
    /// beside the bootstrap's leftover, 6,815,936 entries per direction (225 MB a party);
    /// [`OtSession::pool_capacity_after`] is the larger allocation, mostly never touched.
    pub fn pool_bytes(&self) -> usize {
        self.sender.lanes.written_bytes() + self.receiver.lanes.written_bytes()
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
        let (start, index) = self.sender.take(ch, n)?;
        let lanes = &self.sender.lanes;
        Ok(SenderBatch {
            delta: lanes.delta,
            q: &lanes.q.as_slice()[start..start + n],
            index,
        })
    }

    pub(crate) fn take_recv<C: Channel>(
        &mut self,
        ch: &mut C,
        n: usize,
    ) -> Result<ReceiverBatch<'_>> {
        let (start, index) = self.receiver.take(ch, n)?;
        let lanes = &self.receiver.lanes;
        Ok(ReceiverBatch {
            t: &lanes.t.as_slice()[start..start + n],
            bits: &lanes.bits.as_slice()[start..start + n],
            index,
        })
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

    /// What a silent session keeps resident: the bootstrap's output, then after the first main
    /// refill one iteration beside the bootstrap's leftover, in each direction, whatever the
    /// (small) need; the estimate of a server session's fixed memory rests on this.
    #[test]
    fn a_silent_session_keeps_one_iteration_and_the_bootstrap_leftover_per_direction() {
        use veil_net::run_two_party;
        let (client, server) = run_two_party(
            |c| {
                let mut s = OtSession::setup(c, Role::Client)?;
                let setup = s.pool_bytes();
                s.precompute(c, s.available().0 + 1)?;
                Ok((setup, s.pool_bytes()))
            },
            |c| {
                let mut s = OtSession::setup(c, Role::Server)?;
                let setup = s.pool_bytes();
                s.precompute(c, s.available().0 + 1)?;
                Ok((setup, s.pool_bytes()))
            },
        )
        .unwrap();
        // The published sets (pinned in `ferret::params`): bootstrap n, main n, main reserve.
        let (boot, main, reserve) = (870_400, 6_225_920, 280_384);
        assert_eq!(server, client);
        assert_eq!(client.0, boot * 33);
        assert_eq!(client.1, (main + boot - reserve) * 33);
        assert_eq!(client.1, 224_925_888);
    }
}
