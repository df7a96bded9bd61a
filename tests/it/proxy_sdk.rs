//! End to end through a real OpenAI client library (async-openai): the node in front
//! of the real mock upstream, streaming and not.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use async_openai::types::embeddings::CreateEmbeddingRequestArgs;
use async_openai::types::responses::{CreateResponseArgs, ResponseStreamEvent};
use futures_util::StreamExt;

fn client(node: &Node) -> Client<OpenAIConfig> {
    Client::with_config(
        OpenAIConfig::new()
            .with_api_base(node.url())
            .with_api_key(KEY),
    )
}

fn chat_request(stream_usage: bool) -> async_openai::types::chat::CreateChatCompletionRequest {
    let mut args = CreateChatCompletionRequestArgs::default();
    args.model("gpt-4o-mini")
        .max_completion_tokens(40u32)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("Tell me about rate limits.")
            .build()
            .unwrap()
            .into()]);
    if stream_usage {
        args.stream_options(async_openai::types::chat::ChatCompletionStreamOptions {
            include_usage: Some(true),
            include_obfuscation: None,
        });
    }
    args.build().unwrap()
}

#[tokio::test]
async fn chat_completion_through_the_sdk_settles_real_usage() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 100\ntpm = 100000"), &[&upstream]).await;
    let response = client(&node)
        .chat()
        .create(chat_request(false))
        .await
        .unwrap();
    let usage = response.usage.expect("usage");
    assert!(usage.completion_tokens <= 40);
    assert!(!response.choices.is_empty());
    let status = node.wait_idle("t").await;
    // After settlement the tenant's window holds exactly the real usage.
    assert_eq!(
        status["tokens"]["used"],
        u64::from(usage.prompt_tokens + usage.completion_tokens)
    );
    assert_eq!(status["requests"]["used"], 1);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn streaming_through_the_sdk_hides_the_usage_chunk_unless_asked() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("tpm = 100000"), &[&upstream]).await;
    let client = client(&node);
    for asked in [false, true] {
        let mut stream = client
            .chat()
            .create_stream(chat_request(asked))
            .await
            .unwrap();
        let (mut content_chunks, mut usage_chunks) = (0, 0);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            if chunk.choices.is_empty() {
                assert!(chunk.usage.is_some());
                usage_chunks += 1;
            } else {
                content_chunks += 1;
            }
        }
        assert!(content_chunks > 0);
        assert_eq!(
            usage_chunks,
            usize::from(asked),
            "usage chunk only when the client asked"
        );
        let status = node.wait_idle("t").await;
        assert!(status["tokens"]["used"].as_u64().unwrap() > 0);
    }
    // Both streams settled from the upstream's usage: the tenant's window equals the
    // mock's own count of prompt + completion tokens.
    let stats = upstream.stats();
    let status = node.key("tenant:t").await;
    assert_eq!(
        status["tokens"]["used"],
        stats.prompt_tokens + stats.completion_tokens
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn completions_embeddings_and_models_work_through_the_sdk() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 100"), &[&upstream]).await;
    let client = client(&node);
    let completion = client
        .completions()
        .create(
            CreateCompletionRequestArgs::default()
                .model("gpt-3.5-turbo-instruct")
                .prompt("Say hi")
                .max_tokens(5u32)
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(completion.usage.unwrap().completion_tokens <= 5);
    let embedding = client
        .embeddings()
        .create(
            CreateEmbeddingRequestArgs::default()
                .model("text-embedding-3-small")
                .input("hello world")
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(embedding.usage.prompt_tokens, 2);
    // The catch-all routes list what their upstreams serve (the mock's list).
    let models = client.models().list().await.unwrap();
    let ids: Vec<&str> = models.data.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "claude-sonnet-4-5",
            "gpt-4o",
            "gpt-4o-mini",
            "text-embedding-3-small"
        ]
    );
    let one = client.models().retrieve("gpt-4o").await.unwrap();
    assert_eq!(one.id, "gpt-4o");
    assert_eq!(one.owned_by, "mock");
    let missing = client.models().retrieve("no-such-model").await;
    assert!(missing.is_err(), "{missing:?}");
    // Anthropic's SDK gets Anthropic's shape.
    let listed: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/models", node.url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["has_more"], false);
    assert_eq!(listed["first_id"], "claude-sonnet-4-5");
    assert_eq!(listed["data"][0]["type"], "model");
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// The Responses API, created and streamed through the SDK: both settle from
/// the upstream's usage (`usage` of the response, the `response.completed`
/// event of the stream), so the tenant's window holds the mock's own count.
#[tokio::test]
async fn responses_through_the_sdk_settle_real_usage_streamed_or_not() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 100\ntpm = 100000"), &[&upstream]).await;
    let client = client(&node);
    let request = |stream: bool| {
        let mut args = CreateResponseArgs::default();
        args.model("gpt-4o-mini")
            .instructions("Answer in one sentence.")
            .input("Tell me about rate limits.")
            .max_output_tokens(40u32);
        if stream {
            args.stream(true);
        }
        args.build().unwrap()
    };
    let response = client.responses().create(request(false)).await.unwrap();
    let usage = response.usage.expect("usage");
    assert!(usage.output_tokens <= 40);
    assert!(!response.output.is_empty());
    let mut stream = client
        .responses()
        .create_stream(request(true))
        .await
        .unwrap();
    let (mut deltas, mut completed) = (0, None);
    while let Some(event) = stream.next().await {
        match event.unwrap() {
            ResponseStreamEvent::ResponseOutputTextDelta(_) => deltas += 1,
            ResponseStreamEvent::ResponseCompleted(done) => completed = done.response.usage,
            ResponseStreamEvent::ResponseIncomplete(done) => completed = done.response.usage,
            _ => {}
        }
    }
    assert!(deltas > 0);
    let streamed = completed.expect("the completed event's usage");
    assert_eq!(streamed.input_tokens, usage.input_tokens, "the same input");
    let status = node.wait_idle("t").await;
    let stats = upstream.stats();
    assert_eq!(stats.prompt_tokens, u64::from(2 * usage.input_tokens));
    assert_eq!(
        status["tokens"]["used"],
        stats.prompt_tokens + stats.completion_tokens
    );
    assert_eq!(status["requests"]["used"], 2);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}
