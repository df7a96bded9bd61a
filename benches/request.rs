//! What a proxied request costs the node before and after the upstream call,
//! beyond the HTTP server and client: reading the body (JSON, the prompt's
//! tokens) and writing the rate-limit headers. The body is the one `tollgate
//! load` sends by default (gpt-4o-mini, a 16-token prompt, `max_tokens` 16), so
//! these figures are the shares of the end-to-end runs in docs/BENCHMARKS.md.
//! Run: `cargo bench --bench request` (about 20 s).

mod common;

use std::hint::black_box;

use axum::body::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tollgate::load::request::prompt;
use tollgate::proxy::headers::format_reset;
use tollgate::proxy::request::{Api, ParseSettings, parse};
use tollgate::tokens::{ChatMessage, CountMemo, Encoding, TokenCounter, count_chat_prompt};

/// A chat body as `tollgate load` sends it, with a prompt of `tokens` tokens.
fn chat_body(tokens: usize) -> Bytes {
    let body = serde_json::json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": prompt(tokens, 0)}],
        "max_tokens": 16,
    });
    Bytes::from(serde_json::to_vec(&body).expect("json"))
}

/// How a case's texts are counted.
#[derive(Clone, Copy)]
enum Memo {
    /// Without a memo.
    Off,
    /// Through the node's memo, a text new to it.
    Miss,
    /// Through the node's memo, a text it holds (or, under 256 bytes, one it
    /// passes by).
    Hit,
}

impl Memo {
    fn name(self, tokens: usize) -> &'static str {
        match self {
            Memo::Off => "",
            Memo::Miss => ", new to the memo",
            Memo::Hit if tokens < 64 => ", through the memo (too short for it)",
            Memo::Hit => ", through the memo (counted before)",
        }
    }
}

fn request(c: &mut Criterion) {
    let encoding = Encoding::for_openai_model("gpt-4o-mini").expect("known model");
    encoding.warm_up();
    // 16 tokens: the end-to-end runs' prompt (under the memo's 256 bytes: the
    // memo only adds a length check); 1,200: the seed scenario's, counted
    // without a memo, new to the memo (a miss: hashed, counted and stored; a
    // new tenant scope each time) and counted before (a hit: a text its tenant
    // sent lately, as a system prompt or a chat's history).
    let memo = CountMemo::new(1 << 16, Default::default(), Default::default());
    let cases = [
        (16, Memo::Off),
        (16, Memo::Hit),
        (1_200, Memo::Off),
        (1_200, Memo::Miss),
        (1_200, Memo::Hit),
    ];
    let mut scopes = (0u64..).map(|i| format!("tenant-{i}"));
    for (tokens, how) in cases {
        let body = chat_body(tokens);
        let name = format!(
            "request/parse/chat, one {tokens}-token message{}",
            how.name(tokens)
        );
        c.bench_function(&name, |b| {
            let parse_with = |counter: TokenCounter<'_>| {
                let settings = ParseSettings {
                    default_max_tokens: 4096,
                };
                let parsed = parse(Api::Chat, black_box(body.clone()), settings, |_| {
                    Ok(counter)
                });
                black_box(parsed.is_ok())
            };
            match how {
                Memo::Off => b.iter(|| parse_with(encoding.into())),
                Memo::Hit => b.iter(|| parse_with(TokenCounter::memoized(encoding, &memo, "t"))),
                Memo::Miss => b.iter_batched(
                    || scopes.next().expect("endless"),
                    |scope| parse_with(TokenCounter::memoized(encoding, &memo, &scope)),
                    BatchSize::SmallInput,
                ),
            }
        });
    }
    let text = serde_json::json!([{"role": "user", "content": prompt(16, 0)}]).to_string();
    let messages: Vec<ChatMessage> = serde_json::from_str(&text).expect("messages");
    c.bench_function("tokens/count_chat_prompt, one 16-token message", |b| {
        b.iter(|| black_box(count_chat_prompt(encoding, black_box(&messages))))
    });
    // The gateway's counter against tiktoken-rs's (the mock's), side by side.
    for (name, counted) in [
        ("o200k", Encoding::O200kBase),
        ("cl100k", Encoding::Cl100kBase),
    ] {
        counted.warm_up();
        counted.warm_up_reference();
        for tokens in [16, 1_200] {
            let text = prompt(tokens, 0);
            c.bench_function(
                &format!("tokens/count_text, {name}, the {tokens}-token prompt"),
                |b| b.iter(|| black_box(counted.count_text(black_box(&text)))),
            );
            c.bench_function(
                &format!(
                    "tokens/count_text_reference (tiktoken-rs), {name}, the {tokens}-token prompt"
                ),
                |b| b.iter(|| black_box(counted.count_text_reference(black_box(&text)))),
            );
        }
    }
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
