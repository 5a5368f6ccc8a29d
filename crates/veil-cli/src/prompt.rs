//! The prompts `veil demo` and `veil classify` take: one text each, or with `--pairs` sentence
//! pairs (MRPC-style models), from arguments or a file.

use std::path::Path;

use veil_core::{bail, ensure, Error, Result};
use veil_model::Encoded;
use veil_model::Inputs;
use veil_private::{ClientModel, Input, PromptOptions};

/// One prompt: a text, or a sentence pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Prompt {
    pub(crate) text: String,
    pub(crate) pair: Option<String>,
}

impl Prompt {
    fn single(text: impl Into<String>) -> Self {
        Prompt {
            text: text.into(),
            pair: None,
        }
    }

    /// As the library's client takes it.
    pub(crate) fn input(&self) -> Input<'_> {
        match &self.pair {
            Some(second) => Input::Pair(&self.text, second),
            None => Input::Text(&self.text),
        }
    }

    /// For the printed result: `"text"`, or `"first" ‖ "second"`.
    pub(crate) fn quoted(&self) -> String {
        match &self.pair {
            Some(second) => format!("\"{}\" ‖ \"{second}\"", self.text),
            None => format!("\"{}\"", self.text),
        }
    }
}

/// Every prompt must be of the kind the model was trained on (`recorded`: its config's
/// `veil.inputs`, which encoding checks too), said here with the flag that changes it.
pub(crate) fn check_kind(recorded: Option<Inputs>, prompts: &[Prompt]) -> Result<()> {
    for p in prompts {
        let pairs = p.pair.is_some();
        if let Some(why) = Inputs::refusal(recorded, Inputs::of(pairs)) {
            let flag = if pairs { "leave out" } else { "pass" };
            bail!(InvalidArgument, "{why}: {flag} --pairs");
        }
    }
    Ok(())
}

/// The prompts of a command line: the `text` arguments, then the non-empty lines of `file`.
/// With `pairs`, the arguments are taken two at a time and each line is `FIRST<TAB>SECOND`.
pub(crate) fn read_prompts(
    text: Vec<String>,
    file: Option<&Path>,
    pairs: bool,
) -> Result<Vec<Prompt>> {
    let mut prompts = from_arguments(text, pairs)?;
    if let Some(f) = file {
        let body = std::fs::read_to_string(f).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(f.display().to_string()),
            _ => Error::Other(format!("{}: {e}", f.display())),
        })?;
        for (i, line) in body.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            prompts.push(if pairs {
                match line.split('\t').collect::<Vec<_>>()[..] {
                    [first, second] => Prompt {
                        text: first.to_string(),
                        pair: Some(second.to_string()),
                    },
                    _ => bail!(
                        InvalidArgument,
                        "{} line {}: with --pairs each line is FIRST<TAB>SECOND (one tab)",
                        f.display(),
                        i + 1
                    ),
                }
            } else {
                Prompt::single(line)
            });
        }
    }
    ensure!(
        !prompts.is_empty(),
        InvalidArgument,
        "nothing to classify: give text or --file"
    );
    Ok(prompts)
}

/// `text` as prompts: one each, or with `pairs` two at a time.
pub(crate) fn from_arguments(text: Vec<String>, pairs: bool) -> Result<Vec<Prompt>> {
    if !pairs {
        return Ok(text.into_iter().map(Prompt::single).collect());
    }
    ensure!(
        text.len().is_multiple_of(2),
        InvalidArgument,
        "--pairs takes the texts two at a time (first, second); {} were given",
        text.len()
    );
    let mut it = text.into_iter();
    let mut prompts = Vec::new();
    while let (Some(text), Some(second)) = (it.next(), it.next()) {
        prompts.push(Prompt {
            text,
            pair: Some(second),
        });
    }
    Ok(prompts)
}

/// Checks every prompt's kind and the options against the model, then encodes them all: done
/// before a server is prepared or a connection (and its key material) is made.
pub(crate) fn check_and_encode(
    client: &ClientModel,
    prompts: &[Prompt],
    opts: PromptOptions,
) -> Result<Vec<Encoded>> {
    check_kind(client.config().veil.inputs, prompts)?;
    client.check_options(opts)?;
    prompts
        .iter()
        .map(|p| client.encode(p.input(), opts))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_and_lines_become_single_prompts_or_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.txt");
        std::fs::write(&file, "c one\tc two\n\n d one\td two\n").unwrap();
        let got = read_prompts(strings(&["a", "b"]), Some(&file), true).unwrap();
        let pair = |a: &str, b: &str| Prompt {
            text: a.into(),
            pair: Some(b.into()),
        };
        assert_eq!(
            got,
            [
                pair("a", "b"),
                pair("c one", "c two"),
                pair(" d one", "d two")
            ]
        );
        assert_eq!(got[0].quoted(), "\"a\" ‖ \"b\"");

        let single = read_prompts(strings(&["a"]), Some(&file), false).unwrap();
        assert_eq!(single.len(), 3);
        assert_eq!(single[1], Prompt::single("c one\tc two"));
        assert_eq!(single[0].quoted(), "\"a\"");
    }

    /// A tiny classifier whose config records `inputs` (`None`: nothing recorded).
    fn client_trained_on(inputs: Option<&str>) -> ClientModel {
        let dir = tempfile::tempdir().unwrap();
        veil_model::random::write_tiny_classifier(dir.path(), 1, 2, 1).unwrap();
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if let Some(i) = inputs {
            config["veil"]["inputs"] = i.into();
        }
        std::fs::write(&path, config.to_string()).unwrap();
        ClientModel::open(dir.path()).unwrap()
    }

    #[test]
    fn prompts_must_be_of_the_kind_the_model_was_trained_on() {
        let sentence = [Prompt::single("a fine film")];
        let pair = from_arguments(strings(&["a", "b"]), true).unwrap();
        let (singles, pairs) = (
            client_trained_on(Some("single")),
            client_trained_on(Some("pairs")),
        );
        let kind = |c: &ClientModel| c.config().veil.inputs;
        check_kind(kind(&singles), &sentence).unwrap();
        check_kind(kind(&pairs), &pair).unwrap();
        let err = check_kind(kind(&pairs), &sentence).unwrap_err().to_string();
        assert!(
            err.contains("sentence pairs (first, second), not single texts: pass --pairs"),
            "{err}"
        );
        let err = check_kind(kind(&singles), &pair).unwrap_err().to_string();
        assert!(
            err.contains("not sentence pairs: leave out --pairs"),
            "{err}"
        );
        // Encoding refuses them too (the library and Python clients), token ids included.
        let opts = PromptOptions::default();
        assert!(pairs.encode(Input::Text("a fine film"), opts).is_err());
        assert!(pairs.encode(Input::Ids(&[2, 5, 3]), opts).is_err());
        assert!(singles.encode(Input::Pair("a", "b"), opts).is_err());
        pairs.encode(Input::Pair("a", "b"), opts).unwrap();
        // Nothing recorded: either kind.
        let unknown = client_trained_on(None);
        check_kind(kind(&unknown), &pair).unwrap();
        check_kind(kind(&unknown), &sentence).unwrap();
    }

    #[test]
    fn malformed_pairs_and_nothing_at_all_are_refused() {
        let err = |r: Result<Vec<Prompt>>| r.unwrap_err().to_string();
        assert!(err(from_arguments(strings(&["a", "b", "c"]), true)).contains("3 were given"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.txt");
        std::fs::write(&file, "a\tb\nno tab here\n").unwrap();
        assert!(err(read_prompts(vec![], Some(&file), true)).contains("line 2"));
        std::fs::write(&file, "a\tb\tc\n").unwrap();
        assert!(err(read_prompts(vec![], Some(&file), true)).contains("line 1"));
        assert!(err(read_prompts(vec![], None, false)).contains("nothing to classify"));
        assert!(err(read_prompts(vec![], Some(&dir.path().join("none")), false)).contains("none"));
    }
}
