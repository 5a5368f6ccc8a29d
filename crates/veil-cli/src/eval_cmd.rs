//! `veil eval`: accuracy of the f32 model, the fixed-point simulator and, for `--private N`
//! examples, the real two-party protocol, with how often they agree and how far the private
//! logits are from the simulator's. A long private evaluation (every SST-2 dev sentence takes
//! tens of minutes on two cores) keeps a journal (`--journal FILE`): each private result is
//! appended and flushed as it finishes, and a re-run of the same command resumes after the last.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, FixedPoint, Result};
use veil_model::source::ModelSource;
use veil_model::Encoded;
use veil_model::FixedModel;
use veil_private::client::argmax;
use veil_private::{ClientModel, InProcess, PromptOptions};
use veil_train::workflow::labelled_examples_for;

use crate::compare::{f32_output, max_abs_difference};
use crate::train_cmd::FormatArgs;

#[derive(Args)]
pub struct EvalArgs {
    /// A classifier: `default`, a built-in model's name (`sst2-minilm-l6`, `mrpc-minilm-l6`), a model folder, an overlay folder or a model id in the local
    /// Hugging Face cache (as `veil serve --model`).
    #[arg(long, default_value = "default")]
    model: String,
    /// A labelled file (same formats as finetune).
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    format: FormatArgs,
    /// Evaluate only the first N examples.
    #[arg(long)]
    limit: Option<usize>,
    /// Also run the first N examples through the real two-party protocol (TCP loopback).
    #[arg(long, default_value_t = 0)]
    private: usize,
    /// Append each private result to this file as it finishes; a re-run of the same command
    /// with the same file runs only the examples not in it.
    #[arg(long)]
    journal: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

/// Counts of one evaluated path, with the confusion counts of class 1 for F1 (MRPC's metric,
/// the paper's for paraphrase: class 1 = "equivalent").
#[derive(Default)]
struct Tally {
    examples: usize,
    correct: usize,
    true_positive: usize,
    false_positive: usize,
    false_negative: usize,
}

impl Tally {
    fn add(&mut self, predicted: usize, label: u32) {
        let (p, l) = (predicted == 1, label == 1);
        self.examples += 1;
        self.correct += (predicted == label as usize) as usize;
        self.true_positive += (p && l) as usize;
        self.false_positive += (p && !l) as usize;
        self.false_negative += (!p && l) as usize;
    }

    /// F1 of class 1: 2·TP / (2·TP + FP + FN).
    fn f1(&self) -> f64 {
        let tp2 = 2 * self.true_positive;
        tp2 as f64 / (tp2 + self.false_positive + self.false_negative).max(1) as f64
    }

    fn json(&self, binary: bool) -> serde_json::Value {
        let mut v = serde_json::json!({
            "examples": self.examples,
            "correct": self.correct,
            "accuracy": self.correct as f64 / self.examples.max(1) as f64,
        });
        if binary {
            v["f1"] = self.f1().into();
        }
        v
    }
}

/// One example's private run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct PrivateResult {
    index: usize,
    logits: Vec<f64>,
    online_seconds: f64,
    online_bytes: u64,
    /// The whole inference as the client saw it (embedding, online phase, decoding).
    wall_seconds: f64,
}

/// What a journal was written for: a different model, data file or example count is refused.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct JournalHeader {
    veil_eval_journal: u32,
    model: String,
    data: PathBuf,
    examples: usize,
}

/// The private results so far, in a JSON-lines file: the header, then one result per line.
struct Journal {
    file: File,
    done: HashMap<usize, PrivateResult>,
}

impl Journal {
    /// Opens (or creates) the journal at `path` for `header`. A line cut short by a crash is
    /// dropped (the file is rewritten without it).
    fn open(path: &Path, header: &JournalHeader) -> Result<Journal> {
        let bad = |what: String| Error::Malformed(format!("journal {}: {what}", path.display()));
        let mut done = HashMap::new();
        if path.exists() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
            let mut lines = text.lines();
            let first: JournalHeader = lines
                .next()
                .and_then(|l| serde_json::from_str(l).ok())
                .ok_or_else(|| bad("no header line".into()))?;
            ensure!(
                first == *header,
                InvalidArgument,
                "the journal {} was written for another evaluation ({:?}); remove it or name \
                 another",
                path.display(),
                first
            );
            for line in lines {
                let Ok(r) = serde_json::from_str::<PrivateResult>(line) else {
                    break;
                };
                ensure!(
                    r.index < header.examples,
                    Malformed,
                    "journal {}: example {} of {}",
                    path.display(),
                    r.index,
                    header.examples
                );
                done.insert(r.index, r);
            }
        }
        let mut body = serde_json::to_string(header).map_err(|e| bad(e.to_string()))? + "\n";
        let mut kept: Vec<_> = done.values().collect();
        kept.sort_by_key(|r| r.index);
        for r in kept {
            body += &(serde_json::to_string(r).map_err(|e| bad(e.to_string()))? + "\n");
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, body).map_err(|e| Error::Other(format!("{}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        Ok(Journal { file, done })
    }

    fn record(&mut self, r: &PrivateResult) -> Result<()> {
        let line = serde_json::to_string(r).map_err(|e| Error::Other(e.to_string()))? + "\n";
        self.file.write_all(line.as_bytes())?;
        self.file.sync_data()?;
        self.done.insert(r.index, r.clone());
        Ok(())
    }
}

/// The largest |private − simulator| logit difference per example, in ulps of the fixed-point
/// format (2^−f): how many examples fall in each bucket.
fn gap_histogram(gaps_ulp: &[f64]) -> serde_json::Value {
    let limits = [0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0];
    let mut out = serde_json::Map::new();
    let mut below = 0;
    for limit in limits {
        let n = gaps_ulp.iter().filter(|&&g| g <= limit).count();
        let name = if limit == 0.0 {
            "0".to_string()
        } else {
            format!("<={limit}")
        };
        out.insert(name, (n - below).into());
        below = n;
    }
    out.insert(">1024".into(), (gaps_ulp.len() - below).into());
    serde_json::Value::Object(out)
}

/// The median, 90th and 99th percentiles of the gaps (nearest rank), in ulps.
fn gap_quantiles(gaps_ulp: &[f64]) -> serde_json::Value {
    let mut g = gaps_ulp.to_vec();
    g.sort_by(f64::total_cmp);
    let at = |q: f64| match g.len() {
        0 => 0.0,
        n => g[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
    };
    serde_json::json!({"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)})
}

/// `veil eval`.
pub fn eval(a: EvalArgs) -> Result<()> {
    let started = Instant::now();
    let source = ModelSource::resolve(&a.model)?;
    let model = source.load()?;
    let (labels, mut examples) = labelled_examples_for(
        &model.config,
        &source.tokenizer_folder()?,
        source.record_folder(),
        &a.data,
        a.format.format()?,
        a.format.max_seq_len,
    )?;
    ensure!(
        model.config.veil.num_labels == labels.names.len(),
        InvalidArgument,
        "the model has {} outputs but the data has {} classes",
        model.config.veil.num_labels,
        labels.names.len()
    );
    if let Some(n) = a.limit {
        examples.truncate(n);
    }
    ensure!(
        !examples.is_empty(),
        InvalidArgument,
        "no examples to evaluate"
    );
    let fp = FixedPoint::default_format();
    let fixed = FixedModel::encode(&model.transformer, fp)?;
    let private_n = a.private.min(examples.len());
    let mut journal = match &a.journal {
        Some(path) => {
            let header = JournalHeader {
                veil_eval_journal: 1,
                model: a.model.clone(),
                data: a.data.clone(),
                examples: private_n,
            };
            Some(Journal::open(path, &header)?)
        }
        None => None,
    };
    let resumed = journal.as_ref().map_or(0, |j| j.done.len());
    // Private runs only when some remain.
    let mut private = (private_n > resumed)
        .then(|| {
            let client = ClientModel::from_model(&model)?;
            InProcess::start(&model, client, PromptOptions::default())
        })
        .transpose()?;
    let (mut f32_tally, mut sim_tally, mut private_tally) =
        (Tally::default(), Tally::default(), Tally::default());
    let (mut agree_f32_sim, mut agree_sim_private) = (0usize, 0usize);
    let (mut private_seconds, mut private_wall, mut private_bytes) = (0f64, 0f64, 0u64);
    let mut gaps_ulp = Vec::with_capacity(private_n);
    // The examples where the private argmax is not the simulator's, with the three paths'
    // logits: the simulator's margin says whether truncation error alone can explain it.
    let mut disagreements = Vec::new();
    let mut sim_warnings = 0usize;
    let ulp = 1.0 / fp.scale();
    let pb = veil_model::progress::bar(examples.len() as u64, "evaluating");
    for (i, ex) in examples.iter().enumerate() {
        pb.inc(1);
        let f = f32_output(&model, &ex.ids, &ex.type_ids)?;
        let sim = fixed.forward(&ex.ids, &ex.type_ids)?;
        sim_warnings += sim.warnings.len();
        let s = sim
            .logits_f64(fp)
            .ok_or_else(|| Error::InvalidArgument("the model has no classifier".into()))?;
        f32_tally.add(argmax(&f), ex.label);
        sim_tally.add(argmax(&s), ex.label);
        agree_f32_sim += (argmax(&f) == argmax(&s)) as usize;
        if i >= private_n {
            continue;
        }
        let known = journal.as_ref().and_then(|j| j.done.get(&i).cloned());
        let r = match (known, private.as_mut()) {
            (Some(r), _) => r,
            (None, Some(p)) => {
                let enc = Encoded {
                    ids: ex.ids.clone(),
                    type_ids: ex.type_ids.clone(),
                    truncated: 0,
                };
                let t0 = Instant::now();
                let (logits, report) = p.infer(&enc)?;
                let t = report.online.total();
                let r = PrivateResult {
                    index: i,
                    logits,
                    online_seconds: t.seconds,
                    online_bytes: t.bytes_sent + t.bytes_received,
                    wall_seconds: t0.elapsed().as_secs_f64(),
                };
                if let Some(j) = journal.as_mut() {
                    j.record(&r)?;
                }
                r
            }
            (None, None) => {
                return Err(Error::Other(format!(
                    "example {i} is neither in the journal nor run: no session was opened"
                )))
            }
        };
        private_tally.add(argmax(&r.logits), ex.label);
        if argmax(&r.logits) == argmax(&s) {
            agree_sim_private += 1;
        } else {
            disagreements.push(serde_json::json!({
                "index": i, "label": ex.label, "tokens": ex.ids.len(),
                "f32_logits": f, "fixed_logits": s, "private_logits": r.logits,
            }));
        }
        gaps_ulp.push(max_abs_difference(&r.logits, &s) / ulp);
        private_seconds += r.online_seconds;
        private_wall += r.wall_seconds;
        private_bytes += r.online_bytes;
    }
    pb.finish_and_clear();
    let sessions = private.as_ref().map_or(0, InProcess::sessions);
    if let Some(p) = private {
        p.stop()?;
    }
    let n = examples.len();
    let binary = labels.names.len() == 2;
    let max_gap = gaps_ulp.iter().fold(0f64, |m, &g| m.max(g)) * ulp;
    let histogram = gap_histogram(&gaps_ulp);
    let doc = serde_json::json!({
        "model": a.model, "data": a.data, "labels": labels.names,
        "f32": f32_tally.json(binary),
        "fixed_point": sim_tally.json(binary),
        "fixed_point_warnings": sim_warnings,
        "agreement_f32_fixed": agree_f32_sim as f64 / n as f64,
        "private": (private_n > 0).then(|| serde_json::json!({
            "tally": private_tally.json(binary),
            "agreement_with_fixed": agree_sim_private as f64 / private_n as f64,
            "argmax_equal_to_fixed": agree_sim_private,
            "argmax_differs_from_fixed": disagreements,
            "max_abs_logit_difference_vs_fixed": max_gap,
            "logit_difference_ulp_histogram": histogram,
            "logit_difference_ulp_quantiles": gap_quantiles(&gaps_ulp),
            "mean_online_seconds": private_seconds / private_n as f64,
            "mean_online_bytes": private_bytes as f64 / private_n as f64,
            "total_private_wall_seconds": private_wall,
            "resumed_from_journal": resumed,
            "sessions": sessions,
        })),
        "wall_seconds": started.elapsed().as_secs_f64(),
    });
    if a.json {
        println!("{doc}");
        return Ok(());
    }
    let pct = |t: &Tally| {
        let acc = 100.0 * t.correct as f64 / t.examples.max(1) as f64;
        match binary {
            true => format!("{acc:6.2} % (F1 {:.2} %)", 100.0 * t.f1()),
            false => format!("{acc:6.2} %"),
        }
    };
    println!("{} examples of {}", n, a.data.display());
    println!(
        "  f32            {} ({}/{})",
        pct(&f32_tally),
        f32_tally.correct,
        n
    );
    println!(
        "  fixed point    {} ({}/{}), argmax agrees with f32 on {:.2} %, {} simulator warnings",
        pct(&sim_tally),
        sim_tally.correct,
        n,
        100.0 * agree_f32_sim as f64 / n as f64,
        sim_warnings
    );
    if private_n > 0 {
        println!(
            "  private (2PC)  {} ({}/{}), argmax equals fixed point on {}/{}, max |Δlogit| {:.2e} ({} in ulps); {:.1} s and {:.1} MB online per example, {:.0} s in all{}",
            pct(&private_tally),
            private_tally.correct,
            private_n,
            agree_sim_private,
            private_n,
            max_gap,
            histogram,
            private_seconds / private_n as f64,
            private_bytes as f64 / private_n as f64 / 1e6,
            private_wall,
            if resumed > 0 {
                format!(" ({resumed} resumed from the journal)")
            } else {
                String::new()
            }
        );
        for d in &disagreements {
            println!(
                "    example {} (0-based): private logits {}, fixed point {}, f32 {}",
                d["index"], d["private_logits"], d["fixed_logits"], d["f32_logits"]
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(examples: usize) -> JournalHeader {
        JournalHeader {
            veil_eval_journal: 1,
            model: "m".into(),
            data: "d.tsv".into(),
            examples,
        }
    }

    fn result(index: usize) -> PrivateResult {
        PrivateResult {
            index,
            logits: vec![0.5, -1.25],
            online_seconds: 0.1,
            online_bytes: 10,
            wall_seconds: 0.2,
        }
    }

    /// Results survive a re-open, a line cut short by a crash is dropped (and the file stays
    /// appendable), and a journal of another evaluation is refused.
    #[test]
    fn journal_resumes_and_refuses_another_evaluation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.jsonl");
        let mut j = Journal::open(&path, &header(5)).unwrap();
        j.record(&result(0)).unwrap();
        j.record(&result(1)).unwrap();
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"index\":2,\"logi").unwrap();
        drop(f);
        let mut j = Journal::open(&path, &header(5)).unwrap();
        assert_eq!(j.done.len(), 2);
        assert_eq!(j.done[&1], result(1));
        j.record(&result(2)).unwrap();
        drop(j);
        let j = Journal::open(&path, &header(5)).unwrap();
        assert_eq!(j.done.len(), 3);
        let err = Journal::open(&path, &header(6)).err().unwrap().to_string();
        assert!(err.contains("another evaluation"), "{err}");
        std::fs::write(&path, "not json\n").unwrap();
        assert!(Journal::open(&path, &header(5)).is_err());
    }

    /// Re-opening rewrites the journal; every number must come back as it was written (a
    /// timing of 17 significant digits is where a fast, inexact float parser differs).
    #[test]
    fn a_reopened_journal_keeps_its_records_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.jsonl");
        let mut j = Journal::open(&path, &header(5)).unwrap();
        j.record(&PrivateResult {
            online_seconds: 12.955465373999997,
            ..result(0)
        })
        .unwrap();
        drop(j);
        let before = std::fs::read(&path).unwrap();
        drop(Journal::open(&path, &header(5)).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn f1_of_class_one() {
        let mut t = Tally::default();
        for (p, l) in [(1, 1), (1, 1), (1, 0), (0, 1), (0, 0)] {
            t.add(p, l);
        }
        // TP 2, FP 1, FN 1: F1 = 4 / 6.
        assert!((t.f1() - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(t.json(false).get("f1"), None);
        assert_eq!(t.json(true)["correct"], 3);
    }

    #[test]
    fn gaps_fall_in_their_buckets() {
        let gaps = [0.0, 0.0, 1.0, 3.0, 20.0, 2000.0];
        let h = gap_histogram(&gaps);
        assert_eq!(h["0"], 2);
        assert_eq!(h["<=1"], 1);
        assert_eq!(h["<=4"], 1);
        assert_eq!(h["<=16"], 0);
        assert_eq!(h["<=64"], 1);
        assert_eq!(h[">1024"], 1);
        let q = gap_quantiles(&gaps);
        assert_eq!(
            (q["p50"].as_f64(), q["p99"].as_f64()),
            (Some(1.0), Some(2000.0))
        );
    }
}
