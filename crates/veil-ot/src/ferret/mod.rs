//! Ferret-style silent correlated OT (Yang et al., CCS 2020), semi-honest version.
//!
//! One iteration with LPN parameters (n, k, t) turns `k + t·depth` COTs (the *reserve*) into n
//! fresh COTs with the same Δ:
//! 1. **MPCOT** ([`spcot`]): t Half-Tree single-point COTs, one per bin of the regular noise,
//!    each fed by `depth` reserve COTs whose choice bits fix the receiver's punctured position;
//!    the receiver's noise vector e has one 1 per bin at a uniformly random position.
//! 2. **LPN** ([`lpn`]): both parties add `A·(reserve)` with the public sparse matrix A, so the
//!    receiver's choice vector becomes `e ⊕ A·r`, pseudo-random under regular-noise LPN.
//!
//! Both steps run as jobs of the process's worker pool (`veil_core::parallel`): one tree per job,
//! and slices of LPN rows; every tree and row depends only on its index, so the output does not
//! depend on how the jobs fall.
//!
//! The first reserve comes from IKNP through a smaller *bootstrap* iteration; afterwards each
//! main iteration keeps its first `k + t·depth` outputs as the next reserve and hands out the
//! rest (5,945,536 COTs per main iteration). Parameters and their sources: [`params`].
//!
//! **Seed form.** An iteration's flight needs the sender's whole trees (their level messages),
//! but its outputs are needed only when a call takes them. So [`FerretSender::iterate`] and
//! [`FerretReceiver::iterate`] run the flight, build only the next reserve at once, and return
//! the iteration as what its outputs derive from ([`SenderIteration`], [`ReceiverIteration`]:
//! its input reserve and the roots or level messages, 4.5 MB instead of 100 MB of COTs); every
//! tree and LPN row depends only on its index, so a range of outputs is rebuilt on demand bit
//! for bit as the whole iteration would have been (the sender builds its trees twice, once for
//! the flight and once for the outputs).
//!
//! Traffic per iteration: `t·depth` blocks from sender to receiver in one flight (≈ 0.39 bit per
//! usable COT for the main set); the receiver sends nothing (plus one 16-byte flight at set-up
//! carrying the public matrix seed).
//!
//! Security: semi-honest, 128-bit computational (regular-noise LPN with the published
//! parameters; the Half-Tree trees in the random-permutation model for fixed-key AES). No
//! consistency check: that is only needed against a malicious party, and this version claims
//! no malicious security. Δ, reserves, roots, choice bits and cached leaves are zeroized on drop,
//! punctured indices after each use.

mod background;
mod lpn;
mod params;
mod spcot;
pub(crate) mod table;

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;
use veil_core::parallel::pool;
use veil_core::{Prg, Result};
use veil_net::Channel;
use zeroize::{Zeroize, Zeroizing};

use crate::ct::eq_mask;
use crate::iknp::{IknpReceiver, IknpSender};
pub(crate) use background::window_bytes;
use background::{Chunks, Feed, Piece};
use lpn::{pack_bits, LpnMatrix};
use params::LpnParams;
#[cfg(test)]
pub(crate) use params::{TEST_BOOT, TEST_MAIN};
use spcot::{receive_tree, send_tree};
use table::{huge_bytes, scratch_wiping, HugeTable};

/// Checks that `boot` can seed `main` and that `main` sustains itself.
fn check_params(boot: &LpnParams, main: &LpnParams) {
    assert!(
        boot.n >= main.base_cots() && main.n > main.base_cots(),
        "LPN parameter sets cannot bootstrap"
    );
    for p in [boot, main] {
        assert!(
            (1..=spcot::MAX_DEPTH).contains(&p.depth()) && p.n == p.t << p.depth(),
            "LPN parameter set without full trees"
        );
    }
}

/// Where a range of outputs is built: on the worker pool (a call), or on the calling thread
/// alone (the background thread, whose work must never occupy the pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threads {
    Pool,
    Caller,
}

/// COT sender side of silent OT.
pub struct FerretSender {
    delta: u128,
    main: LpnParams,
    matrix: LpnMatrix,
    reserve: HugeTable,
    prg: Prg,
}

/// COT receiver side of silent OT.
pub struct FerretReceiver {
    main: LpnParams,
    matrix: LpnMatrix,
    reserve: HugeTable,
    reserve_bits: Zeroizing<Vec<u8>>,
}

impl Drop for FerretSender {
    fn drop(&mut self) {
        self.delta.zeroize();
    }
}

/// The leaves of the tree a hand-out stopped in, so that the next one (which starts there)
/// does not rebuild it: many small calls would otherwise rebuild a 4,096-leaf tree each.
#[derive(Default)]
#[cfg_attr(test, derive(Clone))]
struct LastTree {
    index: Option<usize>,
    leaves: Zeroizing<Vec<u128>>,
    /// The receiver's punctured leaf in it (a secret).
    hole: usize,
}

impl Drop for LastTree {
    fn drop(&mut self) {
        self.hole.zeroize();
    }
}

impl LastTree {
    /// Writes the leaves of `rows` (of trees of `2^depth` leaves) to `out` and, with `noise`,
    /// the receiver's noise bits (1 at each tree's punctured leaf). `tree(i, leaves)` builds
    /// tree `i` into `leaves` and returns its punctured leaf (the sender's trees have none: 0).
    /// Whole trees are built in place (on the worker pool when `threads` allows it), the
    /// partial ones at either end through this cache.
    fn leaves<F: Fn(usize, &mut [u128]) -> usize + Sync>(
        &mut self,
        (depth, rows): (usize, Range<usize>),
        out: &mut [u128],
        mut noise: Option<&mut [u8]>,
        tree: &F,
        threads: Threads,
    ) {
        let l = 1 << depth;
        let (first, last) = (rows.start.div_ceil(l) * l, rows.end / l * l);
        if first >= last {
            // Inside one tree, or across the boundary between two partial trees.
            let mid = first.min(rows.end);
            self.partial(l, &rows, rows.start..mid, out, noise.as_deref_mut(), tree);
            self.partial(l, &rows, mid..rows.end, out, noise, tree);
            return;
        }
        self.partial(l, &rows, rows.start..first, out, noise.as_deref_mut(), tree);
        let whole = first - rows.start..last - rows.start;
        let mut holes: Zeroizing<Vec<usize>> = Zeroizing::new(vec![0; whole.len() / l]);
        let trees = first / l;
        let build = |(i, (leaves, hole)): (usize, (&mut [u128], &mut usize))| {
            *hole = tree(trees + i, leaves);
        };
        if whole.len() == l || threads == Threads::Caller {
            out[whole.clone()]
                .chunks_mut(l)
                .zip(holes.iter_mut())
                .enumerate()
                .for_each(build);
        } else {
            pool().install(|| {
                out[whole.clone()]
                    .par_chunks_mut(l)
                    .zip(holes.par_iter_mut())
                    .enumerate()
                    .for_each(build);
            });
        }
        if let Some(noise) = noise.as_deref_mut() {
            for (bin, &hole) in noise[whole].chunks_exact_mut(l).zip(holes.iter()) {
                for (j, b) in bin.iter_mut().enumerate() {
                    *b = (eq_mask(j, hole) & 1) as u8;
                }
            }
        }
        self.partial(l, &rows, last..rows.end, out, noise, tree);
    }

    /// The rows `part` (inside one tree) of `rows`, from the cached tree, built first when it
    /// is another.
    fn partial<F: Fn(usize, &mut [u128]) -> usize + Sync>(
        &mut self,
        l: usize,
        rows: &Range<usize>,
        part: Range<usize>,
        out: &mut [u128],
        noise: Option<&mut [u8]>,
        tree: &F,
    ) {
        if part.is_empty() {
            return;
        }
        let i = part.start / l;
        if self.index != Some(i) {
            self.leaves.resize(l, 0);
            self.hole = tree(i, &mut self.leaves);
            self.index = Some(i);
        }
        let at = part.start - rows.start..part.end - rows.start;
        let within = part.start - i * l..part.end - i * l;
        out[at.clone()].copy_from_slice(&self.leaves[within.clone()]);
        if let Some(noise) = noise {
            for (b, j) in noise[at].iter_mut().zip(within) {
                *b = (eq_mask(j, self.hole) & 1) as u8;
            }
        }
    }

    fn bytes(&self) -> usize {
        self.leaves.capacity() * 16
    }
}

/// What a sender iteration's outputs derive from: its input reserve (the LPN base and the
/// trees' level COTs) and the trees' roots. Immutable after the flight, so the background
/// builder ([`background`]) shares it.
struct SenderCore {
    p: LpnParams,
    matrix: LpnMatrix,
    delta: u128,
    base: HugeTable,
    roots: Zeroizing<Vec<u128>>,
}

impl Drop for SenderCore {
    fn drop(&mut self) {
        self.delta.zeroize();
    }
}

impl SenderCore {
    /// Tree `i`'s leaves (its messages, needed at the flight only, are dropped).
    fn tree(&self, i: usize, leaves: &mut [u128]) {
        let depth = self.p.depth();
        let levels = &self.base.as_slice()[self.p.k..];
        let mut msg = [0u128; spcot::MAX_DEPTH];
        send_tree(
            self.roots[i],
            self.delta,
            &levels[i * depth..(i + 1) * depth],
            leaves,
            &mut msg[..depth],
        );
    }

    /// Outputs `rows` into `out`; `last` caches the tree a range stopped in.
    fn build(&self, rows: Range<usize>, out: &mut [u128], last: &mut LastTree, threads: Threads) {
        let tree = |i: usize, leaves: &mut [u128]| {
            self.tree(i, leaves);
            0
        };
        last.leaves((self.p.depth(), rows.clone()), out, None, &tree, threads);
        let lpn_base = &self.base.as_slice()[..self.p.k];
        self.matrix.encode(rows.start, out, lpn_base, threads);
    }
}

impl Chunks for SenderCore {
    type Chunk = Zeroizing<Vec<u128>>;

    fn params(&self) -> LpnParams {
        self.p
    }

    fn build_here(&self, rows: Range<usize>) -> Self::Chunk {
        let mut out = Zeroizing::new(vec![0u128; rows.len()]);
        self.build(rows, &mut out, &mut LastTree::default(), Threads::Caller);
        out
    }

    fn chunk_bytes(rows: usize) -> usize {
        rows * 16
    }

    fn chunk_len(chunk: &Self::Chunk) -> usize {
        chunk.len()
    }
}

/// One sender iteration after its flight, kept in seed form ([`SenderCore`]), from which any
/// range of its n outputs is rebuilt when it is handed out (the trees a second time: their
/// messages needed them all at the flight). 4.5 MB instead of the 100 MB of its outputs.
#[cfg_attr(test, derive(Clone))]
pub struct SenderIteration {
    core: Arc<SenderCore>,
    /// Outputs before `next` are handed out (or are the engine's next reserve).
    next: usize,
    /// Outputs from `next` on built ahead of their calls ([`Self::build_ahead`]), from entry
    /// `ahead_at` of `ahead`.
    ahead: Zeroizing<Vec<u128>>,
    ahead_at: usize,
    last: LastTree,
    feed: Feed<SenderCore>,
}

impl SenderIteration {
    /// MPCOT's flight: draws the roots, builds every tree and sends the level messages.
    fn start<C: Channel>(
        ch: &mut C,
        p: LpnParams,
        matrix: LpnMatrix,
        delta: u128,
        base: HugeTable,
        prg: &mut Prg,
    ) -> Result<Self> {
        let depth = p.depth();
        let roots: Zeroizing<Vec<u128>> =
            Zeroizing::new((0..p.t).map(|_| u128::from_le_bytes(prg.block())).collect());
        let mut msg = vec![0u128; p.t * depth];
        let levels = &base.as_slice()[p.k..];
        pool().install(|| {
            msg.par_chunks_mut(depth).enumerate().for_each_init(
                || Zeroizing::new(vec![0u128; 1 << depth]),
                |leaves, (i, tree_msg)| {
                    let level_cots = &levels[i * depth..(i + 1) * depth];
                    send_tree(roots[i], delta, level_cots, leaves, tree_msg);
                },
            );
        });
        let bytes: Vec<u8> = msg.iter().flat_map(|b| b.to_le_bytes()).collect();
        ch.send_msg(&bytes)?;
        ch.flush()?;
        Ok(SenderIteration {
            core: Arc::new(SenderCore {
                p,
                matrix,
                delta,
                base,
                roots,
            }),
            next: 0,
            ahead: Zeroizing::new(Vec::new()),
            ahead_at: 0,
            last: LastTree::default(),
            feed: Feed::default(),
        })
    }

    /// Writes the next `out.len()` outputs to `out`: those built ahead first.
    pub(crate) fn take_into(&mut self, out: &mut [u128]) {
        let at = self.ahead_at;
        let a = out.len().min(self.ahead.len() - at);
        out[..a].copy_from_slice(&self.ahead[at..at + a]);
        self.ahead_at += a;
        if self.ahead_at == self.ahead.len() {
            // All taken: wiped and freed.
            (self.ahead, self.ahead_at) = (Zeroizing::new(Vec::new()), 0);
        }
        self.next += a;
        let from = self.next;
        self.produce(from, &mut out[a..]);
        self.next += out.len() - a;
    }

    /// Builds the next `m` outputs (those not yet built) ahead of their calls, so that taking
    /// them later only copies.
    pub(crate) fn build_ahead(&mut self, m: usize) {
        let have = self.ahead.len() - self.ahead_at;
        if m > have {
            let mut ahead = Zeroizing::new(vec![0u128; m]);
            ahead[..have].copy_from_slice(&self.ahead[self.ahead_at..]);
            self.produce(self.next + have, &mut ahead[have..]);
            (self.ahead, self.ahead_at) = (ahead, 0);
        }
    }

    /// Outputs `from..from + out.len()` into `out`: from the chunks built in the background
    /// where they are ready, the rest built here.
    fn produce(&mut self, from: usize, out: &mut [u128]) {
        let (core, last) = (&self.core, &mut self.last);
        assert!(from + out.len() <= core.p.n, "silent iteration overrun");
        self.feed.fill(from..from + out.len(), |piece| match piece {
            Piece::Built { chunk, within, at } => {
                out[at..at + within.len()].copy_from_slice(&chunk[within]);
            }
            Piece::Missing { rows, at } => {
                let out = &mut out[at..at + rows.len()];
                core.build(rows, out, last, Threads::Pool);
            }
        });
    }

    /// Starts building the outputs after those handed out and built ahead in the background
    /// (the pool asks it of its front iteration after every call).
    pub(crate) fn build_in_background(&mut self) {
        let from = self.next + self.ahead.len() - self.ahead_at;
        self.feed.advance(&self.core, from);
    }

    /// Stops building in the background (the iteration is no longer the pool's front one).
    pub(crate) fn pause_background(&mut self) {
        self.feed.pause();
    }

    /// Outputs not yet handed out.
    pub(crate) fn left(&self) -> usize {
        self.core.p.n - self.next
    }

    /// Bytes this iteration keeps (the base resident in whole huge pages).
    pub(crate) fn bytes(&self) -> usize {
        self.core.base.bytes()
            + self.core.roots.len() * 16
            + self.last.bytes()
            + self.ahead.capacity() * 16
            + self.feed.bytes()
    }
}

/// What a receiver iteration's outputs derive from: its input reserve with its choice bits
/// and the sender's level messages (see [`SenderCore`]).
struct ReceiverCore {
    p: LpnParams,
    matrix: LpnMatrix,
    base: HugeTable,
    /// The LPN base's choice bits, packed 64 per word.
    lpn_bits: Zeroizing<Vec<u64>>,
    level_bits: Zeroizing<Vec<u8>>,
    msg: Vec<u128>,
}

impl ReceiverCore {
    /// Tree `i`'s leaves; returns its punctured leaf (a secret).
    fn tree(&self, i: usize, leaves: &mut [u128]) -> usize {
        let depth = self.p.depth();
        let levels = i * depth..(i + 1) * depth;
        receive_tree(
            &self.base.as_slice()[self.p.k..][levels.clone()],
            &self.level_bits[levels.clone()],
            &self.msg[levels],
            leaves,
        )
    }

    /// Outputs `rows` into `out` and their choice bits into `bits` (see [`SenderCore::build`]).
    fn build(
        &self,
        rows: Range<usize>,
        (out, bits): (&mut [u128], &mut [u8]),
        last: &mut LastTree,
        threads: Threads,
    ) {
        let tree = |i: usize, leaves: &mut [u128]| self.tree(i, leaves);
        let span = (self.p.depth(), rows.clone());
        last.leaves(span, out, Some(&mut *bits), &tree, threads);
        let lpn_base = &self.base.as_slice()[..self.p.k];
        let outputs = (out, bits);
        self.matrix
            .encode_with_bits(rows.start, outputs, lpn_base, &self.lpn_bits, threads);
    }
}

impl Chunks for ReceiverCore {
    type Chunk = (Zeroizing<Vec<u128>>, Zeroizing<Vec<u8>>);

    fn params(&self) -> LpnParams {
        self.p
    }

    fn build_here(&self, rows: Range<usize>) -> Self::Chunk {
        let mut out = Zeroizing::new(vec![0u128; rows.len()]);
        let mut bits = Zeroizing::new(vec![0u8; rows.len()]);
        let last = &mut LastTree::default();
        self.build(rows, (&mut out, &mut bits), last, Threads::Caller);
        (out, bits)
    }

    fn chunk_bytes(rows: usize) -> usize {
        rows * 17
    }

    fn chunk_len(chunk: &Self::Chunk) -> usize {
        chunk.0.len()
    }
}

/// One receiver iteration after its flight, kept in seed form ([`ReceiverCore`]; see
/// [`SenderIteration`]).
#[cfg_attr(test, derive(Clone))]
pub struct ReceiverIteration {
    core: Arc<ReceiverCore>,
    next: usize,
    /// Outputs from `next` on, with their choice bits, built ahead of their calls (from entry
    /// `ahead_at`).
    ahead: (Zeroizing<Vec<u128>>, Zeroizing<Vec<u8>>),
    ahead_at: usize,
    last: LastTree,
    feed: Feed<ReceiverCore>,
}

impl ReceiverIteration {
    /// MPCOT's flight: receives the sender's level messages.
    fn start<C: Channel>(
        ch: &mut C,
        p: LpnParams,
        matrix: LpnMatrix,
        base: HugeTable,
        base_bits: &[u8],
    ) -> Result<Self> {
        let bytes = ch.recv_msg_exact(p.t * p.depth() * 16)?;
        let msg = bytes
            .chunks_exact(16)
            .map(|b| u128::from_le_bytes(b.try_into().expect("16 bytes")))
            .collect();
        let (lpn_bits, level_bits) = base_bits.split_at(p.k);
        Ok(ReceiverIteration {
            core: Arc::new(ReceiverCore {
                p,
                matrix,
                base,
                lpn_bits: Zeroizing::new(pack_bits(lpn_bits)),
                level_bits: Zeroizing::new(level_bits.to_vec()),
                msg,
            }),
            next: 0,
            ahead: (Zeroizing::new(Vec::new()), Zeroizing::new(Vec::new())),
            ahead_at: 0,
            last: LastTree::default(),
            feed: Feed::default(),
        })
    }

    /// Writes the next `out.len()` outputs to `out` and their choice bits to `bits`: those
    /// built ahead first.
    pub(crate) fn take_into(&mut self, out: &mut [u128], bits: &mut [u8]) {
        assert_eq!(bits.len(), out.len(), "silent iteration shapes");
        let (at, (t, b)) = (self.ahead_at, &self.ahead);
        let a = out.len().min(t.len() - at);
        out[..a].copy_from_slice(&t[at..at + a]);
        bits[..a].copy_from_slice(&b[at..at + a]);
        self.ahead_at += a;
        if self.ahead_at == t.len() {
            let none = (Zeroizing::new(Vec::new()), Zeroizing::new(Vec::new()));
            (self.ahead, self.ahead_at) = (none, 0);
        }
        self.next += a;
        let from = self.next;
        self.produce(from, &mut out[a..], &mut bits[a..]);
        self.next += out.len() - a;
    }

    /// Builds the next `m` outputs ahead of their calls (see [`SenderIteration::build_ahead`]).
    pub(crate) fn build_ahead(&mut self, m: usize) {
        let (at, have) = (self.ahead_at, self.ahead.0.len() - self.ahead_at);
        if m > have {
            let mut t = Zeroizing::new(vec![0u128; m]);
            let mut b = Zeroizing::new(vec![0u8; m]);
            t[..have].copy_from_slice(&self.ahead.0[at..]);
            b[..have].copy_from_slice(&self.ahead.1[at..]);
            self.produce(self.next + have, &mut t[have..], &mut b[have..]);
            (self.ahead, self.ahead_at) = ((t, b), 0);
        }
    }

    /// Outputs `from..` into `out` and their choice bits into `bits` (see
    /// [`SenderIteration::produce`]).
    fn produce(&mut self, from: usize, out: &mut [u128], bits: &mut [u8]) {
        let (core, last) = (&self.core, &mut self.last);
        assert!(from + out.len() <= core.p.n, "silent iteration overrun");
        self.feed.fill(from..from + out.len(), |piece| match piece {
            Piece::Built { chunk, within, at } => {
                let end = at + within.len();
                out[at..end].copy_from_slice(&chunk.0[within.clone()]);
                bits[at..end].copy_from_slice(&chunk.1[within]);
            }
            Piece::Missing { rows, at } => {
                let span = at..at + rows.len();
                let outputs = (&mut out[span.clone()], &mut bits[span]);
                core.build(rows, outputs, last, Threads::Pool);
            }
        });
    }

    /// See [`SenderIteration::build_in_background`].
    pub(crate) fn build_in_background(&mut self) {
        let from = self.next + self.ahead.0.len() - self.ahead_at;
        self.feed.advance(&self.core, from);
    }

    /// See [`SenderIteration::pause_background`].
    pub(crate) fn pause_background(&mut self) {
        self.feed.pause();
    }

    /// Outputs not yet handed out.
    pub(crate) fn left(&self) -> usize {
        self.core.p.n - self.next
    }

    /// Bytes this iteration keeps (the base resident in whole huge pages).
    pub(crate) fn bytes(&self) -> usize {
        let c = &self.core;
        c.base.bytes()
            + c.lpn_bits.len() * 8
            + c.level_bits.len()
            + c.msg.len() * 16
            + self.last.bytes()
            + self.ahead.0.capacity() * 17
            + self.feed.bytes()
    }
}

impl FerretSender {
    /// Bootstraps from IKNP with the published parameter sets ([`params`]). Returns the sender
    /// and the bootstrap iteration, whose outputs beyond the first reserve are usable.
    pub fn setup<C: Channel>(ch: &mut C, iknp: &mut IknpSender) -> Result<(Self, SenderIteration)> {
        Self::setup_with(ch, iknp, params::BOOTSTRAP, params::MAIN)
    }

    pub(crate) fn setup_with<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpSender,
        boot: LpnParams,
        main: LpnParams,
    ) -> Result<(Self, SenderIteration)> {
        check_params(&boot, &main);
        let mut prg = Prg::from_os_entropy();
        let seed = u128::from_le_bytes(prg.block());
        ch.send_msg(&seed.to_le_bytes())?;
        let mut base = HugeTable::new(boot.base_cots());
        base.as_mut_slice()
            .copy_from_slice(&Zeroizing::new(iknp.extend(ch, boot.base_cots())?));
        let delta = iknp.delta();
        let boot_matrix = LpnMatrix::new(seed, 0, boot.k);
        let mut it = SenderIteration::start(ch, boot, boot_matrix, delta, base, &mut prg)?;
        let mut reserve = HugeTable::new(main.base_cots());
        it.take_into(reserve.as_mut_slice());
        let sender = FerretSender {
            delta,
            main,
            matrix: LpnMatrix::new(seed, 1, main.k),
            reserve,
            prg,
        };
        Ok((sender, it))
    }

    /// Δ, the correlation every COT of this sender carries.
    pub fn delta(&self) -> u128 {
        self.delta
    }

    /// One main iteration's flight; its first outputs become the next reserve at once, the
    /// rest ([`Self::batch_size`]) are in the returned iteration, built as they are taken.
    pub fn iterate<C: Channel>(&mut self, ch: &mut C) -> Result<SenderIteration> {
        let next = HugeTable::new(self.reserve.len());
        let base = std::mem::replace(&mut self.reserve, next);
        let matrix = self.matrix.clone();
        let mut it =
            SenderIteration::start(ch, self.main, matrix, self.delta, base, &mut self.prg)?;
        it.take_into(self.reserve.as_mut_slice());
        Ok(it)
    }

    /// One main iteration's usable COTs into `out` (its allocation is reused).
    pub fn extend<C: Channel>(&mut self, ch: &mut C, out: &mut Vec<u128>) -> Result<()> {
        let mut it = self.iterate(ch)?;
        scratch_wiping(out, it.left(), 0);
        it.take_into(out);
        Ok(())
    }

    /// COTs each main iteration hands out.
    pub fn batch_size(&self) -> usize {
        self.main.n - self.main.base_cots()
    }

    /// Bytes the engine keeps between iterations (its reserve).
    pub(crate) fn bytes(&self) -> usize {
        self.reserve.bytes()
    }

    /// The most bytes one main iteration keeps ([`SenderIteration::bytes`]).
    pub(crate) fn iteration_bytes(&self) -> usize {
        let p = self.main;
        huge_bytes(p.base_cots()) + p.t * 16 + (16 << p.depth())
    }
}

impl FerretReceiver {
    /// Bootstraps from IKNP; returns the receiver and the bootstrap iteration, whose outputs
    /// beyond the first reserve are usable.
    pub fn setup<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpReceiver,
    ) -> Result<(Self, ReceiverIteration)> {
        Self::setup_with(ch, iknp, params::BOOTSTRAP, params::MAIN)
    }

    pub(crate) fn setup_with<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpReceiver,
        boot: LpnParams,
        main: LpnParams,
    ) -> Result<(Self, ReceiverIteration)> {
        check_params(&boot, &main);
        let seed_bytes: [u8; 16] = ch.recv_msg_exact(16)?.try_into().expect("exactly 16 bytes");
        let seed = u128::from_le_bytes(seed_bytes);
        let mut prg = Prg::from_os_entropy();
        let base_bits: Zeroizing<Vec<u8>> =
            Zeroizing::new((0..boot.base_cots()).map(|_| prg.bit() as u8).collect());
        let mut base = HugeTable::new(boot.base_cots());
        base.as_mut_slice()
            .copy_from_slice(&Zeroizing::new(iknp.extend(ch, &base_bits)?));
        let boot_matrix = LpnMatrix::new(seed, 0, boot.k);
        let mut it = ReceiverIteration::start(ch, boot, boot_matrix, base, &base_bits)?;
        let r = main.base_cots();
        let mut reserve = HugeTable::new(r);
        let mut reserve_bits = Zeroizing::new(vec![0u8; r]);
        it.take_into(reserve.as_mut_slice(), &mut reserve_bits);
        let receiver = FerretReceiver {
            main,
            matrix: LpnMatrix::new(seed, 1, main.k),
            reserve,
            reserve_bits,
        };
        Ok((receiver, it))
    }

    /// One main iteration's flight (see [`FerretSender::iterate`]).
    pub fn iterate<C: Channel>(&mut self, ch: &mut C) -> Result<ReceiverIteration> {
        let next = HugeTable::new(self.reserve.len());
        let base = std::mem::replace(&mut self.reserve, next);
        let matrix = self.matrix.clone();
        let mut it = ReceiverIteration::start(ch, self.main, matrix, base, &self.reserve_bits)?;
        it.take_into(self.reserve.as_mut_slice(), &mut self.reserve_bits);
        Ok(it)
    }

    /// One main iteration's usable COTs into `out` with their choices in `bits` (allocations
    /// reused).
    pub fn extend<C: Channel>(
        &mut self,
        ch: &mut C,
        out: &mut Vec<u128>,
        bits: &mut Vec<u8>,
    ) -> Result<()> {
        let mut it = self.iterate(ch)?;
        scratch_wiping(out, it.left(), 0);
        scratch_wiping(bits, it.left(), 0);
        it.take_into(out, bits);
        Ok(())
    }

    /// COTs each main iteration hands out.
    pub fn batch_size(&self) -> usize {
        self.main.n - self.main.base_cots()
    }

    /// Bytes the engine keeps between iterations (its reserve and choice bits).
    pub(crate) fn bytes(&self) -> usize {
        self.reserve.bytes() + self.reserve_bits.len()
    }

    /// The most bytes one main iteration keeps ([`ReceiverIteration::bytes`]).
    pub(crate) fn iteration_bytes(&self) -> usize {
        let (p, levels) = (self.main, self.main.t * self.main.depth());
        huge_bytes(p.base_cots()) + p.k.div_ceil(64) * 8 + levels * 17 + (16 << p.depth())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use veil_net::run_two_party;

    fn check_correlation(delta: u128, q: &[u128], t: &[u128], bits: &[u8]) {
        assert_eq!(q.len(), t.len());
        for i in 0..q.len() {
            let want = q[i] ^ if bits[i] == 1 { delta } else { 0 };
            assert_eq!(t[i], want, "COT {i}");
        }
        let ones = bits.iter().filter(|&&b| b == 1).count() as f64;
        let n = bits.len() as f64;
        assert!(
            (ones - n / 2.0).abs() < 6.0 * (n / 4.0).sqrt(),
            "choice bits biased: {ones} of {n}"
        );
    }

    /// The oracle of [`SenderIteration::take_into`]: all n outputs at once, as the iteration
    /// computed them before the seed form (every tree into its bin, then every LPN row).
    pub(crate) fn eager_send(it: &SenderIteration) -> Vec<u128> {
        let (it, p) = (&*it.core, it.core.p);
        let d = p.depth();
        let (lpn_base, levels) = it.base.as_slice().split_at(p.k);
        let mut out = vec![0u128; p.n];
        let mut msg = vec![0u128; d];
        for (i, leaves) in out.chunks_mut(1 << d).enumerate() {
            let level_cots = &levels[i * d..(i + 1) * d];
            send_tree(it.roots[i], it.delta, level_cots, leaves, &mut msg);
        }
        it.matrix.encode(0, &mut out, lpn_base, Threads::Pool);
        out
    }

    /// The oracle of [`ReceiverIteration::take_into`] (see [`eager_send`]).
    pub(crate) fn eager_receive(it: &ReceiverIteration) -> (Vec<u128>, Vec<u8>) {
        let (it, p) = (&*it.core, it.core.p);
        let d = p.depth();
        let (lpn_base, level_t) = it.base.as_slice().split_at(p.k);
        let mut out = vec![0u128; p.n];
        let mut bits = vec![0u8; p.n];
        for (i, (leaves, noise)) in out
            .chunks_mut(1 << d)
            .zip(bits.chunks_mut(1 << d))
            .enumerate()
        {
            let l = i * d..(i + 1) * d;
            let hole = receive_tree(
                &level_t[l.clone()],
                &it.level_bits[l.clone()],
                &it.msg[l],
                leaves,
            );
            noise[hole] = 1;
        }
        it.matrix.encode_with_bits(
            0,
            (&mut out, &mut bits),
            lpn_base,
            &it.lpn_bits,
            Threads::Pool,
        );
        (out, bits)
    }

    /// Set-up and one main iteration of each party with `boot`/`main`: the engines after it,
    /// the bootstrap iterations and the main ones, as they came out of `iterate`.
    #[allow(clippy::type_complexity)]
    fn one_iteration(
        boot: LpnParams,
        main: LpnParams,
    ) -> (
        (FerretReceiver, ReceiverIteration, ReceiverIteration),
        (FerretSender, SenderIteration, SenderIteration),
    ) {
        run_two_party(
            move |c| {
                let mut iknp = IknpReceiver::setup(c)?;
                let (mut r, boot) = FerretReceiver::setup_with(c, &mut iknp, boot, main)?;
                let it = r.iterate(c)?;
                Ok((r, boot, it))
            },
            move |c| {
                let mut iknp = IknpSender::setup(c)?;
                let (mut s, boot) = FerretSender::setup_with(c, &mut iknp, boot, main)?;
                let it = s.iterate(c)?;
                Ok((s, boot, it))
            },
        )
        .unwrap()
    }

    /// Takes the next `m` outputs from both ends and checks them against rows `at..` of the
    /// outputs computed at once.
    fn take_and_check(
        (sit, rit): (&mut SenderIteration, &mut ReceiverIteration),
        m: usize,
        at: usize,
        (q, t, bits): (&[u128], &[u128], &[u8]),
    ) {
        let mut got_q = vec![0u128; m];
        let (mut got_t, mut got_bits) = (vec![0u128; m], vec![0u8; m]);
        sit.take_into(&mut got_q);
        rit.take_into(&mut got_t, &mut got_bits);
        assert_eq!(got_q, q[at..at + m], "sender rows {at}+{m}");
        assert_eq!(got_t, t[at..at + m], "receiver rows {at}+{m}");
        assert_eq!(got_bits, bits[at..at + m], "choice bits {at}+{m}");
    }

    /// Handing an iteration out in calls of any size (0, 1, within a tree, across tree and
    /// LPN-job boundaries, whole trees in parallel) gives exactly the outputs computed at
    /// once, and the engine's next reserve is their prefix.
    #[test]
    fn an_iteration_handed_out_in_pieces_equals_it_computed_at_once() {
        let ((r, rboot, rit), (s, sboot, sit)) = one_iteration(TEST_BOOT, TEST_MAIN);
        let reserve = TEST_MAIN.base_cots();
        let (q, (t, bits)) = (eager_send(&sit), eager_receive(&rit));
        check_correlation(s.delta(), &q, &t, &bits);
        assert_eq!(s.reserve.as_slice(), &q[..reserve]);
        assert_eq!(r.reserve.as_slice(), &t[..reserve]);
        assert_eq!(&r.reserve_bits[..], &bits[..reserve]);
        let (bq, (bt, bb)) = (eager_send(&sboot), eager_receive(&rboot));
        check_correlation(s.delta(), &bq, &bt, &bb);
        // The bootstrap handed the first main reserve out of its prefix.
        assert_eq!(sboot.next, reserve);
        let sizes = [
            0, 1, 0, 1, 61, 511, 512, 513, 1_024, 5_000, 9_000, 1, 2, 3_000, 0,
        ];
        for (mut sit, mut rit, q, t, bits) in [(sit, rit, q, t, bits), (sboot, rboot, bq, bt, bb)] {
            let mut at = sit.next;
            assert_eq!(rit.next, at);
            for &m in sizes.iter().cycle() {
                let m = m.min(sit.left());
                take_and_check((&mut sit, &mut rit), m, at, (&q, &t, &bits));
                at += m;
                if sit.left() == 0 {
                    break;
                }
            }
            assert_eq!((at, rit.left()), (q.len(), 0));
        }
    }

    /// Built in the background between calls (waited for, racing the calls, or paused), an
    /// iteration hands out exactly the outputs computed at once, and the background did build
    /// some of them.
    #[test]
    fn outputs_built_in_the_background_equal_those_computed_at_once() {
        let ((_, _, rit), (_, _, sit)) = one_iteration(TEST_BOOT, TEST_MAIN);
        let (q, (t, bits)) = (eager_send(&sit), eager_receive(&rit));
        let (mut sit, mut rit) = (sit, rit);
        let sizes = [1, 511, 2_048, 3_000, 0, 700, 9_000, 2, 4_100];
        let (mut at, mut built) = (sit.next, false);
        for (call, &m) in sizes.iter().cycle().enumerate() {
            let m = m.min(sit.left());
            sit.build_in_background();
            rit.build_in_background();
            match call % 5 {
                // Paused: what was built is dropped, and the call builds its outputs itself.
                4 => {
                    sit.pause_background();
                    rit.pause_background();
                    assert_eq!(sit.feed.chunks_ready() + rit.feed.chunks_ready(), 0);
                }
                2 => {}
                _ => {
                    sit.feed.wait_built();
                    rit.feed.wait_built();
                    built |= sit.feed.chunks_ready() > 0 && rit.feed.chunks_ready() > 0;
                }
            }
            take_and_check((&mut sit, &mut rit), m, at, (&q, &t, &bits));
            at += m;
            if sit.left() == 0 {
                break;
            }
        }
        assert_eq!((at, rit.left()), (q.len(), 0));
        assert!(built, "nothing was built in the background");
    }

    #[test]
    fn bootstrap_loop_keeps_the_correlation_over_iterations() {
        type Recv = Vec<(Vec<u128>, Vec<u8>)>;
        let (recv, (delta, sent)): (Recv, (u128, Vec<Vec<u128>>)) = run_two_party(
            move |c| {
                let mut iknp = IknpReceiver::setup(c)?;
                let (mut r, _) = FerretReceiver::setup_with(c, &mut iknp, TEST_BOOT, TEST_MAIN)?;
                let mut all = Vec::new();
                let (mut t, mut bits) = (Vec::new(), Vec::new());
                for _ in 0..4 {
                    r.extend(c, &mut t, &mut bits)?;
                    all.push((t.clone(), bits.clone()));
                }
                Ok(all)
            },
            move |c| {
                let mut iknp = IknpSender::setup(c)?;
                let (mut s, _) = FerretSender::setup_with(c, &mut iknp, TEST_BOOT, TEST_MAIN)?;
                let mut all = Vec::new();
                let mut q = Vec::new();
                for _ in 0..4 {
                    s.extend(c, &mut q)?;
                    all.push(q.clone());
                }
                Ok((s.delta(), all))
            },
        )
        .unwrap();
        for ((t, bits), q) in recv.iter().zip(&sent) {
            assert_eq!(q.len(), TEST_MAIN.n - TEST_MAIN.base_cots());
            check_correlation(delta, q, t, bits);
        }
        assert_ne!(sent[0][..100], sent[1][..100], "iterations repeat");
    }

    /// The published sets: one main iteration, computed at once, keeps the correlation.
    #[test]
    fn published_parameters_one_main_iteration() {
        let ((r, rboot, rit), (s, sboot, sit)) = one_iteration(params::BOOTSTRAP, params::MAIN);
        for (q, (t, bits)) in [
            (eager_send(&sboot), eager_receive(&rboot)),
            (eager_send(&sit), eager_receive(&rit)),
        ] {
            check_correlation(s.delta(), &q, &t, &bits);
        }
        assert_eq!(r.reserve.len(), params::MAIN.base_cots());
    }
}
