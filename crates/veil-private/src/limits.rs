//! What this machine can hold, for a server's limits: open files (one descriptor per
//! connection) and memory (each session at least [`SESSION_FIXED_BYTES`]). A limit asked beyond
//! them is capped, with the reason, rather than found out under load.

/// Bytes kept per session whatever its length: the client's BFV public and Galois keys, the
/// OT pools and the base-OT state. After their first main refill the two pools keep 30 MB
/// (per direction the engine's reserve, one silent iteration in seed form and the bootstrap's;
/// [`veil_nonlinear::OtSession::pool_bytes`]), plus 33 bytes per COT built ahead or written to
/// the window of a call (the test below measures 50 MB with 590,017 COTs built ahead, the
/// keys' 10 MB, and the 6.5 MB the pools may hold built in the background between calls,
/// [`veil_nonlinear::OtSession::background_bytes_limit`]); the rest leaves room for calls of
/// about 1.8 M COTs (larger ones come with a working set that grows with the tokens,
/// [`crate::server::session_memory_estimate`]).
pub(crate) const SESSION_FIXED_BYTES: u64 = 128 << 20;

/// The most sessions a server runs by default (when memory would allow more).
pub(crate) const MAX_DEFAULT_SESSIONS: usize = 64;

/// Descriptors kept for everything that is not a connection (the listener, model files, logs,
/// the worker pool).
const RESERVED_FILES: u64 = 64;

/// The soft limit on open files (`Max open files` in /proc/self/limits); `None` when unknown or
/// unlimited.
pub(crate) fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The machine's limits relevant to a server.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MachineCaps {
    /// The open-file limit ([`open_file_limit`]).
    pub files: Option<u64>,
    /// The memory for sessions, in bytes.
    pub memory: Option<u64>,
}

impl MachineCaps {
    /// Connections the open-file limit leaves room for.
    fn connections(&self) -> Option<u64> {
        self.files.map(|f| f.saturating_sub(RESERVED_FILES).max(2))
    }

    /// `asked` sessions, capped by memory and open files; why, when capped.
    pub(crate) fn sessions(&self, asked: usize) -> (usize, Option<String>) {
        let mut n = asked as u64;
        let mut why = None;
        if let Some(m) = self.memory {
            let fit = (m / SESSION_FIXED_BYTES).max(1);
            if n > fit {
                n = fit;
                why = Some(format!(
                    "{} MiB of memory for sessions hold at most {fit} (each needs at least {} \
                     MiB)",
                    m >> 20,
                    SESSION_FIXED_BYTES >> 20
                ));
            }
        }
        if let Some(c) = self.connections() {
            // Half the descriptors for sessions, half for connections waiting or handshaking.
            let fit = (c / 2).max(1);
            if n > fit {
                n = fit;
                why = Some(format!(
                    "the open-file limit ({}, ulimit -n) leaves room for {fit} sessions beside \
                     the connections waiting for one",
                    self.files.unwrap_or(0)
                ));
            }
        }
        (n as usize, why)
    }

    /// The queue and the handshakes beside `sessions`, capped so that every connection has a
    /// descriptor: (queue, handshakes, why when capped).
    pub(crate) fn waiting(
        &self,
        sessions: usize,
        queue: usize,
        handshakes: usize,
    ) -> (usize, usize, Option<String>) {
        let Some(c) = self.connections() else {
            return (queue, handshakes, None);
        };
        let room = c.saturating_sub(sessions as u64).max(2);
        if (queue + handshakes) as u64 <= room {
            return (queue, handshakes, None);
        }
        let q = (queue as u64).min(room / 2).max(1) as usize;
        let h = (handshakes as u64).min(room - q as u64).max(1) as usize;
        let why = format!(
            "the open-file limit ({}, ulimit -n) leaves {room} descriptors beside {sessions} \
             sessions",
            self.files.unwrap_or(0)
        );
        (q, h, Some(why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_beyond_the_machine_are_capped_with_the_reason() {
        let roomy = MachineCaps {
            files: Some(1 << 20),
            memory: Some(32 << 30),
        };
        assert_eq!(roomy.sessions(8), (8, None));
        assert_eq!(roomy.waiting(8, 16, 256), (16, 256, None));
        let (n, why) = roomy.sessions(100_000);
        assert_eq!(n, 256);
        assert!(why.unwrap().contains("at most 256"));
        let tight = MachineCaps {
            files: Some(128),
            memory: None,
        };
        let (n, why) = tight.sessions(100);
        assert_eq!(n, 32);
        assert!(why.unwrap().contains("ulimit -n"));
        let (q, h, why) = tight.waiting(32, 64, 256);
        assert!(q + h <= 32 && q >= 1 && h >= 1, "{q} {h}");
        assert!(why.unwrap().contains("128"));
        assert!(open_file_limit().is_some_and(|n| n > 0));
    }

    /// A session's fixed part covers what its set-up keeps, measured: both silent-OT pools after
    /// their first main refill and the client's BFV keys (counted at twice the bytes they
    /// arrive in, a bound on their decoded form).
    #[test]
    fn the_fixed_session_memory_covers_the_pools_and_the_keys() {
        use veil_linear::{ClientSession, ServerSession};
        use veil_net::{run_two_party, Channel, Role};
        use veil_nonlinear::OtSession;
        let ring = crate::protocol::session_format().ring;
        let (_, (keys, pools)) = run_two_party(
            |c| {
                let _keys = ClientSession::setup(c, ring)?;
                let mut ot = OtSession::setup(c, Role::Client)?;
                ot.precompute(c, ot.available().0 + 1)
            },
            |c| {
                let _keys = ServerSession::setup(c, ring)?;
                let keys = c.meter().total().bytes_received;
                let mut ot = OtSession::setup(c, Role::Server)?;
                ot.precompute(c, ot.available().0 + 1)?;
                Ok((keys, ot.pool_bytes() as u64))
            },
        )
        .unwrap();
        // 30.3 MB of engines and seed-form iterations, and the 590,017 COTs built ahead.
        assert_eq!(pools, 49_808_373);
        let ahead = OtSession::background_bytes_limit() as u64;
        assert!(
            pools + ahead + 2 * keys <= SESSION_FIXED_BYTES,
            "pools {pools} B, {ahead} B built ahead and keys {keys} B exceed \
             {SESSION_FIXED_BYTES} B"
        );
    }
}
