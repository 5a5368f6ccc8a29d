//! `veil eval`: accuracy of the f32 model, the fixed-point simulator and, for `--private N`
//! examples, the real two-party protocol, with how often they agree and how far the private
//! logits are from the simulator's. The f32 and fixed-point passes run the examples in parallel
//! on the worker pool (`VEIL_THREADS`); the private ones run one after another, each using the
//! pool for its own batches. A long private evaluation (all 872 SST-2 dev sentences take one to
//! three hours on two cores) keeps a journal (`--journal FILE`): each private result is appended
//! and flushed as it finishes, and a re-run of the same command resumes after the last.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use veil_core::parallel::parallel_map;
use veil_core::{ensure, Error, FixedPoint, Result};
use veil_model::source::ModelSource;
use veil_model::Encoded;
use veil_private::argmax;
use veil_private::eval::{
    gap_histogram, gap_quantiles, Journal, JournalHeader, PrivateResult, Tally,
};
use veil_private::{ClientModel, InProcess, PromptOptions};
use veil_train::workflow::labelled_examples_for;
use veil_train::{max_abs_difference, EncodedExample, FixedVsF32};

use crate::train_cmd::FormatArgs;

#[derive(Args)]
pub(crate) struct EvalArgs {
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

/// One example's f32 and fixed-point logits and the simulator's warning count: all that the
/// report keeps of its two plain passes.
#[derive(Debug, PartialEq)]
struct Plain {
    f32: Vec<f64>,
    fixed: Vec<f64>,
    warnings: usize,
}

/// The f32 and fixed-point passes of one example.
fn plain_pass(compare: &FixedVsF32, ex: &EncodedExample) -> Result<Plain> {
    let side = compare.run(&ex.ids, &ex.type_ids)?;
    Ok(Plain {
        f32: side.f32_output()?,
        fixed: side
            .fixed_logits()
            .ok_or_else(|| Error::InvalidArgument("the model has no classifier".into()))?,
        warnings: side.sim.warnings.len(),
    })
}

/// [`plain_pass`] of every example on the process's worker pool (`VEIL_THREADS`), results in
/// example order, so the report is the same whatever the thread count. A job keeps only its
/// example's logits and drops its tensors, so memory grows with the worker count, not with the
/// number of examples.
fn plain_passes(compare: &FixedVsF32, examples: &[EncodedExample]) -> Result<Vec<Plain>> {
    let pb = veil_model::progress::bar(examples.len() as u64, "f32 and fixed point");
    let plain = parallel_map(examples.len(), |i, _| {
        let p = plain_pass(compare, &examples[i])?;
        pb.inc(1);
        Ok(p)
    })?;
    pb.finish_and_clear();
    Ok(plain)
}

/// `veil eval`.
pub(crate) fn eval(a: EvalArgs) -> Result<()> {
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
    let compare = FixedVsF32::new(&model.transformer, fp)?;
    let private_n = a.private.min(examples.len());
    let mut journal = match &a.journal {
        Some(path) => Some(Journal::open(
            path,
            &JournalHeader::new(&a.model, &a.data, private_n),
        )?),
        None => None,
    };
    let resumed = journal.as_ref().map_or(0, Journal::len);
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
    let plain = plain_passes(&compare, &examples)?;
    let pb = veil_model::progress::bar(private_n as u64, "private");
    for (i, (ex, p)) in examples.iter().zip(plain).enumerate() {
        let Plain {
            f32: f,
            fixed: s,
            warnings,
        } = p;
        sim_warnings += warnings;
        f32_tally.add(argmax(&f), ex.label);
        sim_tally.add(argmax(&s), ex.label);
        agree_f32_sim += (argmax(&f) == argmax(&s)) as usize;
        if i >= private_n {
            continue;
        }
        pb.inc(1);
        let known = journal.as_ref().and_then(|j| j.get(i).cloned());
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
    use veil_model::{random, Architecture, ModelConfig};

    /// The pool's passes equal the examples run one after another on this thread, bit for bit
    /// and in example order. The examples' lengths differ (3 to 16 tokens), so their jobs end
    /// out of order on two or more workers.
    #[test]
    fn pool_passes_equal_a_sequential_run_in_example_order() {
        let cfg = ModelConfig::builder(Architecture::Bert)
            .vocab(random::TINY_WORDS.len())
            .layers(2)
            .labels(2)
            .build()
            .unwrap();
        let model = random::random_transformer_with_std(&cfg, [11; 16], 0.2).unwrap();
        let compare = FixedVsF32::new(&model, FixedPoint::default_format()).unwrap();
        let examples: Vec<EncodedExample> = (0..24u32)
            .map(|i| {
                let len = 3 + (i * 5 % 14) as usize;
                let mut ids: Vec<u32> = (0..len as u32).map(|j| 5 + (i + j * 3) % 6).collect();
                (ids[0], ids[len - 1]) = (2, 3);
                EncodedExample {
                    type_ids: vec![0; len],
                    ids,
                    label: i % 2,
                }
            })
            .collect();
        let pooled = plain_passes(&compare, &examples).unwrap();
        let sequential: Vec<Plain> = examples
            .iter()
            .map(|ex| plain_pass(&compare, ex).unwrap())
            .collect();
        assert_eq!(pooled, sequential);
        // Distinct examples give distinct logits: a reordering would show.
        let mut logits: Vec<String> = pooled.iter().map(|p| format!("{:?}", p.f32)).collect();
        logits.sort();
        logits.dedup();
        assert!(logits.len() > 12, "{logits:?}");
    }
}
