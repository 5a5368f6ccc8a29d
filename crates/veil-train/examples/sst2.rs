//! Fine-tunes all-MiniLM-L6-v2 (or its first N blocks) on SST-2 and, optionally, runs the
//! substitution workflow on the result. Real runs, not tests: minutes to hours on a CPU.
//!
//! `cargo run --release -p veil-train --example sst2 -- finetune LAYERS EPOCHS OUT [STOP_AFTER]`
//! `cargo run --release -p veil-train --example sst2 -- substitute MODEL EPOCHS OUT`
//! `cargo run --release -p veil-train --example sst2 -- simulate MODEL EXAMPLES` (fixed-point check)
//! The SST-2 files are read from `$VEIL_SST2` (default `/work/shared/data/sst2`); `$VEIL_ALPHA1`
//! overrides the decay weight α1 of the loss (default: the paper's 0.1).

use std::path::PathBuf;
use std::time::Instant;

use veil_train::{finetune, substitute, DataOptions, FinetuneOptions, SubstituteOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: sst2 finetune LAYERS EPOCHS OUT [STOP_AFTER] | substitute MODEL EPOCHS OUT \
                 | simulate MODEL EXAMPLES";
    let sst2 = PathBuf::from(
        std::env::var("VEIL_SST2").unwrap_or_else(|_| "/work/shared/data/sst2".into()),
    );
    let data = DataOptions::new(sst2.join("stsa.binary.train"), sst2.join("stsa.binary.dev"));
    let alpha1: Option<f64> = std::env::var("VEIL_ALPHA1")
        .ok()
        .map(|a| a.parse())
        .transpose()?;
    let started = Instant::now();
    match args.first().map(String::as_str) {
        Some("finetune") if args.len() >= 4 => {
            let mut opts = FinetuneOptions::new(veil_model::fetch::minilm_l6()?, data, &args[3]);
            opts.num_layers = Some(args[1].parse()?);
            opts.train.epochs = args[2].parse()?;
            opts.stop_after = args.get(4).map(|s| s.parse()).transpose()?;
            if let Some(a) = alpha1 {
                opts.train.loss.alpha1 = a;
            }
            let out = finetune(&opts)?;
            println!(
                "{}",
                serde_json::json!({
                    "steps": out.summary.steps_done, "total_steps": out.summary.total_steps,
                    "resumed_from": out.summary.resumed_from, "mean_loss": out.summary.mean_loss,
                    "train_accuracy": out.summary.train_accuracy,
                    "dev_accuracy": out.dev.as_ref().map(|d| d.accuracy),
                    "max_abs_hidden": out.dev.as_ref().map(|d| d.max_abs_hidden.clone()),
                    "seconds": started.elapsed().as_secs_f64(),
                })
            );
        }
        Some("substitute") if args.len() == 4 => {
            let mut opts = SubstituteOptions::new(&args[1], data, &args[3]);
            opts.train.epochs = args[2].parse()?;
            if let Some(a) = alpha1 {
                opts.train.loss.alpha1 = a;
            }
            let out = substitute(&opts)?;
            println!("{}", serde_json::to_string(&out.report)?);
            println!("seconds {}", started.elapsed().as_secs_f64());
        }
        Some("simulate") if args.len() == 3 => {
            let dir = PathBuf::from(&args[1]);
            let record = veil_train::workflow::TrainingRecord::read(&dir)?
                .ok_or("the model folder has no veil-training.json")?;
            let (model, _) = veil_train::transformer::TrainableTransformer::load(
                &dir,
                record.labels.len(),
                None,
                0,
            )?;
            let tokenizer = veil_model::TextTokenizer::from_folder(&dir, 128)?;
            let format = veil_train::data::DatasetFormat::LabelSentenceLines;
            let dev = record
                .labels
                .apply(&veil_train::data::read_file(&data.dev, &format)?)?;
            let examples = dev
                .iter()
                .take(args[2].parse()?)
                .map(|e| {
                    let enc = tokenizer.encode(&e.text_a, e.text_b.as_deref())?;
                    Ok(veil_train::EncodedExample {
                        ids: enc.ids,
                        type_ids: enc.type_ids,
                        label: e.label as u32,
                    })
                })
                .collect::<veil_core::Result<Vec<_>>>()?;
            let check = veil_train::fixed_check::check_fixed_point(
                &model.transformer,
                &examples,
                veil_core::FixedPoint::default_format(),
            )?;
            println!("{}", serde_json::to_string(&check)?);
            println!("seconds {}", started.elapsed().as_secs_f64());
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
