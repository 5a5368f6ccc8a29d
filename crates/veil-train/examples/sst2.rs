//! Fine-tunes all-MiniLM-L6-v2 (or its first N blocks) on SST-2 and, optionally, runs the
//! substitution workflow on the result. Real runs, not tests: minutes to hours on a CPU.
//!
//! `cargo run --release -p veil-train --example sst2 -- finetune LAYERS EPOCHS OUT [STOP_AFTER]`
//! `cargo run --release -p veil-train --example sst2 -- substitute MODEL EPOCHS OUT`
//! `cargo run --release -p veil-train --example sst2 -- simulate MODEL EXAMPLES` (fixed-point check)
//! The SST-2 files are read from `$VEIL_SST2` (default: the project's shared copy,
//! `veil_model::data::shared_dataset("sst2")`); `$VEIL_ALPHA1`
//! overrides the decay weight α1 of the loss (default: the paper's 0.1).

use std::path::PathBuf;
use std::time::Instant;

use veil_model::data::{shared_dataset, DatasetFormat};
use veil_train::workflow::labelled_examples;
use veil_train::{
    finetune, substitute, DataOptions, FinetuneOptions, SubstituteOptions, SubstituteOutcome,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: sst2 finetune LAYERS EPOCHS OUT [STOP_AFTER] | substitute MODEL EPOCHS OUT \
                 | simulate MODEL EXAMPLES";
    let sst2 = match std::env::var_os("VEIL_SST2") {
        Some(dir) => PathBuf::from(dir),
        None => shared_dataset("sst2")?,
    };
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
            match substitute(&opts)? {
                SubstituteOutcome::Finished(report) => {
                    println!("{}", serde_json::to_string(&report)?)
                }
                SubstituteOutcome::Stopped {
                    steps_done,
                    total_steps,
                } => println!("stopped after {steps_done} of {total_steps} steps"),
            }
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
            let (_, mut examples) = labelled_examples(
                &dir,
                &data.dev,
                Some(DatasetFormat::LabelSentenceLines),
                128,
            )?;
            examples.truncate(args[2].parse()?);
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
