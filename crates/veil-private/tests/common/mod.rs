//! Shared by the soak tests: the server's log captured, the process's thread count, a TLS
//! connection pinning the test server.

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use veil_net::{ClientTls, Fingerprint, ServerPin};

/// The log lines the server writes, captured.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// Captures this process's `tracing` output at INFO (once per test binary).
    pub fn capture() -> Self {
        let log = Log::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        log
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Threads of this process now.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// A TLS connection to `addr` pinning `fp`, its handshake within 20 s.
pub fn tls_to(addr: &str, fp: Fingerprint) -> veil_core::Result<veil_net::TlsChannel> {
    ClientTls {
        pin: ServerPin::Fingerprint {
            fp,
            source: "the soak test".into(),
        },
        identity: None,
    }
    .connect(
        TcpStream::connect(addr)?,
        Instant::now() + Duration::from_secs(20),
    )
}
