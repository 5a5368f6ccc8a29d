//! The server's decoder: the fixed-point weights with every block's linear layers prepared for
//! HE once (one form serves the prefill's many rows and the decode step's one), and the public
//! shape of each layer that both parties derive from the configuration alone.

use std::collections::HashMap;

use veil_core::{bail, ensure, Error, Result, Ring, RingTensor};
use veil_linear::lookup::LookupShape;
use veil_linear::{FcLayer, LookupMethod, PreparedFc, PreparedLookup};
use veil_model::decoder::{DecoderConfig, DecoderFamily};
use veil_model::engine::decoder::{DecoderLayer, DecoderNorm};
use veil_model::{BundleDigest, DecoderTables, FixedDecoder, ProductTruncation};

use crate::protocol::AnnouncedTables;

use veil_linear::weight_set;

/// (in, out) features of private layer `id`, from the public configuration.
pub(crate) fn dims(id: DecoderLayer, cfg: &DecoderConfig) -> Result<(usize, usize)> {
    let (h, q, kv, ffn) = (
        cfg.hidden,
        cfg.heads * cfg.head_dim,
        cfg.kv_heads * cfg.head_dim,
        cfg.intermediate,
    );
    Ok(match id {
        DecoderLayer::Query(_) => (h, q),
        DecoderLayer::Key(_) | DecoderLayer::Value(_) => (h, kv),
        DecoderLayer::AttnOut(_) => (q, h),
        DecoderLayer::Gate(_) | DecoderLayer::Up(_) => (h, ffn),
        DecoderLayer::Down(_) => (ffn, h),
        DecoderLayer::LmHead => bail!(
            InvalidArgument,
            "the LM head is a public table, not a private layer"
        ),
    })
}

/// The layers one HE product computes when the forward pass asks for `id`: a block's query, key
/// and value (one input, the normed rows) and a Llama block's gate and up projections (likewise)
/// are one product against their weights stacked, so the client's rows are encrypted and sent
/// once; any other layer alone. Public (the configuration's family and `id`), so both parties
/// agree; the first member is the group's lead, the one the forward pass asks for first.
pub(crate) fn fused_group(id: DecoderLayer, cfg: &DecoderConfig) -> Vec<DecoderLayer> {
    match id {
        DecoderLayer::Query(i) | DecoderLayer::Key(i) | DecoderLayer::Value(i) => vec![
            DecoderLayer::Query(i),
            DecoderLayer::Key(i),
            DecoderLayer::Value(i),
        ],
        DecoderLayer::Gate(i) | DecoderLayer::Up(i) if cfg.family == DecoderFamily::Llama => {
            vec![DecoderLayer::Gate(i), DecoderLayer::Up(i)]
        }
        other => vec![other],
    }
}

/// The output columns of each member of `group`, in order.
pub(crate) fn group_widths(group: &[DecoderLayer], cfg: &DecoderConfig) -> Result<Vec<usize>> {
    group.iter().map(|&id| Ok(dims(id, cfg)?.1)).collect()
}

/// The public shape of the product computing `group` ([`fused_group`]) for `rows` input rows
/// over `ring` (the format's: it picks the HE set, `N8192Q4L48` at ℓ = 48): the members'
/// weights stacked, out = Σ members' outputs. The request is priced for its own row count
/// (`max_seq = rows`: a prompt's cut is the cheapest for that prompt, a step's the single-row
/// cut), which both parties derive from the public row count; the server's weights, prepared
/// once for up to `max_positions` rows ([`ServerDecoder`]), serve any cut.
pub(crate) fn decoder_fc_shape(
    group: &[DecoderLayer],
    cfg: &DecoderConfig,
    ring: Ring,
    rows: usize,
) -> Result<FcLayer> {
    let Some(&lead) = group.first() else {
        bail!(InvalidArgument, "an empty group of layers");
    };
    let in_features = dims(lead, cfg)?.0;
    for &id in group {
        ensure!(
            dims(id, cfg)?.0 == in_features,
            InvalidArgument,
            "layers {group:?} do not share an input width"
        );
    }
    Ok(FcLayer {
        seq: rows,
        max_seq: rows,
        in_features,
        out_features: group_widths(group, cfg)?.iter().sum(),
        set: weight_set(ring),
    })
}

/// How private tables' embedding looks its rows up: one-hot, whose upload (queries × vocab
/// entries) is below the batched method's (≥ 3 × vocab entries) at a decode step's one query;
/// public, so both parties use it.
pub(crate) const EMBED_LOOKUP: LookupMethod = LookupMethod::OneHot;

/// The public shape of private tables' embedding lookup for `rows` tokens.
pub(crate) fn embed_shape(cfg: &DecoderConfig, rows: usize) -> LookupShape {
    LookupShape {
        vocabs: vec![cfg.vocab_size],
        width: cfg.hidden,
        queries: rows,
    }
}

/// The public shape of private tables' LM head for `rows` final rows (priced for its own
/// rows, as [`decoder_fc_shape`]).
pub(crate) fn head_shape(cfg: &DecoderConfig, ring: Ring, rows: usize) -> FcLayer {
    FcLayer {
        seq: rows,
        max_seq: rows,
        in_features: cfg.hidden,
        out_features: cfg.vocab_size,
        set: weight_set(ring),
    }
}

/// Private tables, prepared for their HE products.
struct PrivateTables {
    /// The token embedding [vocab, hidden], for prompts' lookups (prepared per prompt).
    token: RingTensor,
    /// Its lookup prepared for a decode step's one token.
    step_lookup: PreparedLookup,
    /// The output table [vocab, hidden] as the head's product.
    head: PreparedFc,
}

/// Every private linear layer of a decoder, block by block (the LM head's table is public).
fn private_layers(cfg: &DecoderConfig) -> Vec<DecoderLayer> {
    let mut ids = Vec::new();
    for i in 0..cfg.layers {
        ids.extend([
            DecoderLayer::Query(i),
            DecoderLayer::Key(i),
            DecoderLayer::Value(i),
            DecoderLayer::AttnOut(i),
        ]);
        if cfg.family == DecoderFamily::Llama {
            ids.push(DecoderLayer::Gate(i));
        }
        ids.extend([DecoderLayer::Up(i), DecoderLayer::Down(i)]);
    }
    ids
}

/// The truncations a decoder server runs unless told otherwise: faithful, so every private
/// step's logits are the simulator's bit for bit and a greedy answer is `--simulate`'s. A
/// generation follows its near-ties: SmolLM2's first token after "What is the capital of
/// France?" has its top two 0.046 apart in the simulator, and the one-bit-error truncations'
/// drift (a few hundredths of a logit over 30 blocks) turned "The capital of France is Paris."
/// into "L'Étoile, …" (docs/BENCHMARKS.md, session 31). Faithful costs about twice a step's
/// flights and a quarter to a half more time.
pub const DEFAULT_DECODER_TRUNCATION: ProductTruncation = ProductTruncation::Faithful;

/// The server's decoder: [`FixedDecoder`] (what the simulator runs) with its linear layers
/// prepared for the two-party products. Plain data, read by every generation at once.
pub struct ServerDecoder {
    fixed: FixedDecoder,
    layers: HashMap<DecoderLayer, PreparedFc>,
    /// The public tables' digest, announced to every session (hashing a real vocabulary's
    /// table takes a while, so once).
    tables_digest: BundleDigest,
    /// The table products when the tables are kept private.
    private_tables: Option<PrivateTables>,
    /// The truncations every session runs (announced; the client follows them).
    truncation: ProductTruncation,
}

impl ServerDecoder {
    /// [`ServerDecoder::with_ntt_budget`] at the default budget (`DEFAULT_NTT_BUDGET_BYTES`).
    pub fn new(fixed: FixedDecoder) -> Result<Self> {
        Self::with_ntt_budget(fixed, crate::prepared::DEFAULT_NTT_BUDGET_BYTES)
    }

    /// Prepares every private linear layer of `fixed` and keeps the NTT form of the decode
    /// step's single-row cut for as many fused groups as fit `ntt_budget` bytes, in the model's
    /// order (dense cuts, 32 bytes per weight at ℓ = 48: SmolLM2-135M's whole model takes
    /// 3.4 GB). Unlike an encoder's passes, every group kept saves its weight transforms at
    /// every step, so a budget below the whole model is worth its part. Refuses a model whose
    /// norms do not match its family (RMSNorm without β for Llama, LayerNorm with β for GPT-2):
    /// the client follows the public family alone, so a mismatch would desynchronise the
    /// parties.
    pub fn with_ntt_budget(fixed: FixedDecoder, ntt_budget: usize) -> Result<Self> {
        let cfg = &fixed.config;
        let layer_norm = cfg.family == DecoderFamily::Gpt2;
        let norms = (0..cfg.layers)
            .flat_map(|i| [DecoderNorm::Attn(i), DecoderNorm::Mlp(i)])
            .chain([DecoderNorm::Final]);
        for id in norms {
            let (_, beta) = fixed.norm_weights(id)?;
            ensure!(
                beta.is_some() == layer_norm,
                InvalidArgument,
                "norm {id:?} of a {:?} decoder {} β",
                cfg.family,
                if layer_norm { "lacks" } else { "has" }
            );
        }
        let mut layers = HashMap::new();
        let ring = fixed.format.fp.ring;
        let mut left = ntt_budget;
        for id in private_layers(cfg) {
            let group = fused_group(id, cfg);
            if group[0] != id {
                continue;
            }
            let mut weights = Vec::with_capacity(group.len());
            let mut biases = Vec::with_capacity(group.len());
            for &member in &group {
                let (w, b) = fixed.linear_weights(member)?;
                biases.push(b.map(RingTensor::into_data));
                weights.push(w);
            }
            let w = RingTensor::concat_rows(&weights.iter().collect::<Vec<_>>())?;
            // A group's bias is its members' side by side (zero for a member without one);
            // none when no member has one.
            let b = if biases.iter().any(Option::is_some) {
                let data: Vec<u64> = weights
                    .iter()
                    .zip(&biases)
                    .flat_map(|(w, b)| b.clone().unwrap_or_else(|| vec![0; w.shape()[0]]))
                    .collect();
                Some(RingTensor::from_vec(ring, &[data.len()], data)?)
            } else {
                None
            };
            let mut shape = decoder_fc_shape(&group, cfg, ring, 1)?;
            shape.max_seq = cfg.max_positions;
            let mut fc = PreparedFc::new(shape, &w, b.as_ref())?;
            let step = fc.cut_for_rows(1)?;
            let bytes = fc.matrix().ntt_bytes(step)?;
            if bytes <= left {
                fc.cache_ntt(step)?;
                left -= bytes;
            }
            layers.insert(id, fc);
        }
        let tables_digest = fixed.tables().digest();
        Ok(ServerDecoder {
            fixed,
            layers,
            tables_digest,
            private_tables: None,
            truncation: DEFAULT_DECODER_TRUNCATION,
        })
    }

    /// Runs every session with `truncation` (default [`DEFAULT_DECODER_TRUNCATION`]):
    /// `OneBitError` halves a step's flights, and may change a token where the simulator's top
    /// two logits nearly tie.
    pub fn with_truncation(mut self, truncation: ProductTruncation) -> Self {
        self.truncation = truncation;
        self
    }

    /// The truncations this decoder's sessions run.
    pub fn truncation(&self) -> ProductTruncation {
        self.truncation
    }

    /// Keeps the token embedding and the output table the server's: each generation then
    /// embeds the client's tokens by Veil's private lookup (`veil_linear::lookup`, one-hot)
    /// and computes the
    /// logits by an HE product whose result only the client opens (the `decoder` module's
    /// private-tables mode), and the client needs no tables. Llama family only: GPT-2's
    /// learned positions would be a third table, counted from the first real token, which
    /// only the client knows under padding. Holds the tables again as ring values and
    /// prepared products (a prompt's lookup is prepared per prompt).
    pub fn keep_tables_private(mut self) -> Result<Self> {
        let cfg = &self.fixed.config;
        ensure!(
            cfg.family == DecoderFamily::Llama,
            Unsupported,
            "private tables are built for the Llama family only: a {:?} decoder's learned \
             position table would have to be private too",
            cfg.family
        );
        let ring = self.fixed.format.fp.ring;
        let tables = self.fixed.tables();
        let token = tables.token_matrix()?;
        let step_lookup = PreparedLookup::new(&[&token], 1, EMBED_LOOKUP, 0)?;
        let head = PreparedFc::new(head_shape(cfg, ring, 1), &tables.output_matrix()?, None)?;
        self.private_tables = Some(PrivateTables {
            token,
            step_lookup,
            head,
        });
        Ok(self)
    }

    /// Whether the tables are the server's ([`ServerDecoder::keep_tables_private`]).
    pub fn tables_private(&self) -> bool {
        self.private_tables.is_some()
    }

    fn private(&self) -> Result<&PrivateTables> {
        self.private_tables.as_ref().ok_or_else(|| {
            Error::InvalidArgument("the decoder's tables are public: no table products".into())
        })
    }

    /// The embedding lookup of private tables for a decode step's one token, prepared once.
    pub(crate) fn step_lookup(&self) -> Result<&PreparedLookup> {
        Ok(&self.private()?.step_lookup)
    }

    /// The embedding lookup of private tables for a prompt of `rows` tokens, prepared now.
    pub(crate) fn prompt_lookup(&self, rows: usize) -> Result<PreparedLookup> {
        PreparedLookup::new(&[&self.private()?.token], rows, EMBED_LOOKUP, 0)
    }

    /// The LM head's product of private tables.
    pub(crate) fn head(&self) -> Result<&PreparedFc> {
        Ok(&self.private()?.head)
    }

    /// The fixed-point model (weights, configuration, format).
    pub fn fixed(&self) -> &FixedDecoder {
        &self.fixed
    }

    /// `veil_model::DecoderTables::digest` of the public tables.
    pub fn tables_digest(&self) -> BundleDigest {
        self.tables_digest
    }

    /// What admission announces of the tables: their digest, or the shape's when private.
    pub fn announced_tables(&self) -> AnnouncedTables {
        match self.private_tables {
            None => AnnouncedTables::Public(self.tables_digest),
            Some(_) => AnnouncedTables::Private(DecoderTables::shape_digest(
                &self.fixed.config,
                self.fixed.format,
            )),
        }
    }

    /// Bytes a prompt's embedding lookup prepares beyond the kept weights (a copy of the
    /// token table; 0 with public tables): reserved with each generation's memory.
    pub fn prompt_lookup_bytes(&self) -> usize {
        self.private_tables
            .as_ref()
            .map_or(0, |t| t.token.len() * std::mem::size_of::<u64>())
    }

    /// The model's configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.fixed.config
    }

    /// Bytes of NTT-domain weights kept ([`ServerDecoder::with_ntt_budget`]).
    pub fn ntt_cached_bytes(&self) -> Result<usize> {
        self.layers.values().map(PreparedFc::ntt_cached_bytes).sum()
    }

    /// Bytes the prepared weights hold (the private tables' products included).
    pub fn prepared_bytes(&self) -> usize {
        // The kept token table is the size of a prompt lookup's copy of it.
        let tables = self.prompt_lookup_bytes()
            + self
                .private_tables
                .as_ref()
                .map_or(0, |t| t.head.prepared_bytes());
        self.layers
            .values()
            .map(PreparedFc::prepared_bytes)
            .sum::<usize>()
            + tables
    }

    /// The prepared product whose group ([`fused_group`]) `id` leads, or an error naming a
    /// layer the model does not have.
    pub(crate) fn layer(&self, id: DecoderLayer) -> Result<&PreparedFc> {
        self.layers
            .get(&id)
            .ok_or_else(|| Error::Unsupported(format!("the decoder has no private layer {id:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(family: DecoderFamily) -> DecoderConfig {
        let llama = family == DecoderFamily::Llama;
        DecoderConfig {
            family,
            vocab_size: 100,
            hidden: 576,
            layers: 2,
            heads: 9,
            kv_heads: if llama { 3 } else { 9 },
            head_dim: 64,
            intermediate: 1536,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            max_positions: 2048,
            attention_bias: !llama,
            mlp_bias: !llama,
            tie_word_embeddings: true,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            variants: Vec::new(),
        }
    }

    /// The groups partition a model's private layers, each led by the layer the forward pass
    /// asks for first; a group's product has its members' input width and their outputs side
    /// by side, priced for its own rows; layers of different input widths are refused.
    #[test]
    fn fused_groups_partition_the_layers_and_share_one_input() {
        let ring = Ring::new(48).unwrap();
        for family in [DecoderFamily::Llama, DecoderFamily::Gpt2] {
            let cfg = config(family);
            let layers = private_layers(&cfg);
            let mut seen = Vec::new();
            for &id in &layers {
                let group = fused_group(id, &cfg);
                assert!(group.contains(&id), "{id:?}: {group:?}");
                for &member in &group {
                    assert_eq!(fused_group(member, &cfg), group, "{member:?}");
                }
                if group[0] == id {
                    let at = layers.iter().position(|&l| l == id).unwrap();
                    assert_eq!(&layers[at..at + group.len()], group.as_slice());
                    seen.extend(group.iter().copied());
                    for rows in [1, 7, 40] {
                        let shape = decoder_fc_shape(&group, &cfg, ring, rows).unwrap();
                        let outs: usize = group.iter().map(|&m| dims(m, &cfg).unwrap().1).sum();
                        assert_eq!(shape.in_features, dims(id, &cfg).unwrap().0);
                        assert_eq!(shape.out_features, outs);
                        assert_eq!((shape.seq, shape.max_seq), (rows, rows));
                    }
                }
            }
            assert_eq!(seen, layers, "{family:?}");
        }
        let llama = config(DecoderFamily::Llama);
        assert_eq!(
            fused_group(DecoderLayer::Up(1), &llama),
            [DecoderLayer::Gate(1), DecoderLayer::Up(1)]
        );
        let q = decoder_fc_shape(&fused_group(DecoderLayer::Key(0), &llama), &llama, ring, 1);
        assert_eq!(q.unwrap().out_features, 576 + 2 * 192);
        let gpt2 = config(DecoderFamily::Gpt2);
        assert_eq!(
            fused_group(DecoderLayer::Up(0), &gpt2),
            [DecoderLayer::Up(0)]
        );
        let mixed = [DecoderLayer::Query(0), DecoderLayer::Down(0)];
        assert!(decoder_fc_shape(&mixed, &llama, ring, 1).is_err());
        assert!(decoder_fc_shape(&[], &llama, ring, 1).is_err());
    }
}
