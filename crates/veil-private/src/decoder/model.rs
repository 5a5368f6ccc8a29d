//! The server's decoder: the fixed-point weights with every block's linear layers prepared for
//! HE once (one form serves the prefill's many rows and the decode step's one), and the public
//! shape of each layer that both parties derive from the configuration alone.

use std::collections::HashMap;

use veil_core::{bail, ensure, Error, Result, Ring};
use veil_linear::{FcLayer, PreparedFc};
use veil_model::decoder::{DecoderConfig, DecoderFamily};
use veil_model::engine::decoder::{DecoderLayer, DecoderNorm};
use veil_model::{BundleDigest, FixedDecoder};

use veil_linear::weight_set;

/// (in, out) features of private layer `id`, from the public configuration.
fn dims(id: DecoderLayer, cfg: &DecoderConfig) -> Result<(usize, usize)> {
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

/// The public shape of layer `id` for `rows` input rows over `ring` (the format's: it picks the
/// HE set, `N8192Q4L48` at ℓ = 48). The weights are cut once for any number of rows up to the
/// model's `max_positions` (a prefill of the whole context at most).
pub(crate) fn decoder_fc_shape(
    id: DecoderLayer,
    cfg: &DecoderConfig,
    ring: Ring,
    rows: usize,
) -> Result<FcLayer> {
    let (in_features, out_features) = dims(id, cfg)?;
    Ok(FcLayer {
        seq: rows,
        max_seq: cfg.max_positions,
        in_features,
        out_features,
        set: weight_set(ring),
    })
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

/// The server's decoder: [`FixedDecoder`] (what the simulator runs) with its linear layers
/// prepared for the two-party products. Plain data, read by every generation at once.
pub struct ServerDecoder {
    fixed: FixedDecoder,
    layers: HashMap<DecoderLayer, PreparedFc>,
    /// The public tables' digest, announced to every session (hashing a real vocabulary's
    /// table takes a while, so once).
    tables_digest: BundleDigest,
}

impl ServerDecoder {
    /// Prepares every private linear layer of `fixed`. Refuses a model whose norms do not
    /// match its family (RMSNorm without β for Llama, LayerNorm with β for GPT-2): the client
    /// follows the public family alone, so a mismatch would desynchronise the parties.
    pub fn new(fixed: FixedDecoder) -> Result<Self> {
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
        for id in private_layers(cfg) {
            let (w, b) = fixed.linear_weights(id)?;
            let fc = PreparedFc::new(
                decoder_fc_shape(id, cfg, fixed.format.fp.ring, 1)?,
                &w,
                b.as_ref(),
            )?;
            layers.insert(id, fc);
        }
        let tables_digest = fixed.tables().digest();
        Ok(ServerDecoder {
            fixed,
            layers,
            tables_digest,
        })
    }

    /// The fixed-point model (weights, configuration, format).
    pub fn fixed(&self) -> &FixedDecoder {
        &self.fixed
    }

    /// `veil_model::DecoderTables::digest` of the public tables, announced at admission.
    pub fn tables_digest(&self) -> BundleDigest {
        self.tables_digest
    }

    /// The model's configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.fixed.config
    }

    /// Bytes the prepared weights hold.
    pub fn prepared_bytes(&self) -> usize {
        self.layers.values().map(PreparedFc::prepared_bytes).sum()
    }

    /// The prepared layer `id`, or an error naming a layer the model does not have.
    pub(crate) fn layer(&self, id: DecoderLayer) -> Result<&PreparedFc> {
        self.layers
            .get(&id)
            .ok_or_else(|| Error::Unsupported(format!("the decoder has no private layer {id:?}")))
    }
}
