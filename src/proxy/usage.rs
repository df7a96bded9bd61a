//! Reading the real usage out of upstream responses: OpenAI's `usage` object
//! (`prompt_tokens`/`completion_tokens`), Anthropic's and the Responses API's
//! (`input_tokens`/`output_tokens`), in whole bodies and in SSE events.

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
    /// Anthropic and Responses API input tokens.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub input_tokens: u64,
    /// Anthropic and Responses API output tokens.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub output_tokens: u64,
    /// Anthropic prompt-cache writes: input the provider processed (and counts
    /// against its input-token limits) that `input_tokens` leaves out. Cache
    /// reads are not added: Anthropic's input-token limits leave them out for
    /// most models, and charging them would only hold the tenant back.
    #[serde(default, deserialize_with = "zero_if_null")]
    pub cache_creation_input_tokens: u64,
    /// Anthropic prompt-cache reads: input served from the cache, which
    /// `input_tokens` leaves out and most models' input-token limits do not
    /// count (a scope with `input_counts_cache_reads` counts them).
    #[serde(default, deserialize_with = "zero_if_null")]
    pub cache_read_input_tokens: u64,
}

fn zero_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Option::<u64>::deserialize(d).map(Option::unwrap_or_default)
}

impl Usage {
    /// The settlement this usage implies.
    pub fn settle_with(self) -> SettleWith {
        SettleWith::Usage {
            prompt: (self.prompt_tokens)
                .saturating_add(self.input_tokens)
                .saturating_add(self.cache_creation_input_tokens),
            cache_read: self.cache_read_input_tokens,
            completion: self.completion_tokens.saturating_add(self.output_tokens),
        }
    }
}

/// The most usage a provider may report for one request, past which its
/// figure is clamped (and logged, and counted): a broken or hostile provider
/// claiming 10^12 tokens would otherwise lock the tenant, and through the
/// upstream's limit every tenant on it, out for a window, and a figure near
/// 2^64 would wrap a sum.
///
/// - Output: what the request asked for at most (`max_tokens` x choices), or
///   [`crate::config::bounds::MAX_TOKENS_CAP`] per choice when it set no maximum.
/// - Input: twice the gateway's estimate plus 4,096 (the estimate is at or
///   above the provider's count for what the gateway can see,
///   docs/design/estimates.md); [`OPEN_INPUT_BOUND`] when the request carries
///   input the gateway cannot measure (a file or document part, a stored
///   conversation it continues, or escaped JSON text that could hide either).
///   Cache reads and writes count within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageBound {
    /// Most input tokens (cache reads and writes included).
    pub input: u64,
    /// Most output tokens.
    pub output: u64,
}

/// The input bound of a request whose input the gateway cannot measure: the
/// largest context window providers offer, rounded up.
pub const OPEN_INPUT_BOUND: u64 = 2_000_000;

/// Markers of input the gateway cannot measure, as they appear in a body:
/// file and document parts, a stored response or conversation continued, and
/// `\u` escapes (which could spell either).
const OPAQUE_MARKERS: [&[u8]; 5] = [
    b"\"file",
    b"\"document\"",
    b"\"previous_response_id\"",
    b"\"conversation\"",
    b"\\u",
];

impl UsageBound {
    /// The bound of a request estimated at `prompt` input tokens, producing at
    /// most `output`, with `body`.
    pub fn of(prompt: u64, output: u64, body: &[u8]) -> UsageBound {
        let opaque = (OPAQUE_MARKERS.iter()).any(|m| memchr::memmem::find(body, m).is_some());
        let input = if opaque {
            OPEN_INPUT_BOUND.max(prompt.saturating_mul(2))
        } else {
            prompt.saturating_mul(2).saturating_add(4_096)
        };
        UsageBound { input, output }
    }

    /// `how` within the bound, and whether it had to be clamped.
    pub fn clamp(&self, how: SettleWith) -> (SettleWith, bool) {
        let SettleWith::Usage {
            prompt,
            cache_read,
            completion,
        } = how
        else {
            return (how, false);
        };
        let prompt_in = prompt.min(self.input);
        let cache_in = cache_read.min(self.input.saturating_sub(prompt_in));
        let completion_in = completion.min(self.output);
        let clamped = (prompt_in, cache_in, completion_in) != (prompt, cache_read, completion);
        let how = SettleWith::Usage {
            prompt: prompt_in,
            cache_read: cache_in,
            completion: completion_in,
        };
        (how, clamped)
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
                seen.cache_read_input_tokens = u.cache_read_input_tokens;
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
            if u.cache_read_input_tokens > 0 {
                seen.cache_read_input_tokens = u.cache_read_input_tokens;
            }
            true
        }
        _ => false,
    }
}

#[derive(Deserialize)]
struct ResponsesEvent {
    #[serde(rename = "type")]
    kind: String,
    response: Option<WithUsage>,
}

/// Reads a Responses API SSE data payload: the events that end a response
/// (`response.completed`, `response.incomplete`, `response.failed`) carry the
/// response with its usage. Returns whether this was one with usage: the
/// response's final figure.
pub fn responses_event(data: &[u8], usage: &mut Option<Usage>) -> bool {
    let Ok(event) = serde_json::from_slice::<ResponsesEvent>(data) else {
        return false;
    };
    let ends = matches!(
        event.kind.as_str(),
        "response.completed" | "response.incomplete" | "response.failed"
    );
    match event.response.and_then(|r| r.usage) {
        Some(final_usage) if ends => {
            *usage = Some(final_usage);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_beyond_the_bound_is_clamped_and_within_it_passes() {
        let bound = UsageBound::of(100, 64, br#"{"messages":[{"role":"user","content":"hi"}]}"#);
        assert_eq!(
            bound,
            UsageBound {
                input: 4_296,
                output: 64
            }
        );
        let honest = SettleWith::Usage {
            prompt: 90,
            cache_read: 10,
            completion: 60,
        };
        assert_eq!(bound.clamp(honest), (honest, false));
        let (clamped, hit) = bound.clamp(SettleWith::Usage {
            prompt: u64::MAX,
            cache_read: u64::MAX,
            completion: 1 << 60,
        });
        assert!(hit);
        assert_eq!(
            clamped,
            SettleWith::Usage {
                prompt: 4_296,
                cache_read: 0,
                completion: 64
            }
        );
        assert_eq!(
            bound.clamp(SettleWith::KeepReserved),
            (SettleWith::KeepReserved, false)
        );
    }

    #[test]
    fn input_the_gateway_cannot_measure_widens_the_bound() {
        for body in [
            br#"{"input":[{"type":"input_file","file_id":"f"}]}"#.as_slice(),
            br#"{"previous_response_id":"resp_1","input":"go on"}"#,
            br#"{"content":[{"type":"document","source":{}}]}"#,
            br#"{"content":"file"}"#,
        ] {
            let bound = UsageBound::of(100, 64, body);
            assert_eq!(
                bound.input,
                OPEN_INPUT_BOUND,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

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
        // Cache writes count as input; cache reads are told apart, for the
        // scopes whose limits count them.
        assert_eq!(
            usage.unwrap().settle_with(),
            SettleWith::Usage {
                prompt: 112,
                cache_read: 900,
                completion: 30
            }
        );
    }

    #[test]
    fn a_responses_stream_settles_from_its_completed_event() {
        let mut usage = None;
        let created = br#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","usage":null}}"#;
        assert!(!responses_event(created, &mut usage));
        let delta = br#"{"type":"response.output_text.delta","sequence_number":3,"delta":"hi"}"#;
        assert!(!responses_event(delta, &mut usage));
        let done = br#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","usage":{"input_tokens":21,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":28}}}"#;
        assert!(responses_event(done, &mut usage), "the final count");
        assert_eq!(
            usage.unwrap().settle_with(),
            SettleWith::Usage {
                prompt: 21,
                cache_read: 0,
                completion: 7
            }
        );
        // A whole (non-stream) response reads the same top-level usage.
        let body = br#"{"id":"resp_1","object":"response","usage":{"input_tokens":21,"output_tokens":7,"total_tokens":28}}"#;
        assert_eq!(from_body(body).unwrap(), usage);
    }
}
