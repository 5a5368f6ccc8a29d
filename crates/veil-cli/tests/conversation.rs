//! `veil chat` and `veil proxy` end to end, in the fixed-point simulator on a tiny random Llama.
//! `veil chat`: the second turn, run on the KV cache kept from the first, equals a fresh run on
//! the whole conversation.
//! `veil proxy` over raw HTTP: its answers (whole and streamed) are `veil generate`'s tokens for the same seed, a
//! conversation that extends the previous one (answered from the kept KV cache) equals a fresh
//! run on the whole prompt, and every bad request gets its OpenAI error object and status while
//! the proxy keeps answering.
//! `veil serve` of the same decoder folder and `veil generate --connect`: private generation's
//! tokens are the simulator's, client after client; with `--preprocess` (each decode step
//! preprocessed just before it) `veil generate`, a two-turn `veil chat` on its kept cache and
//! `veil proxy --connect` give the simulator's tokens too; `veil demo` of the decoder
//! (`--preprocess 1`) answers one question privately as the simulator does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use veil_model::decoder::{self, random::TinyShape, sample::SamplingParams, ChatMessage};
use veil_model::{generate, DecoderFormat, FixedDecoder, GenerateOptions};

/// A running `veil proxy`, killed when dropped.
struct Proxy {
    _process: Killed,
    addr: String,
}

/// A child process, killed when dropped (however the test ends).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `veil proxy` of the model in `dir` on `engine` (`--simulate`, or `--connect` and its flags).
fn start(dir: &Path, engine: &[&str]) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["proxy", "--model", dir.to_str().unwrap()])
        .args(engine)
        .args(["--listen", "127.0.0.1:0", "--served-name", "tiny-llama"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("the veil binary runs");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the proxy says where it listens")
            .unwrap();
        if let Some(rest) = line.split("at http://").nth(1) {
            break rest.trim_end_matches("/v1").to_owned();
        }
    };
    // Keep reading its stderr so the proxy never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Proxy {
        _process: Killed(child),
        addr,
    }
}

/// One HTTP/1.1 exchange: the status and the body (read to the connection's close).
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    // A body the proxy refuses by its length may be cut short by the proxy's answer.
    let _ = s.write_all(body);
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    )
}

/// The data of a chunked body, which must end with the empty chunk.
fn dechunk(mut body: &str) -> String {
    let mut data = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size, 16).expect("a hexadecimal chunk size");
        if size == 0 {
            assert_eq!(rest, "\r\n", "nothing after the last chunk");
            return data;
        }
        data.push_str(&rest[..size]);
        body = rest[size..]
            .strip_prefix("\r\n")
            .expect("CRLF after a chunk");
    }
}

fn post(addr: &str, request: &Value) -> (u16, String) {
    http(
        addr,
        "POST",
        "/v1/chat/completions",
        request.to_string().as_bytes(),
    )
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The streamed events' data, `[DONE]` last.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// The greedy or seeded answer of the simulator to `messages` in the chat template, as text.
fn simulated(dir: &Path, messages: &[ChatMessage], max: usize, sampling: SamplingParams) -> String {
    let model = decoder::load(dir.to_str().unwrap()).unwrap();
    let text = model.tokenizer.render_chat(messages, true).unwrap();
    let ids = model.tokenizer.encode(&text).unwrap();
    let fixed = FixedDecoder::encode(&model.weights, DecoderFormat::default()).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: max,
        sampling,
        stop: model.weights.config.eos_token_ids.clone(),
        fixed_length: false,
        pad_to: None,
    };
    let (tokens, _) = generate(&mut fixed.session(), &ids, &opts, |_| Ok(())).unwrap();
    let tokens: Vec<u32> = tokens.iter().map(|t| t.id).collect();
    model.tokenizer.decode(&tokens).unwrap()
}

/// The simulator's greedy tokens after `ids` on the model in `dir`, when none of its steps has
/// a near-tie (top two logits within twice the default truncations' reach): then a private
/// generation must give exactly these.
fn sure(dir: &Path, ids: &[u32], max: usize) -> Option<Vec<u32>> {
    let model = decoder::load(dir.to_str().unwrap()).unwrap();
    let fixed = FixedDecoder::encode(&model.weights, DecoderFormat::default()).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: max,
        sampling: SamplingParams::GREEDY,
        stop: model.weights.config.eos_token_ids.clone(),
        fixed_length: false,
        pad_to: None,
    };
    let (tokens, _) = generate(&mut fixed.session(), ids, &opts, |_| Ok(())).unwrap();
    let near_tie = tokens
        .iter()
        .any(|t| f64::from(t.margin) <= 2.0 * ONE_BIT_ERROR_BOUND);
    (!near_tie).then(|| tokens.iter().map(|t| t.id).collect())
}

/// Questions to search for answers without a near-tie (the model and the simulator are
/// deterministic, so the search finds the same ones every run).
const QUESTIONS: [&str; 7] = [
    "good film",
    "a bad film",
    "great",
    "the film",
    "awful",
    "good",
    "bad",
];

/// A tiny random Llama with room for the chat template's default system line (its tokens are
/// mostly single bytes).
fn tiny_llama(dir: &Path) {
    let shape = TinyShape {
        max_positions: 256,
        ..TinyShape::default()
    };
    decoder::random::write_tiny_llama(dir, 7, &shape).unwrap();
}

#[test]
fn answers_equal_veil_generate_whole_streamed_and_from_the_kept_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama");
    tiny_llama(&dir);
    let p = start(&dir, &["--simulate"]);

    let (status, body) = http(&p.addr, "GET", "/v1/models", b"");
    assert_eq!(status, 200);
    assert_eq!(json_of(&body)["data"][0]["id"], "tiny-llama");
    let (status, body) = http(&p.addr, "GET", "/v1/models/tiny-llama", b"");
    assert_eq!(
        (status, json_of(&body)["id"].clone()),
        (200, json!("tiny-llama"))
    );

    // `veil generate --chat` with the same seed and temperature gives the same text.
    let generated = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args([
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--simulate",
            "--chat",
        ])
        .args(["--json", "--max-new-tokens", "8", "--temperature", "0.9"])
        .args(["--seed", "11", "good film"])
        .output()
        .unwrap();
    assert!(generated.status.success());
    let generated = json_of(&String::from_utf8(generated.stdout).unwrap());
    let request = json!({
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "good film"}],
        "max_tokens": 8,
        "temperature": 0.9,
        "seed": 11,
    });
    let (status, body) = post(&p.addr, &request);
    assert_eq!(status, 200, "{body}");
    let whole = json_of(&body);
    let answer = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(answer, generated["text"].as_str().unwrap());
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(
        whole["usage"]["prompt_tokens"], generated["prompt_tokens"],
        "{whole}"
    );
    let tokens = generated["token_ids"].as_array().unwrap().len();
    assert_eq!(whole["usage"]["completion_tokens"], tokens);
    let finish = if generated["stopped"] == true {
        "stop"
    } else {
        "length"
    };
    assert_eq!(whole["choices"][0]["finish_reason"], finish);

    // Streamed: a role chunk, the text in pieces, the finish reason, usage, then [DONE].
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, body) = post(&p.addr, &streamed);
    assert_eq!(status, 200);
    let ev = events(&body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| json_of(e)).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, answer);
    let last = &chunks[chunks.len() - 2];
    assert_eq!(last["choices"][0]["finish_reason"], finish);
    assert_eq!(
        chunks[chunks.len() - 1]["usage"]["completion_tokens"],
        tokens
    );

    // A conversation that extends the previous one runs on the kept cache and equals a fresh
    // simulator run on the whole prompt (greedy).
    let first = vec![ChatMessage::new("user", "good")];
    let greedy = json!({"model": "tiny-llama", "max_tokens": 4, "temperature": 0});
    let mut r1 = greedy.clone();
    r1["messages"] = json!([{"role": "user", "content": "good"}]);
    let (_, body) = post(&p.addr, &r1);
    let a1 = json_of(&body)["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(a1, simulated(&dir, &first, 4, SamplingParams::GREEDY));
    let mut second = first.clone();
    second.push(ChatMessage::new("assistant", &a1));
    second.push(ChatMessage::new("user", "bad"));
    let mut r2 = greedy.clone();
    r2["messages"] = json!([
        {"role": "user", "content": "good"},
        {"role": "assistant", "content": a1},
        {"role": "user", "content": [{"type": "text", "text": "bad"}]},
    ]);
    let (status, body) = post(&p.addr, &r2);
    assert_eq!(status, 200, "{body}");
    let a2 = json_of(&body);
    assert_eq!(
        a2["choices"][0]["message"]["content"],
        simulated(&dir, &second, 4, SamplingParams::GREEDY)
    );
    let cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = a2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt, "{a2}");
}

#[test]
fn bad_requests_get_openai_errors_and_the_proxy_keeps_answering() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama");
    tiny_llama(&dir);
    let p = start(&dir, &["--simulate"]);
    let good = json!({
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "good film"}],
        "max_tokens": 2,
    });
    let with = |field: &str, value: Value| {
        let mut r = good.clone();
        r[field] = value;
        r
    };
    let cases: Vec<(Vec<u8>, u16, &str, Option<&str>)> = vec![
        (b"{not json".to_vec(), 400, "invalid_json", None),
        (b"[1, 2]".to_vec(), 400, "invalid_json", None),
        (
            with("model", json!("gpt-4")).to_string().into_bytes(),
            404,
            "model_not_found",
            None,
        ),
        (
            with("max_tokens", json!(100_000)).to_string().into_bytes(),
            400,
            "context_length_exceeded",
            Some("messages"),
        ),
        (
            with("n", json!(2)).to_string().into_bytes(),
            400,
            "unsupported_parameter",
            Some("n"),
        ),
        (
            with("tools", json!([{"type": "function"}]))
                .to_string()
                .into_bytes(),
            400,
            "unsupported_parameter",
            Some("tools"),
        ),
        (
            with("foo", json!(1)).to_string().into_bytes(),
            400,
            "unknown_parameter",
            Some("foo"),
        ),
        (
            with("temperature", json!(3)).to_string().into_bytes(),
            400,
            "invalid_value",
            Some("temperature"),
        ),
        (
            with("max_tokens", json!(-1)).to_string().into_bytes(),
            400,
            "invalid_type",
            Some("max_tokens"),
        ),
        (
            with("messages", json!([])).to_string().into_bytes(),
            400,
            "empty_array",
            Some("messages"),
        ),
        (
            with("messages", json!([{"role": "tool", "content": "x"}]))
                .to_string()
                .into_bytes(),
            400,
            "invalid_value",
            Some("messages[0].role"),
        ),
        (vec![b' '; (1 << 20) + 1], 413, "request_too_large", None),
    ];
    for (body, status, code, param) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (got, answer) = http(&p.addr, "POST", "/v1/chat/completions", &body);
        assert_eq!(got, status, "{shown}: {answer}");
        let e = json_of(&answer);
        assert_eq!(e["error"]["code"], code, "{shown}: {answer}");
        assert!(e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        if let Some(param) = param {
            assert_eq!(e["error"]["param"], param, "{shown}: {answer}");
        }
    }
    let (status, body) = http(&p.addr, "GET", "/v1/chat/completions", b"");
    assert_eq!(
        (status, json_of(&body)["error"]["code"].clone()),
        (405, json!("method_not_allowed"))
    );
    let (status, body) = http(&p.addr, "GET", "/v1/nope", b"");
    assert_eq!(
        (status, json_of(&body)["error"]["code"].clone()),
        (404, json!("unknown_url"))
    );
    // Off values of unsupported fields are accepted, and the proxy still answers.
    let mut fine = with("n", json!(1));
    fine["presence_penalty"] = json!(0);
    fine["stop"] = Value::Null;
    fine["user"] = json!("me");
    let (status, body) = post(&p.addr, &fine);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["choices"][0]["message"]["role"], "assistant");
}

#[test]
fn a_busy_port_is_refused_before_the_model_is_loaded() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    // The model does not exist: the port is checked first.
    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args([
            "proxy",
            "--model",
            "/nonexistent/model",
            "--f32",
            "--listen",
            &addr,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

#[test]
fn chat_keeps_the_cache_across_turns_and_answers_as_a_fresh_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama");
    tiny_llama(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["chat", "--model", dir.to_str().unwrap(), "--simulate"])
        .args(["--max-new-tokens", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"good\nbad\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let answers: Vec<&str> = std::str::from_utf8(&out.stdout)
        .unwrap()
        .split('\n')
        .collect();
    let first = vec![ChatMessage::new("user", "good")];
    assert_eq!(
        answers[0],
        simulated(&dir, &first, 4, SamplingParams::GREEDY)
    );
    let mut second = first.clone();
    second.push(ChatMessage::new("assistant", answers[0]));
    second.push(ChatMessage::new("user", "bad"));
    assert_eq!(
        answers[1],
        simulated(&dir, &second, 4, SamplingParams::GREEDY)
    );
    // The second turn's report: some, not all, of its prompt came from the cache.
    let reused: Vec<(usize, usize)> = err
        .lines()
        .filter_map(|l| {
            let (a, b) = l
                .split_once(" prompt tokens from the cache")?
                .0
                .rsplit_once("; ")?
                .1
                .split_once(" of ")?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    assert_eq!(reused.len(), 2, "{err}");
    assert_eq!(reused[0].0, 0);
    assert!(reused[1].0 > 0 && reused[1].0 < reused[1].1, "{err}");
}

/// How far the default truncations may move a logit (`decoder_party.rs`'s bound).
const ONE_BIT_ERROR_BOUND: f64 = 0.02;

/// `veil serve --insecure-plaintext` of the model in `dir` (and `extra` flags) on a free loopback
/// port, once it listens; killed when dropped.
fn serve_tiny(dir: &str, extra: &[&str]) -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let server = Killed(
        Command::new(env!("CARGO_BIN_EXE_veil"))
            .args(["serve", "--model", dir, "--listen", &addr])
            .args(extra)
            .arg("--insecure-plaintext")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while TcpStream::connect(&addr).is_err() {
        assert!(std::time::Instant::now() < deadline, "never listened");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (server, addr)
}

/// `veil generate --chat --json --max-new-tokens 4 "good film"` of the model in `dir` on
/// `engine`.
fn generate_json(dir: &str, engine: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["generate", "--model", dir])
        .args(engine)
        .args(["--chat", "--json", "--max-new-tokens", "4", "good film"])
        .output()
        .unwrap()
}

/// The token ids and top-2 margins of [`generate_json`]'s report.
fn ids_and_margins(out: &std::process::Output) -> (Vec<u32>, Vec<f64>) {
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = |k: &str| report[k].as_array().unwrap().clone();
    (
        list("token_ids")
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect(),
        list("margins")
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect(),
    )
}

/// `veil serve` of a decoder folder, and `veil generate --connect` to it: the private tokens are
/// the simulator's up to the first step whose top-2 margin is within twice the server's default
/// 1-bit-error bound (where the truncations may pick either), and the server serves the next
/// clients as well (with `--fixed-length`, whose step count `veil_model`'s tests check, and
/// with `--pad-to`); then
/// [`preprocessing_changes_no_token`] on the same server, `veil proxy --connect` among them.
#[test]
fn private_generation_through_veil_serve_equals_the_simulator() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_llama(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let (_server, addr) = serve_tiny(dir, &[]);
    let tokens = |engine: &[&str]| {
        let out = generate_json(dir, engine);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{engine:?}: {err}");
        ids_and_margins(&out)
    };
    let (expected, margins) = tokens(&["--simulate"]);
    assert_eq!(expected.len(), 4);
    let private = ["--connect", &addr, "--insecure-plaintext"];
    let fixed = ["--connect", &addr, "--insecure-plaintext", "--fixed-length"];
    // The prompt (98 tokens) padded to 128 positions (the server sees 128): the rotary
    // tables' rounding at the shifted positions moves a logit by far less than the
    // truncations' bound.
    let padded = [
        "--connect",
        &addr,
        "--insecure-plaintext",
        "--pad-to",
        "128",
    ];
    for (client, engine) in [
        ("first", &private[..]),
        ("second", &fixed[..]),
        ("padded", &padded[..]),
    ] {
        let (ids, _) = tokens(engine);
        // The one-bit-error truncations may move a logit by up to ONE_BIT_ERROR_BOUND
        // (decoder_party.rs): a token may differ only where the simulator's top two are
        // within twice that, and the generations part there.
        let parted = (0..4).find(|&i| ids[i] != expected[i]).unwrap_or(4);
        assert!(
            parted == 4 || margins[parted] <= 2.0 * ONE_BIT_ERROR_BOUND,
            "the {client} client's {ids:?} against the simulator's {expected:?} (margins {margins:?})"
        );
    }
    preprocessing_changes_no_token(tmp.path(), &addr);
}

/// `veil export-client --model DIR --out BUNDLE [extra]` of a decoder; the bundle must hold no
/// weight file.
fn export_client(dir: &str, bundle: &Path, extra: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["export-client", "--model", dir, "--out"])
        .arg(bundle)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!bundle.join("model.safetensors").exists());
}

/// `out` succeeded and its tokens and margins are the simulator's (`expected`, `margins`)
/// exactly: a decoder server's default faithful truncations make its logits the simulator's.
fn exactly_the_simulators(out: &std::process::Output, expected: &[u32], margins: &[f64]) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ids_and_margins(out), (expected.to_vec(), margins.to_vec()));
}

/// The tokens of `out` part from `expected` only where the simulator's top two are within the
/// one-bit-error truncations' reach (`margins`: the simulator's).
fn within_the_truncation_bound(out: &std::process::Output, expected: &[u32], margins: &[f64]) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ids, _) = ids_and_margins(out);
    let parted = (0..4).find(|&i| ids[i] != expected[i]).unwrap_or(4);
    assert!(
        parted == 4 || margins[parted] <= 2.0 * ONE_BIT_ERROR_BOUND,
        "{ids:?} against the simulator's {expected:?} (margins {margins:?})"
    );
}

/// A decoder's `veil serve` runs faithful truncations unless told otherwise: a private
/// generation's tokens and top-two margins are the simulator's exactly (its logits are, bit for
/// bit), with no allowance for near-ties. `--truncation one-bit-error` runs the cheaper mode,
/// within its bound; an encoder refuses the flag (its mode is its config's).
#[test]
fn decoder_servers_answer_as_the_simulator_exactly_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_llama(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let simulated = generate_json(dir, &["--simulate"]);
    let (expected, margins) = ids_and_margins(&simulated);
    for flags in [&[][..], &["--truncation", "faithful"]] {
        let (_server, addr) = serve_tiny(dir, flags);
        let private = generate_json(dir, &["--connect", &addr, "--insecure-plaintext"]);
        exactly_the_simulators(&private, &expected, &margins);
    }
    let (_server, addr) = serve_tiny(dir, &["--truncation", "one-bit-error"]);
    let private = generate_json(dir, &["--connect", &addr, "--insecure-plaintext"]);
    within_the_truncation_bound(&private, &expected, &margins);
    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["serve", "--model", "default", "--truncation", "faithful"])
        .args(["--listen", "127.0.0.1:0", "--insecure-plaintext"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("config.json"),
        "{err}"
    );
}

/// `veil export-client` of a decoder: with the client bundle alone (configuration, tokenizer
/// with its chat template, the public tables; no weight file), `veil generate --connect` gets
/// the simulator's tokens and margins exactly from a `veil serve` of the model folder; the
/// bundle cannot run the model on this machine (`--simulate` is refused, saying why).
#[test]
fn a_client_bundle_generates_without_the_models_weights() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_llama(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let bundle = out_dir.path().join("client");
    export_client(dir, &bundle, &[]);
    let bundle = bundle.to_str().unwrap();
    let (_server, addr) = serve_tiny(dir, &[]);
    let (expected, margins) = ids_and_margins(&generate_json(dir, &["--simulate"]));
    let out = generate_json(bundle, &["--connect", &addr, "--insecure-plaintext"]);
    exactly_the_simulators(&out, &expected, &margins);
    let out = generate_json(bundle, &["--simulate"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("holds no weights"),
        "{err}"
    );
}

/// `veil serve --private-tables`: `veil generate --connect --private-tables` with a client
/// bundle exported `--private-tables` (configuration and tokenizer only: no table, no weight)
/// gets the simulator's tokens and margins exactly from a server that keeps the token embedding
/// and the output table; a client that brings the open tables
/// is refused, naming the flag, as is that bundle without the flag; `--private-tables` with
/// `--preprocess` is refused by the parser.
#[test]
fn private_tables_through_veil_serve_equal_the_simulator() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_llama(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let bundle = out_dir.path().join("client");
    export_client(dir, &bundle, &["--private-tables"]);
    assert!(!bundle.join("public.safetensors").exists());
    let bundle = bundle.to_str().unwrap();
    let (_server, addr) = serve_tiny(dir, &["--private-tables"]);
    let run = |engine: &[&str]| generate_json(dir, engine);
    let (expected, margins) = ids_and_margins(&run(&["--simulate"]));
    let private = [
        "--connect",
        &addr,
        "--insecure-plaintext",
        "--private-tables",
    ];
    exactly_the_simulators(&generate_json(bundle, &private), &expected, &margins);
    let out = generate_json(bundle, &private[..3]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--private-tables"),
        "{err}"
    );
    let out = run(&["--connect", &addr, "--insecure-plaintext"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--private-tables"),
        "{err}"
    );
    let out = run(&[
        "--connect",
        &addr,
        "--insecure-plaintext",
        "--private-tables",
        "--preprocess",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot be used with"),
        "{err}"
    );
}

/// `--preprocess` on the server at `addr` of the model in `dir`, on questions whose answers
/// have no near-tie (so a private answer must be the simulator's exactly, with or without
/// preprocessing): `veil generate`'s tokens, a two-turn `veil chat` (its first prompt padded)
/// whose second turn runs on the first's cache (the first turn's last step preprocessed a step that the second turn's
/// prompt replaces), and `veil proxy`'s completion are the simulator's. A short system line
/// keeps the prompts short; each part is timed.
fn preprocessing_changes_no_token(dir: &Path, addr: &str) {
    // New tokens per answer: the prompt, then two steps, each preprocessed after the last.
    const NEW: usize = 3;
    let model = decoder::load(dir.to_str().unwrap()).unwrap();
    let system = ChatMessage::new("system", "Be brief.");
    let answer = |messages: &[ChatMessage]| {
        let ids = model.chat_prompt(messages).unwrap();
        let tokens = sure(dir, &ids, NEW)?;
        let text = model.tokenizer.decode(&tokens).unwrap();
        Some((ids, tokens, text))
    };
    // Two questions whose answers have no near-tie, the second asked after the first's turn,
    // whose prompt extends what the first turn left in the cache (its prompt and every
    // answer token but the last).
    let (first, second, answers) = QUESTIONS
        .iter()
        .find_map(|a| {
            let turn = vec![system.clone(), ChatMessage::new("user", a)];
            let (ids, tokens, one) = answer(&turn)?;
            QUESTIONS.iter().find_map(|b| {
                let mut both = turn.clone();
                both.push(ChatMessage::new("assistant", &one));
                both.push(ChatMessage::new("user", b));
                let (next, _, two) = answer(&both)?;
                let held = [&ids[..], &tokens[..NEW - 1]].concat();
                next.starts_with(&held)
                    .then(|| (*a, *b, [one.clone(), two]))
            })
        })
        .expect("no two questions without a near-tie whose turns share the cache");
    let pre = ["--connect", addr, "--insecure-plaintext", "--preprocess"];

    let started = std::time::Instant::now();
    // A plain prompt (no chat template: a few tokens) without a near-tie.
    let (plain, want) = QUESTIONS
        .iter()
        .find_map(|q| Some((*q, sure(dir, &model.tokenizer.encode(q).unwrap(), NEW)?)))
        .expect("no plain prompt without a near-tie");
    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["generate", "--model", dir.to_str().unwrap()])
        .args(pre)
        .args(["--json", "--max-new-tokens", &NEW.to_string(), plain])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["token_ids"],
        json!(want),
        "veil generate --preprocess"
    );
    eprintln!(
        "generate --preprocess: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The chat's first prompt padded 16 positions beyond its length (`--pad-to`): the second
    // turn then runs on a cache that holds the padding too.
    let first_turn = [system.clone(), ChatMessage::new("user", first)];
    let pad_to = (model.chat_prompt(&first_turn).unwrap().len() + 16).to_string();
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["chat", "--model", dir.to_str().unwrap()])
        .args(pre)
        .args(["--pad-to", &pad_to])
        .args([
            "--system",
            "Be brief.",
            "--max-new-tokens",
            &NEW.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = format!("{first}\n{second}\n");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let got: Vec<&str> = std::str::from_utf8(&out.stdout)
        .unwrap()
        .split('\n')
        .collect();
    assert_eq!(got[..2], answers, "veil chat --preprocess --pad-to");
    // The second turn ran on the first's cache: not "0 of" its prompt's tokens from it.
    let reports: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("from the cache"))
        .collect();
    assert_eq!(reports.len(), 2, "{err}");
    assert!(!reports[1].contains("; 0 of "), "{err}");
    eprintln!(
        "chat --preprocess, two turns: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let started = std::time::Instant::now();
    let proxy = start(dir, &pre);
    let request = json!({
        "model": "tiny-llama",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": first},
        ],
        "max_tokens": NEW,
        "temperature": 0,
    });
    let (status, body) = post(&proxy.addr, &request);
    assert_eq!(status, 200, "{body}");
    let answer = json_of(&body)["choices"][0]["message"]["content"].clone();
    assert_eq!(answer, answers[0], "veil proxy --preprocess");
    eprintln!(
        "proxy --preprocess: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// `veil demo` of a decoder folder: one private chat turn with a server thread over TLS on
/// loopback; the answer is the simulator's up to its first near-tie (where the 1-bit-error
/// truncations may pick either token; at least four tokens on this model and question) with
/// each decode step preprocessed just before it runs (`--preprocess 1`), and the cost lines follow
/// it; `--preprocess 2` is refused for a decoder.
#[test]
fn demo_of_a_decoder_answers_privately_as_the_simulator() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_llama(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let model = decoder::load(dir).unwrap();
    let fixed = FixedDecoder::encode(&model.weights, DecoderFormat::default()).unwrap();
    let opts = GenerateOptions {
        // The demo's limit.
        max_new_tokens: 24,
        sampling: SamplingParams::GREEDY,
        stop: model.weights.config.eos_token_ids.clone(),
        fixed_length: false,
        pad_to: None,
    };
    // The simulator's answer up to its first near-tie, for the first question whose answer
    // has at least four tokens before one (the model and the simulator are deterministic).
    let sure_answer = |question: &str| {
        let ids = model
            .chat_prompt(&[ChatMessage::new("user", question)])
            .unwrap();
        let (tokens, _) = generate(&mut fixed.session(), &ids, &opts, |_| Ok(())).unwrap();
        let sure = tokens
            .iter()
            .position(|t| f64::from(t.margin) <= 2.0 * ONE_BIT_ERROR_BOUND)
            .unwrap_or(tokens.len());
        let ids: Vec<u32> = tokens[..sure].iter().map(|t| t.id).collect();
        (sure >= 4).then(|| model.tokenizer.decode(&ids).unwrap())
    };
    let (question, want) = QUESTIONS
        .iter()
        .find_map(|q| sure_answer(q).map(|a| (*q, a)))
        .expect("no question without an early near-tie");

    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args([
            "demo",
            "--model",
            dir,
            "--tls",
            "--preprocess",
            "1",
            question,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("answer: {want}")),
        "{want:?} in {stdout}"
    );
    assert!(stdout.contains("\nset-up: "), "{stdout}");
    assert!(stdout.contains("\ngeneration: "), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("each decode step preprocessed"), "{stderr}");
    // A decoder holds one preprocessed step: more ahead is refused before the model loads.
    let out = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["demo", "--model", dir, "--preprocess", "2", question])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("next step only (0 or 1)"), "{stderr}");
}
