//! [`DecoderParty`]: the decoder's operators on one party's shares, with that party's half of
//! the KV cache. The module documentation (`decoder`) states what each side learns and the error
//! bound.

use veil_core::approx::Approx;
use veil_core::{bail, ensure, CostClass, Error, Result, RingTensor};
use veil_linear::fc::{fc_online_server, fc_premask_client, fc_premask_server_for};
use veil_linear::lookup::{lookup_client, lookup_server};
use veil_linear::premask::online_client;
use veil_linear::triples::{beaver_matmul, triples_client, triples_server, Triple};
use veil_linear::{fc_client, fc_server_for, shared_matmul_client, shared_matmul_server};
use veil_linear::{ClientSession, ServerSession};
use veil_model::decoder::{DecoderActivation, DecoderConfig, DecoderFamily, DecoderNormKind};
use veil_model::engine::decoder::{
    causal_visible, forward, hide_padding_keys, rotary_accumulators, DecoderEngine, DecoderLayer,
    DecoderNorm, KvCache, LogitRows, Rows,
};
use veil_model::{AttentionNorm, DecoderFormat, DecoderTables, ProductTruncation};
use veil_net::{Channel, Meter, Role};
use veil_nonlinear::{AffineParams, Ctx, HeKeys, OtSession, TruncMode};

use super::model::{
    decoder_fc_shape, embed_shape, fused_group, group_widths, head_shape, ServerDecoder,
    EMBED_LOOKUP,
};
use super::preprocess::{plan_step, Held, StepMaterial};
use crate::preprocess::{Material, Step};
use crate::protocol::OutputShare;
use zeroize::{Zeroize, Zeroizing};

/// What the client holds of the decoder's tables.
#[derive(Clone, Copy)]
pub enum ClientTables<'a> {
    /// An open model's public tables: the client embeds its own tokens and applies the
    /// output table to the final row in the clear.
    Open(&'a DecoderTables),
    /// The tables are the server's (`ServerDecoder::keep_tables_private`): the client knows
    /// the configuration and the format only; embedding and head are HE products.
    Private(&'a DecoderConfig, DecoderFormat),
}

impl<'a> ClientTables<'a> {
    /// `Open` when the client holds the tables, else `Private` with the configuration and the
    /// shipped format: what a client that loaded a decoder's public part connects with.
    pub fn held(tables: Option<&'a DecoderTables>, config: &'a DecoderConfig) -> Self {
        match tables {
            Some(t) => ClientTables::Open(t),
            None => ClientTables::Private(config, DecoderFormat::default()),
        }
    }

    /// The decoder's shape and family.
    pub fn config(&self) -> &'a DecoderConfig {
        match *self {
            ClientTables::Open(t) => t.config(),
            ClientTables::Private(cfg, _) => cfg,
        }
    }

    /// The fixed-point format.
    pub fn format(&self) -> DecoderFormat {
        match self {
            ClientTables::Open(t) => t.format(),
            ClientTables::Private(_, format) => *format,
        }
    }
}

/// What only one side has.
pub enum DecoderSide<'a> {
    /// The client's HE keys and what it holds of the tables (its tokens never leave it).
    Client(&'a ClientSession, ClientTables<'a>),
    /// The server's copy of the client's HE keys and its prepared decoder.
    Server(&'a ServerSession, &'a ServerDecoder),
}

/// One generation's state on one party, kept between its steps (a server's session holds it
/// while its channel waits for the next request): the context limit, the truncation mode, and
/// this party's shares of every block's KV cache, which grows by the new positions at every
/// step. Dropping it frees the cache, however the generation ends.
pub struct Generation {
    cfg: DecoderConfig,
    mode: TruncMode,
    /// SiLU's or GELU's inputs promised below 2^k (the server's proved bound, announced).
    activation_bits: Option<u32>,
    context_limit: usize,
    cache: KvCache,
    /// Set while a step runs: a step that failed part-way leaves some blocks' caches longer
    /// than others, so later steps are refused until [`Generation::reset`].
    broken: bool,
    /// The client's leading padding positions ([`Generation::hide_padding`]); always 0 on the
    /// server, which is never told.
    padding: usize,
}

impl Generation {
    /// An empty KV cache for a model shaped `cfg` that may hold up to `context_limit` positions
    /// (the prompt and every generated token; at most the model's `max_positions`).
    /// `(truncation, activation_bits)` must be the other party's: they decide the protocol each
    /// truncation and each activation's comparisons run (a server's are its truncation mode and
    /// its model's `FixedDecoder::activation_bits`, announced to the client at admission).
    pub fn new(
        cfg: &DecoderConfig,
        (truncation, activation_bits): (ProductTruncation, Option<u32>),
        context_limit: usize,
    ) -> Result<Self> {
        ensure!(
            (1..=cfg.max_positions).contains(&context_limit),
            InvalidArgument,
            "a context of {context_limit} positions (the model takes 1..={})",
            cfg.max_positions
        );
        let mode = match truncation {
            ProductTruncation::Faithful => TruncMode::Faithful,
            ProductTruncation::OneBitError => TruncMode::OneBitError,
        };
        Ok(Generation {
            cfg: cfg.clone(),
            mode,
            activation_bits,
            context_limit,
            cache: KvCache::with_capacity(cfg, context_limit),
            broken: false,
            padding: 0,
        })
    }

    /// Client: makes the first `padding` positions of this generation padding that hides the
    /// prompt's length from the server (`veil_model::engine::decoder::hide_padding_keys`: no
    /// real position attends to them, GPT-2's positions count from the first real token). Only
    /// the client knows it: the server runs the padded length as any prompt. Before the first
    /// step; the client then runs the padding (any tokens) before its prompt.
    pub fn hide_padding(&mut self, padding: usize) -> Result<()> {
        ensure!(
            self.positions() == 0,
            InvalidArgument,
            "padding goes before the first prompt: {} positions have run",
            self.positions()
        );
        ensure!(
            padding < self.context_limit,
            InvalidArgument,
            "{padding} positions of padding leave no room in a context of {}",
            self.context_limit
        );
        self.padding = padding;
        Ok(())
    }

    /// Bytes one party's KV cache takes at `positions` positions of a model shaped `cfg`:
    /// what a server counts against a session's memory for a generation's context limit
    /// (a [`Generation`] allocates exactly this for its limit when it is made).
    pub fn cache_bytes(cfg: &DecoderConfig, positions: usize) -> usize {
        2 * cfg.layers * positions * cfg.kv_heads * cfg.head_dim * std::mem::size_of::<u64>()
    }

    /// The most positions this generation's cache may hold.
    pub fn context_limit(&self) -> usize {
        self.context_limit
    }

    /// Positions cached so far.
    pub fn positions(&self) -> usize {
        self.cache.positions()
    }

    /// Forgets the cache: a new generation with the same limit (after a failed step too).
    pub fn reset(&mut self) {
        self.cache.clear();
        self.broken = false;
        self.padding = 0;
    }

    /// Refuses a step of `tokens` new positions before anything is sent when it cannot run:
    /// after a failed step, for no tokens, or beyond the context limit. Both parties decide
    /// from public numbers alone, so both refuse the same step and neither waits for the other.
    pub fn check_room(&self, tokens: usize) -> Result<()> {
        ensure!(
            !self.broken,
            InvalidArgument,
            "an earlier step failed part-way and left the KV cache inconsistent: reset the generation"
        );
        ensure!(tokens > 0, InvalidArgument, "no tokens to run");
        let start = self.positions();
        if tokens > self.context_limit.saturating_sub(start) {
            return Err(Error::Refused(format!(
                "{tokens} more positions after {start} exceed the generation's context limit of {}",
                self.context_limit
            )));
        }
        Ok(())
    }
}

/// One party's steps of a [`Generation`]: the channel, the OT pools and its side, borrowed for
/// as many steps as the caller likes. Both parties run the same [`forward`] in lock-step; the
/// client drives it with [`DecoderParty::client_step`] (its token ids), the server with
/// [`DecoderParty::server_step`] (their number only).
pub struct DecoderParty<'a, C: Channel> {
    ch: &'a mut C,
    ot: &'a mut OtSession,
    side: DecoderSide<'a>,
    ax: Approx,
    format: DecoderFormat,
    generation: &'a mut Generation,
    /// Products computed with their group's lead ([`fused_group`]), not yet asked for: this
    /// party's truncated shares, with the rows they were computed on.
    pending: Vec<Pending>,
    /// The running step's preprocessed material, when it has some.
    pre: Option<Held>,
}

/// A member's truncated share of a fused product, waiting for the forward pass to ask for it.
struct Pending {
    id: DecoderLayer,
    input: RingTensor,
    output: RingTensor,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.input.zeroize();
        self.output.zeroize();
    }
}

impl<'a, C: Channel> DecoderParty<'a, C> {
    /// This party's steps of `generation`, which must have been made for the side's model.
    pub fn new(
        ch: &'a mut C,
        ot: &'a mut OtSession,
        side: DecoderSide<'a>,
        generation: &'a mut Generation,
    ) -> Result<Self> {
        let (cfg, format, ax) = match &side {
            DecoderSide::Client(_, t) => (t.config(), t.format(), Approx::new(t.format().fp)?),
            DecoderSide::Server(_, m) => (m.config(), m.fixed().format, m.fixed().approx),
        };
        if let DecoderSide::Client(_, ClientTables::Private(cfg, _)) = &side {
            ensure!(
                cfg.family == DecoderFamily::Llama,
                Unsupported,
                "private tables are built for the Llama family only"
            );
        }
        ensure!(
            *cfg == generation.cfg,
            InvalidArgument,
            "a generation made for another model"
        );
        Ok(DecoderParty {
            ch,
            ot,
            side,
            ax,
            format,
            generation,
            pending: Vec::new(),
            pre: None,
        })
    }

    /// The channel's meter (per-step costs are differences of its snapshots).
    pub fn meter(&self) -> &Meter {
        self.ch.meter()
    }

    /// The COTs this party's OT session has drawn so far, (sending, receiving): a step's draw
    /// is their difference, the same on both sides with the directions swapped.
    pub fn ot_consumed(&self) -> (u64, u64) {
        self.ot.consumed()
    }

    /// Client: runs its next tokens `ids` (the prompt, then one generated token per step)
    /// after the cached positions; returns the logits of the last of them, [1, vocab] at f
    /// bits, which only the client learns.
    pub fn client_step(&mut self, ids: &[u32]) -> Result<RingTensor> {
        self.client_step_inner(ids, None)
    }

    /// [`Self::client_step`] on material [`Self::preprocess`] made for this very step (refused
    /// before anything is sent when it was made for another): its linear layers and attention
    /// products run their online parts only.
    pub fn client_step_with(&mut self, ids: &[u32], material: StepMaterial) -> Result<RingTensor> {
        self.client_step_inner(ids, Some(material))
    }

    /// Client: the generation's first `padding` positions hide the prompt's length
    /// ([`Generation::hide_padding`]); before the first step, which then runs the padding
    /// (any tokens) before the prompt.
    pub fn hide_padding(&mut self, padding: usize) -> Result<()> {
        ensure!(
            matches!(self.side, DecoderSide::Client(..)),
            InvalidArgument,
            "only the client knows the padding"
        );
        self.generation.hide_padding(padding)
    }

    fn client_step_inner(&mut self, ids: &[u32], pre: Option<StepMaterial>) -> Result<RingTensor> {
        ensure!(
            matches!(self.side, DecoderSide::Client(..)),
            InvalidArgument,
            "the server has no token ids: it runs server_step"
        );
        self.step(ids, pre)
    }

    /// Server: runs the client's next `tokens` positions, which it does not see; the client
    /// gets the logits, the server nothing.
    pub fn server_step(&mut self, tokens: usize) -> Result<()> {
        self.server_step_inner(tokens, None)
    }

    /// [`Self::server_step`] on material made for this very step, as
    /// [`Self::client_step_with`].
    pub fn server_step_with(&mut self, tokens: usize, material: StepMaterial) -> Result<()> {
        self.server_step_inner(tokens, Some(material))
    }

    fn server_step_inner(&mut self, tokens: usize, pre: Option<StepMaterial>) -> Result<()> {
        ensure!(
            matches!(self.side, DecoderSide::Server(..)),
            InvalidArgument,
            "the client runs client_step with its token ids"
        );
        // Checked before the placeholders are allocated: `tokens` may come from the peer.
        self.generation.check_room(tokens)?;
        // Placeholders: the server's embedding share is zero whatever the ids.
        self.step(&vec![0; tokens], pre).map(drop)
    }

    /// Offline, both parties: the material of the next step of `tokens` tokens (after the
    /// positions cached now; `crate::decoder::preprocess`), made in one request — every FC
    /// group's mask in one Π_MatMul batch, every attention product's triple in one cross-term
    /// batch — and the OT pools filled to at least `pool_cots` COTs each way. Both parties
    /// pass the same `tokens` and `pool_cots` (the server decides them in a session).
    pub fn preprocess(&mut self, tokens: usize, pool_cots: usize) -> Result<StepMaterial> {
        ensure!(
            !self.tables_private(),
            Unsupported,
            "preprocessing a step of a model with private tables: its table products are not \
             planned yet; run its steps single-phase"
        );
        self.generation.check_room(tokens)?;
        let start = self.generation.positions();
        let cfg = self.cfg();
        let ring = self.ax.fp.ring;
        let steps = plan_step(cfg, ring, start, tokens)?;
        let mut leads = Vec::new();
        let mut dims = Vec::new();
        let mut batches = Vec::new();
        for step in &steps {
            match step {
                Step::Fc(lead, rows) => leads.push((*lead, *rows)),
                Step::Products(d) => {
                    batches.push(d.len());
                    dims.extend_from_slice(d);
                }
            }
        }
        let shapes = leads
            .iter()
            .map(|&(lead, rows)| decoder_fc_shape(&fused_group(lead, cfg), cfg, ring, rows))
            .collect::<Result<Vec<_>>>()?;
        // A failure part-way may leave the pools of the two parties apart: as a failed step.
        self.generation.broken = true;
        let held = {
            let _g = self.ch.meter().enter(CostClass::MatMul);
            match self.side {
                DecoderSide::Client(s, _) => {
                    let masks = fc_premask_client(self.ch, s, &shapes)?;
                    let triples =
                        make_triples(dims.is_empty(), || triples_client(self.ch, s, ring, &dims))?;
                    Held::Client(material(tokens, &leads, masks, triples, &batches))
                }
                DecoderSide::Server(s, m) => {
                    let requests = leads
                        .iter()
                        .zip(&shapes)
                        .map(|(&(lead, _), shape)| Ok((m.layer(lead)?, *shape)))
                        .collect::<Result<Vec<_>>>()?;
                    let masks = fc_premask_server_for(self.ch, s, &requests)?;
                    let triples =
                        make_triples(dims.is_empty(), || triples_server(self.ch, s, ring, &dims))?;
                    Held::Server(material(tokens, &leads, masks, triples, &batches))
                }
            }
        };
        self.ot.precompute(self.ch, pool_cots)?;
        self.generation.broken = false;
        Ok(StepMaterial {
            start,
            tokens,
            held,
        })
    }

    /// Forgets the cache ([`Generation::reset`]).
    pub fn reset(&mut self) {
        self.generation.reset();
    }

    /// Runs the composition on the next positions, after [`Generation::check_room`] and, with
    /// material, [`StepMaterial::check_for`]; a step that leaves material unused fails.
    fn step(&mut self, ids: &[u32], pre: Option<StepMaterial>) -> Result<RingTensor> {
        self.generation.check_room(ids.len())?;
        let client = matches!(self.side, DecoderSide::Client(..));
        if let Some(m) = &pre {
            m.check_for(self.generation.positions(), ids.len(), client)?;
        }
        let cfg = self.cfg();
        self.generation.broken = true;
        self.clear_pending();
        self.pre = pre.map(|m| m.held);
        let logits = forward(self, cfg, ids, LogitRows::Last);
        self.clear_pending();
        let left = self.pre.take();
        let logits = logits?;
        ensure!(
            left.is_none_or(|m| m.is_used_up()),
            InvalidArgument,
            "the step left preprocessed material unused: it was planned for another step"
        );
        self.generation.broken = false;
        Ok(logits)
    }

    /// Whether the tables are the server's (both parties know: the server prepared them so,
    /// the client was told at admission).
    fn tables_private(&self) -> bool {
        match self.side {
            DecoderSide::Client(_, t) => matches!(t, ClientTables::Private(..)),
            DecoderSide::Server(_, m) => m.tables_private(),
        }
    }

    /// Private tables: the embedding of the client's ids as shares, by Veil's private lookup
    /// of the server's token table (exact mod 2^ℓ).
    fn private_embed(&mut self, ids: &[u32]) -> Result<RingTensor> {
        let _g = self.ch.meter().enter(CostClass::Embedding);
        let shape = embed_shape(self.cfg(), ids.len());
        match self.side {
            DecoderSide::Client(s, _) => lookup_client(self.ch, s, &shape, EMBED_LOOKUP, &[ids]),
            DecoderSide::Server(s, m) => {
                let made;
                let prepared = match ids.len() {
                    1 => m.step_lookup()?,
                    rows => {
                        made = m.prompt_lookup(rows)?;
                        &made
                    }
                };
                lookup_server(self.ch, s, prepared)
            }
        }
    }

    /// Drops (and zeroizes) the fused products not asked for.
    fn clear_pending(&mut self) {
        self.pending.clear();
    }

    fn cfg(&self) -> &'a DecoderConfig {
        match self.side {
            DecoderSide::Client(_, t) => t.config(),
            DecoderSide::Server(_, m) => m.config(),
        }
    }

    fn role(&self) -> Role {
        match self.side {
            DecoderSide::Client(..) => Role::Client,
            DecoderSide::Server(..) => Role::Server,
        }
    }

    /// A context whose truncations are the generation's mode.
    fn cx(&mut self) -> Ctx<'_, C> {
        let role = self.role();
        let mut cx = Ctx::new(self.ot, self.ch, role, self.ax);
        cx.trunc_mode = self.generation.mode;
        cx
    }

    /// ⌊x / 2^f⌋ on the shares of a product, in the generation's mode.
    fn truncate(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let _g = self.ch.meter().enter(CostClass::Truncation);
        let f = self.ax.fp.frac_bits();
        let y = self.cx().trunc(x.data(), f)?;
        RingTensor::from_vec(x.ring(), x.shape(), y)
    }

    /// The LM head; its result only the client learns. Public output table: the server sends
    /// its share of the normed rows, the client applies the table in the clear (the
    /// simulator's own head). Private tables: one HE product against the server's table, whose
    /// accumulator shares the server sends instead, and the client truncates them as the
    /// simulator does. The server's share of the logits is zero either way.
    fn head(&mut self, h: &RingTensor) -> Result<RingTensor> {
        let _g = self.ch.meter().enter(CostClass::Head);
        let ring = h.ring();
        let private = self.tables_private();
        let mut share = match (private, &self.side) {
            (false, _) => Zeroizing::new(h.clone()),
            (true, DecoderSide::Client(s, _)) => {
                let shape = head_shape(self.cfg(), ring, h.dims().0);
                Zeroizing::new(fc_client(self.ch, s, &shape, h)?)
            }
            (true, DecoderSide::Server(s, m)) => {
                let shape = head_shape(self.cfg(), ring, h.dims().0);
                Zeroizing::new(fc_server_for(self.ch, s, m.head()?, &shape, h)?)
            }
        };
        match self.side {
            DecoderSide::Server(..) => {
                OutputShare(share.data().to_vec()).send(self.ch, ring)?;
                self.ch.flush()?;
                RingTensor::zeros(ring, &[h.dims().0, self.cfg().vocab_size])
            }
            DecoderSide::Client(_, tables) => {
                let theirs = OutputShare::recv(self.ch, ring, share.len())?;
                let theirs = RingTensor::from_vec(ring, share.shape(), theirs.0)?;
                share.add_in_place(&theirs)?;
                match tables {
                    ClientTables::Open(t) => t.logits(&share),
                    ClientTables::Private(..) => {
                        let f = self.ax.fp.frac_bits();
                        let logits = share.data().iter().map(|&v| self.ax.trunc(v, f)).collect();
                        RingTensor::from_vec(ring, share.shape(), logits)
                    }
                }
            }
        }
    }
}

impl<C: Channel> DecoderEngine for DecoderParty<'_, C> {
    type Value = RingTensor;

    fn cached(&self) -> usize {
        self.generation.positions()
    }

    /// Client: the embedding of its ids, computed from the public tables as the simulator
    /// does; server: zero (its ids are placeholders, only their number is real). Private
    /// tables: both parties' shares from the private lookup.
    fn embed(&mut self, ids: &[u32], start: usize) -> Result<RingTensor> {
        if self.tables_private() {
            return self.private_embed(ids);
        }
        match self.side {
            DecoderSide::Client(_, ClientTables::Open(tables)) => {
                tables.embed(ids, start, self.generation.padding)
            }
            _ => RingTensor::zeros(self.ax.fp.ring, &[ids.len(), self.cfg().hidden]),
        }
    }

    /// The server's weights times the shared rows (one HE product), then one truncation;
    /// the LM head is the public table applied by the client (`DecoderParty::head`).
    ///
    /// Layers that share their input ([`fused_group`]: a block's query, key and value; a Llama
    /// block's gate and up) are one HE product against their stacked weights and one
    /// truncation, run when the forward pass asks for the group's lead: the rows are encrypted
    /// and sent once and the members share every flight. The other members' truncated shares
    /// wait until the forward pass asks for them with the same rows (checked on this party's
    /// share). Truncation is elementwise, so each member's values are those of its own product
    /// and truncation (bit for bit in the faithful mode).
    fn linear(&mut self, id: DecoderLayer, x: &RingTensor) -> Result<RingTensor> {
        if id == DecoderLayer::LmHead {
            return self.head(x);
        }
        let cfg = self.cfg();
        let group = fused_group(id, cfg);
        if group[0] != id {
            let at = self.pending.iter().position(|p| p.id == id);
            let Some(at) = at else {
                bail!(
                    InvalidArgument,
                    "layer {id:?} asked for before its group's lead {:?}",
                    group[0]
                );
            };
            let p = self.pending.remove(at);
            ensure!(
                p.input == *x,
                InvalidArgument,
                "layer {id:?} asked for with other rows than its group's lead {:?}",
                group[0]
            );
            return Ok(p.output.clone());
        }
        self.clear_pending();
        let rows = x.dims().0;
        let shape = decoder_fc_shape(&group, cfg, x.ring(), rows)?;
        let mut acc = {
            let _g = self.ch.meter().enter(CostClass::MatMul);
            match (&self.side, self.pre.as_mut()) {
                (DecoderSide::Client(..), Some(Held::Client(pre))) => {
                    online_client(self.ch, vec![pre.next_fc(id)?], &[x])?.remove(0)
                }
                (DecoderSide::Server(_, m), Some(Held::Server(pre))) => {
                    let mask = pre.next_fc(id)?;
                    fc_online_server(self.ch, vec![(m.layer(id)?, mask, x)])?.remove(0)
                }
                (DecoderSide::Client(s, _), None) => fc_client(self.ch, s, &shape, x)?,
                (DecoderSide::Server(s, m), None) => {
                    fc_server_for(self.ch, s, m.layer(id)?, &shape, x)?
                }
                _ => bail!(InvalidArgument, "the other party's preprocessed material"),
            }
        };
        let all = self.truncate(&acc);
        acc.zeroize();
        let mut all = all?;
        let widths = group_widths(&group, cfg)?;
        let mut from = widths[0];
        for (&member, &w) in group.iter().zip(&widths).skip(1) {
            self.pending.push(Pending {
                id: member,
                input: x.clone(),
                output: all.columns(from, w)?,
            });
            from += w;
        }
        let lead = all.columns(0, widths[0]);
        all.zeroize();
        lead
    }

    /// RMSNorm (Llama) or LayerNorm (GPT-2) on the format's wide domain, with the server's γ
    /// (and β); the Scale substitute: the server's γ times the shares and one truncation
    /// (`Ctx::scale_affine`, the norms' own final product), under the RMSNorm cost class.
    fn norm(
        &mut self,
        id: DecoderNorm,
        kind: DecoderNormKind,
        x: &RingTensor,
    ) -> Result<RingTensor> {
        let cfg = self.cfg();
        if kind == DecoderNormKind::Scale {
            // The public configuration picks this branch on both sides. Scale is Llama-only
            // (refused for GPT-2 by the composition): there is no β.
            ensure!(
                cfg.family == DecoderFamily::Llama,
                Unsupported,
                "the Scale norm is implemented for the Llama family only"
            );
            let gamma = match self.side {
                DecoderSide::Server(_, m) => Some(m.fixed().norm_weights(id)?.0),
                DecoderSide::Client(..) => None,
            };
            let mut cx = self.cx();
            let _g = cx.ch.meter().enter(CostClass::RmsNorm);
            return cx.scale_affine(x, gamma, None);
        }
        let (eps, dev_bits) = (cfg.norm_eps, self.format.norm_dev_bits);
        let ring = self.format.fp.ring;
        let (weights, keys) = match self.side {
            DecoderSide::Server(s, m) => {
                (Some(m.fixed().norm_weights(id)?), HeKeys::server(s, ring)?)
            }
            DecoderSide::Client(s, _) => (None, HeKeys::client(s, ring)?),
        };
        let mode = self.generation.mode;
        let role = self.role();
        let mut cx = Ctx::new(self.ot, self.ch, role, self.ax).with_he(keys)?;
        cx.trunc_mode = mode;
        match cfg.family {
            DecoderFamily::Llama => {
                let _g = cx.ch.meter().enter(CostClass::RmsNorm);
                cx.rms_norm(x, weights.map(|(gamma, _)| gamma), eps, dev_bits)
            }
            DecoderFamily::Gpt2 => {
                let _g = cx.ch.meter().enter(CostClass::LayerNorm);
                let params = match weights {
                    Some((gamma, Some(beta))) => Some(AffineParams { gamma, beta }),
                    Some((_, None)) => bail!(InvalidArgument, "LayerNorm {id:?} has no β"),
                    None => None,
                };
                cx.layer_norm_at(x, params.as_ref(), eps, dev_bits)
            }
        }
    }

    /// A public linear map: each party multiplies its own shares by the public cos and sin
    /// (`rotary_accumulators`, the simulator's arithmetic), then one truncation on shares.
    fn rotary(&mut self, x: &RingTensor, heads: usize, start: usize) -> Result<RingTensor> {
        let ring = x.ring();
        let signed: Vec<i64> = x.data().iter().map(|&v| ring.to_signed(v)).collect();
        let acc = rotary_accumulators(self.cfg(), self.ax.fp, &signed, (x.dims().0, heads), start)?;
        let local = acc.into_iter().map(|a| ring.from_signed(a)).collect();
        self.truncate(&RingTensor::from_vec(ring, x.shape(), local)?)
    }

    fn append_cache(
        &mut self,
        block: usize,
        start: usize,
        k: &RingTensor,
        v: &RingTensor,
    ) -> Result<(RingTensor, RingTensor)> {
        let total = start + k.dims().0;
        let limit = self.generation.context_limit;
        if total > limit {
            return Err(Error::Refused(format!(
                "{total} positions exceed the generation's context limit of {limit}"
            )));
        }
        self.generation.cache.append(block, start, k, v)
    }

    /// Every pair in one batch of HE products of shares by shares (`veil_linear::cross`), or,
    /// preprocessed, of Beaver triples (`veil_linear::triples`), then one truncation of every
    /// product.
    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        let role = self.role();
        let acc = {
            let _g = self.ch.meter().enter(CostClass::MatMul);
            match (&self.side, self.pre.as_mut()) {
                (_, Some(pre)) => beaver_matmul(self.ch, role, pre.next_products()?, a, b)?,
                (DecoderSide::Client(s, _), None) => shared_matmul_client(self.ch, s, a, b)?,
                (DecoderSide::Server(s, _), None) => shared_matmul_server(self.ch, s, a, b)?,
            }
        };
        ensure!(!acc.is_empty(), InvalidArgument, "no products to compute");
        let joined = RingTensor::concat_rows(&acc.iter().collect::<Vec<_>>())?;
        self.truncate(&joined)?.split_rows(acc[0].dims().0)
    }

    /// Softmax (`Ctx::softmax_masked`) or ReLU-normalise (`Ctx::relu_normalise_masked`, its
    /// comparisons promised |x| < 2^RELU_DOMAIN_BITS as the encoder's) with a public mask per
    /// row: query row r sees the keys up to its own position.
    fn causal_weights(
        &mut self,
        kind: AttentionNorm,
        scores: &RingTensor,
        start: usize,
    ) -> Result<RingTensor> {
        let (rows, total) = scores.dims();
        ensure!(
            total > start,
            InvalidArgument,
            "scores over {total} keys for a step starting at {start}"
        );
        let new = total - start;
        let mask: Vec<bool> = (0..rows)
            .flat_map(|r| causal_visible(start, new, r, total))
            .collect();
        // The client alone pushes its share of the padding keys' scores down; the server,
        // which is never told the padding, runs the same protocol on its share as it is.
        // The copy is a share of the scores: wiped when dropped, on error paths too.
        let hidden = hide_padding_keys(self.ax.fp, self.generation.padding, scores, start)?
            .map(zeroize::Zeroizing::new);
        let scores = hidden.as_deref().unwrap_or(scores);
        let mut cx = self.cx();
        match kind {
            AttentionNorm::Softmax => {
                let _g = cx.ch.meter().enter(CostClass::Softmax);
                cx.softmax_masked(scores, &mask)
            }
            AttentionNorm::ReluNormalise => {
                let _g = cx.ch.meter().enter(CostClass::ReluNormalise);
                let k = cx.ax.relu_bound_bits();
                cx.relu_normalise_masked(scores, &mask, Some(k))
            }
        }
    }

    /// SiLU (or, substituted, ReLU with the comparisons promised |x| < 2^RELU_DOMAIN_BITS) of
    /// the gate, then its secret product with `up` and one truncation (the simulator's
    /// ⌊act(g)·u / 2^f⌋); hard-swish is one protocol with its product by `up`
    /// (`Ctx::hard_swish_gated`, the simulator's `approx::hard_swish_gated`).
    fn gated(
        &mut self,
        act: DecoderActivation,
        gate: &RingTensor,
        up: &RingTensor,
    ) -> Result<RingTensor> {
        ensure!(
            gate.shape() == up.shape(),
            InvalidArgument,
            "gate {:?} and up {:?}",
            gate.shape(),
            up.shape()
        );
        let f = self.ax.fp.frac_bits();
        let bound = self.generation.activation_bits;
        let mut cx = self.cx();
        let s = match act {
            DecoderActivation::Original => {
                let _g = cx.ch.meter().enter(CostClass::Silu);
                cx.silu(gate.data(), bound)?
            }
            DecoderActivation::Relu => {
                let k = cx.ax.relu_bound_bits();
                cx.relu(gate.data(), Some(k))?
            }
            DecoderActivation::HardSwish => {
                let k = cx.ax.relu_bound_bits();
                let y = cx.hard_swish_gated(gate.data(), up.data(), Some(k))?;
                return RingTensor::from_vec(gate.ring(), gate.shape(), y);
            }
        };
        let _g = cx.ch.meter().enter(CostClass::Mul);
        let y = cx.mul_trunc(&s, up.data(), f)?;
        RingTensor::from_vec(gate.ring(), gate.shape(), y)
    }

    /// GELU (tanh form) with faithful truncations whatever the mode, as the encoder's; its
    /// comparisons on the generation's activation bound.
    fn gelu(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let role = self.role();
        let bound = self.generation.activation_bits;
        let mut cx = Ctx::new(self.ot, self.ch, role, self.ax);
        let _g = cx.ch.meter().enter(CostClass::Gelu);
        cx.gelu(x, bound)
    }
}

/// The triples of a step's products in one batch, or none when it has no products.
fn make_triples(none: bool, make: impl FnOnce() -> Result<Vec<Triple>>) -> Result<Vec<Triple>> {
    if none {
        Ok(Vec::new())
    } else {
        make()
    }
}

/// A step's material from its FC groups' masks (one per lead, in order) and its products'
/// triples (in order, `batches[i]` for the i-th batch).
fn material<M>(
    tokens: usize,
    leads: &[(DecoderLayer, usize)],
    masks: Vec<M>,
    triples: Vec<Triple>,
    batches: &[usize],
) -> Material<M, DecoderLayer> {
    let mut triples = triples.into_iter();
    let per_batch: Vec<Vec<Triple>> = batches
        .iter()
        .map(|&n| triples.by_ref().take(n).collect())
        .collect();
    Material::new(
        tokens,
        leads.iter().map(|&(lead, _)| lead).zip(masks),
        per_batch,
    )
}
