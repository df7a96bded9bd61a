//! Reading the real usage out of upstream responses: OpenAI's `usage` object
//! (`prompt_tokens`/`completion_tokens`), Anthropic's (`input_tokens`/
//! `output_tokens`), in whole bodies and in SSE events.

use crate::actor::SettleWith;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// Usage as both providers report it; missing fields count as 0.
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// OpenAI prompt tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// OpenAI completion tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Anthropic input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Anthropic output tokens.
    #[serde(default)]
    pub output_tokens: u64,
}

impl Usage {
    /// The settlement this usage implies.
    pub fn settle_with(self) -> SettleWith {
        SettleWith::Usage {
            prompt: self.prompt_tokens + self.input_tokens,
            completion: self.completion_tokens + self.output_tokens,
        }
    }
}

#[derive(Deserialize)]
struct WithUsage {
    usage: Option<Usage>,
}

/// Usage of a whole (non-stream) JSON body; `Err` if the body is not JSON at all.
pub fn from_body(body: &[u8]) -> Result<Option<Usage>, serde_json::Error> {
    serde_json::from_slice::<WithUsage>(body).map(|b| b.usage)
}

#[derive(Deserialize)]
struct OpenAiChunk {
    usage: Option<Usage>,
    choices: Option<Vec<IgnoredAny>>,
}

/// What one OpenAI SSE `data:` payload says.
#[derive(Debug, PartialEq, Eq)]
pub enum OpenAiEvent {
    /// A chunk carrying the final usage; `usage_only` when it has no choices (the
    /// extra chunk `include_usage` adds).
    Usage {
        /// The usage.
        usage: Usage,
        /// No choices in this chunk.
        usage_only: bool,
    },
    /// Anything else (content, `[DONE]`, unparseable).
    Other,
}

/// Classifies an OpenAI SSE data payload.
pub fn openai_event(data: &[u8]) -> OpenAiEvent {
    if data == b"[DONE]" {
        return OpenAiEvent::Other;
    }
    match serde_json::from_slice::<OpenAiChunk>(data) {
        Ok(OpenAiChunk {
            usage: Some(usage),
            choices,
        }) => OpenAiEvent::Usage {
            usage,
            usage_only: choices.is_none_or(|c| c.is_empty()),
        },
        _ => OpenAiEvent::Other,
    }
}

#[derive(Deserialize)]
struct AnthropicEvent {
    #[serde(rename = "type")]
    kind: String,
    message: Option<WithUsage>,
    usage: Option<Usage>,
}

/// Folds an Anthropic SSE data payload into `usage`: `message_start` carries input
/// tokens, `message_delta` the cumulative output tokens.
pub fn anthropic_event(data: &[u8], usage: &mut Option<Usage>) {
    let Ok(event) = serde_json::from_slice::<AnthropicEvent>(data) else {
        return;
    };
    let seen = usage.get_or_insert_with(Usage::default);
    match event.kind.as_str() {
        "message_start" => {
            if let Some(u) = event.message.and_then(|m| m.usage) {
                seen.input_tokens = u.input_tokens;
                seen.output_tokens = seen.output_tokens.max(u.output_tokens);
            }
        }
        "message_delta" => {
            if let Some(u) = event.usage {
                seen.output_tokens = u.output_tokens;
                if u.input_tokens > 0 {
                    seen.input_tokens = u.input_tokens;
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_usage_chunk_is_recognised() {
        let e = openai_event(br#"{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#);
        assert_eq!(
            e,
            OpenAiEvent::Usage {
                usage: Usage {
                    prompt_tokens: 3,
                    completion_tokens: 4,
                    ..Usage::default()
                },
                usage_only: true
            }
        );
        assert_eq!(
            openai_event(br#"{"choices":[{"delta":{}}],"usage":null}"#),
            OpenAiEvent::Other
        );
        assert_eq!(openai_event(b"[DONE]"), OpenAiEvent::Other);
        assert_eq!(openai_event(b"garbage"), OpenAiEvent::Other);
    }

    #[test]
    fn anthropic_usage_accumulates_over_events() {
        let mut usage = None;
        anthropic_event(br#"{"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":1}}}"#, &mut usage);
        anthropic_event(
            br#"{"type":"content_block_delta","delta":{"text":"hi"}}"#,
            &mut usage,
        );
        anthropic_event(
            br#"{"type":"message_delta","usage":{"output_tokens":30}}"#,
            &mut usage,
        );
        assert_eq!(
            usage.unwrap().settle_with(),
            SettleWith::Usage {
                prompt: 12,
                completion: 30
            }
        );
    }
}
