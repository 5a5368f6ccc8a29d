//! The client's bundle: everything a client needs to run a private inference and nothing of the
//! server's — the public `config.json` (shape, operator variants, embedding mode), the tokenizer
//! and, in public-embedding mode, the public embedding tables (`public.safetensors`, the
//! `embeddings.*` tensors: word, position, token-type tables and their LayerNorm, which
//! fine-tuning froze). No encoder, pooler or classifier weight is written, and loading refuses a
//! bundle that carries one. In private-embedding mode the tables are the server's too: the bundle
//! holds no tensor at all. Every file is listed with its SHA-256 in the bundle's manifest and
//! re-hashed at load ([`crate::manifest`]).

use std::path::Path;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use veil_core::{bail, Error, FixedPoint, Result, RingTensor};

use crate::candle_error;
use crate::config::ModelConfig;
use crate::folder::{has_weights, load_config, load_tokenizer, Model, PUBLIC_PREFIX};
use crate::manifest;
use crate::nn::Embeddings;
use crate::sim::public_embedding;
use crate::tokenize::TextTokenizer;
use crate::variants::EmbeddingMode;

use crate::manifest::{BundleDigest, TABLES_FILE};

/// A loaded client bundle.
pub struct ClientBundle {
    /// The model's shape and operators, as the server's must match.
    pub config: ModelConfig,
    /// The tokenizer the client encodes prompts with.
    pub tokenizer: TextTokenizer,
    /// The public tables (public-embedding mode only).
    tables: Option<Embeddings>,
    /// What a server serving the same model announces ([`crate::manifest`]).
    pub digest: BundleDigest,
}

/// Writes the client bundle of `model` into `dir` (created if missing), with the manifest of
/// its files' SHA-256 ([`crate::manifest::MANIFEST_FILE`]).
pub fn save_bundle(model: &Model, dir: &Path) -> Result<()> {
    manifest::write_bundle(dir, &manifest::bundle_files(model)?)
}

impl ClientBundle {
    /// Reads a bundle written by [`save_bundle`].
    pub fn load(dir: &Path) -> Result<Self> {
        manifest::refuse_model_folder(dir)?;
        let config = load_config(dir)?;
        let tokenizer = load_tokenizer(dir, &config)?;
        let path = dir.join(TABLES_FILE);
        let tables = match config.veil.embedding {
            EmbeddingMode::Private => None,
            EmbeddingMode::Public => {
                let tensors = candle_core::safetensors::load(&path, &Device::Cpu)
                    .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))?;
                if let Some(name) = tensors.keys().find(|n| !n.starts_with(PUBLIC_PREFIX)) {
                    bail!(
                        Malformed,
                        "{}: carries {name:?}, which is not a public table",
                        path.display()
                    );
                }
                let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
                Some(
                    Embeddings::new(&config, vb.pp("embeddings"))
                        .map_err(candle_error(&format!("{}", path.display())))?,
                )
            }
        };
        // Every file re-hashed against the manifest written at export.
        let digest = manifest::verify(dir, config.veil.embedding)?;
        Ok(ClientBundle {
            config,
            tokenizer,
            tables,
            digest,
        })
    }

    /// A bundle, or the bundle part of a full model folder (a client that has the whole folder,
    /// e.g. in tests, uses only this part).
    pub fn open(dir: &Path) -> Result<Self> {
        if has_weights(dir) {
            Self::from_model(&crate::folder::load(dir)?)
        } else {
            Self::load(dir)
        }
    }

    /// The bundle part of a full model (what a client holding the whole folder uses).
    pub fn from_model(model: &Model) -> Result<Self> {
        let tokenizer = model
            .tokenizer
            .clone()
            .ok_or_else(|| Error::InvalidArgument("the model folder has no tokenizer".into()))?;
        let tables = (model.config.veil.embedding == EmbeddingMode::Public)
            .then(|| model.transformer.embeddings.clone());
        Ok(ClientBundle {
            config: model.config.clone(),
            tokenizer,
            tables,
            digest: manifest::model_digest(model)?,
        })
    }

    /// The encoder input of one sequence in public-embedding mode, at `fp`
    /// ([`public_embedding`]); an error in private-embedding mode, where the tables are the
    /// server's.
    pub fn embed(&self, ids: &[u32], type_ids: &[u32], fp: FixedPoint) -> Result<RingTensor> {
        let Some(tables) = &self.tables else {
            bail!(
                InvalidArgument,
                "private-embedding model: the client holds no tables, the lookup is private"
            )
        };
        public_embedding(&self.config, tables, ids, type_ids, fp)
    }
}
