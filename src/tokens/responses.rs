//! Prompt tokens of a Responses API request (`POST /v1/responses`): the
//! `instructions`, every `input` item, and the `tools` definitions.
//!
//! The input is a string (one user message) or a list of items. Messages are
//! counted as chat messages are (framing, role, text parts; an image by its
//! `detail`, `super::openai_image_tokens`; another part at the flat
//! [`NON_TEXT_PART_TOKENS`]); a function call by its name and
//! arguments, a tool's output by its text. Any other item (a type this counter
//! does not know, a reasoning item, a built-in tool's call) is counted as the
//! tokens of its JSON text, which its syntax only inflates: more than the
//! provider counts, never less, for text it would bill. Tool definitions are
//! counted the same way.

use super::{
    NON_TEXT_PART_TOKENS, REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE, TOKENS_PER_NAME, TokenCounter,
    count_json,
};
use serde_json::Value;

/// Prompt tokens of a Responses API request.
pub fn count_responses_prompt<'c>(
    counter: impl Into<TokenCounter<'c>>,
    instructions: Option<&str>,
    input: Option<&Value>,
    tools: Option<&Value>,
) -> u64 {
    let counter = counter.into();
    let instructions = instructions.map_or(0, |text| {
        TOKENS_PER_MESSAGE + counter.count_role("system") + counter.count_text(text)
    });
    let input = match input {
        None | Some(Value::Null) => 0,
        Some(Value::String(text)) => {
            TOKENS_PER_MESSAGE + counter.count_role("user") + counter.count_text(text)
        }
        Some(Value::Array(items)) => items.iter().map(|item| count_item(counter, item)).sum(),
        Some(other) => count_json(counter, other),
    };
    let tools = tools.map_or(0, |t| match t {
        Value::Null => 0,
        other => count_json(counter, other),
    });
    instructions + input + tools + REPLY_PRIMING_TOKENS
}

/// One `input` item.
fn count_item(counter: TokenCounter<'_>, item: &Value) -> u64 {
    let kind = item.get("type").and_then(Value::as_str);
    let role = item.get("role").and_then(Value::as_str);
    match (kind, role) {
        // A message: `{"role": ..., "content": ...}`, its type optional.
        (None | Some("message"), Some(role)) => {
            let content = item.get("content").map_or(0, |c| count_content(counter, c));
            let name = (item.get("name").and_then(Value::as_str))
                .map_or(0, |n| TOKENS_PER_NAME + counter.count_text(n));
            TOKENS_PER_MESSAGE + counter.count_role(role) + content + name
        }
        (Some("function_call"), _) => {
            let text = |field| item.get(field).and_then(Value::as_str).unwrap_or("");
            TOKENS_PER_MESSAGE
                + counter.count_text(text("name"))
                + counter.count_text(text("arguments"))
        }
        (Some("function_call_output"), _) => {
            let output = item.get("output").map_or(0, |o| count_content(counter, o));
            TOKENS_PER_MESSAGE + output
        }
        _ => count_json(counter, item),
    }
}

/// A message's content: a string, or a list of parts (text parts by their
/// text, others at the flat non-text cost).
fn count_content(counter: TokenCounter<'_>, content: &Value) -> u64 {
    match content {
        Value::String(text) => counter.count_text(text),
        Value::Array(parts) => (parts.iter())
            .map(|part| {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(text)) => {
                        counter.count_text(text)
                    }
                    (Some("input_image"), _) => counter.image_tokens(
                        part.get("detail").and_then(Value::as_str),
                        part.get("image_url").and_then(Value::as_str),
                    ),
                    (Some("refusal"), _) => {
                        let refusal = part.get("refusal").and_then(Value::as_str);
                        counter.count_text(refusal.unwrap_or(""))
                    }
                    _ => NON_TEXT_PART_TOKENS,
                }
            })
            .sum(),
        Value::Null => 0,
        other => count_json(counter, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Encoding;
    use serde_json::json;

    const ENC: Encoding = Encoding::Cl100kBase;

    #[test]
    fn a_string_input_is_one_user_message_and_instructions_a_system_one() {
        let input = json!("Hello!");
        let counted = count_responses_prompt(ENC, Some("Be brief."), Some(&input), None);
        let expected =
            (TOKENS_PER_MESSAGE + ENC.count_text("system") + ENC.count_text("Be brief."))
                + (TOKENS_PER_MESSAGE + ENC.count_text("user") + ENC.count_text("Hello!"))
                + REPLY_PRIMING_TOKENS;
        assert_eq!(counted, expected);
    }

    #[test]
    fn items_count_their_text_calls_outputs_and_unknown_items_as_json() {
        let input = json!([
            {"role": "user", "content": [
                {"type": "input_text", "text": "What is in this image?"},
                {"type": "input_image", "image_url": "https://example.com/cat.png"}
            ]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21 C"},
            {"type": "some_future_item", "payload": "x y z"}
        ]);
        let counted = count_responses_prompt(ENC, None, Some(&input), None);
        let expected = (TOKENS_PER_MESSAGE
            + ENC.count_text("user")
            + ENC.count_text("What is in this image?")
            + crate::tokens::IMAGE_HIGH_DETAIL_MOST_TOKENS)
            + (TOKENS_PER_MESSAGE
                + ENC.count_text("get_weather")
                + ENC.count_text("{\"city\":\"Paris\"}"))
            + (TOKENS_PER_MESSAGE + ENC.count_text("sunny, 21 C"))
            + ENC.count_text(&input[3].to_string())
            + REPLY_PRIMING_TOKENS;
        assert_eq!(counted, expected);
    }

    #[test]
    fn tool_definitions_cost_what_their_json_text_does() {
        let tools = json!([{"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
        let without = count_responses_prompt(ENC, None, Some(&json!("hi")), None);
        let with = count_responses_prompt(ENC, None, Some(&json!("hi")), Some(&tools));
        assert_eq!(with - without, ENC.count_text(&tools.to_string()));
    }
}
