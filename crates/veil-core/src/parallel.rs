//! The process's one worker pool: every parallel step of Veil runs on it, the HE batches
//! ([`parallel_map`]: encryptions, products, responses; [`join`]: packing trees), veil-ot's
//! silent-OT expansion (its trees and LPN step, through [`pool`]) and the per-element work of
//! the OT flavours that the non-linear protocols call ([`lanes`]: COT hashing, 1-of-N rows and
//! keys; also the column blocks of an HE batch with few tasks). Beside it, one background thread
//! in the scheduler's idle class ([`in_background`]: veil-ot's pools building their next COTs)
//! waits out HE batches ([`he_batch_running`]).
//!
//! **Why one pool.** A server runs one thread per client session, and every session's batches
//! want all the cores. Workers spawned per call made N concurrent sessions run N times as many
//! threads as cores, which only added switching, thread start-up and per-thread memory (stacks,
//! malloc arenas), since the sessions share the same cores anyway. With one pool the number of
//! worker threads is fixed for the life of the process and concurrent sessions queue their jobs
//! on the same workers.
//!
//! **Size.** `VEIL_THREADS` (a number ≥ 1) when set, otherwise the available cores; read once,
//! when the first parallel step starts the pool. The pool is Veil's own rather than rayon's
//! global one, which candle also uses and may already have started at its own size: ours then
//! still has the size `VEIL_THREADS` says.
//!
//! **No deadlock.** A job on the pool only computes: it never waits on a channel, on a peer or
//! on a lock held across jobs. A session thread outside the pool blocks until its jobs are done;
//! a job that starts a nested parallel step runs it on the pool too, and a worker waiting for
//! such a step runs other jobs meanwhile (rayon's work stealing). So every job can finish
//! however many sessions share the pool. Keep network I/O on the session threads, outside the
//! pool.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use crate::{Error, Prg, Result};

/// Worker threads of the pool: `VEIL_THREADS` when set (to measure how the work scales with
/// threads, or to leave cores to other processes), otherwise the available cores.
pub fn threads() -> usize {
    std::env::var("VEIL_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&t| t >= 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The process's worker pool, started on first use with [`threads`] workers, and with it the
/// background thread ([`in_background`]). Run parallel iterators inside `pool().install(..)`.
pub fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        background_queue();
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads())
            .thread_name(|i| format!("veil-worker-{i}"))
            .build()
            .expect("cannot start the worker threads")
    })
}

/// Work the process does when a core would otherwise idle: veil-ot's pools building their
/// next COTs.
pub trait BackgroundJob: Send + Sync {
    /// Does the work (on the background thread; it may return early when it has none left).
    fn run(&self);
}

/// The background thread's queue; `None` when the thread could not be started.
type BackgroundQueue = Option<Mutex<Sender<Arc<dyn BackgroundJob>>>>;

fn background_queue() -> &'static BackgroundQueue {
    static QUEUE: OnceLock<BackgroundQueue> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (tx, rx) = channel::<Arc<dyn BackgroundJob>>();
        std::thread::Builder::new()
            .name("veil-background".into())
            .spawn(move || {
                crate::process::run_this_thread_when_idle();
                for job in rx {
                    job.run();
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    })
}

/// Queues `job` on the process's one background thread, which runs its jobs one after another
/// in the scheduler's idle class ([`crate::process::run_this_thread_when_idle`]) and starts with
/// the pool, so a process has a fixed number of threads. Background work only ever saves time
/// later: where the thread could not be started, the job is dropped unrun.
pub fn in_background(job: Arc<dyn BackgroundJob>) {
    if let Some(q) = background_queue() {
        let _ = q.lock().unwrap_or_else(|e| e.into_inner()).send(job);
    }
}

/// HE batches running now ([`parallel_map`], [`join`]).
static HE_BATCHES: AtomicUsize = AtomicUsize::new(0);

/// Counts an HE batch while it lives.
struct HeBatch;

impl HeBatch {
    fn start() -> Self {
        HE_BATCHES.fetch_add(1, Ordering::Relaxed);
        HeBatch
    }
}

impl Drop for HeBatch {
    fn drop(&mut self) {
        HE_BATCHES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether an HE batch is running on the pool. Background work (veil-ot's building ahead)
/// waits meanwhile: the batch keeps the cores busy anyway, and the background's memory traffic
/// would only slow it (measured, docs/BENCHMARKS.md session 35).
pub fn he_batch_running() -> bool {
    HE_BATCHES.load(Ordering::Relaxed) > 0
}

/// Maps `f` over `0..count` on the pool, results in index order; `f` gets a PRG seeded from
/// the OS, one per job of the pool (never shared between threads). Every index is its own job:
/// the items are whole HE operations (milliseconds), so on a shared machine an idle worker can
/// always take the next one rather than wait for a descheduled worker's share. A panic in `f`
/// becomes an error.
pub fn parallel_map<T: Send>(
    count: usize,
    f: impl Fn(usize, &mut Prg) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let _batch = HeBatch::start();
    let run = || {
        pool().install(|| {
            (0..count)
                .into_par_iter()
                .with_max_len(1)
                .map_init(Prg::from_os_entropy, |prg, i| f(i, prg))
                .collect()
        })
    };
    catch_unwind(AssertUnwindSafe(run))
        .map_err(|_| Error::Other("a parallel worker panicked".into()))?
}

/// `f` on the consecutive lanes `0..lane`, `lane..2·lane`, … of `0..len` (the last one
/// shorter), results in lane order: on the pool when there are several lanes and the pool has
/// more than one worker, else one after another on the calling thread (with one worker, the two
/// parties' session threads already keep two cores busy). The per-element work of a protocol
/// step (the OT flavours' hashing, a 1-of-N sender's rows) runs in lanes while its messages stay
/// one flight: a lane must depend on its range alone, so the results are those of one lane
/// however the lanes fall. A panic in `f` reaches the caller, as it would on its own thread.
pub fn lanes<T: Send>(len: usize, lane: usize, f: impl Fn(Range<usize>) -> T + Sync) -> Vec<T> {
    assert!(lane > 0, "lanes of length 0");
    let range = |i: usize| i * lane..((i + 1) * lane).min(len);
    let count = len.div_ceil(lane);
    if count <= 1 || pool().current_num_threads() == 1 {
        return (0..count).map(|i| f(range(i))).collect();
    }
    pool().install(|| {
        (0..count)
            .into_par_iter()
            .with_max_len(1)
            .map(|i| f(range(i)))
            .collect()
    })
}

/// `a` and `b`, the second on another worker of the pool when one is free (rayon's join), else
/// one after the other on the calling thread: the two halves of a recursive HE step, such as a
/// packing tree's subtrees. A panic in either reaches the caller.
pub fn join<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    let _batch = HeBatch::start();
    if pool().current_num_threads() == 1 {
        return (a(), b());
    }
    pool().install(|| rayon::join(a, b))
}

/// The lanes' parts as one vector, in order, grown from the first part's buffer: a call of one
/// lane (most calls) copies nothing.
pub fn joined<T>(parts: Vec<Vec<T>>) -> Vec<T> {
    let total: usize = parts.iter().map(Vec::len).sum();
    let mut parts = parts.into_iter();
    let mut all = parts.next().unwrap_or_default();
    all.reserve_exact(total - all.len());
    parts.for_each(|p| all.extend(p));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_index_order_and_errors_and_panics_are_errors() {
        let squares = parallel_map(1000, |i, _| Ok(i * i)).unwrap();
        assert_eq!(squares, (0..1000).map(|i| i * i).collect::<Vec<_>>());
        assert!(parallel_map(0, |_, _| Ok(0u8)).unwrap().is_empty());
        let failed = parallel_map(100, |i, _| {
            if i == 57 {
                Err(Error::Other("57".into()))
            } else {
                Ok(i)
            }
        });
        assert!(matches!(failed, Err(Error::Other(m)) if m == "57"));
        let panicked = parallel_map(10, |i, _| if i == 3 { panic!("3") } else { Ok(i) });
        assert!(panicked.is_err());
    }

    #[test]
    fn nested_maps_and_concurrent_callers_share_the_pool() {
        let outer: Vec<std::thread::JoinHandle<Vec<usize>>> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    parallel_map(20, |i, _| {
                        Ok(parallel_map(5, |j, _| Ok(j))?.iter().sum::<usize>() + i + t)
                    })
                    .unwrap()
                })
            })
            .collect();
        for (t, h) in outer.into_iter().enumerate() {
            assert_eq!(
                h.join().unwrap(),
                (0..20).map(|i| 10 + i + t).collect::<Vec<_>>()
            );
        }
        assert_eq!(pool().current_num_threads(), threads());
    }

    /// A recursive split (a packing tree's shape) inside a pool job gives the serial result, and
    /// a panic in a half becomes the enclosing map's error.
    #[test]
    fn joins_recurse_inside_jobs_and_panics_reach_the_caller() {
        fn sum(range: std::ops::Range<u64>) -> u64 {
            if range.end - range.start <= 4 {
                return range.sum();
            }
            let mid = range.start + (range.end - range.start) / 2;
            let (a, b) = join(|| sum(range.start..mid), || sum(mid..range.end));
            a + b
        }
        assert_eq!(sum(0..1000), 499_500);
        let sums = parallel_map(8, |i, _| Ok(sum(0..100 * i as u64))).unwrap();
        assert_eq!(
            sums,
            (0..8u64).map(|i| (0..100 * i).sum()).collect::<Vec<_>>()
        );
        let panicked = parallel_map(2, |i, _| {
            let (a, b) = join(|| i, || if i == 1 { panic!("half") } else { i });
            Ok(a + b)
        });
        assert!(panicked.is_err());
    }

    #[test]
    fn lanes_cover_the_range_in_order_whatever_their_length() {
        for len in [0usize, 1, 2, 7, 64, 1000, 1001] {
            for lane in [1usize, 3, 64, 1000, 5000] {
                let parts = lanes(len, lane, |r| r.clone().collect::<Vec<_>>());
                assert_eq!(parts.len(), len.div_ceil(lane));
                assert!(parts.iter().all(|p| !p.is_empty() && p.len() <= lane));
                assert_eq!(joined(parts), (0..len).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn every_job_gets_its_own_random_stream() {
        let draws = parallel_map(64, |_, prg| Ok(prg.u64())).unwrap();
        let mut unique = draws.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), draws.len());
    }
}
