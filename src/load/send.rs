//! Sending one request and reading its answer into a [`Sample`].
//!
//! Non-stream bodies are read as bytes (at most [`MAX_BODY_BYTES`] kept) and only
//! `usage` is deserialized. Streams are read chunk by chunk through [`SseUsage`]; the
//! first chunk's arrival is the time to first byte. Bodies of error answers are drained
//! unread so the connection goes back to the pool.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use tokio::time::Instant;

use super::record::{Outcome, Sample};
use super::retry;
use super::usage::{self, SseUsage, Usage};

/// Largest non-stream body kept for usage parsing; a longer body is drained and its
/// usage is not read.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// What one send produced: the sample, and the retry-after wait the answer asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sent {
    /// How the request ended, timed.
    pub sample: Sample,
    /// The wait a 429/503 asked for, already capped.
    pub retry_after: Option<Duration>,
}

/// Executes `req` on `client` and reads the whole answer, timing it from `started`
/// (in a closed loop the send itself; in an open loop up to when the slot was due,
/// so that a generator that fell behind charges its lateness to the latency
/// instead of hiding it, as wrk2 does). Never fails: transport problems become
/// [`Outcome::TransportError`].
pub async fn send(
    client: &reqwest::Client,
    req: reqwest::Request,
    stream: bool,
    started: Instant,
) -> Sent {
    let transport = |e: reqwest::Error| {
        tracing::debug!(error = %e, timeout = e.is_timeout(), "transport error");
        Sent {
            sample: Sample {
                outcome: Outcome::TransportError,
                latency: started.elapsed(),
                ttfb: None,
                usage: Usage::default(),
            },
            retry_after: None,
        }
    };
    let resp = match client.execute(req).await {
        Ok(resp) => resp,
        Err(e) => return transport(e),
    };
    let status = resp.status();
    let retry_after = retry::retry_after(status, resp.headers());
    let outcome = Outcome::from_status(status);
    let read = if outcome != Outcome::Ok {
        drain(resp).await.map(|()| (Usage::default(), None))
    } else if stream && is_event_stream(&resp) {
        read_stream(resp, started).await
    } else {
        read_json(resp).await.map(|usage| (usage, None))
    };
    match read {
        Ok((usage, ttfb)) => Sent {
            sample: Sample {
                outcome,
                latency: started.elapsed(),
                ttfb,
                usage,
            },
            retry_after,
        },
        Err(e) => transport(e),
    }
}

fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

async fn drain(mut resp: reqwest::Response) -> reqwest::Result<()> {
    while resp.chunk().await?.is_some() {}
    Ok(())
}

/// Reads a JSON body; the common one-chunk body is parsed without copying.
async fn read_json(mut resp: reqwest::Response) -> reqwest::Result<Usage> {
    let Some(first) = resp.chunk().await? else {
        return Ok(Usage::default());
    };
    let Some(second) = resp.chunk().await? else {
        return Ok(usage::from_json(&first));
    };
    let mut body = Vec::with_capacity(first.len() + second.len());
    body.extend_from_slice(&first);
    body.extend_from_slice(&second);
    let mut too_big = body.len() > MAX_BODY_BYTES;
    while let Some(chunk) = resp.chunk().await? {
        too_big = too_big || body.len() + chunk.len() > MAX_BODY_BYTES;
        if too_big {
            body = Vec::new();
        } else {
            body.extend_from_slice(&chunk);
        }
    }
    Ok(if too_big {
        Usage::default()
    } else {
        usage::from_json(&body)
    })
}

async fn read_stream(
    mut resp: reqwest::Response,
    started: Instant,
) -> reqwest::Result<(Usage, Option<Duration>)> {
    let mut sse = SseUsage::default();
    let mut ttfb = None;
    while let Some(chunk) = resp.chunk().await? {
        if ttfb.is_none() && !chunk.is_empty() {
            ttfb = Some(started.elapsed());
        }
        sse.feed(&chunk);
    }
    Ok((sse.usage(), ttfb))
}
