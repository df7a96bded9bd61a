//! Test harness: a real tollgate node on port 0 in front of real mock upstreams.
#![allow(dead_code, clippy::unwrap_used)] // test support: a failed unwrap is a failed test

pub(crate) mod certs;
pub(crate) mod cluster;
pub(crate) mod cutting_proxy;
pub(crate) mod redis;
pub(crate) mod served;

use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;
use tollgate::config::Config;
use tollgate::mock::{MockConfig, MockHandle};

pub(crate) const KEY: &str = "sk-test";
pub(crate) const ADMIN: &str = "admin-test-token";

/// A running node.
pub(crate) struct Node {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Node {
    pub(crate) fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Kills the node as a crash would: its task is aborted, no drain, no goodbye;
    /// peers only learn of it from the failure detector.
    pub(crate) async fn crash(mut self) {
        self.crash_in_place().await;
    }

    /// [`Node::crash`], leaving the dead node in place (to be replaced by its
    /// successor).
    pub(crate) async fn crash_in_place(&mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// Starts a graceful stop without waiting for it: the node drains (refusing
    /// new work) while its in-flight requests finish. [`Node::stop`] waits.
    pub(crate) fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }

    /// `/admin/keys/{key}` as JSON.
    pub(crate) async fn key(&self, key: &str) -> serde_json::Value {
        let response = reqwest::Client::new()
            .get(format!("http://{}/admin/keys/{key}", self.addr))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        json(response).await
    }

    /// Waits until the tenant has no request in flight (or panics after 5 s).
    pub(crate) async fn wait_idle(&self, tenant: &str) -> serde_json::Value {
        for _ in 0..100 {
            let status = self.key(&format!("tenant:{tenant}")).await;
            if status["concurrency"]["in_flight"] == 0 {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("tenant {tenant} still has requests in flight");
    }
}

/// The key's hash line for configs.
pub(crate) fn key_hash() -> String {
    format!("sha256:{}", tollgate::config::hash_api_key(KEY))
}

/// Starts a node from TOML (`{MOCK}`, `{MOCK2}`, `{HASH}` are substituted).
pub(crate) async fn node(toml: &str, mocks: &[&MockHandle]) -> Node {
    node_with_transport(toml, mocks, None).await
}

/// As [`node`], gossiping over `transport` (e.g. chitchat's `ChannelTransport`).
pub(crate) async fn node_with_transport<M: Upstream>(
    toml: &str,
    mocks: &[&M],
    transport: Option<std::sync::Arc<dyn tollgate_cluster::chitchat::transport::Transport>>,
) -> Node {
    let mut text = toml
        .replace("{HASH}", &key_hash())
        .replace("{ADMIN}", ADMIN);
    for (i, mock) in mocks.iter().enumerate() {
        let name = if i == 0 {
            "{MOCK}".to_owned()
        } else {
            format!("{{MOCK{}}}", i + 1)
        };
        text = text.replace(&name, &mock.base_url());
    }
    // A test may open with its own `[server]` settings: the harness's go in it.
    let own_server = text
        .trim_start()
        .strip_prefix("[server]\n")
        .map(str::to_owned);
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN}\"\n{}",
        own_server.unwrap_or(text)
    );
    let config = Config::from_toml(&text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (ready_tx, ready_rx) = oneshot::channel::<()>();
    let on_ready = move |_| {
        let _ = ready_tx.send(());
    };
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop_rx.await;
        };
        match transport {
            Some(t) => {
                tollgate::server::run_with_transport(config, listener, None, shutdown, on_ready, t)
                    .await
                    .unwrap()
            }
            None => tollgate::server::run(config, listener, None, shutdown, on_ready)
                .await
                .unwrap(),
        }
    });
    // Requests sent before the node is ready would wait in the listener's
    // backlog while it starts (loading the token tables takes seconds in a debug
    // build), and a test timing its client against the node would measure that.
    tokio::time::timeout(Duration::from_secs(60), ready_rx)
        .await
        .expect("the node became ready within 60 s")
        .expect("the node started (see its panic above)");
    Node {
        addr,
        stop: Some(stop_tx),
        task,
    }
}

/// What a node's config names as an upstream: a mock in this process or in
/// its own ([`served::MockProcess`]).
pub(crate) trait Upstream {
    /// The OpenAI-style base URL, `http://ADDR/v1`.
    fn base_url(&self) -> String;
}

impl Upstream for MockHandle {
    fn base_url(&self) -> String {
        MockHandle::base_url(self)
    }
}

/// A mock with `f` applied to its default config.
pub(crate) async fn mock(f: impl FnOnce(&mut MockConfig)) -> MockHandle {
    let mut config = MockConfig::default();
    f(&mut config);
    tollgate::mock::spawn(config).await.unwrap()
}

/// One upstream, one catch-all route, one tenant with `tenant_limits` lines.
pub(crate) fn single(tenant_limits: &str) -> String {
    format!(
        r#"
[[upstreams]]
id = "mock"
kind = "openai"
base_url = "{{MOCK}}"

[[upstreams]]
id = "mock-anthropic"
kind = "anthropic"
base_url = "{{MOCK}}"

[[routes]]
models = ["claude-*"]
upstreams = ["mock-anthropic"]

[[routes]]
models = ["*"]
upstreams = ["mock"]

[[tenants]]
id = "t"
api_key_hashes = ["{{HASH}}"]
{tenant_limits}
"#
    )
}

/// The node's `/metrics` text.
pub(crate) async fn metrics(node: &Node) -> String {
    reqwest::get(format!("http://{}/metrics", node.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// POSTs JSON with the test key to `base` (a node's `/v1` URL) + `path`.
pub(crate) async fn post_url(base: &str, path: &str, body: serde_json::Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap()
}

/// POSTs JSON with the test key.
pub(crate) async fn post(
    node: &Node,
    path: &str,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{}{path}", node.url()))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

pub(crate) fn chat_body(content: &str, max_tokens: u64) -> serde_json::Value {
    serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
}

/// A response body as JSON.
pub(crate) async fn json(response: reqwest::Response) -> serde_json::Value {
    let bytes = response.bytes().await.unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}
