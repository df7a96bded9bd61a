//! What a proxied request costs the node before and after the upstream call,
//! beyond the HTTP server and client: reading the body (JSON, the prompt's
//! tokens) and writing the rate-limit headers. The body is the one `tollgate
//! load` sends by default (gpt-4o-mini, a 16-token prompt, `max_tokens` 16), so
//! these figures are the shares of the end-to-end runs in docs/BENCHMARKS.md.
//! Run: `cargo bench --bench request` (about 20 s).

mod common;

use std::hint::black_box;

use axum::body::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::load::request::prompt;
use tollgate::proxy::headers::format_reset;
use tollgate::proxy::request::{Api, ParseSettings, parse};
use tollgate::tokens::{ChatMessage, CountMemo, Counter, Encoding, count_chat_prompt};

/// A chat body as `tollgate load` sends it, with a prompt of `tokens` tokens.
fn chat_body(tokens: usize) -> Bytes {
    let body = serde_json::json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": prompt(tokens, 0)}],
        "max_tokens": 16,
    });
    Bytes::from(serde_json::to_vec(&body).expect("json"))
}

fn request(c: &mut Criterion) {
    let encoding = Encoding::for_openai_model("gpt-4o-mini").expect("known model");
    encoding.warm_up();
    // 16 tokens: the end-to-end runs' prompt; 1,200: the seed scenario's,
    // counted every time (without a memo, as before the thirty-second session,
    // or a text new to the memo) and answered from the node's memo (a text its
    // tenant sent lately: a system prompt, a chat's history).
    let memo = CountMemo::default();
    for (tokens, memoized) in [(16, false), (1_200, false), (1_200, true)] {
        let body = chat_body(tokens);
        let how = if memoized {
            ", counted before (memo)"
        } else {
            ""
        };
        let name = format!("request/parse/chat, one {tokens}-token message{how}");
        let counter = if memoized {
            Counter::memoized(encoding, &memo, "tenant")
        } else {
            encoding.into()
        };
        c.bench_function(&name, |b| {
            b.iter(|| {
                let settings = ParseSettings {
                    default_max_tokens: 4096,
                };
                let parsed = parse(Api::Chat, black_box(body.clone()), settings, |_| {
                    Ok(counter)
                });
                black_box(parsed.is_ok())
            })
        });
    }
    let text = serde_json::json!([{"role": "user", "content": prompt(16, 0)}]).to_string();
    let messages: Vec<ChatMessage> = serde_json::from_str(&text).expect("messages");
    c.bench_function("tokens/count_chat_prompt, one 16-token message", |b| {
        b.iter(|| black_box(count_chat_prompt(encoding, black_box(&messages))))
    });
    c.bench_function("tokens/count_text, the role \"user\"", |b| {
        b.iter(|| black_box(encoding.count_text(black_box("user"))))
    });
    c.bench_function("headers/format_reset, 1.5 s", |b| {
        b.iter(|| black_box(format_reset(black_box(1_500_000_000))))
    });
}

criterion_group! {
    name = benches;
    config = common::short_runs();
    targets = request
}
criterion_main!(benches);
