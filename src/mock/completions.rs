//! OpenAI's legacy `POST /v1/completions`: one choice per prompt (string, list of
//! strings, or token lists), each of the drawn length; `max_tokens` defaults to 16 as
//! OpenAI's does.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;

use super::completion;
use super::count::Counter;
use super::error::{ApiError, Flavor};
use super::log::Api;
use super::openai::{Reply, Usage, token_groups};
use super::request::{self, CompletionsRequest};
use super::state::{Admission, Charge, MockState};
use super::stream::{SseBuilder, json_response, to_json};

/// Default `max_tokens` of the legacy completions API, as OpenAI applies it.
const DEFAULT_MAX_TOKENS: u64 = 16;

#[derive(Serialize)]
struct TextCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [TextChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    text: &'a str,
    index: u64,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match completions_response(&mock, &headers, body).await {
        Ok(response) => response,
        Err(error) => mock.refuse(Api::Completions, Flavor::OpenAi, error).await,
    }
}

async fn completions_response(
    mock: &Arc<MockState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = request::read_body(mock, headers, body)?;
    let req: CompletionsRequest = request::parse(&bytes)?;
    let max_tokens = request::max_tokens(&[("max_tokens", req.max_tokens)])?;
    let (stream, include_usage) = request::stream_mode(req.stream, req.stream_options)?;
    request::single_choice(req.n)?;
    // Each prompt's `best_of` completions are all generated and billed; one
    // is returned.
    let best_of = request::best_of(req.best_of)?;
    req.prompt.validate("prompt", true)?;
    mock.check_model(&req.model)?;
    let prompt_tokens = req.prompt.count(Counter::for_model(&req.model));
    let (seq, completion) = mock.draw(Some(max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)));
    let prompts = req.prompt.len() as u64;
    let generated = prompts * best_of;
    let charge = Charge {
        api: Api::Completions,
        model: &req.model,
        prompt_tokens,
        completion_tokens: completion.tokens * generated,
        // The cap the request set: the default of 16 only caps the draw.
        output_cap: max_tokens.map(|cap| cap.saturating_mul(generated)),
        stream,
    };
    let Admission { slot, headers } = mock.admit(charge).await?;
    mock.first_byte_delay(stream, completion.tokens * prompts)
        .await;
    let reply = Reply {
        id: format!("cmpl-mock{seq:012}"),
        created: mock.unix_secs(),
        model: &req.model,
        prompt_tokens,
        completion,
        include_usage,
        misreport: 0,
    };
    if !stream {
        return Ok(json_response(
            completions_json(&reply, prompts, generated),
            headers,
        ));
    }
    let mut sse = SseBuilder::default();
    let pace = mock.config().inter_token_ms;
    completions_stream(&mut sse, &reply, (prompts, generated), pace);
    Ok(sse.into_response(headers, slot))
}

/// The answer: a choice per prompt; the usage bills every `generated`
/// completion.
fn completions_json(reply: &Reply<'_>, prompts: u64, generated: u64) -> Vec<u8> {
    let text = completion::text(reply.completion.tokens);
    let choices: Vec<TextChoice> = (0..prompts)
        .map(|index| TextChoice {
            text: &text,
            index,
            logprobs: None,
            finish_reason: Some(reply.finish_reason()),
        })
        .collect();
    let usage = Usage::new(reply.prompt_tokens, reply.completion.tokens * generated);
    to_json(&TextCompletion {
        id: &reply.id,
        object: "text_completion",
        created: reply.created,
        model: reply.model,
        choices: &choices,
        usage: Some(Some(usage)),
    })
}

fn completions_stream(
    sse: &mut SseBuilder,
    reply: &Reply<'_>,
    (prompts, generated): (u64, u64),
    inter_token_ms: u64,
) {
    let emit = |sse: &mut SseBuilder, choices: &[TextChoice<'_>], usage| {
        let chunk = TextCompletion {
            id: &reply.id,
            object: "text_completion",
            created: reply.created,
            model: reply.model,
            choices,
            usage,
        };
        sse.event(None, &chunk);
    };
    for index in 0..prompts {
        for group in token_groups(reply.completion.tokens, inter_token_ms) {
            sse.delay(Duration::from_millis(inter_token_ms.saturating_mul(group)));
            let text = completion::text(group);
            let choice = TextChoice {
                text: &text,
                index,
                logprobs: None,
                finish_reason: None,
            };
            emit(sse, &[choice], reply.chunk_usage());
        }
        let finish_reason = Some(reply.finish_reason());
        let last = TextChoice {
            text: "",
            index,
            logprobs: None,
            finish_reason,
        };
        emit(sse, &[last], reply.chunk_usage());
    }
    if reply.include_usage {
        let usage = Usage::new(reply.prompt_tokens, reply.completion.tokens * generated);
        emit(sse, &[], Some(Some(usage)));
    }
    sse.done_marker();
}
