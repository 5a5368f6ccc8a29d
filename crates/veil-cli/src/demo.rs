//! `veil demo`, which runs a server and a client in one process over TCP loopback or, with
//! `--net`, over a link shaped like a network, and prints what `veil classify` prints
//! ([`crate::classify_cmd`]). The client's pipeline itself is `veil_private::Client`.

use std::sync::Arc;

use veil_core::Result;
use veil_model::source::{ModelSource, Task};
use veil_model::Inputs;
use veil_net::NetworkModel;
use veil_private::{Ahead, Client, ClientModel, Link, Loopback, PromptOptions, ServerModel};

use crate::prompt::Prompt;

/// `veil demo`: a server thread and this process's client over TCP loopback, or over a link
/// shaped like `net` (the reports then measure the time on it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    model: &str,
    prompts: Vec<Prompt>,
    opts: PromptOptions,
    net: Option<NetworkModel>,
    tls: bool,
    json: bool,
    preprocess_ahead: usize,
    ntt_budget: usize,
) -> Result<()> {
    let link = Link::new(net, tls)?;
    let plain = if tls {
        "TLS 1.3 on TCP loopback"
    } else {
        "TCP loopback"
    };
    let over = net.map_or(plain.to_string(), |n| format!("a link shaped like {n}"));
    let source = ModelSource::resolve(model)?;
    let built_in = source.built_in();
    if let Some(b) = built_in {
        eprintln!(
            "veil demo: model {} = {}, run privately over {over}.",
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
    let encoded = crate::prompt::check_and_encode(&client, &prompts, opts)?;
    let limits = client.session_options(&encoded, opts, None);
    let server = Arc::new(ServerModel::from_model(&m, ntt_budget)?);
    // Both parties hold their own forms of the weights now: the loaded model's f32 layers (the
    // client keeps only its tables) need not stay for the prompts (heap peak −9 MB).
    drop(m);
    let server = Loopback::start(server, link)?;
    let session = Client::connect_renewing(client, server.connector(), opts, limits)?;
    let ahead = Ahead {
        prompts: preprocess_ahead,
        upfront: false,
    };
    crate::classify_cmd::classify_all(session, &prompts, json, ahead)?;
    server.stop()?;
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
