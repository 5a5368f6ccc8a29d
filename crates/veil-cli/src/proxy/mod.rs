//! `veil proxy`: an OpenAI-compatible HTTP endpoint on the user's machine, so that tools that
//! already speak that API (the `openai` packages, editors, agents) get Veil's generation
//! unchanged. `POST /v1/chat/completions` (with `"stream": true` as server-sent events),
//! `GET /v1/models` and `GET /v1/models/{id}`; everything else gets an OpenAI-style error object
//! with its HTTP status.
//!
//! The proxy holds the generating session (and, for private generation, the client's keys), so it
//! listens on loopback by default and has no authentication of its own: whoever can reach its
//! address can use it. Requests run one at a time on one KV cache, which is reused when a
//! request's conversation extends the previous one (as chat tools send it); at most
//! [`MAX_WAITING`] requests wait, the next get HTTP 503. Bodies are capped at [`MAX_BODY`].

mod api;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response, Server};
use veil_core::{Error, Result};
use veil_model::decoder;
use veil_model::GenerateOptions;

use crate::decoding::{CachedSession, CommandModel, Engine, EngineArgs};
use api::{ApiError, ChatRequest, Completion, Usage};

/// The largest request body read (a long conversation is well under it).
const MAX_BODY: usize = 1 << 20;

/// Requests being answered or waiting for the session, at most; more get HTTP 503.
const MAX_WAITING: usize = 8;

#[derive(Args)]
pub(crate) struct ProxyArgs {
    /// A decoder with a chat template: `smollm2-135m-instruct`, a `.gguf` file or a Hugging Face
    /// folder.
    #[arg(long)]
    model: String,
    #[command(flatten)]
    engine: EngineArgs,
    /// Where to listen. Anything but loopback lets other machines use this proxy's session.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The model id clients name in requests (default: the --model argument's last path part).
    #[arg(long)]
    served_name: Option<String>,
    /// New tokens per answer when a request gives no `max_tokens`.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: usize,
}

/// What every request handler shares.
struct Proxy<'e> {
    model: &'e CommandModel,
    name: String,
    session: Mutex<CachedSession<'e>>,
    default_max_tokens: usize,
    /// The engine's `--fixed-length`: every answer runs all its `max_tokens` steps.
    fixed_length: bool,
    /// The engine's `--pad-to`: a session's first prompt is padded to this length.
    pad_to: Option<usize>,
    completions: AtomicU64,
    waiting: AtomicUsize,
}

pub(crate) fn proxy_cmd(a: ProxyArgs) -> Result<()> {
    // Bind first: a busy port is reported before the model is loaded.
    let server = Server::http(a.listen).map_err(|e| {
        Error::InvalidArgument(format!("veil proxy cannot listen on {}: {e}", a.listen))
    })?;
    let model = CommandModel::load(&a.model, &a.engine, true)?;
    let engine = Engine::new(a.engine, &model)?;
    let name = a
        .served_name
        .clone()
        .unwrap_or_else(|| served_name(&a.model));
    let proxy = Proxy {
        model: &model,
        name,
        session: Mutex::new(CachedSession::new(&engine)),
        default_max_tokens: a.default_max_tokens,
        fixed_length: engine.fixed_length(),
        pad_to: engine.pad_to(),
        completions: AtomicU64::new(0),
        waiting: AtomicUsize::new(0),
    };
    let addr = server.server_addr().to_ip().unwrap_or(a.listen);
    if !addr.ip().is_loopback() {
        eprintln!(
            "veil proxy: warning: listening on {addr}, not loopback: anyone who reaches it \
             uses this proxy's session"
        );
    }
    eprintln!(
        "veil proxy: serving {} ({}) at http://{addr}/v1",
        proxy.name,
        engine.mode()
    );
    std::thread::scope(|s| {
        for request in server.incoming_requests() {
            if proxy.waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING {
                proxy.waiting.fetch_sub(1, Ordering::SeqCst);
                let busy = ApiError::with_status(
                    503,
                    "server_busy",
                    format!("{MAX_WAITING} requests are already waiting: retry later"),
                );
                respond_json(request, busy.status, &busy.body());
                continue;
            }
            let proxy = &proxy;
            s.spawn(move || {
                proxy.handle(request);
                proxy.waiting.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Ok(())
}

/// The model id for `--model SPEC`: a built-in name as is, a path by its last part (without
/// `.gguf`).
fn served_name(spec: &str) -> String {
    let path = std::path::Path::new(spec.trim_end_matches('/'));
    let last = if decoder::is_gguf_path(path) {
        path.file_stem()
    } else {
        path.file_name()
    };
    last.and_then(|s| s.to_str()).unwrap_or(spec).to_owned()
}

fn respond_json(request: Request, status: u16, body: &Value) {
    let response = Response::from_string(body.to_string())
        .with_status_code(status)
        .with_header(header("Content-Type", "application/json"));
    // A client that hung up before its answer needs nothing more.
    let _ = request.respond(response);
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("ASCII header")
}

/// The request's body, at most [`MAX_BODY`] bytes.
fn read_body(request: &mut Request) -> std::result::Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::with_status(
            413,
            "request_too_large",
            format!("the request body is larger than {MAX_BODY} bytes"),
        )
    };
    if request.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    request
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| {
            ApiError::invalid(
                None,
                None,
                format!("the request body could not be read: {e}"),
            )
        })?;
    if body.len() > MAX_BODY {
        return Err(too_large());
    }
    Ok(body)
}

impl Proxy<'_> {
    fn handle(&self, mut request: Request) {
        let path = request.url().split('?').next().unwrap_or("").to_owned();
        let method = request.method().clone();
        let models_prefix = "/v1/models/";
        let outcome = match (&method, path.as_str()) {
            (Method::Get, "/v1/models") => Ok(api::models(&self.name)),
            (Method::Get, p) if p.starts_with(models_prefix) => {
                let id = &p[models_prefix.len()..];
                if id == self.name {
                    Ok(api::models(&self.name)["data"][0].clone())
                } else {
                    Err(ApiError::with_status(
                        404,
                        "model_not_found",
                        format!(
                            "The model '{id}' does not exist: this proxy serves '{}'",
                            self.name
                        ),
                    ))
                }
            }
            (Method::Post, "/v1/chat/completions") => match read_body(&mut request)
                .and_then(|body| ChatRequest::parse(&body, &self.name))
            {
                Ok(chat) if chat.stream => return self.stream(request, chat),
                Ok(chat) => self.complete(chat),
                Err(e) => Err(e),
            },
            (_, "/v1/models" | "/v1/chat/completions") => Err(ApiError::with_status(
                405,
                "method_not_allowed",
                format!("{method} is not allowed on {path}"),
            )),
            _ => Err(ApiError::with_status(
                404,
                "unknown_url",
                format!("Unrecognized request URL ({method}: {path})"),
            )),
        };
        match outcome {
            Ok(body) => respond_json(request, 200, &body),
            Err(e) => respond_json(request, e.status, &e.body()),
        }
    }

    /// The prompt and generation options of `chat`, refused (HTTP 400) when they do not fit the
    /// model.
    fn prepare(
        &self,
        chat: &ChatRequest,
    ) -> std::result::Result<(Vec<u32>, GenerateOptions), ApiError> {
        let ids = self
            .model
            .tokenizer()
            .chat_ids(&chat.messages)
            .map_err(|e| ApiError::invalid(Some("messages"), None, e.to_string()))?;
        let max_new = chat.max_tokens.unwrap_or(self.default_max_tokens);
        let context = self.model.config().max_positions;
        if ids.len().saturating_add(max_new) > context {
            return Err(ApiError::invalid(
                Some("messages"),
                Some("context_length_exceeded"),
                format!(
                    "This model's maximum context length is {context} tokens. However, you \
                     requested {} tokens ({} in the messages, {max_new} in the completion).",
                    ids.len().saturating_add(max_new),
                    ids.len()
                ),
            ));
        }
        let mut sampling = chat.sampling;
        if !chat.seeded {
            sampling.seed = veil_core::Prg::from_os_entropy().u64();
        }
        let opts = GenerateOptions {
            max_new_tokens: max_new,
            sampling,
            stop: self.model.config().eos_token_ids.clone(),
            fixed_length: self.fixed_length,
            pad_to: self.pad_to,
        };
        Ok((ids, opts))
    }

    fn completion_id(&self) -> String {
        format!(
            "chatcmpl-veil-{}",
            self.completions.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// `"stream": false`: the whole answer in one JSON body.
    fn complete(&self, chat: ChatRequest) -> std::result::Result<Value, ApiError> {
        let (ids, opts) = self.prepare(&chat)?;
        let mut text = String::new();
        let (tokens, finish, cached) = self
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .generate(self.model, &ids, &opts, |piece| {
                text.push_str(piece);
                Ok(())
            })
            .map_err(|e| ApiError::server(e.to_string()))?;
        let id = self.completion_id();
        let c = Completion {
            id: &id,
            created: now(),
            model: &self.name,
        };
        Ok(c.full(
            &text,
            finish.as_str(),
            Usage::new(ids.len(), cached, tokens.len()),
        ))
    }

    /// `"stream": true`: server-sent events, one chunk per piece of text as it is generated,
    /// then `data: [DONE]`. A failure after the first event is sent as an error event.
    fn stream(&self, request: Request, chat: ChatRequest) {
        let (ids, opts) = match self.prepare(&chat) {
            Ok(p) => p,
            Err(e) => return respond_json(request, e.status, &e.body()),
        };
        let id = self.completion_id();
        let c = Completion {
            id: &id,
            created: now(),
            model: &self.name,
        };
        let mut out = request.into_writer();
        // Each event is one HTTP chunk, flushed at once: the client sees the text as it comes,
        // and the body ends with the zero chunk, so the connection can stay open (keep-alive).
        let event = |out: &mut dyn Write, v: &Value| http_chunk(out, &format!("data: {v}\n\n"));
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: \
                    no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
        let opened = out
            .write_all(head.as_bytes())
            .map_err(Error::Io)
            .and_then(|_| {
                event(
                    &mut out,
                    &c.chunk(json!({"role": "assistant", "content": ""}), None),
                )
            });
        if opened.is_err() {
            return;
        }
        let mut session = self
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // A write error (the client hung up) ends the generation: the error returned from the
        // callback stops it.
        let result = session.generate(self.model, &ids, &opts, |piece| {
            event(&mut out, &c.chunk(json!({ "content": piece }), None))
        });
        drop(session);
        let _ = match result {
            Ok((tokens, finish, cached)) => {
                let mut end = event(&mut out, &c.chunk(json!({}), Some(finish.as_str())));
                if chat.include_usage {
                    end = end.and_then(|_| {
                        event(
                            &mut out,
                            &c.usage_chunk(Usage::new(ids.len(), cached, tokens.len())),
                        )
                    });
                }
                end.and_then(|_| http_chunk(&mut out, "data: [DONE]\n\n"))
            }
            Err(e) => event(&mut out, &ApiError::server(e.to_string()).body()),
        }
        // The empty chunk ends the body.
        .and_then(|_| http_chunk(&mut out, ""));
    }
}

/// One chunk of a `Transfer-Encoding: chunked` body, flushed.
fn http_chunk(out: &mut dyn Write, data: &str) -> Result<()> {
    write!(out, "{:x}\r\n{data}\r\n", data.len())
        .and_then(|_| out.flush())
        .map_err(Error::Io)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
