//! Labelled text datasets for sequence classification: the one reader behind `veil finetune`,
//! `veil substitute`, `veil eval` and the tests.
//!
//! Three file formats, chosen by [`DatasetFormat`] (or from the file extension with
//! [`DatasetFormat::from_path`]):
//! * `LABEL SENTENCE` per line — the SST-2 sentence files (`stsa.binary.{train,dev}`);
//! * GLUE TSV with a header row, single sentences or sentence pairs (SST-2, MRPC, QNLI, RTE, QQP
//!   column conventions are recognised; others via explicit [`Columns`]);
//! * CSV with a header row and named columns.
//!
//! A leading UTF-8 byte-order mark is ignored in every format (GLUE's MRPC dev file has one).
//! Labels are strings in the file. A [`LabelSet`] built from the training file turns them into
//! class ids, and the dev file is read against the *same* set, so class `k` means the same
//! thing in both. Every parse error names the file and the line it comes from.
//!
//! The project's copies of SST-2 and MRPC are not committed (their licences forbid copies):
//! [`shared_dataset`] finds them beside the repository, and says they are absent on a user's clone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use veil_core::{bail, ensure, Error, Result};

/// The directory of dataset `name` (`sst2`, `mrpc`) under `$VEIL_SHARED_DATA`, else under
/// `shared/data` beside the repository root; an `Io` error of kind `NotFound` when it is absent.
pub fn shared_dataset(name: &str) -> Result<PathBuf> {
    let root = match std::env::var_os("VEIL_SHARED_DATA") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"),
    };
    let dir = root.join(name);
    if !dir.is_dir() {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{}: no such directory (the project's data copies are not part of the \
                 repository; $VEIL_SHARED_DATA may point to them)",
                dir.display()
            ),
        )));
    }
    Ok(dir)
}

/// One example as read from a file; its label stays the file's string until a [`LabelSet`]
/// gives it a class id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// 1-based line of the file the example starts on (for error messages).
    pub line: u64,
    /// The sentence (the first of a pair).
    pub text_a: String,
    /// Second sentence of a pair task (MRPC, QNLI), `None` for single-sentence tasks.
    pub text_b: Option<String>,
    /// The label as the file spells it.
    pub label: String,
}

/// Which columns of a delimited file hold the text(s) and the label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Columns {
    /// The column of the sentence (the first of a pair).
    pub text_a: String,
    /// The column of the second sentence, for pair tasks.
    pub text_b: Option<String>,
    /// The column of the label.
    pub label: String,
}

impl Columns {
    /// A single-sentence task's columns.
    pub fn single(text: &str, label: &str) -> Self {
        Columns {
            text_a: text.into(),
            text_b: None,
            label: label.into(),
        }
    }

    /// A sentence-pair task's columns.
    pub fn pair(text_a: &str, text_b: &str, label: &str) -> Self {
        Columns {
            text_a: text_a.into(),
            text_b: Some(text_b.into()),
            label: label.into(),
        }
    }

    /// The GLUE column conventions, most specific first (a QNLI header also has `sentence`).
    fn glue_conventions() -> [Columns; 5] {
        [
            Columns::pair("#1 String", "#2 String", "Quality"), // MRPC
            Columns::pair("question1", "question2", "is_duplicate"), // QQP
            Columns::pair("question", "sentence", "label"),     // QNLI
            Columns::pair("sentence1", "sentence2", "label"),   // RTE, WNLI
            Columns::single("sentence", "label"),               // SST-2
        ]
    }
}

/// The layout of a dataset file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetFormat {
    /// `LABEL SENTENCE` per line, label and sentence separated by the first run of whitespace.
    LabelSentenceLines,
    /// Tab-separated, no quoting (GLUE files contain bare `"` inside sentences). `None` columns
    /// means: recognise a GLUE convention from the header.
    GlueTsv(Option<Columns>),
    /// Comma-separated with RFC 4180 quoting and a header row.
    Csv(Columns),
}

impl DatasetFormat {
    /// `.tsv` → GLUE TSV (auto columns), anything else → `LABEL SENTENCE` lines. CSV needs column
    /// names, so it is never guessed.
    pub fn from_path(path: &Path) -> Result<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("tsv") => Ok(DatasetFormat::GlueTsv(None)),
            Some(ext) if ext.eq_ignore_ascii_case("csv") => Err(Error::InvalidArgument(format!(
                "{}: CSV files need explicit column names (text, optional pair, label)",
                path.display()
            ))),
            _ => Ok(DatasetFormat::LabelSentenceLines),
        }
    }
}

/// Reads a whole dataset file; parse errors are prefixed with its path.
pub fn read_file(path: &Path, format: &DatasetFormat) -> Result<Vec<Example>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::InvalidArgument(format!("cannot read {}: {e}", path.display())))?;
    parse(&text, format).map_err(|e| match e {
        Error::Malformed(m) => Error::Malformed(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// Parses dataset text in the given format.
pub fn parse(text: &str, format: &DatasetFormat) -> Result<Vec<Example>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let examples = match format {
        DatasetFormat::LabelSentenceLines => parse_label_sentence_lines(text)?,
        DatasetFormat::GlueTsv(columns) => parse_delimited(text, b'\t', false, columns.as_ref())?,
        DatasetFormat::Csv(columns) => parse_delimited(text, b',', true, Some(columns))?,
    };
    ensure!(!examples.is_empty(), Malformed, "no examples");
    Ok(examples)
}

fn parse_label_sentence_lines(text: &str) -> Result<Vec<Example>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((label, sentence)) = line.split_once(char::is_whitespace) else {
            bail!(
                Malformed,
                "line {line_no}: expected `LABEL SENTENCE`, found only {line:?}"
            );
        };
        let sentence = sentence.trim();
        ensure!(
            !sentence.is_empty(),
            Malformed,
            "line {line_no}: empty sentence"
        );
        out.push(Example {
            line: line_no,
            text_a: sentence.to_string(),
            text_b: None,
            label: label.to_string(),
        });
    }
    Ok(out)
}

fn parse_delimited(
    text: &str,
    delimiter: u8,
    quoting: bool,
    columns: Option<&Columns>,
) -> Result<Vec<Example>> {
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .quoting(quoting)
        .flexible(true)
        .has_headers(true)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| Error::Malformed(format!("line 1: unreadable header: {e}")))?
        .clone();
    let names: Vec<&str> = header.iter().map(str::trim).collect();
    let find = |name: &str| names.iter().position(|h| *h == name);
    let columns = match columns {
        Some(c) => c.clone(),
        None => Columns::glue_conventions()
            .into_iter()
            .find(|c| find(&c.label).is_some() && find(&c.text_a).is_some())
            .ok_or_else(|| {
                Error::Malformed(format!(
                    "line 1: header {names:?} matches no GLUE layout (sentence/label, \
                     question/sentence/label, #1 String/#2 String/Quality, ...); \
                     test files without labels cannot be used for training"
                ))
            })?,
    };
    let index_of = |name: &str| {
        find(name).ok_or_else(|| {
            Error::Malformed(format!(
                "line 1: no column named {name:?} in header {names:?}"
            ))
        })
    };
    let a = index_of(&columns.text_a)?;
    let b = columns.text_b.as_deref().map(index_of).transpose()?;
    let label = index_of(&columns.label)?;

    let mut out = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            Error::Malformed(format!("line {line}: {e}"))
        })?;
        let line_no = record.position().map_or(0, |p| p.line());
        if record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        ensure!(
            record.len() == header.len(),
            Malformed,
            "line {line_no}: {} fields, header has {}",
            record.len(),
            header.len()
        );
        let field = |i: usize, what: &str| -> Result<String> {
            let v = record[i].trim();
            ensure!(
                !v.is_empty(),
                Malformed,
                "line {line_no}: empty {what} field"
            );
            Ok(v.to_string())
        };
        out.push(Example {
            line: line_no,
            text_a: field(a, &columns.text_a)?,
            text_b: b
                .map(|b| field(b, columns.text_b.as_deref().unwrap_or("")))
                .transpose()?,
            label: field(label, &columns.label)?,
        });
    }
    Ok(out)
}

/// The class names, index = class id. Built from the training data and stored with the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSet {
    /// The name of each class, by id.
    pub names: Vec<String>,
}

impl LabelSet {
    /// Integer labels keep their value as the class id (`0`/`1` in SST-2, MRPC); otherwise the
    /// distinct names in sorted order (`entailment` = 0, `not_entailment` = 1, as GLUE does).
    pub fn from_examples(examples: &[Example]) -> Result<Self> {
        let distinct: BTreeSet<&str> = examples.iter().map(|e| e.label.as_str()).collect();
        let numeric: Option<Vec<usize>> = distinct.iter().map(|l| l.parse().ok()).collect();
        let names: Vec<String> = match numeric {
            Some(ids) => {
                let max = ids.iter().copied().max().unwrap_or(0);
                ensure!(
                    max < 1024,
                    Malformed,
                    "integer label {max} is too large for a class id (limit 1023)"
                );
                (0..=max).map(|i| i.to_string()).collect()
            }
            None => distinct.iter().map(|s| s.to_string()).collect(),
        };
        ensure!(
            names.len() >= 2,
            Malformed,
            "a classifier needs at least two classes, found {:?}",
            names
        );
        Ok(LabelSet { names })
    }

    /// The number of classes.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no classes (never, for a set built from examples).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The class id of `example`'s label; a label the set does not know is an error naming
    /// its line.
    pub fn class_of(&self, example: &Example) -> Result<u32> {
        let id = self.names.iter().position(|n| *n == example.label);
        let Some(id) = id else {
            bail!(
                Malformed,
                "line {}: label {:?} is not one of the training labels {:?}",
                example.line,
                example.label,
                self.names
            );
        };
        Ok(id as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<Vec<Example>>) -> String {
        r.expect_err("must be rejected").to_string()
    }

    #[test]
    fn label_sentence_lines() {
        let ex = parse(
            "1 a great film\n\n0  dull ,  slow\n",
            &DatasetFormat::LabelSentenceLines,
        )
        .unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].label, "1");
        assert_eq!(ex[0].text_a, "a great film");
        assert_eq!(ex[1].line, 3);
        assert_eq!(ex[1].text_a, "dull ,  slow");
        assert!(err(parse("1 ok\n0\n", &DatasetFormat::LabelSentenceLines)).contains("line 2"));
        assert!(err(parse("\n\n", &DatasetFormat::LabelSentenceLines)).contains("no examples"));
    }

    #[test]
    fn glue_tsv_single_and_pairs() {
        let sst = "sentence\tlabel\nit 's \"great\"\t1\nbad\t0\n";
        let ex = parse(sst, &DatasetFormat::GlueTsv(None)).unwrap();
        assert_eq!(ex[0].text_a, "it 's \"great\"");
        assert_eq!(ex[0].text_b, None);
        assert_eq!(ex[1].line, 3);

        let mrpc =
            "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe said \"yes\".\tHe agreed.\n";
        let ex = parse(mrpc, &DatasetFormat::GlueTsv(None)).unwrap();
        assert_eq!(ex[0].text_a, "He said \"yes\".");
        assert_eq!(ex[0].text_b.as_deref(), Some("He agreed."));
        assert_eq!(ex[0].label, "1");

        let qnli = "index\tquestion\tsentence\tlabel\n0\tWho?\tHim.\tentailment\n\
                    1\tWhy?\tNo.\tnot_entailment\n";
        let raw = parse(qnli, &DatasetFormat::GlueTsv(None)).unwrap();
        assert_eq!(raw[1].text_a, "Why?");
        assert_eq!(raw[1].text_b.as_deref(), Some("No."));
        let labels = LabelSet::from_examples(&raw).unwrap();
        assert_eq!(labels.names, ["entailment", "not_entailment"]);
        assert_eq!(labels.class_of(&raw[1]).unwrap(), 1);
    }

    #[test]
    fn glue_tsv_malformed() {
        let f = DatasetFormat::GlueTsv(None);
        assert!(err(parse("index\tsentence\n0\tx\n", &f)).contains("no GLUE layout"));
        assert!(err(parse("sentence\tlabel\nok\t1\ntoo\tmany\tfields\n", &f)).contains("line 3"));
        assert!(err(parse("sentence\tlabel\nok\t1\nmissing\t\n", &f)).contains("line 3: empty"));
        let cols = DatasetFormat::GlueTsv(Some(Columns::single("text", "y")));
        assert!(err(parse("sentence\tlabel\nok\t1\n", &cols)).contains("no column named \"text\""));
    }

    #[test]
    fn csv_named_columns() {
        let f = DatasetFormat::Csv(Columns::single("review", "sentiment"));
        let ex = parse(
            "id,review,sentiment\n7,\"good, really \"\"good\"\"\",pos\n8,meh,neg\n",
            &f,
        )
        .unwrap();
        assert_eq!(ex[0].text_a, "good, really \"good\"");
        assert_eq!(ex[0].label, "pos");
        let labels = LabelSet::from_examples(&ex).unwrap();
        assert_eq!(labels.class_of(&ex[0]).unwrap(), 1);

        let pairs = DatasetFormat::Csv(Columns::pair("q", "a", "y"));
        let ex = parse("q,a,y\nwho,me,1\nwhy,no,0\n", &pairs).unwrap();
        assert_eq!(ex[1].text_b.as_deref(), Some("no"));

        assert!(err(parse("id,review\n1,x\n", &f)).contains("sentiment"));
        assert!(err(parse("id,review,sentiment\n1,x,pos\n2,\"open,neg\n", &f)).contains("line"));
        assert!(err(parse("id,review,sentiment\n1,x\n", &f)).contains("line 2: 2 fields"));
    }

    #[test]
    fn byte_order_mark_is_ignored() {
        // The start of GLUE's MRPC dev.tsv: its header begins with U+FEFF.
        let mrpc = "\u{feff}Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n\
                    1\t1355540\t1355592\tHe said the pie business doesn't fit.\t\"The pie\" did not fit.\n";
        let ex = parse(mrpc, &DatasetFormat::GlueTsv(None)).unwrap();
        assert_eq!((ex[0].line, ex[0].label.as_str()), (2, "1"));
        assert_eq!(ex[0].text_b.as_deref(), Some("\"The pie\" did not fit."));

        let lines = parse(
            "\u{feff}1 fine\n0 bad\n",
            &DatasetFormat::LabelSentenceLines,
        )
        .unwrap();
        assert_eq!(lines[0].label, "1");
        let csv = DatasetFormat::Csv(Columns::single("text", "label"));
        assert_eq!(
            parse("\u{feff}text,label\nok,1\n", &csv).unwrap()[0].label,
            "1"
        );
    }

    /// Every format read from a file: a good file parses, and a bad line is reported with the
    /// file's path and its line number.
    #[test]
    fn files_in_every_format_and_their_errors() {
        let dir = tempfile::tempdir().unwrap();
        let csv = DatasetFormat::Csv(Columns::pair("q", "a", "y"));
        let cases = [
            (
                "train.txt",
                DatasetFormat::LabelSentenceLines,
                "1 good\n0 bad\n",
                "1 good\n\n0 bad\nnonsense\n",
                "line 4",
            ),
            (
                "dev.tsv",
                DatasetFormat::GlueTsv(None),
                "sentence\tlabel\ngood\t1\nbad\t0\n",
                "sentence\tlabel\ngood\t1\nbad\n",
                "line 3",
            ),
            (
                "pairs.csv",
                csv,
                "q,a,y\nwho,me,1\n\"why, then\",no,0\n",
                "q,a,y\nwho,me,1\nwhy,,0\n",
                "line 3",
            ),
        ];
        for (name, format, good, bad, bad_line) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, good).unwrap();
            let ex = read_file(&path, &format).unwrap();
            assert_eq!(ex.len(), 2, "{name}");
            assert_eq!(ex[1].label, "0", "{name}");
            std::fs::write(&path, bad).unwrap();
            let e = read_file(&path, &format).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{}: {bad_line}:", path.display())),
                "{name}: {e}"
            );
        }
        let missing = dir.path().join("missing.tsv");
        let e = read_file(&missing, &DatasetFormat::GlueTsv(None)).unwrap_err();
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn label_sets() {
        let raw = |labels: &[&str]| -> Vec<Example> {
            labels
                .iter()
                .enumerate()
                .map(|(i, l)| Example {
                    line: i as u64 + 1,
                    text_a: "x".into(),
                    text_b: None,
                    label: l.to_string(),
                })
                .collect()
        };
        // Integer labels keep their value, even when a class is missing from the sample.
        assert_eq!(
            LabelSet::from_examples(&raw(&["2", "0"])).unwrap().names,
            ["0", "1", "2"]
        );
        assert!(LabelSet::from_examples(&raw(&["pos", "pos"])).is_err());
        assert_eq!(
            LabelSet::from_examples(&raw(&["1", "1"])).unwrap().names,
            ["0", "1"]
        );
        assert!(LabelSet::from_examples(&raw(&["0", "99999"])).is_err());
        let set = LabelSet::from_examples(&raw(&["0", "1"])).unwrap();
        let e = set
            .class_of(&raw(&["1", "yes"])[1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("yes"), "{e}");
    }

    #[test]
    fn format_from_extension() {
        assert_eq!(
            DatasetFormat::from_path(Path::new("dev.TSV")).unwrap(),
            DatasetFormat::GlueTsv(None)
        );
        assert_eq!(
            DatasetFormat::from_path(Path::new("stsa.binary.dev")).unwrap(),
            DatasetFormat::LabelSentenceLines
        );
        assert!(DatasetFormat::from_path(Path::new("x.csv")).is_err());
    }
}
