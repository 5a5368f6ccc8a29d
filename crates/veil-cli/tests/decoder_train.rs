//! `veil substitute-decoder` and `veil eval-decoder` end to end on a tiny seeded Llama: a run
//! stopped after one step resumes to the end, the result scores on a question set, and bad
//! arguments are refused with a clear message.

use std::path::Path;
use std::process::Command;

use veil_model::decoder::random::{write_tiny_llama, TinyShape};

fn veil(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(args)
        .output()
        .expect("the veil binary runs")
}

fn veil_ok(args: &[&str]) -> String {
    let out = veil(args);
    assert!(
        out.status.success(),
        "veil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn veil_err(args: &[&str]) -> String {
    let out = veil(args);
    assert!(!out.status.success(), "veil {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const TEXT: [&str; 6] = [
    "1 the film is a charming and often affecting journey",
    "0 a dull and lifeless story with nothing to say",
    "1 an engaging comedy about friendship and family",
    "0 one of the worst films of the year",
    "1 a bold and moving portrait of a small town",
    "0 the music is lovely but the script is thin",
];

#[test]
fn substitute_decoder_resumes_and_eval_decoder_scores() {
    let tmp = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let model = tmp.path().join("m");
    let shape = TinyShape {
        max_positions: 160,
        ..TinyShape::default()
    };
    write_tiny_llama(&model, 11, &shape).unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, TEXT.join("\n")).unwrap();
    let questions = tmp.path().join("q.txt");
    std::fs::write(&questions, "# two\nWhat is 2 plus 3?\n\nName a colour.\n").unwrap();
    let out = tmp.path().join("out");
    let (m, t, o) = (s(&model), s(&text), s(&out));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "substitute-decoder",
            "--model",
            &m,
            "--out",
            &o,
            "--train",
            &t,
            "--held-out",
            &t,
            "--text",
            "mix",
            "--seq-len",
            "24",
            "--updates",
            "2",
            "--batch-size",
            "2",
            "--held-out-sequences",
            "3",
            "--threshold",
            "0",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        veil_ok(&args)
    };
    let first = run(&["--max-steps", "1"]);
    assert!(first.contains("stopped after 1 of 4 steps"), "{first}");
    let done: serde_json::Value = serde_json::from_str(run(&[]).trim()).unwrap();
    assert_eq!(done["resumed_steps"], 1);
    assert!(done["final_agreement"].as_f64().unwrap() >= 0.0);
    assert!(out.join("steps.md").is_file() && out.join("stage.json").is_file());

    let q = s(&questions);
    let qdir = s(&tmp.path().join("qs"));
    let scored: serde_json::Value = serde_json::from_str(
        veil_ok(&[
            "eval-decoder",
            "--model",
            &o,
            "--questions",
            &q,
            "--max-new-tokens",
            "3",
            "--out",
            &qdir,
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(scored["questions"], 2);
    assert!(tmp.path().join("qs/questions.md").is_file());
    // A stage of the progress folder scores too.
    let state = std::fs::read_dir(out.join("progress"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("state-")
        })
        .expect("a state folder");
    veil_ok(&[
        "eval-decoder",
        "--model",
        &s(&state),
        "--questions",
        &q,
        "--max-new-tokens",
        "2",
    ]);

    let err = veil_err(&["eval-decoder", "--model", &m, "--questions", &q]);
    assert!(err.contains("--original"), "{err}");
    let err = veil_err(&[
        "substitute-decoder",
        "--model",
        &m,
        "--out",
        &s(&tmp.path().join("bad")),
        "--train",
        &t,
        "--held-out",
        &t,
        "--operators",
        "gelu",
    ]);
    assert!(err.contains("encoder operator"), "{err}");
}
