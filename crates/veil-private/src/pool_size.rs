//! How many silent-OT COTs one inference of `seq` tokens draws, from the model's public shape
//! alone, so preprocessing can fill the pools before any inference of that length has run.
//!
//! The non-linear protocols draw COTs in lock-step and independently of the values they work on
//! (a precondition of their security), so the count is a function of the shapes of the calls the
//! composition makes. [`cots_per_inference`] walks `veil_model::engine`'s one composition on
//! shapes (the planner of [`crate::preprocess::plan`] gives each call's output shape) and, for
//! each call that draws COTs, runs that very call of the two-party engine
//! ([`crate::forward::Party`]) on one row and on two rows of zeros, in a local session whose two
//! parties are threads of this process (fresh keys, nothing of any client). Every such operator
//! works row by row, so its draw is `a + b·rows` and the two samples give it; calls of the same
//! kind and width are sampled once. Calls on one row (the head) and the mean over tokens run at
//! their true shape. `tests/preprocess.rs` checks the count against real inferences.
//!
//! Cost: a local set-up (BFV keys, base OTs) and a few one- and two-row operator runs, well
//! under a second for BERT-Base; [`CotCounts`] keeps each length's count for the server.

use std::collections::HashMap;
use std::sync::Mutex;

use veil_core::approx::Approx;
use veil_core::{ensure, CostClass, Result, RingTensor};
use veil_linear::{ClientSession, ServerSession};
use veil_model::engine::{self, Engine, LayerId, NormId};
use veil_model::{Activation, AttentionNorm, LayerNormKind, ModelConfig};
use veil_net::{run_two_party, Channel, Role};
use veil_nonlinear::{Backend, OtSession};

use crate::forward::{Party, Side};
use crate::prepared::{Cuts, ServerModel};
use crate::preprocess::Planner;

/// COTs drawn, in the server's (sending, receiving) direction (the client's are the reverse).
pub type Draw = (u64, u64);

/// The COTs one inference draws, per length asked for so far (at most one entry per length the
/// model takes): what a server's sessions share, so each length is sampled once.
#[derive(Default)]
pub struct CotCounts {
    known: Mutex<HashMap<usize, Draw>>,
}

impl CotCounts {
    /// The silent-OT COTs one inference of `seq` tokens of `model` draws, in the server's
    /// (sending, receiving) direction: sampled once per length ([`cots_per_inference`]), then
    /// remembered.
    pub fn per_inference(&self, model: &ServerModel, seq: usize) -> Result<Draw> {
        let max = model.config().max_sequence_len();
        ensure!(
            (1..=max).contains(&seq),
            InvalidArgument,
            "{seq} tokens (the model takes 1..={max})"
        );
        let known = self.known.lock().map(|m| m.get(&seq).copied());
        if let Ok(Some(d)) = known {
            return Ok(d);
        }
        let d = cots_per_inference(model, Approx::new(model.fixed().fp())?, seq)?;
        if let Ok(mut m) = self.known.lock() {
            m.insert(seq, d);
        }
        Ok(d)
    }
}

/// The COTs one inference of `seq` tokens of `model` draws, in the server's (sending,
/// receiving) direction.
pub(crate) fn cots_per_inference(model: &ServerModel, ax: Approx, seq: usize) -> Result<Draw> {
    let cfg = model.config();
    let ring = ax.fp.ring;
    let announced = (model.fixed().activation_bits(), model.cuts());
    // Both parties walk the composition in lock-step; only their set-up and side differ.
    let (_, server) = run_two_party(
        |ch| {
            let lin = ClientSession::setup(ch, ring)?;
            let ot = OtSession::setup_with(ch, Role::Client, Backend::Iknp)?;
            walk(ch, ot, ax, cfg, Side::Client(&lin, seq), seq, announced)
        },
        |ch| {
            let lin = ServerSession::setup(ch, ring)?;
            let ot = OtSession::setup_with(ch, Role::Server, Backend::Iknp)?;
            walk(ch, ot, ax, cfg, Side::Server(&lin, model), seq, announced)
        },
    )?;
    Ok(server)
}

/// One party's walk through the composition for `seq` tokens, sampling each call (GELU on
/// the model's `activation_bits`, the linear layers on its `cuts`: what the server announces).
fn walk<C: Channel>(
    ch: &mut C,
    mut ot: OtSession,
    ax: Approx,
    cfg: &ModelConfig,
    side: Side<'_>,
    seq: usize,
    (activation_bits, cuts): (Option<u32>, Cuts),
) -> Result<Draw> {
    let ring = ax.fp.ring;
    let party = Party {
        ch,
        ot: &mut ot,
        ax,
        cfg,
        activation_bits,
        cuts,
        side,
        pre: None,
    };
    let mut s = Sampler {
        shapes: Planner::new(cfg, ring),
        party,
        sampled: HashMap::new(),
        total: (0, 0),
    };
    let x = RingTensor::zeros(ring, &[seq, cfg.hidden_size])?;
    engine::encoder_and_head(&mut s, cfg, &x)?;
    Ok(s.total)
}

/// What a sampled call is: the same key means the same draw per row.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum Call {
    Truncation,
    AttentionNorm(AttentionNorm),
    Activation(Activation),
    Norm(LayerNormKind),
    Tanh,
    MeanRows,
}

/// An engine on shapes that adds up the COTs of each call, sampled on the real protocols.
struct Sampler<'a, C: Channel> {
    shapes: Planner<'a>,
    party: Party<'a, C>,
    /// Per call and width (and rows, for calls run at their true shape): the draw of the first
    /// row and of each further row.
    sampled: HashMap<(Call, usize, usize), (Draw, Draw)>,
    total: Draw,
}

impl<'a, C: Channel> Sampler<'a, C> {
    /// Adds the draw of `op` on `rows` rows of width `cols`: sampled on one and two rows, or
    /// run at its true shape when `exact` (or when it has one row).
    fn draw(
        &mut self,
        call: Call,
        rows: usize,
        cols: usize,
        exact: bool,
        op: impl Fn(&mut Party<'a, C>, &RingTensor) -> Result<RingTensor>,
    ) -> Result<()> {
        let exact = exact || rows == 1;
        let key = (call, cols, if exact { rows } else { 0 });
        let (first, more) = match self.sampled.get(&key) {
            Some(&d) => d,
            None => {
                let mut measure = |r: usize| -> Result<Draw> {
                    let x = RingTensor::zeros(self.party.ax.fp.ring, &[r, cols])?;
                    let before = self.party.ot.consumed();
                    op(&mut self.party, &x)?;
                    let after = self.party.ot.consumed();
                    Ok((after.0 - before.0, after.1 - before.1))
                };
                let d = if exact {
                    (measure(rows)?, (0, 0))
                } else {
                    let (one, two) = (measure(1)?, measure(2)?);
                    (one, (two.0 - one.0, two.1 - one.1))
                };
                self.sampled.insert(key, d);
                d
            }
        };
        let further = if exact { 0 } else { rows as u64 - 1 };
        self.total.0 += first.0 + further * more.0;
        self.total.1 += first.1 + further * more.1;
        Ok(())
    }
}

impl<C: Channel> Engine for Sampler<'_, C> {
    type Scope = ();

    fn scope(&mut self, _class: CostClass) {}

    fn linear(&mut self, id: LayerId, x: &RingTensor) -> Result<RingTensor> {
        let y = self.shapes.linear(id, x)?;
        let (rows, cols) = (y.shape()[0], y.shape()[1]);
        self.draw(Call::Truncation, rows, cols, false, |p, x| p.truncate(x))?;
        Ok(y)
    }

    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        let ys = self.shapes.products(a, b)?;
        let rows = ys.iter().map(|y| y.shape()[0]).sum();
        let cols = ys.first().map_or(0, |y| y.shape()[1]);
        self.draw(Call::Truncation, rows, cols, false, |p, x| p.truncate(x))?;
        Ok(ys)
    }

    fn adjust_scores(&mut self, _scores: &mut RingTensor) -> Result<()> {
        Ok(())
    }

    fn attention_norm(&mut self, kind: AttentionNorm, scores: &RingTensor) -> Result<RingTensor> {
        let (rows, cols) = (scores.shape()[0], scores.shape()[1]);
        self.draw(Call::AttentionNorm(kind), rows, cols, false, |p, x| {
            p.attention_norm(kind, x)
        })?;
        self.shapes.attention_norm(kind, scores)
    }

    fn activation(&mut self, kind: Activation, x: &RingTensor) -> Result<RingTensor> {
        let (rows, cols) = (x.shape()[0], x.shape()[1]);
        self.draw(Call::Activation(kind), rows, cols, false, |p, x| {
            p.activation(kind, x)
        })?;
        self.shapes.activation(kind, x)
    }

    fn norm(&mut self, id: NormId, kind: LayerNormKind, x: &RingTensor) -> Result<RingTensor> {
        let (rows, cols) = (x.shape()[0], x.shape()[1]);
        self.draw(Call::Norm(kind), rows, cols, false, |p, x| {
            p.norm(id, kind, x)
        })?;
        self.shapes.norm(id, kind, x)
    }

    fn tanh(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let (rows, cols) = (x.shape()[0], x.shape()[1]);
        self.draw(Call::Tanh, rows, cols, true, |p, x| p.tanh(x))?;
        self.shapes.tanh(x)
    }

    fn mean_rows(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let (rows, cols) = (x.shape()[0], x.shape()[1]);
        self.draw(Call::MeanRows, rows, cols, true, |p, x| p.mean_rows(x))?;
        self.shapes.mean_rows(x)
    }
}
