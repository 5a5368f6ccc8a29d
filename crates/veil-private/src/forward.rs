//! The encoder and head on shares: one code path for both parties, mirroring
//! `veil_model::sim::FixedModel::forward` step by step.
//!
//! **Error bound.** With [`ProductTruncation::Faithful`] the private result equals the
//! simulator's integers. With [`ProductTruncation::OneBitError`] (the default) every truncation
//! after a linear or attention product may come out one ulp (2^−f) below the simulator's, and
//! Softmax, ReLU-normalise, LayerNorm and centring run their truncations in the 1-bit-error mode
//! of `veil_nonlinear` (products fused with their truncation, at most 2 ulp low each; the
//! operators' own bounds in that mode are in `veil_nonlinear::composite`); GELU stays bit-exact.
//! The deviation is these one-sided errors carried through the later layers (bounded in
//! `tests/`; far below the fixed-point error itself).
//!
//! Role-specific steps are confined to [`Party::linear`] (client encrypts, server multiplies),
//! the server-private LayerNorm parameters, and the final reveal of the output to the client.
//! Each step runs under the meter label of its operator class, so the cost report is exact:
//! "MatMul" (HE products), "Truncation" (after each product), "GELU"/"ReLU",
//! "Softmax"/"ReLU-normalise", "LayerNorm"/"Centring", "Head".

use veil_core::approx::{Approx, MEAN_EXTRA_BITS};
use veil_core::{ensure, Result, RingTensor};
use veil_linear::{fc_client, fc_server, shared_matmul_client, shared_matmul_server};
use veil_linear::{ClientSession, ServerSession};
use veil_model::sim::FixedNorm;
use veil_model::ProductTruncation;
use veil_model::{Activation, AttentionNorm, HeadKind, LayerNormKind, ModelConfig};
use veil_net::{Channel, Role};
use veil_nonlinear::{AffineParams, Ctx, HeKeys, OtSession, TruncMode};

use crate::layers::{LayerId, ServerModel};

/// How far below every real attention score the client pushes the scores of padding keys:
/// far enough that Softmax's exp clamps them to exactly 0 and ReLU-normalise's ReLU zeroes
/// them (real scores stay far inside ±4096), small enough to stay clear of the ring's range
/// (2^25 at f = 13 in a 41-bit ring).
pub const PADDING_KEY_OFFSET: f64 = 4096.0;

/// What only one side has.
pub enum Side<'a> {
    /// The client's keys, and how many leading tokens are real: the others are padding that
    /// hides the true length from the server, masked out by the client alone.
    Client(&'a ClientSession, usize),
    Server(&'a ServerSession, &'a ServerModel),
}

/// One party's state for one inference.
pub struct Party<'a, C: Channel> {
    pub ch: &'a mut C,
    pub ot: &'a mut OtSession,
    pub ax: Approx,
    pub cfg: &'a ModelConfig,
    pub side: Side<'a>,
}

fn columns(x: &RingTensor, from: usize, width: usize) -> Result<RingTensor> {
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let d: Vec<u64> = (0..rows)
        .flat_map(|r| {
            x.data()[r * cols + from..r * cols + from + width]
                .iter()
                .copied()
        })
        .collect();
    RingTensor::from_vec(x.ring(), &[rows, width], d)
}

fn stack_rows(parts: &[RingTensor]) -> Result<RingTensor> {
    let cols = parts[0].shape()[1];
    let rows: usize = parts.iter().map(|p| p.shape()[0]).sum();
    let d: Vec<u64> = parts
        .iter()
        .flat_map(|p| p.data().iter().copied())
        .collect();
    RingTensor::from_vec(parts[0].ring(), &[rows, cols], d)
}

impl<'a, C: Channel> Party<'a, C> {
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

    fn tensor(&self, like: &RingTensor, data: Vec<u64>) -> Result<RingTensor> {
        RingTensor::from_vec(like.ring(), like.shape(), data)
    }

    /// The truncation the config's [`ProductTruncation`] asks for.
    fn product_trunc_mode(&self) -> TruncMode {
        match self.cfg.veil.product_truncation {
            ProductTruncation::Faithful => TruncMode::Faithful,
            ProductTruncation::OneBitError => TruncMode::OneBitError,
        }
    }

    /// A context whose truncations follow [`Self::product_trunc_mode`]: for truncations after
    /// products, and for every operator but GELU (Softmax, LayerNorm and the friendly ones, whose
    /// truncations all come after a product).
    fn policy_cx(&mut self) -> Ctx<'_, C> {
        let mode = self.product_trunc_mode();
        let mut cx = self.cx();
        cx.trunc_mode = mode;
        cx
    }

    /// ⌊x / 2^f⌋ on the shares of a product, as the config's [`ProductTruncation`] says.
    fn truncate(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let _g = self.ch.meter().enter("Truncation");
        let f = self.ax.fp.frac_bits();
        let mut cx = self.policy_cx();
        let y = cx.trunc(x.data(), f)?;
        self.tensor(x, y)
    }

    /// ⌊(x·Wᵀ + b) / 2^f⌋ for the server's layer `id`.
    fn linear(&mut self, id: LayerId, x: &RingTensor) -> Result<RingTensor> {
        let acc = {
            let _g = self.ch.meter().enter("MatMul");
            match &self.side {
                Side::Client(s, _) => fc_client(self.ch, s, &id.public(self.cfg, x.shape()[0]), x)?,
                Side::Server(s, m) => fc_server(self.ch, s, m.prepared().get(id)?, x)?,
            }
        };
        self.truncate(&acc)
    }

    /// ⌊(Σ_h a_h·b_h) / 2^f⌋ per pair, both operands shared.
    fn shared_products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        let acc = {
            let _g = self.ch.meter().enter("MatMul");
            match &self.side {
                Side::Client(s, _) => shared_matmul_client(self.ch, s, a, b)?,
                Side::Server(s, ..) => shared_matmul_server(self.ch, s, a, b)?,
            }
        };
        let joined = self.truncate(&stack_rows(&acc)?)?;
        let rows = acc[0].shape()[0];
        let cols = acc[0].shape()[1];
        (0..acc.len())
            .map(|i| {
                RingTensor::from_vec(
                    joined.ring(),
                    &[rows, cols],
                    joined.data()[i * rows * cols..(i + 1) * rows * cols].to_vec(),
                )
            })
            .collect()
    }

    fn norm(
        &mut self,
        x: &RingTensor,
        pick: impl Fn(&ServerModel) -> &FixedNorm,
        kind: LayerNormKind,
    ) -> Result<RingTensor> {
        let server_norm = match &self.side {
            Side::Server(_, m) => Some(pick(m)),
            Side::Client(..) => None,
        };
        let params = server_norm.map(|n| AffineParams {
            gamma: &n.gamma,
            beta: &n.beta,
        });
        let eps = self.cfg.layer_norm_eps;
        let role = self.role();
        let policy = self.product_trunc_mode();
        // The share-product HE keys let LayerNorm's 1-bit-error path run its sum of squares and
        // d·r on BFV (veil_nonlinear::rows).
        let keys = match &self.side {
            Side::Client(s, _) => HeKeys::client(s)?,
            Side::Server(s, ..) => HeKeys::server(s)?,
        };
        let mut cx = Ctx::new(self.ot, self.ch, role, self.ax).with_he(keys)?;
        cx.trunc_mode = policy;
        match kind {
            LayerNormKind::Exact => {
                let _g = cx.ch.meter().enter("LayerNorm");
                cx.layer_norm(x, params.as_ref(), eps)
            }
            LayerNormKind::Centring => {
                let _g = cx.ch.meter().enter("Centring");
                cx.centre_affine(x, params.as_ref())
            }
        }
    }

    /// Client only: subtracts [`PADDING_KEY_OFFSET`] from its share of every score against a
    /// padding key, a local step the server cannot see. Real queries then attend exactly as
    /// without padding (their probabilities over the padding are 0), so the real tokens' values
    /// equal the unpadded run's.
    fn mask_padding_keys(&self, scores: &mut RingTensor) {
        let Side::Client(_, real) = self.side else {
            return;
        };
        let cols = scores.shape()[1];
        if real >= cols {
            return;
        }
        let ring = scores.ring();
        let offset = ring.neg(self.ax.fp.encode(PADDING_KEY_OFFSET));
        for row in scores.data_mut().chunks_mut(cols) {
            for v in &mut row[real..] {
                *v = ring.add(*v, offset);
            }
        }
    }

    /// Server only: adds MPNet's relative-position bias ([heads][seq·seq], a public function of
    /// the positions applied to the server's private table) to its own share of the scores.
    fn add_position_bias(&self, scores: &mut RingTensor, bias: Option<&[Vec<u64>]>) {
        let Some(bias) = bias else { return };
        let ring = scores.ring();
        for (v, &b) in scores.data_mut().iter_mut().zip(bias.iter().flatten()) {
            *v = ring.add(*v, b);
        }
    }

    /// One encoder block (sim: `FixedModel::block`).
    fn block(
        &mut self,
        i: usize,
        x: &RingTensor,
        position_bias: Option<&[Vec<u64>]>,
    ) -> Result<RingTensor> {
        let variant = self.cfg.veil.blocks[i];
        let (s, h) = (x.shape()[0], x.shape()[1]);
        let nh = self.cfg.num_heads;
        let dh = h / nh;
        let qkv = self.linear(LayerId::Qkv(i), x)?;
        let head = |base: usize, hd: usize| columns(&qkv, base + hd * dh, dh);
        let mut qs = Vec::with_capacity(nh);
        let mut kts = Vec::with_capacity(nh);
        let mut vs = Vec::with_capacity(nh);
        for hd in 0..nh {
            qs.push(head(0, hd)?);
            kts.push(head(h, hd)?.transpose()?);
            vs.push(head(2 * h, hd)?);
        }
        let mut scores = stack_rows(&self.shared_products(&qs, &kts)?)?; // [nh·s, s]
        self.mask_padding_keys(&mut scores);
        self.add_position_bias(&mut scores, position_bias);
        let valid = vec![true; s];
        let probs = {
            let mut cx = self.policy_cx();
            match variant.attention {
                AttentionNorm::Softmax => {
                    let _g = cx.ch.meter().enter("Softmax");
                    cx.softmax(&scores, &valid)?
                }
                AttentionNorm::ReluNormalise => {
                    let _g = cx.ch.meter().enter("ReLU-normalise");
                    let k = cx.ax.relu_bound_bits();
                    cx.relu_normalise(&scores, &valid, Some(k))?
                }
            }
        };
        let ps: Vec<RingTensor> = (0..nh)
            .map(|hd| {
                RingTensor::from_vec(
                    probs.ring(),
                    &[s, s],
                    probs.data()[hd * s * s..(hd + 1) * s * s].to_vec(),
                )
            })
            .collect::<Result<_>>()?;
        let heads = self.shared_products(&ps, &vs)?;
        let ctx = RingTensor::concat_columns(&heads.iter().collect::<Vec<_>>())?;
        let attn = self.linear(LayerId::AttnOut(i), &ctx)?.add(x)?;
        let y = self.norm(&attn, |m| &m.fixed.blocks[i].ln1, variant.ln1)?;
        let inter = self.linear(LayerId::Intermediate(i), &y)?;
        let act = {
            let mut cx = self.cx();
            match variant.activation {
                Activation::Gelu => {
                    let _g = cx.ch.meter().enter("GELU");
                    cx.gelu(&inter)?
                }
                Activation::Relu => {
                    let _g = cx.ch.meter().enter("ReLU");
                    let k = cx.ax.relu_bound_bits();
                    cx.relu_tensor(&inter, Some(k))?
                }
            }
        };
        let out = self.linear(LayerId::Output(i), &act)?.add(&y)?;
        self.norm(&out, |m| &m.fixed.blocks[i].ln2, variant.ln2)
    }

    /// Pooling and classifier (sim: `FixedModel::head`): returns shares of the logits, or of the
    /// pooled vector when the model has no classifier.
    fn head(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let _g = self.ch.meter().enter("Head");
        let (s, h) = (x.shape()[0], x.shape()[1]);
        let ring = x.ring();
        let pooled = if self.cfg.veil.head == HeadKind::Pooler {
            let first = RingTensor::from_vec(ring, &[1, h], x.data()[..h].to_vec())?;
            let p = self.linear(LayerId::Pooler, &first)?;
            let t = self.cx().tanh(p.data())?;
            RingTensor::from_vec(ring, &[1, h], t)?
        } else {
            let sums: Vec<u64> = (0..h)
                .map(|c| (0..s).fold(0u64, |a, r| ring.add(a, x.data()[r * h + c])))
                .collect();
            let (p, c) = self.ax.mean_params(s);
            let f = self.ax.fp.frac_bits();
            let mut cx = self.cx();
            let t = if p > 0 { cx.trunc(&sums, p)? } else { sums };
            RingTensor::from_vec(ring, &[1, h], cx.scale_trunc(&t, c, f + MEAN_EXTRA_BITS)?)?
        };
        if self.cfg.veil.num_labels == 0 {
            return pooled.reshape(&[h]);
        }
        let logits = self.linear(LayerId::Classifier, &pooled)?;
        let n = logits.len();
        logits.reshape(&[n])
    }

    /// Runs every block and the head on this party's share of the embedding output.
    pub fn encoder_and_head(&mut self, x: &RingTensor) -> Result<RingTensor> {
        ensure!(
            x.shape().len() == 2 && x.shape()[1] == self.cfg.hidden_size && x.shape()[0] > 0,
            InvalidArgument,
            "embedding share of shape {:?}, expected [seq, {}]",
            x.shape(),
            self.cfg.hidden_size
        );
        let position_bias = match &self.side {
            Side::Server(_, m) => m.fixed.position_bias(x.shape()[0]),
            Side::Client(..) => None,
        };
        let mut h = x.clone();
        for i in 0..self.cfg.num_layers {
            h = self.block(i, &h, position_bias.as_deref())?;
        }
        self.head(&h)
    }
}
