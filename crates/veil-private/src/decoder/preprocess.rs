//! Preprocessing between tokens: a decode step's prompt-independent work, made after the
//! previous step's logits came back (while its token is printed), so that the step itself runs
//! online parts only.
//!
//! [`plan_step`] runs the decoder's one composition (`veil_model::engine::decoder::forward`) on
//! shapes alone ([`StepPlanner`]), at the context the step will have: its linear steps in the
//! engine's order — each fused FC group of every block at the step's rows, each batch of
//! attention products (Q·Kᵀ and P·V, one per key/value head) at that context length.
//! `DecoderParty::preprocess` then makes, in one request, a Delphi mask per FC group
//! (`veil_linear::premask`: all of the step's groups in one Π_MatMul batch) and one Beaver
//! matrix triple per product (`veil_linear::triples`: all of the step's products in one
//! cross-term batch), and fills the silent-OT pools with the COTs the caller asks for.
//! `DecoderParty::client_step_with` / `server_step_with` consume the [`StepMaterial`] in the
//! plan's order: each FC group is then the client's one message D = X0 − R and the server's
//! plaintext product, each batch of attention products one opening each way.
//!
//! **Security model.** Semi-honest, as the single-phase step. Offline: the transcripts of
//! Π_MatMul on a fresh uniform mask and of the cross terms on fresh uniform operands (BFV under
//! the client's key, flooded, counted against the session's HE budget like any product); they
//! depend on public shapes only. Online: D = X0 − R and the openings E = A − U, F = B − V are
//! one-time-padded by masks used once. Material is single-use by construction (a
//! [`StepMaterial`] is taken by value, its masks and triples are not `Clone` and are zeroized
//! when dropped, used or not), and is made for one step: its start position, token count and
//! party are checked before anything is sent, each mask and triple against its product's shape,
//! and a step that leaves material unused is an error. What the server learns is unchanged:
//! that a step of this many tokens is coming.
//!
//! **Error.** None added: the premasked FC and the Beaver products are exact mod 2^ℓ (the
//! offline products carry Π_MatMul's failure probability, 2^-69 per decrypted coefficient at
//! ℓ = 48), so a preprocessed step's logits equal the single-phase step's and, in the faithful
//! mode, the simulator's, bit for bit.
//!
//! **Flights.** Offline: 2 for the FC masks, 2 for the triples, plus the OT refills the fill
//! needs (none when the pools already hold it). Online, per block: one client → server message
//! per FC group (4 in a Llama or a GPT-2 block) and one message each way per batch of attention
//! products (2 batches), in place of each HE product's round trip; the other operators' flights
//! are unchanged. The step's flights do not drop with it: the truncation after each product
//! keeps the direction changes the round trip had (measured on the tests' two-block Llama in
//! the faithful mode: 1,066 flights either way), while the products' online bytes fall from
//! 2,753,428 / 1,022,792 to 4,944 / 2,992 (client → server / server → client).

use veil_core::{ensure, Result, Ring, RingTensor};
use veil_linear::premask::{ClientMask, ServerMask};
use veil_linear::triples::Triple;
use veil_model::decoder::{DecoderActivation, DecoderConfig, DecoderNormKind};
use veil_model::engine::decoder::{
    forward, DecoderEngine, DecoderLayer, DecoderNorm, LogitRows, Rows,
};
use veil_model::AttentionNorm;

use super::model::{dims, fused_group, group_widths};
use crate::preprocess::{record_products, steps_material_bytes, Material, Step};

/// The linear steps of one decoder step of `tokens` tokens after `start` cached positions, in
/// the engine's order: each fused group's lead with its rows, each batch of products with its
/// (n, k, m) per key/value head.
pub fn plan_step(
    cfg: &DecoderConfig,
    ring: Ring,
    start: usize,
    tokens: usize,
) -> Result<Vec<Step<DecoderLayer>>> {
    let mut p = StepPlanner {
        cfg,
        ring,
        start,
        steps: Vec::new(),
    };
    forward(&mut p, cfg, &vec![0; tokens], LogitRows::Last)?;
    Ok(p.steps)
}

/// Bytes one party keeps for a step's material ([`plan_step`]'s steps): the client R and its
/// share per FC group, the server T; both parties U, V and W per product.
pub fn step_material_bytes(
    cfg: &DecoderConfig,
    steps: &[Step<DecoderLayer>],
    client: bool,
) -> Result<usize> {
    steps_material_bytes(
        steps,
        |&lead| {
            let group = fused_group(lead, cfg);
            Ok((dims(lead, cfg)?.0, group_widths(&group, cfg)?.iter().sum()))
        },
        client,
    )
}

/// The COTs to put in the pools when preprocessing a step of `tokens` tokens, from the last
/// step's draw `last` (its tokens, the larger direction's COTs): its draw per token (rounded up)
/// times `tokens`, and an eighth more — most of a step's draw is per row (the norms, the
/// activation, the gated product, the truncations), and the next step's context is longer,
/// which widens its Softmax rows. An estimate, not a bound: what it misses refills online,
/// reported as "OT refill". Both parties compute it from their own pools' count (the draws are
/// in lock-step), and a session's server announces it.
pub(crate) fn pool_fill(last: Option<(usize, u64)>, tokens: usize) -> usize {
    let cots = match last {
        Some((t, drawn)) if t > 0 => {
            let scaled = drawn.div_ceil(t as u64).saturating_mul(tokens as u64);
            scaled.saturating_add(scaled / 8)
        }
        _ => 0,
    };
    usize::try_from(cots)
        .unwrap_or(usize::MAX)
        .min(veil_nonlinear::OtSession::MAX_PRECOMPUTE)
}

/// A decoder engine on shapes: records the linear steps of one step and returns zeros of the
/// right shapes. The LM head is a public table, not a product.
struct StepPlanner<'a> {
    cfg: &'a DecoderConfig,
    ring: Ring,
    start: usize,
    steps: Vec<Step<DecoderLayer>>,
}

impl DecoderEngine for StepPlanner<'_> {
    type Value = RingTensor;

    fn cached(&self) -> usize {
        self.start
    }

    fn embed(&mut self, ids: &[u32], _start: usize) -> Result<RingTensor> {
        RingTensor::zeros(self.ring, &[ids.len(), self.cfg.hidden])
    }

    fn linear(&mut self, id: DecoderLayer, x: &RingTensor) -> Result<RingTensor> {
        let rows = x.dims().0;
        let out = match id {
            DecoderLayer::LmHead => self.cfg.vocab_size,
            id => {
                if fused_group(id, self.cfg)[0] == id {
                    self.steps.push(Step::Fc(id, rows));
                }
                dims(id, self.cfg)?.1
            }
        };
        RingTensor::zeros(self.ring, &[rows, out])
    }

    fn norm(&mut self, _: DecoderNorm, _: DecoderNormKind, x: &RingTensor) -> Result<RingTensor> {
        Ok(x.clone())
    }

    fn rotary(&mut self, x: &RingTensor, _: usize, _: usize) -> Result<RingTensor> {
        Ok(x.clone())
    }

    fn append_cache(
        &mut self,
        _block: usize,
        start: usize,
        k: &RingTensor,
        v: &RingTensor,
    ) -> Result<(RingTensor, RingTensor)> {
        let total = start + k.dims().0;
        Ok((
            RingTensor::zeros(self.ring, &[total, k.dims().1])?,
            RingTensor::zeros(self.ring, &[total, v.dims().1])?,
        ))
    }

    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        record_products(self.ring, &mut self.steps, a, b)
    }

    fn causal_weights(&mut self, _: AttentionNorm, s: &RingTensor, _: usize) -> Result<RingTensor> {
        Ok(s.clone())
    }

    fn gated(
        &mut self,
        _: DecoderActivation,
        gate: &RingTensor,
        _: &RingTensor,
    ) -> Result<RingTensor> {
        Ok(gate.clone())
    }

    fn gelu(&mut self, x: &RingTensor) -> Result<RingTensor> {
        Ok(x.clone())
    }
}

/// One party's half of the material.
pub(super) enum Held {
    /// The client's masks (R and its share) and triples.
    Client(Material<ClientMask, DecoderLayer>),
    /// The server's masks (T) and triples.
    Server(Material<ServerMask, DecoderLayer>),
}

impl Held {
    pub(super) fn next_products(&mut self) -> Result<Vec<Triple>> {
        match self {
            Held::Client(m) => m.next_products(),
            Held::Server(m) => m.next_products(),
        }
    }

    pub(super) fn is_used_up(&self) -> bool {
        match self {
            Held::Client(m) => m.is_used_up(),
            Held::Server(m) => m.is_used_up(),
        }
    }
}

/// One party's preprocessed material for one decoder step: made for the step of `tokens`
/// tokens after `start` cached positions, used by that step only (taken by value; zeroized
/// when dropped).
pub struct StepMaterial {
    pub(super) start: usize,
    pub(super) tokens: usize,
    pub(super) held: Held,
}

impl StepMaterial {
    /// The cached positions the step it was made for starts after.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The tokens of the step it was made for.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Whether it was made for the step of `tokens` tokens after `start` positions.
    pub fn is_for(&self, start: usize, tokens: usize) -> bool {
        (self.start, self.tokens) == (start, tokens)
    }

    /// Refuses, before anything is sent, material made for another step or held by the other
    /// party.
    pub(super) fn check_for(&self, start: usize, tokens: usize, client: bool) -> Result<()> {
        ensure!(
            self.is_for(start, tokens),
            InvalidArgument,
            "material made for a step of {} tokens after {} positions, used for a step of \
             {tokens} after {start}",
            self.tokens,
            self.start
        );
        ensure!(
            matches!(self.held, Held::Client(_)) == client,
            InvalidArgument,
            "the other party's preprocessed material"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::pool_fill;

    /// The last draw and an eighth more after a step as long; after the prefill, its draw per
    /// token (rounded up) times the step's tokens and an eighth more; nothing before any step;
    /// never above what one precompute may ask for.
    #[test]
    fn the_fill_follows_the_last_draw_per_token() {
        assert_eq!(pool_fill(None, 1), 0);
        assert_eq!(pool_fill(Some((1, 800)), 1), 900);
        assert_eq!(pool_fill(Some((8, 8_001)), 1), 1_001 + 125);
        assert_eq!(pool_fill(Some((8, 8_000)), 2), 2_000 + 250);
        assert_eq!(pool_fill(Some((0, 8_000)), 1), 0);
        let max = veil_nonlinear::OtSession::MAX_PRECOMPUTE;
        assert_eq!(pool_fill(Some((1, u64::MAX)), 1), max);
        assert_eq!(pool_fill(Some((2, u64::MAX)), 3), max);
    }
}
