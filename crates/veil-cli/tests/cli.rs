//! The `veil` binary end to end on a tiny model: fine-tune from the command line, evaluate the
//! result in f32, in the fixed-point simulator and through the real two-party protocol (whose
//! logits must stay within the one-bit-error truncation's bound of the simulator's), and refuse
//! bad arguments with a clear message.

use std::path::Path;
use std::process::Command;

use veil_model::{folder, random, Architecture, ModelConfig};

const WORDS: [&str; 11] = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "great", "bad", "awful", "the", "film",
];

/// A one-block random BERT with `labels` classifier outputs (0: none) and the WORDS vocabulary.
fn tiny_folder(dir: &Path, labels: usize, seed: u8) {
    let cfg = ModelConfig::builder(Architecture::Bert)
        .vocab(WORDS.len())
        .layers(1)
        .labels(labels)
        .build()
        .unwrap();
    let model = random::random_transformer_with_std(&cfg, [seed; 16], 0.1).unwrap();
    folder::save(dir, &model, None).unwrap();
    std::fs::write(dir.join("vocab.txt"), WORDS.join("\n")).unwrap();
}

fn data_file(path: &Path) {
    let lines: Vec<String> = (0..40)
        .map(|i| {
            let (label, cue) = if i % 2 == 0 {
                (1, ["good", "great"][i % 4 / 2])
            } else {
                (0, ["bad", "awful"][i % 4 / 2])
            };
            format!("{label} the film {cue}")
        })
        .collect();
    std::fs::write(path, lines.join("\n")).unwrap();
}

fn veil(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(args)
        .output()
        .expect("the veil binary runs")
}

/// Runs `veil args`, which must succeed, and returns its standard output.
fn veil_ok(args: &[&str]) -> Vec<u8> {
    let out = veil(args);
    assert!(
        out.status.success(),
        "veil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Output of `--json` with one object per line.
fn json_lines(out: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn finetune_then_eval_agrees_across_f32_fixed_point_and_2pc() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, tuned, data) = (
        tmp.path().join("base"),
        tmp.path().join("tuned"),
        tmp.path().join("data.txt"),
    );
    tiny_folder(&base, 0, 3);
    data_file(&data);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let out = veil_ok(&[
        "finetune",
        "--model",
        &s(&base),
        "--train",
        &s(&data),
        "--dev",
        &s(&data),
        "--out",
        &s(&tuned),
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--lr",
        "3e-3",
        "--alpha1",
        "0",
        "--quiet",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["updates"], 15);

    let out = veil_ok(&[
        "eval",
        "--model",
        &s(&tuned),
        "--data",
        &s(&data),
        "--private",
        "2",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(r["f32"]["examples"], 40);
    assert_eq!(r["private"]["tally"]["examples"], 2);
    assert_eq!(r["private"]["agreement_with_fixed"], 1.0);
    // The default truncation after products may read one ulp low per product output.
    let dev = r["private"]["max_abs_logit_difference_vs_fixed"]
        .as_f64()
        .unwrap();
    assert!(dev <= 0.02, "2PC logits {dev} away from the simulator's");
    assert!(r["agreement_f32_fixed"].as_f64().unwrap() >= 0.9, "{r}");

    // Sentence pairs (GLUE MRPC's layout, byte-order mark included): segment ids and [SEP] go
    // through the private protocol as through the simulator; F1 is reported beside accuracy.
    let pairs = tmp.path().join("pairs.tsv");
    let mut tsv = String::from("\u{feff}Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n");
    for (i, (a, b)) in [
        ("the film good", "good film"),
        ("the film bad", "great film"),
    ]
    .iter()
    .cycle()
    .take(4)
    .enumerate()
    {
        tsv += &format!("{}\t{i}\t{}\t{a}\t{b}\n", 1 - i % 2, i + 10);
    }
    std::fs::write(&pairs, tsv).unwrap();
    // The single-sentence classifier refuses them; one fine-tuned on them records it.
    let refused = veil(&["eval", "--model", &s(&tuned), "--data", &s(&pairs)]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("classifies single texts"), "{why}");
    let paired = tmp.path().join("paired");
    veil_ok(&[
        "finetune",
        "--model",
        &s(&base),
        "--train",
        &s(&pairs),
        "--dev",
        &s(&pairs),
        "--out",
        &s(&paired),
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--quiet",
    ]);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(paired.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["veil"]["inputs"], "pairs");
    let out = veil_ok(&[
        "eval",
        "--model",
        &s(&paired),
        "--data",
        &s(&pairs),
        "--private",
        "4",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(r["private"]["argmax_equal_to_fixed"], 4, "{r}");
    assert_eq!(
        r["private"]["argmax_differs_from_fixed"],
        serde_json::json!([])
    );
    let gap = &r["private"]["max_abs_logit_difference_vs_fixed"];
    assert!(gap.as_f64().unwrap() <= 0.02, "{r}");
    assert!(r["private"]["tally"]["f1"].is_number(), "{r}");

    // With a journal: a run of 2 private examples, then the same command for 3 resumes is
    // refused (another evaluation), and the same command again runs nothing privately and
    // reports the journal's results.
    let journal = tmp.path().join("private.jsonl");
    let eval = |n: &str| {
        veil(&[
            "eval",
            "--model",
            &s(&tuned),
            "--data",
            &s(&data),
            "--private",
            n,
            "--journal",
            &s(&journal),
            "--json",
        ])
    };
    let first = eval("2");
    assert!(first.status.success());
    let first: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["private"]["resumed_from_journal"], 0);
    assert_eq!(
        std::fs::read_to_string(&journal).unwrap().lines().count(),
        3
    );
    let other = eval("3");
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("another evaluation"));
    let again: serde_json::Value = serde_json::from_slice(&eval("2").stdout).unwrap();
    assert_eq!(again["private"]["resumed_from_journal"], 2);
    for key in [
        "tally",
        "max_abs_logit_difference_vs_fixed",
        "logit_difference_ulp_histogram",
    ] {
        assert_eq!(again["private"][key], first["private"][key], "{key}");
    }

    // A journal whose first result answers the other class is reported as a disagreement,
    // by index, with the three paths' logits.
    let text = std::fs::read_to_string(&journal).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let logits = &mut lines[1]["logits"];
    let swapped = serde_json::json!([logits[1].clone(), logits[0].clone()]);
    assert_ne!(*logits, swapped, "tied logits cannot be told apart");
    *logits = swapped.clone();
    let edited: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&journal, edited).unwrap();
    let swapped_run: serde_json::Value = serde_json::from_slice(&eval("2").stdout).unwrap();
    assert_eq!(swapped_run["private"]["argmax_equal_to_fixed"], 1);
    let differs = &swapped_run["private"]["argmax_differs_from_fixed"];
    assert_eq!(differs.as_array().map(Vec::len), Some(1), "{differs}");
    assert_eq!(differs[0]["index"], 0);
    assert_eq!(differs[0]["private_logits"], swapped);
    assert!(differs[0]["fixed_logits"].is_array() && differs[0]["f32_logits"].is_array());
}

/// `veil eval` prints the same report, byte for byte, on one worker thread as on four: its f32
/// and fixed-point passes run on the worker pool and come back in example order. The model
/// (seed 7) tells the data's sentences apart (30 of 40 right, where most seeds answer one class
/// throughout), so results taken out of order would change its tallies.
#[test]
fn eval_prints_the_same_report_whatever_the_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, data) = (tmp.path().join("model"), tmp.path().join("data.txt"));
    veil_model::random::write_tiny_classifier(&model, 1, 2, 7).unwrap();
    data_file(&data);
    let run = |threads: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_veil"))
            .args(["eval", "--model", model.to_str().unwrap()])
            .args(["--data", data.to_str().unwrap()])
            .env("VEIL_THREADS", threads)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let one = run("1");
    assert!(one.contains("(30/40)"), "{one}");
    assert_eq!(run("4"), one);
}

/// `veil embed` on an encoder without a classifier: its pooled vectors in f32, fixed point and
/// the real protocol agree (cosine near 1, private within the one-bit truncation's reach of the
/// simulator), sentences come from a file and the command line, and a run without sentences is
/// refused.
#[test]
fn embed_compares_pooled_vectors_across_f32_fixed_point_and_2pc() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, data) = (tmp.path().join("enc"), tmp.path().join("s.txt"));
    tiny_folder(&model, 0, 5);
    std::fs::write(&data, "the film good\n\nthe film awful\n").unwrap();
    let m = model.to_str().unwrap();
    let out = veil_ok(&[
        "embed",
        "--model",
        m,
        "--data",
        data.to_str().unwrap(),
        "--private",
        "2",
        "--json",
        "great film",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["sentences"], 3);
    assert_eq!(v["private"]["sentences"], 2);
    assert_eq!(v["fixed_point"]["warnings"].as_array().unwrap().len(), 0);
    let fixed = v["fixed_point"]["min_cosine_to_f32"].as_f64().unwrap();
    let private = v["private"]["min_cosine_to_f32"].as_f64().unwrap();
    assert!(fixed > 0.999 && private > 0.999, "{v}");
    let gap = v["private"]["max_difference_to_fixed"].as_f64().unwrap();
    assert!(gap < 64.0 / 8192.0, "private vs fixed {gap}");
    let per = v["per_sentence"].as_array().unwrap();
    assert!(per[0]["cosine_private_f32"].is_number() && per[2]["cosine_private_f32"].is_null());
    let out = veil(&["embed", "--model", m]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no sentences"));
}

#[test]
fn bad_arguments_get_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let m = missing.to_str().unwrap();
    let out = veil(&["eval", "--model", m, "--data", m]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("veil:") && err.contains("nope"), "{err}");
    // A missing model is "not found", with its path, on both sides.
    let state = tmp.path().join("state");
    let out = veil(&[
        "serve",
        "--model",
        m,
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not found") && err.contains("nope"), "{err}");
    let out = veil(&["classify", "--model", m, "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not found") && err.contains("nope/config.json"),
        "{err}"
    );
    // --pad-to beyond the model's limit is refused before connecting (nothing listens here).
    let model = tmp.path().join("model");
    tiny_folder(&model, 2, 3);
    let out = veil(&[
        "classify",
        "--connect",
        "127.0.0.1:9",
        "--model",
        model.to_str().unwrap(),
        "--pad-to",
        "1000",
        "x",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pad-to 1000"), "{err}");
    let out = veil(&[
        "finetune", "--model", m, "--train", m, "--dev", m, "--out", m, "--format", "csv",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--text-column"));
}

/// A server process that is killed when the test ends, however it ends.
struct ServerProcess(std::process::Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn client_bundle_classifies_against_a_served_model_without_its_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, bundle) = (tmp.path().join("model"), tmp.path().join("client"));
    tiny_folder(&full, 2, 5);
    let s = |p: &Path| p.to_str().unwrap().to_string();

    veil_ok(&["export-client", "--model", &s(&full), "--out", &s(&bundle)]);
    assert!(bundle.join("public.safetensors").is_file() && bundle.join("config.json").is_file());
    assert!(!bundle.join("model.safetensors").exists());

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let state = tmp.path().join("state");
    let known = tmp.path().join("known_servers");
    let _server = ServerProcess(
        Command::new(env!("CARGO_BIN_EXE_veil"))
            .args([
                "serve",
                "--model",
                &s(&full),
                "--listen",
                &addr,
                "--state-dir",
                &s(&state),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let probs = |client: &Path| -> Vec<f64> {
        let out = veil_ok(&[
            "classify",
            "--connect",
            &addr,
            "--model",
            &s(client),
            "--known-servers",
            &s(&known),
            "--json",
            "the film good",
        ]);
        let r: serde_json::Value = serde_json::from_slice(&out).unwrap();
        r["probabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .collect()
    };
    let (from_bundle, from_folder) = (probs(&bundle), probs(&full));
    // --preprocess 2 over three prompts: two preprocessed before the first runs, the third
    // while the first is printed; each classified as without preprocessing.
    let out = veil_ok(&[
        "classify",
        "--connect",
        &addr,
        "--model",
        &s(&bundle),
        "--known-servers",
        &s(&known),
        "--preprocess",
        "2",
        "--json",
        "the film good",
        "film",
        "the film good",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    for (i, r) in lines.iter().enumerate() {
        assert!(
            r["cost"]["offline"]["time_s"].is_number(),
            "prompt {i}: {r}"
        );
        if i != 1 {
            for (a, b) in r["probabilities"]
                .as_array()
                .unwrap()
                .iter()
                .zip(&from_bundle)
            {
                assert!((a.as_f64().unwrap() - b).abs() < 0.01, "prompt {i}: {r}");
            }
        }
    }
    // Trust on first use recorded the server's fingerprint, the one in its state directory.
    let recorded = std::fs::read_to_string(&known).unwrap();
    assert!(recorded.starts_with(&format!("{addr} ")), "{recorded}");
    assert!(state.join("key.der").is_file());
    let fp = recorded.split_whitespace().nth(1).unwrap().to_string();
    let pinned = veil_ok(&[
        "classify",
        "--connect",
        &addr,
        "--model",
        &s(&bundle),
        "--server-fingerprint",
        &fp,
        "--json",
        "the film good",
    ]);
    assert!(String::from_utf8_lossy(&pinned).contains("probabilities"));
    // A changed key is refused, naming the file.
    let other = "ab".repeat(32);
    std::fs::write(&known, format!("{addr} {other}\n")).unwrap();
    let out = veil(&[
        "classify",
        "--connect",
        &addr,
        "--model",
        &s(&bundle),
        "--known-servers",
        &s(&known),
        "the film good",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&fp) && err.contains(&other) && err.contains(&s(&known)),
        "{err}"
    );
    // Plain TCP against a TLS server fails cleanly, without hanging.
    let out = veil(&[
        "classify",
        "--connect",
        &addr,
        "--model",
        &s(&bundle),
        "--insecure-plaintext",
        "--timeout",
        "20",
        "the film good",
    ]);
    assert!(!out.status.success());
    assert_eq!(from_bundle.len(), 2);
    for (a, b) in from_bundle.iter().zip(&from_folder) {
        assert!(
            (a - b).abs() < 0.01,
            "bundle {from_bundle:?} vs folder {from_folder:?}"
        );
    }
}

/// An empty prompt and one longer than the model's limit are refused before anything is sent
/// (with the token count); `--truncate` classifies the long one's first tokens.
#[test]
fn empty_and_over_long_prompts_are_refused_unless_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_folder(tmp.path(), 2, 41);
    let dir = tmp.path().to_str().unwrap();
    let out = veil(&["demo", "--model", dir, "  "]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
    let long = ["the film good"; 10].join(" ");
    let out = veil(&["demo", "--model", dir, &long]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("32 tokens, 16 more than the model's limit of 16")
            && err.contains("--truncate"),
        "{err}"
    );
    let ok = veil_ok(&["demo", "--model", dir, "--truncate", "--json", &long]);
    assert!(String::from_utf8_lossy(&ok).contains("\"label\""));
}

/// `--pairs`: the texts two at a time, each pair one prompt (reported with both sentences); an
/// odd count is refused before the server is prepared, and so are single texts for a model
/// trained on pairs.
#[test]
fn demo_classifies_sentence_pairs() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_folder(tmp.path(), 2, 47);
    let dir = tmp.path().to_str().unwrap();
    let out = veil_ok(&[
        "demo",
        "--model",
        dir,
        "--pairs",
        "--json",
        "good film",
        "bad film",
        "the film",
        "great",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["text"], "good film");
    assert_eq!(lines[0]["pair"], "bad film");
    assert_eq!(lines[1]["pair"], "great");
    let out = veil(&["demo", "--model", dir, "--pairs", "good film"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("two at a time"), "{err}");

    // A folder whose config records pairs refuses single texts, and its default prompts are
    // the paraphrase pairs.
    let config_path = tmp.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["veil"]["inputs"] = "pairs".into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let out = veil(&["demo", "--model", dir, "good film"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pass --pairs"), "{err}");
    let lines = json_lines(&veil_ok(&["demo", "--model", dir, "--truncate", "--json"]));
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l["pair"].is_string()),
        "{lines:?}"
    );
}

/// A built-in model's prompt kind is known without its public tables: prompts of the other kind
/// are refused before anything is fetched (here the cache is a file, so any fetch would fail).
#[test]
fn built_in_models_refuse_the_wrong_prompt_kind_before_fetching() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("not-a-folder");
    std::fs::write(&cache, "").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_veil"))
            .args(args)
            .env("VEIL_CACHE", &cache)
            .output()
            .unwrap();
        assert!(!out.status.success(), "veil {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["demo", "--model", "mrpc-minilm-l6", "one sentence"]);
    assert!(err.contains("pass --pairs"), "{err}");
    let err = run(&["demo", "--model", "sst2-minilm-l6", "--pairs", "a", "b"]);
    assert!(err.contains("leave out --pairs"), "{err}");
    let err = run(&[
        "classify",
        "--connect=127.0.0.1:9",
        "--model=mrpc-minilm-l6",
        "--insecure-plaintext",
        "one sentence",
    ]);
    assert!(err.contains("pass --pairs"), "{err}");
}

/// `veil demo` shows results only: its in-process server's info lines are hidden unless
/// `--verbose` brings them back.
#[test]
fn demo_hides_the_servers_info_logs_unless_verbose() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_folder(tmp.path(), 2, 44);
    let dir = tmp.path().to_str().unwrap();
    let stderr = |verbose: bool| {
        let mut args = vec!["demo", "--model", dir, "--json", "the film good"];
        if verbose {
            args.insert(0, "--verbose");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_veil"))
            .args(&args)
            .env_remove("VEIL_LOG")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"label\""));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let quiet = stderr(false);
    assert!(!quiet.contains("INFO"), "{quiet}");
    let verbose = stderr(true);
    assert!(
        verbose.contains("INFO") && verbose.contains("inference"),
        "{verbose}"
    );
}

/// `--net` runs the demo over a shaped link and the report says its time was measured there;
/// a malformed `--net` is refused with the syntax.
#[test]
fn demo_over_a_shaped_link_reports_measured_time() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_folder(tmp.path(), 2, 43);
    let dir = tmp.path().to_str().unwrap();
    let out = veil_ok(&[
        "demo",
        "--model",
        dir,
        "--net",
        "1G,2ms",
        "--json",
        "the film good",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let cost = &v["cost"];
    assert_eq!(cost["measured"], serde_json::json!(true), "{cost}");
    assert_eq!(cost["network"]["bits_per_second"], serde_json::json!(1e9));
    // The output share leaves the server after the request arrived: at least one RTT.
    let time = cost["time_s"].as_f64().unwrap();
    assert!(time >= 2e-3, "{time} s");
    assert!(cost.get("modelled_wan_s").is_none());

    let out = veil(&["demo", "--model", dir, "--net", "100M", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("RATE,RTT"));

    // The same over TLS on loopback; TLS and a shaped link do not combine.
    let ok = veil_ok(&["demo", "--model", dir, "--tls", "--json", "the film good"]);
    assert!(String::from_utf8_lossy(&ok).contains("\"label\""));
    let out = veil(&["demo", "--model", dir, "--tls", "--net", "lan", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("choose one"));
}

/// `--insecure-plaintext` on both sides still classifies; SIGTERM stops the server cleanly
/// (no longer accepting, open sessions given their grace), with its structured log.
#[test]
fn plaintext_when_asked_and_graceful_shutdown_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("model");
    tiny_folder(&full, 2, 7);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = ServerProcess(
        Command::new(env!("CARGO_BIN_EXE_veil"))
            .args([
                "serve",
                "--model",
                &s(&full),
                "--listen",
                &addr,
                "--insecure-plaintext",
                "--max-sessions",
                "2",
            ])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(std::time::Instant::now() < deadline, "never listened");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = veil_ok(&[
        "classify",
        "--connect",
        &addr,
        "--model",
        &s(&full),
        "--insecure-plaintext",
        "--json",
        "the film good",
    ]);
    assert!(String::from_utf8_lossy(&out).contains("probabilities"));
    let pid = server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(st) = server.0.try_wait().unwrap() {
            break st;
        }
        assert!(std::time::Instant::now() < until, "no exit after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    std::io::Read::read_to_string(&mut server.0.stderr.take().unwrap(), &mut log).unwrap();
    for want in [
        "max_sessions=2",
        "session ended",
        "inferences=1",
        "shutting down",
        "stopped",
    ] {
        assert!(log.contains(want), "no {want:?} in the log:\n{log}");
    }
}

/// With a file-descriptor limit the server runs out of descriptors: accept errors are backed off
/// (a handful of log lines, not a loop), and once the idle connections time out the server
/// serves again.
#[test]
fn accept_errors_are_backed_off_and_the_server_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("model");
    tiny_folder(&full, 2, 9);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = tmp.path().join("log");
    let script = format!(
        "ulimit -n 24 && exec '{}' serve --model '{}' --listen {addr} --insecure-plaintext \
         --max-sessions 16 --handshake-timeout 2 2>'{}'",
        env!("CARGO_BIN_EXE_veil"),
        s(&full),
        s(&log)
    );
    let _server = ServerProcess(Command::new("sh").args(["-c", &script]).spawn().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut idle = Vec::new();
    loop {
        match std::net::TcpStream::connect(&addr) {
            Ok(c) => {
                idle.push(c);
                break;
            }
            Err(_) => {
                assert!(std::time::Instant::now() < deadline, "never listened");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    }
    // More silent connections than the server has descriptors for.
    for _ in 0..30 {
        if let Ok(c) = std::net::TcpStream::connect(&addr) {
            idle.push(c);
        }
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    drop(idle);
    // The handshake deadline freed the descriptors: a client is served.
    let out = veil_ok(&[
        "classify",
        "--connect",
        &addr,
        "--model",
        &s(&full),
        "--insecure-plaintext",
        "--json",
        "the film good",
    ]);
    assert!(String::from_utf8_lossy(&out).contains("probabilities"));
    let text = std::fs::read_to_string(&log).unwrap();
    // The server capped its limits to the 24 descriptors and said so; accept errors, if any,
    // were backed off, not looped.
    assert!(
        text.contains("capped") && text.contains("ulimit -n"),
        "{text}"
    );
    let failed = text.matches("accept failed").count();
    eprintln!("{failed} accept errors logged");
    assert!(failed < 40, "{failed} accept errors logged: a loop\n{text}");
    assert!(text.contains("timed out"), "{text}");
}

#[test]
fn substitute_stops_resumes_and_takes_its_levers() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, tuned, sub, data) = (
        tmp.path().join("base"),
        tmp.path().join("tuned"),
        tmp.path().join("sub"),
        tmp.path().join("data.txt"),
    );
    tiny_folder(&base, 0, 3);
    data_file(&data);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    veil_ok(&[
        "finetune",
        "--model",
        &s(&base),
        "--train",
        &s(&data),
        "--dev",
        &s(&data),
        "--out",
        &s(&tuned),
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--lr",
        "3e-3",
        "--quiet",
    ]);
    let substitute = |extra: &[&str]| {
        let mut args = vec![
            "substitute",
            "--model",
            &s(&tuned),
            "--train",
            &s(&data),
            "--dev",
            &s(&data),
            "--out",
            &s(&sub),
            "--batch-size",
            "8",
            "--max-steps",
            "2",
            "--simulate",
            "0",
            "--retries",
            "1",
            "--retry-factor",
            "1.5",
            "--distill",
            "0.5",
            "--block-order",
            "up",
            "--stage-lr",
            "softmax=1e-3",
            "--stage-lr",
            "LN2=2e-3",
            "--quiet",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        veil(&args)
    };
    let out = substitute(&["--stop-after-steps", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("stopped after 2 of 4 steps"), "{said}");

    let out = substitute(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["resumed_steps"], 2, "{r}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sub.join("substitution.json")).unwrap()).unwrap();
    let steps = report["substitution"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    for step in steps {
        let attempts = step["attempts"].as_array().unwrap();
        assert_eq!(attempts[0]["updates"], 2);
        if attempts.len() == 2 {
            assert_eq!(attempts[1]["updates"], 3);
        }
    }

    // Other options do not continue this run; bad levers are refused before any work.
    let out = substitute(&["--max-drop", "3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("differing: substitution"), "{err}");
    for (args, says) in [
        (&["--stage-lr", "layernorm=1e-3"][..], "unknown operator"),
        (&["--stage-lr", "gelu"][..], "OP=LR"),
        (&["--stage-lr", "gelu=fast"][..], "learning rate"),
        (
            &["--stage-lr", "gelu=1e-3", "--stage-lr", "GELU=2e-3"][..],
            "twice",
        ),
    ] {
        let out = substitute(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `veil generate` on a tiny random Llama folder: the simulator's greedy tokens printed with
/// `--json` are the library's (`veil_model::generate` on the same `FixedDecoder`), and a run
/// without a mode is refused with the reason.
#[test]
fn generate_prints_the_simulators_greedy_tokens() {
    use veil_model::decoder::{self, random::TinyShape, sample::SamplingParams};
    use veil_model::{generate, GenerateOptions};
    use veil_model::{DecoderFormat, FixedDecoder};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama");
    decoder::random::write_tiny_llama(&dir, 7, &TinyShape::default()).unwrap();
    let dir_s = dir.to_str().unwrap();

    let out = veil_ok(&[
        "generate",
        "--model",
        dir_s,
        "--simulate",
        "--json",
        "--max-new-tokens",
        "6",
        "good film",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let printed: Vec<u32> = report["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();

    let model = decoder::load(dir_s).unwrap();
    let ids = model.tokenizer.encode("good film").unwrap();
    assert_eq!(
        report["prompt_tokens"].as_u64().unwrap() as usize,
        ids.len()
    );
    let fixed = FixedDecoder::encode(&model.weights, DecoderFormat::default()).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 6,
        sampling: SamplingParams::GREEDY,
        stop: model.weights.config.eos_token_ids.clone(),
        fixed_length: false,
        pad_to: None,
    };
    let (expected, _) = generate(&mut fixed.session(), &ids, &opts, |_| Ok(())).unwrap();
    let expected: Vec<u32> = expected.iter().map(|t| t.id).collect();
    assert!(!expected.is_empty());
    assert_eq!(printed, expected);

    let refused = veil(&["generate", "--model", dir_s, "good film"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("say where the model runs: --connect ADDR"),
        "{err}"
    );
    // Hiding where the answer ends is for a server's eyes, and preprocessing needs an online
    // phase to shorten: both need a server.
    for flag in ["--fixed-length", "--preprocess"] {
        let refused = veil(&[
            "generate",
            "--model",
            dir_s,
            "--simulate",
            flag,
            "good film",
        ]);
        assert!(!refused.status.success(), "{flag}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("--connect"), "{flag}: {err}");
    }
}

/// `veil serve` checks its flags and its listening address before it prepares (or fetches) any
/// weights: a busy port and `--max-sessions 0` are refused at once, naming the cause.
#[test]
fn serve_finds_a_busy_port_and_bad_flags_before_preparing_weights() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let start = std::time::Instant::now();
    // The default model is not fetched: the port is checked first.
    let out = veil(&["serve", "--listen", &addr, "--insecure-plaintext"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    let out = veil(&["serve", "--listen", "127.0.0.1:0", "--max-sessions", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("max sessions 0"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
}
