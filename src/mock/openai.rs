//! OpenAI-compatible chat completions, streamed or not, shaped like the real responses
//! (`chatcmpl-` ids, `created`, `usage`, `finish_reason`), and the pieces the other
//! OpenAI routes share.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;

use super::completion::{self, Completion, TOKENS_PER_FAST_CHUNK};
use super::count::Counter;
use super::error::{ApiError, Flavor};
use super::log::Api;
use super::request::{self, ChatRequest};
use super::state::{Admission, Charge, MockState};
use super::stream::{SseBuilder, json_response, to_json};

const FINGERPRINT: &str = "fp_tollgate_mock";

/// OpenAI's `usage` object.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

impl Usage {
    pub(crate) fn new(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
        }
    }
}

/// What every reply needs to know about its request.
pub(crate) struct Reply<'a> {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion: Completion,
    pub(crate) include_usage: bool,
    /// Added to both figures of the usage reported (a misreporting provider,
    /// [`super::MockConfig::misreported_usage`]).
    pub(crate) misreport: u64,
}

impl Reply<'_> {
    /// The usage this reply reports: what was counted, plus any misreport.
    pub(crate) fn reported_usage(&self) -> Usage {
        Usage::new(
            self.prompt_tokens.saturating_add(self.misreport),
            self.completion.tokens.saturating_add(self.misreport),
        )
    }

    pub(crate) fn finish_reason(&self) -> &'static str {
        if self.completion.hit_max_tokens {
            "length"
        } else {
            "stop"
        }
    }

    /// `None` (field omitted) without include_usage, `Some(None)` (`null`) with it.
    pub(crate) fn chunk_usage(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }
}

/// Sizes of the stream's content chunks, in tokens.
pub(crate) fn token_groups(tokens: u64, inter_token_ms: u64) -> impl Iterator<Item = u64> {
    let group = if inter_token_ms == 0 {
        TOKENS_PER_FAST_CHUNK
    } else {
        1
    };
    (0..tokens.div_ceil(group)).map(move |i| group.min(tokens - i * group))
}

#[derive(Serialize)]
struct ChatCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'static str,
    choices: [ChatChoice<'a>; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u64,
    message: AssistantMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    content: &'a str,
    refusal: Option<()>,
}

#[derive(Serialize)]
struct ChatChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'static str,
    choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u64,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match chat_response(&mock, &headers, body).await {
        Ok(response) => response,
        Err(error) => mock.refuse(Api::Chat, Flavor::OpenAi, error).await,
    }
}

async fn chat_response(
    mock: &Arc<MockState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = request::read_body(mock, headers, body)?;
    let req: ChatRequest = request::parse(&bytes)?;
    let caps = [
        ("max_tokens", req.max_tokens),
        ("max_completion_tokens", req.max_completion_tokens),
    ];
    let max_tokens = request::max_tokens(&caps)?;
    let (stream, include_usage) = request::stream_mode(req.stream, req.stream_options)?;
    request::single_choice(req.n)?;
    request::non_empty("messages", req.messages.len())?;
    mock.check_model(&req.model)?;
    let counted: request::Counted = request::parse(&bytes)?;
    let counter = Counter::for_model(&req.model);
    let tools = counted.tools.as_deref().unwrap_or_default();
    let prompt_tokens = counter.chat(&counted.messages) + counter.openai_tools(tools);
    let (seq, completion) = mock.draw(max_tokens);
    let charge = Charge {
        api: Api::Chat,
        model: &req.model,
        prompt_tokens,
        completion_tokens: completion.tokens,
        output_cap: max_tokens,
        stream,
    };
    let Admission { slot, headers } = mock.admit(charge).await?;
    mock.first_byte_delay(stream, completion.tokens).await;
    let reply = Reply {
        id: format!("chatcmpl-mock{seq:012}"),
        created: mock.unix_secs(),
        model: &req.model,
        prompt_tokens,
        completion,
        include_usage,
        misreport: mock.config().misreported_usage,
    };
    if !stream {
        return Ok(json_response(chat_json(&reply), headers));
    }
    let mut sse = SseBuilder::default();
    chat_stream(&mut sse, &reply, mock.config().inter_token_ms);
    Ok(sse.into_response(headers, slot))
}

fn chat_json(reply: &Reply<'_>) -> Vec<u8> {
    let content = completion::text(reply.completion.tokens);
    to_json(&ChatCompletion {
        id: &reply.id,
        object: "chat.completion",
        created: reply.created,
        model: reply.model,
        system_fingerprint: FINGERPRINT,
        choices: [ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: &content,
                refusal: None,
            },
            logprobs: None,
            finish_reason: reply.finish_reason(),
        }],
        usage: reply.reported_usage(),
    })
}

fn chat_stream(sse: &mut SseBuilder, reply: &Reply<'_>, inter_token_ms: u64) {
    let emit = |sse: &mut SseBuilder, choices: &[ChunkChoice<'_>], usage| {
        let chunk = ChatChunk {
            id: &reply.id,
            object: "chat.completion.chunk",
            created: reply.created,
            model: reply.model,
            system_fingerprint: FINGERPRINT,
            choices,
            usage,
        };
        sse.event(None, &chunk);
    };
    let choice = |delta, finish_reason| ChunkChoice {
        index: 0,
        delta,
        logprobs: None,
        finish_reason,
    };
    let first = choice(
        Delta {
            role: Some("assistant"),
            content: Some(""),
        },
        None,
    );
    emit(sse, &[first], reply.chunk_usage());
    for group in token_groups(reply.completion.tokens, inter_token_ms) {
        sse.delay(std::time::Duration::from_millis(
            inter_token_ms.saturating_mul(group),
        ));
        let text = completion::text(group);
        let content = ChunkChoice {
            index: 0,
            delta: Delta {
                role: None,
                content: Some(&text),
            },
            logprobs: None,
            finish_reason: None,
        };
        emit(sse, &[content], reply.chunk_usage());
    }
    let last = choice(
        Delta {
            role: None,
            content: None,
        },
        Some(reply.finish_reason()),
    );
    emit(sse, &[last], reply.chunk_usage());
    if reply.include_usage {
        emit(sse, &[], Some(Some(reply.reported_usage())));
    }
    sse.done_marker();
}
