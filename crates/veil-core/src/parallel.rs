//! The one work-sharing helper of Veil's batches (HE products, encryptions, responses): scoped
//! threads over an index range, each with its own PRG.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use crate::{Error, Prg, Result};

/// Worker threads of one batch: the available cores (at most 8), or `VEIL_THREADS` when set (to
/// measure how the work scales with threads).
fn workers() -> usize {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    std::env::var("VEIL_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&t| t >= 1)
        .unwrap_or(cores)
        .min(8)
}

/// Maps `f` over `0..count` on the available cores; `f` gets its own PRG per worker. Workers
/// take the next index from a shared counter rather than a fixed chunk each, so on a shared
/// machine a descheduled worker does not leave the other idle at the end.
pub fn parallel_map<T: Send>(
    count: usize,
    f: impl Fn(usize, &mut Prg) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let w = workers().min(count).max(1);
    let next = AtomicUsize::new(0);
    let (f, next) = (&f, &next);
    let mut done: Vec<(usize, T)> = thread::scope(|s| {
        let handles: Vec<_> = (0..w)
            .map(|_| {
                s.spawn(move || {
                    let mut prg = Prg::from_os_entropy();
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return Ok(out);
                        }
                        out.push((i, f(i, &mut prg)?));
                    }
                })
            })
            .collect();
        let mut all = Vec::with_capacity(count);
        for h in handles {
            let part: Result<Vec<(usize, T)>> = h
                .join()
                .map_err(|_| Error::Other("a parallel worker panicked".into()))?;
            all.extend(part?);
        }
        Ok::<_, Error>(all)
    })?;
    done.sort_unstable_by_key(|&(i, _)| i);
    Ok(done.into_iter().map(|(_, v)| v).collect())
}
