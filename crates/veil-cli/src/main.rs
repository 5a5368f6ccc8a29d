//! The `veil` command: private transformer inference from the terminal.

#![forbid(unsafe_code)]

mod demo;
mod train_cmd;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use veil_core::{bail, Error, FixedPoint, Result};
use veil_model::random::Preset;
use veil_model::sim::FixedModel;
use veil_net::{NetworkModel, TcpChannel};
use veil_private::bench::Variant;
use veil_private::{ClientConnection, ServerModel};

#[derive(Parser)]
#[command(
    name = "veil",
    version,
    about = "Private transformer inference (BFV + OT, semi-honest 2PC)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Starts a server and a client over loopback and classifies a few sentences privately.
    Demo {
        /// A model folder with a classifier; default: the built-in SST-2 sentiment model
        /// (all-MiniLM-L6-v2 cut to 2 blocks, fine-tuned and made privacy-friendly; its public
        /// tables come from PyPI once).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Sentences to classify (default: a few built-in ones).
        sentences: Vec<String>,
        /// Pad every prompt to this many tokens so the server cannot learn its length
        /// (pooler-head models only).
        #[arg(long)]
        pad_to: Option<usize>,
        /// Classify the first tokens of a prompt longer than the model's limit (otherwise such
        /// a prompt is refused, with its token count).
        #[arg(long)]
        truncate: bool,
        /// Run over a link shaped like this network and report the time measured on it:
        /// lan (3 Gbps, 0.8 ms RTT), wan (100 Mbps, 80 ms RTT) or RATE,RTT such as 100M,80ms or
        /// 1G,10ms (RATE in bit/s with an optional k, M or G; RTT with a unit s, ms or us).
        /// Without it: loopback, with modelled LAN and WAN times.
        #[arg(long)]
        net: Option<NetworkModel>,
        #[arg(long)]
        json: bool,
    },
    /// Serves a model folder to private-inference clients.
    Serve {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: String,
        /// Memory for NTT-domain weights, in MiB: layers whose transformed weights fit are
        /// served without per-request weight transforms (short-prompt cuts first). The
        /// coefficient-form weights are kept regardless; nothing grows with prompt lengths.
        #[arg(long, default_value_t = veil_private::prepared::DEFAULT_NTT_BUDGET_BYTES >> 20)]
        ntt_budget_mib: usize,
    },
    /// Writes the client bundle of a model folder: config, tokenizer and (public-embedding
    /// mode) the public embedding tables, no weight of the server's. What `veil classify
    /// --model` needs on the client's machine.
    ExportClient {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Classifies text privately against a `veil serve` server. The client needs the model's
    /// public part in a local folder: a bundle from `veil export-client` (or the full folder).
    Classify {
        #[arg(long, default_value = "127.0.0.1:7878")]
        connect: String,
        #[arg(long)]
        model: PathBuf,
        /// One prompt per line.
        #[arg(long)]
        file: Option<PathBuf>,
        text: Vec<String>,
        /// Pad every prompt to this many tokens so the server cannot learn its length
        /// (pooler-head models only).
        #[arg(long)]
        pad_to: Option<usize>,
        /// Classify the first tokens of a prompt longer than the model's limit (otherwise such
        /// a prompt is refused, with its token count).
        #[arg(long)]
        truncate: bool,
        #[arg(long)]
        json: bool,
    },
    /// Fine-tunes a sequence classifier on CPU with the paper's bound loss.
    Finetune(train_cmd::FinetuneArgs),
    /// Algorithm 5: replaces GELU, Softmax and both LayerNorms block by block, keeping each change
    /// whose dev accuracy stays within --max-drop points of the original.
    Substitute(train_cmd::SubstituteArgs),
    /// Accuracy of a classifier in f32, in the fixed-point simulator and (--private N) in the real
    /// two-party protocol, with their agreement.
    Eval(train_cmd::EvalArgs),
    /// Benchmarks (release build; both parties on this machine over TCP loopback).
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// HE linear layers: BERT-Tiny and BERT-Base shapes.
    Linear {
        #[arg(long)]
        json: bool,
    },
    /// OT engine: base OT, IKNP, silent COT and derived flavours.
    Ot {
        #[arg(long)]
        json: bool,
    },
    /// Non-linear operators on BERT-Base-shaped inputs of one encoder layer.
    Nonlinear {
        #[arg(long)]
        json: bool,
        /// 1/16 of the element counts, for a quick look.
        #[arg(long)]
        quick: bool,
    },
    /// A whole private inference of a seeded random model of a paper shape.
    Model {
        #[arg(long, value_enum, default_value = "tiny")]
        shape: Shape,
        #[arg(long, value_enum, default_value = "substituted")]
        variant: VariantArg,
        #[arg(long, default_value_t = 128)]
        seq: usize,
        /// Run over a link shaped like this network and report the time measured on it:
        /// lan (3 Gbps, 0.8 ms RTT), wan (100 Mbps, 80 ms RTT) or RATE,RTT such as 100M,80ms or
        /// 1G,10ms (RATE in bit/s with an optional k, M or G; RTT with a unit s, ms or us).
        /// Without it: loopback, with modelled LAN and WAN times.
        #[arg(long)]
        net: Option<NetworkModel>,
        #[arg(long)]
        json: bool,
    },
    /// The extra cost of private-embedding mode: the embedding layer on shares (HE lookup of
    /// the private tables by private token ids, then the embedding LayerNorm).
    Embedding {
        #[arg(long, default_value_t = 768)]
        width: usize,
        /// onehot (one-hot × table) or pir (batch PIR, the default of `veil serve`).
        #[arg(long, default_value = "pir")]
        method: String,
        #[arg(long, default_value_t = 30522)]
        vocab: usize,
        #[arg(long, default_value_t = 128)]
        seq: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Shape {
    Tiny,
    Medium,
    Base,
}

#[derive(Clone, Copy, ValueEnum)]
enum VariantArg {
    Original,
    Substituted,
}

fn print_records(records: &[serde_json::Value], json: bool) {
    for r in records {
        if json {
            println!("{r}");
        } else {
            println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
        }
    }
}

fn load_server_model(dir: &Path, ntt_budget_bytes: usize) -> Result<ServerModel> {
    let model = veil_model::folder::load(dir)?;
    ServerModel::with_ntt_budget(
        FixedModel::encode(&model.transformer, FixedPoint::default_format())?,
        ntt_budget_bytes,
    )
}

fn bench(what: BenchCmd) -> Result<()> {
    match what {
        BenchCmd::Linear { json } => print_records(&veil_bench::linear::run()?, json),
        BenchCmd::Ot { json } => print_records(&veil_bench::ot::run()?, json),
        BenchCmd::Nonlinear { json, quick } => {
            let scale = if quick {
                veil_bench::nonlinear::Scale::Quick
            } else {
                veil_bench::nonlinear::Scale::Full
            };
            veil_bench::nonlinear::run_streaming(scale, None, &mut |v| {
                print_records(std::slice::from_ref(v), json)
            })?
        }
        BenchCmd::Embedding {
            width,
            method,
            vocab,
            seq,
            json,
        } => {
            let method = veil_linear::LookupMethod::parse(&method)?;
            let v = veil_private::bench::bench_embedding(vocab, width, seq, method)?;
            print_records(&[v], json);
        }
        BenchCmd::Model {
            shape,
            variant,
            seq,
            net,
            json,
        } => {
            let preset = match shape {
                Shape::Tiny => Preset::BertTiny,
                Shape::Medium => Preset::BertMedium,
                Shape::Base => Preset::RobertaBase,
            };
            let variant = match variant {
                VariantArg::Original => Variant::Original,
                VariantArg::Substituted => Variant::Substituted,
            };
            if json {
                println!(
                    "{}",
                    veil_private::bench::run_model_json(preset, variant, seq, net)?
                );
            } else {
                let (report, prep) = veil_private::bench::run_model(preset, variant, seq, net)?;
                println!("{} ({}), {seq} tokens; weight preparation {prep:.2} s (once per model and length)", preset.name(), variant.name());
                print!("{}", report.to_table());
            }
        }
    }
    Ok(())
}

fn classify(
    connect: &str,
    model: &Path,
    file: Option<&Path>,
    text: Vec<String>,
    opts: demo::PromptOptions,
    json: bool,
) -> Result<()> {
    let mut prompts = text;
    if let Some(f) = file {
        let body = std::fs::read_to_string(f)
            .map_err(|e| Error::Other(format!("{}: {e}", f.display())))?;
        prompts.extend(
            body.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if prompts.is_empty() {
        bail!(InvalidArgument, "nothing to classify: give text or --file");
    }
    let client = demo::ClientModel::load(model)?;
    // Every prompt is checked before the connection (and its key material) is made.
    let encoded = prompts
        .iter()
        .map(|p| client.encode_prompt(p, opts))
        .collect::<Result<Vec<_>>>()?;
    let mut conn = ClientConnection::connect(TcpChannel::connect(connect)?)?;
    client.check_matches(conn.config())?;
    for (p, enc) in prompts.iter().zip(&encoded) {
        let (probs, report) = client.classify(&mut conn, enc, opts)?;
        demo::print_result(p, &probs, &report, json);
    }
    conn.close()
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Demo {
            model,
            sentences,
            pad_to,
            truncate,
            net,
            json,
        } => demo::run(
            model.as_deref(),
            sentences,
            demo::PromptOptions { pad_to, truncate },
            net,
            json,
        ),
        Cmd::Serve {
            model,
            listen,
            ntt_budget_mib,
        } => {
            let server = Arc::new(load_server_model(&model, ntt_budget_mib << 20)?);
            let prepared = server.prepared();
            eprintln!(
                "veil serve: prepared weights {:.1} MiB, of which NTT-domain {:.1} MiB \
                 (budget {ntt_budget_mib} MiB); the same for every prompt length",
                prepared.prepared_bytes() as f64 / (1 << 20) as f64,
                prepared.ntt_cached_bytes()? as f64 / (1 << 20) as f64,
            );
            let listener = TcpListener::bind(&listen)?;
            eprintln!(
                "veil serve: {} on {}",
                model.display(),
                listener.local_addr()?
            );
            veil_private::serve(listener, server)
        }
        Cmd::Classify {
            connect,
            model,
            file,
            text,
            pad_to,
            truncate,
            json,
        } => classify(
            &connect,
            &model,
            file.as_deref(),
            text,
            demo::PromptOptions { pad_to, truncate },
            json,
        ),
        Cmd::ExportClient { model, out } => {
            let m = veil_model::folder::load(&model)?;
            veil_model::client::save_bundle(&m, &out)?;
            eprintln!(
                "veil export-client: wrote {} (config, tokenizer{})",
                out.display(),
                if m.config.veil.embedding == veil_model::EmbeddingMode::Public {
                    ", public embedding tables"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Cmd::Finetune(a) => train_cmd::finetune(a),
        Cmd::Substitute(a) => train_cmd::substitute(a),
        Cmd::Eval(a) => train_cmd::eval(a),
        Cmd::Bench { what } => bench(what),
    }
}

fn main() {
    veil_core::process::keep_freed_memory();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("veil: {e}");
        std::process::exit(1);
    }
}
