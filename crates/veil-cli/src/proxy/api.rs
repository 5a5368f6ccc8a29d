//! The OpenAI chat-completions API as the proxy speaks it: a request checked field by field
//! (anything the proxy cannot honour is refused by name, never silently ignored), the response
//! bodies, the streamed chunks, and the error object with its HTTP status.

use serde::Serialize;
use serde_json::{json, Map, Value};
use veil_model::decoder::sample::SamplingParams;
use veil_model::decoder::ChatMessage;

/// An error as OpenAI's API returns it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
    message: String,
}

impl ApiError {
    /// A request the proxy will not run (HTTP 400).
    pub(crate) fn invalid(
        param: Option<&str>,
        code: Option<&'static str>,
        message: String,
    ) -> Self {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code,
            message,
        }
    }

    /// A request outside what the proxy serves, with its own status (404, 405, 413, 503…).
    pub(crate) fn with_status(status: u16, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
            message,
        }
    }

    /// The generation itself failed (the engine or the server): HTTP 502 when a remote server
    /// is involved would be as right; 500 says the proxy could not answer.
    pub(crate) fn server(message: String) -> Self {
        ApiError {
            status: 500,
            kind: "server_error",
            param: None,
            code: None,
            message,
        }
    }

    pub(crate) fn body(&self) -> Value {
        json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// A chat-completion request the proxy can run.
#[derive(Debug)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<ChatMessage>,
    /// None: the proxy's default.
    pub(crate) max_tokens: Option<usize>,
    pub(crate) sampling: SamplingParams,
    /// Whether `seed` was given (otherwise the proxy draws one).
    pub(crate) seeded: bool,
    pub(crate) stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub(crate) include_usage: bool,
}

/// Fields accepted and ignored: they change nothing the proxy computes.
const IGNORED: [&str; 4] = ["user", "metadata", "store", "service_tier"];

/// Fields the proxy cannot honour, with the value that means "off" (accepted as a no-op).
fn off_value(field: &str, v: &Value) -> Option<bool> {
    let off = match field {
        "presence_penalty" | "frequency_penalty" => v.as_f64() == Some(0.0),
        "logit_bias" => v.as_object().is_some_and(Map::is_empty),
        "logprobs" | "parallel_tool_calls" => v.as_bool() == Some(false),
        "n" => v.as_u64() == Some(1),
        "response_format" => v.get("type").and_then(Value::as_str) == Some("text"),
        "stop" | "tools" | "tool_choice" | "functions" | "function_call" | "top_logprobs" => {
            return Some(v.is_null() || v.as_array().is_some_and(Vec::is_empty))
        }
        _ => return None,
    };
    Some(off || v.is_null())
}

fn number(obj: &Map<String, Value>, field: &str) -> Result<Option<f64>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            ApiError::invalid(
                Some(field),
                Some("invalid_type"),
                format!("'{field}' must be a number"),
            )
        }),
    }
}

fn count(obj: &Map<String, Value>, field: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(
                Some(field),
                Some("invalid_type"),
                format!("'{field}' must be a non-negative integer"),
            )
        }),
    }
}

/// The text of one message's `content`: a string, or an array of `{"type": "text", "text"}`
/// parts (joined).
fn content(v: &Value, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    let bad = |what: &str| ApiError::invalid(Some(&param), Some("invalid_type"), what.into());
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(bad("only text content parts are supported")),
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.concat()),
        _ => Err(bad("content must be a string or an array of text parts")),
    }
}

fn messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = v.and_then(Value::as_array).ok_or_else(|| {
        ApiError::invalid(
            Some("messages"),
            Some("invalid_type"),
            "'messages' must be an array of messages".into(),
        )
    })?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            Some("empty_array"),
            "'messages' must hold at least one message".into(),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "user" | "assistant")) => r,
                // OpenAI's newer name for the system line.
                Some("developer") => "system",
                other => {
                    return Err(ApiError::invalid(
                        Some(&format!("messages[{i}].role")),
                        Some("invalid_value"),
                        format!(
                            "role {} is not supported: use system, developer, user or assistant",
                            other.map_or("(missing)".into(), |r| format!("'{r}'"))
                        ),
                    ))
                }
            };
            let text = content(m.get("content").unwrap_or(&Value::Null), i)?;
            Ok(ChatMessage::new(role, &text))
        })
        .collect()
}

impl ChatRequest {
    /// Checks `body` against what the proxy serves: the model it names must be `model`.
    pub(crate) fn parse(body: &[u8], model: &str) -> Result<Self, ApiError> {
        let v: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid(
                None,
                Some("invalid_json"),
                format!("the request body is not valid JSON: {e}"),
            )
        })?;
        let obj = v.as_object().ok_or_else(|| {
            ApiError::invalid(
                None,
                Some("invalid_json"),
                "the request body must be a JSON object".into(),
            )
        })?;
        match obj.get("model").and_then(Value::as_str) {
            Some(m) if m == model => {}
            Some(m) => {
                return Err(ApiError::with_status(
                    404,
                    "model_not_found",
                    format!("The model '{m}' does not exist: this proxy serves '{model}'"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    Some("model"),
                    Some("missing_required_parameter"),
                    "'model' is required".into(),
                ))
            }
        }
        const KNOWN: [&str; 9] = [
            "model",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "seed",
            "stream",
            "stream_options",
        ];
        for (field, value) in obj {
            if KNOWN.contains(&field.as_str()) || IGNORED.contains(&field.as_str()) {
                continue;
            }
            match off_value(field, value) {
                Some(true) => {}
                Some(false) => {
                    return Err(ApiError::invalid(
                        Some(field),
                        Some("unsupported_parameter"),
                        format!("'{field}' is not supported by veil proxy"),
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        Some(field),
                        Some("unknown_parameter"),
                        format!("Unrecognized request argument supplied: {field}"),
                    ))
                }
            }
        }
        let max_tokens = match (
            count(obj, "max_completion_tokens")?,
            count(obj, "max_tokens")?,
        ) {
            (Some(a), _) | (None, Some(a)) => Some(a),
            (None, None) => None,
        };
        if max_tokens == Some(0) {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                Some("invalid_value"),
                "max_tokens must be at least 1".into(),
            ));
        }
        let temperature = number(obj, "temperature")?.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                Some("temperature"),
                Some("invalid_value"),
                format!("temperature {temperature} is not in [0, 2]"),
            ));
        }
        let top_p = number(obj, "top_p")?.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                Some("top_p"),
                Some("invalid_value"),
                format!("top_p {top_p} is not in (0, 1]"),
            ));
        }
        let seed = count(obj, "seed")?;
        let stream = match obj.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    Some("stream"),
                    Some("invalid_type"),
                    "'stream' must be a boolean".into(),
                ))
            }
        };
        let include_usage = obj
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(ChatRequest {
            messages: messages(obj.get("messages"))?,
            max_tokens: max_tokens.map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_k: 0,
                top_p: top_p as f32,
                seed: seed.unwrap_or(0),
            },
            seeded: seed.is_some(),
            stream,
            include_usage,
        })
    }
}

/// Token counts, as OpenAI reports them; `cached_tokens` are the prompt tokens the kept KV
/// cache already held (not run again).
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptDetails,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct PromptDetails {
    cached_tokens: usize,
}

impl Usage {
    pub(crate) fn new(prompt: usize, cached: usize, completion: usize) -> Self {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptDetails {
                cached_tokens: cached,
            },
        }
    }
}

/// What every body of one completion repeats.
pub(crate) struct Completion<'a> {
    pub(crate) id: &'a str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
}

impl Completion<'_> {
    /// The whole answer (`"stream": false`).
    pub(crate) fn full(&self, text: &str, finish: &str, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "finish_reason": finish,
                "logprobs": null,
            }],
            "usage": usage,
        })
    }

    /// One streamed chunk: `delta` holds the role or a piece of text; the last one has the
    /// finish reason and an empty delta.
    pub(crate) fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": null }],
        })
    }

    /// The usage chunk after the last one (`stream_options.include_usage`).
    pub(crate) fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        })
    }
}

/// `GET /v1/models`: the one model the proxy serves.
pub(crate) fn models(model: &str) -> Value {
    json!({
        "object": "list",
        "data": [{ "id": model, "object": "model", "created": 0, "owned_by": "veil" }],
    })
}
