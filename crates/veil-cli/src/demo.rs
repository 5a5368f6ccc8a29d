//! `veil demo`, which runs a server and a client in one process over TCP loopback or, with
//! `--net`, over a link shaped like a network, and the printing of a classified prompt (shared
//! with `veil classify`). The client's pipeline itself is `veil_private::client`.

use std::sync::Arc;

use veil_core::{Error, Result};
use veil_model::source::{ModelSource, Task};
use veil_model::tokenize::Encoded;
use veil_model::Inputs;
use veil_net::{Channel, NetworkModel};
use veil_private::prepared::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::{
    Classification, Client, ClientModel, ClientOptions, LoopbackServer, PromptOptions, ServerModel,
};

use crate::prompt::Prompt;

fn print_result(prompt: &Prompt, c: &Classification, json: bool) {
    if json {
        let mut v = serde_json::json!({
            "text": prompt.text, "label": c.label, "probabilities": c.probabilities,
            "cost": c.cost.to_json(),
        });
        if let Some(second) = &prompt.pair {
            v["pair"] = second.as_str().into();
        }
        println!("{v}");
    } else {
        let p: Vec<String> = c.probabilities.iter().map(|p| format!("{p:.3}")).collect();
        println!(
            "\n{}\n  → label {}   probabilities [{}]",
            prompt.quoted(),
            c.label,
            p.join(", ")
        );
        print!("{}", c.cost.to_table());
    }
}

/// `veil demo`: a server thread and this process's client over TCP loopback, or over a link
/// shaped like `net` (the reports then measure the time on it).
pub fn run(
    model: &str,
    prompts: Vec<Prompt>,
    opts: PromptOptions,
    net: Option<NetworkModel>,
    tls: bool,
    json: bool,
    preprocess_ahead: usize,
) -> Result<()> {
    veil_core::ensure!(
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
    let source = ModelSource::resolve(model)?;
    let built_in = source.built_in();
    if let Some(b) = built_in {
        eprintln!(
            "veil demo: model {} = {}, run privately over {link}.",
            b.name, b.description
        );
    }
    // Given prompts of the wrong kind are refused before a built-in's tables are fetched.
    if let (Some(b), false) = (built_in, prompts.is_empty()) {
        crate::prompt::check_kind(Some(b.task.inputs()), &prompts)?;
    }
    let m = source.load()?;
    let client = ClientModel::from_model(&m)?;
    let prompts: Vec<Prompt> = if prompts.is_empty() {
        // A folder's examples follow what it was trained on: pairs when its config says so,
        // otherwise the sentiment sentences of the default model.
        let task = match (built_in, client.config().veil.inputs) {
            (Some(b), _) => b.task,
            (None, Some(Inputs::Pairs)) => Task::Paraphrase,
            (None, _) => Task::Sentiment,
        };
        task.demo_prompts()
            .iter()
            .map(|&(text, pair)| Prompt {
                text: text.into(),
                pair: pair.map(Into::into),
            })
            .collect()
    } else {
        prompts
    };
    crate::prompt::check_kind(client.config().veil.inputs, &prompts)?;
    // Refuse a bad option or prompt before the server is prepared or any key moves.
    client.check_options(opts)?;
    let encoded = prompts
        .iter()
        .map(|p| p.encode(&client, opts))
        .collect::<Result<Vec<_>>>()?;
    let limits = client.session_options(&encoded, opts, None);
    let server = Arc::new(ServerModel::from_model(&m, DEFAULT_NTT_BUDGET_BYTES)?);
    let run = Run {
        prompts: &prompts,
        encoded: &encoded,
        opts,
        limits,
        json,
        pipeline: Pipeline {
            ahead: preprocess_ahead,
            upfront: false,
        },
    };
    match net {
        None if tls => {
            let server = LoopbackServer::tls(server)?;
            run.on(client, server.tls_connector())?;
            server.stop()?;
        }
        None => {
            let server = LoopbackServer::plain(server)?;
            run.on(client, server.plain_connector())?;
            server.stop()?;
        }
        Some(net) => run.on(client, move || {
            veil_private::shaped_channel(server.clone(), net)
        })?,
    }
    if let (Some(b), false) = (built_in, json) {
        let labels: Vec<String> = b
            .task
            .labels()
            .iter()
            .enumerate()
            .map(|(i, l)| format!("{i} = {l}"))
            .collect();
        println!("\nlabels: {}", labels.join(", "));
    }
    Ok(())
}

/// The demo's prompts and how to run them, whatever the channel to the server.
struct Run<'a> {
    prompts: &'a [Prompt],
    encoded: &'a [Encoded],
    opts: PromptOptions,
    limits: ClientOptions,
    json: bool,
    pipeline: Pipeline,
}

impl Run<'_> {
    /// Classifies every prompt with a renewing client whose sessions `connect` opens.
    fn on<C: Channel>(
        &self,
        client: ClientModel,
        connect: impl FnMut() -> Result<C> + Send + 'static,
    ) -> Result<()> {
        let client = Client::connect_renewing(client, connect, self.opts, self.limits)?;
        classify_all(client, self.prompts, self.encoded, self.json, self.pipeline)
    }
}

/// How many prompts a session keeps preprocessed ahead of the one it classifies
/// (`--preprocess K`), and whether the first `ahead` are preprocessed before the first prompt
/// runs (`veil classify`) or the first prompt runs at once and each next one is preprocessed
/// while the current one is printed (`veil demo`).
#[derive(Clone, Copy, Debug)]
pub struct Pipeline {
    pub ahead: usize,
    pub upfront: bool,
}

/// Classifies and prints each prompt on one session, preprocessing as `pipeline` says, then
/// closes it. A server that refuses to preprocess more (its budget), or a model preprocessing
/// does not cover, is reported once; the rest run without.
pub fn classify_all<C: Channel>(
    mut client: Client<C>,
    prompts: &[Prompt],
    encoded: &[Encoded],
    json: bool,
    pipeline: Pipeline,
) -> Result<()> {
    let mut next = if pipeline.upfront { 0 } else { 1 };
    let mut refused = false;
    // A new session (the old one's keys spent) may take preprocessing again.
    let mut session = client.sessions();
    // Preprocesses prompts `from..upto` not yet preprocessed.
    let mut top_up = |client: &mut Client<C>, from: usize, upto: usize| -> Result<()> {
        if client.sessions() != session {
            session = client.sessions();
            refused = false;
        }
        next = next.max(from);
        while next < upto.min(encoded.len()) && !refused {
            match client.preprocess_for(&encoded[next]) {
                Ok(_) => next += 1,
                // Over the server's budget, or a model preprocessing does not cover (private
                // embeddings): said once, and the prompts still run.
                Err(Error::Refused(why) | Error::Unsupported(why)) => {
                    eprintln!("veil: {why}; the next prompts run without preprocessing");
                    refused = true;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    if pipeline.upfront {
        top_up(&mut client, 0, pipeline.ahead)?;
    }
    for (i, (prompt, enc)) in prompts.iter().zip(encoded).enumerate() {
        for c in client.classify_encoded(std::slice::from_ref(enc))? {
            print_result(prompt, &c, json);
        }
        if pipeline.ahead > 0 {
            top_up(&mut client, i + 1, i + 1 + pipeline.ahead)?;
        }
    }
    client.close()
}
