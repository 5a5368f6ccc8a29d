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
//! A silent pool keeps its iterations in seed form and builds a call's COTs from them into a
//! window as large as the largest call, so a party keeps about 30 MB (the engines' reserves,
//! one iteration per direction and the bootstrap's until drawn) plus that window, not the
//! 225 MB of one materialised iteration per direction; preprocessing adds 13 MB per 5.9 M COTs
//! each way. The COTs, their order, the refills and their bytes are those of the materialised
//! pool (a test checks them against it). Between calls the front iteration of each silent pool
//! builds the next COTs on an idle-priority thread (`crate::ferret`'s background module: at
//! most 2^17 COTs a pool, [`OtSession::background_bytes_limit`]); a call takes what is built and
//! builds the rest itself, never waiting for the thread, so the COTs and the traffic are the same.
//!
//! Every consumed COT has a per-direction index that both parties know; flavours derive their
//! hash tweaks from it, so no tweak is ever reused within a session.

use std::collections::VecDeque;
use std::ops::Range;

use veil_core::{ensure, CostClass, Prg, Result};
use veil_net::{Channel, Role};
use zeroize::{Zeroize, Zeroizing};

use crate::ferret::table::PoolBuf;
use crate::ferret::{
    window_bytes, FerretReceiver, FerretSender, ReceiverIteration, SenderIteration,
};
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

/// One direction's engine and what it has made that is not yet consumed: IKNP with the live
/// entries of the lanes, or silent COT with its iterations in seed form, in the order their
/// COTs are handed out.
enum Engine<I, S, It> {
    Iknp(I, Range<usize>),
    Silent(Box<S>, VecDeque<It>),
}

/// A silent iteration kept in seed form ([`crate::ferret::SenderIteration`]).
trait Iteration {
    /// COTs not yet handed out.
    fn left(&self) -> usize;
    /// Builds the next `m` ahead of their calls.
    fn build_ahead(&mut self, m: usize);
    /// Builds its next outputs on the background thread ([`crate::ferret`]'s prefetch).
    fn build_in_background(&mut self);
    /// Stops doing so.
    fn pause_background(&mut self);
    /// Bytes it keeps.
    fn bytes(&self) -> usize;
}

/// One direction's COT storage, and how each engine writes into it: the sender's `q`, or the
/// receiver's `t` with its choice bits. The refill logic ([`Pool::ensure`]) is the same for both.
trait Lanes {
    type Iknp;
    type Silent;
    type Iteration: Iteration;

    /// Bytes of one COT in the buffers.
    const ENTRY_BYTES: usize;

    /// IKNP: extends by `m` COTs and stores them after the `live` ones, which move to the front.
    fn iknp_refill<C: Channel>(
        &mut self,
        e: &mut Self::Iknp,
        ch: &mut C,
        live: Range<usize>,
        m: usize,
    ) -> Result<()>;

    /// Silent: one iteration's flight.
    fn iterate<C: Channel>(e: &mut Self::Silent, ch: &mut C) -> Result<Self::Iteration>;

    /// Silent: makes entries `0..n` the window a call's COTs are written to.
    fn window(&mut self, n: usize);

    /// Silent: writes the next `at.len()` COTs of `it` to entries `at` of the window.
    fn write(&mut self, it: &mut Self::Iteration, at: Range<usize>);

    /// Silent: the COTs each iteration hands out, and the bytes it keeps until they are.
    fn silent_sizes(e: &Self::Silent) -> (usize, usize);

    /// Bytes the silent engine keeps between iterations.
    fn engine_bytes(e: &Self::Silent) -> usize;

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

/// A pool of one direction.
struct Pool<L: Lanes> {
    engine: Engine<L::Iknp, L::Silent, L::Iteration>,
    lanes: L,
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

impl<'a> SenderBatch<'a> {
    /// The COTs `at` of this run (their tweaks unchanged): a group's, or a lane's.
    pub(crate) fn part(&self, at: Range<usize>) -> SenderBatch<'a> {
        SenderBatch {
            delta: self.delta,
            index: self.index + at.start as u64,
            q: &self.q[at],
        }
    }
}

impl<'a> ReceiverBatch<'a> {
    /// The COTs `at` of this run (their tweaks unchanged).
    pub(crate) fn part(&self, at: Range<usize>) -> ReceiverBatch<'a> {
        ReceiverBatch {
            t: &self.t[at.clone()],
            bits: &self.bits[at.clone()],
            index: self.index + at.start as u64,
        }
    }
}

fn refill_size(available: usize, need: usize) -> usize {
    (need - available).max(IKNP_MIN_REFILL)
}

/// Capacity of a grown IKNP pool buffer (geometric growth: repeated refills rarely allocate).
fn iknp_capacity(len: usize) -> usize {
    2 * len
}

impl Iteration for SenderIteration {
    fn left(&self) -> usize {
        self.left()
    }

    fn build_ahead(&mut self, m: usize) {
        self.build_ahead(m)
    }

    fn build_in_background(&mut self) {
        self.build_in_background()
    }

    fn pause_background(&mut self) {
        self.pause_background()
    }

    fn bytes(&self) -> usize {
        self.bytes()
    }
}

impl Iteration for ReceiverIteration {
    fn left(&self) -> usize {
        self.left()
    }

    fn build_ahead(&mut self, m: usize) {
        self.build_ahead(m)
    }

    fn build_in_background(&mut self) {
        self.build_in_background()
    }

    fn pause_background(&mut self) {
        self.pause_background()
    }

    fn bytes(&self) -> usize {
        self.bytes()
    }
}

impl Lanes for Sending {
    type Iknp = IknpSender;
    type Silent = FerretSender;
    type Iteration = SenderIteration;
    const ENTRY_BYTES: usize = 16;

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

    fn iterate<C: Channel>(e: &mut FerretSender, ch: &mut C) -> Result<SenderIteration> {
        e.iterate(ch)
    }

    fn window(&mut self, n: usize) {
        self.q.make_room(0..0, 0, n, 2 * n);
    }

    fn write(&mut self, it: &mut SenderIteration, at: Range<usize>) {
        it.take_into(&mut self.q.as_mut_slice()[at]);
    }

    fn silent_sizes(e: &FerretSender) -> (usize, usize) {
        (e.batch_size(), e.iteration_bytes())
    }

    fn engine_bytes(e: &FerretSender) -> usize {
        e.bytes()
    }

    fn written_bytes(&self) -> usize {
        self.q.written_bytes()
    }
}

impl Lanes for Receiving {
    type Iknp = IknpReceiver;
    type Silent = FerretReceiver;
    type Iteration = ReceiverIteration;
    const ENTRY_BYTES: usize = 17;

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

    fn iterate<C: Channel>(e: &mut FerretReceiver, ch: &mut C) -> Result<ReceiverIteration> {
        e.iterate(ch)
    }

    fn window(&mut self, n: usize) {
        self.t.make_room(0..0, 0, n, 2 * n);
        self.bits.make_room(0..0, 0, n, 2 * n);
    }

    fn write(&mut self, it: &mut ReceiverIteration, at: Range<usize>) {
        let bits = &mut self.bits.as_mut_slice()[at.clone()];
        it.take_into(&mut self.t.as_mut_slice()[at], bits);
    }

    fn silent_sizes(e: &FerretReceiver) -> (usize, usize) {
        (e.batch_size(), e.iteration_bytes())
    }

    fn engine_bytes(e: &FerretReceiver) -> usize {
        e.bytes()
    }

    fn written_bytes(&self) -> usize {
        self.t.written_bytes() + self.bits.written_bytes()
    }
}

impl<L: Lanes> Pool<L> {
    fn new(engine: Engine<L::Iknp, L::Silent, L::Iteration>, lanes: L) -> Self {
        Pool {
            engine,
            lanes,
            consumed: 0,
        }
    }

    fn available(&self) -> usize {
        match &self.engine {
            Engine::Iknp(_, live) => live.len(),
            Engine::Silent(_, its) => its.iter().map(|it| it.left()).sum(),
        }
    }

    /// Bytes this pool keeps: its buffers' written entries, and a silent engine's reserve and
    /// iterations.
    fn bytes(&self) -> usize {
        let engine = match &self.engine {
            Engine::Iknp(..) => 0,
            Engine::Silent(e, its) => {
                L::engine_bytes(e) + its.iter().map(|it| it.bytes()).sum::<usize>()
            }
        };
        self.lanes.written_bytes() + engine
    }

    /// The bytes that hold `ready` COTs with the first `built` of them built ahead: a silent
    /// pool's iterations in seed form that its refill adds and the COTs built ahead
    /// ([`Pool::build_ahead`]), an IKNP pool's grown buffer.
    fn bytes_for(&self, ready: usize, built: usize) -> usize {
        let ready = ready.max(built);
        match &self.engine {
            Engine::Iknp(..) => iknp_capacity(ready) * L::ENTRY_BYTES,
            Engine::Silent(e, _) => {
                let (batch, bytes) = L::silent_sizes(e);
                let refill = ready.saturating_sub(self.available()).div_ceil(batch);
                refill * bytes + built * L::ENTRY_BYTES
            }
        }
    }

    /// Refills until the pool holds `n` COTs and builds them ahead of their calls (the offline
    /// phase): an online call then only copies them, as it did when pools held whole
    /// iterations built.
    fn build_ahead<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<()> {
        self.ensure(ch, n)?;
        if let Engine::Silent(_, its) = &mut self.engine {
            let mut have = 0;
            for it in its.iter_mut() {
                if have == n {
                    break;
                }
                let m = it.left().min(n - have);
                it.build_ahead(m);
                have += m;
            }
        }
        Ok(())
    }

    /// Refills until the pool holds `need` COTs (both parties run the same refills).
    fn ensure<C: Channel>(&mut self, ch: &mut C, need: usize) -> Result<()> {
        let left = self.available();
        if left >= need {
            return Ok(());
        }
        let _g = ch.meter().enter_class(CostClass::OtRefill);
        match &mut self.engine {
            Engine::Iknp(e, live) => {
                let m = refill_size(left, need);
                self.lanes.iknp_refill(e, ch, live.clone(), m)?;
                *live = 0..left + m;
            }
            Engine::Silent(e, its) => {
                let (mut have, mut first) = (left, true);
                while have < need {
                    let it = L::iterate(e, ch)?;
                    have += it.left();
                    // A refill's first iteration is handed out before the leftover, its
                    // further ones after it (both parties order them alike).
                    if first {
                        its.push_front(it);
                    } else {
                        its.push_back(it);
                    }
                    first = false;
                }
            }
        }
        Ok(())
    }

    /// Takes `n` COTs from the front (refilling first when needed): their first entry and their
    /// session-wide index. A silent pool builds them from its iterations into its window,
    /// dropping (wiping) each iteration once all its COTs are out.
    fn take<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<(usize, u64)> {
        ensure!(
            n <= MAX_COTS_PER_CALL,
            InvalidArgument,
            "{n} OTs in one call exceed {MAX_COTS_PER_CALL}"
        );
        self.ensure(ch, n)?;
        let start = match &mut self.engine {
            Engine::Iknp(_, live) => {
                live.start += n;
                live.start - n
            }
            Engine::Silent(_, its) => {
                self.lanes.window(n);
                let mut done = 0;
                while done < n {
                    let it = its.front_mut().expect("the refill covers the call");
                    let m = it.left().min(n - done);
                    self.lanes.write(it, done..done + m);
                    done += m;
                    if it.left() == 0 {
                        its.pop_front();
                    }
                }
                // The front iteration builds the next call's COTs in the background until it
                // runs; a refill may have put it before others that were building.
                for (i, it) in its.iter_mut().enumerate() {
                    match i {
                        0 => it.build_in_background(),
                        _ => it.pause_background(),
                    }
                }
                0
            }
        };
        let index = self.consumed;
        self.consumed += n as u64;
        Ok((start, index))
    }
}

impl Pool<Sending> {
    fn setup<C: Channel>(ch: &mut C, backend: Backend) -> Result<Self> {
        let mut iknp = IknpSender::setup(ch)?;
        let delta = iknp.delta();
        let engine = match backend {
            Backend::Iknp => Engine::Iknp(iknp, 0..0),
            Backend::Silent => {
                let (ferret, boot) = FerretSender::setup(ch, &mut iknp)?;
                Engine::Silent(Box::new(ferret), VecDeque::from([boot]))
            }
        };
        let lanes = Sending {
            delta,
            q: PoolBuf::from_vec(Vec::new()),
        };
        Ok(Pool::new(engine, lanes))
    }
}

impl Pool<Receiving> {
    fn setup<C: Channel>(ch: &mut C, backend: Backend) -> Result<Self> {
        let mut iknp = IknpReceiver::setup(ch)?;
        let engine = match backend {
            Backend::Iknp => Engine::Iknp(iknp, 0..0),
            Backend::Silent => {
                let (ferret, boot) = FerretReceiver::setup(ch, &mut iknp)?;
                Engine::Silent(Box::new(ferret), VecDeque::from([boot]))
            }
        };
        let lanes = Receiving {
            t: PoolBuf::from_vec(Vec::new()),
            bits: PoolBuf::from_vec(Vec::new()),
            prg: Prg::from_os_entropy(),
        };
        Ok(Pool::new(engine, lanes))
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

    /// The most COTs a direction may be refilled to hold by [`OtSession::refill`]: 2^29, about
    /// 90 silent iterations (≈ 600 MB in seed form).
    pub const MAX_READY: usize = 1 << 29;

    /// Refills until the pools hold `sending` and `receiving` COTs in this party's two
    /// directions (the peer passes them swapped), keeping them in seed form (the offline
    /// phase's refills: about 1.1 bytes a COT instead of the 16–17 of COTs built ahead); calls
    /// then build them from their seeds without refilling. Flights: those of the refills,
    /// server's sending direction first.
    pub fn refill<C: Channel>(
        &mut self,
        ch: &mut C,
        sending: usize,
        receiving: usize,
    ) -> Result<()> {
        ensure!(
            sending.max(receiving) <= Self::MAX_READY,
            InvalidArgument,
            "refilling to {} COTs exceeds {}",
            sending.max(receiving),
            Self::MAX_READY
        );
        self.in_step_order(
            ch,
            |pool, ch| pool.ensure(ch, sending),
            |pool, ch| pool.ensure(ch, receiving),
        )
    }

    /// Pre-generates `n` COTs in each direction (offline phase): refills, and builds the next
    /// `n` out of their seed form, so later calls only copy them. Flights: those of the
    /// refills, server's sending direction first.
    pub fn precompute<C: Channel>(&mut self, ch: &mut C, n: usize) -> Result<()> {
        ensure!(
            n <= MAX_COTS_PER_CALL,
            InvalidArgument,
            "precompute({n}) exceeds {MAX_COTS_PER_CALL}"
        );
        self.in_step_order(
            ch,
            |pool, ch| pool.build_ahead(ch, n),
            |pool, ch| pool.build_ahead(ch, n),
        )
    }

    /// Runs `send` on the sending pool and `recv` on the receiving one in the order both
    /// parties share, the server's sending direction (the client's receiving one) first, so
    /// their refills' flights pair up.
    fn in_step_order<C: Channel>(
        &mut self,
        ch: &mut C,
        send: impl FnOnce(&mut Pool<Sending>, &mut C) -> Result<()>,
        recv: impl FnOnce(&mut Pool<Receiving>, &mut C) -> Result<()>,
    ) -> Result<()> {
        match self.role {
            Role::Server => {
                send(&mut self.sender, ch)?;
                recv(&mut self.receiver, ch)
            }
            Role::Client => {
                recv(&mut self.receiver, ch)?;
                send(&mut self.sender, ch)
            }
        }
    }

    /// COTs ready in (sending, receiving) direction.
    pub fn available(&self) -> (usize, usize) {
        (self.sender.available(), self.receiver.available())
    }

    /// The bytes both pools need to hold `n` COTs ready beyond what a session keeps anyway
    /// (see [`OtSession::pool_bytes`]), so preprocessing budgets the memory it takes: a silent
    /// pool builds them ahead (16 bytes per COT sent, 17 per COT received) and keeps the
    /// iterations its refill adds in seed form (6.4 MB sending and 6.7 MB receiving per main
    /// iteration of 5,945,536 COTs).
    pub fn pool_bytes_for(&self, n: usize) -> usize {
        self.pool_bytes_for_ready((n, n), n)
    }

    /// The bytes both pools need beyond what a session keeps anyway to hold `ready` COTs
    /// (sending, receiving) after an [`OtSession::refill`], the first `built` of each direction
    /// built ahead by an [`OtSession::precompute`] (the rest stay in seed form).
    pub fn pool_bytes_for_ready(&self, ready: (usize, usize), built: usize) -> usize {
        self.sender.bytes_for(ready.0, built) + self.receiver.bytes_for(ready.1, built)
    }

    /// The most bytes the two silent pools hold for the COTs their front iterations build in
    /// the background between calls (`crate::ferret`'s prefetch, included in
    /// [`OtSession::pool_bytes`] while held): a session's fixed memory counts it beside the
    /// pools' resident bytes after set-up.
    pub fn background_bytes_limit() -> usize {
        window_bytes(Sending::ENTRY_BYTES) + window_bytes(Receiving::ENTRY_BYTES)
    }

    /// Bytes the two pools keep resident. A silent pool keeps its engine's reserve, its
    /// iterations in seed form (the input reserve, roots or level messages, and the last tree
    /// a call stopped in), the COTs built in the background for the next call, and the window
    /// the largest call so far was written to (16 bytes per COT sent, 17 per COT received); an
    /// IKNP pool its buffer's written entries.
    pub fn pool_bytes(&self) -> usize {
        self.sender.bytes() + self.receiver.bytes()
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
    use crate::ferret::tests::{eager_receive, eager_send};
    use crate::ferret::{TEST_BOOT, TEST_MAIN};
    use veil_net::run_two_party;

    /// The pool as it was before iterations were kept in seed form (the oracle of the COT
    /// stream): every iteration's COTs materialised at once, a refill's first iteration
    /// handed out before the leftover and its further ones after it. It is given the
    /// iterations the seed-form pool's refill made (in the order made), and must use exactly
    /// those.
    struct Materialised<It> {
        cots: VecDeque<(u128, u8)>,
        all: fn(&It) -> Vec<(u128, u8)>,
    }

    impl<It: Iteration> Materialised<It> {
        fn usable(&self, it: &It) -> Vec<(u128, u8)> {
            let all = (self.all)(it);
            all[all.len() - it.left()..].to_vec()
        }

        /// Refills to `n` with the iterations `made`.
        fn fill(&mut self, n: usize, made: Vec<It>) {
            let mut made = made.into_iter();
            let mut first = true;
            while self.cots.len() < n {
                let it = made.next().expect("the materialised pool refills more");
                let usable = self.usable(&it);
                if first {
                    let left = std::mem::take(&mut self.cots);
                    self.cots.extend(usable);
                    self.cots.extend(left);
                } else {
                    self.cots.extend(usable);
                }
                first = false;
            }
            assert!(made.next().is_none(), "the seed-form pool refills more");
        }

        fn take(&mut self, n: usize, made: Vec<It>) -> Vec<(u128, u8)> {
            self.fill(n, made);
            self.cots.drain(..n).collect()
        }
    }

    /// Runs `ensure(n)`, or `build_ahead(n)` (as `precompute` does) if `ahead`; returns the
    /// iterations it made, in the order made (a refill's first goes to the front, its further
    /// ones to the back).
    fn refill<L: Lanes>(
        pool: &mut Pool<L>,
        ch: &mut veil_net::MemChannel,
        n: usize,
        ahead: bool,
    ) -> Vec<L::Iteration>
    where
        L::Iteration: Clone,
    {
        let before = match &pool.engine {
            Engine::Silent(_, its) => its.len(),
            Engine::Iknp(..) => unreachable!(),
        };
        if ahead {
            pool.build_ahead(ch, n).unwrap();
        } else {
            pool.ensure(ch, n).unwrap();
        }
        match &pool.engine {
            Engine::Silent(_, its) if its.len() > before => {
                let later = its.iter().skip(before + 1);
                std::iter::once(&its[0]).chain(later).cloned().collect()
            }
            _ => Vec::new(),
        }
    }

    /// (COTs built ahead first, as `precompute` does, or 0; the call's size): calls of 0 and
    /// 1, within a tree, across trees, to the end of the bootstrap's leftover (1,646 COTs),
    /// across iterations (23,150 each), refills of several iterations at once, and calls that
    /// take part of the COTs built ahead, all of them, or run past them.
    const STEPS: [(usize, usize); 16] = [
        (0, 0),
        (0, 1),
        (3_000, 1_000),
        (0, 645),
        (0, 1),
        (0, 0),
        (30_000, 512),
        (0, 23_150),
        (0, 7),
        (0, 30_000),
        (100_000, 50_000),
        (0, 1),
        (0, 4_095),
        (0, 70_000),
        (0, 0),
        (0, 23_149),
    ];

    /// The COT streams of the seed-form pool and of the materialised one agree bit for bit,
    /// call by call, in both lanes (the client sends, the server receives), refilled at the
    /// same calls with the same bytes.
    #[test]
    fn the_seed_form_pool_hands_out_the_materialised_pools_cots() {
        type Calls = Vec<Vec<(u128, u8)>>;
        let (client, server) = run_two_party(
            |c| {
                let mut iknp = IknpSender::setup(c)?;
                let delta = iknp.delta();
                let (ferret, boot) = FerretSender::setup_with(c, &mut iknp, TEST_BOOT, TEST_MAIN)?;
                let mut old = Materialised {
                    cots: VecDeque::new(),
                    all: |it| eager_send(it).into_iter().map(|q| (q, 0)).collect(),
                };
                old.cots = old.usable(&boot).into();
                let lanes = Sending {
                    delta,
                    q: PoolBuf::from_vec(Vec::new()),
                };
                let engine = Engine::Silent(Box::new(ferret), VecDeque::from([boot]));
                let mut pool = Pool::new(engine, lanes);
                let (mut new_calls, mut old_calls, mut traffic) =
                    (Calls::new(), Calls::new(), Vec::new());
                for (ahead, n) in STEPS {
                    let before = c.meter().total();
                    let early = refill(&mut pool, c, ahead, true);
                    let made = refill(&mut pool, c, n, false);
                    let after = c.meter().total();
                    let count = (early.len() + made.len()) as u64;
                    traffic.push((count, after.bytes_sent - before.bytes_sent));
                    old.fill(ahead, early);
                    old_calls.push(old.take(n, made));
                    let (start, _) = pool.take(c, n)?;
                    let q = &pool.lanes.q.as_slice()[start..start + n];
                    new_calls.push(q.iter().map(|&q| (q, 0)).collect());
                }
                Ok((delta, new_calls, old_calls, traffic))
            },
            |c| {
                let mut iknp = IknpReceiver::setup(c)?;
                let (ferret, boot) =
                    FerretReceiver::setup_with(c, &mut iknp, TEST_BOOT, TEST_MAIN)?;
                let mut old = Materialised {
                    cots: VecDeque::new(),
                    all: |it| {
                        let (t, bits) = eager_receive(it);
                        t.into_iter().zip(bits).collect()
                    },
                };
                old.cots = old.usable(&boot).into();
                let lanes = Receiving {
                    t: PoolBuf::from_vec(Vec::new()),
                    bits: PoolBuf::from_vec(Vec::new()),
                    prg: Prg::from_os_entropy(),
                };
                let engine = Engine::Silent(Box::new(ferret), VecDeque::from([boot]));
                let mut pool = Pool::new(engine, lanes);
                let (mut new_calls, mut old_calls) = (Calls::new(), Calls::new());
                for (ahead, n) in STEPS {
                    old.fill(ahead, refill(&mut pool, c, ahead, true));
                    old_calls.push(old.take(n, refill(&mut pool, c, n, false)));
                    let (start, _) = pool.take(c, n)?;
                    let t = &pool.lanes.t.as_slice()[start..start + n];
                    let bits = &pool.lanes.bits.as_slice()[start..start + n];
                    new_calls.push(t.iter().copied().zip(bits.iter().copied()).collect());
                }
                Ok((new_calls, old_calls))
            },
        )
        .unwrap();
        let (delta, sent, sent_before, traffic) = client;
        let (received, received_before) = server;
        assert_eq!(sent, sent_before);
        assert_eq!(received, received_before);
        for ((&(_, n), q), t) in STEPS.iter().zip(&sent).zip(&received) {
            assert_eq!((q.len(), t.len()), (n, n));
            for (&(q, _), &(t, b)) in q.iter().zip(t) {
                assert_eq!(t, q ^ if b == 1 { delta } else { 0 });
            }
        }
        // Each iteration sends its t·depth blocks (and the message's 4-byte length) in the
        // refill, as before.
        let iteration = (TEST_MAIN.t * TEST_MAIN.depth() * 16 + 4) as u64;
        let made: Vec<u64> = traffic.iter().map(|&(made, _)| made).collect();
        for &(made, bytes) in &traffic {
            assert_eq!(bytes, made * iteration);
        }
        // 1,646 + 23,150·k COTs cover the 202,561 drawn at k = 9, refilled at these calls.
        assert_eq!(STEPS.iter().map(|s| s.1).sum::<usize>(), 202_561);
        assert_eq!(made, [0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 4, 0, 0, 1, 0, 1]);
    }

    /// What a silent session keeps resident after its set-up and after its first main refill
    /// and a call that drew all of the bootstrap's leftover and one COT more: per direction,
    /// the engine's reserve and one iteration in seed form (the bootstrap's until it is
    /// drawn), the window of the largest call, and the COTs built in the background for the
    /// next; the estimate of a server session's fixed memory rests on this. `pool_bytes_for` is exactly what the refill adds.
    #[test]
    fn a_silent_session_keeps_iterations_in_seed_form() {
        use veil_net::run_two_party;
        let party = |role| {
            move |c: &mut veil_net::MemChannel| {
                let mut s = OtSession::setup(c, role)?;
                let setup = s.pool_bytes();
                let n = s.available().0 + 1;
                let estimate = s.pool_bytes_for(n);
                s.precompute(c, n)?;
                let filled = s.pool_bytes();
                match role {
                    Role::Client => s.take_send(c, n)?.q.len(),
                    Role::Server => s.take_recv(c, n)?.t.len(),
                };
                match role {
                    Role::Client => s.take_recv(c, n)?.t.len(),
                    Role::Server => s.take_send(c, n)?.q.len(),
                };
                Ok((setup, estimate, filled, s.pool_bytes()))
            }
        };
        let (client, server) = run_two_party(party(Role::Client), party(Role::Server)).unwrap();
        assert_eq!(server, client);
        let (setup, estimate, filled, drawn) = client;
        // Reserve: 280,384 blocks in three huge pages (6 MiB); main trees of 4,096 leaves.
        let (reserve, tree) = (6 << 20, 4_096 * 16);
        let (k, levels) = (262_144, 1_520 * 12);
        // Bootstrap: 74,036 blocks in one huge page, 850 roots or 8,500 level messages.
        let boot_send = (2 << 20) + 850 * 16 + 1_024 * 16;
        let boot_recv = (2 << 20) + 65_536 / 8 + 8_500 * 17 + 1_024 * 16;
        let send_it = reserve + 1_520 * 16 + tree;
        let recv_it = reserve + k / 8 + levels * 17 + tree;
        let engines = 2 * reserve + 280_384;
        assert_eq!(setup, engines + boot_send + boot_recv);
        // Refilled by one iteration each way, and the 590,017 COTs built ahead.
        assert_eq!(estimate, send_it + recv_it + 590_017 * 33);
        assert_eq!(filled, setup + estimate);
        // Drawing them: the main iteration's first ones, built ahead, now copied to the
        // window of the call (590,017 COTs each way) and freed; the bootstrap's still pending,
        // and the front iterations building their next COTs in the background (held at the
        // most that takes).
        assert_eq!(drawn, filled + OtSession::background_bytes_limit());
        assert_eq!(filled, 49_808_373);
    }
}
