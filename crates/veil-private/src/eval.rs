//! Evaluation of private runs against labels, as `veil eval` reports it and any other client
//! (Python) can: the counts and metrics of one evaluated path ([`Tally`]: accuracy, F1 of
//! class 1), how far private logits are from the simulator's ([`gap_histogram`],
//! [`gap_quantiles`]), and the resumable [`Journal`] of private results. A private evaluation
//! of a whole dev set takes hours on two cores; the journal lets a re-run of the same command
//! continue after the last result written.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use veil_core::{ensure, Error, Result};

/// Counts of one evaluated path, with the confusion counts of class 1 for F1 (MRPC's metric,
/// the paper's for paraphrase: class 1 = "equivalent").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Examples counted.
    pub examples: usize,
    /// Examples whose prediction is their label.
    pub correct: usize,
    /// Predicted 1, labelled 1.
    pub true_positive: usize,
    /// Predicted 1, labelled otherwise.
    pub false_positive: usize,
    /// Labelled 1, predicted otherwise.
    pub false_negative: usize,
}

impl Tally {
    /// Counts one example: the predicted class and the label.
    pub fn add(&mut self, predicted: usize, label: u32) {
        let (p, l) = (predicted == 1, label == 1);
        self.examples += 1;
        self.correct += (predicted == label as usize) as usize;
        self.true_positive += (p && l) as usize;
        self.false_positive += (p && !l) as usize;
        self.false_negative += (!p && l) as usize;
    }

    /// The share of examples predicted right (0 with none).
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.examples.max(1) as f64
    }

    /// F1 of class 1: 2·TP / (2·TP + FP + FN) (0 when there is no positive at all).
    pub fn f1(&self) -> f64 {
        let tp2 = 2 * self.true_positive;
        tp2 as f64 / (tp2 + self.false_positive + self.false_negative).max(1) as f64
    }

    /// Examples, correct ones and accuracy, with F1 for a `binary` task.
    pub fn json(&self, binary: bool) -> serde_json::Value {
        let mut v = serde_json::json!({
            "examples": self.examples,
            "correct": self.correct,
            "accuracy": self.accuracy(),
        });
        if binary {
            v["f1"] = self.f1().into();
        }
        v
    }
}

/// The largest |private − simulator| logit difference per example, in ulps of the fixed-point
/// format (2^−f): how many examples fall in each bucket (0, ≤ 1, ≤ 4, … ≤ 1024, > 1024).
pub fn gap_histogram(gaps_ulp: &[f64]) -> serde_json::Value {
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
pub fn gap_quantiles(gaps_ulp: &[f64]) -> serde_json::Value {
    let mut g = gaps_ulp.to_vec();
    g.sort_by(f64::total_cmp);
    let at = |q: f64| match g.len() {
        0 => 0.0,
        n => g[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
    };
    serde_json::json!({"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)})
}

/// One example's private run, as the journal records it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PrivateResult {
    /// The example's index in the evaluated data.
    pub index: usize,
    /// The logits the client reconstructed.
    pub logits: Vec<f64>,
    /// The online phase's time.
    pub online_seconds: f64,
    /// The online phase's bytes, both directions.
    pub online_bytes: u64,
    /// The whole inference as the client saw it (embedding, online phase, decoding).
    pub wall_seconds: f64,
}

/// What a journal was written for: a different model, data file or example count is refused.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JournalHeader {
    veil_eval_journal: u32,
    model: String,
    data: PathBuf,
    examples: usize,
}

impl JournalHeader {
    /// The evaluation of the first `examples` of `data` on `model` (as the command named them).
    pub fn new(model: impl Into<String>, data: impl Into<PathBuf>, examples: usize) -> Self {
        JournalHeader {
            veil_eval_journal: 1,
            model: model.into(),
            data: data.into(),
            examples,
        }
    }
}

/// The private results so far, in a JSON-lines file: the header, then one result per line,
/// each appended and flushed as it finishes.
pub struct Journal {
    file: File,
    done: HashMap<usize, PrivateResult>,
}

impl Journal {
    /// Opens (or creates) the journal at `path` for `header`. A journal written for another
    /// evaluation is refused; reading stops at the first line that does not parse (one cut
    /// short by a crash), and the file is rewritten without it and what follows. The lines
    /// kept are written back as they were read, so every number survives byte for byte.
    pub fn open(path: &Path, header: &JournalHeader) -> Result<Journal> {
        let bad = |what: String| Error::Malformed(format!("journal {}: {what}", path.display()));
        let io = |p: &Path, e: std::io::Error| Error::Other(format!("{}: {e}", p.display()));
        let mut done = HashMap::new();
        let mut body = serde_json::to_string(header).map_err(|e| bad(e.to_string()))? + "\n";
        if path.exists() {
            let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
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
                if done.insert(r.index, r).is_none() {
                    body += line;
                    body += "\n";
                }
            }
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, body).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        Ok(Journal { file, done })
    }

    /// Appends `r` and flushes it to the disk before returning.
    pub fn record(&mut self, r: &PrivateResult) -> Result<()> {
        let line = serde_json::to_string(r).map_err(|e| Error::Other(e.to_string()))? + "\n";
        self.file.write_all(line.as_bytes())?;
        self.file.sync_data()?;
        self.done.insert(r.index, r.clone());
        Ok(())
    }

    /// The recorded result of example `index`, if any.
    pub fn get(&self, index: usize) -> Option<&PrivateResult> {
        self.done.get(&index)
    }

    /// How many examples are recorded.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Whether nothing is recorded yet.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(examples: usize) -> JournalHeader {
        JournalHeader::new("m", "d.tsv", examples)
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

    fn append(path: &Path, bytes: &[u8]) {
        let mut f = OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(bytes).unwrap();
    }

    /// A re-run resumes after the last line written; a line cut short by a crash is dropped
    /// (and the file stays appendable); a journal of another evaluation, or without a header,
    /// is refused, as is a result beyond the evaluated examples.
    #[test]
    fn journal_resumes_after_the_last_line_and_refuses_another_evaluation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.jsonl");
        let mut j = Journal::open(&path, &header(5)).unwrap();
        assert!(j.is_empty());
        j.record(&result(0)).unwrap();
        j.record(&result(1)).unwrap();
        drop(j);
        append(&path, b"{\"index\":2,\"logi");
        let mut j = Journal::open(&path, &header(5)).unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(j.get(1), Some(&result(1)));
        assert_eq!(j.get(2), None);
        j.record(&result(2)).unwrap();
        drop(j);
        let j = Journal::open(&path, &header(5)).unwrap();
        assert_eq!(j.len(), 3);
        assert_eq!(j.get(2), Some(&result(2)));
        drop(j);
        let lines = std::fs::read_to_string(&path).unwrap();
        assert_eq!(lines.lines().count(), 4, "{lines}");

        let err = Journal::open(&path, &header(6)).err().unwrap().to_string();
        assert!(err.contains("another evaluation"), "{err}");
        let other = JournalHeader::new("another model", "d.tsv", 5);
        assert!(Journal::open(&path, &other).is_err());
        append(&path, b"{\"index\":7,\"logits\":[],\"online_seconds\":0,\"online_bytes\":0,\"wall_seconds\":0}\n");
        let err = Journal::open(&path, &header(5)).err().unwrap().to_string();
        assert!(err.contains("example 7 of 5"), "{err}");
        std::fs::write(&path, "not json\n").unwrap();
        let err = Journal::open(&path, &header(5)).err().unwrap().to_string();
        assert!(err.contains("no header line"), "{err}");
    }

    /// Re-opening rewrites the journal; every number must come back as it was written (a
    /// timing of 17 significant digits is where a fast, inexact float parser differs).
    #[test]
    fn a_reopened_journal_keeps_its_records_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.jsonl");
        let mut j = Journal::open(&path, &header(5)).unwrap();
        let precise = PrivateResult {
            online_seconds: 12.955465373999997,
            ..result(0)
        };
        j.record(&precise).unwrap();
        drop(j);
        let before = std::fs::read(&path).unwrap();
        let j = Journal::open(&path, &header(5)).unwrap();
        assert_eq!(j.get(0), Some(&precise));
        drop(j);
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    /// Hand-counted: predictions (1,1), (1,1), (1,0), (0,1), (0,0), (2,2) as (predicted,
    /// label) give 4 correct of 6, TP 2, FP 1, FN 1, so F1 = 4 / 6.
    #[test]
    fn accuracy_and_f1_of_class_one() {
        let mut t = Tally::default();
        for (p, l) in [(1, 1), (1, 1), (1, 0), (0, 1), (0, 0), (2, 2)] {
            t.add(p, l);
        }
        assert_eq!(
            t,
            Tally {
                examples: 6,
                correct: 4,
                true_positive: 2,
                false_positive: 1,
                false_negative: 1,
            }
        );
        assert!((t.accuracy() - 4.0 / 6.0).abs() < 1e-12);
        assert!((t.f1() - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(t.json(false).get("f1"), None);
        assert_eq!(t.json(true)["correct"], 4);
        assert_eq!(t.json(true)["f1"], t.f1());
        // Nothing counted, or no positive anywhere: 0, not NaN.
        assert_eq!(Tally::default().accuracy(), 0.0);
        let mut negatives = Tally::default();
        negatives.add(0, 0);
        assert_eq!((negatives.accuracy(), negatives.f1()), (1.0, 0.0));
    }

    #[test]
    fn gaps_fall_in_their_buckets_and_quantiles_take_the_nearest_rank() {
        let gaps = [0.0, 0.0, 1.0, 3.0, 20.0, 2000.0];
        let h = gap_histogram(&gaps);
        assert_eq!(h["0"], 2);
        assert_eq!(h["<=1"], 1);
        assert_eq!(h["<=4"], 1);
        assert_eq!(h["<=16"], 0);
        assert_eq!(h["<=64"], 1);
        assert_eq!(h["<=1024"], 0);
        assert_eq!(h[">1024"], 1);
        // Ranks ceil(0.5·6) = 3, ceil(0.9·6) = 6, ceil(0.99·6) = 6 of the sorted gaps.
        let q = gap_quantiles(&gaps);
        assert_eq!(
            (q["p50"].as_f64(), q["p90"].as_f64(), q["p99"].as_f64()),
            (Some(1.0), Some(2000.0), Some(2000.0))
        );
        assert_eq!(gap_quantiles(&[])["p50"], 0.0);
    }
}
