//! Building an iteration's next outputs ahead of their calls on an idle-priority thread, so
//! that a call finds them built instead of running the trees and the LPN step itself.
//!
//! A silent pool's front iteration asks for the [`WINDOW_ROWS`] outputs after the last call's
//! ([`Prefetch::advance`]); the process's background thread (`veil_core::parallel::in_background`),
//! scheduled only when a core would otherwise idle (`SCHED_IDLE` on Linux), builds them [`CHUNK_ROWS`] at a time (whole trees, on that
//! thread alone: never on the worker pool, whose jobs are the protocol's), and waits while an HE
//! batch runs (`veil_core::parallel::he_batch_running`). A call takes the
//! chunks that are ready and builds the rest itself, exactly as before; it never waits for the
//! thread, so a busy machine loses nothing but the thread's wasted chunks. Every output depends
//! only on its index, so the COTs, their order, the flights and the bytes are the same however
//! the work falls (tests in `ferret`).
//!
//! Memory: at most the window plus two chunks per pool (the one being built and the one a call
//! is taking from), counted in the pool's bytes and in the session-memory estimate
//! ([`window_bytes`]). Built chunks are zeroized when dropped, like every COT buffer.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use veil_core::parallel::{in_background, BackgroundJob};

use super::params::LpnParams;

/// Outputs one background job builds at a time (rounded to whole trees): 32,768 COTs, about
/// 3 ms of one core (tests: a few of their small trees).
pub(crate) const CHUNK_ROWS: usize = if cfg!(test) { 2_048 } else { 1 << 15 };

/// Outputs a pool's front iteration keeps built ahead of its last call: 2^17 COTs, 2 MiB sent
/// or 2.1 MiB received per pool (tests: four chunks). A SmolLM2 decode step gained as much
/// with 2^17 as with 2^18 or 2^19 (docs/BENCHMARKS.md, session 35): the calls that find their
/// COTs built are mostly the many small ones, and a large call's first part.
pub(crate) const WINDOW_ROWS: usize = if cfg!(test) { 8_192 } else { 1 << 17 };

/// The most bytes one pool's prefetch holds: the window and two chunks, `entry` bytes a COT.
pub(crate) fn window_bytes(entry: usize) -> usize {
    (WINDOW_ROWS + 2 * CHUNK_ROWS) * entry
}

/// What a prefetch builds: an iteration's outputs (and choice bits), from its seed form.
pub(crate) trait Chunks: Send + Sync + 'static {
    type Chunk: Send + 'static;
    /// The iteration's parameters.
    fn params(&self) -> LpnParams;
    /// Outputs of the iteration.
    fn rows(&self) -> usize {
        self.params().n
    }
    /// Leaves per tree: chunks are whole trees.
    fn tree_rows(&self) -> usize {
        1 << self.params().depth()
    }
    /// Outputs `rows` (whole trees) built on the calling thread alone.
    fn build_here(&self, rows: Range<usize>) -> Self::Chunk;
    /// Bytes of a chunk of `rows` outputs.
    fn chunk_bytes(rows: usize) -> usize;
    /// Outputs a chunk holds.
    fn chunk_len(chunk: &Self::Chunk) -> usize;
}

struct State<T> {
    /// Built chunks, ascending: (first row, outputs).
    built: VecDeque<(usize, T)>,
    /// The chunk being built, by its first row.
    working: Option<usize>,
    /// New chunks start at or after this row (the end of the last call).
    from: usize,
    /// Chunks end at or before this row.
    target: usize,
    /// Whether a job for this prefetch is queued or running.
    queued: bool,
    /// The iteration is gone: nothing more is built.
    closed: bool,
}

/// One iteration's outputs built ahead (shared by the iteration and the background thread).
pub(crate) struct Prefetch<B: Chunks> {
    core: Arc<B>,
    state: Mutex<State<B::Chunk>>,
}

impl<B: Chunks> Prefetch<B> {
    pub(crate) fn new(core: Arc<B>) -> Arc<Self> {
        Arc::new(Prefetch {
            core,
            state: Mutex::new(State {
                built: VecDeque::new(),
                working: None,
                from: 0,
                target: 0,
                queued: false,
                closed: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<B::Chunk>> {
        // A poisoned state only means a build panicked; its chunk was never pushed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunk_rows(&self) -> usize {
        let l = self.core.tree_rows();
        (CHUNK_ROWS / l).max(1) * l
    }

    /// The next chunk to build, as rows, or `None` when the window is built.
    fn next_chunk(&self, s: &State<B::Chunk>) -> Option<Range<usize>> {
        let c = self.chunk_rows();
        let after = s
            .working
            .into_iter()
            .chain(s.built.back().map(|b| b.0))
            .max()
            .map_or(0, |start| start + c);
        let start = s.from.next_multiple_of(c).max(after);
        let end = (start + c).min(self.core.rows());
        (start < end && end <= s.target.min(self.core.rows())).then_some(start..end)
    }

    /// Asks for the outputs `from..from + WINDOW_ROWS` (`from`: the end of the last call).
    pub(crate) fn advance(self: &Arc<Self>, from: usize) {
        let mut s = self.lock();
        s.from = from;
        s.target = from + WINDOW_ROWS;
        if s.closed || s.queued || self.next_chunk(&s).is_none() {
            return;
        }
        s.queued = true;
        drop(s);
        in_background(self.clone());
    }

    /// The built chunk holding `row`, taken out, after dropping those wholly before it; or
    /// where the next built chunk starts (the caller builds up to there itself).
    pub(crate) fn take_chunk(&self, row: usize) -> Result<(usize, B::Chunk), Option<usize>> {
        let c = self.chunk_rows();
        let mut s = self.lock();
        while s.built.front().is_some_and(|b| b.0 + c <= row) {
            s.built.pop_front();
        }
        match s.built.front() {
            Some(&(start, _)) if start <= row => Ok(s.built.pop_front().expect("front exists")),
            front => Err(front.map(|b| b.0)),
        }
    }

    /// Stops building (the iteration is dropped); built chunks are dropped and wiped.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.built.clear();
    }

    /// Builds chunks until the window is built or the iteration is gone (the background
    /// thread's job).
    pub(crate) fn build_window(&self) {
        loop {
            // HE batches keep the cores busy: the idle moments they leave are too short to
            // help, and a chunk's table reads would slow them.
            while veil_core::parallel::he_batch_running() {
                if self.lock().closed {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let rows = {
                let mut s = self.lock();
                match (s.closed, self.next_chunk(&s)) {
                    (false, Some(rows)) => {
                        s.working = Some(rows.start);
                        rows
                    }
                    _ => {
                        s.queued = false;
                        return;
                    }
                }
            };
            let chunk = self.core.build_here(rows.clone());
            let mut s = self.lock();
            s.working = None;
            if !s.closed {
                s.built.push_back((rows.start, chunk));
            }
        }
    }
}

impl<B: Chunks> BackgroundJob for Prefetch<B> {
    fn run(&self) {
        self.build_window()
    }
}

/// A run of the rows a call asks for: held by a built chunk (`within` it), or to be built by
/// the caller; `at` is the run's offset in the call's output.
pub(crate) enum Piece<'a, T> {
    Built {
        chunk: &'a T,
        within: Range<usize>,
        at: usize,
    },
    Missing {
        rows: Range<usize>,
        at: usize,
    },
}

/// An iteration's end of its prefetch: started by [`Feed::advance`], with the chunk a call is
/// taking from. Dropping it stops the background work on the iteration.
pub(crate) struct Feed<B: Chunks> {
    prefetch: Option<Arc<Prefetch<B>>>,
    current: Option<(usize, B::Chunk)>,
}

impl<B: Chunks> Default for Feed<B> {
    fn default() -> Self {
        Feed {
            prefetch: None,
            current: None,
        }
    }
}

/// The same iteration at the same point, without its background work (tests compare
/// iterations with their clones).
#[cfg(test)]
impl<B: Chunks> Clone for Feed<B> {
    fn clone(&self) -> Self {
        Feed::default()
    }
}

impl<B: Chunks> Drop for Feed<B> {
    fn drop(&mut self) {
        self.pause();
    }
}

impl<B: Chunks> Feed<B> {
    /// Splits `rows` into pieces, in order: the runs built chunks hold, and the runs between
    /// them the caller builds (all of `rows` before the first [`Feed::advance`]).
    pub(crate) fn fill(&mut self, rows: Range<usize>, mut piece: impl FnMut(Piece<'_, B::Chunk>)) {
        let mut r = rows.start;
        while r < rows.end {
            if let Some((start, chunk)) = &self.current {
                let (start, end) = (*start, *start + B::chunk_len(chunk));
                if (start..end).contains(&r) {
                    let stop = end.min(rows.end);
                    piece(Piece::Built {
                        chunk,
                        within: r - start..stop - start,
                        at: r - rows.start,
                    });
                    r = stop;
                }
                if r >= end {
                    self.current = None;
                }
                continue;
            }
            let next = match self.prefetch.as_ref().map(|p| p.take_chunk(r)) {
                Some(Ok(chunk)) => {
                    self.current = Some(chunk);
                    continue;
                }
                Some(Err(next)) => next,
                None => None,
            };
            let stop = next.map_or(rows.end, |s| s.min(rows.end));
            piece(Piece::Missing {
                rows: r..stop,
                at: r - rows.start,
            });
            r = stop;
        }
    }

    /// Builds the window after row `from` in the background (see [`Prefetch::advance`]).
    pub(crate) fn advance(&mut self, core: &Arc<B>, from: usize) {
        self.prefetch
            .get_or_insert_with(|| Prefetch::new(core.clone()))
            .advance(from);
    }

    /// Waits until the background thread has built the window (tests).
    #[cfg(test)]
    pub(crate) fn wait_built(&self) {
        let Some(p) = &self.prefetch else { return };
        for _ in 0..10_000 {
            if !p.lock().queued {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the background thread built nothing in 10 s");
    }

    /// Chunks built and not yet taken (tests).
    #[cfg(test)]
    pub(crate) fn chunks_ready(&self) -> usize {
        self.prefetch.as_ref().map_or(0, |p| p.lock().built.len())
    }

    /// Stops the background work (its built chunks are dropped and wiped); a later
    /// [`Feed::advance`] starts it again.
    pub(crate) fn pause(&mut self) {
        if let Some(p) = self.prefetch.take() {
            p.close();
        }
    }

    /// Bytes held for the chunks built ahead, being built and being taken from: the most
    /// they take ([`window_bytes`]) while running, so that a pool's count does not depend on
    /// how far the background thread got.
    pub(crate) fn bytes(&self) -> usize {
        match (&self.prefetch, &self.current) {
            (Some(_), _) => window_bytes(B::chunk_bytes(1)),
            (None, Some((_, c))) => B::chunk_bytes(B::chunk_len(c)),
            (None, None) => 0,
        }
    }
}
