//! Preprocessing: the linear layers' prompt-independent work for one future inference of a
//! given length, done before the prompt exists (issue 17's offline phase).
//!
//! [`plan`] runs the model's one composition (`veil_model::engine`) on shapes alone, so the
//! list of linear steps — each FC layer with its rows, each batch of attention products with
//! its shapes — is the engine's own, in its order. [`preprocess_client`] and
//! [`preprocess_server`] then make, for each step, a preprocessed FC mask
//! (`veil_linear::premask`, one Π_MatMul round trip per layer) or one Beaver matrix triple per
//! head (`veil_linear::triples`, one cross-term round trip per batch). The two-party pass
//! ([`crate::forward::Party`]) consumes a [`Material`] step by step: its linear layers are then
//! one message and a plaintext product, its attention products one opening each way.
//!
//! **Security.** Each mask and triple is the single-use value of its module (used once by
//! construction, zeroized on drop; the online steps check shapes), so a [`Material`] is used by
//! exactly one inference and dropped with its session. The offline transcripts are those of
//! Π_MatMul and the cross terms (same flooding, same 128/40-bit parameters, counted against the
//! session's HE budget); the online openings are one-time-padded.
//! The non-linear layers' silent-OT pools are filled in the same request, with the COTs the
//! inference will draw ([`crate::pool_size`], from the shape), as far as the server's
//! per-session budget allows (what does not fit refills online, reported as "OT refill").
//! **Not preprocessed:** the private-embedding lookup (such models are refused).

use std::collections::VecDeque;

use veil_core::{bail, CostClass, Result, Ring, RingTensor};
use veil_linear::fc::{fc_premask_client, fc_premask_server_for};
use veil_linear::premask::{ClientMask, ServerMask};
use veil_linear::triples::{triples_client, triples_server, Triple};
use veil_linear::{ClientSession, ServerSession};
use veil_model::engine::{self, Engine, LayerId, NormId};
use veil_model::{Activation, AttentionNorm, LayerNormKind, ModelConfig};
use veil_net::Channel;

use crate::prepared::{fc_shape, Cuts, ServerModel};

/// One linear step of the composition, in order (an encoder's layers are named by
/// [`LayerId`], a decoder's fused groups by their lead `DecoderLayer`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<I = LayerId> {
    /// A fully connected layer on this many rows.
    Fc(I, usize),
    /// One batch of shared × shared products, (n, k, m) per head.
    Products(Vec<(usize, usize, usize)>),
}

/// A shape planner's batch of shared × shared products: records its (n, k, m) per product and
/// returns zeros of the products' shapes (the encoder's and the decoder's planners alike).
pub(crate) fn record_products<I>(
    ring: Ring,
    steps: &mut Vec<Step<I>>,
    a: &[RingTensor],
    b: &[RingTensor],
) -> Result<Vec<RingTensor>> {
    let dims: Vec<_> = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x.shape()[0], x.shape()[1], y.shape()[1]))
        .collect();
    let out = dims
        .iter()
        .map(|&(n, _, m)| RingTensor::zeros(ring, &[n, m]))
        .collect();
    steps.push(Step::Products(dims));
    out
}

/// The linear steps of one inference of `seq` tokens, in the engine's order.
pub fn plan(cfg: &ModelConfig, ring: Ring, seq: usize) -> Result<Vec<Step>> {
    let mut p = Planner::new(cfg, ring);
    let x = RingTensor::zeros(ring, &[seq, cfg.hidden_size])?;
    engine::encoder_and_head(&mut p, cfg, &x)?;
    Ok(p.steps)
}

/// An engine on shapes: records the linear steps and returns zeros of the right shapes.
pub(crate) struct Planner<'a> {
    cfg: &'a ModelConfig,
    ring: Ring,
    steps: Vec<Step>,
}

impl<'a> Planner<'a> {
    pub(crate) fn new(cfg: &'a ModelConfig, ring: Ring) -> Self {
        Planner {
            cfg,
            ring,
            steps: Vec::new(),
        }
    }
}

impl Engine for Planner<'_> {
    type Scope = ();

    fn scope(&mut self, _class: CostClass) {}

    fn linear(&mut self, id: LayerId, x: &RingTensor) -> Result<RingTensor> {
        let rows = x.shape()[0];
        self.steps.push(Step::Fc(id, rows));
        RingTensor::zeros(self.ring, &[rows, id.dims(self.cfg).1])
    }

    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        record_products(self.ring, &mut self.steps, a, b)
    }

    fn adjust_scores(&mut self, _scores: &mut RingTensor) -> Result<()> {
        Ok(())
    }

    fn attention_norm(&mut self, _: AttentionNorm, scores: &RingTensor) -> Result<RingTensor> {
        Ok(scores.clone())
    }

    fn activation(&mut self, _: Activation, x: &RingTensor) -> Result<RingTensor> {
        Ok(x.clone())
    }

    fn norm(&mut self, _: NormId, _: LayerNormKind, x: &RingTensor) -> Result<RingTensor> {
        Ok(x.clone())
    }

    fn tanh(&mut self, x: &RingTensor) -> Result<RingTensor> {
        Ok(x.clone())
    }

    fn mean_rows(&mut self, x: &RingTensor) -> Result<RingTensor> {
        RingTensor::zeros(self.ring, &[1, x.shape()[1]])
    }
}

/// One party's preprocessed material for one inference of `seq` tokens: a mask per FC step
/// and the triples of each product batch, consumed in the plan's order.
pub struct Material<M, I = LayerId> {
    seq: usize,
    fc: VecDeque<(I, M)>,
    products: VecDeque<Vec<Triple>>,
}

/// The client's material (its FC masks).
pub type ClientMaterial = Material<ClientMask>;
/// The server's material (its FC masks).
pub type ServerMaterial = Material<ServerMask>;

impl<M, I: PartialEq + std::fmt::Debug> Material<M, I> {
    /// Material made from each FC step's mask and each product batch's triples, in order.
    pub(crate) fn new(
        seq: usize,
        fc: impl IntoIterator<Item = (I, M)>,
        products: impl IntoIterator<Item = Vec<Triple>>,
    ) -> Self {
        Material {
            seq,
            fc: fc.into_iter().collect(),
            products: products.into_iter().collect(),
        }
    }

    /// The prompt length it was made for.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// The mask of the next FC step, which must be layer `id`.
    pub(crate) fn next_fc(&mut self, id: I) -> Result<M> {
        match self.fc.pop_front() {
            Some((made, mask)) if made == id => Ok(mask),
            Some((made, _)) => {
                veil_core::bail!(InvalidArgument, "material for {made:?} used for {id:?}")
            }
            None => veil_core::bail!(InvalidArgument, "no preprocessed mask left for {id:?}"),
        }
    }

    /// The triples of the next product batch.
    pub(crate) fn next_products(&mut self) -> Result<Vec<Triple>> {
        self.products
            .pop_front()
            .ok_or_else(|| veil_core::Error::InvalidArgument("no preprocessed triples left".into()))
    }

    /// Whether every step's material was used.
    pub fn is_used_up(&self) -> bool {
        self.fc.is_empty() && self.products.is_empty()
    }
}

/// Bytes one party keeps for the inference these steps plan: the client R and its share per
/// FC step, the server T; both parties U, V and W per head.
pub fn material_bytes(cfg: &ModelConfig, steps: &[Step], client: bool) -> usize {
    steps_material_bytes(steps, |id| Ok(id.dims(cfg)), client).unwrap_or(usize::MAX)
}

/// [`material_bytes`] for steps whose FC layers have (in, out) features `dims(id)`.
pub(crate) fn steps_material_bytes<I>(
    steps: &[Step<I>],
    dims: impl Fn(&I) -> Result<(usize, usize)>,
    client: bool,
) -> Result<usize> {
    let mut elems = 0usize;
    for s in steps {
        elems += match s {
            Step::Fc(id, rows) => {
                let (i, o) = dims(id)?;
                rows * (o + if client { i } else { 0 })
            }
            Step::Products(dims) => dims.iter().map(|&(n, k, m)| n * k + k * m + n * m).sum(),
        };
    }
    Ok(elems * 8)
}

/// What one step made: a mask, or a batch's triples.
enum Made<M> {
    Fc(M),
    Products(Vec<Triple>),
}

/// The material of the planned steps of one inference of `seq` tokens, each made by `make`
/// (this party's side of the step's offline protocol) under the meter label "MatMul".
fn make_material<C: Channel, M>(
    ch: &mut C,
    seq: usize,
    steps: &[Step],
    mut make: impl FnMut(&mut C, &Step) -> Result<Made<M>>,
) -> Result<Material<M>> {
    let mut m = Material {
        seq,
        fc: VecDeque::new(),
        products: VecDeque::new(),
    };
    for step in steps {
        let _g = ch.meter().enter(CostClass::MatMul);
        match (step, make(ch, step)?) {
            (Step::Fc(id, _), Made::Fc(mask)) => m.fc.push_back((*id, mask)),
            (_, Made::Products(t)) => m.products.push_back(t),
            (_, Made::Fc(_)) => bail!(InvalidArgument, "a mask made for a product batch"),
        }
    }
    Ok(m)
}

/// Offline, client: the material for one inference of `seq` tokens, its linear layers on the
/// server's announced `cuts`.
pub(crate) fn preprocess_client<C: Channel>(
    ch: &mut C,
    lin: &ClientSession,
    cfg: &ModelConfig,
    cuts: Cuts,
    ring: Ring,
    seq: usize,
) -> Result<ClientMaterial> {
    make_material(ch, seq, &plan(cfg, ring, seq)?, |ch, step| {
        Ok(match step {
            Step::Fc(id, rows) => {
                let shape = fc_shape(*id, cfg, *rows, cuts);
                Made::Fc(fc_premask_client(ch, lin, &[shape])?.remove(0))
            }
            Step::Products(dims) => Made::Products(triples_client(ch, lin, ring, dims)?),
        })
    })
}

/// Offline, server: the other side of [`preprocess_client`], for the steps of `plan` (the
/// caller has it already, to check the material's size against its budget).
pub(crate) fn preprocess_server<C: Channel>(
    ch: &mut C,
    lin: &ServerSession,
    model: &ServerModel,
    ring: Ring,
    seq: usize,
    steps: &[Step],
) -> Result<ServerMaterial> {
    make_material(ch, seq, steps, |ch, step| {
        Ok(match step {
            Step::Fc(id, rows) => {
                let fc = model.prepared().get(*id)?;
                let shape = fc_shape(*id, model.config(), *rows, model.cuts());
                Made::Fc(fc_premask_server_for(ch, lin, &[(fc, shape)])?.remove(0))
            }
            Step::Products(dims) => Made::Products(triples_server(ch, lin, ring, dims)?),
        })
    })
}
