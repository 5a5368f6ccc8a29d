//! The project's real SST-2 and MRPC files (`shared/data` beside the repository, not committed)
//! read by `veil_model::data`. Skipped, with a printed reason, when a copy is absent.

use std::path::PathBuf;
use veil_model::data::{self, DatasetFormat, LabelSet};

fn shared(dataset: &str) -> Option<PathBuf> {
    data::shared_dataset(dataset)
        .map_err(|e| veil_core::skip_unless_ci(&e.to_string()))
        .ok()
}

#[test]
fn real_sst2_files_parse() {
    let Some(dir) = shared("sst2") else { return };
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
#[test]
fn real_mrpc_files_parse() {
    let Some(dir) = shared("mrpc") else { return };
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
