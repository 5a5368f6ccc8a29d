//! End-to-end tests of `finetune` and `substitute` on a tiny seeded BERT folder and a synthetic
//! sentiment task (label 1 iff the sentence contains a positive word).

use std::path::Path;

use rand::{Rng, SeedableRng};
use veil_model::Architecture;
use veil_model::{folder, random, ModelConfig};
use veil_train::transformer::{Freeze, TrainableTransformer};
use veil_train::workflow::{labelled_examples, TrainingRecord, RECORD_FILE};
use veil_train::{
    evaluate, finetune, substitute, train, DataOptions, EncodedExample, FinetuneOptions,
    LossWeights, Operator, RunControl, SubstituteOptions, SubstituteOutcome, TrainConfig,
};

const POSITIVE: [&str; 3] = ["good", "great", "fine"];
const NEUTRAL: [&str; 8] = [
    "the", "film", "plot", "actor", "scene", "story", "was", "very",
];
const NEGATIVE: [&str; 3] = ["bad", "dull", "awful"];

/// A 2-block BERT (hidden 32) with seeded weights, no classifier, and a word-level vocabulary.
fn tiny_bert_folder(dir: &Path) {
    let cfg = ModelConfig::builder(Architecture::Bert)
        .vocab(24)
        .hidden(32)
        .ffn(64)
        .positions(32)
        .labels(0)
        .build()
        .unwrap();
    let model = random::random_transformer_with_std(&cfg, [7; 16], 0.1).unwrap();
    folder::save(dir, &model, None).unwrap();
    let mut vocab = vec!["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    vocab.extend(POSITIVE.iter().chain(&NEUTRAL).chain(&NEGATIVE));
    assert!(vocab.len() <= 24);
    std::fs::write(dir.join("vocab.txt"), vocab.join("\n")).unwrap();
}

/// `LABEL SENTENCE` lines: 3–7 neutral words plus one positive (label 1) or negative word.
fn sentiment_file(path: &Path, n: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut lines = Vec::new();
    for _ in 0..n {
        let label = rng.gen_range(0..2);
        let mut words: Vec<&str> = (0..rng.gen_range(3..8))
            .map(|_| NEUTRAL[rng.gen_range(0..NEUTRAL.len())])
            .collect();
        let cue = if label == 1 { POSITIVE } else { NEGATIVE }[rng.gen_range(0..3)];
        words.insert(rng.gen_range(0..=words.len()), cue);
        lines.push(format!("{label} {}", words.join(" ")));
    }
    std::fs::write(path, lines.join("\n")).unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        tiny_bert_folder(&root.join("base"));
        sentiment_file(&root.join("train.txt"), 192, 1);
        sentiment_file(&root.join("dev.txt"), 64, 2);
        Fixture { _dir: dir, root }
    }

    fn data(&self) -> DataOptions {
        DataOptions::new(self.root.join("train.txt"), self.root.join("dev.txt"))
    }

    fn finetune_options(&self, out: &str) -> FinetuneOptions {
        let mut o = FinetuneOptions::new(self.root.join("base"), self.data(), self.root.join(out));
        o.train = TrainConfig {
            epochs: 12,
            batch_size: 16,
            learning_rate: 2e-3,
            loss: LossWeights {
                alpha1: 0.0,
                ..LossWeights::paper(None)
            },
            checkpoint_every: 10,
            ..TrainConfig::default()
        };
        o.progress = false;
        o
    }
}

#[test]
fn finetune_learns_freezes_embeddings_and_records_it() {
    let fx = Fixture::new();
    let opts = fx.finetune_options("ft");
    let outcome = finetune(&opts).unwrap();
    let dev = outcome.dev.unwrap();
    assert!(dev.accuracy >= 0.9, "dev accuracy {}", dev.accuracy);
    assert_eq!(dev.max_abs_hidden.len(), 2);
    assert!(
        !fx.root.join("ft/checkpoint").exists(),
        "finished run keeps no checkpoint"
    );

    let record = TrainingRecord::read(&fx.root.join("ft")).unwrap().unwrap();
    assert!(
        record.freeze_embeddings,
        "public-embedding models freeze by default"
    );
    assert_eq!(record.labels.names, ["0", "1"]);
    assert_eq!(record.dev, dev);
    assert!(record
        .initialised
        .iter()
        .any(|n| n.starts_with("classifier")));

    // The folder loads back as a 2-label classifier with the embeddings of the base model.
    let base = folder::load(&fx.root.join("base")).unwrap();
    let tuned = folder::load(&fx.root.join("ft")).unwrap();
    assert_eq!(tuned.config.veil.num_labels, 2);
    let get = |m: &veil_model::Model, name: &str| -> Vec<f32> {
        let t = &m
            .transformer
            .named
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1;
        t.flatten_all().unwrap().to_vec1().unwrap()
    };
    for name in [
        "embeddings.word_embeddings.weight",
        "embeddings.LayerNorm.weight",
    ] {
        assert_eq!(get(&base, name), get(&tuned, name), "{name} moved");
    }
    let v = "encoder.layer.1.attention.self.query.weight";
    assert_ne!(
        get(&base, v),
        get(&tuned, v),
        "encoder weights were trained"
    );
}

#[test]
fn finetune_resumes_after_interruption() {
    let fx = Fixture::new();
    let mut opts = fx.finetune_options("ft");
    opts.train.epochs = 2; // 12 batches per epoch
    opts.stop_after = Some(10);
    let part = finetune(&opts).unwrap();
    assert!(part.dev.is_none() && !part.summary.finished());
    assert!(fx.root.join("ft/checkpoint/state.json").exists());
    assert!(!fx.root.join("ft").join(RECORD_FILE).exists());
    opts.stop_after = None;
    let rest = finetune(&opts).unwrap();
    assert_eq!(rest.summary.resumed_from, Some(10));
    assert_eq!(rest.summary.steps_done, 24);
    assert!(rest.dev.is_some() && !rest.already_finished);

    // The same command once more reports the finished run and leaves the model as it was.
    let model_file = fx.root.join("ft/model.safetensors");
    let trained = std::fs::read(&model_file).unwrap();
    let again = finetune(&opts).unwrap();
    assert!(again.already_finished);
    assert_eq!(again.summary, rest.summary);
    assert_eq!(again.dev, rest.dev);
    assert_eq!(std::fs::read(&model_file).unwrap(), trained);

    // How often checkpoints are written does not matter; explicitly what the default chose
    // (frozen public embeddings) neither.
    opts.train.checkpoint_every += 1;
    opts.freeze_embeddings = Some(true);
    assert!(finetune(&opts).unwrap().already_finished);

    // Other settings into the same folder are refused, not trained over it.
    let refused = |o: &FinetuneOptions| {
        let err = finetune(o).unwrap_err().to_string();
        assert!(err.contains("other settings"), "{err}");
        assert_eq!(std::fs::read(&model_file).unwrap(), trained);
    };
    let mut other = opts.clone();
    other.train.learning_rate *= 2.0;
    refused(&other);
    let mut other = opts.clone();
    other.freeze_embeddings = Some(false);
    refused(&other);
    let mut other = opts.clone();
    other.data.max_seq_len -= 1;
    refused(&other);
}

#[test]
fn max_steps_caps_the_run() {
    let fx = Fixture::new();
    let mut opts = fx.finetune_options("ft");
    opts.train.max_steps = Some(5); // of 12 epochs × 12 batches
    let out = finetune(&opts).unwrap();
    assert_eq!(out.summary.total_steps, 5);
    assert_eq!(out.summary.steps_done, 5);
    assert!(out.dev.is_some());
}

#[test]
fn finetune_reports_bad_data_with_file_and_line() {
    let fx = Fixture::new();
    std::fs::write(fx.root.join("dev.txt"), "1 good film\n2 what label\n").unwrap();
    let err = finetune(&fx.finetune_options("ft"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("dev.txt") && err.contains("line 2"), "{err}");
}

#[test]
fn training_steps_reduce_the_loss_and_respect_frozen_blocks() {
    let fx = Fixture::new();
    let (model, info) = TrainableTransformer::load(&fx.root.join("base"), 2, None, 3).unwrap();
    assert_eq!(info.initialised.len(), 2); // classifier weight and bias
    let data = labelled_examples(&fx.root.join("base"), &fx.root.join("train.txt"), None, 32)
        .unwrap()
        .1;
    let before = model.parameter_values().unwrap();
    let config = TrainConfig {
        epochs: 1,
        batch_size: 16,
        learning_rate: 3e-3,
        loss: LossWeights::paper(Some(1.0)),
        ..TrainConfig::default()
    };
    let freeze = Freeze {
        embeddings: true,
        blocks_below: 1,
    };
    let first = train(
        &model,
        model.trainable(freeze),
        &data,
        &config,
        &RunControl::default(),
    )
    .unwrap();
    let second = train(
        &model,
        model.trainable(freeze),
        &data,
        &config,
        &RunControl::default(),
    )
    .unwrap();
    assert!(
        second.mean_loss < first.mean_loss,
        "{first:?} then {second:?}"
    );
    let after = model.parameter_values().unwrap();
    for (((name, _), b), a) in model.params().iter().zip(&before).zip(&after) {
        let unchanged = b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            == a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let frozen = name.starts_with("embeddings.") || name.starts_with("encoder.layer.0.");
        if frozen {
            assert!(unchanged, "frozen {name} moved");
        }
        // Weight matrices all have a task gradient (a key *bias* does not: it adds the same
        // q·b to every score of a row, which softmax ignores).
        let has_gradient = name.ends_with(".weight") && !name.contains("LayerNorm");
        if !frozen && has_gradient {
            assert!(!unchanged, "trainable {name} did not move");
        }
    }
    let eval = evaluate(&model, &data, 64).unwrap();
    assert_eq!(eval.max_abs_hidden.len(), 2);
}

#[test]
fn substitute_writes_a_model_that_loads_with_its_variants() {
    let fx = Fixture::new();
    finetune(&fx.finetune_options("ft")).unwrap();
    let mut opts = SubstituteOptions::new(fx.root.join("ft"), fx.data(), fx.root.join("sub"));
    opts.train = TrainConfig {
        epochs: 2,
        batch_size: 16,
        learning_rate: 2e-3,
        ..fx.finetune_options("unused").train
    };
    opts.progress = false;
    opts.simulate_examples = 4;
    let SubstituteOutcome::Finished(doc) = substitute(&opts).unwrap() else {
        panic!("stopped without a step limit")
    };
    let report = &doc.substitution;
    assert_eq!(report.steps.len(), 8);
    assert!(report.original.accuracy >= 0.9);
    for step in &report.steps {
        assert_eq!(step.accepted, step.accuracy > report.threshold);
    }

    // The saved folder carries exactly the accepted replacements.
    let loaded = folder::load(&fx.root.join("sub")).unwrap();
    let variants = &loaded.config.veil.blocks;
    let friendly = veil_model::BlockVariant::friendly();
    for (block, v) in variants.iter().enumerate() {
        let accepted = |op: Operator| {
            report
                .steps
                .iter()
                .any(|s| s.operator == op && s.block == block && s.accepted)
        };
        assert_eq!(
            v.activation == friendly.activation,
            accepted(Operator::Gelu),
            "block {block}"
        );
        assert_eq!(
            v.attention == friendly.attention,
            accepted(Operator::Softmax)
        );
        assert_eq!(v.ln1 == friendly.ln1, accepted(Operator::LayerNorm1));
        assert_eq!(v.ln2 == friendly.ln2, accepted(Operator::LayerNorm2));
    }
    let record = TrainingRecord::read(&fx.root.join("sub")).unwrap().unwrap();
    assert_eq!(&record.variants, variants);

    // The reloaded model reproduces the reported final accuracy.
    let (reloaded, info) = TrainableTransformer::load(&fx.root.join("sub"), 2, None, 0).unwrap();
    assert!(info.initialised.is_empty());
    let dev = labelled_examples(&fx.root.join("sub"), &fx.root.join("dev.txt"), None, 128)
        .unwrap()
        .1;
    let again = evaluate(&reloaded, &dev, 64).unwrap();
    assert!((again.accuracy - report.final_evaluation.accuracy).abs() < 1e-9);

    // Reports and the fixed-point check.
    for f in ["substitution.json", "substitution.md", "accuracy.svg"] {
        assert!(fx.root.join("sub").join(f).exists(), "{f}");
    }
    let fp = doc.fixed_point.as_ref().unwrap();
    assert_eq!((fp.ring_bits, fp.frac_bits, fp.examples), (41, 13, 4));
    assert_eq!(fp.per_block.len(), 2);
    assert!(fp.overflow_free(), "{fp:?}");
    assert!(fp.per_block.iter().all(|b| b.max_error < 0.1), "{fp:?}");
}

#[test]
fn substitute_resumes_step_by_step_and_refuses_other_options() {
    let fx = Fixture::new();
    finetune(&fx.finetune_options("ft")).unwrap();
    let options = |out: &str, stop_after_steps: Option<usize>| {
        let mut o = SubstituteOptions::new(fx.root.join("ft"), fx.data(), fx.root.join(out));
        o.train = TrainConfig {
            epochs: 1,
            batch_size: 16,
            learning_rate: 2e-3,
            checkpoint_every: 5,
            ..fx.finetune_options("unused").train
        };
        o.progress = false;
        o.simulate_examples = 0;
        o.stop_after_steps = stop_after_steps;
        o
    };
    let finished = |o: &SubstituteOptions| match substitute(o).unwrap() {
        SubstituteOutcome::Finished(doc) => doc.substitution,
        stopped => panic!("{stopped:?}"),
    };
    let want = finished(&options("straight", None));

    let sub = fx.root.join("sub");
    match substitute(&options("sub", Some(3))).unwrap() {
        SubstituteOutcome::Stopped {
            steps_done,
            total_steps,
        } => assert_eq!((steps_done, total_steps), (3, 8)),
        other => panic!("{other:?}"),
    }
    assert!(sub.join("progress/progress.json").is_file());
    assert!(!sub.join("config.json").exists(), "no model before the end");

    let mut other = options("sub", None);
    other.train.learning_rate = 1e-3;
    let err = substitute(&other).unwrap_err().to_string();
    assert!(err.contains("differing: train_config"), "{err}");

    let got = finished(&options("sub", None));
    assert_eq!(got.steps.len(), 8);
    for (i, (g, w)) in got.steps.iter().zip(&want.steps).enumerate() {
        assert_eq!(g.resumed, i < 3, "step {i}");
        assert_eq!((g.operator, g.block), (w.operator, w.block));
        assert_eq!(
            (g.accuracy, g.accepted),
            (w.accuracy, w.accepted),
            "step {i}"
        );
        assert!((g.train_loss - w.train_loss).abs() < 1e-4, "step {i}");
    }
    assert_eq!(
        got.final_evaluation.accuracy,
        want.final_evaluation.accuracy
    );
    let variants = |dir: &str| folder::load(&fx.root.join(dir)).unwrap().config.veil.blocks;
    assert_eq!(variants("sub"), variants("straight"));
    let md = std::fs::read_to_string(sub.join("substitution.md")).unwrap();
    assert!(md.contains("3 of 8 steps"), "{md}");

    // The progress stays: running again redoes nothing and rewrites the same model.
    let again = finished(&options("sub", None));
    assert_eq!(again.resumed_steps(), 8);
    assert_eq!(variants("sub"), variants("straight"));
    let names: Vec<String> = std::fs::read_dir(sub.join("progress"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert!(names.is_empty(), "training checkpoints left: {names:?}");

    // A damaged state is a clear error, not a panic.
    let progress = std::fs::read_to_string(sub.join("progress/progress.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&progress).unwrap();
    let state = sub.join("progress").join(state["state"].as_str().unwrap());
    std::fs::write(state.join("params.safetensors"), b"garbage").unwrap();
    let err = substitute(&options("sub", None)).unwrap_err().to_string();
    assert!(err.contains("params.safetensors"), "{err}");
}

#[test]
fn substitute_retries_rejected_steps_with_more_updates() {
    let fx = Fixture::new();
    finetune(&fx.finetune_options("ft")).unwrap();
    let mut o = SubstituteOptions::new(fx.root.join("ft"), fx.data(), fx.root.join("retry"));
    o.train = TrainConfig {
        epochs: 1,
        batch_size: 16,
        learning_rate: 2e-3,
        ..fx.finetune_options("unused").train
    };
    o.progress = false;
    o.simulate_examples = 0;
    o.substitution.stages = veil_train::substitute::paper_stages()[..1].to_vec();
    // Only improvements pass, so steps get rejected and retried.
    o.substitution.max_accuracy_drop = 0.0;
    o.substitution.retries = 1;
    let SubstituteOutcome::Finished(doc) = substitute(&o).unwrap() else {
        panic!("stopped without a step limit")
    };
    let report = &doc.substitution;
    let mut retried = 0;
    for step in &report.steps {
        let last = step.attempts.last().unwrap();
        assert_eq!(step.accepted, last.accuracy > report.threshold);
        assert_eq!(step.accuracy, last.accuracy);
        assert_eq!(step.attempts[0].updates, 12); // 192 examples in batches of 16
        if step.attempts.len() == 2 {
            retried += 1;
            assert!(step.attempts[0].accuracy <= report.threshold);
            assert_eq!(step.attempts[1].updates, 24);
        } else {
            assert!(step.accepted, "{step:?}");
        }
    }
    assert!(retried > 0, "{report:?}");
}

#[test]
fn substitute_distils_towards_the_original_model() {
    let fx = Fixture::new();
    finetune(&fx.finetune_options("ft")).unwrap();
    let options = |out: &str, distill: f64| {
        let mut o = SubstituteOptions::new(fx.root.join("ft"), fx.data(), fx.root.join(out));
        o.train = TrainConfig {
            epochs: 1,
            batch_size: 16,
            learning_rate: 2e-3,
            ..fx.finetune_options("unused").train
        };
        o.train.loss.distill = distill;
        o.progress = false;
        o.simulate_examples = 0;
        o.substitution.stages = veil_train::substitute::paper_stages()[..1].to_vec();
        o
    };
    let run = |o: &SubstituteOptions| match substitute(o).unwrap() {
        SubstituteOutcome::Finished(doc) => doc.substitution,
        stopped => panic!("{stopped:?}"),
    };
    let plain = run(&options("plain", 0.0));
    let mut first = options("distilled", 1.0);
    first.stop_after_steps = Some(1);
    assert!(matches!(
        substitute(&first).unwrap(),
        SubstituteOutcome::Stopped { steps_done: 1, .. }
    ));
    // The weight is part of the run: progress made with it is not continued without it.
    let err = substitute(&options("distilled", 0.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("differing: train_config"), "{err}");
    let distilled = run(&options("distilled", 1.0));
    assert_eq!(distilled.steps.len(), 2);
    // The same first step (GELU in the top block), trained under a different loss.
    assert!(
        (distilled.steps[0].train_loss - plain.steps[0].train_loss).abs() > 1e-4,
        "{distilled:?} {plain:?}"
    );
    let bad = options("bad", -1.0);
    assert!(substitute(&bad)
        .unwrap_err()
        .to_string()
        .contains("distillation"));
}

#[test]
fn substitute_trains_a_stage_at_its_own_learning_rate() {
    let fx = Fixture::new();
    finetune(&fx.finetune_options("ft")).unwrap();
    let run = |out: &str, learning_rate: Option<f64>| {
        let mut o = SubstituteOptions::new(fx.root.join("ft"), fx.data(), fx.root.join(out));
        o.train = TrainConfig {
            epochs: 1,
            batch_size: 16,
            learning_rate: 2e-3,
            ..fx.finetune_options("unused").train
        };
        o.progress = false;
        o.simulate_examples = 0;
        o.substitution.stages = veil_train::substitute::paper_stages()[..1].to_vec();
        o.substitution.stages[0].learning_rate = learning_rate;
        o.stop_after_steps = Some(1);
        substitute(&o).unwrap();
        // The stopped run's record of its one step.
        let progress = std::fs::read(fx.root.join(out).join("progress/progress.json")).unwrap();
        let progress: serde_json::Value = serde_json::from_slice(&progress).unwrap();
        progress["steps"][0]["train_loss"].as_f64().unwrap()
    };
    let (default, same, frozen) = (
        run("default", None),
        run("same", Some(2e-3)),
        run("frozen", Some(1e-12)),
    );
    assert!((default - same).abs() < 1e-6, "{default} vs {same}");
    assert!((default - frozen).abs() > 1e-3, "{default} vs {frozen}");
}

#[test]
fn substitute_needs_a_trained_classifier() {
    let fx = Fixture::new();
    let mut opts = SubstituteOptions::new(fx.root.join("base"), fx.data(), fx.root.join("sub"));
    opts.progress = false;
    let err = substitute(&opts).unwrap_err().to_string();
    assert!(err.contains("veil finetune"), "{err}");
}

/// candle's fused softmax kernel has no backward pass; attention must use a differentiable
/// softmax or the query and key projections silently stop training.
#[test]
fn query_and_key_projections_receive_gradients() {
    let fx = Fixture::new();
    let (model, _) = TrainableTransformer::load(&fx.root.join("base"), 2, None, 3).unwrap();
    let tokenizer = veil_model::TextTokenizer::from_folder(&fx.root.join("base"), 32).unwrap();
    let enc = tokenizer.encode("the film was good", None).unwrap();
    let example = EncodedExample {
        ids: enc.ids,
        type_ids: enc.type_ids,
        label: 1,
    };
    let batch = veil_train::Batch::new(&[&example], &candle_core::Device::Cpu).unwrap();
    let out = veil_train::SequenceClassifier::forward(&model, &batch).unwrap();
    let loss = candle_nn::loss::cross_entropy(&out.logits, &batch.labels).unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in model.params() {
        if name.ends_with("query.weight") || name.ends_with("key.weight") {
            assert!(
                grads.get(var.as_tensor()).is_some(),
                "{name} has no gradient"
            );
        }
    }
}

#[test]
fn frozen_view_keeps_values_and_trainable_gradients() {
    use veil_train::{Batch, SequenceClassifier};
    let fx = Fixture::new();
    let (model, _) = TrainableTransformer::load(&fx.root.join("base"), 2, None, 5).unwrap();
    let tokenizer = veil_model::TextTokenizer::from_folder(&fx.root.join("base"), 32).unwrap();
    let examples: Vec<EncodedExample> = ["the film was good", "a dull plot", "great"]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let enc = tokenizer.encode(t, None).unwrap();
            EncodedExample {
                ids: enc.ids,
                type_ids: enc.type_ids,
                label: (i % 2) as u32,
            }
        })
        .collect();
    let batch = Batch::new(
        &examples.iter().collect::<Vec<_>>(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let freeze = Freeze {
        embeddings: true,
        blocks_below: 1,
    };
    let view = model.frozen_view(freeze);
    let full_out = SequenceClassifier::forward(&model, &batch).unwrap();
    let view_out = view.forward(&batch).unwrap();
    let values = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(values(&full_out.logits), values(&view_out.logits));
    let loss = |o: &veil_train::ClassifierOutput| {
        candle_nn::loss::cross_entropy(&o.logits, &batch.labels).unwrap()
    };
    let full_grads = loss(&full_out).backward().unwrap();
    let view_grads = loss(&view_out).backward().unwrap();
    for (name, var) in model.params() {
        let frozen = name.starts_with("embeddings.") || name.starts_with("encoder.layer.0.");
        let g = view_grads.get(var.as_tensor());
        if frozen {
            assert!(g.is_none(), "{name}: the frozen part still got a gradient");
        } else if let Some(full) = full_grads.get(var.as_tensor()) {
            let (a, b) = (values(full), values(g.expect("trainable gradient")));
            let gap = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(gap <= 1e-6, "{name}: gradients differ by {gap}");
        }
    }
}
