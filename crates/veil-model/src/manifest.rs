//! A client bundle's integrity: the SHA-256 of every file a client uses (config, tokenizer,
//! public tables), recorded at export in [`MANIFEST_FILE`] (the format of `sha256sum`, so
//! `sha256sum -c bundle.sha256` checks it too) and re-hashed at every load. The bundle's
//! [`BundleDigest`] is the SHA-256 of that manifest: a server computes it from its own model,
//! without writing anything, and announces it, so a client refuses a stale or altered bundle
//! before any key material moves.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use candle_core::Tensor;
use sha2::{Digest, Sha256};
use veil_core::{bail, Error, Result};

use crate::folder::{Model, PUBLIC_PREFIX};
use crate::variants::EmbeddingMode;

/// The manifest inside a bundle.
pub const MANIFEST_FILE: &str = "bundle.sha256";
/// File of the public tables inside a bundle.
pub const TABLES_FILE: &str = "public.safetensors";
pub(crate) const CONFIG_FILE: &str = "config.json";
pub(crate) const TOKENIZER_FILE: &str = "tokenizer.json";

/// The SHA-256 of a bundle's manifest: names everything the client uses.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BundleDigest(pub [u8; 32]);

impl fmt::Display for BundleDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for BundleDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BundleDigest({self})")
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(h: &[u8; 32]) -> String {
    BundleDigest(*h).to_string()
}

/// The files of `model`'s bundle with their bytes, in manifest order: exactly what
/// [`crate::client::save_bundle`] writes.
pub(crate) fn bundle_files(model: &Model) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let tokenizer = model
        .tokenizer
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the model has no tokenizer to bundle".into()))?;
    let mut files = vec![
        (CONFIG_FILE, model.config.to_json().into_bytes()),
        (TOKENIZER_FILE, tokenizer.to_json()?.into_bytes()),
    ];
    if model.config.veil.embedding == EmbeddingMode::Public {
        let tables: HashMap<String, Tensor> = model
            .transformer
            .named
            .iter()
            .filter(|(name, _)| name.starts_with(PUBLIC_PREFIX))
            .map(|(name, t)| (name.clone(), t.clone()))
            .collect();
        let bytes = safetensors::serialize(&tables, None)
            .map_err(|e| Error::Other(format!("serialising the public tables: {e}")))?;
        files.push((TABLES_FILE, bytes));
    }
    Ok(files)
}

/// Writes `files` into `dir` (created if missing) and their manifest beside them.
pub(crate) fn write_bundle(dir: &Path, files: &[(&'static str, Vec<u8>)]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes)?;
    }
    std::fs::write(dir.join(MANIFEST_FILE), manifest(files))?;
    Ok(())
}

/// Refuses to read `dir` as a client bundle when it holds model weights.
pub(crate) fn refuse_model_folder(dir: &Path) -> Result<()> {
    if crate::folder::has_weights(dir) {
        bail!(
            InvalidArgument,
            "{} holds model weights: it is a model folder, not a client bundle",
            dir.display()
        );
    }
    Ok(())
}

/// The manifest of `files`: one `sha256sum` line each.
pub(crate) fn manifest(files: &[(&'static str, Vec<u8>)]) -> String {
    files
        .iter()
        .map(|(name, bytes)| format!("{}  {name}\n", hex(&sha256(bytes))))
        .collect()
}

/// The digest a client holding `model`'s bundle has: what a server serving `model` announces.
pub fn model_digest(model: &Model) -> Result<BundleDigest> {
    Ok(BundleDigest(sha256(
        manifest(&bundle_files(model)?).as_bytes(),
    )))
}

/// Re-hashes the bundle in `dir` against its manifest: every file a client of this embedding
/// mode uses must be listed, present and unchanged. Returns the bundle's digest.
pub fn verify(dir: &Path, mode: EmbeddingMode) -> Result<BundleDigest> {
    let mut expected = vec![CONFIG_FILE, TOKENIZER_FILE];
    if mode == EmbeddingMode::Public {
        expected.push(TABLES_FILE);
    }
    Ok(verify_listed(dir, &expected, &[])?.0)
}

/// Re-hashes the files `dir`'s manifest lists: each of `required` must be listed, nothing
/// outside `required` and `optional` may be, and every listed file must be present and
/// unchanged. Returns the manifest's digest and which of `optional` it lists.
pub(crate) fn verify_listed<'a>(
    dir: &Path,
    required: &[&'a str],
    optional: &[&'a str],
) -> Result<(BundleDigest, Vec<&'a str>)> {
    let path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            NotFound,
            "{}: the bundle has no digest of its files; export it again with `veil \
             export-client`",
            path.display()
        ),
        Err(e) => bail!(Other, "{}: {e}", path.display()),
    };
    let mut listed = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let Some((digest, name)) = line.split_once("  ") else {
            bail!(
                Malformed,
                "{} line {}: not `SHA-256  file`",
                path.display(),
                n + 1
            )
        };
        listed.insert(name.to_string(), digest.to_string());
    }
    let known = |k: &str| required.contains(&k) || optional.contains(&k);
    if let Some(extra) = listed.keys().find(|k| !known(k)) {
        bail!(
            Malformed,
            "{} lists {extra:?}, which is not a file of this bundle",
            path.display()
        );
    }
    if let Some(name) = required.iter().find(|n| !listed.contains_key(**n)) {
        bail!(Malformed, "{} does not list {name}", path.display())
    }
    let present: Vec<&str> = optional
        .iter()
        .copied()
        .filter(|n| listed.contains_key(*n))
        .collect();
    for name in required.iter().chain(&present) {
        let recorded = &listed[*name];
        let file = dir.join(name);
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                NotFound,
                "{}: a file of the bundle is missing; export it again with `veil export-client`",
                file.display()
            ),
            Err(e) => bail!(Other, "{}: {e}", file.display()),
        };
        let now = hex(&sha256(&bytes));
        if &now != recorded {
            bail!(
                Malformed,
                "{} changed since the bundle was exported (SHA-256 {now}, recorded {recorded}): \
                 export it again with `veil export-client`",
                file.display()
            );
        }
    }
    Ok((BundleDigest(sha256(text.as_bytes())), present))
}
