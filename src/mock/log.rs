//! The JSONL decision log: one line per request admitted or refused, the ground truth
//! the harness and the benchmark judge the gateway by.
//!
//! Handlers serialize their line and send it to one writer task through a bounded
//! channel; `send().await` applies backpressure and never drops a line. Closing the log
//! flushes it and waits for the writer, so the file is complete when
//! [`LogSender::close`] returns. Lines are written in the order handlers send them,
//! which may differ from `ts_ms` order by a few milliseconds under concurrency: sort by
//! `ts_ms` before replaying the window.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

/// Lines buffered between handlers and the writer.
const CHANNEL_CAPACITY: usize = 8192;
/// Lines the writer takes per wake-up.
const BATCH_LINES: usize = 512;

/// The API a request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/responses` (OpenAI's Responses API).
    Responses,
}

/// Whether the request was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Charged to the window and served.
    Admitted,
    /// Answered with an error; nothing charged.
    Refused,
}

/// Why a request was refused. A model group's limit refuses with the reason of its
/// kind (`requests`, `tokens`, `input_tokens`, `output_tokens`), as the account's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// Requests-per-window limit (429).
    Requests,
    /// Tokens-per-window limit (429).
    Tokens,
    /// Concurrency limit (429).
    Concurrency,
    /// Input-tokens-per-window limit (429).
    #[serde(rename = "input_tokens")]
    InputTokens,
    /// Output-tokens-per-window limit (429).
    #[serde(rename = "output_tokens")]
    OutputTokens,
    /// Requests-per-day limit, OpenAI's RPD (429).
    #[serde(rename = "requests_per_day")]
    RequestsPerDay,
    /// Tokens-per-day limit, OpenAI's TPD (429).
    #[serde(rename = "tokens_per_day")]
    TokensPerDay,
    /// Malformed or unacceptable request (400, 404, 413).
    Invalid,
    /// Missing or wrong API key (401).
    Unauthorized,
}

/// One line of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// Decision time: Unix milliseconds at mock start plus the mock's monotonic clock,
    /// in whole milliseconds; the limits use exactly this clock.
    pub ts_ms: u64,
    /// Which API.
    pub api: Api,
    /// Requested model; `null` when refused before the model was read.
    pub model: Option<String>,
    /// Admitted or refused.
    pub outcome: Outcome,
    /// `null` when admitted.
    pub reason: Option<Reason>,
    /// Prompt tokens as the mock counts them (also on rate-limit refusals).
    pub prompt_tokens: u64,
    /// Completion tokens drawn (charged when admitted; 0 for embeddings).
    pub completion_tokens: u64,
    /// Output tokens charged to the output limit at admission: the request's
    /// `max_tokens` (times its prompts), or `completion_tokens` when it set none.
    /// When the answer ends the charge is corrected down to `completion_tokens`.
    #[serde(default)]
    pub output_estimate: u64,
    /// Whether the request asked for a stream.
    pub stream: bool,
}

enum Message {
    Line(Vec<u8>),
    Close(oneshot::Sender<std::io::Result<()>>),
}

/// The handlers' end of the log.
#[derive(Clone, Debug)]
pub(super) struct LogSender {
    tx: mpsc::Sender<Message>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("log message")
    }
}

impl LogSender {
    /// Opens `path` for appending and starts the writer task.
    pub(super) async fn open(path: &Path) -> std::io::Result<LogSender> {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await?;
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        tokio::spawn(write_lines(file, rx));
        Ok(LogSender { tx })
    }

    /// Queues one line, waiting while the channel is full.
    pub(super) async fn write(&self, line: &LogLine) {
        let mut bytes = match serde_json::to_vec(line) {
            Ok(bytes) => bytes,
            // A LogLine has only strings, numbers and enums: serialization cannot fail.
            Err(err) => return tracing::error!(%err, "log line not serializable"),
        };
        bytes.push(b'\n');
        if self.tx.send(Message::Line(bytes)).await.is_err() {
            tracing::warn!("log line after the log was closed");
        }
    }

    /// Flushes every line sent so far and stops the writer; reports the first write
    /// error. Closing twice is harmless.
    pub(super) async fn close(&self) -> std::io::Result<()> {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Message::Close(ack)).await.is_err() {
            return Ok(());
        }
        done.await.unwrap_or(Ok(()))
    }
}

async fn write_lines(file: tokio::fs::File, mut rx: mpsc::Receiver<Message>) {
    let mut out = tokio::io::BufWriter::with_capacity(1 << 16, file);
    let mut batch = Vec::with_capacity(BATCH_LINES);
    let mut first_error: Option<std::io::Error> = None;
    let record = |result: std::io::Result<()>, first_error: &mut Option<_>| {
        if let Err(err) = result {
            tracing::error!(%err, "writing the mock log");
            first_error.get_or_insert(err);
        }
    };
    while rx.recv_many(&mut batch, BATCH_LINES).await > 0 {
        for message in batch.drain(..) {
            match message {
                Message::Line(bytes) => record(out.write_all(&bytes).await, &mut first_error),
                Message::Close(ack) => {
                    record(out.flush().await, &mut first_error);
                    let _ = ack.send(first_error.map_or(Ok(()), Err));
                    return;
                }
            }
        }
        if rx.is_empty() {
            record(out.flush().await, &mut first_error);
        }
    }
    record(out.flush().await, &mut first_error);
}
