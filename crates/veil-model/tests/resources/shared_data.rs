//! The project's real SST-2 and MRPC files (`shared/data` beside the repository, not committed)
//! read by `veil_model::data`. Counted as ignored, with the reason, when a copy is absent;
//! failed then under CI (see `veil_test_harness`).

use std::path::PathBuf;
use veil_model::data::{self, DatasetFormat, LabelSet};
use veil_test_harness::{needs, Missing, Trial};

/// This file's trials.
pub fn trials() -> Vec<Trial> {
    vec![
        needs(
            "real_sst2_files_parse",
            || shared("sst2"),
            real_sst2_files_parse,
        ),
        needs(
            "real_mrpc_files_parse",
            || shared("mrpc"),
            real_mrpc_files_parse,
        ),
    ]
}

fn shared(dataset: &str) -> Result<PathBuf, Missing> {
    data::shared_dataset(dataset).map_err(|e| Missing(e.to_string()))
}

fn real_sst2_files_parse(dir: PathBuf) {
    let train = data::read_file(
        &dir.join("stsa.binary.train"),
        &DatasetFormat::LabelSentenceLines,
    )
    .unwrap();
    let dev = data::read_file(
        &dir.join("stsa.binary.dev"),
        &DatasetFormat::LabelSentenceLines,
    )
    .unwrap();
    assert_eq!((train.len(), dev.len()), (6920, 872));
    let labels = LabelSet::from_examples(&train).unwrap();
    assert_eq!(labels.names, ["0", "1"]);
    let positive = dev.iter().filter(|e| labels.class_of(e).unwrap() == 1);
    assert_eq!(positive.count(), 444);
}

/// GLUE MRPC: sentence pairs, and a dev file that starts with a UTF-8 byte-order mark.
fn real_mrpc_files_parse(dir: PathBuf) {
    let dev_path = dir.join("dev.tsv");
    assert!(std::fs::read(&dev_path)
        .unwrap()
        .starts_with("\u{feff}".as_bytes()));
    let train = data::read_file(&dir.join("train.tsv"), &DatasetFormat::GlueTsv(None)).unwrap();
    let dev = data::read_file(&dev_path, &DatasetFormat::GlueTsv(None)).unwrap();
    assert_eq!((train.len(), dev.len()), (3668, 408));
    assert!(dev.iter().all(|e| e.text_b.is_some()));
    let labels = LabelSet::from_examples(&train).unwrap();
    assert_eq!(labels.names, ["0", "1"]);
    let paraphrases = dev.iter().filter(|e| labels.class_of(e).unwrap() == 1);
    assert_eq!(paraphrases.count(), 279);
}
