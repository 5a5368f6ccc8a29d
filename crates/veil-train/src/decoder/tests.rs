//! Tests of the decoder workflow on tiny seeded Llamas (no shared data needed).

use std::path::{Path, PathBuf};

use veil_model::decoder::random::{write_tiny_llama, TinyShape};
use veil_model::decoder::{DecoderActivation, DecoderBlockVariant};
use veil_model::engine::decoder::LogitRows;
use veil_model::F32Model;

use super::answers::{answer_all, chat_prompts, TEMPLATES};
use super::data::{batch_at, sequences};
use super::distill::{finetune, kl_loss, DistillSettings, FinetuneJob, HeldOut, Scope};
use super::model::{ids_tensor, KvCache, TrainableDecoder};
use super::stage::{apply_stage, save_stage, write_hf_folder};
use super::workflow::{
    load_trainable, pad_id, substitute_decoder, substituted_decoder, DecoderOutcome,
    DecoderSubstituteOptions,
};
use crate::substitute::Operator;

fn tiny(dir: &Path, seed: u8, shape: &TinyShape) -> String {
    write_tiny_llama(dir, seed, shape).unwrap();
    dir.display().to_string()
}

fn logits(model: &TrainableDecoder, ids: &[u32]) -> Vec<f32> {
    model
        .forward(&ids_tensor(&[ids.to_vec()]).unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
}

const IDS: [u32; 12] = [5, 17, 200, 33, 4, 90, 120, 7, 260, 1, 64, 11];

#[test]
fn original_variants_match_decode_f32() {
    let tmp = tempfile::tempdir().unwrap();
    for (seed, shape) in [
        (3, TinyShape::default()),
        (
            9,
            TinyShape {
                attention_bias: true,
                tie_word_embeddings: false,
                kv_heads: 4,
                ..TinyShape::default()
            },
        ),
    ] {
        let dir = tmp.path().join(format!("m{seed}"));
        let m = veil_model::decoder::load(&tiny(&dir, seed, &shape)).unwrap();
        let reference = F32Model::new(&m.weights).unwrap();
        let expected = reference.session().step(&IDS, LogitRows::All).unwrap();
        let model = TrainableDecoder::from_weights(&m.weights).unwrap();
        let got = logits(&model, &IDS);
        assert_eq!(got.len(), expected.data.len());
        let err = max_rel(&got, &expected.data);
        assert!(err < 1e-4, "relative error {err}");
        // The cached step path gives the same last logits.
        let mut cache = KvCache::default();
        model.step(&IDS[..7], &mut cache).unwrap();
        let last = model.step(&IDS[7..], &mut cache).unwrap();
        let v = m.weights.config.vocab_size;
        let err = max_rel(&last, &got[got.len() - v..]);
        assert!(err < 1e-4, "cached step: relative error {err}");
    }
}

/// What is trained is what the engines run: each substitute, alone and mixed, in the trainable
/// model and in decode_f32 (the composition every engine, the two-party one included, shares).
#[test]
fn substituted_variants_match_decode_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let m = veil_model::decoder::load(&tiny(tmp.path(), 5, &TinyShape::default())).unwrap();
    let (friendly, scaled) = (DecoderBlockVariant::FRIENDLY, DecoderBlockVariant::SCALED);
    let layers = m.weights.config.layers;
    let mut mixes = vec![vec![friendly; layers]];
    let mut mixed = vec![DecoderBlockVariant::ORIGINAL; layers];
    mixed[0] = friendly;
    mixed[layers - 1] = scaled;
    mixes.push(mixed);
    // Hard-swish in every block (its slope near −3 and 3 is where candle's clamp and the
    // engine's could differ).
    let hard_swish = DecoderBlockVariant {
        activation: DecoderActivation::HardSwish,
        ..DecoderBlockVariant::ORIGINAL
    };
    mixes.push(vec![hard_swish; layers]);
    for variants in mixes {
        let mut w = m.weights.clone();
        w.config.variants = variants.clone();
        let reference = F32Model::new(&w).unwrap();
        let expected = reference.session().step(&IDS, LogitRows::All).unwrap();
        let mut model = TrainableDecoder::from_weights(&m.weights).unwrap();
        for (i, v) in variants.iter().enumerate() {
            model.set_variant(i, *v).unwrap();
        }
        let err = max_rel(&logits(&model, &IDS), &expected.data);
        assert!(err < 1e-4, "{variants:?}: relative error {err}");
    }
}

#[test]
fn every_substitution_changes_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut model, _) = load_trainable(&tiny(tmp.path(), 4, &TinyShape::default())).unwrap();
    let original = logits(&model, &IDS);
    for op in Operator::DECODER {
        let v = substituted_decoder(
            DecoderBlockVariant::ORIGINAL,
            op,
            DecoderActivation::HardSwish,
        )
        .unwrap();
        model.set_variant(1, v).unwrap();
        let changed = logits(&model, &IDS);
        assert!(
            max_rel(&changed, &original) > 1e-3,
            "{} left the logits unchanged",
            op.label()
        );
        model.set_variant(1, DecoderBlockVariant::ORIGINAL).unwrap();
    }
    assert!(substituted_decoder(
        DecoderBlockVariant::ORIGINAL,
        Operator::Gelu,
        DecoderActivation::Relu
    )
    .is_err());
}

fn text_file(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let p = dir.join(name);
    let body: String = lines.iter().map(|l| format!("1 {l}\n")).collect();
    std::fs::write(&p, body).unwrap();
    p
}

const TRAIN: [&str; 8] = [
    "the film is a charming and often affecting journey",
    "it is a gorgeous, witty, seductive movie",
    "a dull and lifeless story with nothing to say",
    "the acting is strong and the plot moves quickly",
    "one of the worst films of the year",
    "an engaging comedy about friendship and family",
    "the music is lovely but the script is thin",
    "a bold and moving portrait of a small town",
];

#[test]
fn distillation_reduces_the_loss_and_only_trains_the_block() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tiny(tmp.path(), 5, &TinyShape::default());
    let (teacher, tokenizer) = load_trainable(&spec).unwrap();
    let (mut student, _) = load_trainable(&spec).unwrap();
    let sentences: Vec<String> = TRAIN.iter().map(|s| s.to_string()).collect();
    let train = sequences(&tokenizer, &sentences, 24, 1, 0).unwrap();
    let pad = pad_id(&teacher);
    let relu = substituted_decoder(
        DecoderBlockVariant::ORIGINAL,
        Operator::Softmax,
        DecoderActivation::Relu,
    )
    .unwrap();
    student.set_variant(1, relu).unwrap();
    let kl_now = |student: &TrainableDecoder| {
        let b = batch_at(&train, train.len(), 0, pad);
        let ids = ids_tensor(&b.ids).unwrap();
        let mask = candle_core::Tensor::from_vec(
            b.mask(),
            (b.ids.len(), b.ids[0].len()),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        kl_loss(
            &student.forward(&ids).unwrap(),
            &teacher.forward(&ids).unwrap(),
            &mask,
        )
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
    };
    let before = kl_now(&student);
    let block0 = student.values(|n| n.starts_with("layers.0.")).unwrap();
    let settings = DistillSettings {
        updates: 40,
        batch_size: 4,
        learning_rate: 3e-3,
        ..DistillSettings::default()
    };
    let job = FinetuneJob {
        blocks: 1..2,
        budget: 1.0,
        learning_rate: None,
        bound: None,
        checkpoint_dir: None,
        data_offset: 0,
        below_unchanged: true,
        progress: false,
    };
    // Reusing the teacher's hidden state below gives the same loss as recomputing it.
    let b = batch_at(&train, 4, 0, pad);
    let reused = super::distill::distill_forward(&student, &teacher, &b, 1, true, &settings, None)
        .unwrap()
        .kl;
    let recomputed =
        super::distill::distill_forward(&student, &teacher, &b, 1, false, &settings, None)
            .unwrap()
            .kl;
    assert!(
        (reused - recomputed).abs() < 1e-6,
        "{reused} vs {recomputed}"
    );
    let r = finetune(&mut student, &teacher, &train, &settings, &job, pad).unwrap();
    assert_eq!(r.updates, 40);
    let after = kl_now(&student);
    assert!(after < 0.7 * before, "KL {before} → {after}");
    // Block 0 was frozen.
    for (name, t) in block0 {
        let now = student.param(&name).unwrap().as_tensor().clone();
        let d = (now - t).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0, "{name} changed");
    }
    // Scope::Above trains block 1 too when block 0 is replaced (and resumes a checkpoint).
    let ck = tmp.path().join("ck");
    let settings = DistillSettings {
        updates: 6,
        checkpoint_every: 2,
        scope: Scope::Above,
        ..settings
    };
    let job = FinetuneJob {
        blocks: 0..1,
        checkpoint_dir: Some(&ck),
        below_unchanged: false,
        ..job
    };
    let first = finetune(&mut student, &teacher, &train, &settings, &job, pad).unwrap();
    assert_eq!(first.resumed_from, None);
    // A checkpoint of update 4 is left (the last update writes none); a rerun continues it.
    let again = finetune(&mut student, &teacher, &train, &settings, &job, pad).unwrap();
    assert_eq!(again.resumed_from, Some(4));
}

#[test]
fn stages_and_hf_folders_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tiny(&tmp.path().join("m"), 6, &TinyShape::default());
    let (mut model, tokenizer) = load_trainable(&spec).unwrap();
    let v = substituted_decoder(
        DecoderBlockVariant::ORIGINAL,
        Operator::Silu,
        DecoderActivation::Relu,
    )
    .unwrap();
    model.set_variant(1, v).unwrap();
    // Change block 1's parameters.
    let changed: Vec<_> = model
        .values(|n| n.starts_with("layers.1."))
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, (t * 1.1).unwrap()))
        .collect();
    model
        .set_values(changed.iter().map(|(n, t)| (n, t)))
        .unwrap();
    let expected = logits(&model, &IDS);
    let stage = tmp.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    save_stage(&stage, &model, &spec, &[1].into_iter().collect()).unwrap();
    let (mut fresh, _) = load_trainable(&spec).unwrap();
    apply_stage(&stage, &mut fresh).unwrap();
    assert!(max_rel(&logits(&fresh, &IDS), &expected) < 1e-6);
    // The delta holds block 1 only.
    let delta =
        candle_core::safetensors::load(stage.join("delta.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    assert!(delta.keys().all(|k| k.starts_with("layers.1.")));
    // A Hugging Face folder reads back with its variants and weights.
    let hf = tmp.path().join("hf");
    write_hf_folder(&hf, &model, &tokenizer).unwrap();
    let (back, tok2) = load_trainable(&hf.display().to_string()).unwrap();
    assert_eq!(back.variants(), model.variants());
    assert!(max_rel(&logits(&back, &IDS), &expected) < 1e-6);
    assert!(tok2.has_chat_template());
    // A stage of another model is refused.
    let other = tiny(
        &tmp.path().join("o"),
        6,
        &TinyShape {
            layers: 3,
            ..TinyShape::default()
        },
    );
    let (mut three, _) = load_trainable(&other).unwrap();
    let err = apply_stage(&stage, &mut three).unwrap_err().to_string();
    assert!(err.contains("number of blocks"), "{err}");
}

#[test]
fn held_out_agreement_of_the_original_is_one() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tiny(tmp.path(), 7, &TinyShape::default());
    let (teacher, tokenizer) = load_trainable(&spec).unwrap();
    let sentences: Vec<String> = TRAIN.iter().map(|s| s.to_string()).collect();
    let held = sequences(&tokenizer, &sentences, 16, 2, 5).unwrap();
    assert!(held.len() <= 5);
    let h = HeldOut::new(&teacher, &held, &[], 2, pad_id(&teacher)).unwrap();
    let e = h.evaluate(&teacher).unwrap();
    assert_eq!(e.accuracy, 1.0);
    assert!((e.perplexity.unwrap() - h.teacher_perplexity).abs() < 1e-9);
    assert_eq!(e.max_abs_hidden.len(), 2);
}

/// Answers are the original's greedy continuations, kept and resumed from their file; a file
/// made for other inputs (or unreadable) is replaced; scored from the answers, the original
/// agrees with itself everywhere and a changed model does not.
#[test]
fn answered_chat_text_is_kept_resumed_and_scored_on_the_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = TinyShape {
        max_positions: 200,
        ..TinyShape::default()
    };
    let spec = tiny(&tmp.path().join("m"), 12, &shape);
    let (teacher, tokenizer) = load_trainable(&spec).unwrap();
    let sentences: Vec<String> = TRAIN.iter().map(|s| s.to_string()).collect();
    // The tiny tokenizer spends a token on about every character of the chat template.
    let prompts = chat_prompts(&tokenizer, &sentences, 3, 5, 170).unwrap();
    assert_eq!(prompts.len(), 5.min(sentences.len()));
    let len = prompts.iter().map(Vec::len).max().unwrap() + 6;
    let cache = tmp.path().join("answers.json");
    let all = answer_all(&teacher, 1, &prompts, len, &cache, false).unwrap();
    for (a, p) in all.iter().zip(&prompts) {
        assert_eq!(&a.ids[..a.prompt_len], &p[..]);
        let answer = &a.ids[a.prompt_len..];
        assert!(!answer.is_empty() && a.ids.len() <= len);
        assert_eq!(
            answer,
            super::questions::greedy(&teacher, p, len - p.len()).unwrap()
        );
    }
    // Resumed from a partial file: the same answers.
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    file["answers"].as_array_mut().unwrap().truncate(2);
    std::fs::write(&cache, serde_json::to_vec(&file).unwrap()).unwrap();
    assert_eq!(
        answer_all(&teacher, 1, &prompts, len, &cache, false).unwrap(),
        all
    );
    // Another model's (or a garbled) file is replaced, not trusted.
    file["answers"][0] = serde_json::json!([1, 2, 3]);
    std::fs::write(&cache, serde_json::to_vec(&file).unwrap()).unwrap();
    assert_eq!(
        answer_all(&teacher, 2, &prompts, len, &cache, false).unwrap(),
        all
    );
    std::fs::write(&cache, b"{not json").unwrap();
    assert_eq!(
        answer_all(&teacher, 1, &prompts, len, &cache, false).unwrap(),
        all
    );
    assert!(answer_all(&teacher, 1, &prompts, prompts[0].len(), &cache, false).is_err());
    // The user turns follow the templates in turn.
    let first = tokenizer.decode(&prompts[1]).unwrap();
    assert!(
        first.contains(TEMPLATES[1].split("{}").next().unwrap().trim()),
        "{first}"
    );

    let seqs: Vec<Vec<u32>> = all.iter().map(|a| a.ids.clone()).collect();
    let from: Vec<usize> = all.iter().map(|a| a.prompt_len - 1).collect();
    let h = HeldOut::new(&teacher, &seqs, &from, 2, pad_id(&teacher)).unwrap();
    let e = h.evaluate(&teacher).unwrap();
    assert_eq!(e.accuracy, 1.0);
    assert_eq!(
        e.examples,
        all.iter()
            .map(|a| a.ids.len() - a.prompt_len + 1)
            .sum::<usize>()
    );
    let mut student = load_trainable(&spec).unwrap().0;
    student
        .set_variant(
            1,
            substituted_decoder(
                DecoderBlockVariant::ORIGINAL,
                Operator::Softmax,
                DecoderActivation::Relu,
            )
            .unwrap(),
        )
        .unwrap();
    assert!(h.evaluate(&student).unwrap().accuracy < 1.0);
    // A scored position must leave a next token to predict.
    assert!(HeldOut::new(&teacher, &seqs, &[seqs[0].len() - 1; 5], 2, 0).is_err());
}

#[test]
fn workflow_runs_resumes_and_scores_questions() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = TinyShape {
        max_positions: 400,
        ..TinyShape::default()
    };
    let spec = tiny(&tmp.path().join("m"), 8, &shape);
    let train = text_file(tmp.path(), "train.txt", &TRAIN);
    let dev = text_file(tmp.path(), "dev.txt", &TRAIN[..4]);
    let out = tmp.path().join("out");
    let mut opts = DecoderSubstituteOptions::new(&spec, &out, vec![train], vec![dev]);
    // Answered chat text (the default): the tiny tokenizer's prompts are ~150 tokens.
    opts.seq_len = 340;
    opts.train_sequences = 6;
    opts.held_out_sequences = 4;
    opts.settings = DistillSettings {
        updates: 4,
        batch_size: 2,
        learning_rate: 1e-3,
        checkpoint_every: 2,
        ..DistillSettings::default()
    };
    opts.threshold = 0.0;
    opts.stop_after_steps = Some(1);
    match substitute_decoder(&opts).unwrap() {
        DecoderOutcome::Stopped {
            steps_done,
            total_steps,
        } => assert_eq!((steps_done, total_steps), (1, 4)),
        DecoderOutcome::Finished(_) => panic!("should have stopped"),
    }
    assert!(out.join("steps.md").is_file());
    assert!(
        out.join("answers-train.json").is_file() && out.join("answers-held-out.json").is_file()
    );
    // Other settings are refused against the saved progress.
    let mut other = opts.clone();
    other.settings.updates = 5;
    let err = substitute_decoder(&other).unwrap_err().to_string();
    assert!(err.contains("other options"), "{err}");
    opts.stop_after_steps = None;
    let DecoderOutcome::Finished(report) = substitute_decoder(&opts).unwrap() else {
        panic!("should have finished")
    };
    assert_eq!(report.steps.len(), 4);
    assert!(report.steps[0].resumed && !report.steps[1].resumed);
    assert!(report
        .steps
        .iter()
        .all(|s| s.accepted && s.perplexity.is_some()));
    // Top-down, SiLU then Softmax.
    let order: Vec<(Operator, usize)> =
        report.steps.iter().map(|s| (s.operator, s.block)).collect();
    assert_eq!(
        order,
        [
            (Operator::Silu, 1),
            (Operator::Silu, 0),
            (Operator::Softmax, 1),
            (Operator::Softmax, 0)
        ]
    );
    for f in [
        "substitution.json",
        "substitution.md",
        "config.json",
        "model.safetensors",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let (student, tokenizer, base) = super::load_scored(&out.display().to_string()).unwrap();
    assert!(student.variants().iter().all(|v| !v.is_original()));
    let (original, _) = load_trainable(&base.clone().unwrap()).unwrap();
    let questions = vec![
        "What is 2 plus 3?".to_string(),
        "Name a colour.".to_string(),
    ];
    let r = super::score_questions(
        (&student, "out"),
        (&original, "original"),
        &tokenizer,
        &questions,
        4,
    )
    .unwrap();
    assert_eq!(r.questions.len(), 2);
    let self_score = super::score_questions(
        (&original, "o"),
        (&original, "o"),
        &tokenizer,
        &questions,
        4,
    )
    .unwrap();
    assert_eq!(self_score.exact_match, 1.0);
    assert_eq!(self_score.first_token_agreement, 1.0);
    // A stage in one step: both blocks replaced, then fine-tuned once (answers reused).
    let grouped_out = tmp.path().join("grouped");
    std::fs::create_dir_all(&grouped_out).unwrap();
    for f in ["answers-train.json", "answers-held-out.json"] {
        std::fs::copy(out.join(f), grouped_out.join(f)).unwrap();
    }
    let grouped = DecoderSubstituteOptions {
        out: grouped_out.clone(),
        blocks_per_step: vec![2],
        ..opts.clone()
    };
    let DecoderOutcome::Finished(report) = substitute_decoder(&grouped).unwrap() else {
        panic!("should have finished")
    };
    let steps: Vec<(Operator, std::ops::Range<usize>)> = report
        .steps
        .iter()
        .map(|s| (s.operator, s.blocks()))
        .collect();
    assert_eq!(steps, [(Operator::Silu, 0..2), (Operator::Softmax, 0..2)]);
    assert_eq!(report.replaced(Operator::Softmax), 2);
    let (student, _, _) = super::load_scored(&grouped_out.display().to_string()).unwrap();
    assert!(student.variants().iter().all(|v| !v.is_original()));
    let md = std::fs::read_to_string(grouped_out.join("steps.md")).unwrap();
    assert!(md.contains("| 0–1 |"), "{md}");
}
