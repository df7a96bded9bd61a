//! Reading the real usage out of upstream responses: OpenAI's `usage` object
//! (`prompt_tokens`/`completion_tokens`), Anthropic's (`input_tokens`/
//! `output_tokens`), in whole bodies and in SSE events.

use crate::actor::SettleWith;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// Usage as both providers report it; missing and `null` fields count as 0
/// (Anthropic's SDK types several of them as optional).
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// OpenAI prompt tokens.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub prompt_tokens: u64,
    /// OpenAI completion tokens.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub completion_tokens: u64,
    /// Anthropic input tokens.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub input_tokens: u64,
    /// Anthropic output tokens.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub output_tokens: u64,
    /// Anthropic prompt-cache writes: input the provider processed (and counts
    /// against its input-token limits) that `input_tokens` leaves out. Cache
    /// reads are not added: Anthropic's input-token limits leave them out for
    /// most models, and charging them would only hold the tenant back.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub cache_creation_input_tokens: u64,
}

fn zero_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Option::<u64>::deserialize(d).map(Option::unwrap_or_default)
}

impl Usage {
    /// The settlement this usage implies.
    pub fn settle_with(self) -> SettleWith {
        SettleWith::Usage {
            prompt: self.prompt_tokens + self.input_tokens + self.cache_creation_input_tokens,
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
/// tokens, `message_delta` the cumulative output tokens. Returns whether this was
/// a `message_delta` with usage: until one comes, the output count is
/// `message_start`'s placeholder (about 1), and a stream that ends without one
/// (an `error` event mid-stream, then the end) has no final usage.
pub fn anthropic_event(data: &[u8], usage: &mut Option<Usage>) -> bool {
    let Ok(event) = serde_json::from_slice::<AnthropicEvent>(data) else {
        return false;
    };
    let seen = usage.get_or_insert_with(Usage::default);
    match event.kind.as_str() {
        "message_start" => {
            if let Some(u) = event.message.and_then(|m| m.usage) {
                seen.input_tokens = u.input_tokens;
                seen.cache_creation_input_tokens = u.cache_creation_input_tokens;
                seen.output_tokens = seen.output_tokens.max(u.output_tokens);
            }
            false
        }
        "message_delta" => {
            let Some(u) = event.usage else {
                return false;
            };
            seen.output_tokens = u.output_tokens;
            if u.input_tokens > 0 {
                seen.input_tokens = u.input_tokens;
            }
            if u.cache_creation_input_tokens > 0 {
                seen.cache_creation_input_tokens = u.cache_creation_input_tokens;
            }
            true
        }
        _ => false,
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
        let start = br#"{"type":"message_start","message":{"usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":900,"output_tokens":1}}}"#;
        assert!(!anthropic_event(start, &mut usage), "not final yet");
        let delta = br#"{"type":"content_block_delta","delta":{"text":"hi"}}"#;
        assert!(!anthropic_event(delta, &mut usage));
        let end = br#"{"type":"message_delta","usage":{"input_tokens":null,"cache_creation_input_tokens":null,"output_tokens":30}}"#;
        assert!(anthropic_event(end, &mut usage), "the final count");
        // Cache writes count as input; cache reads do not.
        assert_eq!(
            usage.unwrap().settle_with(),
            SettleWith::Usage {
                prompt: 112,
                completion: 30
            }
        );
    }
}
