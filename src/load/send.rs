//! Sending one request and reading its answer into a [`Sample`].
//!
//! Requests go through hyper's pooled client directly, the gateway's own upstream
//! client without proxies (`crate::upstream_http`), not reqwest: reqwest
//! turns each request's URL into a URI and back three times, work the generator
//! would do on the same cores as the target it measures.
//!
//! Non-stream bodies are read as bytes (at most [`MAX_BODY_BYTES`] kept) and only
//! `usage` is deserialized. Streams are read chunk by chunk through [`SseUsage`]; the
//! first chunk's arrival is the time to first byte. Bodies of error answers are drained
//! unread so the connection goes back to the pool.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use tokio::time::Instant;

use super::record::{Outcome, Sample};
use super::request::Outgoing;
use super::retry;
use super::usage::{self, SseUsage, Usage};
use crate::upstream_http::{BoxError, Endpoint, UpstreamBody, UpstreamHttp, UpstreamResponse};

/// Largest non-stream body kept for usage parsing; a longer body is drained and its
/// usage is not read.
pub(super) const MAX_BODY_BYTES: usize = 16 << 20;

/// What one send produced: the sample, and the retry-after wait the answer asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sent {
    /// How the request ended, timed.
    pub sample: Sample,
    /// The wait a 429/503 asked for, already capped.
    pub retry_after: Option<Duration>,
}

/// How one request goes out: the client, where to, whether to read a stream, and
/// the longest the whole exchange may take (`--timeout`, from the send).
#[derive(Debug, Clone, Copy)]
pub(super) struct Via<'a> {
    /// The pooled client.
    pub client: &'a UpstreamHttp,
    /// The target's endpoint.
    pub endpoint: &'a Endpoint,
    /// Read a `text/event-stream` answer as one.
    pub stream: bool,
    /// From the send to the answer's last byte.
    pub timeout: Duration,
}

/// Sends `req` and reads the whole answer, timing it from `started` (in a closed
/// loop the send itself; in an open loop up to when the slot was due, so that a
/// generator that fell behind charges its lateness to the latency instead of
/// hiding it, as wrk2 does). Never fails: transport problems and answers not
/// whole within the timeout become [`Outcome::TransportError`].
pub(super) async fn send(via: Via<'_>, req: Outgoing, started: Instant) -> Sent {
    let exchange = exchange(via, req, started);
    match tokio::time::timeout(via.timeout, exchange).await {
        Ok(sent) => sent,
        Err(_) => {
            tracing::debug!(timeout = ?via.timeout, "transport error: timed out");
            transport_error(started)
        }
    }
}

fn transport_error(started: Instant) -> Sent {
    Sent {
        sample: Sample {
            outcome: Outcome::TransportError,
            latency: started.elapsed(),
            ttfb: None,
            usage: Usage::default(),
        },
        retry_after: None,
    }
}

async fn exchange(via: Via<'_>, req: Outgoing, started: Instant) -> Sent {
    let transport = |e: BoxError| {
        tracing::debug!(error = %crate::upstream_http::describe(&*e), "transport error");
        transport_error(started)
    };
    let resp = match via.client.post(via.endpoint, req.headers, req.body).await {
        Ok(resp) => resp,
        Err(e) => return transport(e),
    };
    let status = resp.status();
    let retry_after = retry::retry_after(status, resp.headers());
    let outcome = Outcome::from_status(status);
    let stream = via.stream && is_event_stream(&resp);
    let body = resp.into_body();
    let read = if outcome != Outcome::Ok {
        drain(body).await.map(|()| (Usage::default(), None))
    } else if stream {
        read_stream(body, started).await
    } else {
        read_json(body).await.map(|usage| (usage, None))
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

fn is_event_stream(resp: &UpstreamResponse) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

async fn drain(mut resp: UpstreamBody) -> Result<(), BoxError> {
    while resp.chunk().await?.is_some() {}
    Ok(())
}

/// Reads a JSON body; the common one-chunk body is parsed without copying.
async fn read_json(mut resp: UpstreamBody) -> Result<Usage, BoxError> {
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
    mut resp: UpstreamBody,
    started: Instant,
) -> Result<(Usage, Option<Duration>), BoxError> {
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
