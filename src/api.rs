//! The APIs a node serves, as every layer names them: the proxy routes and
//! forwards by them, metrics label by them, the load generator sends them.

use crate::config::UpstreamKind;

/// The proxied APIs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/responses` (OpenAI's Responses API).
    Responses,
    /// `POST /v1/messages/count_tokens` (Anthropic): the provider's count of a
    /// message's input, no completion.
    CountTokens,
}

impl Api {
    /// Every API, in [`Api::index`] order.
    pub const ALL: [Api; 6] = [
        Api::Chat,
        Api::Completions,
        Api::Embeddings,
        Api::Messages,
        Api::Responses,
        Api::CountTokens,
    ];

    /// Path below the upstream's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/chat/completions",
            Api::Completions => "/completions",
            Api::Embeddings => "/embeddings",
            Api::Messages => "/messages",
            Api::Responses => "/responses",
            Api::CountTokens => "/messages/count_tokens",
        }
    }

    /// Position in per-API tables (0..6).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Upstream kind that serves this API.
    pub fn upstream_kind(self) -> UpstreamKind {
        match self {
            Api::Messages | Api::CountTokens => UpstreamKind::Anthropic,
            _ => UpstreamKind::Openai,
        }
    }

    /// Label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Embeddings => "embeddings",
            Api::Messages => "messages",
            Api::Responses => "responses",
            Api::CountTokens => "count_tokens",
        }
    }
}
