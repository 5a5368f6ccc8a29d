//! The decoder's fixed-point simulator: the composition of [`crate::engine::decoder`] in
//! Z_{2^ℓ} with `veil_core::approx`'s operators, the integers a two-party pass must produce.
//!
//! Encoding ([`FixedDecoder::encode`]): weights at f fractional bits (held as i32, the
//! simulator's memory), biases at 2f; the attention scale 1/√d_head folded into the query
//! weights and bias; every linear layer y = ⌊(W·x + b) / 2^f⌋ with an exact accumulator; rotary
//! positions multiply by public cos/sin at f bits and truncate once; Q·Kᵀ, P·V and the gate's
//! silu(g)·u are secret products truncated by f (SiLU and GELU with their sign comparisons on
//! the model's proved activation bound, [`FixedDecoder::activation_bits`], the two-party
//! pass's value inside it; an input beyond it, possible only after a norm's input left its
//! domain and where the private output is unspecified, is counted as a domain violation); RMSNorm ([`veil_core::approx::Approx::rms_norm_row`])
//! and GPT-2's LayerNorm run on the wide domain |x| < 2^[`DecoderFormat::norm_dev_bits`].
//!
//! Substituted operators ([`crate::decoder::DecoderBlockVariant`], Llama family): the Scale norm
//! is ⌊x_i·γ_i / 2^f⌋ (γ at f bits; error vs f64 under one ulp plus γ's encoding error times
//! |x|, its accumulator recorded against the wrap bound); ReLU-normalise attention is
//! [`Approx::relu_normalise_row`] over each row's visible keys (3e-4 absolute vs f64 with the
//! quantised ε, inside its domain: row sums Σ ReLU + ε below 2^(norm_bits − f) = 2^18 at ℓ = 48,
//! f = 13, and visible scores |x| < 2^`RELU_DOMAIN_BITS`, the promise the private comparisons
//! make); the ReLU activation is exact (the private comparison's domain |gate| <
//! 2^`RELU_DOMAIN_BITS` counted), then ⌊relu(g)·u / 2^f⌋. Inputs outside these domains are
//! counted with the norms' in [`BlockReport::out_of_domain`] and reported by
//! [`DecoderSim::warnings`].
//!
//! Format ([`DecoderFormat::default`]): ℓ = 48, f = 13, norms on |x| < 2^16. Llama-family
//! residual streams carry "massive activations" (SmolLM2-135M: ≈ 24,900 on one position): at the
//! encoder's ℓ = 41 the MLP's down projection that writes them (accumulator bound 2^(ℓ−1−2f) =
//! 16,384) wraps, and their squares (Σx² ≈ 6·10^8) do not fit a 2f-bit sum. Seven more bits
//! give the linear accumulators 2^21 of room and the norms a 2^16 domain with the coarse sum of
//! squares pre-shifted by 6 bits (see docs/RESULTS.md for the measured extremes).
//!
//! Statistics: per block the largest |hidden|, the largest accumulator against the wrap bound,
//! the largest norm input against the domain, and the count of domain violations (norm rows,
//! and in substituted blocks ReLU inputs and ReLU-normalise row sums), merged over every
//! step of a generation ([`DecoderSim::reports`], [`DecoderSim::warnings`]).

mod activation_bound;

use veil_core::approx::{Approx, LayerNormPlan};
use veil_core::{bail, ensure, Error, FixedPoint, Result, RingTensor};

use crate::decoder::{
    DecoderActivation, DecoderConfig, DecoderFamily, DecoderNormKind, DecoderWeights, Linear,
    Matrix, Mlp, Norm,
};
use crate::engine::decoder::{
    self as composition, causal_visible, hide_padding_keys, rotary_accumulators, DecoderEngine,
    DecoderLayer, DecoderNorm, KvCache, LogitRows, Rows,
};
use crate::sim::{
    matmul_signed, max_abs, relu_domain, relu_normalise_domain, secret_products, BlockReport,
    Tracker,
};
use crate::variants::AttentionNorm;

/// The decoder's fixed-point format: the ring and fraction, and the norms' input domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderFormat {
    /// The ring and fractional bits.
    pub fp: FixedPoint,
    /// Norm inputs (RMSNorm: x; LayerNorm: x − μ) are promised below 2^norm_dev_bits.
    pub norm_dev_bits: u32,
}

/// ℓ of [`DecoderFormat::default`].
pub(crate) const DECODER_RING_BITS: u32 = 48;
/// f of [`DecoderFormat::default`] (the encoder's resolution).
pub(crate) const DECODER_FRAC_BITS: u32 = 13;
/// The norms' domain bits of [`DecoderFormat::default`]: 65,536, 2.6× SmolLM2's largest value.
pub(crate) const DECODER_NORM_DEV_BITS: u32 = 16;

impl Default for DecoderFormat {
    fn default() -> Self {
        DecoderFormat {
            fp: FixedPoint::new(DECODER_RING_BITS, DECODER_FRAC_BITS)
                .expect("48-bit ring with 13 fractional bits is valid"),
            norm_dev_bits: DECODER_NORM_DEV_BITS,
        }
    }
}

/// A linear layer in fixed point: weight [out, in] at f bits (signed), bias at 2f bits.
#[derive(Clone, Debug)]
struct FixedLinear {
    weight: Vec<i32>,
    bias: Option<Vec<u64>>,
    rows: usize,
    cols: usize,
}

impl FixedLinear {
    fn encode(fp: FixedPoint, l: &Linear, scale: f64) -> Result<Self> {
        let bias = l.bias.as_ref().map(|b| {
            b.iter()
                .map(|&v| fp.encode_at(v as f64 * scale, 2 * fp.frac_bits()))
                .collect()
        });
        Ok(FixedLinear {
            bias,
            ..encode_matrix(fp, &l.weight, scale)?
        })
    }
}

/// A weight matrix at f bits as i32 (every |w| < 2^(31−f) fits: 262,144 at f = 13).
fn encode_matrix(fp: FixedPoint, m: &Matrix, scale: f64) -> Result<FixedLinear> {
    let weight = m
        .data
        .iter()
        .map(|&v| {
            let raw = fp.ring.to_signed(fp.encode(v as f64 * scale));
            i32::try_from(raw).map_err(|_| {
                Error::Unsupported(format!(
                    "weight {v} does not fit 32 bits at f = {}",
                    fp.frac_bits()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FixedLinear {
        weight,
        bias: None,
        rows: m.rows,
        cols: m.cols,
    })
}

/// γ (and β for LayerNorm) at f bits, with the public plan of its rsqrt.
#[derive(Clone, Debug)]
struct FixedNorm {
    gamma: Vec<u64>,
    beta: Option<Vec<u64>>,
    plan: LayerNormPlan,
}

impl FixedNorm {
    fn encode(ax: &Approx, n: &Norm, eps: f64, dev_bits: u32) -> Self {
        let enc = |v: &[f32]| {
            v.iter()
                .map(|&x| ax.fp.encode(x as f64))
                .collect::<Vec<_>>()
        };
        FixedNorm {
            gamma: enc(&n.weight),
            beta: n.bias.as_deref().map(enc),
            plan: ax.norm_plan(n.weight.len(), eps, dev_bits),
        }
    }
}

#[derive(Clone, Debug)]
struct FixedBlock {
    attn_norm: FixedNorm,
    q: FixedLinear,
    k: FixedLinear,
    v: FixedLinear,
    o: FixedLinear,
    mlp_norm: FixedNorm,
    gate: Option<FixedLinear>,
    up: FixedLinear,
    down: FixedLinear,
}

/// The decoder's tables at f bits: the token embedding, GPT-2's learned position rows and the
/// output table (the token embedding when tied). For an open model they are public, so the
/// two-party pass lets the client embed its own tokens and apply the output table to the normed
/// hidden row in the clear (`veil_private`'s decoder engine): these two methods are the
/// simulator's own embedding and LM head, so the client's values are the simulator's.
#[derive(Clone, Debug)]
pub struct DecoderTables {
    approx: Approx,
    format: DecoderFormat,
    config: DecoderConfig,
    /// [vocab, hidden].
    token: FixedLinear,
    /// [max_positions, hidden] (GPT-2).
    position: Option<FixedLinear>,
    /// [vocab, hidden] when not tied to `token`.
    output: Option<FixedLinear>,
}

impl DecoderTables {
    /// Encodes the public tables at `format`: the token embedding [vocab, hidden], GPT-2's
    /// position table [max_positions, hidden] and an untied output table [vocab, hidden]. What a
    /// client builds from an open model's tables alone, without the server's weights.
    pub fn encode(
        config: &DecoderConfig,
        format: DecoderFormat,
        token: &Matrix,
        position: Option<&Matrix>,
        output: Option<&Matrix>,
    ) -> Result<Self> {
        let (vocab, h) = (config.vocab_size, config.hidden);
        for (name, m, rows) in [
            ("token embedding", Some(token), vocab),
            ("position table", position, config.max_positions),
            ("output table", output, vocab),
        ] {
            if let Some(m) = m {
                ensure!(
                    m.rows == rows && m.cols == h && m.data.len() == rows * h,
                    InvalidArgument,
                    "{name} of {}×{} ({} values), expected {rows}×{h}",
                    m.rows,
                    m.cols,
                    m.data.len()
                );
            }
        }
        ensure!(
            position.is_some() == (config.family == DecoderFamily::Gpt2),
            InvalidArgument,
            "a {:?} decoder {} a position table",
            config.family,
            if position.is_some() {
                "with"
            } else {
                "without"
            }
        );
        let fp = format.fp;
        let enc = |m: &Matrix| encode_matrix(fp, m, 1.0);
        Ok(DecoderTables {
            approx: Approx::new(fp)?,
            format,
            config: config.clone(),
            token: enc(token)?,
            position: position.map(enc).transpose()?,
            output: output.map(enc).transpose()?,
        })
    }

    /// [`DecoderTables::encode`] of `w`'s public matrices only (token embedding, GPT-2's
    /// positions, an untied output table): what a client with the open model's file builds.
    pub fn of_weights(w: &DecoderWeights, format: DecoderFormat) -> Result<Self> {
        Self::encode(
            &w.config,
            format,
            &w.token_embedding,
            w.position_embedding.as_ref(),
            w.lm_head.as_ref(),
        )
    }

    /// SHA-256 of everything the client's half of a generation depends on: the configuration,
    /// the format and every table's ring values. A server announces its own tables' digest and
    /// a client refuses a server whose digest differs from its tables' before any key material
    /// moves: different public tables would make its embeddings and logits silently wrong.
    pub fn digest(&self) -> crate::BundleDigest {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"veil decoder tables v1\0");
        h.update(format!("{:?}\0{:?}\0", self.config, self.format).as_bytes());
        let tables = [
            Some(&self.token),
            self.position.as_ref(),
            self.output.as_ref(),
        ];
        for t in tables {
            match t {
                None => h.update([0u8]),
                Some(t) => {
                    h.update([1u8]);
                    h.update((t.rows as u64).to_le_bytes());
                    h.update((t.cols as u64).to_le_bytes());
                    for v in &t.weight {
                        h.update(v.to_le_bytes());
                    }
                    // The tables carry no bias; hashed all the same, so none is overlooked.
                    let bias = t.bias.as_deref().unwrap_or(&[]);
                    h.update((bias.len() as u64).to_le_bytes());
                    for v in bias {
                        h.update(v.to_le_bytes());
                    }
                }
            }
        }
        crate::BundleDigest(h.finalize().into())
    }

    /// SHA-256 of the configuration and the format alone: what a server whose tables are
    /// private announces, and a client without tables checks, instead of [`Self::digest`].
    pub fn shape_digest(config: &DecoderConfig, format: DecoderFormat) -> crate::BundleDigest {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"veil decoder shape v1\0");
        h.update(format!("{config:?}\0{format:?}\0").as_bytes());
        crate::BundleDigest(h.finalize().into())
    }

    /// The decoder's shape and family.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The fixed-point algorithms at the format's ring.
    pub fn approx(&self) -> Approx {
        self.approx
    }

    /// The format the tables (and the whole decoder) are encoded at.
    pub fn format(&self) -> DecoderFormat {
        self.format
    }

    /// The embedding of `ids` at positions start.. (token row plus the position row for
    /// GPT-2), [ids, hidden] at f bits. The first `padding` positions of the generation are
    /// padding ([`crate::engine::decoder::hide_padding_keys`]): GPT-2's learned positions count
    /// from the first real token (a padding position takes position 0).
    pub fn embed(&self, ids: &[u32], start: usize, padding: usize) -> Result<RingTensor> {
        let (h, ring) = (self.config.hidden, self.approx.fp.ring);
        if let Some(p) = &self.position {
            ensure!(
                start + ids.len() <= p.rows,
                InvalidArgument,
                "positions up to {} exceed the position table's {}",
                start + ids.len(),
                p.rows
            );
        }
        let mut out = Vec::with_capacity(ids.len() * h);
        for (r, &id) in ids.iter().enumerate() {
            let id = id as usize;
            ensure!(
                id < self.config.vocab_size,
                InvalidArgument,
                "token id {id} outside the vocabulary of {}",
                self.config.vocab_size
            );
            let tok = &self.token.weight[id * h..(id + 1) * h];
            let pos = self.position.as_ref().map(|p| {
                let at = (start + r).saturating_sub(padding);
                &p.weight[at * h..(at + 1) * h]
            });
            for c in 0..h {
                let v = tok[c] as i64 + pos.map_or(0, |p| p[c] as i64);
                out.push(ring.from_signed(v));
            }
        }
        RingTensor::from_vec(ring, &[ids.len(), h], out)
    }

    /// The LM head: ⌊h·Tᵀ / 2^f⌋ for the normed rows h [rows, hidden], logits [rows, vocab]
    /// at f bits (the simulator's `linear` of [`DecoderLayer::LmHead`]).
    pub fn logits(&self, h: &RingTensor) -> Result<RingTensor> {
        let mut unused = Tracker::new(self.approx.fp, 0);
        linear_signed(
            &self.approx,
            self.output(),
            DecoderLayer::LmHead,
            h,
            &mut unused,
        )
    }

    /// The token embedding [vocab, hidden] at f bits as ring elements: what a server that
    /// keeps its tables private prepares for the embedding's HE product.
    pub fn token_matrix(&self) -> Result<RingTensor> {
        self.ring_matrix(&self.token)
    }

    /// The output table [vocab, hidden] at f bits (the token embedding when tied), as
    /// [`DecoderTables::token_matrix`], for the LM head's HE product.
    pub fn output_matrix(&self) -> Result<RingTensor> {
        self.ring_matrix(self.output())
    }

    fn ring_matrix(&self, t: &FixedLinear) -> Result<RingTensor> {
        let ring = self.approx.fp.ring;
        let data = t
            .weight
            .iter()
            .map(|&v| ring.from_signed(v.into()))
            .collect();
        RingTensor::from_vec(ring, &[t.rows, t.cols], data)
    }

    fn output(&self) -> &FixedLinear {
        self.output.as_ref().unwrap_or(&self.token)
    }
}

/// ⌊(x·Wᵀ + b) / 2^f⌋ of layer `id` with an exact accumulator, recorded in `tracker`.
fn linear_signed(
    ax: &Approx,
    l: &FixedLinear,
    id: DecoderLayer,
    x: &RingTensor,
    tracker: &mut Tracker,
) -> Result<RingTensor> {
    let ring = ax.fp.ring;
    let &[rows, inner] = x.shape() else {
        bail!(
            InvalidArgument,
            "{id:?} takes a matrix, got {:?}",
            x.shape()
        );
    };
    ensure!(
        inner == l.cols && x.ring() == ring,
        InvalidArgument,
        "{id:?} expects {} inputs in a {}-bit ring, got {inner}",
        l.cols,
        ring.bits()
    );
    let sx: Vec<i64> = x.data().iter().map(|&v| ring.to_signed(v)).collect();
    let out = matmul_signed(
        ax,
        &sx,
        &l.weight,
        (rows, inner, l.rows),
        l.bias.as_deref(),
        tracker,
    );
    RingTensor::from_vec(ring, &[rows, l.rows], out)
}

/// The encoded decoder: what the server would hold in the private pass.
#[derive(Clone, Debug)]
pub struct FixedDecoder {
    /// The fixed-point algorithms at the format's ring.
    pub approx: Approx,
    /// The format the weights are encoded at.
    pub format: DecoderFormat,
    /// The decoder's shape and family.
    pub config: DecoderConfig,
    tables: DecoderTables,
    blocks: Vec<FixedBlock>,
    final_norm: FixedNorm,
    /// |SiLU's or GELU's input| < 2^k for every prompt (`activation_bound`), or None.
    activation_bits: Option<u32>,
}

impl FixedDecoder {
    /// Encodes validated f32 weights at `format`.
    pub fn encode(w: &DecoderWeights, format: DecoderFormat) -> Result<Self> {
        let fp = format.fp;
        let approx = Approx::new(fp)?;
        let c = &w.config;
        let max_row = approx.norm_max_row(format.norm_dev_bits);
        ensure!(
            c.hidden <= max_row,
            Unsupported,
            "hidden size {} exceeds the {max_row} values a norm row on |x| < 2^{} may have at ℓ = {}",
            c.hidden,
            format.norm_dev_bits,
            fp.ring.bits()
        );
        let norm = |n: &Norm| FixedNorm::encode(&approx, n, c.norm_eps, format.norm_dev_bits);
        let lin = |l: &Linear| FixedLinear::encode(fp, l, 1.0);
        let q_scale = 1.0 / (c.head_dim as f64).sqrt();
        let blocks = w
            .blocks
            .iter()
            .map(|b| {
                let (gate, up, down) = match &b.mlp {
                    Mlp::Gated { gate, up, down } => (Some(lin(gate)?), lin(up)?, lin(down)?),
                    Mlp::Plain { up, down } => (None, lin(up)?, lin(down)?),
                };
                Ok(FixedBlock {
                    attn_norm: norm(&b.attn_norm),
                    q: FixedLinear::encode(fp, &b.q, q_scale)?,
                    k: lin(&b.k)?,
                    v: lin(&b.v)?,
                    o: lin(&b.o)?,
                    mlp_norm: norm(&b.mlp_norm),
                    gate,
                    up,
                    down,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tables = DecoderTables::of_weights(w, format)?;
        let activation_bits = activation_bound::provable_activation_bits(&approx, c, &blocks);
        Ok(FixedDecoder {
            approx,
            format,
            config: c.clone(),
            tables,
            blocks,
            final_norm: norm(&w.final_norm),
            activation_bits,
        })
    }

    /// k with |input| < 2^k for every SiLU (Llama) or GELU (GPT-2) this model computes in the
    /// norms' domain, proved from its weights (`activation_bound`); None when there is none
    /// narrower than the ring. Both parties' activations compare on k bits
    /// (`Approx::silu_within`), so a server announces it to its clients.
    pub fn activation_bits(&self) -> Option<u32> {
        self.activation_bits
    }

    /// Widens the activation bound to at least `bits` (still a true bound: a wider one always
    /// is), so that a benchmark on random weights pays a pretrained model's comparisons.
    pub fn widen_activation_bound(&mut self, bits: u32) {
        self.activation_bits =
            crate::normed_bound::widened(self.activation_bits, bits, self.format.fp.ring);
    }

    /// The embedding and output tables (public for an open model).
    pub fn tables(&self) -> &DecoderTables {
        &self.tables
    }

    /// Layer `id`'s weight \[out, in\] at f bits and bias \[out\] at 2f bits as ring elements: what
    /// the server of the two-party pass prepares for its HE products. The LM head is not one of
    /// them (its table is public: [`DecoderTables::logits`]).
    pub fn linear_weights(&self, id: DecoderLayer) -> Result<(RingTensor, Option<RingTensor>)> {
        ensure!(
            id != DecoderLayer::LmHead,
            InvalidArgument,
            "the LM head is a public table, not a private layer"
        );
        let l = self.layer(id)?;
        let ring = self.fp().ring;
        let w = l
            .weight
            .iter()
            .map(|&v| ring.from_signed(v.into()))
            .collect();
        let bias = l
            .bias
            .as_ref()
            .map(|b| RingTensor::from_vec(ring, &[l.rows], b.clone()))
            .transpose()?;
        Ok((RingTensor::from_vec(ring, &[l.rows, l.cols], w)?, bias))
    }

    /// Norm `id`'s γ and (LayerNorm) β at f bits: the server's side of the two-party norm.
    pub fn norm_weights(&self, id: DecoderNorm) -> Result<(&[u64], Option<&[u64]>)> {
        let n = self.norm_params(id)?;
        Ok((&n.gamma, n.beta.as_deref()))
    }

    /// The ring and fractional bits.
    pub fn fp(&self) -> FixedPoint {
        self.format.fp
    }

    fn layer(&self, id: DecoderLayer) -> Result<&FixedLinear> {
        let missing = || Error::Unsupported(format!("the decoder has no layer {id:?}"));
        let b = |i: usize| self.blocks.get(i).ok_or_else(missing);
        Ok(match id {
            DecoderLayer::Query(i) => &b(i)?.q,
            DecoderLayer::Key(i) => &b(i)?.k,
            DecoderLayer::Value(i) => &b(i)?.v,
            DecoderLayer::AttnOut(i) => &b(i)?.o,
            DecoderLayer::Gate(i) => b(i)?.gate.as_ref().ok_or_else(missing)?,
            DecoderLayer::Up(i) => &b(i)?.up,
            DecoderLayer::Down(i) => &b(i)?.down,
            DecoderLayer::LmHead => self.tables.output(),
        })
    }

    fn norm_params(&self, id: DecoderNorm) -> Result<&FixedNorm> {
        let missing = || Error::Unsupported(format!("the decoder has no norm {id:?}"));
        Ok(match id {
            DecoderNorm::Attn(i) => &self.blocks.get(i).ok_or_else(missing)?.attn_norm,
            DecoderNorm::Mlp(i) => &self.blocks.get(i).ok_or_else(missing)?.mlp_norm,
            DecoderNorm::Final => &self.final_norm,
        })
    }

    /// A generation session: an empty KV cache on this model.
    pub fn session(&self) -> DecoderSim<'_> {
        DecoderSim::new(self)
    }
}

/// The simulator as a [`DecoderEngine`], holding the KV cache (ring values) and the statistics
/// of every step so far.
pub struct DecoderSim<'a> {
    model: &'a FixedDecoder,
    cache: KvCache,
    tracker: Tracker,
    /// One per block, then the final norm and LM head; merged over steps.
    reports: Vec<BlockReport>,
    /// Leading positions of this generation that are padding ([`Self::hide_padding`]).
    padding: usize,
}

impl<'a> DecoderSim<'a> {
    /// A generation session on `model` with an empty KV cache.
    pub fn new(model: &'a FixedDecoder) -> Self {
        let fp = model.fp();
        let n = model.config.layers;
        DecoderSim {
            model,
            cache: KvCache::new(&model.config),
            tracker: Tracker::new(fp, 0),
            reports: (0..=n).map(|b| Tracker::new(fp, b).report).collect(),
            padding: 0,
        }
    }

    /// Makes the first `padding` positions of this generation padding that no real position
    /// attends to, as a private generation's client does to hide the prompt's length
    /// ([`hide_padding_keys`]): before anything has run; the caller runs them (any tokens)
    /// before the prompt.
    pub fn hide_padding(&mut self, padding: usize) -> Result<()> {
        ensure!(
            self.cache.positions() == 0,
            InvalidArgument,
            "padding goes before the first prompt: {} positions have run",
            self.cache.positions()
        );
        self.padding = padding;
        Ok(())
    }

    /// Runs the next tokens against the cache; logits [1 or ids, vocab] at f bits.
    pub fn step(&mut self, ids: &[u32], rows: LogitRows) -> Result<RingTensor> {
        let cfg = self.model.config.clone();
        let logits = composition::forward(self, &cfg, ids, rows)?;
        let head = std::mem::replace(&mut self.tracker, Tracker::new(self.model.fp(), 0));
        merge(&mut self.reports[cfg.layers], &head.report);
        Ok(logits)
    }

    /// [`DecoderSim::step`] decoded to real logits, one Vec per row.
    pub fn step_f64(&mut self, ids: &[u32], rows: LogitRows) -> Result<Vec<Vec<f64>>> {
        let logits = self.step(ids, rows)?;
        let vocab = self.model.config.vocab_size;
        Ok(logits
            .decode(self.model.fp())
            .chunks(vocab)
            .map(<[f64]>::to_vec)
            .collect())
    }

    /// Forgets the cache and the padding (the statistics stay).
    pub fn reset(&mut self) {
        self.cache.clear();
        self.padding = 0;
    }

    /// Per block (entry `layers`: the final norm and LM head), merged over every step.
    pub fn reports(&self) -> &[BlockReport] {
        &self.reports
    }

    /// One line per block whose accumulators wrapped or whose inputs left an operator's domain
    /// (norm rows, and in substituted blocks ReLU inputs and ReLU-normalise row sums).
    pub fn warnings(&self) -> Vec<String> {
        let fp = self.model.fp();
        let domain = (1u64 << self.model.format.norm_dev_bits) as f64;
        let substituted = self.model.config.is_substituted();
        let mut out = Vec::new();
        for r in &self.reports {
            if r.wrapped > 0 {
                out.push(format!(
                    "block {}: {} product accumulators exceeded the ring bound {} (max {:.1}) and wrapped mod 2^{}",
                    r.block, r.wrapped, r.accumulator_bound, r.max_abs_accumulator, fp.ring.bits()
                ));
            }
            if r.out_of_domain > 0 && substituted {
                out.push(format!(
                    "block {}: {} inputs outside the approximations' domains (norm rows: max |input| {:.1}, domain {domain}; ReLU inputs: |x| < {}; ReLU-normalise row sums: < {})",
                    r.block, r.out_of_domain, r.max_abs_norm_deviation, relu_domain(fp), relu_normalise_domain(fp)
                ));
            } else if r.out_of_domain > 0 {
                out.push(format!(
                    "block {}: {} norm rows outside the domain (max |input| {:.1}, domain {domain})",
                    r.block, r.out_of_domain, r.max_abs_norm_deviation
                ));
            }
        }
        out
    }

    fn ring(&self) -> veil_core::Ring {
        self.model.fp().ring
    }

    fn signed(&self, x: &[u64]) -> Vec<i64> {
        let ring = self.ring();
        x.iter().map(|&v| ring.to_signed(v)).collect()
    }

    /// ⌊a·b / 2^f⌋ for two secret values, the accumulator recorded.
    fn product(&mut self, a: u64, b: u64) -> u64 {
        let ring = self.ring();
        let acc = ring.to_signed(a).wrapping_mul(ring.to_signed(b));
        self.tracker.accumulator(acc);
        self.model
            .approx
            .trunc(ring.from_signed(acc), self.model.fp().frac_bits())
    }

    /// hard-swish(g)·u as [`Approx::hard_swish_gated`](veil_core::Approx::hard_swish_gated),
    /// with its ReLUs' inputs g ± 3 checked against their domain, ⌊g·u⌋_f tracked as a product
    /// and the factor's product counted as wrapped when it leaves the ring's signed range.
    fn hard_swish_gated(&mut self, g: u64, u: u64) -> u64 {
        let ax = self.model.approx;
        let ring = self.ring();
        let three = 3u64 << self.model.fp().frac_bits();
        let inputs = [ring.add(g, three), ring.sub(g, three)];
        self.tracker.report.out_of_domain += self.outside_relu_domain(&inputs);
        let gu = self.product(g, u);
        let fac = ax.hard_swish_factor(g);
        let acc =
            ring.to_signed(fac).unsigned_abs() as u128 * ring.to_signed(gu).unsigned_abs() as u128;
        if acc >= 1u128 << (ring.bits() - 1) {
            self.tracker.report.wrapped += 1;
        }
        ax.hard_swish_apply(fac, gu)
    }

    /// How many of `xs` lie outside the ReLU domain |x| < 2^RELU_DOMAIN_BITS the private
    /// comparisons are promised (outside it the protocol's ReLU is unspecified).
    fn outside_relu_domain(&self, xs: &[u64]) -> usize {
        let fp = self.model.fp();
        let bound = relu_domain(fp);
        xs.iter().filter(|&&v| fp.decode(v).abs() >= bound).count()
    }

    /// ReLU-normalise of one row of scores over its visible keys
    /// ([`Approx::relu_normalise_row`]), counting a row sum Σ ReLU + ε at or above
    /// 2^(norm_bits − f) and visible scores outside the ReLU domain: the protocol equals these
    /// integers only inside both.
    fn relu_normalise(&mut self, row: &[u64], visible: &[bool]) -> Vec<u64> {
        let m = self.model;
        let fp = m.fp();
        let seen: Vec<u64> = row
            .iter()
            .zip(visible)
            .filter(|(_, &v)| v)
            .map(|(&x, _)| x)
            .collect();
        let sum = seen.iter().map(|&v| fp.decode(v).max(0.0)).sum::<f64>()
            + fp.decode(m.approx.relu_normalise_eps());
        let outside = self.outside_relu_domain(&seen);
        let t = &mut self.tracker.report;
        t.out_of_domain += outside;
        if sum >= relu_normalise_domain(fp) {
            t.out_of_domain += 1;
        }
        m.approx.relu_normalise_row(row, visible)
    }

    /// The Scale norm x·γ (+ β): ⌊x_i·γ_i / 2^f⌋ per value, the product the two-party norm
    /// computes with the server's γ, its accumulator recorded.
    fn scale(&mut self, n: &FixedNorm, x: &RingTensor) -> Result<RingTensor> {
        let m = self.model;
        let (ring, ax) = (m.fp().ring, &m.approx);
        let h = x.shape()[1];
        ensure!(
            n.gamma.len() == h,
            InvalidArgument,
            "γ of {} for rows of {h}",
            n.gamma.len()
        );
        let mut out = Vec::with_capacity(x.len());
        for (i, &v) in x.data().iter().enumerate() {
            let g = n.gamma[i % h];
            let acc = i128::from(ring.to_signed(v)) * i128::from(ring.to_signed(g));
            self.tracker
                .accumulator(acc.clamp(i64::MIN.into(), i64::MAX.into()) as i64);
            let y = ax.mul_trunc(v, g);
            out.push(n.beta.as_ref().map_or(y, |b| ring.add(y, b[i % h])));
        }
        RingTensor::from_vec(ring, x.shape(), out)
    }

    /// 1 when v is outside the model's proved activation bound (never, unless the norm's
    /// input left its domain first), else 0.
    fn outside_activation_bound(&self, v: u64) -> usize {
        crate::normed_bound::beyond(self.model.activation_bits, self.model.fp().ring, v).into()
    }

    fn map(&self, x: &RingTensor, f: impl Fn(u64) -> u64) -> Result<RingTensor> {
        RingTensor::from_vec(
            x.ring(),
            x.shape(),
            x.data().iter().map(|&v| f(v)).collect(),
        )
    }
}

/// Folds one step's statistics of a block into its running report.
fn merge(into: &mut BlockReport, r: &BlockReport) {
    into.max_abs_hidden = into.max_abs_hidden.max(r.max_abs_hidden);
    into.max_abs_accumulator = into.max_abs_accumulator.max(r.max_abs_accumulator);
    into.wrapped += r.wrapped;
    into.max_abs_norm_deviation = into.max_abs_norm_deviation.max(r.max_abs_norm_deviation);
    into.out_of_domain += r.out_of_domain;
}

impl DecoderEngine for DecoderSim<'_> {
    type Value = RingTensor;

    fn cached(&self) -> usize {
        self.cache.positions()
    }

    fn embed(&mut self, ids: &[u32], start: usize) -> Result<RingTensor> {
        self.model.tables.embed(ids, start, self.padding)
    }

    fn linear(&mut self, id: DecoderLayer, x: &RingTensor) -> Result<RingTensor> {
        let m = self.model;
        linear_signed(&m.approx, m.layer(id)?, id, x, &mut self.tracker)
    }

    fn norm(
        &mut self,
        id: DecoderNorm,
        kind: DecoderNormKind,
        x: &RingTensor,
    ) -> Result<RingTensor> {
        let m = self.model;
        let n = m.norm_params(id)?;
        let (fp, ax) = (m.fp(), &m.approx);
        let h = x.shape()[1];
        if kind == DecoderNormKind::Scale {
            return self.scale(n, x);
        }
        let domain = (1u64 << m.format.norm_dev_bits) as f64;
        let mut out = Vec::with_capacity(x.len());
        for row in x.data().chunks(h) {
            let d = match n.beta {
                Some(_) => ax.centre(row),
                None => row.to_vec(),
            };
            let dev = d.iter().map(|&v| fp.decode(v).abs()).fold(0.0, f64::max);
            let t = &mut self.tracker.report;
            t.max_abs_norm_deviation = t.max_abs_norm_deviation.max(dev);
            if dev >= domain {
                t.out_of_domain += 1;
            }
            out.extend(ax.scale_row(&n.plan, &d, &n.gamma, n.beta.as_deref()));
        }
        RingTensor::from_vec(fp.ring, x.shape(), out)
    }

    fn rotary(&mut self, x: &RingTensor, heads: usize, start: usize) -> Result<RingTensor> {
        let m = self.model;
        let fp = m.fp();
        let (rows, cols) = x.dims();
        ensure!(
            cols == heads * m.config.head_dim,
            InvalidArgument,
            "rotary on {cols} columns, expected {heads}·{}",
            m.config.head_dim
        );
        let sx = self.signed(x.data());
        let acc = rotary_accumulators(&m.config, fp, &sx, (rows, heads), start)?;
        let mut out = Vec::with_capacity(acc.len());
        for a in acc {
            self.tracker.accumulator(a);
            out.push(m.approx.trunc(fp.ring.from_signed(a), fp.frac_bits()));
        }
        RingTensor::from_vec(fp.ring, x.shape(), out)
    }

    fn append_cache(
        &mut self,
        block: usize,
        start: usize,
        k: &RingTensor,
        v: &RingTensor,
    ) -> Result<(RingTensor, RingTensor)> {
        self.cache.append(block, start, k, v)
    }

    fn products(&mut self, a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<RingTensor>> {
        secret_products(&self.model.approx, a, b, &mut self.tracker)
    }

    fn causal_weights(
        &mut self,
        kind: AttentionNorm,
        scores: &RingTensor,
        start: usize,
    ) -> Result<RingTensor> {
        let total = scores.shape()[1];
        ensure!(
            total > start,
            InvalidArgument,
            "scores over {total} keys for a step starting at {start}"
        );
        let new = total - start;
        let hidden = hide_padding_keys(self.model.fp(), self.padding, scores, start)?;
        let scores = hidden.as_ref().unwrap_or(scores);
        let mut probs = Vec::with_capacity(scores.len());
        for (r, row) in scores.data().chunks(total).enumerate() {
            let visible = causal_visible(start, new, r, total);
            probs.extend(match kind {
                AttentionNorm::Softmax => self.model.approx.softmax_row(row, &visible),
                AttentionNorm::ReluNormalise => self.relu_normalise(row, &visible),
            });
        }
        RingTensor::from_vec(scores.ring(), scores.shape(), probs)
    }

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
        let (ax, bound) = (self.model.approx, self.model.activation_bits);
        let out = gate
            .data()
            .iter()
            .zip(up.data())
            .map(|(&g, &u)| match act {
                DecoderActivation::Original => {
                    self.tracker.report.out_of_domain += self.outside_activation_bound(g);
                    self.product(ax.silu_within(g, bound), u)
                }
                DecoderActivation::Relu => {
                    self.tracker.report.out_of_domain += self.outside_relu_domain(&[g]);
                    self.product(ax.relu(g), u)
                }
                DecoderActivation::HardSwish => self.hard_swish_gated(g, u),
            })
            .collect();
        RingTensor::from_vec(gate.ring(), gate.shape(), out)
    }

    fn gelu(&mut self, x: &RingTensor) -> Result<RingTensor> {
        let (ax, bound) = (self.model.approx, self.model.activation_bits);
        let outside: usize = x
            .data()
            .iter()
            .map(|&v| self.outside_activation_bound(v))
            .sum();
        self.tracker.report.out_of_domain += outside;
        self.map(x, |v| ax.gelu_within(v, bound))
    }

    fn block_done(&mut self, block: usize, output: &RingTensor) -> Result<()> {
        let fp = self.model.fp();
        let mut done = std::mem::replace(&mut self.tracker, Tracker::new(fp, block + 1));
        done.report.max_abs_hidden = max_abs(output, fp);
        merge(&mut self.reports[block], &done.report);
        Ok(())
    }
}
