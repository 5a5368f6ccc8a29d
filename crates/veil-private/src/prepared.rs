//! The server's linear layers, prepared for HE once per model (one form serves every sequence
//! length), and the public description of every layer that both parties derive from the
//! architecture alone.
//!
//! **Memory.** Each weight matrix is kept once; the NTT form of its cuts (which saves the
//! per-request weight transforms; see `veil_linear::layout` for the short- and long-prompt
//! cuts) is kept when the server's budget allows ([`ServerModel::with_ntt_budget`]): all
//! layers' short-prompt cuts, then all layers' long-prompt cuts, each set whole or not at all.
//! Nothing grows with the number of distinct prompt lengths served.
//!
//! Q, K and V are fused into one [3h, h] layer: the client's input is encrypted and sent once
//! instead of three times, and one round trip replaces three.

use std::collections::HashMap;

use veil_core::{ensure, Error, Result, RingTensor};
use veil_he::ParamSet;
use veil_linear::{FcLayer, PreparedFc};
use veil_model::engine::LayerId;
use veil_model::ModelConfig;
use veil_model::{FixedLinear, FixedModel};

use crate::protocol::session_format;

/// Parameter set of the weight × share products (small fixed-point weights).
pub(crate) const WEIGHT_SET: ParamSet = ParamSet::N8192;

/// Which cut of a kept matrix a request's layout takes, announced by the server at admission
/// ([`crate::protocol::Announced::cuts`]), so both parties derive the same layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cuts {
    /// The cheapest at the request's length of the cuts every matrix keeps at the model's row
    /// limit (`veil_linear::WeightBlocking::all_for`): what a server caching their NTT forms
    /// serves without weight transforms.
    Kept,
    /// A cut priced at the request's own length (as a decoder's requests are): a server without
    /// an NTT cache transforms its weights for every request anyway, and at 8–64 rows this is
    /// modelled 13–16 % below the kept cuts.
    PerLength,
}

/// The public shape of layer `id` for `rows` input rows: what both parties derive the
/// product's layout from.
pub(crate) fn fc_shape(id: LayerId, cfg: &ModelConfig, rows: usize, cuts: Cuts) -> FcLayer {
    let (in_features, out_features) = id.dims(cfg);
    FcLayer {
        seq: rows,
        // The row limit the cuts are chosen under: the request's own length prices them there.
        max_seq: match cuts {
            Cuts::Kept => id.max_rows(cfg),
            Cuts::PerLength => rows,
        },
        in_features,
        out_features,
        set: WEIGHT_SET,
    }
}

/// All linear layers of a model, prepared once for every sequence length.
pub struct PreparedLayers {
    layers: HashMap<LayerId, PreparedFc>,
}

impl PreparedLayers {
    /// The prepared layer `id`, or an error naming a layer the model does not have.
    pub fn get(&self, id: LayerId) -> Result<&PreparedFc> {
        self.layers
            .get(&id)
            .ok_or_else(|| Error::Unsupported(format!("the model has no layer {id:?}")))
    }

    /// Bytes the prepared weights hold (coefficient blocks, cached NTT forms, biases).
    pub fn prepared_bytes(&self) -> usize {
        self.layers.values().map(|l| l.prepared_bytes()).sum()
    }

    /// Bytes of NTT-domain weights kept.
    pub fn ntt_cached_bytes(&self) -> Result<usize> {
        self.layers.values().map(|l| l.ntt_cached_bytes()).sum()
    }
}

/// The layers' weights stacked by output rows and their biases joined: one [Σ out, in] layer.
fn fuse(parts: &[&FixedLinear]) -> Result<(RingTensor, RingTensor)> {
    let ring = parts[0].weight.ring();
    let inp = parts[0].in_dim();
    let out: usize = parts.iter().map(|p| p.out_dim()).sum();
    let w: Vec<u64> = parts
        .iter()
        .flat_map(|p| p.weight.data().iter().copied())
        .collect();
    let b: Vec<u64> = parts
        .iter()
        .flat_map(|p| p.bias.data().iter().copied())
        .collect();
    Ok((
        RingTensor::from_vec(ring, &[out, inp], w)?,
        RingTensor::from_vec(ring, &[out], b)?,
    ))
}

/// Default budget for NTT-domain weights: none. The rule: keep a cut's NTT form only while it
/// is a modest share of the model (a few times its coefficient weights), and no cut is: the NTT
/// form takes N/(k_w·m_w) × 24 bytes per weight (three 8-byte limbs per slot of N, each weight
/// polynomial holding k_w·m_w weights), 384 bytes at the short-prompt cut (k_w·m_w = N/16)
/// against 8 in coefficient form, so 48× the weights at best: the 2-block MiniLM's short-prompt
/// cuts take 1.36 GB (1,296 MiB; `veil demo` then peaks at 1.85 GB instead of 0.38 GB),
/// BERT-Tiny's passes 152 MB and 1.21 GB (3 KB per weight at its long-prompt cut; the test
/// below pins both), BERT-Base's short-prompt cuts ≈ 30 GB. What a cache saves is one weight
/// transform per polynomial per request: in release, at the 2-block MiniLM's short prompts,
/// about 0.9 s of the server's CPU per prompt (a fifth of it) and no MatMul wall time
/// measurable on a loaded 2-core machine (server and client in separate processes). A server
/// with memory to spare and CPU-bound short prompts can still ask for one (`veil serve
/// --ntt-budget-mib 2048` keeps the MiniLM's short-prompt cuts; `veil demo` and `veil bench
/// model` take the same flag).
pub const DEFAULT_NTT_BUDGET_BYTES: usize = 0;

/// The server's model: the fixed-point model's norms, tables and bounds plus its linear layers
/// prepared for HE once, for every sequence length (each weight held there only). Plain data,
/// read by every session at once.
pub struct ServerModel {
    /// The fixed-point model without its linear layers' weights and biases, which
    /// [`ServerModel::with_ntt_budget`] moves into `layers` (held once: they are the model's
    /// largest part).
    fixed: FixedModel,
    layers: PreparedLayers,
    /// The cuts its requests take, fixed by what `layers` caches.
    cuts: Cuts,
}

impl ServerModel {
    /// Prepares the model with the [`DEFAULT_NTT_BUDGET_BYTES`] budget.
    pub fn new(fixed: FixedModel) -> Result<Self> {
        Self::with_ntt_budget(fixed, DEFAULT_NTT_BUDGET_BYTES)
    }

    /// Prepares every linear layer once and keeps the NTT form of as many as fit `ntt_budget`
    /// bytes (in layer order: block 0's first).
    pub fn with_ntt_budget(mut fixed: FixedModel, ntt_budget: usize) -> Result<Self> {
        // The client follows the public config alone, so the weights must match it exactly.
        let cfg = &fixed.config;
        ensure!(
            (cfg.veil.head == veil_model::HeadKind::Pooler) == fixed.head.pool_dense.is_some(),
            InvalidArgument,
            "config head {:?} does not match the pooler weights present",
            cfg.veil.head
        );
        ensure!(
            (cfg.veil.num_labels > 0) == fixed.head.classifier.is_some(),
            InvalidArgument,
            "config num_labels = {} does not match the classifier weights present",
            cfg.veil.num_labels
        );
        let layers = prepare(&mut fixed, ntt_budget)?;
        let cuts = match layers.ntt_cached_bytes()? {
            0 => Cuts::PerLength,
            _ => Cuts::Kept,
        };
        Ok(ServerModel {
            fixed,
            layers,
            cuts,
        })
    }

    /// The fixed-point model's configuration, format, norms, tables and bounds. Its linear
    /// layers' weights are in [`ServerModel::prepared`] only, so it cannot run the simulator:
    /// keep a [`FixedModel`] of one's own for that.
    pub fn fixed(&self) -> &FixedModel {
        &self.fixed
    }

    /// Encodes a loaded model at the session's fixed-point format and prepares it (with a
    /// progress spinner: the 2-block MiniLM takes seconds, BERT-Base minutes).
    pub fn from_model(model: &veil_model::Model, ntt_budget: usize) -> Result<Self> {
        let pb = veil_model::progress::spinner("preparing the model's weights for HE");
        let prepared = FixedModel::encode(&model.transformer, session_format())
            .and_then(|fixed| Self::with_ntt_budget(fixed, ntt_budget));
        pb.finish_and_clear();
        prepared
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.fixed.config
    }

    /// The prepared layers (the same for every sequence length).
    pub fn prepared(&self) -> &PreparedLayers {
        &self.layers
    }

    /// The cuts this server's requests take (announced at admission): the kept ones when it
    /// caches their NTT forms, else each request's own.
    pub fn cuts(&self) -> Cuts {
        self.cuts
    }
}

/// Prepares every linear layer of `fixed` and moves its weights there: each layer's weights and
/// biases are emptied in `fixed` as soon as its prepared form (its own transposed copy) exists, so
/// the server holds each weight once, and preparing holds at most one layer twice.
fn prepare(fixed: &mut FixedModel, ntt_budget: usize) -> Result<PreparedLayers> {
    let cfg = fixed.config.clone();
    let ring = fixed.fp().ring;
    let mut order = Vec::new();
    let mut layers = HashMap::new();
    let mut add = |id: LayerId, parts: &mut [&mut FixedLinear]| -> Result<()> {
        let shape = fc_shape(id, &cfg, 1, Cuts::Kept);
        let prepared = match parts {
            [one] => PreparedFc::new(shape, &one.weight, Some(&one.bias))?,
            _ => {
                let (w, b) = fuse(&parts.iter().map(|p| &**p).collect::<Vec<_>>())?;
                PreparedFc::new(shape, &w, Some(&b))?
            }
        };
        layers.insert(id, prepared);
        order.push(id);
        for p in parts {
            p.weight = RingTensor::zeros(ring, &[0, 0])?;
            p.bias = RingTensor::zeros(ring, &[0])?;
        }
        Ok(())
    };
    for (i, b) in fixed.blocks.iter_mut().enumerate() {
        add(
            LayerId::Qkv(i),
            &mut [&mut b.query, &mut b.key, &mut b.value],
        )?;
        add(LayerId::AttnOut(i), &mut [&mut b.attn_out])?;
        add(LayerId::Intermediate(i), &mut [&mut b.intermediate])?;
        add(LayerId::Output(i), &mut [&mut b.output])?;
    }
    if let Some(p) = &mut fixed.head.pool_dense {
        add(LayerId::Pooler, &mut [p])?;
    }
    if let Some(c) = &mut fixed.head.classifier {
        add(LayerId::Classifier, &mut [c])?;
    }
    // A pass is every layer's short-prompt cut, or every layer's long-prompt cut. A prompt goes
    // through every layer, so a pass saves a request's weight transforms only when all of it is
    // kept; a pass is therefore kept whole or not at all, short-prompt cuts (dense, so small)
    // first, while the budget lasts.
    let mut left = ntt_budget;
    for pass in 0..2 {
        let mut cuts = Vec::new();
        for id in &order {
            if let Some(&(cut, bytes)) = layers[id].ntt_bytes()?.get(pass) {
                cuts.push((*id, cut, bytes));
            }
        }
        let bytes: usize = cuts.iter().map(|c| c.2).sum();
        if bytes <= left {
            for (id, cut, _) in cuts {
                layers.get_mut(&id).expect("just inserted").cache_ntt(cut)?;
            }
            left -= bytes;
        }
    }
    Ok(PreparedLayers { layers })
}

#[cfg(test)]
mod tests {
    use veil_model::random::{random_transformer, Preset};

    use super::*;
    use crate::bench::{config, Variant};

    /// Bytes of each pass (every layer's short-prompt cut, then every layer's long-prompt cut).
    fn pass_bytes(layers: &PreparedLayers) -> Vec<usize> {
        (0..2)
            .map(|pass| {
                let cut = |l: &PreparedFc| l.ntt_bytes().unwrap().get(pass).map_or(0, |c| c.1);
                layers.layers.values().map(cut).sum()
            })
            .collect()
    }

    /// A random model of BERT-Tiny's shape at the session's format.
    fn tiny(seed: [u8; 16]) -> FixedModel {
        let cfg = config(Preset::BertTiny, Variant::Original);
        FixedModel::encode(&random_transformer(&cfg, seed).unwrap(), session_format()).unwrap()
    }

    /// The server holds each linear weight once: its fixed model's linear layers are empty after
    /// preparation, and the prepared layers hold every weight and bias (8 bytes each) of the
    /// model's blocks and head.
    #[test]
    fn the_server_holds_each_weight_once() {
        let fixed = tiny([4; 16]);
        let mut entries = 0;
        for b in &fixed.blocks {
            for l in [
                &b.query,
                &b.key,
                &b.value,
                &b.attn_out,
                &b.intermediate,
                &b.output,
            ] {
                entries += l.weight.len() + l.bias.len();
            }
        }
        for l in [
            fixed.head.pool_dense.as_ref(),
            fixed.head.classifier.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            entries += l.weight.len() + l.bias.len();
        }
        let server = ServerModel::with_ntt_budget(fixed, 0).unwrap();
        assert_eq!(server.prepared().prepared_bytes(), entries * 8);
        let kept = &server.fixed().blocks[0];
        assert_eq!(kept.query.weight.len() + kept.output.bias.len(), 0);
        assert!(server
            .fixed()
            .head
            .classifier
            .as_ref()
            .unwrap()
            .weight
            .is_empty());
    }

    /// What the NTT cache of BERT-Tiny's shape holds at a budget: nothing at 0, the short-prompt
    /// pass alone when only it fits, each pass once (not per length) and never beyond the
    /// budget. The pass sizes are pinned, so a change in what a cut costs shows here.
    #[test]
    fn the_ntt_cache_keeps_whole_passes_within_its_budget() {
        let fixed = tiny([3; 16]);
        let none = ServerModel::with_ntt_budget(fixed.clone(), 0).unwrap();
        assert_eq!(none.prepared().ntt_cached_bytes().unwrap(), 0);
        let passes = pass_bytes(none.prepared());
        assert_eq!(passes, [151_584_768, 1_207_959_552]);
        let short = ServerModel::with_ntt_budget(fixed, passes[0] + passes[1] - 1).unwrap();
        let layers = short.prepared();
        assert_eq!(layers.ntt_cached_bytes().unwrap(), passes[0]);
        let coefficients = none.prepared().prepared_bytes();
        assert_eq!(layers.prepared_bytes(), coefficients + passes[0]);
    }
}
