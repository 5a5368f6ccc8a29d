//! Private generation's cost benchmark (`veil bench generate`): a seeded random decoder of a
//! real model's shape (`veil_model::decoder::DecoderShape`; the cost does not depend on the
//! weights' values) in the shipped format, both parties in one process over TCP loopback or a
//! link shaped like a given network; a prefill of random prompt tokens, then one greedy step per
//! new token. Reports the set-up (HE keys, base OTs) and every step apart: wall time, bytes each
//! way and flights, per operator class. With [`GenerateBench::friendly`] every block of a Llama
//! shape runs the substitutes (hard-swish or ReLU for SiLU, ReLU-normalise attention; the norms
//! kept), so a fully substituted model's cost can be measured beside the original's. With
//! [`GenerateBench::preprocess`] each decode step is preprocessed after the previous step's
//! logits came back (`crate::decoder`'s preprocessing, the OT pools filled by
//! `pool_fill`): each step's report is then its online cost, and its `offline` field the
//! preprocessing's, measured apart.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use veil_core::{bail, Prg, Result};
use veil_linear::{ClientSession, ServerSession};
use veil_model::decoder::{
    argmax, DecoderActivation, DecoderBlockVariant, DecoderFamily, DecoderShape,
};
use veil_model::{DecoderFormat, FixedDecoder, ProductTruncation};
use veil_net::{run_two_party_on, run_two_party_tcp, shaped_pair, Channel, Meter};
use veil_net::{NetworkModel, RealClock, Role};
use veil_nonlinear::OtSession;

use crate::decoder::{
    pool_fill, ClientTables, DecoderParty, DecoderSide, Generation, ServerDecoder,
};
use crate::report::PhaseCost;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct GenerateBench {
    /// The model's shape.
    pub shape: DecoderShape,
    /// Random prompt tokens run in one prefill.
    pub prompt_tokens: usize,
    /// Greedy steps after the prefill, one token each.
    pub new_tokens: usize,
    /// The shaped link; `None`: TCP loopback.
    pub net: Option<NetworkModel>,
    /// How every product's truncation rounds (the shipped default: one-bit error).
    pub truncation: ProductTruncation,
    /// Every block substituted: this activation for SiLU and ReLU-normalise attention (Llama-family
    /// shapes only; refused for GPT-2). `None`: the original operators.
    pub friendly: Option<DecoderActivation>,
    /// Each decode step preprocessed between tokens, its offline cost reported beside it.
    pub preprocess: bool,
    /// The tables private too ([`ServerDecoder::keep_tables_private`]): each step embeds by
    /// the private lookup and computes the head as an HE product (not with `preprocess`).
    pub private_tables: bool,
    /// Bytes of the server's NTT-domain weights ([`ServerDecoder::with_ntt_budget`]).
    pub ntt_budget: usize,
}

/// The client's meter since its last reset (per class), with the phase's wall time; resets it
/// for the next phase, as a session's set-up and inference are reported apart.
fn phase(meter: &Meter, seconds: f64) -> Value {
    let per_op = meter
        .by_class()
        .into_iter()
        .filter(|(_, s)| s.rounds() > 0)
        .collect();
    meter.reset();
    let mut v = PhaseCost { per_op }.to_json(Role::Client);
    v["wall_s"] = json!(seconds);
    v
}

/// Runs the benchmark; the JSON `veil bench generate --json` prints.
pub fn bench_generate(b: GenerateBench) -> Result<Value> {
    if b.prompt_tokens == 0 {
        bail!(InvalidArgument, "a prompt of at least one token is needed");
    }
    if b.friendly.is_some() && b.shape.config().family != DecoderFamily::Llama {
        bail!(
            Unsupported,
            "the friendly substitutes run in Llama-family decoders only, not the {} shape",
            b.shape.name()
        );
    }
    if b.private_tables && b.preprocess {
        bail!(
            Unsupported,
            "steps of a model with private tables are not preprocessed"
        );
    }
    let mut weights = b.shape.random_weights(7)?;
    if let Some(activation) = b.friendly {
        let friendly = DecoderBlockVariant {
            activation,
            ..DecoderBlockVariant::FRIENDLY
        };
        weights.config.variants = vec![friendly; weights.config.layers];
        weights.config.validate(b.shape.name())?;
    }
    let cfg = weights.config.clone();
    let limit = b.prompt_tokens + b.new_tokens;
    if limit > cfg.max_positions {
        bail!(
            InvalidArgument,
            "{limit} positions exceed the {} shape's {}",
            b.shape.name(),
            cfg.max_positions
        );
    }
    let mut fixed = FixedDecoder::encode(&weights, DecoderFormat::default())?;
    drop(weights);
    // Random weights prove a narrower activation bound than a pretrained model's: pay the
    // pretrained one's comparisons where it is known.
    if let Some(k) = b.shape.pretrained_activation_bits() {
        fixed.widen_activation_bound(k);
    }
    let t = Instant::now();
    let mut server = ServerDecoder::with_ntt_budget(fixed.clone(), b.ntt_budget)?;
    if b.private_tables {
        server = server.keep_tables_private()?;
    }
    let prepare_s = t.elapsed().as_secs_f64();
    let tables = match b.private_tables {
        true => ClientTables::Private(&fixed.config, fixed.format),
        false => ClientTables::Open(fixed.tables()),
    };
    let mut prg = Prg::from_os_entropy();
    let prompt: Vec<u32> = (0..b.prompt_tokens)
        .map(|_| prg.below(cfg.vocab_size as u64) as u32)
        .collect();

    let (t, p, n, limit) = (b.truncation, b.prompt_tokens, b.new_tokens, limit);
    let pre = b.preprocess;
    let report = match b.net {
        None => {
            run_two_party_tcp(
                |c| run_client(c, (&fixed, tables), &prompt, t, n, pre),
                |s| run_server(s, &server, t, p, limit, n, pre),
            )?
            .0
        }
        Some(net) => {
            let pair = shaped_pair(net, Arc::new(RealClock::new()))?;
            run_two_party_on(
                pair,
                |c| run_client(c, (&fixed, tables), &prompt, t, n, pre),
                |s| run_server(s, &server, t, p, limit, n, pre),
            )?
            .0
        }
    };
    let mut v = report;
    v["shape"] = json!(b.shape.name());
    v["prompt_tokens"] = json!(b.prompt_tokens);
    v["new_tokens"] = json!(b.new_tokens);
    v["layers"] = json!(cfg.layers);
    v["network"] = json!(b.net.map(|n| n.to_string()));
    v["truncation"] = json!(format!("{:?}", b.truncation));
    v["activation_bits"] = json!(fixed.activation_bits());
    v["operators"] = json!(match b.friendly {
        Some(activation) => format!("friendly ({activation:?}, ReluNormalise)"),
        None => "original".into(),
    });
    v["preprocess"] = json!(b.preprocess);
    v["private_tables"] = json!(b.private_tables);
    v["weight_preparation_s"] = json!(prepare_s);
    v["ntt_cached_bytes"] = json!(server.ntt_cached_bytes()?);
    Ok(v)
}

/// The client: set-up, the prefill of `prompt`, then `new_tokens` greedy steps (each
/// preprocessed after the previous one when `preprocess`); its meter's report of each, a
/// step's preprocessing as its `offline` field.
fn run_client<C: Channel>(
    ch: &mut C,
    (fixed, tables): (&FixedDecoder, ClientTables<'_>),
    prompt: &[u32],
    truncation: ProductTruncation,
    new_tokens: usize,
    preprocess: bool,
) -> Result<Value> {
    let t = Instant::now();
    let lin = ClientSession::setup(ch, fixed.fp().ring)?;
    let mut ot = OtSession::setup(ch, Role::Client)?;
    let setup = phase(ch.meter(), t.elapsed().as_secs_f64());
    let arithmetic = (truncation, fixed.activation_bits());
    let mut generation = Generation::new(&fixed.config, arithmetic, prompt.len() + new_tokens)?;
    let side = DecoderSide::Client(&lin, tables);
    let mut party = DecoderParty::new(ch, &mut ot, side, &mut generation)?;
    let mut steps = Vec::with_capacity(new_tokens + 1);
    let mut next = prompt.to_vec();
    let mut last_draw = None;
    for i in 0..=new_tokens {
        let (offline, material) = if preprocess && i > 0 {
            let t = Instant::now();
            let m = party.preprocess(1, pool_fill(last_draw, 1))?;
            (
                Some(phase(party.meter(), t.elapsed().as_secs_f64())),
                Some(m),
            )
        } else {
            (None, None)
        };
        let t = Instant::now();
        let before = party.ot_consumed();
        let logits = match material {
            Some(m) => party.client_step_with(&next, m)?,
            None => party.client_step(&next)?,
        }
        .decode(fixed.fp());
        let after = party.ot_consumed();
        last_draw = Some((next.len(), (after.0 - before.0).max(after.1 - before.1)));
        let mut step = phase(party.meter(), t.elapsed().as_secs_f64());
        if preprocess && i > 0 {
            step["offline"] = json!(offline);
        }
        steps.push(step);
        let logits: Vec<f32> = logits.iter().map(|&l| l as f32).collect();
        next = vec![argmax(&logits)?];
    }
    let prefill = steps.remove(0);
    Ok(json!({ "setup": setup, "prefill": prefill, "steps": steps }))
}

/// The server's side of [`run_client`].
fn run_server<C: Channel>(
    ch: &mut C,
    model: &ServerDecoder,
    truncation: ProductTruncation,
    prompt_tokens: usize,
    limit: usize,
    new_tokens: usize,
    preprocess: bool,
) -> Result<()> {
    let lin = ServerSession::setup(ch, model.fixed().fp().ring)?;
    let mut ot = OtSession::setup(ch, Role::Server)?;
    let arithmetic = (truncation, model.fixed().activation_bits());
    let mut generation = Generation::new(model.config(), arithmetic, limit)?;
    let side = DecoderSide::Server(&lin, model);
    let mut party = DecoderParty::new(ch, &mut ot, side, &mut generation)?;
    let mut tokens = prompt_tokens;
    let mut last_draw = None;
    for i in 0..=new_tokens {
        let material = match preprocess && i > 0 {
            true => Some(party.preprocess(1, pool_fill(last_draw, 1))?),
            false => None,
        };
        let before = party.ot_consumed();
        match material {
            Some(m) => party.server_step_with(tokens, m)?,
            None => party.server_step(tokens)?,
        }
        let after = party.ot_consumed();
        last_draw = Some((tokens, (after.0 - before.0).max(after.1 - before.1)));
        tokens = 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2 with `--friendly` is refused before any weights are drawn.
    #[test]
    fn friendly_gpt2_is_refused() {
        let e = bench_generate(GenerateBench {
            shape: DecoderShape::Gpt2,
            prompt_tokens: 1,
            new_tokens: 0,
            net: None,
            truncation: ProductTruncation::OneBitError,
            friendly: Some(DecoderActivation::HardSwish),
            preprocess: false,
            private_tables: false,
            ntt_budget: 0,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("Llama-family decoders only"), "{e}");
    }
}
