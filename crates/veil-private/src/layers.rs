//! The server's linear layers, prepared for HE once per (model, sequence length), and the public
//! description of every layer that both parties derive from the architecture alone.
//!
//! Q, K and V are fused into one [3h, h] layer: the client's input is encrypted and sent once
//! instead of three times, and one round trip replaces three.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use veil_core::{ensure, Error, Result, RingTensor};
use veil_he::ParamSet;
use veil_linear::{FcLayer, PreparedFc};
use veil_model::sim::{FixedLinear, FixedModel};
use veil_model::ModelConfig;

/// Parameter set of the weight × share products (small fixed-point weights).
pub const WEIGHT_SET: ParamSet = ParamSet::N8192;

/// Names a linear layer of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerId {
    /// Fused query/key/value of a block.
    Qkv(usize),
    AttnOut(usize),
    Intermediate(usize),
    Output(usize),
    Pooler,
    Classifier,
}

impl LayerId {
    /// The layer's public shape for `rows` input rows.
    pub fn public(self, cfg: &ModelConfig, rows: usize) -> FcLayer {
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let (inp, out) = match self {
            LayerId::Qkv(_) => (h, 3 * h),
            LayerId::AttnOut(_) | LayerId::Pooler => (h, h),
            LayerId::Intermediate(_) => (h, ff),
            LayerId::Output(_) => (ff, h),
            LayerId::Classifier => (h, cfg.veil.num_labels),
        };
        FcLayer {
            seq: rows,
            in_features: inp,
            out_features: out,
            set: WEIGHT_SET,
        }
    }
}

/// All linear layers of a model prepared for one sequence length.
pub struct PreparedLayers {
    layers: HashMap<LayerId, PreparedFc>,
}

impl PreparedLayers {
    pub fn get(&self, id: LayerId) -> Result<&PreparedFc> {
        self.layers
            .get(&id)
            .ok_or_else(|| Error::Unsupported(format!("the model has no layer {id:?}")))
    }
}

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

/// The server's model: the fixed-point weights plus HE-prepared layers per sequence length
/// (the packing layout depends on the number of rows, so each length is prepared on first use
/// and cached).
pub struct ServerModel {
    pub fixed: FixedModel,
    cache: Mutex<HashMap<usize, Arc<PreparedLayers>>>,
}

impl ServerModel {
    pub fn new(fixed: FixedModel) -> Result<Self> {
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
        Ok(ServerModel {
            fixed,
            cache: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.fixed.config
    }

    /// The layers prepared for `seq` rows (prepared now if this length is new).
    pub fn prepared(&self, seq: usize) -> Result<Arc<PreparedLayers>> {
        if let Some(p) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&seq)
        {
            return Ok(p.clone());
        }
        let p = Arc::new(self.prepare(seq)?);
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(seq, p.clone());
        Ok(p)
    }

    fn prepare(&self, seq: usize) -> Result<PreparedLayers> {
        let cfg = self.config();
        let mut layers = HashMap::new();
        let mut add = |id: LayerId, rows: usize, w: &RingTensor, b: &RingTensor| -> Result<()> {
            layers.insert(id, PreparedFc::new(id.public(cfg, rows), w, Some(b))?);
            Ok(())
        };
        for (i, b) in self.fixed.blocks.iter().enumerate() {
            let (w, bias) = fuse(&[&b.query, &b.key, &b.value])?;
            add(LayerId::Qkv(i), seq, &w, &bias)?;
            add(
                LayerId::AttnOut(i),
                seq,
                &b.attn_out.weight,
                &b.attn_out.bias,
            )?;
            add(
                LayerId::Intermediate(i),
                seq,
                &b.intermediate.weight,
                &b.intermediate.bias,
            )?;
            add(LayerId::Output(i), seq, &b.output.weight, &b.output.bias)?;
        }
        if let Some(p) = &self.fixed.head.pool_dense {
            add(LayerId::Pooler, 1, &p.weight, &p.bias)?;
        }
        if let Some(c) = &self.fixed.head.classifier {
            add(LayerId::Classifier, 1, &c.weight, &c.bias)?;
        }
        Ok(PreparedLayers { layers })
    }
}
