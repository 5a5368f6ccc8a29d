//! Model folders: good folders of each architecture round-trip; every broken case errors with a
//! message naming the culprit.

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use veil_model::random::random_transformer;
use veil_model::{
    folder, Architecture, Batch, BlockVariant, EmbeddingMode, HeadKind, LayerNormKind, ModelConfig,
    TextTokenizer,
};

/// A fresh temporary directory per test, removed when the test is done with it.
struct TempFolder(PathBuf);

impl std::ops::Deref for TempFolder {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempFolder {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempFolder {
    let d = std::env::temp_dir().join(format!("veil-model-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempFolder(d)
}

const WORDS: &[&str] = &[
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "was", "great", "bad", "not",
    "a", "film", "##s", "!", ".", ",", "good", "plot", "actors",
];

fn write_vocab(dir: &Path) {
    std::fs::write(dir.join("vocab.txt"), WORDS.join("\n")).unwrap();
}

fn tiny_config(arch: Architecture, head: HeadKind, labels: usize) -> ModelConfig {
    ModelConfig::builder(arch)
        .vocab(WORDS.len())
        .positions(40)
        .head(head)
        .labels(labels)
        .build()
        .unwrap()
}

/// Writes a tiny random folder and returns it.
fn tiny_folder(name: &str, cfg: &ModelConfig) -> TempFolder {
    let dir = temp_dir(name);
    let t = random_transformer(cfg, [7; 16]).unwrap();
    write_vocab(&dir);
    folder::save(&dir, &t, None).unwrap();
    dir
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn every_architecture_and_head_round_trips() {
    for arch in [
        Architecture::Bert,
        Architecture::Roberta,
        Architecture::MpNet,
    ] {
        for (head, labels) in [
            (HeadKind::Pooler, 3),
            (HeadKind::Pooler, 0),
            (HeadKind::MeanPool, 2),
            (HeadKind::MeanPool, 0),
        ] {
            let mut cfg = tiny_config(arch, head, labels);
            cfg.veil.blocks[1] = BlockVariant::friendly();
            cfg.veil.blocks[0].ln2 = LayerNormKind::Centring;
            cfg.veil.embedding = EmbeddingMode::Private;
            let name = format!("{arch:?}-{head:?}-{labels}");
            let original = random_transformer(&cfg, [3; 16]).unwrap();
            let dir = temp_dir(&name);
            write_vocab(&dir);
            folder::save(&dir, &original, None).unwrap();
            let loaded = folder::load(&dir).unwrap();
            assert_eq!(loaded.config, cfg, "{name}");
            assert_eq!(
                loaded.transformer.named.len(),
                original.named.len(),
                "{name}"
            );
            for ((n1, t1), (n2, t2)) in original.named.iter().zip(&loaded.transformer.named) {
                assert_eq!(n1, n2);
                assert_eq!(max_abs_diff(t1, t2), 0.0, "{name}: {n1}");
            }
            let tok = loaded.tokenizer.as_ref().expect("vocab.txt present");
            let enc = tok
                .encode("the movie was great !", Some("bad plot"))
                .unwrap();
            let batch = Batch::single(&enc.ids, &enc.type_ids, &Device::Cpu).unwrap();
            let a = original.forward(&batch).unwrap();
            let b = loaded.transformer.forward(&batch).unwrap();
            assert_eq!(a.hidden_states.len(), 3);
            assert_eq!(max_abs_diff(&a.pooled, &b.pooled), 0.0, "{name}");
            assert_eq!(a.logits.is_some(), labels > 0, "{name}");
            if let (Some(x), Some(y)) = (&a.logits, &b.logits) {
                assert_eq!(x.dims(), &[1, labels]);
                assert_eq!(max_abs_diff(x, y), 0.0, "{name}");
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

#[test]
fn hf_prefixed_checkpoints_and_default_settings_load() {
    // An HF classifier checkpoint: prefixed names, no "veil" object, id2label gives num_labels.
    let cfg = tiny_config(Architecture::Bert, HeadKind::Pooler, 3);
    let dir = tiny_folder("hf-prefixed", &cfg);
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("veil");
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let names =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(names.keys().any(|k| k.starts_with("bert.embeddings.")));
    let m = folder::load(&dir).unwrap();
    assert_eq!(m.config.veil.head, HeadKind::Pooler);
    assert_eq!(m.config.veil.num_labels, 3);
    assert!(m
        .config
        .veil
        .blocks
        .iter()
        .all(|b| *b == BlockVariant::exact(veil_model::Activation::Gelu)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Expects loading `dir` to fail with a message containing every `needle`.
fn expect_error(dir: &Path, needles: &[&str]) {
    let err = folder::load(dir)
        .expect_err("broken folder must not load")
        .to_string();
    for n in needles {
        assert!(err.contains(n), "error {err:?} does not mention {n:?}");
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(path, v.to_string()).unwrap();
}

fn edit_weights(dir: &Path, f: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let path = dir.join("model.safetensors");
    let mut w = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    f(&mut w);
    candle_core::safetensors::save(&w, &path).unwrap();
}

#[test]
fn broken_configs_are_named() {
    let cfg = tiny_config(Architecture::Bert, HeadKind::MeanPool, 0);
    let dir = tiny_folder("broken-config", &cfg);
    let good = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let reset = || std::fs::write(dir.join("config.json"), &good).unwrap();

    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    expect_error(&dir, &["config.json"]);
    reset();
    edit_config(&dir, |o| {
        o.remove("hidden_size");
    });
    expect_error(&dir, &["hidden_size"]);
    reset();
    edit_config(&dir, |o| {
        o.insert("model_type".into(), "gpt2".into());
    });
    expect_error(&dir, &["model_type", "gpt2"]);
    reset();
    edit_config(&dir, |o| {
        o.insert("hidden_act".into(), "swish".into());
    });
    expect_error(&dir, &["hidden_act", "swish"]);
    reset();
    edit_config(&dir, |o| {
        o.insert("num_attention_heads".into(), 3.into());
    });
    expect_error(&dir, &["num_attention_heads"]);
    reset();
    edit_config(&dir, |o| {
        o.insert("num_hidden_layers".into(), 3.into());
    });
    expect_error(&dir, &["veil.blocks", "num_hidden_layers"]);
    reset();
    edit_config(&dir, |o| {
        o.insert("vocab_size".into(), (-5).into());
    });
    expect_error(&dir, &["vocab_size"]);
    reset();
    // A token id is 32 bits: 2^32 does not fit (it would wrap to 0).
    edit_config(&dir, |o| {
        o.insert("pad_token_id".into(), (1u64 << 32).into());
    });
    expect_error(&dir, &["pad_token_id", "below 2^32"]);
    reset();
    edit_config(&dir, |o| {
        o["veil"]["blocks"][0]["activation"] = "swish".into();
    });
    expect_error(&dir, &["veil", "swish"]);
    reset();
    edit_config(&dir, |o| {
        o["veil"]["blocks"][1]["attention"] = "sparsemax".into();
    });
    expect_error(&dir, &["veil", "sparsemax"]);
    reset();
    edit_config(&dir, |o| {
        o["veil"]["embedding"] = "hidden".into();
    });
    expect_error(&dir, &["veil", "hidden"]);
    reset();
    std::fs::remove_file(dir.join("config.json")).unwrap();
    expect_error(&dir, &["config.json"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn broken_weights_are_named() {
    let cfg = tiny_config(Architecture::Roberta, HeadKind::Pooler, 2);
    let dir = tiny_folder("broken-weights", &cfg);
    let good = std::fs::read(dir.join("model.safetensors")).unwrap();
    let reset = || std::fs::write(dir.join("model.safetensors"), &good).unwrap();

    edit_weights(&dir, |w| {
        w.remove("roberta.encoder.layer.1.attention.self.key.weight");
    });
    expect_error(&dir, &["encoder.layer.1.attention.self.key.weight"]);
    reset();
    edit_weights(&dir, |w| {
        w.remove("classifier.out_proj.bias");
    });
    expect_error(&dir, &["classifier.out_proj.bias"]);
    reset();
    edit_weights(&dir, |w| {
        w.insert(
            "roberta.encoder.layer.0.intermediate.dense.weight".into(),
            Tensor::zeros((31, 16), candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
    });
    expect_error(
        &dir,
        &["encoder.layer.0.intermediate.dense.weight", "shape"],
    );
    reset();
    std::fs::write(
        dir.join("model.safetensors"),
        b"\x08\0\0\0\0\0\0\0{}garbage",
    )
    .unwrap();
    expect_error(&dir, &["model.safetensors"]);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    expect_error(&dir, &["model.safetensors", "pytorch_model.bin"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mpnet_needs_its_relative_attention_bias() {
    let cfg = tiny_config(Architecture::MpNet, HeadKind::MeanPool, 0);
    let dir = tiny_folder("mpnet-bias", &cfg);
    edit_weights(&dir, |w| {
        w.remove("encoder.relative_attention_bias.weight");
    });
    expect_error(&dir, &["encoder.relative_attention_bias.weight"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_pairs_truncation_and_no_padding() {
    let dir = temp_dir("tokenizer");
    write_vocab(&dir);
    let tok = TextTokenizer::from_vocab_txt(&dir.join("vocab.txt"), true, 8).unwrap();
    let one = tok.encode("The movie was GREAT", None).unwrap();
    assert_eq!(one.ids, vec![2, 5, 6, 7, 8, 3]);
    assert_eq!(one.type_ids, vec![0; 6]);
    let pair = tok.encode("bad films", Some("good plot")).unwrap();
    assert_eq!(pair.ids, vec![2, 9, 12, 13, 3, 17, 18, 3]);
    assert_eq!(pair.type_ids, vec![0, 0, 0, 0, 0, 1, 1, 1]);
    let long = tok
        .encode("the movie was great the movie was great", None)
        .unwrap();
    assert_eq!(long.len(), 8);
    assert_eq!(*long.ids.last().unwrap(), 3, "truncation keeps [SEP]");
    let unknown = tok.encode("zebra", None).unwrap();
    assert_eq!(unknown.ids, vec![2, 1, 3]);
    // Saved as tokenizer.json, it loads back to the same encodings.
    tok.save(&dir.join("tokenizer.json")).unwrap();
    let again = TextTokenizer::from_folder(&dir, 8).unwrap();
    assert_eq!(again.encode("bad films", Some("good plot")).unwrap(), pair);
    assert!(TextTokenizer::from_vocab_txt(&dir.join("missing.txt"), true, 8).is_err());
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    assert!(TextTokenizer::from_folder(&dir, 8).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn too_long_inputs_are_rejected() {
    let cfg = tiny_config(Architecture::Roberta, HeadKind::MeanPool, 0);
    let t = random_transformer(&cfg, [1; 16]).unwrap();
    // RoBERTa positions start at pad+2 = 2, so 40 positions allow 38 tokens.
    assert_eq!(cfg.max_sequence_len(), 38);
    let ok = Batch::single(&[5; 38], &[0; 38], &Device::Cpu).unwrap();
    assert!(t.forward(&ok).is_ok());
    let long = Batch::single(&[5; 39], &[0; 39], &Device::Cpu).unwrap();
    assert!(t.forward(&long).is_err());
}

#[test]
fn overlay_ships_the_trained_part_and_reassembles_with_the_base_tables() {
    // Base: an embedding model; tuned: a classifier with the same embedding tables.
    let base_cfg = tiny_config(Architecture::Bert, HeadKind::MeanPool, 0);
    let base = tiny_folder("overlay-base", &base_cfg);
    let tuned_cfg = tiny_config(Architecture::Bert, HeadKind::Pooler, 2);
    let mut tuned = random_transformer(&tuned_cfg, [8; 16]).unwrap();
    let base_model = folder::load(&base).unwrap();
    let tables: HashMap<String, Tensor> = base_model
        .transformer
        .named
        .iter()
        .filter(|(n, _)| n.starts_with("embeddings."))
        .cloned()
        .collect();
    tuned.named.retain(|(n, _)| !n.starts_with("embeddings."));
    tuned.named.extend(tables.clone());
    let out = temp_dir("overlay-out");
    let path = out.join("overlay.safetensors");
    folder::save_overlay(&tuned, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let m = folder::load_overlay(&base, &tuned_cfg.to_json(), &bytes).unwrap();
    assert_eq!(m.config, tuned_cfg);
    let get = |t: &veil_model::Transformer, name: &str| -> Tensor {
        t.named.iter().find(|(n, _)| n == name).unwrap().1.clone()
    };
    // The tables come from the base exactly, the trained part within f16 rounding.
    let w = "embeddings.word_embeddings.weight";
    assert_eq!(max_abs_diff(&get(&m.transformer, w), &tables[w]), 0.0);
    let q = "encoder.layer.1.attention.self.query.weight";
    let gap = max_abs_diff(&get(&m.transformer, q), &get(&tuned, q));
    assert!(gap > 0.0 && gap < 1e-3, "f16 rounding {gap}");
    let ids = m
        .tokenizer
        .as_ref()
        .unwrap()
        .encode("the movie was great", None)
        .unwrap();
    assert_eq!(
        m.transformer
            .output_f32(&ids.ids, &ids.type_ids)
            .unwrap()
            .len(),
        2
    );

    // A broken overlay is an error that says so.
    let err = folder::load_overlay(&base, &tuned_cfg.to_json(), &bytes[..bytes.len() / 2])
        .unwrap_err()
        .to_string();
    assert!(err.contains("overlay"), "{err}");
}

#[test]
fn client_bundle_holds_only_public_parts_and_embeds_like_the_full_model() {
    use veil_core::FixedPoint;
    use veil_model::FixedModel;
    use veil_model::{save_bundle, ClientBundle, TABLES_FILE};
    let fp = FixedPoint::default_format();
    for arch in [
        Architecture::Bert,
        Architecture::Roberta,
        Architecture::MpNet,
    ] {
        let cfg = tiny_config(arch, HeadKind::Pooler, 2);
        let full = folder::load(&tiny_folder(&format!("bundle-src-{arch:?}"), &cfg)).unwrap();
        let dir = temp_dir(&format!("bundle-{arch:?}"));
        save_bundle(&full, &dir).unwrap();
        // Only config, tokenizer and embedding tables were written.
        let tables = candle_core::safetensors::load(dir.join(TABLES_FILE), &Device::Cpu).unwrap();
        assert!(!tables.is_empty());
        assert!(
            tables.keys().all(|k| k.starts_with("embeddings.")),
            "{:?}",
            tables.keys()
        );
        assert!(!dir.join("model.safetensors").exists());
        let bundle = ClientBundle::open(&dir).unwrap();
        assert_eq!(bundle.config, full.config);
        let enc = bundle
            .tokenizer
            .encode("the movie was great", None)
            .unwrap();
        let got = bundle.embed(&enc.ids, &enc.type_ids, fp).unwrap();
        let sim = FixedModel::encode(&full.transformer, fp).unwrap();
        let (want, _) = sim.embed(&enc.ids, &enc.type_ids).unwrap();
        assert_eq!(got, want, "{arch:?}");
    }
}

#[test]
fn client_bundle_refuses_private_tables_and_weights() {
    use veil_model::{save_bundle, ClientBundle, TABLES_FILE};
    let cfg = tiny_config(Architecture::Bert, HeadKind::Pooler, 2);
    let src = tiny_folder("bundle-bad-src", &cfg);
    // A folder with weights is not a bundle.
    assert!(ClientBundle::load(&src).is_err());
    // A bundle whose table file carries a non-public tensor is refused.
    let full = folder::load(&src).unwrap();
    let dir = temp_dir("bundle-bad");
    save_bundle(&full, &dir).unwrap();
    let mut t = candle_core::safetensors::load(dir.join(TABLES_FILE), &Device::Cpu).unwrap();
    t.insert(
        "encoder.layer.0.output.dense.weight".into(),
        Tensor::zeros((2, 2), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&t, dir.join(TABLES_FILE)).unwrap();
    let err = ClientBundle::load(&dir).err().expect("refused");
    assert!(err.to_string().contains("not a public table"), "{err}");
    // Private-embedding mode: no tables at all, and embedding on the client is an error.
    let mut model = folder::load(&src).unwrap();
    model.config.veil.embedding = EmbeddingMode::Private;
    let dir = temp_dir("bundle-private");
    save_bundle(&model, &dir).unwrap();
    assert!(!dir.join(TABLES_FILE).exists());
    let b = ClientBundle::load(&dir).unwrap();
    assert!(b
        .embed(&[2, 5, 3], &[0; 3], veil_core::FixedPoint::default_format())
        .is_err());
}
