//! Token usage reported by a response: a JSON body, or usage events inside an SSE stream.
//!
//! Only the `usage` object is deserialized (serde skips every other field). OpenAI
//! names its fields `prompt_tokens`/`completion_tokens`; Anthropic
//! `input_tokens`/`output_tokens`. Streams: OpenAI sends one final chunk with `usage`
//! when asked (`stream_options.include_usage`); Anthropic sends `message_start`
//! (`message.usage`, input and a first output count) and `message_delta` (`usage`,
//! cumulative output); the Responses API sends the response with its usage in
//! `response.completed`. The last value seen for each field wins.

use serde::Deserialize;

/// Longest SSE line kept while waiting for its end; longer lines are skipped unread.
pub const MAX_SSE_LINE_BYTES: usize = 1 << 20;

/// Tokens one response reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens, if reported.
    pub prompt: Option<u64>,
    /// Completion (output) tokens, if reported.
    pub completion: Option<u64>,
}

impl Usage {
    /// Whether the response reported any usage at all.
    pub fn is_reported(&self) -> bool {
        self.prompt.is_some() || self.completion.is_some()
    }

    fn merge(&mut self, fields: &UsageFields) {
        if let Some(n) = fields.prompt_tokens.or(fields.input_tokens) {
            self.prompt = Some(n);
        }
        if let Some(n) = fields.completion_tokens.or(fields.output_tokens) {
            self.completion = Some(n);
        }
    }
}

#[derive(Deserialize)]
struct UsageFields {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

/// A JSON body or SSE event: `usage` at the top, or inside `message` (Anthropic's
/// `message_start`) or `response` (the Responses API's `response.completed`).
#[derive(Deserialize)]
struct Envelope {
    usage: Option<UsageFields>,
    message: Option<Message>,
    response: Option<Message>,
}

#[derive(Deserialize)]
struct Message {
    usage: Option<UsageFields>,
}

impl Envelope {
    fn merge_into(&self, usage: &mut Usage) {
        for inner in [&self.message, &self.response] {
            if let Some(fields) = inner.as_ref().and_then(|m| m.usage.as_ref()) {
                usage.merge(fields);
            }
        }
        if let Some(fields) = &self.usage {
            usage.merge(fields);
        }
    }
}

/// Usage from a complete (non-streamed) JSON response body; empty if absent or unparsable.
pub fn from_json(body: &[u8]) -> Usage {
    let mut usage = Usage::default();
    if let Ok(envelope) = serde_json::from_slice::<Envelope>(body) {
        envelope.merge_into(&mut usage);
    }
    usage
}

/// Incremental SSE reader that keeps only usage. Feed it body chunks as they arrive;
/// lines may be split anywhere across chunks. Only `data:` lines mentioning `usage` are
/// parsed as JSON.
#[derive(Debug, Default)]
pub struct SseUsage {
    partial: Vec<u8>,
    skipping: bool,
    usage: Usage,
}

impl SseUsage {
    /// Consumes one chunk of the stream.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = (&chunk[..end], &chunk[end + 1..]);
            if self.skipping {
                self.skipping = false;
            } else if self.partial.is_empty() {
                self.line(line);
            } else {
                let mut joined = std::mem::take(&mut self.partial);
                joined.extend_from_slice(line);
                self.line(&joined);
                joined.clear();
                self.partial = joined;
            }
            chunk = rest;
        }
        if self.skipping || chunk.is_empty() {
            return;
        }
        if self.partial.len() + chunk.len() > MAX_SSE_LINE_BYTES {
            self.partial.clear();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(chunk);
        }
    }

    /// The usage seen so far (a final line without a newline is not an event yet).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if !has_usage_object(data) {
            return;
        }
        if let Ok(envelope) = serde_json::from_slice::<Envelope>(data) {
            envelope.merge_into(&mut self.usage);
        }
    }
}

/// Whether `data` has a `"usage": {` key; OpenAI sends `"usage":null` on every chunk
/// when usage was asked for, and those need no JSON parse. A `"usage"` inside a JSON
/// string is escaped (`\"usage\"`), so generated text cannot match.
fn has_usage_object(data: &[u8]) -> bool {
    const KEY: &[u8] = b"\"usage\"";
    let skip_ws = |s: &[u8]| -> usize { s.iter().take_while(|b| b.is_ascii_whitespace()).count() };
    let mut rest = data;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        rest = &rest[at + KEY.len()..];
        let after = &rest[skip_ws(rest)..];
        if let Some(value) = after.strip_prefix(b":")
            && value[skip_ws(value)..].first() == Some(&b'{')
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI_STREAM: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,",
        "\"completion_tokens\":34,\"total_tokens\":46}}\n\n",
        "data: [DONE]\n\n",
    );

    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\r\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],",
        "\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n",
        "event: content_block_delta\r\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,",
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"usage\"}}\r\n\r\n",
        "event: message_delta\r\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},",
        "\"usage\":{\"output_tokens\":15}}\r\n\r\n",
        "event: message_stop\r\n",
        "data: {\"type\":\"message_stop\"}\r\n\r\n",
    );

    fn feed_in_pieces(stream: &str, piece: usize) -> Usage {
        let mut sse = SseUsage::default();
        for chunk in stream.as_bytes().chunks(piece) {
            sse.feed(chunk);
        }
        sse.usage()
    }

    #[test]
    fn openai_stream_usage_chunk_is_found_however_it_is_split() {
        let want = Usage {
            prompt: Some(12),
            completion: Some(34),
        };
        for piece in [1, 2, 7, 64, OPENAI_STREAM.len()] {
            assert_eq!(feed_in_pieces(OPENAI_STREAM, piece), want, "piece={piece}");
        }
    }

    #[test]
    fn anthropic_stream_takes_input_from_start_and_output_from_delta() {
        let want = Usage {
            prompt: Some(25),
            completion: Some(15),
        };
        for piece in [1, 3, 50, ANTHROPIC_STREAM.len()] {
            assert_eq!(
                feed_in_pieces(ANTHROPIC_STREAM, piece),
                want,
                "piece={piece}"
            );
        }
    }

    #[test]
    fn only_usage_objects_are_worth_parsing() {
        assert!(has_usage_object(br#"{"usage":{"prompt_tokens":1}}"#));
        assert!(has_usage_object(br#"{"a":1, "usage" : { "x": 1}}"#));
        assert!(has_usage_object(
            br#"{"usage":null,"message":{"usage":{}}}"#
        ));
        assert!(!has_usage_object(br#"{"choices":[],"usage":null}"#));
        assert!(!has_usage_object(
            br#"{"delta":{"text":"say \"usage\": {"}}"#
        ));
        assert!(!has_usage_object(br#"{"usage""#));
    }

    #[test]
    fn stream_without_usage_reports_none() {
        let stream = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert!(!feed_in_pieces(stream, 5).is_reported());
    }

    #[test]
    fn overlong_lines_are_skipped_and_reading_resumes() {
        let mut sse = SseUsage::default();
        sse.feed(b"data: {\"usage\":{\"prompt_tokens\":");
        sse.feed(&vec![b'1'; MAX_SSE_LINE_BYTES]);
        assert!(sse.partial.is_empty());
        sse.feed(b"}}\ndata: {\"usage\":{\"completion_tokens\":3}}\n");
        assert_eq!(
            sse.usage(),
            Usage {
                prompt: None,
                completion: Some(3)
            }
        );
    }

    #[test]
    fn json_bodies_of_each_api() {
        let chat = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],
            "usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
        assert_eq!(
            from_json(chat),
            Usage {
                prompt: Some(9),
                completion: Some(2)
            }
        );
        let embed =
            br#"{"data":[{"embedding":[0.1,0.2]}],"usage":{"prompt_tokens":5,"total_tokens":5}}"#;
        assert_eq!(
            from_json(embed),
            Usage {
                prompt: Some(5),
                completion: None
            }
        );
        let anthropic = br#"{"type":"message","usage":{"input_tokens":7,"output_tokens":8}}"#;
        assert_eq!(
            from_json(anthropic),
            Usage {
                prompt: Some(7),
                completion: Some(8)
            }
        );
        assert!(!from_json(b"not json").is_reported());
        assert!(!from_json(br#"{"error":{"message":"x"}}"#).is_reported());
    }
}
