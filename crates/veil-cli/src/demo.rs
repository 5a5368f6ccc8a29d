//! `veil demo`, which runs a server and a client in one process over TCP loopback or, with
//! `--net`, over a link shaped like a network, and prints what `veil classify` prints
//! ([`crate::classify_cmd`]). The client's pipeline itself is `veil_private::client`.

use std::sync::Arc;

use veil_core::Result;
use veil_model::source::{ModelSource, Task};
use veil_model::Inputs;
use veil_net::{Channel, NetworkModel};
use veil_private::prepared::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::{
    Ahead, Client, ClientModel, ClientOptions, LoopbackServer, PromptOptions, ServerModel,
};

use crate::prompt::Prompt;

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
    let encoded = crate::prompt::check_and_encode(&client, &prompts, opts)?;
    let limits = client.session_options(&encoded, opts, None);
    let server = Arc::new(ServerModel::from_model(&m, DEFAULT_NTT_BUDGET_BYTES)?);
    let run = Run {
        prompts: &prompts,
        opts,
        limits,
        json,
        ahead: Ahead {
            prompts: preprocess_ahead,
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
    opts: PromptOptions,
    limits: ClientOptions,
    json: bool,
    ahead: Ahead,
}

impl Run<'_> {
    /// Classifies every prompt with a renewing client whose sessions `connect` opens.
    fn on<C: Channel>(
        &self,
        client: ClientModel,
        connect: impl FnMut() -> Result<C> + Send + 'static,
    ) -> Result<()> {
        let client = Client::connect_renewing(client, connect, self.opts, self.limits)?;
        crate::classify_cmd::classify_all(client, self.prompts, self.json, self.ahead)
    }
}
