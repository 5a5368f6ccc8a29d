//! Process-wide settings a Veil binary applies at start, and the process's CPU time (for the
//! benchmarks). The only unsafe code of this crate: three libc calls.

/// Keeps freed memory in the heap instead of returning it to the OS. The HE code allocates and
/// frees polynomials of 64–260 KB at a high rate; with glibc's defaults each such buffer is
/// mapped, zeroed by the kernel and unmapped again, a large part of a key switch, a response
/// and an encryption (measurements in docs/BENCHMARKS.md, "Moved from code comments"). After
/// this call buffers up to 32 MiB (glibc's largest threshold) come from the heap and the heap
/// is never trimmed, so the process's memory is bounded by its peak (which the server's limits
/// bound). The number of malloc arenas is capped at the number of cores: with glibc's default
/// (8 per core) the buffers of the worker pool and of the session threads spread over many
/// arenas, each keeping its own peak. No effect outside glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = i32::try_from(cores).unwrap_or(i32::MAX).max(1);
        // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// Puts the calling thread in the scheduler's idle class (`SCHED_IDLE` on Linux): it runs only
/// when a core would otherwise idle, so background work (the silent-OT pools' building ahead)
/// never slows the protocol's own threads. No effect elsewhere, or if the call is refused.
pub fn run_this_thread_when_idle() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler only reads `param`; pid 0 is the calling thread.
        #[allow(unsafe_code)]
        unsafe {
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
    }
}

/// User + system CPU seconds of this process so far (microsecond resolution), or `None` where
/// the OS does not say. Both parties of a benchmark run in one process, so a difference is their
/// combined CPU time: unlike wall time, it does not depend on other load on the machine.
pub fn cpu_seconds() -> Option<f64> {
    #[cfg(unix)]
    {
        // SAFETY: getrusage only writes the struct we pass; a zeroed rusage is a valid value.
        #[allow(unsafe_code)]
        let (ok, u) = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            (libc::getrusage(libc::RUSAGE_SELF, &mut u) == 0, u)
        };
        if ok {
            let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
            return Some(t(u.ru_utime) + t(u.ru_stime));
        }
    }
    None
}
