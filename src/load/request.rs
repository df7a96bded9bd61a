//! The requests a run sends, built once before the first send.
//!
//! Bodies are serialized up front into a few [`Bytes`] variants (they differ only in
//! their first word, so a prompt cache upstream does not collapse them into one), and
//! each send clones one: a reference-count bump, no serialization on the hot path.

use anyhow::Context as _;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::json;

use super::args::{Api, LoadArgs};
use crate::upstream_http::Endpoint;

/// Anthropic API version sent with `--api messages`.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Header naming the closed-loop worker that sent a request, so a server (or a test)
/// can tell workers apart when they share pooled connections.
pub const WORKER_HEADER: &str = "x-tollgate-load-worker";
/// Header carrying `--priority`.
pub const PRIORITY_HEADER: &str = "x-tollgate-priority";
/// Header carrying `--max-wait-ms`.
pub const MAX_WAIT_HEADER: &str = "x-tollgate-max-wait-ms";

/// First words of the prompt variants; each is one token in cl100k and o200k.
const VARIANT_WORDS: [&str; 16] = [
    "apple", "river", "stone", "cloud", "green", "light", "water", "house", "music", "paper",
    "table", "horse", "bread", "glass", "chair", "plant",
];

/// Everything needed to build one request cheaply.
#[derive(Debug, Clone)]
pub struct Target {
    endpoint: Endpoint,
    headers: HeaderMap,
    bodies: Vec<Bytes>,
}

/// One request's headers and body, for [`Target::endpoint`].
#[derive(Debug)]
pub struct Outgoing {
    /// The shared headers (and a worker id).
    pub headers: HeaderMap,
    /// A body variant (shared bytes).
    pub body: Bytes,
}

impl Target {
    /// Builds the endpoint URL, headers and body variants for validated `args`.
    pub fn new(args: &LoadArgs) -> anyhow::Result<Target> {
        let path = match args.api {
            Api::Chat => "chat/completions",
            Api::Completions => "completions",
            Api::Embeddings => "embeddings",
            Api::Messages => "messages",
            Api::Responses => "responses",
        };
        let base = args.url.trim_end_matches('/');
        let endpoint = Endpoint::direct(&format!("{base}/{path}"))
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("bad --url {:?}", args.url))?;
        let headers = headers(args)?;
        let bodies = (0..VARIANT_WORDS.len())
            .map(|variant| body(args, &prompt(args.prompt_tokens, variant)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Target {
            endpoint,
            headers,
            bodies,
        })
    }

    /// Number of body variants; [`Target::request`] takes an index below this.
    pub fn variants(&self) -> usize {
        self.bodies.len()
    }

    /// The shared headers with a worker id added, for one closed-loop worker.
    pub fn worker_headers(&self, worker: usize) -> HeaderMap {
        let mut headers = self.headers.clone();
        headers.insert(
            HeaderName::from_static(WORKER_HEADER),
            HeaderValue::from(worker),
        );
        headers
    }

    /// The shared headers (open loop).
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Where every request goes.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// One request ready to send: `headers` cloned, body variant shared.
    pub fn request(&self, headers: &HeaderMap, variant: usize) -> Outgoing {
        Outgoing {
            headers: headers.clone(),
            body: self.bodies[variant % self.bodies.len()].clone(),
        }
    }
}

/// A prompt of about `tokens` tokens: a variant word then `hello` repeated.
pub fn prompt(tokens: usize, variant: usize) -> String {
    let first = VARIANT_WORDS[variant % VARIANT_WORDS.len()];
    let mut text = String::with_capacity(first.len() + tokens.saturating_sub(1) * 6);
    text.push_str(first);
    for _ in 1..tokens {
        text.push_str(" hello");
    }
    text
}

fn headers(args: &LoadArgs) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if args.api == Api::Messages {
        headers.insert(
            "x-api-key",
            HeaderValue::from_str(&args.api_key).context("--api-key")?,
        );
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
    } else {
        let bearer =
            HeaderValue::from_str(&format!("Bearer {}", args.api_key)).context("--api-key")?;
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
    }
    if let Some(priority) = args.priority {
        headers.insert(PRIORITY_HEADER, HeaderValue::from_static(priority.as_str()));
    }
    if let Some(ms) = args.max_wait_ms {
        headers.insert(MAX_WAIT_HEADER, HeaderValue::from(ms));
    }
    Ok(headers)
}

fn body(args: &LoadArgs, prompt: &str) -> anyhow::Result<Bytes> {
    let mut value = match args.api {
        Api::Chat | Api::Messages => json!({
            "model": args.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": args.max_tokens,
        }),
        Api::Completions => json!({
            "model": args.model,
            "prompt": prompt,
            "max_tokens": args.max_tokens,
        }),
        Api::Embeddings => json!({"model": args.model, "input": prompt}),
        Api::Responses => json!({
            "model": args.model,
            "input": prompt,
            "max_output_tokens": args.max_tokens,
        }),
    };
    if args.stream {
        value["stream"] = json!(true);
        if matches!(args.api, Api::Chat | Api::Completions) {
            value["stream_options"] = json!({"include_usage": true});
        }
    }
    Ok(Bytes::from(serde_json::to_vec(&value)?))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::tokens::Encoding;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn target(args: &[&str]) -> (LoadArgs, Target) {
        let argv = std::iter::once("load").chain(args.iter().copied());
        let args = Cli::try_parse_from(argv).unwrap().load;
        let target = Target::new(&args).unwrap();
        (args, target)
    }

    fn body_json(t: &Target, variant: usize) -> serde_json::Value {
        let req = t.request(t.headers(), variant);
        let bytes = &req.body;
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn prompt_is_about_the_requested_number_of_tokens() {
        let encoding = Encoding::for_openai_model("gpt-4o-mini").unwrap();
        for n in [1, 7, 100, 1000] {
            for variant in 0..VARIANT_WORDS.len() {
                let got = encoding.count_text(&prompt(n, variant));
                assert_eq!(got, n as u64, "n={n} variant={variant}");
            }
        }
    }

    #[test]
    fn chat_stream_asks_for_usage_and_uses_bearer_auth() {
        let (_, t) = target(&["--stream", "--priority", "batch", "--max-wait-ms", "250"]);
        let req = t.request(t.headers(), 3);
        assert_eq!(
            t.endpoint().url.as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        assert_eq!(req.headers["authorization"], "Bearer sk-demo");
        assert_eq!(req.headers[PRIORITY_HEADER], "batch");
        assert_eq!(req.headers[MAX_WAIT_HEADER], "250");
        let body = body_json(&t, 3);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["messages"][0]["content"], prompt(16, 3));
    }

    #[test]
    fn messages_use_anthropic_headers_and_path() {
        let (_, t) = target(&["--api", "messages", "--url", "http://h:1/v1/", "--stream"]);
        let req = t.request(&t.worker_headers(7), 0);
        assert_eq!(t.endpoint().url.as_str(), "http://h:1/v1/messages");
        assert_eq!(req.headers["x-api-key"], "sk-demo");
        assert_eq!(req.headers["anthropic-version"], ANTHROPIC_VERSION);
        assert_eq!(req.headers[WORKER_HEADER], "7");
        assert!(req.headers.get("authorization").is_none());
        let body = body_json(&t, 0);
        assert_eq!(body["stream"], true);
        assert!(body.get("stream_options").is_none());
    }

    #[test]
    fn embeddings_and_completions_bodies() {
        let (_, t) = target(&["--api", "embeddings", "--prompt-tokens", "2"]);
        assert_eq!(
            body_json(&t, 1),
            json!({"model": "gpt-4o-mini", "input": "river hello"})
        );
        let (_, t) = target(&["--api", "completions", "--model", "m"]);
        let body = body_json(&t, 0);
        assert_eq!(body["model"], "m");
        assert!(body["prompt"].as_str().unwrap().starts_with("apple hello"));
        assert!(body.get("stream").is_none());
    }

    #[test]
    fn variants_differ_only_in_their_first_word() {
        let (_, t) = target(&[]);
        assert_eq!(t.variants(), VARIANT_WORDS.len());
        let a = body_json(&t, 0);
        let b = body_json(&t, 1);
        assert_ne!(a, b);
        let tail = |v: &serde_json::Value| {
            let s = v["messages"][0]["content"].as_str().unwrap().to_owned();
            s[s.find(' ').unwrap()..].to_owned()
        };
        assert_eq!(tail(&a), tail(&b));
    }
}
