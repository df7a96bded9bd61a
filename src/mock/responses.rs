//! OpenAI's Responses API, `POST /v1/responses`, streamed or not, shaped like
//! the real responses: a `response` object with one assistant message of
//! `output_text`, `usage` as `input_tokens`/`output_tokens`; streamed as the
//! event sequence `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`s, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done` and
//! `response.completed` (with the usage), each with its `sequence_number`.
//! Input tokens: the `instructions`, every `input` item and the tools, by
//! the mock's own rule (`super::count`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::completion::{self, Completion};
use super::count::Counter;
use super::error::{ApiError, Flavor};
use super::log::Api;
use super::openai::token_groups;
use super::request;
use super::state::{Admission, Charge, MockState};
use super::stream::{SseBuilder, json_response, to_json};

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
struct ResponsesRequest<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default, borrow)]
    instructions: Option<Cow<'a, str>>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
}

/// `POST /v1/responses`.
pub(crate) async fn responses(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match responses_response(&mock, &headers, body).await {
        Ok(response) => response,
        Err(error) => mock.refuse(Api::Responses, Flavor::OpenAi, error).await,
    }
}

async fn responses_response(
    mock: &Arc<MockState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = request::read_body(mock, headers, body)?;
    let req: ResponsesRequest = request::parse(&bytes)?;
    let max_tokens = request::max_tokens(&[("max_output_tokens", req.max_output_tokens)])?;
    if req.input.is_none() {
        return Err(ApiError::Invalid(
            "Missing required parameter: 'input'.".into(),
        ));
    }
    mock.check_model(&req.model)?;
    let tools = (req.tools.as_ref().and_then(Value::as_array)).map_or(&[][..], Vec::as_slice);
    let input_tokens = Counter::for_model(&req.model).responses(
        req.instructions.as_deref(),
        req.input.as_ref(),
        tools,
    );
    let stream = req.stream.unwrap_or(false);
    let (seq, completion) = mock.draw(max_tokens);
    let charge = Charge {
        api: Api::Responses,
        model: &req.model,
        prompt_tokens: input_tokens,
        completion_tokens: completion.tokens,
        output_cap: max_tokens,
        stream,
    };
    let Admission { slot, headers } = mock.admit(charge).await?;
    mock.first_byte_delay(stream, completion.tokens).await;
    let reply = Reply {
        id: format!("resp_mock{seq:012}"),
        message_id: format!("msg_mock{seq:012}"),
        created_at: mock.unix_secs(),
        model: &req.model,
        input_tokens,
        completion,
    };
    let whole = reply.response("completed", &completion::text(completion.tokens));
    mock.stored.keep(&whole);
    if !stream {
        return Ok(json_response(to_json(&whole), headers));
    }
    let mut sse = SseBuilder::default();
    reply.stream(&mut sse, mock.config().inter_token_ms);
    Ok(sse.into_response(headers, slot))
}

/// What a response says of its request.
struct Reply<'a> {
    id: String,
    message_id: String,
    created_at: u64,
    model: &'a str,
    input_tokens: u64,
    completion: Completion,
}

impl Reply<'_> {
    /// The `response` object: `status` `in_progress` (no output, no usage yet)
    /// or `completed`/`incomplete` with the message `text`.
    fn response(&self, status: &str, text: &str) -> Value {
        let done = status != "in_progress";
        let status = match status {
            "completed" if self.completion.hit_max_tokens => "incomplete",
            other => other,
        };
        let output = if done {
            json!([self.message("completed", text)])
        } else {
            json!([])
        };
        let usage = done.then(|| {
            json!({
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.completion.tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.completion.tokens,
            })
        });
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": null,
            "max_output_tokens": null,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null},
            "store": false,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
        })
    }

    fn message(&self, status: &str, text: &str) -> Value {
        let content = if status == "completed" {
            json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
        } else {
            json!([])
        };
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    fn stream(&self, sse: &mut SseBuilder, inter_token_ms: u64) {
        let mut seq = 0u64;
        let mut emit = |sse: &mut SseBuilder, kind: &str, mut event: Value| {
            event["type"] = json!(kind);
            event["sequence_number"] = json!(seq);
            seq += 1;
            sse.event(Some(kind), &event);
        };
        let started = self.response("in_progress", "");
        emit(sse, "response.created", json!({"response": started}));
        emit(sse, "response.in_progress", json!({"response": started}));
        let at = json!({"output_index": 0});
        let item = self.message("in_progress", "");
        emit(
            sse,
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        );
        let part_at = json!({"item_id": self.message_id, "output_index": 0, "content_index": 0});
        let empty_part = json!({"type": "output_text", "text": "", "annotations": []});
        emit(
            sse,
            "response.content_part.added",
            with(&part_at, "part", empty_part),
        );
        let mut text = String::new();
        for group in token_groups(self.completion.tokens, inter_token_ms) {
            sse.delay(Duration::from_millis(inter_token_ms.saturating_mul(group)));
            let delta = completion::text(group);
            text.push_str(&delta);
            let event = with(
                &with(&part_at, "delta", json!(delta)),
                "logprobs",
                json!([]),
            );
            emit(sse, "response.output_text.delta", event);
        }
        let done = with(&with(&part_at, "text", json!(text)), "logprobs", json!([]));
        emit(sse, "response.output_text.done", done);
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        emit(
            sse,
            "response.content_part.done",
            with(&part_at, "part", part),
        );
        let item = self.message("completed", &text);
        emit(sse, "response.output_item.done", with(&at, "item", item));
        let ended = self.response("completed", &text);
        let kind = match ended["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        emit(sse, kind, json!({"response": ended}));
    }
}

/// `base` with `field` set to `value`.
fn with(base: &Value, field: &str, value: Value) -> Value {
    let mut out = base.clone();
    out[field] = value;
    out
}
