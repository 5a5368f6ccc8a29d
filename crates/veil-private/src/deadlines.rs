//! How long each step of a session may take: the server's [`Deadlines`] per step, which the
//! client also uses as the least it allows an inference, and the naming of a step that timed
//! out.

use std::time::Duration;

use veil_model::ModelConfig;

/// How long a server waits on a silent client between requests before dropping the session.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long each step of a session may take on the server (a total per step, not per read).
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// TLS handshake and the client's hello.
    pub handshake: Duration,
    /// Key set-up (BFV keys, base OTs, the first silent-COT bootstrap).
    pub setup: Duration,
    /// Between two requests.
    pub idle: Duration,
    /// One inference: `infer_base` + `infer_per_token` × its tokens (times the load factor the
    /// server passes when sessions share the cores).
    pub infer_base: Duration,
    /// See `infer_base`.
    pub infer_per_token: Duration,
}

impl Deadlines {
    /// Deadlines for a model: the per-token allowance grows with the blocks and the square of
    /// the width (BERT-Base: 18 s per token, so 128 tokens get 39 min, about 4× the measured
    /// time of the original operators and 30× the substituted ones on two cores).
    pub fn for_model(cfg: &ModelConfig) -> Self {
        let width = (cfg.hidden_size as f64 / 768.0).max(1.0 / 16.0);
        let per_token = 1.5 * cfg.num_layers as f64 * width * width;
        Deadlines {
            handshake: Duration::from_secs(10),
            setup: Duration::from_secs(120),
            idle: IDLE_TIMEOUT,
            infer_base: Duration::from_secs(60),
            infer_per_token: Duration::from_secs_f64(per_token.max(0.01)),
        }
    }

    /// Deadlines for a decoder's generation sessions: an encoder's handshake, set-up and idle
    /// allowances; a step gets `infer_base` + `infer_per_token` × its tokens, 2 s per block and
    /// token (a decode step of a 30-block model: 1 min beyond the base, many times its measured
    /// time on two cores).
    pub fn for_decoder(cfg: &veil_model::decoder::DecoderConfig) -> Self {
        Deadlines {
            handshake: Duration::from_secs(10),
            setup: Duration::from_secs(120),
            idle: IDLE_TIMEOUT,
            infer_base: Duration::from_secs(60),
            infer_per_token: Duration::from_secs(2) * cfg.layers.max(1) as u32,
        }
    }

    /// These deadlines with the set-up's and each inference's allowance `factor` times longer.
    pub fn stretched(self, factor: u32) -> Self {
        Deadlines {
            setup: self.setup * factor,
            infer_base: self.infer_base * factor,
            infer_per_token: self.infer_per_token * factor,
            ..self
        }
    }

    /// The deadline of one inference of `seq` tokens, stretched by `load` (≥ 1).
    pub fn inference(&self, seq: usize, load: f64) -> Duration {
        (self.infer_base + self.infer_per_token.mul_f64(seq as f64)).mul_f64(load.max(1.0))
    }
}

/// A timed-out step, named.
pub(crate) fn in_step(e: veil_core::Error, step: &str, budget: Duration) -> veil_core::Error {
    match e {
        veil_core::Error::TimedOut(m) => veil_core::Error::TimedOut(format!(
            "{step} did not finish within {:.1} s ({m})",
            budget.as_secs_f64()
        )),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretched_deadlines_lengthen_set_up_and_inference_only() {
        let cfg = veil_model::random::Preset::BertTiny.config();
        let d = Deadlines::for_model(&cfg);
        let s = d.stretched(10);
        assert_eq!(s.inference(8, 1.0), d.inference(8, 1.0) * 10);
        assert_eq!(s.setup, d.setup * 10);
        assert_eq!((s.handshake, s.idle), (d.handshake, d.idle));
    }
}
