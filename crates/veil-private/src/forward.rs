//! The encoder and head on shares: [`Party`] is the two-party [`Engine`] that runs
//! `veil_model::engine`'s one composition (the one the simulator runs too), each operator on
//! this party's shares; one code path for both parties.
//!
//! **Error bound.** With [`ProductTruncation::Faithful`] the private result equals the
//! simulator's integers. With [`ProductTruncation::OneBitError`] (the default) every truncation
//! after a linear or attention product may come out one ulp (2^−f) below the simulator's, and
//! Softmax, ReLU-normalise, LayerNorm, centring and the pooler's tanh run their truncations in
//! the 1-bit-error mode of `veil_nonlinear` (products fused with their truncation, at most 2 ulp
//! low each; the operators' own bounds in that mode are on `veil_nonlinear::Ctx`'s layer methods
//! and elementary functions); GELU stays bit-exact. GELU compares on the model's proved bound
//! ([`Party::activation_bits`]), as the simulator does.
//! The deviation is these one-sided errors carried through the later layers (bounded in
//! `tests/`; far below the fixed-point error itself).
//!
//! Role-specific steps are confined to the linear layers (client encrypts, server multiplies),
//! the server-private LayerNorm parameters, and the final reveal of the output to the client.
//! Each step runs under the meter label of its operator class, so the cost report is exact:
//! "MatMul" (HE products), "Truncation" (after each product), "GELU"/"ReLU",
//! "Softmax"/"ReLU-normalise", "LayerNorm"/"Centring", "Head".

use veil_core::approx::{Approx, MEAN_EXTRA_BITS};
use veil_core::{bail, ensure, CostClass, Result, RingTensor};
use veil_linear::fc::fc_online_server;
use veil_linear::premask::online_client;
use veil_linear::triples::{beaver_matmul, Triple};
use veil_linear::{fc_client, fc_server_for, shared_matmul_client, shared_matmul_server};
use veil_linear::{ClientSession, ServerSession};
use veil_model::engine::{self, push_down_keys, Engine, LayerId, NormId};
use veil_model::ProductTruncation;
use veil_model::{Activation, AttentionNorm, LayerNormKind, ModelConfig};
use veil_net::{Channel, LabelGuard, Role};
use veil_nonlinear::{AffineParams, Ctx, HeKeys, OtSession, TruncMode};

use crate::prepared::{fc_shape, Cuts, ServerModel};
use crate::preprocess::{ClientMaterial, ServerMaterial};

/// What only one side has.
pub enum Side<'a> {
    /// The client's keys, and how many leading tokens are real: the others are padding that
    /// hides the true length from the server, masked out by the client alone.
    Client(&'a ClientSession, usize),
    /// The server's session keys and its prepared model.
    Server(&'a ServerSession, &'a ServerModel),
}

/// This party's preprocessed material for the inference ([`crate::preprocess`]), when it has
/// some: its linear layers then run their online steps only.
pub enum Pre<'a> {
    /// The client's.
    Client(&'a mut ClientMaterial),
    /// The server's.
    Server(&'a mut ServerMaterial),
}

impl Pre<'_> {
    /// The triples of the next product batch, whichever party's material this is.
    fn next_products(&mut self) -> Result<Vec<Triple>> {
        match self {
            Pre::Client(m) => m.next_products(),
            Pre::Server(m) => m.next_products(),
        }
    }
}

/// One party's state for one inference.
pub struct Party<'a, C: Channel> {
    /// The channel to the other party.
    pub ch: &'a mut C,
    /// The session's OT pools.
    pub ot: &'a mut OtSession,
    /// The approximations the model's operators run with.
    pub ax: Approx,
    /// The model's public configuration.
    pub cfg: &'a ModelConfig,
    /// k with every GELU input below 2^k, the server's proved bound
    /// (`veil_model::FixedModel::activation_bits`, announced at admission): both parties'
    /// GELUs compare on k bits. None: on the whole ring.
    pub activation_bits: Option<u32>,
    /// Which cuts the linear layers take (the server's, announced at admission).
    pub cuts: Cuts,
    /// What only this party has.
    pub side: Side<'a>,
    /// This inference's preprocessed material, if any.
    pub pre: Option<Pre<'a>>,
}

impl<'a, C: Channel> Party<'a, C> {
    /// Runs every block and the head on this party's share of the embedding output: shares of
    /// the logits, or of the pooled vector when the model has no classifier.
    pub fn encoder_and_head(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let cfg = self.cfg;
        let out = engine::encoder_and_head(self, cfg, x)?;
        Ok(out.logits.unwrap_or(out.pooled))
    }

    fn role(&self) -> Role {
        match self.side {
            Side::Client(..) => Role::Client,
            Side::Server(..) => Role::Server,
        }
    }

    fn cx(&mut self) -> Ctx<'_, C> {
        let role = self.role();
        Ctx::new(self.ot, self.ch, role, self.ax)
    }

    /// The truncation the config's [`ProductTruncation`] asks for: after products, and in
    /// every operator but GELU (Softmax, LayerNorm, tanh and the friendly ones, whose
    /// truncations all come after a product).
    fn product_trunc_mode(&self) -> TruncMode {
        match self.cfg.veil.product_truncation {
            ProductTruncation::Faithful => TruncMode::Faithful,
            ProductTruncation::OneBitError => TruncMode::OneBitError,
        }
    }

    /// A context whose truncations follow [`Self::product_trunc_mode`].
    fn policy_cx(&mut self) -> Ctx<'_, C> {
        let mode = self.product_trunc_mode();
        let mut cx = self.cx();
        cx.trunc_mode = mode;
        cx
    }

    /// ⌊x / 2^f⌋ on the shares of a product, as the config's [`ProductTruncation`] says.
    pub(crate) fn truncate(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let _g = self.ch.meter().enter(CostClass::Truncation);
        let f = self.ax.fp.frac_bits();
        let y = self.policy_cx().trunc(x.data(), f)?;
        RingTensor::from_vec(x.ring(), x.shape(), y)
    }

    /// Client only: pushes its share of every score against a padding key down
    /// ([`push_down_keys`]), a local step the server cannot see. Real queries then attend
    /// exactly as without padding (their probabilities over the padding are 0), so the real
    /// tokens' values equal the unpadded run's.
    fn mask_padding_keys(&self, scores: &mut RingTensor) {
        let Side::Client(_, real) = self.side else {
            return;
        };
        let cols = scores.shape()[1];
        if real >= cols {
            return;
        }
        push_down_keys(self.ax.fp, scores.data_mut(), cols, |_, c| c >= real);
    }

    /// Server only: adds MPNet's relative-position bias ([heads][seq·seq], a public function of
    /// the positions applied to the server's private table) to its own share of the scores.
    fn add_position_bias(&self, scores: &mut RingTensor) {
        let Side::Server(_, m) = self.side else {
            return;
        };
        let Some(bias) = m.fixed().position_bias(scores.shape()[1]) else {
            return;
        };
        let ring = scores.ring();
        for (v, &b) in scores.data_mut().iter_mut().zip(bias.iter().flatten()) {
            *v = ring.add(*v, b);
        }
    }
}

impl<C: Channel> Engine for Party<'_, C> {
    type Scope = LabelGuard;

    fn scope(&mut self, class: CostClass) -> LabelGuard {
        self.ch.meter().enter(class)
    }

    fn linear(&mut self, id: LayerId, x: &RingTensor) -> Result<RingTensor> {
        let acc = {
            let _g = self.ch.meter().enter(CostClass::MatMul);
            match (&self.side, self.pre.as_mut()) {
                (Side::Client(..), Some(Pre::Client(m))) => {
                    online_client(self.ch, vec![m.next_fc(id)?], &[x])?.remove(0)
                }
                (Side::Server(_, model), Some(Pre::Server(m))) => {
                    let fc = model.prepared().get(id)?;
                    fc_online_server(self.ch, vec![(fc, m.next_fc(id)?, x)])?.remove(0)
                }
                (Side::Client(s, _), None) => fc_client(
                    self.ch,
                    s,
                    &fc_shape(id, self.cfg, x.shape()[0], self.cuts),
                    x,
                )?,
                (Side::Server(s, m), None) => {
                    let shape = fc_shape(id, self.cfg, x.shape()[0], self.cuts);
                    fc_server_for(self.ch, s, m.prepared().get(id)?, &shape, x)?
                }
                _ => bail!(InvalidArgument, "the other party's preprocessed material"),
            }
        };
        self.truncate(&acc)
    }

    /// All pairs in one batch of HE products (or, preprocessed, of Beaver triples), then one
    /// truncation of every product.
    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        let role = self.role();
        let acc = {
            let _g = self.ch.meter().enter(CostClass::MatMul);
            match (&self.side, self.pre.as_mut()) {
                (_, Some(pre)) => beaver_matmul(self.ch, role, pre.next_products()?, a, b)?,
                (Side::Client(s, _), None) => shared_matmul_client(self.ch, s, a, b)?,
                (Side::Server(s, ..), None) => shared_matmul_server(self.ch, s, a, b)?,
            }
        };
        ensure!(!acc.is_empty(), InvalidArgument, "no products to compute");
        let joined = RingTensor::concat_rows(&acc.iter().collect::<Vec<_>>())?;
        self.truncate(&joined)?.split_rows(acc[0].shape()[0])
    }

    fn adjust_scores(&mut self, scores: &mut RingTensor) -> Result<()> {
        self.mask_padding_keys(scores);
        self.add_position_bias(scores);
        Ok(())
    }

    fn attention_norm(&mut self, kind: AttentionNorm, scores: &RingTensor) -> Result<RingTensor> {
        let valid = vec![true; scores.shape()[1]];
        let mut cx = self.policy_cx();
        match kind {
            AttentionNorm::Softmax => {
                let _g = cx.ch.meter().enter(CostClass::Softmax);
                cx.softmax(scores, &valid)
            }
            AttentionNorm::ReluNormalise => {
                let _g = cx.ch.meter().enter(CostClass::ReluNormalise);
                let k = cx.ax.relu_bound_bits();
                cx.relu_normalise(scores, &valid, Some(k))
            }
        }
    }

    fn activation(&mut self, kind: Activation, x: &RingTensor) -> Result<RingTensor> {
        let bound = self.activation_bits;
        let mut cx = self.cx();
        match kind {
            Activation::Gelu => {
                let _g = cx.ch.meter().enter(CostClass::Gelu);
                cx.gelu(x, bound)
            }
            Activation::Relu => {
                let _g = cx.ch.meter().enter(CostClass::Relu);
                let k = cx.ax.relu_bound_bits();
                cx.relu_tensor(x, Some(k))
            }
        }
    }

    fn norm(&mut self, id: NormId, kind: LayerNormKind, x: &RingTensor) -> Result<RingTensor> {
        let server_norm = match &self.side {
            Side::Server(_, m) => Some(m.fixed().norm_params(id)?),
            Side::Client(..) => None,
        };
        let params = server_norm.map(|n| AffineParams {
            gamma: &n.gamma,
            beta: &n.beta,
        });
        let eps = self.cfg.layer_norm_eps;
        // The share-product HE keys let LayerNorm's 1-bit-error path run its sum of squares and
        // d·r on BFV (veil-nonlinear's `he_rows`).
        let keys = match &self.side {
            Side::Client(s, _) => HeKeys::client(s, self.ax.fp.ring)?,
            Side::Server(s, ..) => HeKeys::server(s, self.ax.fp.ring)?,
        };
        let mode = self.product_trunc_mode();
        let role = self.role();
        let mut cx = Ctx::new(self.ot, self.ch, role, self.ax).with_he(keys)?;
        cx.trunc_mode = mode;
        match kind {
            LayerNormKind::Exact => {
                let _g = cx.ch.meter().enter(CostClass::LayerNorm);
                cx.layer_norm(x, params.as_ref(), eps)
            }
            LayerNormKind::Centring => {
                let _g = cx.ch.meter().enter(CostClass::Centring);
                cx.centre_affine(x, params.as_ref())
            }
        }
    }

    fn tanh(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let t = self.policy_cx().tanh(x.data())?;
        RingTensor::from_vec(x.ring(), x.shape(), t)
    }

    /// Σ over tokens, then the two truncating steps of `approx::mean_of_sum`.
    fn mean_rows(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let (s, h) = (x.shape()[0], x.shape()[1]);
        let ring = x.ring();
        let sums: Vec<u64> = (0..h)
            .map(|c| (0..s).fold(0u64, |a, r| ring.add(a, x.data()[r * h + c])))
            .collect();
        let (p, c) = self.ax.mean_params(s);
        let f = self.ax.fp.frac_bits();
        let mut cx = self.cx();
        let t = if p > 0 { cx.trunc(&sums, p)? } else { sums };
        RingTensor::from_vec(ring, &[1, h], cx.scale_trunc(&t, c, f + MEAN_EXTRA_BITS)?)
    }
}
