//! The mock's own token counts, as the providers document them, sharing no
//! code with the gateway's estimator (`crate::tokens`): the mock plays the
//! provider, and its counts are the ground truth the gateway's estimates are
//! judged by, so a blind spot of the estimator must show as a difference
//! here, not be copied.
//!
//! - Text: tiktoken-rs, with the encoding tiktoken names for the model
//!   (`cl100k_base` when it names none).
//! - Chat messages: OpenAI's cookbook ("How to count tokens with tiktoken"):
//!   3 tokens per message, its `role`, `content` and `name` (1 more for a
//!   name), 3 to prime the reply. A content part: its text; an image by
//!   OpenAI's vision rule (`detail: low` 85 tokens; otherwise 85 + 170 per
//!   512 px tile, by the image's size when the request carries the image as
//!   a `data:` URL; the mock fetches nothing, so an image given by address is
//!   charged the most a high-detail image can cost, [`IMAGE_MOST`]); audio
//!   ten tokens a second of it (`super::audio`); another part 85. An assistant's tool calls: each function's name and arguments.
//! - Tools: the cookbook's `num_tokens_for_tools` (per function 7 tokens, or
//!   10 on `cl100k_base` models, its `name:description`, 3 more and per
//!   property 3 plus `name:type:description`, enums 3 per item less 3, and 12
//!   to end).
//! - Responses API: `instructions` as a system message, the input's items
//!   as messages or calls, the tools as chat's.
//! - Anthropic: the same message rule; tools add Anthropic's documented tool
//!   system prompt ([`ANTHROPIC_TOOL_PROMPT`]) and each definition's JSON
//!   text; an image sent as base64 its width x height / 750 once scaled
//!   within Anthropic's limits (1,568 px on its long side, about 1.15
//!   megapixels); one given by address the most one costs
//!   ([`ANTHROPIC_IMAGE_MOST`]).

use serde_json::Value;
use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

/// The most a high-detail image costs on OpenAI's vision rule: scaled into
/// 2048 x 2048 and to 768 px on its short side, 2048 x 768 is 4 x 2 tiles.
pub(super) const IMAGE_MOST: u64 = 85 + 170 * 8;

/// Anthropic's tool-use system prompt, with `tool_choice` `auto` or `none`
/// (the larger of its two figures), added once when tools are defined.
pub(super) const ANTHROPIC_TOOL_PROMPT: u64 = 346;

/// The most an image costs at Anthropic: about 1.15 megapixels kept, / 750.
pub(super) const ANTHROPIC_IMAGE_MOST: u64 = 1_600;

/// Counts for one model.
#[derive(Clone, Copy)]
pub(super) struct Counter {
    bpe: &'static CoreBPE,
    /// The cookbook's per-function start: 7 on `o200k_base` models, 10 before.
    function_start: u64,
    /// Models that count images by 32 px patches: their multiplier, in
    /// thousandths; `None`: by 512 px tiles.
    patch_multiplier: Option<u64>,
}

/// OpenAI's models that count images by 32 px patches, with their multiplier
/// in thousandths (its vision guide's table).
const PATCH_MODELS: [(&str, u64); 5] = [
    ("gpt-5-mini", 1_620),
    ("gpt-5-nano", 2_460),
    ("gpt-4.1-mini", 1_620),
    ("gpt-4.1-nano", 2_460),
    ("o4-mini", 1_720),
];

impl Counter {
    /// The counter of `model`'s encoding.
    pub(super) fn for_model(model: &str) -> Counter {
        let patch_multiplier = (PATCH_MODELS.iter())
            .find(|(name, _)| model.starts_with(name))
            .map(|(_, multiplier)| *multiplier);
        let (bpe, function_start) = match get_tokenizer(model) {
            Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => {
                (tiktoken_rs::o200k_base_singleton(), 7)
            }
            _ => (tiktoken_rs::cl100k_base_singleton(), 10),
        };
        Counter {
            bpe,
            function_start,
            patch_multiplier,
        }
    }

    /// An OpenAI image by this model's rule.
    fn image(self, detail: Option<&str>, url: Option<&str>) -> u64 {
        match self.patch_multiplier {
            Some(multiplier) => patch_image(multiplier, url),
            None => openai_image(detail, url),
        }
    }

    /// Tokens of a text.
    pub(super) fn text(self, text: &str) -> u64 {
        self.bpe.count_ordinary(text) as u64
    }

    /// Prompt tokens of chat `messages` (each a message object).
    pub(super) fn chat(self, messages: &[Value]) -> u64 {
        let per_message: u64 = messages.iter().map(|m| self.message(m)).sum();
        per_message + 3
    }

    fn message(self, message: &Value) -> u64 {
        let text = |field: &str| message.get(field).and_then(Value::as_str);
        let role = text("role").map_or(0, |r| self.text(r));
        let name = text("name").map_or(0, |n| 1 + self.text(n));
        let content = message.get("content").map_or(0, |c| self.content(c));
        let calls: u64 = (message.get("tool_calls").and_then(Value::as_array))
            .into_iter()
            .flatten()
            .filter_map(|call| call.get("function"))
            .chain(message.get("function_call"))
            .map(|f| self.function_call(f))
            .sum();
        3 + role + name + content + calls
    }

    fn function_call(self, function: &Value) -> u64 {
        let text = |field: &str| function.get(field).and_then(Value::as_str).unwrap_or("");
        self.text(text("name")) + self.text(text("arguments"))
    }

    /// A message's content: a text, or parts.
    pub(super) fn content(self, content: &Value) -> u64 {
        match content {
            Value::String(text) => self.text(text),
            Value::Array(parts) => parts.iter().map(|p| self.part(p)).sum(),
            _ => 0,
        }
    }

    fn part(self, part: &Value) -> u64 {
        let text = part.get("text").and_then(Value::as_str);
        match (part.get("type").and_then(Value::as_str), text) {
            (Some("text" | "input_text" | "output_text"), Some(text)) => self.text(text),
            (Some("image_url"), _) => {
                let detail = part.pointer("/image_url/detail").and_then(Value::as_str);
                self.image(
                    detail,
                    part.pointer("/image_url/url").and_then(Value::as_str),
                )
            }
            (Some("input_image"), _) => self.image(
                part.get("detail").and_then(Value::as_str),
                part.get("image_url").and_then(Value::as_str),
            ),
            (Some("image"), _) => anthropic_image(part.get("source")),
            (Some("tool_use"), _) => {
                let name = part.get("name").and_then(Value::as_str).unwrap_or("");
                let input = part.get("input").map_or(0, |i| self.text(&i.to_string()));
                self.text(name) + input
            }
            (Some("tool_result"), _) => part.get("content").map_or(0, |c| self.content(c)),
            (Some("input_audio"), _) => part.get("input_audio").map_or(0, super::audio::tokens),
            _ => 85,
        }
    }

    /// OpenAI's tool definitions, by the cookbook's `num_tokens_for_tools`.
    pub(super) fn openai_tools(self, tools: &[Value]) -> u64 {
        if tools.is_empty() {
            return 0;
        }
        let functions = tools.iter().filter_map(|t| t.get("function").or(Some(t)));
        let counted: u64 = functions.map(|f| self.function(f)).sum();
        counted + 12
    }

    fn function(self, function: &Value) -> u64 {
        fn text<'v>(v: &'v Value, field: &str) -> &'v str {
            v.get(field).and_then(Value::as_str).unwrap_or("")
        }
        let description = text(function, "description");
        let line = format!(
            "{}:{}",
            text(function, "name"),
            description.trim_end_matches('.')
        );
        let mut count = self.function_start + self.text(&line);
        let properties = function
            .pointer("/parameters/properties")
            .and_then(Value::as_object);
        if let Some(properties) = properties.filter(|p| !p.is_empty()) {
            count += 3;
            for (key, property) in properties {
                count += 3;
                if let Some(items) = property.get("enum").and_then(Value::as_array) {
                    count = count.saturating_sub(3);
                    for item in items {
                        count += 3 + self.text(
                            &item
                                .as_str()
                                .map_or_else(|| item.to_string(), str::to_owned),
                        );
                    }
                }
                let described = text(property, "description").trim_end_matches('.');
                let kind = property.get("type").map_or_else(String::new, |t| match t {
                    Value::String(t) => t.clone(),
                    other => other.to_string(),
                });
                count += self.text(&format!("{key}:{kind}:{described}"));
            }
        }
        count
    }

    /// A Responses API request's input: `instructions` as a system message, a
    /// string `input` as a user message, items as messages, function calls by
    /// name and arguments, tool outputs by their text, other items by their
    /// JSON text; the tools as chat's; 3 to prime the reply.
    pub(super) fn responses(
        self,
        instructions: Option<&str>,
        input: Option<&Value>,
        tools: &[Value],
    ) -> u64 {
        let instructions = instructions.map_or(0, |text| 3 + self.text("system") + self.text(text));
        let input = match input {
            Some(Value::String(text)) => 3 + self.text("user") + self.text(text),
            Some(Value::Array(items)) => items.iter().map(|item| self.item(item)).sum(),
            _ => 0,
        };
        instructions + input + self.openai_tools(tools) + 3
    }

    fn item(self, item: &Value) -> u64 {
        match item.get("type").and_then(Value::as_str) {
            None | Some("message") if item.get("role").is_some() => self.message(item),
            Some("function_call") => self.function_call(item),
            Some("function_call_output") => item.get("output").map_or(0, |o| self.content(o)),
            _ => self.text(&item.to_string()),
        }
    }

    /// Anthropic's tool definitions: its tool system prompt and each
    /// definition's JSON text.
    pub(super) fn anthropic_tools(self, tools: &[Value]) -> u64 {
        if tools.is_empty() {
            return 0;
        }
        let definitions: u64 = tools.iter().map(|t| self.text(&t.to_string())).sum();
        ANTHROPIC_TOOL_PROMPT + definitions
    }
}

/// OpenAI's image rule: `low` 85; otherwise by the image's size when the
/// request carries it (a base64 `data:` URL: the size from its header), 85
/// plus 170 per 512 px tile of the image fitted into 2048 x 2048 and brought
/// down to 768 px on its short side; [`IMAGE_MOST`] without it.
fn openai_image(detail: Option<&str>, url: Option<&str>) -> u64 {
    if detail == Some("low") {
        return 85;
    }
    let Some((width, height)) = url.and_then(data_url_image_size) else {
        return IMAGE_MOST;
    };
    // In integers, scaled by 1,000 (thousandths of a pixel), rounding the
    // scaled sides up: a tile is only saved by a whole pixel.
    let (mut w, mut h) = (width.max(1) * 1_000, height.max(1) * 1_000);
    let long = w.max(h);
    if long > 2_048_000 {
        w = (w * 2_048_000).div_ceil(long);
        h = (h * 2_048_000).div_ceil(long);
    }
    let short = w.min(h);
    if short > 768_000 {
        w = (w * 768_000).div_ceil(short);
        h = (h * 768_000).div_ceil(short);
    }
    85 + 170 * w.div_ceil(512_000) * h.div_ceil(512_000)
}

/// OpenAI's patch rule: the 32 px patches covering the image; more than 1,536
/// and the image is scaled down until at most 1,536 cover it (the guide's
/// steps, in floating point as it writes them); then times the model's
/// multiplier. An image the mock cannot see (an address) costs the most.
fn patch_image(multiplier: u64, url: Option<&str>) -> u64 {
    const MOST: f64 = 1_536.0;
    let patches = match url.and_then(data_url_image_size) {
        None => MOST,
        Some((w, h)) => {
            let (w, h) = (w.max(1) as f64, h.max(1) as f64);
            let covering = (w / 32.0).ceil() * (h / 32.0).ceil();
            if covering <= MOST {
                covering
            } else {
                let mut r = (32.0 * 32.0 * MOST / (w * h)).sqrt();
                let (across, down) = (w * r / 32.0, h * r / 32.0);
                r *= (across.floor() / across).min(down.floor() / down);
                ((w * r / 32.0).ceil() * (h * r / 32.0).ceil()).min(MOST)
            }
        }
    };
    (patches as u64 * multiplier).div_ceil(1_000)
}

/// Anthropic's rule: an image larger than 1,568 px on its long side, or than
/// about 1.15 megapixels, is scaled down keeping its aspect; it then costs
/// width x height / 750. The mock fetches nothing: an image by address is
/// charged the most one can cost.
fn anthropic_image(source: Option<&Value>) -> u64 {
    let base64 = source
        .filter(|s| s.get("type").and_then(Value::as_str) == Some("base64"))
        .and_then(|s| s.get("data").and_then(Value::as_str));
    let Some((w, h)) = base64.and_then(base64_image_size) else {
        return ANTHROPIC_IMAGE_MOST;
    };
    let (mut w, mut h) = (w.max(1), h.max(1));
    let long = w.max(h);
    if long > 1_568 {
        (w, h) = (w * 1_568 / long, h * 1_568 / long);
    }
    const MOST_PIXELS: u64 = 1_092 * 1_092;
    if w * h > MOST_PIXELS {
        let scale = (MOST_PIXELS as f64 / (w * h) as f64).sqrt();
        (w, h) = ((w as f64 * scale) as u64, (h as f64 * scale) as u64);
    }
    (w * h).div_ceil(750)
}

/// The size of the image in a base64 `data:` URL, read from its header.
fn data_url_image_size(url: &str) -> Option<(u64, u64)> {
    let rest = url.strip_prefix("data:")?;
    base64_image_size(rest.split_once(";base64,")?.1)
}

/// The size of a base64 image, read from its header.
fn base64_image_size(data: &str) -> Option<(u64, u64)> {
    use base64::Engine;
    // The header is near the start: decode at most 128 KiB of it.
    let take = data.len().min(128 * 1024) / 4 * 4;
    let bytes = (base64::engine::general_purpose::STANDARD)
        .decode(&data.as_bytes()[..take])
        .ok()?;
    let size = imagesize::blob_size(&bytes).ok()?;
    Some((size.width as u64, size.height as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_cookbook_example_counts_19_and_its_tools_example_as_published() {
        let counter = Counter::for_model("gpt-4");
        let messages = [
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "user", "content": "Hello!"}),
        ];
        assert_eq!(counter.chat(&messages), 19);
        // One function with a described string property: 10 + "name:desc",
        // 3, 3 + "key:type:desc", 12 to end.
        let tools = [json!({"type": "function", "function": {
            "name": "get_weather", "description": "Weather now.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city."}}}}})];
        let expected = 10
            + counter.text("get_weather:Weather now")
            + 3
            + 3
            + counter.text("city:string:The city")
            + 12;
        assert_eq!(counter.openai_tools(&tools), expected);
        assert_eq!(Counter::for_model("gpt-4o").function_start, 7);
    }

    #[test]
    fn images_cost_by_detail_and_tool_traffic_by_its_text() {
        let counter = Counter::for_model("gpt-4o");
        let low = json!([{"type": "image_url", "image_url": {"url": "x", "detail": "low"}}]);
        let high = json!([{"type": "image_url", "image_url": {"url": "x"}}]);
        assert_eq!(counter.content(&low), 85);
        assert_eq!(counter.content(&high), 1_445);
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]});
        let plain = json!({"role": "assistant", "content": null});
        assert_eq!(
            counter.chat(&[call]) - counter.chat(&[plain]),
            counter.text("f") + counter.text("{\"a\":1}")
        );
    }
}
