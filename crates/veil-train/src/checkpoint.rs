//! Checkpoints that let an interrupted fine-tuning run resume exactly where it stopped.
//!
//! A checkpoint folder holds `params-<step>.safetensors` (the trainable parameters),
//! `optimizer-<step>.safetensors` (AdamW moments) and `state.json`. `state.json` is written last
//! and atomically (write + rename), so it always names a complete pair of tensor files: a crash
//! while saving leaves the previous checkpoint valid.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};

use crate::optim::AdamW;
use veil_model::candle_error;

/// Progress of a run, and what it was started with (a resume with different settings or data
/// would silently train something else, so it is refused).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainState {
    /// Updates completed.
    pub(crate) step: u64,
    /// Updates the whole run makes.
    pub(crate) total_steps: u64,
    /// The run's settings, serialised, compared on resume.
    pub(crate) config: serde_json::Value,
    /// Fingerprint of the training examples.
    pub(crate) data_fingerprint: u64,
}

const STATE_FILE: &str = "state.json";

fn params_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("params-{step}.safetensors"))
}

fn optimizer_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("optimizer-{step}.safetensors"))
}

pub(crate) fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("{what} {}: {e}", path.display()))
}

/// Saves parameters, optimiser state and progress into `dir`, replacing an older checkpoint.
pub(crate) fn save(
    dir: &Path,
    params: &[(String, Var)],
    opt: &AdamW,
    state: &TrainState,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create", dir, e))?;
    let previous = load_state(dir)?.map(|s| s.step);
    let tensors: HashMap<String, Tensor> = params
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&tensors, params_file(dir, state.step))
        .map_err(candle_error("checkpoint"))?;
    candle_core::safetensors::save(&opt.state_tensors(), optimizer_file(dir, state.step))
        .map_err(candle_error("checkpoint"))?;
    write_json_atomically(&dir.join(STATE_FILE), state)?;
    if let Some(old) = previous.filter(|&s| s != state.step) {
        // Best effort: a leftover old file is harmless, state.json no longer points at it.
        let _ = std::fs::remove_file(params_file(dir, old));
        let _ = std::fs::remove_file(optimizer_file(dir, old));
    }
    Ok(())
}

/// Writes `value` as JSON to `path` through a temporary file and a rename, so a reader sees the
/// old or the new content, never a torn one.
pub(crate) fn write_json_atomically(path: &Path, value: &impl Serialize) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let json = serde_json::to_vec_pretty(value).map_err(|e| Error::Other(e.to_string()))?;
    std::fs::write(&tmp, json).map_err(|e| io_err("cannot write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("cannot commit", path, e))
}

/// Reads `state.json` if the folder has a checkpoint.
pub(crate) fn load_state(dir: &Path) -> Result<Option<TrainState>> {
    let path = dir.join(STATE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path).map_err(|e| io_err("cannot read", &path, e))?;
    let state = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Malformed(format!("{}: {e}", path.display())))?;
    Ok(Some(state))
}

/// Restores the parameters and optimiser state saved at `state.step`.
pub(crate) fn restore(
    dir: &Path,
    state: &TrainState,
    params: &[(String, Var)],
    opt: &mut AdamW,
) -> Result<()> {
    let load = |p: PathBuf| {
        candle_core::safetensors::load(&p, &Device::Cpu)
            .map_err(|e| Error::Malformed(format!("{}: {e}", p.display())))
    };
    let saved = load(params_file(dir, state.step))?;
    for (name, var) in params {
        let t = saved
            .get(name)
            .ok_or_else(|| Error::Malformed(format!("checkpoint has no parameter {name:?}")))?;
        ensure!(
            t.dims() == var.dims(),
            Malformed,
            "checkpoint parameter {name:?} has shape {:?}, model has {:?}",
            t.dims(),
            var.dims()
        );
        var.set(
            &t.to_dtype(var.dtype())
                .map_err(candle_error("checkpoint"))?,
        )
        .map_err(candle_error("checkpoint"))?;
    }
    ensure!(
        saved.len() == params.len(),
        Malformed,
        "checkpoint has {} parameters, the run trains {}",
        saved.len(),
        params.len()
    );
    opt.load_state(&load(optimizer_file(dir, state.step))?, state.step)
}
