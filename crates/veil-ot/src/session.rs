//! [`OtSession`]: one party's end of a bidirectional OT session.
//!
//! Each party holds a COT *sender* pool (for OTs it sends; it knows Δ) and a COT *receiver*
//! pool (for OTs it receives), each fed by its own engine. Every derived flavour consumes random
//! COTs from the front of a pool; both parties consume and refill in lock-step, because refills
//! are a deterministic function of the request size and of the pool level, which are the same on
//! both sides. A refill adds the engine's flights (IKNP: one flight receiver → sender; silent
//! COT: see [`crate::ferret`]) before the call's own flights.
//!
//! Every consumed COT has a per-direction index that both parties know; flavours derive their
//! hash tweaks from it, so no tweak is ever reused within a session.

use veil_core::{ensure, Prg, Result};
use veil_net::{Channel, Role};
use zeroize::{Zeroize, Zeroizing};

use crate::ferret::table::{reserve_wiping, scratch_wiping};
use crate::ferret::{FerretReceiver, FerretSender};
use crate::iknp::{IknpReceiver, IknpSender};

/// Which extension produces the COTs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// IKNP: 128 bits of traffic per COT, no set-up beyond 128 base OTs; refills by the
    /// amount needed (at least 2^16), one flight each.
    Iknp,
    /// Ferret silent COT (bootstrapped from IKNP): under 0.5 bit per COT; refills by one main
    /// iteration (10,001,981 COTs, two flights). Set-up costs one bootstrap iteration.
    Silent,
}

/// IKNP refills by at least this many COTs, so small calls do not each pay a flight.
const IKNP_MIN_REFILL: usize = 1 << 16;

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

/// COTs this party sends: `q_i`, with the receiver holding `q_i ⊕ r_i·Δ`.
struct SenderPool {
    engine: SendEngine,
    delta: u128,
    q: Vec<u128>,
    pos: usize,
    consumed: u64,
    /// Silent COT's second output buffer, reused across iterations.
    spare: Vec<u128>,
}

/// COTs this party receives: choice bits `r_i` and `t_i = q_i ⊕ r_i·Δ`.
struct ReceiverPool {
    engine: RecvEngine,
    t: Vec<u128>,
    bits: Vec<u8>,
    pos: usize,
    consumed: u64,
    prg: Prg,
    spare_t: Vec<u128>,
    spare_bits: Vec<u8>,
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

/// Appends `src` to a pool buffer, growing it geometrically with [`reserve_wiping`].
fn extend_wiping<T: Copy + Zeroize>(v: &mut Vec<T>, src: &[T]) {
    reserve_wiping(v, src.len().max(v.len()));
    v.extend_from_slice(src);
}

/// Where one silent iteration goes when `left` COTs remain in the pool: the iteration's blocks
/// are written at `offset` of the spare buffer, and the leftover is copied in front of the
/// usable part, over the iteration's reserve prefix (`start` blocks, already copied out by the
/// engine) and, if the leftover is longer, into the `offset` blocks before it. Returns
/// `(offset, p)`: the new pool is `spare[p..offset + iteration_len]`, leftover first. No COT
/// of the iteration is copied, and the buffers never need more than `iteration_len + left`.
/// Capacity of a silent pool buffer when it must grow: the iteration plus room for a leftover
/// of a quarter iteration, so calls of up to ~2.5 M OTs never grow a buffer twice (each fresh
/// buffer costs the kernel ~0.1 s of page clearing).
fn spare_capacity(iteration_len: usize) -> usize {
    iteration_len + iteration_len / 4
}

fn silent_layout(left: usize, start: usize) -> (usize, usize) {
    let offset = left.saturating_sub(start);
    (offset, offset + start - left)
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
            q,
            pos,
            consumed: 0,
            spare: Vec::new(),
        })
    }

    fn available(&self) -> usize {
        self.q.len() - self.pos
    }

    fn ensure<C: Channel>(&mut self, ch: &mut C, need: usize) -> Result<()> {
        if self.available() >= need {
            return Ok(());
        }
        match &mut self.engine {
            SendEngine::Iknp(e) => {
                self.q.drain(..self.pos);
                self.pos = 0;
                let more = Zeroizing::new(e.extend(ch, refill_size(self.q.len(), need))?);
                extend_wiping(&mut self.q, &more);
            }
            SendEngine::Silent(e) => {
                while self.q.len() - self.pos < need {
                    // The iteration fills the spare buffer in place, the leftover moves in
                    // front of its usable part, and the buffers swap roles.
                    let left = self.q.len() - self.pos;
                    let (offset, p) = silent_layout(left, e.reserve_len());
                    let end = offset + e.iteration_len();
                    scratch_wiping(&mut self.spare, end, spare_capacity(e.iteration_len()));
                    let start = e.extend_into(ch, &mut self.spare[offset..end])?;
                    assert_eq!(start, e.reserve_len(), "silent OT reserve length");
                    self.spare[p..offset + start].copy_from_slice(&self.q[self.pos..]);
                    std::mem::swap(&mut self.q, &mut self.spare);
                    self.pos = p;
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
            q: &self.q[start..start + n],
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
            t,
            bits,
            pos,
            consumed: 0,
            prg: Prg::from_os_entropy(),
            spare_t: Vec::new(),
            spare_bits: Vec::new(),
        })
    }

    fn available(&self) -> usize {
        self.t.len() - self.pos
    }

    fn ensure<C: Channel>(&mut self, ch: &mut C, need: usize) -> Result<()> {
        if self.available() >= need {
            return Ok(());
        }
        match &mut self.engine {
            RecvEngine::Iknp(e) => {
                self.t.drain(..self.pos);
                self.bits.drain(..self.pos);
                self.pos = 0;
                let m = refill_size(self.t.len(), need);
                let choices: Zeroizing<Vec<u8>> =
                    Zeroizing::new((0..m).map(|_| self.prg.bit() as u8).collect());
                let more = Zeroizing::new(e.extend(ch, &choices)?);
                extend_wiping(&mut self.t, &more);
                extend_wiping(&mut self.bits, &choices);
            }
            RecvEngine::Silent(e) => {
                while self.t.len() - self.pos < need {
                    // As for the sender, with the choice bits alongside.
                    let left = self.t.len() - self.pos;
                    let (offset, p) = silent_layout(left, e.reserve_len());
                    let end = offset + e.iteration_len();
                    scratch_wiping(&mut self.spare_t, end, spare_capacity(e.iteration_len()));
                    scratch_wiping(&mut self.spare_bits, end, spare_capacity(e.iteration_len()));
                    let start = e.extend_into(
                        ch,
                        &mut self.spare_t[offset..end],
                        &mut self.spare_bits[offset..end],
                    )?;
                    assert_eq!(start, e.reserve_len(), "silent OT reserve length");
                    self.spare_t[p..offset + start].copy_from_slice(&self.t[self.pos..]);
                    self.spare_bits[p..offset + start].copy_from_slice(&self.bits[self.pos..]);
                    std::mem::swap(&mut self.t, &mut self.spare_t);
                    std::mem::swap(&mut self.bits, &mut self.spare_bits);
                    self.pos = p;
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
            t: &self.t[start..start + n],
            bits: &self.bits[start..start + n],
            index,
        })
    }
}

impl Drop for SenderPool {
    fn drop(&mut self) {
        self.delta.zeroize();
        self.q.zeroize();
        self.spare.zeroize();
    }
}

impl Drop for ReceiverPool {
    fn drop(&mut self) {
        self.t.zeroize();
        self.bits.zeroize();
        self.spare_t.zeroize();
        self.spare_bits.zeroize();
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
    use super::silent_layout;

    #[test]
    fn silent_layout_puts_the_leftover_right_before_the_usable_part() {
        let start = 100;
        for left in [0, 1, 99, 100, 101, 250] {
            let (offset, p) = silent_layout(left, start);
            // The leftover ends where the iteration's usable part begins...
            assert_eq!(p + left, offset + start, "left {left}");
            // ...and the iteration is written no further out than the leftover needs.
            assert_eq!(offset, left.saturating_sub(start));
        }
    }
}
