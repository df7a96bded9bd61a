//! The seed scenario's workers: an upstream that grants a token budget
//! and a request budget per window, and `workers` agents each running one task
//! after another. A task is one chat completion with a long prompt and a large
//! `max_tokens` whose real completion is shorter; it is retried until it succeeds
//! (honouring `retry-after`, else backing off exponentially, as the official
//! OpenAI clients do), so what a user sees is tasks completed per window.
//!
//! Workers talk to the gateway nodes (spread round robin), or with `direct`
//! straight to the upstream: the uncoordinated baseline, where only the
//! provider's 429s and the clients' retries shape the traffic.

use crate::checker::Op;
use crate::workload::{self, PROXY_PORT};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The seed scenario's settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TaskSpec {
    /// Agents, each running one task at a time.
    pub workers: usize,
    /// Tokens (prompt + completion) the upstream grants per window.
    pub tpm: u64,
    /// Prompt length of every task, in tokens (approximately: the chat framing
    /// adds a few).
    pub prompt_tokens: u64,
    /// Every task's `max_tokens`.
    pub max_tokens: u64,
    /// The real completion lengths the upstream draws from (inclusive), shorter
    /// than `max_tokens`.
    pub completion: (u64, u64),
    /// The nodes' `[estimation] completion` policy: `max-tokens` or `adaptive`.
    pub estimate: String,
    /// Workers send straight to the upstream (no gateway): the baseline.
    pub direct: bool,
}

impl TaskSpec {
    /// The seed scenario: 12 workers, 150,000 tokens and 500 requests per
    /// window at the upstream, prompts of 1,200 tokens, `max_tokens` 800, real
    /// completions of 200-600 tokens.
    pub fn seed_scenario(estimate: &str, direct: bool) -> TaskSpec {
        TaskSpec {
            workers: 12,
            tpm: 150_000,
            prompt_tokens: 1_200,
            max_tokens: 800,
            completion: (200, 600),
            estimate: estimate.into(),
            direct,
        }
    }
}

/// One task, from its first attempt to its success (or the end of the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Task {
    /// The worker that ran it.
    pub worker: usize,
    /// When its first attempt was sent (ms since the run started).
    pub first_ms: u64,
    /// When it succeeded; `None`: the run ended first.
    pub done_ms: Option<u64>,
    /// Requests it took (1: no retry).
    pub attempts: u32,
}

/// The longest a worker waits between attempts (its backoff cap, and the most
/// of a `retry-after` it honours).
const MAX_WAIT: Duration = Duration::from_secs(8);
/// The first backoff without a `retry-after`.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Runs the workers until `end`: returns every attempt (as operations, for the
/// checker) and every task.
pub async fn run(
    spec: TaskSpec,
    node_ips: Vec<String>,
    mock_url: String,
    started: Instant,
    end: Instant,
) -> (Vec<Op>, Vec<Task>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default();
    let record = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let body = Arc::new(request_body(&spec));
    let mut handles = Vec::new();
    for worker in 0..spec.workers {
        let node = worker % node_ips.len().max(1);
        let url = match (spec.direct, node_ips.get(node)) {
            (false, Some(ip)) => format!("http://{ip}:{PROXY_PORT}/v1/chat/completions"),
            _ => format!("{mock_url}/v1/chat/completions"),
        };
        let agent = Worker {
            http: http.clone(),
            url,
            worker,
            node,
            started,
            body: body.clone(),
        };
        let record = record.clone();
        handles.push(tokio::spawn(async move { agent.drive(end, &record).await }));
    }
    for h in handles {
        let _ = h.await;
    }
    let (mut ops, tasks) = std::mem::take(&mut *record.lock());
    ops.sort_by_key(|o: &Op| o.invoke_ms);
    (ops, tasks)
}

/// Every task's request: a prompt of about `prompt_tokens` tokens (" hello" is
/// one token in the cl100k and o200k encodings) and the scenario's `max_tokens`.
fn request_body(spec: &TaskSpec) -> String {
    let prompt =
        "hello".to_owned() + &" hello".repeat(spec.prompt_tokens.saturating_sub(1) as usize);
    serde_json::json!({
        "model": workload::tenant_model(0),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": spec.max_tokens,
    })
    .to_string()
}

type Record = Mutex<(Vec<Op>, Vec<Task>)>;

struct Worker {
    http: reqwest::Client,
    url: String,
    worker: usize,
    node: usize,
    started: Instant,
    body: Arc<String>,
}

impl Worker {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn drive(&self, end: Instant, record: &Record) {
        while Instant::now() < end {
            let mut task = Task {
                worker: self.worker,
                first_ms: self.now_ms(),
                done_ms: None,
                attempts: 0,
            };
            let mut backoff = FIRST_BACKOFF;
            loop {
                task.attempts += 1;
                let op = self.attempt().await;
                let (ok, retry_after) = (op.status == Some(200), op.retry_after_ms);
                let done_ms = op.complete_ms;
                record.lock().0.push(op);
                if ok {
                    task.done_ms = done_ms;
                    break;
                }
                // Honour retry-after (bounded); without one, back off and double.
                let wait = match retry_after {
                    Some(ms) => Duration::from_millis(ms).min(MAX_WAIT),
                    None => {
                        let wait = backoff;
                        backoff = (backoff * 2).min(MAX_WAIT);
                        wait
                    }
                };
                if Instant::now() + wait >= end {
                    // The run ends first: this worker is done (starting another
                    // task now would only hammer the upstream until the end).
                    record.lock().1.push(task);
                    return;
                }
                tokio::time::sleep(wait).await;
            }
            record.lock().1.push(task);
        }
    }

    async fn attempt(&self) -> Op {
        let invoke_ms = self.now_ms();
        let response = (self.http.post(&self.url))
            .bearer_auth(workload::tenant_key(0))
            .header("content-type", "application/json")
            .body(self.body.as_str().to_owned())
            .send()
            .await;
        let (status, tokens, retry_after_ms) = match response {
            Ok(r) => {
                let status = r.status().as_u16();
                let retry = workload::retry_after_ms(r.headers());
                match r.bytes().await {
                    Ok(body) => (status, workload::usage_tokens(&body), retry),
                    Err(_) => (0, None, None),
                }
            }
            Err(_) => (0, None, None),
        };
        Op {
            node: self.node,
            tenant: 0,
            stream: false,
            batch: false,
            invoke_ms,
            complete_ms: Some(self.now_ms()),
            status: Some(status),
            tokens,
            retry_after_ms,
        }
    }
}

/// Tasks completed by `until_ms`, per window of `window_ms` (at a one-minute
/// window, tasks per minute).
pub fn per_window(tasks: &[Task], until_ms: u64, window_ms: u64) -> f64 {
    let done = (tasks.iter())
        .filter(|t| t.done_ms.is_some_and(|d| d <= until_ms))
        .count();
    done as f64 * window_ms as f64 / until_ms.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_has_the_asked_length_in_cl100k() {
        let spec = TaskSpec::seed_scenario("max-tokens", false);
        let body: serde_json::Value = serde_json::from_str(&request_body(&spec)).unwrap();
        let text = body["messages"][0]["content"].as_str().unwrap();
        let tokens = tollgate::tokens::Encoding::parse("cl100k_base")
            .unwrap()
            .count_text(text);
        assert_eq!(tokens, 1_200);
        assert_eq!(body["max_tokens"], 800);
    }

    #[test]
    fn tasks_per_window_count_those_done_in_time() {
        let task = |done_ms| Task {
            worker: 0,
            first_ms: 0,
            done_ms,
            attempts: 1,
        };
        let tasks = [
            task(Some(1_000)),
            task(Some(11_000)),
            task(None),
            task(Some(13_000)),
        ];
        // Two done within 12 s = 2 windows of 6 s: one per window.
        assert_eq!(per_window(&tasks, 12_000, 6_000), 1.0);
    }
}
