//! What `veil eval` and `veil embed` share when they set one model's f32 run, its fixed-point
//! simulation and its private run side by side: the f32 output in f64, the largest difference
//! between two outputs, and private sessions with a server thread over TCP loopback.

use std::sync::Arc;

use veil_core::{Error, Result};
use veil_model::tokenize::Encoded;
use veil_model::Model;
use veil_net::TcpChannel;
use veil_private::prepared::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::CostReport;
use veil_private::{
    Client, ClientModel, ClientOptions, LoopbackServer, PromptOptions, ServerModel,
};

/// The f32 model's logits (or pooled vector when it has no classifier), widened to f64 so it
/// compares with the decoded fixed-point outputs.
pub fn f32_output(model: &Model, ids: &[u32], type_ids: &[u32]) -> Result<Vec<f64>> {
    Ok(model
        .transformer
        .output_f32(ids, type_ids)
        .map_err(|e| Error::Other(format!("candle: {e}")))?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The largest |a_i − b_i|.
pub fn max_abs_difference(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()))
}

/// Private runs of `model` with both parties in this process: a server prepared once on a TCP
/// loopback port, and a renewing client ([`Client::connect_renewing`]): a new session (fresh
/// keys) whenever the next prompt might not fit in what the current one's keys may still
/// reveal, so a run of any length neither meets the server's refusal nor prepares the model
/// again.
pub struct Loopback {
    /// Connected at the first inference: a resumed evaluation may spend a long time on the
    /// examples it already has before it needs one, and an idle session is dropped. Declared
    /// before `server` so that, dropped on an error, the session ends before the server waits
    /// out its grace period for it.
    session: Option<Client<TcpChannel>>,
    server: LoopbackServer,
    /// The client's half of the model, until the session takes it.
    client: Option<ClientModel>,
    opts: PromptOptions,
}

impl Loopback {
    /// A server prepared from `model`, and `client` (the public half of the same model, which
    /// the caller may have encoded its prompts with) for the session.
    pub fn start(model: &Model, client: ClientModel, opts: PromptOptions) -> Result<Self> {
        let prepared = Arc::new(ServerModel::from_model(model, DEFAULT_NTT_BUDGET_BYTES)?);
        let server = LoopbackServer::plain(prepared)?;
        Ok(Loopback {
            session: None,
            server,
            client: Some(client),
            opts,
        })
    }

    /// The private output of `enc` (the client embeds with the public tables as any client does).
    pub fn infer(&mut self, enc: &Encoded) -> Result<(Vec<f64>, CostReport)> {
        let session = match &mut self.session {
            Some(s) => s,
            None => {
                let client = self.client.take().ok_or_else(|| {
                    Error::Other("the private session failed to open earlier".into())
                })?;
                self.session.insert(Client::connect_renewing(
                    client,
                    self.server.plain_connector(),
                    self.opts,
                    ClientOptions::default(),
                )?)
            }
        };
        session.infer(enc)
    }

    /// Sessions opened so far.
    pub fn sessions(&self) -> usize {
        self.session.as_ref().map_or(0, Client::sessions)
    }

    /// Ends the session and stops the server.
    pub fn stop(self) -> Result<()> {
        self.session.map(Client::close).transpose()?;
        self.server.stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_difference() {
        assert_eq!(max_abs_difference(&[1.0, -2.0], &[1.5, 1.0]), 3.0);
        assert_eq!(max_abs_difference(&[], &[]), 0.0);
    }
}
