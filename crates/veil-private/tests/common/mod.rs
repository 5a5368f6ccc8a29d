//! Shared by the soak tests: their model, the server's log captured, the process's thread
//! count, a TLS connection pinning the test server.

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

/// The soak tests' server model: the tiny 2-block shape with friendly operators and faithful
/// truncation (so private results equal the simulator's exactly), seeded random weights; the
/// simulator's model beside it.
pub fn friendly_model(seed: u8) -> (veil_model::FixedModel, Arc<veil_private::ServerModel>) {
    use veil_model::{BlockVariant, ModelConfig, ProductTruncation};
    let mut cfg = ModelConfig::builder(veil_model::Architecture::Bert)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::friendly(); 2];
    cfg.veil.product_truncation = ProductTruncation::Faithful;
    let t = veil_model::random::random_transformer_with_std(&cfg, [seed; 16], 0.2).unwrap();
    let fixed =
        veil_model::FixedModel::encode(&t, veil_core::FixedPoint::default_format()).unwrap();
    let model = Arc::new(veil_private::ServerModel::new(fixed.clone()).unwrap());
    (fixed, model)
}

/// A prompt's embedding (the client's input to the private pass) and the simulator's logits,
/// which a private run with faithful truncation must equal.
pub fn simulated(fixed: &veil_model::FixedModel, ids: &[u32]) -> (veil_core::RingTensor, Vec<f64>) {
    let types = vec![0u32; ids.len()];
    let out = fixed.forward(ids, &types).unwrap();
    let want = out.logits.unwrap().decode(fixed.fp());
    (fixed.embed(ids, &types).unwrap().0, want)
}
