//! Model configuration: the Hugging Face `config.json` fields Veil uses, plus Veil's own
//! `"veil"` object (operator variants, embedding mode, head).
//!
//! Parsing is strict about what matters (a missing or ill-typed field is an error naming the
//! field) and ignores the many HF fields that do not affect the forward pass (dropout, etc.).
//! [`ModelConfig::to_json`] writes a config HF can read back, with the `"veil"` object added;
//! a folder without `"veil"` gets the original operators in every block.

use crate::variants::{
    Activation, BlockVariant, EmbeddingMode, HeadKind, Inputs, ProductTruncation,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use veil_core::{bail, ensure, Result};

/// The encoder families Veil runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// BERT: absolute positions from 0, two token types.
    Bert,
    /// RoBERTa: BERT blocks, positions numbered after the padding id.
    Roberta,
    /// MPNet: BERT blocks with a shared relative-position bias and no token types.
    MpNet,
}

impl Architecture {
    /// The `model_type` of `config.json` that names it.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Bert => "bert",
            Architecture::Roberta => "roberta",
            Architecture::MpNet => "mpnet",
        }
    }

    fn from_model_type(s: &str) -> Result<Self> {
        Ok(match s {
            "bert" => Architecture::Bert,
            "roberta" => Architecture::Roberta,
            "mpnet" => Architecture::MpNet,
            other => bail!(
                Unsupported,
                "config.json: model_type {other:?} is not a supported architecture (bert, roberta, mpnet)"
            ),
        })
    }

    /// RoBERTa and MPNet number positions from `pad_token_id + 1` (HF
    /// `create_position_ids_from_input_ids`); BERT from 0.
    pub fn position_offset(self, pad_token_id: u32) -> usize {
        match self {
            Architecture::Bert => 0,
            Architecture::Roberta | Architecture::MpNet => pad_token_id as usize + 1,
        }
    }
}

/// Veil's per-model settings, stored as the `"veil"` object of `config.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VeilSettings {
    /// Whether the embedding layer runs in the clear on the client or inside the protocol.
    #[serde(default)]
    pub embedding: EmbeddingMode,
    /// Truncation after products in the private pass (not a property of the weights).
    #[serde(default)]
    pub product_truncation: ProductTruncation,
    /// What turns the last hidden states into the output.
    pub head: HeadKind,
    /// Output width of the classifier on top of the head; 0 = no classifier (the pooled vector
    /// is the output, as for sentence embeddings).
    pub num_labels: usize,
    /// One entry per encoder block.
    pub blocks: Vec<BlockVariant>,
    /// The prompts a classifier was trained on; `None`: not recorded (a pre-trained encoder,
    /// or a folder written before it was), and prompts of either kind are taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Inputs>,
}

/// Everything the forward pass needs to know about a model's shape and operators.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The encoder family (`model_type`).
    pub architecture: Architecture,
    /// Token ids are below this.
    pub vocab_size: usize,
    /// The width of every hidden state.
    pub hidden_size: usize,
    /// The number of encoder blocks.
    pub num_layers: usize,
    /// Attention heads per block (they divide the width).
    pub num_heads: usize,
    /// The width of each block's feed-forward layer.
    pub intermediate_size: usize,
    /// The longest input the position table covers.
    pub max_position_embeddings: usize,
    /// 0 for MPNet (no token-type embedding).
    pub type_vocab_size: usize,
    /// The ε every LayerNorm adds to the variance.
    pub layer_norm_eps: f64,
    /// The padding token (RoBERTa and MPNet number positions after it).
    pub pad_token_id: u32,
    /// MPNet only: number of relative-position buckets (HF default 32).
    pub relative_attention_num_buckets: usize,
    /// The activation named by HF `hidden_act` (the per-block choice is in `veil.blocks`).
    pub hidden_act: Activation,
    /// Veil's own settings (the `"veil"` object).
    pub veil: VeilSettings,
}

impl ModelConfig {
    /// A builder for a config with the original operators in every block, starting from the
    /// tiny shape of the tests and examples ([`ConfigBuilder`]); set every field that differs.
    pub fn builder(architecture: Architecture) -> ConfigBuilder {
        ConfigBuilder {
            architecture,
            vocab_size: 50,
            hidden_size: 16,
            num_layers: 2,
            num_heads: 2,
            intermediate_size: 32,
            max_position_embeddings: 16,
            head: HeadKind::Pooler,
            num_labels: 2,
        }
    }

    /// The config as a server announces it and a client compares it: what both parties compute
    /// with. `veil.inputs` is left out: it only guards the client's own prompts, and a client
    /// that predates it still reads the announcement.
    pub fn announced(&self) -> ModelConfig {
        let mut c = self.clone();
        c.veil.inputs = None;
        c
    }

    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Checks the shape relations the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            ensure!(v > 0, Malformed, "config.json: {name} must be positive");
        }
        ensure!(
            self.hidden_size.is_multiple_of(self.num_heads),
            Malformed,
            "config.json: hidden_size {} is not a multiple of num_attention_heads {}",
            self.hidden_size,
            self.num_heads
        );
        ensure!(
            self.veil.blocks.len() == self.num_layers,
            Malformed,
            "config.json: veil.blocks has {} entries but num_hidden_layers is {}",
            self.veil.blocks.len(),
            self.num_layers
        );
        ensure!(
            self.layer_norm_eps > 0.0 && self.layer_norm_eps.is_finite(),
            Malformed,
            "config.json: layer_norm_eps must be positive"
        );
        ensure!(
            self.architecture != Architecture::MpNet || self.relative_attention_num_buckets >= 4,
            Malformed,
            "config.json: relative_attention_num_buckets must be at least 4"
        );
        Ok(())
    }

    /// Longest input sequence the position table allows.
    pub fn max_sequence_len(&self) -> usize {
        self.max_position_embeddings
            - self
                .architecture
                .position_offset(self.pad_token_id)
                .min(self.max_position_embeddings)
    }

    /// Checks one token sequence against the tables: length within the position table, ids
    /// within the vocabulary, type ids within the token types (ignored, as in HF, by models
    /// without a type table).
    pub fn check_input(&self, ids: &[u32], type_ids: &[u32]) -> Result<()> {
        ensure!(
            !ids.is_empty() && ids.len() == type_ids.len(),
            InvalidArgument,
            "need a non-empty sequence with one type id per token"
        );
        ensure!(
            ids.len() <= self.max_sequence_len(),
            InvalidArgument,
            "sequence of {} tokens exceeds the model's limit of {}",
            ids.len(),
            self.max_sequence_len()
        );
        ensure!(
            ids.iter().all(|&i| (i as usize) < self.vocab_size),
            InvalidArgument,
            "token id beyond the vocabulary of {}",
            self.vocab_size
        );
        ensure!(
            self.type_vocab_size == 0
                || type_ids
                    .iter()
                    .all(|&t| (t as usize) < self.type_vocab_size),
            InvalidArgument,
            "token type id beyond the {} token types",
            self.type_vocab_size
        );
        Ok(())
    }

    /// Parses the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| veil_core::Error::Malformed(format!("config.json is not JSON: {e}")))?;
        let obj = match v.as_object() {
            Some(o) => o,
            None => bail!(Malformed, "config.json: top level is not an object"),
        };
        let architecture = Architecture::from_model_type(req_str(obj, "model_type")?)?;
        let act_name = opt_str(obj, "hidden_act")?.unwrap_or("gelu");
        let hidden_act = match Activation::from_hf(act_name) {
            Some(a) => a,
            None => bail!(
                Unsupported,
                "config.json: hidden_act {act_name:?} is not supported (gelu, relu)"
            ),
        };
        if let Some(p) = opt_str(obj, "position_embedding_type")? {
            ensure!(
                p == "absolute",
                Unsupported,
                "config.json: position_embedding_type {p:?} is not supported (absolute)"
            );
        }
        let num_layers = req_usize(obj, "num_hidden_layers")?;
        let veil = match obj.get("veil") {
            Some(v) => serde_json::from_value::<VeilSettings>(v.clone())
                .map_err(|e| veil_core::Error::Malformed(format!("config.json: veil: {e}")))?,
            None => default_settings(obj, hidden_act, num_layers)?,
        };
        let default_types = if architecture == Architecture::MpNet {
            0
        } else {
            2
        };
        let cfg = ModelConfig {
            architecture,
            vocab_size: req_usize(obj, "vocab_size")?,
            hidden_size: req_usize(obj, "hidden_size")?,
            num_layers,
            num_heads: req_usize(obj, "num_attention_heads")?,
            intermediate_size: req_usize(obj, "intermediate_size")?,
            max_position_embeddings: req_usize(obj, "max_position_embeddings")?,
            type_vocab_size: opt_usize(obj, "type_vocab_size")?.unwrap_or(default_types),
            layer_norm_eps: opt_f64(obj, "layer_norm_eps")?.unwrap_or(1e-12),
            pad_token_id: opt_usize(obj, "pad_token_id")?.map(|p| p as u32).unwrap_or(
                if architecture == Architecture::Bert {
                    0
                } else {
                    1
                },
            ),
            relative_attention_num_buckets: opt_usize(obj, "relative_attention_num_buckets")?
                .unwrap_or(32),
            hidden_act,
            veil,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The HF-compatible `config.json` text, with the `"veil"` object.
    pub fn to_json(&self) -> String {
        let arch_name = match (self.architecture, self.veil.num_labels) {
            (Architecture::Bert, 0) => "BertModel",
            (Architecture::Bert, _) => "BertForSequenceClassification",
            (Architecture::Roberta, 0) => "RobertaModel",
            (Architecture::Roberta, _) => "RobertaForSequenceClassification",
            (Architecture::MpNet, 0) => "MPNetModel",
            (Architecture::MpNet, _) => "MPNetForSequenceClassification",
        };
        let mut v = json!({
            "architectures": [arch_name],
            "model_type": self.architecture.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act.hf_name(),
            "max_position_embeddings": self.max_position_embeddings,
            "layer_norm_eps": self.layer_norm_eps,
            "pad_token_id": self.pad_token_id,
            "veil": self.veil,
        });
        let o = v.as_object_mut().expect("object literal");
        if self.architecture == Architecture::MpNet {
            o.insert(
                "relative_attention_num_buckets".into(),
                self.relative_attention_num_buckets.into(),
            );
        } else {
            o.insert("type_vocab_size".into(), self.type_vocab_size.into());
            o.insert("position_embedding_type".into(), "absolute".into());
        }
        if self.veil.num_labels > 0 {
            let labels: Map<String, Value> = (0..self.veil.num_labels)
                .map(|i| (i.to_string(), format!("LABEL_{i}").into()))
                .collect();
            o.insert("id2label".into(), Value::Object(labels));
        }
        serde_json::to_string_pretty(&v).expect("config serialises")
    }
}

/// Settings for an HF folder Veil has not written: the original operators, and a classifier
/// head exactly when HF's `architectures` names a sequence classifier.
fn default_settings(
    obj: &Map<String, Value>,
    act: Activation,
    num_layers: usize,
) -> Result<VeilSettings> {
    let is_classifier = obj
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|s| s.ends_with("ForSequenceClassification"))
        });
    let num_labels = if !is_classifier {
        0
    } else if let Some(m) = obj.get("id2label").and_then(Value::as_object) {
        m.len()
    } else {
        opt_usize(obj, "num_labels")?.unwrap_or(2)
    };
    Ok(VeilSettings {
        embedding: EmbeddingMode::Public,
        product_truncation: ProductTruncation::default(),
        head: if is_classifier {
            HeadKind::Pooler
        } else {
            HeadKind::MeanPool
        },
        num_labels,
        blocks: vec![BlockVariant::exact(act); num_layers],
        inputs: None,
    })
}

fn req_str<'a>(o: &'a Map<String, Value>, k: &str) -> Result<&'a str> {
    match opt_str(o, k)? {
        Some(s) => Ok(s),
        None => bail!(Malformed, "config.json: missing field {k:?}"),
    }
}

fn opt_str<'a>(o: &'a Map<String, Value>, k: &str) -> Result<Option<&'a str>> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => bail!(Malformed, "config.json: field {k:?} is not a string"),
    }
}

fn req_usize(o: &Map<String, Value>, k: &str) -> Result<usize> {
    match opt_usize(o, k)? {
        Some(v) => Ok(v),
        None => bail!(Malformed, "config.json: missing field {k:?}"),
    }
}

fn opt_usize(o: &Map<String, Value>, k: &str) -> Result<Option<usize>> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|x| usize::try_from(x).ok()) {
            Some(x) if x < 1 << 32 => Ok(Some(x)),
            _ => bail!(
                Malformed,
                "config.json: field {k:?} is not a non-negative integer below 2^32: {v}"
            ),
        },
    }
}

fn opt_f64(o: &Map<String, Value>, k: &str) -> Result<Option<f64>> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) => Ok(Some(x)),
            None => bail!(Malformed, "config.json: field {k:?} is not a number: {v}"),
        },
    }
}
/// Named shape fields instead of nine positional arguments: `ModelConfig::builder(arch)` starts
/// at vocabulary 50, width 16, 2 blocks of 2 heads, FFN 32, 16 positions and a pooler head with 2
/// labels (a model that runs in milliseconds); presets and tests set what differs.
#[derive(Clone, Debug)]
#[must_use]
pub struct ConfigBuilder {
    architecture: Architecture,
    vocab_size: usize,
    hidden_size: usize,
    num_layers: usize,
    num_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    head: HeadKind,
    num_labels: usize,
}

impl ConfigBuilder {
    /// The vocabulary size.
    pub fn vocab(mut self, n: usize) -> Self {
        self.vocab_size = n;
        self
    }

    /// The hidden width.
    pub fn hidden(mut self, n: usize) -> Self {
        self.hidden_size = n;
        self
    }

    /// The number of encoder blocks.
    pub fn layers(mut self, n: usize) -> Self {
        self.num_layers = n;
        self
    }

    /// The number of attention heads (a divisor of the width).
    pub fn heads(mut self, n: usize) -> Self {
        self.num_heads = n;
        self
    }

    /// The feed-forward layer's width.
    pub fn ffn(mut self, n: usize) -> Self {
        self.intermediate_size = n;
        self
    }

    /// The longest input, in tokens.
    pub fn positions(mut self, n: usize) -> Self {
        self.max_position_embeddings = n;
        self
    }

    /// The head on top of the encoder.
    pub fn head(mut self, head: HeadKind) -> Self {
        self.head = head;
        self
    }

    /// The classifier's outputs; 0 for none.
    pub fn labels(mut self, n: usize) -> Self {
        self.num_labels = n;
        self
    }

    /// The config, checked as a loaded one is ([`ModelConfig::validate`]).
    pub fn build(self) -> Result<ModelConfig> {
        let cfg = ModelConfig {
            architecture: self.architecture,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            intermediate_size: self.intermediate_size,
            max_position_embeddings: self.max_position_embeddings,
            type_vocab_size: if self.architecture == Architecture::MpNet {
                0
            } else {
                2
            },
            layer_norm_eps: 1e-12,
            pad_token_id: if self.architecture == Architecture::Bert {
                0
            } else {
                1
            },
            relative_attention_num_buckets: 32,
            hidden_act: Activation::Gelu,
            veil: VeilSettings {
                embedding: EmbeddingMode::Public,
                product_truncation: ProductTruncation::default(),
                head: self.head,
                num_labels: self.num_labels,
                blocks: vec![BlockVariant::exact(Activation::Gelu); self.num_layers],
                inputs: None,
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
