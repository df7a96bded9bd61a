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
    let models = client.models().list().await;
    assert!(models.is_ok(), "{models:?}");
    node.stop().await;
    upstream.shutdown().await.unwrap();
}
