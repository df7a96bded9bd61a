//! The gateway's prompt estimate against the mock's independent count, per kind
//! of request: a corpus of chats, tool definitions and calls, images, audio,
//! prompt lists, Responses items and Anthropic tools, each sent through a node, the
//! estimate read from what the node reserved (its metrics). The
//! estimate must never be below the provider's count (the reservation would be
//! short); the table of how far above it is, per kind, is docs/BENCHMARKS.md's
//! (`cargo test --test it estimates:: -- --nocapture`). The completion reserved
//! must cover what the provider bills too.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use serde_json::{Value, json};
use tollgate::proxy::request::Api;

/// One request of the corpus: its kind, API, path and body.
type Case = (&'static str, Api, &'static str, Value);

fn chat(model: &str, messages: Value, extra: Value) -> Value {
    let mut body = json!({"model": model, "max_tokens": 5, "messages": messages});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

fn tools(n: usize) -> Value {
    (0..n)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
            "description": "Look something up in the knowledge base and return the best passages.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "top_k": {"type": "integer", "description": "How many passages."},
                "lang": {"type": "string", "enum": ["en", "fr", "de"]}},
                "required": ["query"]}}})
        })
        .collect()
}

/// A PNG of `width` x `height` as a data URL: its signature and header, all
/// a size reader needs.
fn png(width: u32, height: u32) -> String {
    use base64::Engine;
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    bytes.extend_from_slice(&width.to_be_bytes());
    bytes.extend_from_slice(&height.to_be_bytes());
    bytes.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("data:image/png;base64,{data}")
}

fn image_chat(url: &str, detail: Option<&str>) -> Value {
    let mut image = json!({"url": url});
    if let Some(detail) = detail {
        image["detail"] = json!(detail);
    }
    chat(
        "gpt-4o",
        json!([{"role": "user", "content": [{"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": image}]}]),
        json!({}),
    )
}

fn tool_turns(n: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Find the refund policy."})];
    for i in 0..n {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"),
            "type": "function", "function": {"name": "tool_0", "arguments": "{\"query\":\"refund policy\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"),
            "content": "Refunds are accepted within 30 days of purchase with a receipt."}));
    }
    chat("gpt-4o-mini", json!(messages), json!({"tools": tools(1)}))
}

fn text_cases() -> Vec<Case> {
    let sentence = "The quick brown fox jumps over the lazy dog near the river bank. ";
    [1, 20, 200]
        .into_iter()
        .map(|n| {
            let text = sentence.repeat(n);
            let body = chat(
                "gpt-4o-mini",
                json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]),
                json!({}),
            );
            ("chat text", Api::Chat, "/chat/completions", body)
        })
        .collect()
}

fn tool_cases() -> Vec<Case> {
    let ask = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let mut cases: Vec<Case> = [1, 4, 16]
        .into_iter()
        .map(|n| {
            let extra = json!({"tools": tools(n), "tool_choice": "auto"});
            let body = chat("gpt-4o-mini", ask.clone(), extra);
            ("tool definitions", Api::Chat, "/chat/completions", body)
        })
        .collect();
    cases.extend([1, 3, 8].into_iter().map(|n| {
        let body = tool_turns(n);
        (
            "tool calls and results",
            Api::Chat,
            "/chat/completions",
            body,
        )
    }));
    cases
}

fn image_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = [(512, 512), (1024, 1024), (2048, 1024), (4000, 3000)]
        .into_iter()
        .map(|(w, h)| {
            let body = image_chat(&png(w, h), None);
            ("image as data, high", Api::Chat, "/chat/completions", body)
        })
        .collect();
    cases.push((
        "image as data, low",
        Api::Chat,
        "/chat/completions",
        image_chat(&png(1024, 1024), Some("low")),
    ));
    for url in [
        png(1024, 1024),
        png(1800, 2400),
        "https://example.com/a.png".into(),
    ] {
        let mut body = image_chat(&url, None);
        body["model"] = json!("gpt-4.1-mini");
        cases.push(("image, a patch model", Api::Chat, "/chat/completions", body));
    }
    cases.push((
        "image by address, high",
        Api::Chat,
        "/chat/completions",
        image_chat("https://example.com/a.png", None),
    ));
    cases
}

/// A PCM wav of `millis` at 24 kHz, 16-bit mono, base64.
fn wav(millis: u32) -> String {
    use base64::Engine;
    let audio = 48 * millis;
    let mut bytes = b"RIFF".to_vec();
    bytes.extend((36 + audio).to_le_bytes());
    bytes.extend(b"WAVEfmt \x10\0\0\0\x01\0\x01\0");
    bytes.extend(24_000u32.to_le_bytes());
    bytes.extend(48_000u32.to_le_bytes());
    bytes.extend([2, 0, 16, 0]);
    bytes.extend(b"data");
    bytes.extend(audio.to_le_bytes());
    bytes.resize(bytes.len() + audio as usize, 0);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A constant-bitrate mp3 of `frames` MPEG-1 Layer III frames (128 kbit/s,
/// 48 kHz: 24 ms each), base64.
fn mp3(frames: usize) -> String {
    use base64::Engine;
    let frame = [&[0xff, 0xfb, 0x94, 0x00][..], &[0u8; 380]].concat();
    base64::engine::general_purpose::STANDARD.encode(frame.repeat(frames))
}

fn audio_cases() -> Vec<Case> {
    let ask = |data: String, format: &str| {
        chat(
            "gpt-4o-audio-preview",
            json!([{"role": "user", "content": [{"type": "text", "text": "Transcribe this."},
                {"type": "input_audio", "input_audio": {"data": data, "format": format}}]}]),
            json!({}),
        )
    };
    vec![
        (
            "audio, wav (1 s, 30 s)",
            Api::Chat,
            "/chat/completions",
            ask(wav(1_000), "wav"),
        ),
        (
            "audio, wav (1 s, 30 s)",
            Api::Chat,
            "/chat/completions",
            ask(wav(30_000), "wav"),
        ),
        (
            "audio, mp3 (2.4 s)",
            Api::Chat,
            "/chat/completions",
            ask(mp3(100), "mp3"),
        ),
    ]
}

fn list_and_responses_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = [(1, 1), (3, 1), (10, 1), (3, 4)]
        .into_iter()
        .map(|(n, best_of)| {
            let prompts: Vec<String> = (0..n).map(|i| format!("Summarise chapter {i}.")).collect();
            let body = json!({"model": "gpt-3.5-turbo-instruct", "max_tokens": 5,
                "best_of": best_of, "prompt": prompts});
            ("list of prompts", Api::Completions, "/completions", body)
        })
        .collect();
    cases.extend([1, 4].into_iter().map(|calls| {
        let mut input = vec![json!({"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]})];
        for i in 0..calls {
            input.push(json!({"type": "function_call", "call_id": format!("c{i}"), "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}));
            input.push(json!({"type": "function_call_output", "call_id": format!("c{i}"), "output": "sunny, 21 C"}));
        }
        let body = json!({"model": "gpt-4o-mini", "max_output_tokens": 5, "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "get_weather", "description": "Current weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "input": input});
        ("Responses items", Api::Responses, "/responses", body)
    }));
    cases
}

fn anthropic_image_cases() -> Vec<Case> {
    [(200, 200), (1000, 1000), (4000, 3000)]
        .into_iter()
        .map(|(w, h)| {
            let data = png(w, h).replace("data:image/png;base64,", "");
            let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
                    {"type": "text", "text": "What is this?"}]}]});
            ("Anthropic image as data", Api::Messages, "/messages", body)
        })
        .collect()
}

fn anthropic_cases() -> Vec<Case> {
    [1, 4]
        .into_iter()
        .map(|n| {
            let tools: Vec<Value> = (0..n)
                .map(|i| json!({"name": format!("read_file_{i}"), "description": "Read a file of the repository.",
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}))
                .collect();
            let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 5, "system": "Be brief.",
                "tools": tools, "messages": [{"role": "user", "content": "What does main.rs do?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file_0",
                    "input": {"path": "src/main.rs"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                    "content": "fn main() {}"}]}]});
            ("Anthropic tools and tool use", Api::Messages, "/messages", body)
        })
        .collect()
}

/// The tokens the node's tenant scope has reserved so far (its tokens window
/// charges the prompt estimate plus the completion reserved).
async fn reserved_so_far(node: &Node) -> u64 {
    let text = metrics(node).await;
    (text.lines())
        .find(|l| l.starts_with("tollgate_tokens_reserved_total{scope=\"tenant\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The completion the node reserves for `body`: its `max_tokens` (5), once
/// per prompt of a list and per completion `best_of` generates.
fn completion_reserved(body: &Value) -> u64 {
    let prompts = body["prompt"].as_array().map_or(1, |p| p.len() as u64);
    prompts * body["best_of"].as_u64().unwrap_or(1) * 5
}

#[tokio::test]
async fn the_estimate_is_never_below_the_providers_count_for_any_kind_of_request() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("tpm = 100000000"), &[&upstream]).await;
    let mut cases = text_cases();
    cases.extend(tool_cases());
    cases.extend(image_cases());
    cases.extend(list_and_responses_cases());
    cases.extend(anthropic_cases());
    cases.extend(anthropic_image_cases());
    cases.extend(audio_cases());
    // Per kind: (estimate - count) / count of each request.
    let mut errors: Vec<(&str, Vec<f64>)> = Vec::new();
    for (kind, api, path, body) in cases {
        let before = reserved_so_far(&node).await;
        let headers: &[(&str, &str)] = if api == Api::Messages {
            &[("anthropic-version", "2023-06-01")]
        } else {
            &[]
        };
        let response = json(post(&node, path, body.clone(), headers).await).await;
        let reserved = reserved_so_far(&node).await - before;
        let estimate = (reserved.checked_sub(completion_reserved(&body))).unwrap_or_else(|| {
            panic!("{kind}: {reserved} reserved, less than it may bill: {body}")
        });
        let usage = &response["usage"];
        let counted = (usage["prompt_tokens"].as_u64())
            .or(usage["input_tokens"].as_u64())
            .unwrap_or_else(|| panic!("no usage: {response}"));
        assert!(
            estimate >= counted,
            "{kind}: estimate {estimate} below the provider's {counted}: {body}"
        );
        // The completion reserved covers what the provider bills (every
        // `best_of` completion of every prompt).
        let billed = (usage["completion_tokens"].as_u64())
            .or(usage["output_tokens"].as_u64())
            .unwrap_or(0);
        assert!(
            billed <= completion_reserved(&body),
            "{kind}: {billed} completion tokens billed, more than reserved: {body}"
        );
        let error = (estimate - counted) as f64 / counted as f64;
        match errors.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, list)) => list.push(error),
            None => errors.push((kind, vec![error])),
        }
    }
    println!("| kind | requests | median over | worst over |\n|---|---|---|---|");
    for (kind, mut list) in errors {
        list.sort_by(f64::total_cmp);
        let median = list[list.len() / 2];
        let worst = list[list.len() - 1];
        println!(
            "| {kind} | {} | {:+.1}% | {:+.1}% |",
            list.len(),
            median * 100.0,
            worst * 100.0
        );
    }
    node.stop().await;
    upstream.shutdown().await.unwrap();
}
