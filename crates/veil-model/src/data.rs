//! Labelled sentence files: SST-2 in the `LABEL SENTENCE` format of `stsa.binary.{train,dev}`.
//!
//! The SST-2 copy lives outside the repository, in `shared/data/sst2/` beside the repo root
//! (not committed; absent on a user's clone), so callers get `None` from [`sst2_dir`] and skip.

use std::path::{Path, PathBuf};
use veil_core::{bail, Result};

/// One labelled sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub label: u32,
    pub text: String,
}

/// `<repo root>/../shared/data/sst2` if it exists (or `$VEIL_SST2_DIR`).
pub fn sst2_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("VEIL_SST2_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/sst2"),
    };
    dir.join("stsa.binary.dev").is_file().then_some(dir)
}

/// Reads `LABEL SENTENCE` lines; blank lines are skipped, anything else malformed is an error
/// naming the line.
pub fn read_labelled(path: &Path) -> Result<Vec<Example>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| veil_core::Error::Malformed(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (label, sentence) = line.split_once(' ').unwrap_or((line, ""));
        let Ok(label) = label.parse::<u32>() else {
            bail!(
                Malformed,
                "{}:{}: label {label:?} is not a number",
                path.display(),
                n + 1
            )
        };
        if sentence.trim().is_empty() {
            bail!(Malformed, "{}:{}: empty sentence", path.display(), n + 1);
        }
        out.push(Example {
            label,
            text: sentence.trim().to_string(),
        });
    }
    Ok(out)
}
