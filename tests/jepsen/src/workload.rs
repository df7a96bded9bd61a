//! The workload: one client loop per (node, tenant), on the bridge, talking to the
//! node's proxy over real HTTP. Demand is above capacity and skewed (node 0 and
//! tenant 0 send most), comes in bursty on/off phases, mixes streamed and
//! non-streamed requests and the interactive and batch lanes, and honours
//! `retry-after`. Every operation is recorded with a terminal outcome.

use crate::checker::Op;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The proxy's port on every node.
pub const PROXY_PORT: u16 = 8080;

/// The API key of tenant `k`.
pub fn tenant_key(k: usize) -> String {
    format!("sk-jepsen-t{k}")
}

/// The model tenant `k` asks for: the mock logs it, so the checker can count each
/// tenant's traffic at the upstream (the route accepts every model).
pub fn tenant_model(k: usize) -> String {
    format!("jepsen-t{k}")
}

/// Tenant `k`'s model at the Anthropic account ([`agent_request`]'s Messages
/// call), routed by its `claude-` prefix.
pub fn tenant_claude_model(k: usize) -> String {
    format!("claude-{}", tenant_model(k))
}

/// Tenant `k`'s model for [`agent_request`]'s image chat: in the account's
/// `vision-*` model group, limited apart within the account
/// ([`VISION_TPM`]).
pub fn tenant_vision_model(k: usize) -> String {
    format!("vision-{}", tenant_model(k))
}

/// The tenant a mock log line belongs to, from its model.
pub fn tenant_of_model(model: &str) -> Option<usize> {
    let model = (model.strip_prefix("claude-"))
        .or_else(|| model.strip_prefix("vision-"))
        .unwrap_or(model);
    model.strip_prefix("jepsen-t")?.parse().ok()
}

/// Tokens per window of the account's `vision-*` model group in runs with
/// agents' traffic (`--model-limit` of the mock, `[[upstreams.model_limits]]`
/// of the nodes' OpenAI upstream): room for three of the image chats a window
/// (~100 tokens each) and a node's third of it room for one, fewer than the
/// four or so a window the workload sends
/// while the request limit binds, so the group's limit binds within the
/// account's.
pub const VISION_TPM: u64 = 350;

/// The Anthropic account's input and output tokens per window in runs with
/// agents' traffic (`--model-limit` of the mock, `itpm`/`otpm` of the nodes'
/// `anthropic` upstream): room for about five of [`agent_request`]'s Messages
/// calls a window (420 input tokens each by the mock's count) and for three
/// `max_tokens`, so the output limit binds first under the workload's demand
/// (up to 16 such calls a window at 3 nodes) and a node's share of the input
/// limit binds now and then.
pub const ANTHROPIC_ITPM: u64 = 2_400;
/// See [`ANTHROPIC_ITPM`].
pub const ANTHROPIC_OTPM: u64 = 3 * ANTHROPIC_MAX_TOKENS;
/// `max_tokens` of the Messages calls.
const ANTHROPIC_MAX_TOKENS: u64 = 16;

/// The longest a client waits on a `retry-after` before trying again.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(2);

/// How demand is spread over the clients and time. The steady patterns ask 4x
/// capacity in all; `mixed` more (4 x H(nodes) x H(tenants), H the harmonic
/// number: 7.3x at 3 nodes and 1 tenant, less its quiet seconds); `bursty` 4x
/// while on, 2x on average. Each client runs one request at a time, so what it
/// sends is also bounded by the latency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// The harness's default: node 0 and tenant 0 send most, and every client is
    /// quiet one second in four.
    #[default]
    Mixed,
    /// Every client sends the same, steadily.
    Uniform,
    /// Tenant 0 sends 16 times what each other tenant sends, steadily.
    HotTenant,
    /// Node k sends in proportion to 1/(k+1), steadily.
    SkewedNodes,
    /// Every client sends the same, in 2 s on / 2 s off phases (all in step).
    Bursty,
    /// As `uniform`, half the requests agents' calls ([`agent_request`]).
    Agents,
}

impl Pattern {
    /// Every pattern, for the benchmark matrix.
    pub const ALL: [Pattern; 6] = [
        Pattern::Mixed,
        Pattern::Uniform,
        Pattern::HotTenant,
        Pattern::SkewedNodes,
        Pattern::Bursty,
        Pattern::Agents,
    ];

    /// Its name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Mixed => "mixed",
            Pattern::Uniform => "uniform",
            Pattern::HotTenant => "hot-tenant",
            Pattern::SkewedNodes => "skewed-nodes",
            Pattern::Bursty => "bursty",
            Pattern::Agents => "agents",
        }
    }

    /// The pattern called `name`.
    pub fn parse(name: &str) -> anyhow::Result<Pattern> {
        (Pattern::ALL.into_iter())
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown workload {name:?}: mixed, uniform, hot-tenant, skewed-nodes, bursty, agents"
                )
            })
    }

    /// The share of the cluster's demand (4x capacity in all) of the client on
    /// `node` for `tenant`.
    fn weight(self, node: usize, tenant: usize, nodes: usize, tenants: usize) -> f64 {
        let (n, t) = (nodes.max(1) as f64, tenants.max(1) as f64);
        match self {
            Pattern::Mixed => 4.0 / (node as f64 + 1.0) / (tenant as f64 + 1.0),
            Pattern::Uniform | Pattern::Bursty | Pattern::Agents => 4.0 / (n * t),
            Pattern::HotTenant => {
                // 16:1 between tenant 0 and each other tenant.
                let parts = 16.0 + (t - 1.0);
                let part = if tenant == 0 { 16.0 } else { 1.0 };
                4.0 * part / parts / n
            }
            Pattern::SkewedNodes => {
                let harmonic: f64 = (1..=nodes.max(1)).map(|k| 1.0 / k as f64).sum();
                4.0 / (node as f64 + 1.0) / harmonic / t
            }
        }
    }

    /// Whether a client is quiet at `second` of the run.
    fn quiet(self, second: u64, seed: u64) -> bool {
        match self {
            Pattern::Mixed => (second + seed) % 4 == 3,
            Pattern::Bursty => (second / 2) % 2 == 1,
            _ => false,
        }
    }
}

/// What the clients do.
#[derive(Debug, Clone)]
pub struct Shape {
    /// How demand is spread.
    pub pattern: Pattern,
    /// Tenants.
    pub tenants: usize,
    /// Requests per second the whole cluster may send (L / W): demand is a
    /// multiple of it.
    pub capacity_per_s: f64,
    /// Share of requests streamed.
    pub stream_share: f64,
    /// Share of requests in the batch lane.
    pub batch_share: f64,
    /// Share of requests that are agents' traffic ([`agent_request`]), sent
    /// whole (not streamed).
    pub agent_share: f64,
    /// Seeds the clients.
    pub seed: u64,
    /// Request loops per client (at least 1), sharing its demand: one loop sends
    /// one request at a time, so with a single loop what a client sends is bounded
    /// by the latency (the benchmark uses several, to stay limiter-bound).
    pub loops: usize,
}

/// Runs the clients until `end`; returns every operation.
pub async fn run(ips: Vec<String>, shape: Shape, started: Instant, end: Instant) -> Vec<Op> {
    let ops = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let mut tasks = Vec::new();
    let nodes = ips.len();
    for (node, ip) in ips.into_iter().enumerate() {
        for tenant in 0..shape.tenants {
            let weight = shape.pattern.weight(node, tenant, nodes, shape.tenants);
            let loops = shape.loops.max(1);
            let per_second = shape.capacity_per_s * weight / loops as f64;
            let gap = Duration::from_secs_f64(1.0 / per_second.max(0.5 / loops as f64));
            for lane in 0..loops {
                let seed =
                    shape.seed ^ ((node as u64) << 8) ^ tenant as u64 ^ ((lane as u64) << 20);
                let client = Client {
                    http: client.clone(),
                    base: format!("http://{ip}:{PROXY_PORT}/v1"),
                    node,
                    tenant,
                    started,
                };
                let (ops, shape) = (ops.clone(), shape.clone());
                tasks.push(tokio::spawn(async move {
                    client.drive(gap, &shape, seed, end, &ops).await;
                }));
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut all = ops.lock().clone();
    all.sort_by_key(|o| o.invoke_ms);
    all
}

struct Client {
    http: reqwest::Client,
    /// The node's `/v1`.
    base: String,
    node: usize,
    tenant: usize,
    started: Instant,
}

impl Client {
    async fn drive(
        &self,
        gap: Duration,
        shape: &Shape,
        seed: u64,
        end: Instant,
        ops: &Mutex<Vec<Op>>,
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        while Instant::now() < end {
            // Bursty patterns: quiet phases.
            let second = self.started.elapsed().as_secs();
            if shape.pattern.quiet(second, seed) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            let agent = rng.random_bool(shape.agent_share);
            let stream = !agent && rng.random_bool(shape.stream_share);
            let batch = rng.random_bool(shape.batch_share);
            let (path, body) = match agent {
                true => agent_request(self.tenant, rng.random_range(0..AGENT_KINDS)),
                false => chat_request(self.tenant, stream),
            };
            let op = self.one(path, &body, stream, batch).await;
            let retry = op.retry_after_ms.map(Duration::from_millis);
            ops.lock().push(op);
            let jitter = gap.mul_f64(rng.random_range(0.5..1.5));
            // Honour retry-after (bounded), as a well-behaved client does.
            tokio::time::sleep(jitter.max(retry.unwrap_or_default().min(MAX_RETRY_WAIT))).await;
        }
    }

    async fn one(&self, path: &str, body: &serde_json::Value, stream: bool, batch: bool) -> Op {
        let invoke_ms = self.started.elapsed().as_millis() as u64;
        let mut request = (self.http.post(format!("{}{path}", self.base)))
            .bearer_auth(tenant_key(self.tenant))
            .header("content-type", "application/json")
            .body(body.to_string());
        if batch {
            request = request.header("x-tollgate-priority", "batch");
        }
        let (status, tokens, retry_after_ms) = match request.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                let retry = retry_after_ms(r.headers());
                match r.bytes().await {
                    Ok(body) => (status, usage_tokens(&body), retry),
                    // The connection broke mid-body (a node killed mid-stream).
                    Err(_) => (0, None, None),
                }
            }
            Err(_) => (0, None, None),
        };
        Op {
            node: self.node,
            tenant: self.tenant,
            stream,
            batch,
            invoke_ms,
            complete_ms: Some(self.started.elapsed().as_millis() as u64),
            status: Some(status),
            tokens,
            retry_after_ms,
        }
    }
}

/// The clients' plain request: a short chat, streamed or not.
fn chat_request(tenant: usize, stream: bool) -> (&'static str, serde_json::Value) {
    let body = serde_json::json!({
        "model": tenant_model(tenant),
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": stream,
        "stream_options": stream.then(|| serde_json::json!({"include_usage": true})),
    });
    ("/chat/completions", body)
}

/// Kinds of [`agent_request`].
pub const AGENT_KINDS: usize = 5;

/// One request of an agent, of kind `kind` (`0..AGENT_KINDS`): a chat with tool
/// definitions, a tool call and its result; a chat with an image (to a model
/// of the account's `vision-*` group); a list of
/// prompts; a Messages call to the Anthropic account with a system prompt, a
/// tool, a tool use and its result; a Responses call with instructions, a tool
/// and function-call items.
pub fn agent_request(tenant: usize, kind: usize) -> (&'static str, serde_json::Value) {
    use serde_json::json;
    let model = tenant_model(tenant);
    let tool = json!({"type": "function", "function": {"name": "search",
        "description": "Search the knowledge base.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}});
    match kind % AGENT_KINDS {
        0 => (
            "/chat/completions",
            json!({"model": model, "max_tokens": 8, "tools": [tool],
            "messages": [{"role": "user", "content": "Find the refund policy."},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "search", "arguments": "{\"query\":\"refunds\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Within 30 days."}]}),
        ),
        1 => (
            "/chat/completions",
            json!({"model": tenant_vision_model(tenant), "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}]}]}),
        ),
        2 => (
            "/completions",
            json!({"model": model, "max_tokens": 4,
            "prompt": ["Summarise A.", "Summarise B.", "Summarise C."]}),
        ),
        3 => (
            "/messages",
            json!({"model": tenant_claude_model(tenant), "max_tokens": ANTHROPIC_MAX_TOKENS,
            "system": "You are a support agent. Use the tools.",
            "tools": [{"name": "search", "description": "Search the knowledge base.",
                "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": "Find the refund policy."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search",
                    "input": {"query": "refunds"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                    "content": "Within 30 days."}]}]}),
        ),
        _ => (
            "/responses",
            json!({"model": model, "max_output_tokens": 8, "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "search", "description": "Search.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Refunds?"}]},
                {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "30 days"}]}),
        ),
    }
}

/// The wait a response asks for, in ms: `retry-after-ms` when it parses (what
/// the official OpenAI SDKs read first, and what tollgate and the mock send),
/// else `retry-after` in seconds. Both clients of the harness read it so
/// (`retry-after` alone, in whole seconds, turns every hint under a second into
/// a second, which costs `lease` under `hot-tenant`: docs/BENCHMARKS.md).
pub fn retry_after_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    tollgate::load::retry::parse(text("retry-after-ms"), text("retry-after"))
        .map(|wait| wait.as_millis() as u64)
}

/// Total tokens from a response body: the `usage` object of a JSON response, or
/// of a stream's last usage chunk.
pub fn usage_tokens(body: &[u8]) -> Option<u64> {
    let total = |v: &serde_json::Value| {
        let usage = &v["usage"];
        (usage["total_tokens"].as_u64()).or_else(|| {
            let part = |name: &str| usage[name].as_u64();
            Some(part("input_tokens")? + part("output_tokens")?)
        })
    };
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        return total(&v);
    }
    let text = std::str::from_utf8(body).ok()?;
    (text.lines().rev())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|v| total(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_json_or_the_streams_usage_chunk() {
        let json = br#"{"usage":{"prompt_tokens":8,"completion_tokens":3,"total_tokens":11}}"#;
        assert_eq!(usage_tokens(json), Some(11));
        let sse = b"data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"total_tokens\":9}}\n\ndata: [DONE]\n\n";
        assert_eq!(usage_tokens(sse), Some(9));
        assert_eq!(usage_tokens(b"not json"), None);
        assert_eq!(tenant_of_model(&tenant_model(3)), Some(3));
        assert_eq!(tenant_of_model(&tenant_vision_model(2)), Some(2));
        assert_eq!(tenant_of_model(&tenant_claude_model(1)), Some(1));
        assert_eq!(tenant_of_model("gpt-4o"), None);
    }

    #[test]
    fn retry_after_ms_is_preferred_to_seconds() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after_ms(&h), None);
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after_ms(&h), Some(2_000));
        h.insert("retry-after-ms", "1250".parse().unwrap());
        assert_eq!(retry_after_ms(&h), Some(1_250));
        // A garbled ms header falls back to the seconds.
        h.insert("retry-after-ms", "soon".parse().unwrap());
        assert_eq!(retry_after_ms(&h), Some(2_000));
    }
}
