//! Integration tests of the mock upstream over real HTTP on port 0: exact limits and
//! their 429s, streaming formats, token accounting, determinism, the log and /stats.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a panic is the test failing"
)]

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tollgate::mock::{self, Api, LogLine, MockConfig, MockHandle, MockStats, Outcome, Reason};
use tollgate::tokens::{ChatMessage, Encoding, count_chat_prompt};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("missing header {name}: {:?}", self.headers))
            .to_str()
            .unwrap()
    }

    /// `data:` payloads of an SSE body, with their `event:` names.
    fn events(&self) -> Vec<(Option<String>, String)> {
        assert!(
            self.body.ends_with("\n\n"),
            "unterminated stream: {:?}",
            self.body
        );
        self.body
            .split_terminator("\n\n")
            .map(|frame| {
                let mut event = None;
                let mut data = None;
                for line in frame.lines() {
                    if let Some(name) = line.strip_prefix("event: ") {
                        event = Some(name.to_owned());
                    } else if let Some(payload) = line.strip_prefix("data: ") {
                        data = Some(payload.to_owned());
                    } else {
                        panic!("unexpected SSE line {line:?}");
                    }
                }
                (event, data.expect("frame without data"))
            })
            .collect()
    }
}

async fn send(mock: &MockHandle, path: &str, body: &str, key: Option<&str>) -> Reply {
    let client = reqwest::Client::new();
    let mut request = client
        .post(format!("{}{path}", mock.base_url()))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    Reply {
        status,
        headers,
        body: response.text().await.unwrap(),
    }
}

async fn post(mock: &MockHandle, path: &str, body: Value) -> Reply {
    send(mock, path, &body.to_string(), None).await
}

fn chat_body(content: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]})
}

fn prompt_tokens(encoding: Encoding, messages: &Value) -> u64 {
    let text = messages.to_string();
    let messages: Vec<ChatMessage> = serde_json::from_str(&text).unwrap();
    count_chat_prompt(encoding, &messages)
}

fn fixed_completion(tokens: u64) -> MockConfig {
    MockConfig {
        completion_min_tokens: tokens,
        completion_max_tokens: tokens,
        ..MockConfig::default()
    }
}

#[tokio::test]
async fn rpm_limit_admits_exactly_n_then_429_with_headers_and_retry_after_that_is_not_early()
-> TestResult {
    let mock = mock::spawn(MockConfig {
        rpm: 3,
        window_ms: 2000,
        ..MockConfig::default()
    })
    .await?;
    for remaining in ["2", "1", "0"] {
        let reply = post(&mock, "/chat/completions", chat_body("hi")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.header("x-ratelimit-limit-requests"), "3");
        assert_eq!(reply.header("x-ratelimit-remaining-requests"), remaining);
        assert!(reply.headers.get("x-ratelimit-limit-tokens").is_none());
    }
    let refused = post(&mock, "/chat/completions", chat_body("hi")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let error = &refused.json()["error"];
    assert_eq!(error["type"], "requests");
    assert_eq!(error["code"], "rate_limit_exceeded");
    assert_eq!(error["param"], Value::Null);
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), "0");
    let retry_ms: u64 = refused.header("retry-after-ms").parse()?;
    let retry_secs: u64 = refused.header("retry-after").parse()?;
    assert!((1..=2000).contains(&retry_ms), "retry-after-ms {retry_ms}");
    assert_eq!(retry_secs, retry_ms.div_ceil(1000));
    assert!(refused.header("x-ratelimit-reset-requests").ends_with('s'));
    tokio::time::sleep(Duration::from_millis(retry_ms)).await;
    let after = post(&mock, "/chat/completions", chat_body("hi")).await;
    assert_eq!(
        after.status,
        StatusCode::OK,
        "refused after waiting retry-after-ms: {}",
        after.body
    );
    let stats = mock.stats();
    assert_eq!((stats.admitted, stats.refused.requests), (4, 1));
    assert_eq!(stats.peak_window_requests, 3);
    mock.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn tpm_limit_charges_prompt_plus_completion() -> TestResult {
    let messages = json!([{"role": "user", "content": "Hello there, how are you?"}]);
    let prompt = prompt_tokens(Encoding::O200kBase, &messages);
    let cost = prompt + 10;
    // Room for two requests by prompt + completion, four by prompt alone.
    let config = MockConfig {
        tpm: 2 * cost + cost / 2,
        window_ms: 2000,
        ..fixed_completion(10)
    };
    assert!(
        config.tpm >= 4 * prompt,
        "test needs prompt-only accounting to differ"
    );
    let mock = mock::spawn(config.clone()).await?;
    let body = json!({"model": "gpt-4o-mini", "messages": messages});
    for used in [cost, 2 * cost] {
        let reply = post(&mock, "/chat/completions", body.clone()).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["usage"]["prompt_tokens"], prompt);
        assert_eq!(
            reply.header("x-ratelimit-remaining-tokens"),
            (config.tpm - used).to_string()
        );
    }
    let refused = post(&mock, "/chat/completions", body).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.json()["error"]["type"], "tokens");
    assert_eq!(
        refused.header("x-ratelimit-limit-tokens"),
        config.tpm.to_string()
    );
    let stats = mock.stats();
    assert_eq!((stats.admitted, stats.refused.tokens), (2, 1));
    assert_eq!(stats.peak_window_tokens, 2 * cost);
    mock.shutdown().await?;
    Ok(())
}

async fn open_stream(mock: &MockHandle) -> reqwest::Response {
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true});
    let response = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url()))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response
}

async fn wait_for_in_flight(mock: &MockHandle, expected: u64) {
    for _ in 0..5000 {
        if mock.stats().in_flight == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "in_flight stuck at {} (wanted {expected})",
        mock.stats().in_flight
    );
}

#[tokio::test]
async fn concurrency_limit_holds_slots_until_streams_end_or_clients_leave() -> TestResult {
    let config = MockConfig {
        concurrency: 2,
        inter_token_ms: 40,
        ..fixed_completion(10)
    };
    let mock = mock::spawn(config).await?;
    let first = open_stream(&mock).await;
    let second = open_stream(&mock).await;
    let refused = post(&mock, "/chat/completions", chat_body("x")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("concurrent")
    );
    assert!(refused.headers.contains_key("retry-after"));
    // Reading a stream to its end frees its slot.
    let text = first.text().await?;
    assert!(text.ends_with("data: [DONE]\n\n"));
    let admitted = post(&mock, "/chat/completions", chat_body("x")).await;
    assert_eq!(admitted.status, StatusCode::OK);
    // A client that goes away mid-stream frees its slot too.
    drop(second);
    wait_for_in_flight(&mock, 0).await;
    let stats = mock.stats();
    assert_eq!(
        (
            stats.admitted,
            stats.refused.concurrency,
            stats.max_in_flight
        ),
        (3, 1, 2)
    );
    mock.shutdown().await?;
    Ok(())
}

/// Content of a chat stream's chunks, and checks every chunk's shape.
fn chat_stream_content(reply: &Reply, include_usage: bool) -> (String, Vec<Value>) {
    let events = reply.events();
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(event, data)| {
            assert!(event.is_none());
            serde_json::from_str(data).unwrap()
        })
        .collect();
    let mut content = String::new();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk.get("usage").is_some(), include_usage, "{chunk}");
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(text);
        }
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    (content, chunks)
}

#[tokio::test]
async fn chat_streams_match_openai_with_and_without_include_usage() -> TestResult {
    let mock = mock::spawn(MockConfig {
        seed: 3,
        ..MockConfig::default()
    })
    .await?;
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]);
    let prompt = prompt_tokens(Encoding::O200kBase, &messages);
    let plain = json!({"model": "gpt-4o", "messages": messages, "stream": true, "max_tokens": 40});
    let reply = post(&mock, "/chat/completions", plain).await;
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let (content, chunks) = chat_stream_content(&reply, false);
    let tokens = Encoding::O200kBase.count_text_reference(&content);
    let finish = &chunks.last().unwrap()["choices"][0]["finish_reason"];
    assert_eq!(finish, if tokens == 40 { "length" } else { "stop" });

    let with_usage = json!({"model": "gpt-4o", "messages": messages, "stream": true,
        "stream_options": {"include_usage": true}});
    let reply = post(&mock, "/chat/completions", with_usage).await;
    let (content, chunks) = chat_stream_content(&reply, true);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert!(rest.iter().all(|c| c["usage"].is_null()));
    assert_eq!(usage_chunk["choices"], json!([]));
    let completion = Encoding::O200kBase.count_text_reference(&content);
    let expected = json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion});
    assert_eq!(usage_chunk["usage"], expected);
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert_eq!(mock.stats().completion_tokens, tokens + completion);
    mock.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn messages_stream_reports_usage_in_message_start_and_message_delta() -> TestResult {
    let mock = mock::spawn(MockConfig {
        seed: 9,
        ..MockConfig::default()
    })
    .await?;
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": true,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello, Claude"}]}]});
    let reply = post(&mock, "/messages", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let events = reply.events();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_deref().unwrap()).collect();
    let deltas = names.len() - 5;
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (name, value) in names.iter().zip(&data) {
        assert_eq!(value["type"], *name);
    }
    let messages = json!([{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello, Claude"}]);
    let input = prompt_tokens(Encoding::Cl100kBase, &messages);
    assert_eq!(data[0]["message"]["usage"]["input_tokens"], input);
    let text: String = data[2..2 + deltas]
        .iter()
        .map(|d| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    let output = Encoding::Cl100kBase.count_text_reference(&text);
    let message_delta = &data[data.len() - 2];
    assert_eq!(message_delta["usage"]["output_tokens"], output);
    let stop = if output == 100 {
        "max_tokens"
    } else {
        "end_turn"
    };
    assert_eq!(message_delta["delta"]["stop_reason"], stop);
    assert_eq!(mock.stats().prompt_tokens, input);
    mock.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn completion_never_exceeds_max_tokens_and_text_matches_usage() -> TestResult {
    for seed in 0..4 {
        let mock = mock::spawn(MockConfig {
            seed,
            ..MockConfig::default()
        })
        .await?;
        let mut hit = 0;
        for i in 0..40u64 {
            let cap = 1 + (i * 37 + seed * 11) % 200;
            let field = if i % 2 == 0 {
                "max_tokens"
            } else {
                "max_completion_tokens"
            };
            let mut body = chat_body("count me");
            body[field] = json!(cap);
            let reply = post(&mock, "/chat/completions", body).await.json();
            let usage = &reply["usage"];
            let completion = usage["completion_tokens"].as_u64().unwrap();
            assert!(completion <= cap, "seed={seed} i={i}: {completion} > {cap}");
            let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(
                Encoding::O200kBase.count_text_reference(content),
                completion,
                "seed={seed} i={i}"
            );
            let finish = reply["choices"][0]["finish_reason"].as_str().unwrap();
            assert_eq!(finish == "length", completion == cap, "seed={seed} i={i}");
            hit += u32::from(completion == cap);
        }
        assert!(
            hit > 0 && hit < 40,
            "seed={seed}: caps never or always bind ({hit})"
        );
        mock.shutdown().await?;
    }
    Ok(())
}

async fn lengths(seed: u64) -> Vec<(u64, String)> {
    let mock = mock::spawn(MockConfig {
        seed,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut out = Vec::new();
    for i in 0..20 {
        let reply = post(
            &mock,
            "/chat/completions",
            chat_body(&format!("question {i}")),
        )
        .await
        .json();
        let id = reply["id"].as_str().unwrap().to_owned();
        out.push((reply["usage"]["completion_tokens"].as_u64().unwrap(), id));
    }
    mock.shutdown().await.unwrap();
    out
}

#[tokio::test]
async fn same_seed_gives_same_completions_across_two_mocks() {
    let (a, b, other) = (lengths(42).await, lengths(42).await, lengths(43).await);
    assert_eq!(a, b);
    assert_ne!(
        a.iter().map(|x| x.0).collect::<Vec<_>>(),
        other.iter().map(|x| x.0).collect::<Vec<_>>()
    );
}

fn read_log(path: &std::path::Path) -> Vec<LogLine> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "partial last line");
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test]
async fn log_lines_are_complete_and_correct_after_shutdown() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("mock.jsonl");
    let config = MockConfig {
        rpm: 2,
        api_key: Some("sk-test".into()),
        log_path: Some(path.clone()),
        ..fixed_completion(7)
    };
    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let mock = mock::spawn(config).await?;
    let key = Some("sk-test");
    assert_eq!(
        send(&mock, "/chat/completions", "{}", None).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&mock, "/chat/completions", "{nope", key).await.status,
        StatusCode::BAD_REQUEST
    );
    let chat = chat_body("logged").to_string();
    let first = send(&mock, "/chat/completions", &chat, key).await.json();
    let stream = json!({"model": "claude-x", "max_tokens": 5, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        send(&mock, "/messages", &stream.to_string(), key)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mock, "/chat/completions", &chat, key).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    mock.shutdown().await?;
    let after_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;

    let lines = read_log(&path);
    let summary: Vec<(Api, Outcome, Option<Reason>, bool)> = lines
        .iter()
        .map(|l| (l.api, l.outcome, l.reason, l.stream))
        .collect();
    assert_eq!(
        summary,
        [
            (
                Api::Chat,
                Outcome::Refused,
                Some(Reason::Unauthorized),
                false
            ),
            (Api::Chat, Outcome::Refused, Some(Reason::Invalid), false),
            (Api::Chat, Outcome::Admitted, None, false),
            (Api::Messages, Outcome::Admitted, None, true),
            (Api::Chat, Outcome::Refused, Some(Reason::Requests), false),
        ]
    );
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        (lines[2].prompt_tokens, lines[2].completion_tokens),
        (prompt, 7)
    );
    assert_eq!(lines[2].model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(
        (lines[3].completion_tokens, lines[4].prompt_tokens),
        (5, prompt)
    );
    assert_eq!(lines[0].model, None);
    assert!(lines.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms));
    assert!(lines[0].ts_ms + 1 >= before_ms && lines[4].ts_ms <= after_ms + 1);
    Ok(())
}

#[tokio::test]
async fn log_keeps_every_line_of_a_concurrent_burst() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("burst.jsonl");
    let config = MockConfig {
        rpm: 150,
        log_path: Some(path.clone()),
        ..MockConfig::default()
    };
    let mock = std::sync::Arc::new(mock::spawn(config).await?);
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let mock = mock.clone();
            tokio::spawn(async move {
                post(&mock, "/chat/completions", chat_body(&i.to_string()))
                    .await
                    .status
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += u32::from(task.await? == StatusCode::OK);
    }
    let stats = mock.stats();
    let mock = std::sync::Arc::into_inner(mock).expect("all tasks done");
    mock.shutdown().await?;
    let lines = read_log(&path);
    assert_eq!(lines.len(), 400);
    assert_eq!(ok, 150);
    let admitted = lines
        .iter()
        .filter(|l| l.outcome == Outcome::Admitted)
        .count();
    assert_eq!(admitted, 150);
    assert_eq!(stats.peak_window_requests, 150);
    let tokens: u64 = lines
        .iter()
        .filter(|l| l.outcome == Outcome::Admitted)
        .map(|l| l.prompt_tokens + l.completion_tokens)
        .sum();
    assert_eq!(tokens, stats.prompt_tokens + stats.completion_tokens);
    Ok(())
}

#[tokio::test]
async fn stats_report_peaks_totals_and_limits_over_http_and_in_process() -> TestResult {
    let mock = mock::spawn(MockConfig {
        rpm: 5,
        tpm: 100_000,
        ..MockConfig::default()
    })
    .await?;
    let mut charged = 0;
    for i in 0..8 {
        let reply = post(&mock, "/chat/completions", chat_body(&format!("s{i}"))).await;
        if reply.status == StatusCode::OK {
            charged += reply.json()["usage"]["total_tokens"].as_u64().unwrap();
        }
    }
    let url = format!("http://{}/stats", mock.addr());
    let over_http: MockStats = serde_json::from_str(&reqwest::get(url).await?.text().await?)?;
    let stats = mock.stats();
    assert_eq!(over_http, stats);
    assert_eq!((stats.admitted, stats.refused.requests), (5, 3));
    assert_eq!(stats.peak_window_requests, 5);
    assert_eq!(stats.peak_window_tokens, charged);
    assert_eq!(stats.prompt_tokens + stats.completion_tokens, charged);
    assert_eq!(
        (stats.limits.rpm, stats.limits.tpm, stats.limits.window_ms),
        (5, 100_000, 60_000)
    );
    assert_eq!((stats.in_flight, stats.max_in_flight), (0, 1));
    let health = reqwest::get(format!("http://{}/healthz", mock.addr())).await?;
    assert_eq!(health.status(), StatusCode::OK);
    mock.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_400_401_404_bodies_in_the_providers_shapes() -> TestResult {
    let config = MockConfig {
        api_key: Some("sk-good".into()),
        models: vec!["gpt-4o-mini".into(), "claude-x".into()],
        ..MockConfig::default()
    };
    let mock = mock::spawn(config).await?;
    let good = Some("sk-good");
    let chat = chat_body("hi").to_string();
    for key in [None, Some("sk-bad")] {
        let reply = send(&mock, "/chat/completions", &chat, key).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.json()["error"]["code"], "invalid_api_key");
    }
    let with_x_api_key = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("x-api-key", "sk-good")
        .body(chat.clone())
        .send()
        .await?;
    assert_eq!(with_x_api_key.status(), StatusCode::OK);
    let invalid = [
        ("/chat/completions", "{not json"),
        ("/chat/completions", "[]"),
        (
            "/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
        ),
        ("/chat/completions", r#"{"model":"gpt-4o-mini"}"#),
        (
            "/chat/completions",
            r#"{"model":"gpt-4o-mini","messages":[]}"#,
        ),
        (
            "/chat/completions",
            r#"{"model":"gpt-4o-mini","messages":"hi"}"#,
        ),
        (
            "/chat/completions",
            r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
        ),
        (
            "/chat/completions",
            r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"max_tokens":"9"}"#,
        ),
        (
            "/chat/completions",
            r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
        ),
        ("/completions", r#"{"model":"gpt-4o-mini"}"#),
        ("/completions", r#"{"model":"gpt-4o-mini","prompt":7}"#),
        ("/embeddings", r#"{"model":"gpt-4o-mini"}"#),
        ("/embeddings", r#"{"model":"gpt-4o-mini","input":[]}"#),
    ];
    for (path, body) in invalid {
        let reply = send(&mock, path, body, good).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{path} {body}: {}",
            reply.body
        );
        let error = &reply.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let unknown = send(
        &mock,
        "/chat/completions",
        &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(),
        good,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["error"]["code"], "model_not_found");
    let no_max =
        json!({"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let reply = send(&mock, "/messages", &no_max, good).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["type"], "error");
    assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
    let reply = send(&mock, "/messages", &no_max, None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.json()["error"]["type"], "authentication_error");
    let stats = mock.stats();
    assert_eq!(stats.refused.unauthorized, 3);
    assert_eq!(stats.refused.invalid, invalid.len() as u64 + 2);
    assert_eq!(stats.admitted, 1);
    mock.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn completions_embeddings_and_models_look_like_openai() -> TestResult {
    let mock = mock::spawn(fixed_completion(20)).await?;
    let reply = post(
        &mock,
        "/completions",
        json!({"model": "gpt-3.5-turbo-instruct",
        "prompt": ["Say this", "is a test"], "max_tokens": 8}),
    )
    .await
    .json();
    let expected_prompt = Encoding::Cl100kBase.count_text_reference("Say this")
        + Encoding::Cl100kBase.count_text_reference("is a test");
    assert_eq!(reply["object"], "text_completion");
    assert_eq!(reply["choices"].as_array().unwrap().len(), 2);
    assert_eq!(reply["choices"][1]["finish_reason"], "length");
    assert_eq!(
        reply["usage"],
        json!({"prompt_tokens": expected_prompt, "completion_tokens": 16, "total_tokens": expected_prompt + 16})
    );
    // Legacy completions default to max_tokens 16, as OpenAI's do.
    let reply = post(
        &mock,
        "/completions",
        json!({"model": "m", "prompt": "x", "stream": true,
        "stream_options": {"include_usage": true}}),
    )
    .await;
    let events = reply.events();
    let usage: Value = serde_json::from_str(&events[events.len() - 2].1)?;
    assert_eq!(usage["usage"]["completion_tokens"], 16);

    let reply = post(
        &mock,
        "/embeddings",
        json!({"model": "text-embedding-3-small", "input": ["a b", "c"]}),
    )
    .await
    .json();
    let expected = Encoding::Cl100kBase.count_text_reference("a b") + 1;
    assert_eq!(
        reply["usage"],
        json!({"prompt_tokens": expected, "total_tokens": expected})
    );
    assert_eq!(reply["data"][1]["embedding"].as_array().unwrap().len(), 16);
    let b64 = post(
        &mock,
        "/embeddings",
        json!({"model": "m", "input": "a", "encoding_format": "base64", "dimensions": 3}),
    )
    .await
    .json();
    assert_eq!(b64["data"][0]["embedding"].as_str().unwrap().len(), 16); // 12 bytes -> 16 chars

    let models: Value = serde_json::from_str(
        &reqwest::get(format!("{}/models", mock.base_url()))
            .await?
            .text()
            .await?,
    )?;
    assert_eq!(models["object"], "list");
    assert!(models["data"].as_array().is_some_and(|d| !d.is_empty()));
    let stats = mock.stats();
    assert_eq!((stats.admitted, stats.completion_tokens), (4, 32));
    mock.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn latency_delays_the_first_byte() -> TestResult {
    let mock = mock::spawn(MockConfig {
        latency_ms: 150,
        inter_token_ms: 5,
        ..fixed_completion(10)
    })
    .await?;
    let start = tokio::time::Instant::now();
    let reply = post(&mock, "/chat/completions", chat_body("slow")).await;
    assert_eq!(reply.status, StatusCode::OK);
    // Non-streamed: time to first byte plus the whole generation.
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
    mock.shutdown().await?;
    Ok(())
}
