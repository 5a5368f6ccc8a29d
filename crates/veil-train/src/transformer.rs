//! A veil-model [`Transformer`] made trainable: its parameters live in a candle `VarMap`, its
//! blocks can switch operator variants, and parameters are grouped (embeddings / block i / head)
//! so a run can freeze the embedding tables and the blocks below the one being substituted.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rand::SeedableRng;
use veil_core::{bail, ensure, Error, Result};
use veil_model::{folder, BlockVariant, Inputs, ModelConfig, Transformer};

use crate::batch::{Batch, ClassifierOutput, SequenceClassifier};
use crate::init::{fill_normal, fill_zeros};
use veil_model::candle_error;

/// Files of [`TrainableTransformer::write_state`].
const STATE_PARAMS: &str = "params.safetensors";
const STATE_VARIANTS: &str = "variants.json";

/// HF's initialiser range for new dense layers.
const NEW_WEIGHT_STD: f64 = 0.02;

/// Which part of the model a parameter belongs to, decided by its HF name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamGroup {
    /// `embeddings.*` (tables and their LayerNorm).
    Embeddings,
    /// `encoder.layer.<i>.*`.
    Block(usize),
    /// MPNet's `encoder.relative_attention_bias`: shared by every block.
    SharedAttentionBias,
    /// Pooler and classifier.
    Head,
}

impl ParamGroup {
    /// The group of a parameter, by its Hugging Face name.
    pub fn of(name: &str) -> ParamGroup {
        if name.starts_with("embeddings.") {
            return ParamGroup::Embeddings;
        }
        if let Some(rest) = name.strip_prefix("encoder.layer.") {
            if let Some(i) = rest.split('.').next().and_then(|i| i.parse().ok()) {
                return ParamGroup::Block(i);
            }
        }
        if name.starts_with("encoder.") {
            return ParamGroup::SharedAttentionBias;
        }
        ParamGroup::Head
    }
}

/// What stays fixed during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freeze {
    /// Freeze `embeddings.*` (required when the client computes embeddings in the clear from
    /// the public pre-trained tables).
    pub embeddings: bool,
    /// Freeze blocks `0 .. blocks_below` (Algorithm 5 freezes the blocks below the one being
    /// substituted). Parameters shared by all blocks are frozen when any block is.
    pub blocks_below: usize,
}

impl Freeze {
    fn is_frozen(&self, group: ParamGroup) -> bool {
        match group {
            ParamGroup::Embeddings => self.embeddings,
            ParamGroup::Block(i) => i < self.blocks_below,
            ParamGroup::SharedAttentionBias => self.blocks_below > 0,
            ParamGroup::Head => false,
        }
    }
}

/// A transformer whose parameters are candle `Var`s.
pub struct TrainableTransformer {
    /// The model whose weights are the `Var`s.
    pub transformer: Transformer,
    /// Every parameter, sorted by name (a stable order for the optimiser and checkpoints).
    params: Vec<(String, Var)>,
}

/// How loading went: names of the parameters the folder did not have (freshly initialised).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadInfo {
    /// Parameters initialised afresh.
    pub initialised: Vec<String>,
}

impl TrainableTransformer {
    /// Builds the model for `config` and fills it from `weights`. Missing parameters are allowed
    /// only in the head (a new classifier); they are drawn N(0, 0.02²) (biases 0) from `seed`.
    /// Weights the config does not use (e.g. blocks cut away, an unused pooler) are ignored.
    pub fn from_weights(
        config: &ModelConfig,
        weights: &HashMap<String, Tensor>,
        seed: u64,
    ) -> Result<(Self, LoadInfo)> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let transformer = Transformer::new(config, vb)
            .map_err(|e| Error::InvalidArgument(format!("building the model: {e}")))?;
        let mut params: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .map_err(|_| Error::Other("parameter map lock poisoned".into()))?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut info = LoadInfo::default();
        for (name, var) in &params {
            match weights.get(name) {
                Some(t) => {
                    ensure!(
                        t.dims() == var.dims(),
                        Malformed,
                        "weight {name:?} has shape {:?}, the config needs {:?}",
                        t.dims(),
                        var.dims()
                    );
                    var.set(
                        &t.to_dtype(DType::F32)
                            .map_err(candle_error("model parameters"))?,
                    )
                    .map_err(candle_error("model parameters"))?;
                }
                None if ParamGroup::of(name) == ParamGroup::Head => {
                    if var.rank() >= 2 {
                        fill_normal(var, NEW_WEIGHT_STD, &mut rng)?;
                    } else {
                        fill_zeros(var)?;
                    }
                    info.initialised.push(name.clone());
                }
                None => bail!(Malformed, "the model folder has no weight {name:?}"),
            }
        }
        Ok((
            TrainableTransformer {
                transformer,
                params,
            },
            info,
        ))
    }

    /// Loads a model folder as a classifier with `num_labels` classes, keeping its first
    /// `num_layers` blocks (all when `None`).
    pub fn load(
        dir: &Path,
        num_labels: usize,
        num_layers: Option<usize>,
        seed: u64,
    ) -> Result<(Self, LoadInfo)> {
        let mut config = folder::load_config(dir)?;
        ensure!(
            num_labels >= 2,
            InvalidArgument,
            "a classifier needs at least two labels"
        );
        let existing = config.veil.num_labels;
        ensure!(
            existing == 0 || existing == num_labels,
            InvalidArgument,
            "{} is a classifier with {existing} labels; the data has {num_labels}",
            dir.display()
        );
        config.veil.num_labels = num_labels;
        if let Some(n) = num_layers {
            ensure!(
                (1..=config.num_layers).contains(&n),
                InvalidArgument,
                "cannot keep {n} of the model's {} blocks",
                config.num_layers
            );
            config.num_layers = n;
            config.veil.blocks.truncate(n);
        }
        let weights = folder::load_weights(dir, &config)?;
        Self::from_weights(&config, &weights, seed)
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.transformer.config
    }

    /// Records in the config that is saved with it what its prompts are (the training data's).
    pub fn record_inputs(&mut self, inputs: Inputs) {
        self.transformer.config.veil.inputs = Some(inputs);
    }

    /// Encoder blocks.
    pub fn num_blocks(&self) -> usize {
        self.transformer.blocks.len()
    }

    /// All parameters, sorted by name.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The parameters a run with `freeze` updates.
    pub fn trainable(&self, freeze: Freeze) -> Vec<(String, Var)> {
        self.params
            .iter()
            .filter(|(name, _)| !freeze.is_frozen(ParamGroup::of(name)))
            .cloned()
            .collect()
    }

    /// Each block's operator variants.
    pub fn variants(&self) -> Vec<BlockVariant> {
        self.transformer.blocks.iter().map(|b| b.variant).collect()
    }

    /// Switches block `i` to `variant`, in the module and in the config that is saved with it.
    pub fn set_variant(&mut self, i: usize, variant: BlockVariant) -> Result<()> {
        ensure!(
            i < self.num_blocks(),
            InvalidArgument,
            "block {i} out of range"
        );
        let block = &mut self.transformer.blocks[i];
        block.variant = variant;
        block.ln1.kind = variant.ln1;
        block.ln2.kind = variant.ln2;
        self.transformer.config.veil.blocks[i] = variant;
        Ok(())
    }

    /// A copy of every parameter's current value.
    pub fn parameter_values(&self) -> Result<Vec<Tensor>> {
        self.params
            .iter()
            .map(|(_, v)| {
                v.as_tensor()
                    .copy()
                    .map_err(candle_error("model parameters"))
            })
            .collect()
    }

    /// Restores values taken by [`Self::parameter_values`].
    pub fn set_parameter_values(&self, values: &[Tensor]) -> Result<()> {
        ensure!(
            values.len() == self.params.len(),
            InvalidArgument,
            "parameter count differs"
        );
        for ((_, var), value) in self.params.iter().zip(values) {
            var.set(value).map_err(candle_error("model parameters"))?;
        }
        Ok(())
    }

    /// Writes every parameter and the block variants into `dir` (`params.safetensors`,
    /// `variants.json`): the state a substitution run resumes from.
    pub fn write_state(&self, dir: &Path) -> Result<()> {
        let tensors: HashMap<String, Tensor> = self
            .params
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&tensors, dir.join(STATE_PARAMS))
            .map_err(candle_error("model parameters"))?;
        let json =
            serde_json::to_vec_pretty(&self.variants()).map_err(|e| Error::Other(e.to_string()))?;
        let path = dir.join(STATE_VARIANTS);
        std::fs::write(&path, json)
            .map_err(|e| Error::Other(format!("cannot write {}: {e}", path.display())))
    }

    /// Restores what [`Self::write_state`] wrote, after checking it fits this model.
    pub fn read_state(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join(STATE_VARIANTS);
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::Other(format!("cannot read {}: {e}", path.display())))?;
        let variants: Vec<BlockVariant> = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))?;
        ensure!(
            variants.len() == self.num_blocks(),
            Malformed,
            "{} has {} blocks, the model {}",
            path.display(),
            variants.len(),
            self.num_blocks()
        );
        let path = dir.join(STATE_PARAMS);
        let saved = candle_core::safetensors::load(&path, &Device::Cpu)
            .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))?;
        ensure!(
            saved.len() == self.params.len(),
            Malformed,
            "{} has {} parameters, the model {}",
            path.display(),
            saved.len(),
            self.params.len()
        );
        let values = self
            .params
            .iter()
            .map(|(name, var)| {
                let t = saved.get(name).ok_or_else(|| {
                    Error::Malformed(format!("{} has no parameter {name:?}", path.display()))
                })?;
                ensure!(
                    t.dims() == var.dims() && t.dtype() == var.dtype(),
                    Malformed,
                    "{}: parameter {name:?} is {:?} {:?}, the model's {:?} {:?}",
                    path.display(),
                    t.dtype(),
                    t.dims(),
                    var.dtype(),
                    var.dims()
                );
                Ok(t.clone())
            })
            .collect::<Result<Vec<Tensor>>>()?;
        for (i, v) in variants.into_iter().enumerate() {
            self.set_variant(i, v)?;
        }
        self.set_parameter_values(&values)
    }

    /// Writes the model folder (config with variants, weights, tokenizer).
    pub fn save(&self, dir: &Path, tokenizer: Option<&veil_model::TextTokenizer>) -> Result<()> {
        folder::save(dir, &self.transformer, tokenizer)
    }
}

impl Freeze {
    /// The hidden state (0: embedding output, i: output of block i − 1) below which nothing is
    /// trained, if any: the backward pass can stop there. Trainable embeddings under frozen
    /// blocks still need the gradient through those blocks.
    fn frozen_through(&self) -> Option<usize> {
        self.embeddings.then_some(self.blocks_below)
    }
}

/// A model being trained under `freeze`: the same forward values, with the autograd graph cut
/// at the top of the frozen part so backward does no work for parameters that do not move.
pub struct FrozenView<'a> {
    model: &'a TrainableTransformer,
    freeze: Freeze,
}

impl TrainableTransformer {
    /// The model seen as a classifier whose frozen part builds no autograd graph.
    pub fn frozen_view(&self, freeze: Freeze) -> FrozenView<'_> {
        FrozenView {
            model: self,
            freeze,
        }
    }

    fn classify(
        &self,
        batch: &Batch,
        detach_at: Option<usize>,
    ) -> candle_core::Result<ClassifierOutput> {
        let out = self.transformer.forward_detached(
            &veil_model::Batch {
                input_ids: batch.input_ids.clone(),
                token_type_ids: Some(batch.type_ids.clone()),
                attention_mask: Some(batch.attention_mask.clone()),
            },
            detach_at,
        )?;
        let Some(logits) = out.logits else {
            candle_core::bail!("the model has no classifier (num_labels = 0)")
        };
        // hidden_states[0] is the embedding output; the bound applies to block outputs.
        let hidden_states = out.hidden_states.into_iter().skip(1).collect();
        Ok(ClassifierOutput {
            logits,
            hidden_states,
        })
    }
}

impl SequenceClassifier for TrainableTransformer {
    fn forward(&self, batch: &Batch) -> candle_core::Result<ClassifierOutput> {
        self.classify(batch, None)
    }
}

impl SequenceClassifier for FrozenView<'_> {
    fn forward(&self, batch: &Batch) -> candle_core::Result<ClassifierOutput> {
        self.model.classify(batch, self.freeze.frozen_through())
    }
}
