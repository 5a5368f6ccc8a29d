//! `veil classify` (a client of a remote server) and the printing of each classified prompt,
//! which `veil demo` shares.

use veil_core::Result;
use veil_model::source::ModelSource;
use veil_net::Channel;
use veil_private::{Ahead, Classification, Client, ClientModel, PromptOptions};

use crate::prompt::Prompt;

/// `veil classify`: every prompt checked before the connection, then classified on a
/// renewing client, `--preprocess K` ahead.
pub(crate) fn classify(
    connect: &str,
    model: &str,
    prompts: Vec<Prompt>,
    opts: PromptOptions,
    preprocess_ahead: usize,
    json: bool,
    net: &crate::ClientNetArgs,
) -> Result<()> {
    let timeout = crate::secs(net.timeout, "--timeout")?;
    let transport = net.transport()?;
    // A built-in model's kind is known before its public tables are fetched (on first use).
    // Resolved once: resolving a PyPI encoder's name verifies its cached files.
    let source = ModelSource::resolve(model)?;
    if let Some(b) = source.built_in() {
        crate::prompt::check_kind(Some(b.task.inputs()), &prompts)?;
    }
    let client = ClientModel::from_source(&source)?;
    let encoded = crate::prompt::check_and_encode(&client, &prompts, opts)?;
    let limits = client.session_options(&encoded, opts, Some(timeout));
    // The server's configuration is compared with the bundle before any key material moves;
    // a long run continues on new sessions as each one's keys are spent.
    let addr = connect.to_string();
    let client = Client::connect_renewing(client, move || transport.connect(&addr), opts, limits)?;
    let ahead = Ahead {
        prompts: preprocess_ahead,
        upfront: true,
    };
    classify_all(client, &prompts, json, ahead)
}

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

/// Classifies and prints each prompt on one series of sessions, preprocessing as `ahead`
/// says (the policy is the library's, [`Client::classify_ahead`]), then closes it.
pub(crate) fn classify_all<C: Channel>(
    mut client: Client<C>,
    prompts: &[Prompt],
    json: bool,
    ahead: Ahead,
) -> Result<()> {
    let inputs: Vec<_> = prompts.iter().map(Prompt::input).collect();
    client.classify_ahead(&inputs, ahead, |i, c| {
        print_result(&prompts[i], &c, json);
        Ok(())
    })?;
    client.close()
}
