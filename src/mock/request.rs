//! Request bodies as the mock reads them: only the fields it needs, typed strictly
//! (a wrong type is a 400), every other field accepted and ignored, as a provider
//! that passes unknown-but-valid parameters would.

use std::borrow::Cow;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use serde::Deserialize;

use super::count::Counter;
use super::error::ApiError;
use super::state::MockState;
use crate::tokens::ChatMessage;

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest<'a> {
    #[serde(borrow)]
    pub(crate) model: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) messages: Vec<ChatMessage<'a>>,
    #[serde(default)]
    pub(crate) max_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) n: Option<u64>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct CompletionsRequest<'a> {
    #[serde(borrow)]
    pub(crate) model: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) prompt: Prompt<'a>,
    #[serde(default)]
    pub(crate) max_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) n: Option<u64>,
    /// Completions generated per prompt, the best one returned; every one is
    /// billed.
    #[serde(default)]
    pub(crate) best_of: Option<u64>,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub(crate) struct EmbeddingsRequest<'a> {
    #[serde(borrow)]
    pub(crate) model: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) input: Prompt<'a>,
    #[serde(default, borrow)]
    pub(crate) encoding_format: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(crate) dimensions: Option<u64>,
}

/// Anthropic `POST /v1/messages`.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagesRequest<'a> {
    #[serde(borrow)]
    pub(crate) model: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) messages: Vec<ChatMessage<'a>>,
    #[serde(default)]
    pub(crate) max_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
}

/// What the mock counts of a chat or messages body: the messages (and an
/// Anthropic `system`) as sent, and the tools (`super::count`).
#[derive(Debug, Deserialize)]
pub(crate) struct Counted {
    #[serde(default)]
    pub(crate) messages: Vec<serde_json::Value>,
    #[serde(default)]
    pub(crate) system: Option<serde_json::Value>,
    #[serde(default)]
    pub(crate) tools: Option<Vec<serde_json::Value>>,
}

/// `stream_options`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
}

/// A completions `prompt` or an embeddings `input`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Prompt<'a> {
    /// One text.
    #[serde(borrow)]
    Text(Cow<'a, str>),
    /// Several texts.
    #[serde(borrow)]
    Texts(Vec<Cow<'a, str>>),
    /// One pre-tokenized text.
    Tokens(Vec<u32>),
    /// Several pre-tokenized texts.
    TokenLists(Vec<Vec<u32>>),
}

impl Prompt<'_> {
    /// Number of prompts (completions: one choice each; embeddings: one vector each).
    pub(crate) fn len(&self) -> usize {
        match self {
            Prompt::Text(_) | Prompt::Tokens(_) => 1,
            Prompt::Texts(texts) => texts.len(),
            Prompt::TokenLists(lists) => lists.len(),
        }
    }

    /// Tokens of all prompts, without chat framing.
    pub(crate) fn count(&self, counter: Counter) -> u64 {
        match self {
            Prompt::Text(text) => counter.text(text),
            Prompt::Texts(texts) => texts.iter().map(|t| counter.text(t)).sum(),
            Prompt::Tokens(tokens) => tokens.len() as u64,
            Prompt::TokenLists(lists) => lists.iter().map(|l| l.len() as u64).sum(),
        }
    }

    /// 400 on an empty list, or an empty item when `allow_empty_item` is false.
    pub(crate) fn validate(&self, field: &str, allow_empty_item: bool) -> Result<(), ApiError> {
        let empty_item = match self {
            Prompt::Text(text) => text.is_empty(),
            Prompt::Texts(texts) => texts.iter().any(|t| t.is_empty()),
            Prompt::Tokens(tokens) => tokens.is_empty(),
            Prompt::TokenLists(lists) => lists.iter().any(Vec::is_empty),
        };
        non_empty(field, self.len())?;
        if empty_item && !allow_empty_item {
            return Err(ApiError::Invalid(format!(
                "'{field}' must not contain empty items"
            )));
        }
        Ok(())
    }
}

/// Checks the API key and reads the body.
pub(crate) fn read_body(
    mock: &MockState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    mock.check_auth(headers)?;
    body.map_err(|rejection| ApiError::Body {
        status: rejection.status(),
        message: rejection.body_text(),
    })
}

/// Parses a JSON object body.
pub(crate) fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::Invalid(
            "We could not parse the JSON body of your request: expected a JSON object".into(),
        ));
    }
    serde_json::from_slice(bytes).map_err(|err| {
        ApiError::Invalid(format!(
            "We could not parse the JSON body of your request: {err}"
        ))
    })
}

/// 400 when a required list is empty.
pub(crate) fn non_empty(field: &str, len: usize) -> Result<(), ApiError> {
    if len == 0 {
        return Err(ApiError::Invalid(format!(
            "Invalid '{field}': empty array. Expected an array with minimum length 1, but got an empty array instead."
        )));
    }
    Ok(())
}

/// The smallest of the given caps; 400 if any is below 1.
pub(crate) fn max_tokens(caps: &[(&str, Option<u64>)]) -> Result<Option<u64>, ApiError> {
    let mut result: Option<u64> = None;
    for &(field, cap) in caps {
        let Some(cap) = cap else { continue };
        if cap < 1 {
            return Err(ApiError::Invalid(format!(
                "Invalid '{field}': integer below minimum value. Expected a value >= 1, but got {cap} instead."
            )));
        }
        result = Some(result.map_or(cap, |r| r.min(cap)));
    }
    Ok(result)
}

/// `(stream, include_usage)`; 400 for `stream_options` without `stream: true`.
pub(crate) fn stream_mode(
    stream: Option<bool>,
    options: Option<StreamOptions>,
) -> Result<(bool, bool), ApiError> {
    let stream = stream.unwrap_or(false);
    match options {
        Some(_) if !stream => Err(ApiError::Invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.".into(),
        )),
        Some(options) => Ok((true, options.include_usage.unwrap_or(false))),
        None => Ok((stream, false)),
    }
}

/// 400 unless `n` is absent or 1 (the mock generates one choice per prompt).
/// Completions generated per prompt for `best_of` (1 when absent); 400 outside
/// OpenAI's 1..=20.
pub(crate) fn best_of(best_of: Option<u64>) -> Result<u64, ApiError> {
    match best_of {
        None => Ok(1),
        Some(b @ 1..=20) => Ok(b),
        Some(b) => Err(ApiError::Invalid(format!(
            "Invalid 'best_of': must be between 1 and 20, got {b}."
        ))),
    }
}

pub(crate) fn single_choice(n: Option<u64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::Invalid(format!(
            "Invalid 'n': the mock upstream supports only n=1, got {n}."
        ))),
    }
}
