//! Anthropic-compatible `POST /v1/messages`: `max_tokens` required, input tokens
//! counted over the `system` prompt plus the messages (with OpenAI's chat framing, as
//! the mock counts everything), and the SSE event sequence `message_start` (with
//! `usage.input_tokens`), `content_block_start`, `content_block_delta`s,
//! `content_block_stop`, `message_delta` (cumulative `usage.output_tokens`),
//! `message_stop`.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::json;

use super::completion::{self, Completion};
use super::count::Counter;
use super::error::{ApiError, Flavor};
use super::log::Api;
use super::openai::token_groups;
use super::request::{self, MessagesRequest};
use super::state::{Admission, Charge, MockState};
use super::stream::{SseBuilder, json_response, to_json};
use crate::tokens::ChatMessage;

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match messages_response(&mock, &headers, body).await {
        Ok(response) => response,
        Err(error) => mock.refuse(Api::Messages, Flavor::Anthropic, error).await,
    }
}

async fn messages_response(
    mock: &Arc<MockState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = request::read_body(mock, headers, body)?;
    let req: MessagesRequest = request::parse(&bytes)?;
    let max_tokens = request::max_tokens(&[("max_tokens", req.max_tokens)])?
        .ok_or_else(|| ApiError::Invalid("max_tokens: Field required".into()))?;
    request::non_empty("messages", req.messages.len())?;
    if let Some(bad) = req
        .messages
        .iter()
        .find(|m| m.role != "user" && m.role != "assistant")
    {
        return Err(ApiError::Invalid(format!(
            "messages: Unexpected role \"{}\". Allowed roles are \"user\" or \"assistant\".",
            bad.role
        )));
    }
    let stream = req.stream.unwrap_or(false);
    mock.check_model(&req.model)?;
    let input_tokens = count_input(&req.model, &bytes)?;
    let (seq, completion) = mock.draw(Some(max_tokens));
    let charge = Charge {
        api: Api::Messages,
        model: &req.model,
        prompt_tokens: input_tokens,
        completion_tokens: completion.tokens,
        output_cap: Some(max_tokens),
        stream,
    };
    let Admission { slot, headers } = mock.admit(charge).await?;
    mock.first_byte_delay(stream, completion.tokens).await;
    let id = format!("msg_mock{seq:012}");
    if !stream {
        let body = message_json(&id, &req.model, input_tokens, completion);
        return Ok(json_response(to_json(&body), headers));
    }
    let mut sse = SseBuilder::default();
    message_stream(
        &mut sse,
        &id,
        &req.model,
        input_tokens,
        completion,
        mock.config().inter_token_ms,
    );
    Ok(sse.into_response(headers, slot))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the count a
/// message with this input would be charged. Free, as Anthropic's is: nothing
/// is charged to the limits or logged.
pub(crate) async fn count_tokens(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = (|| {
        let bytes = request::read_body(&mock, &headers, body)?;
        let req: CountTokensRequest = request::parse(&bytes)?;
        request::non_empty("messages", req.messages.len())?;
        mock.check_model(&req.model)?;
        count_input(&req.model, &bytes)
    })();
    match counted {
        Ok(input_tokens) => {
            let body = to_json(&json!({"input_tokens": input_tokens}));
            json_response(body, HeaderMap::new())
        }
        Err(error) => error.into_response(Flavor::Anthropic),
    }
}

/// The input of a `count_tokens` request (`max_tokens` not needed).
#[derive(serde::Deserialize)]
struct CountTokensRequest<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(borrow)]
    messages: Vec<ChatMessage<'a>>,
}

/// Anthropic's input: the system prompt (as a system message) plus the
/// messages, counted as a chat, and the tools (`super::count`).
fn count_input(model: &str, body: &[u8]) -> Result<u64, ApiError> {
    let counted: request::Counted = request::parse(body)?;
    if counted
        .system
        .as_ref()
        .is_some_and(|s| !(s.is_string() || s.is_array()))
    {
        return Err(ApiError::Invalid(
            "system: Input should be a valid string or a list of content blocks".into(),
        ));
    }
    let counter = Counter::for_model(model);
    let system = counted
        .system
        .as_ref()
        .map_or(0, |s| 3 + counter.text("system") + counter.content(s));
    let tools = counted.tools.as_deref().unwrap_or_default();
    Ok(system + counter.chat(&counted.messages) + counter.anthropic_tools(tools))
}

fn stop_reason(completion: Completion) -> &'static str {
    if completion.hit_max_tokens {
        "max_tokens"
    } else {
        "end_turn"
    }
}

fn message_json(
    id: &str,
    model: &str,
    input_tokens: u64,
    completion: Completion,
) -> serde_json::Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": completion::text(completion.tokens)}],
        "stop_reason": stop_reason(completion),
        "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": completion.tokens},
    })
}

fn message_stream(
    sse: &mut SseBuilder,
    id: &str,
    model: &str,
    input_tokens: u64,
    completion: Completion,
    inter_token_ms: u64,
) {
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }});
    sse.event(Some("message_start"), &start);
    let block = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
    sse.event(Some("content_block_start"), &block);
    for group in token_groups(completion.tokens, inter_token_ms) {
        sse.delay(Duration::from_millis(inter_token_ms.saturating_mul(group)));
        let delta = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": completion::text(group)}});
        sse.event(Some("content_block_delta"), &delta);
    }
    sse.event(
        Some("content_block_stop"),
        &json!({"type": "content_block_stop", "index": 0}),
    );
    let delta = json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(completion), "stop_sequence": null},
        "usage": {"output_tokens": completion.tokens}});
    sse.event(Some("message_delta"), &delta);
    sse.event(Some("message_stop"), &json!({"type": "message_stop"}));
}
