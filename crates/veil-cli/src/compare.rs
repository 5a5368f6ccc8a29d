//! What `veil eval` and `veil embed` share when they set one model's f32 run, its fixed-point
//! simulation and its private run side by side: the f32 output in f64, the largest difference
//! between two outputs, and a private session with a server thread over TCP loopback.

use std::sync::Arc;

use veil_core::{Error, Result};
use veil_model::Model;
use veil_net::TcpChannel;
use veil_private::prepared::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::{Client, ClientModel, ClientOptions, PromptOptions, ServerModel};

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

/// A client session with a server thread of `model` on TCP loopback; the client embeds with
/// the public tables as any client does.
pub fn loopback_client(
    model: &Model,
    client_model: ClientModel,
    opts: PromptOptions,
) -> Result<Client<TcpChannel>> {
    let server = Arc::new(ServerModel::from_model(model, DEFAULT_NTT_BUDGET_BYTES)?);
    Client::connect(
        client_model,
        veil_private::loopback_channel(server)?,
        opts,
        ClientOptions::default(),
    )
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
