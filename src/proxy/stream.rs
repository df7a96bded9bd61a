//! Streaming responses: upstream SSE bytes pass through to the client event by event
//! while the gateway reads the usage out of them; the permits travel with the stream
//! and are settled when it ends. If the client goes away, axum drops the stream, the
//! permits drop, and they settle conservatively (reservation kept). If the upstream
//! goes silent for longer than its idle timeout or breaks, the stream is cut.

use super::request::Api;
use super::usage::{OpenAiEvent, Usage, anthropic_event, openai_event};
use crate::actor::{Permit, SettleWith};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use std::pin::Pin;
use std::time::Duration;

/// Permits and guards a response holds until its last byte.
pub struct Held {
    /// The tenant's permit.
    pub tenant: Permit,
    /// The upstream's permit.
    pub upstream: Permit,
    /// Anything else to drop at the end (the node's in-flight slot).
    pub guard: Box<dyn Send + Sync>,
}

impl Held {
    /// Settles both permits the same way.
    pub fn settle(self, how: SettleWith) {
        self.tenant.settle(how);
        self.upstream.settle(how);
    }
}

/// Splits SSE bytes into events and decides, per event, to keep or strip it.
#[derive(Default)]
pub struct SseScanner {
    buffer: BytesMut,
    /// Usage seen so far.
    pub usage: Option<Usage>,
}

fn event_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

fn data_lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event.split(|b| *b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.strip_prefix(b"data:")
            .map(|d| d.strip_prefix(b" ").unwrap_or(d))
    })
}

impl SseScanner {
    /// Feeds upstream bytes; returns the bytes to forward now.
    pub fn feed(&mut self, chunk: &[u8], api: Api, strip_usage_chunk: bool) -> Bytes {
        self.buffer.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = event_end(&self.buffer) {
            let event = self.buffer.split_to(end);
            if self.keep(&event, api, strip_usage_chunk) {
                out.extend_from_slice(&event);
            }
        }
        out.freeze()
    }

    fn keep(&mut self, event: &[u8], api: Api, strip_usage_chunk: bool) -> bool {
        let mut keep = true;
        for data in data_lines(event) {
            if api == Api::Messages {
                anthropic_event(data, &mut self.usage);
            } else if let OpenAiEvent::Usage { usage, usage_only } = openai_event(data) {
                self.usage = Some(usage);
                keep &= !(strip_usage_chunk && usage_only);
            }
        }
        keep
    }

    /// Bytes left after the last complete event (forwarded as they are).
    pub fn rest(&mut self) -> Bytes {
        self.buffer.split().freeze()
    }
}

struct State {
    upstream: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    scanner: SseScanner,
    held: Option<Held>,
    api: Api,
    strip_usage_chunk: bool,
    idle_timeout: Duration,
}

impl State {
    fn finish(&mut self) {
        if let Some(held) = self.held.take() {
            let how = self
                .scanner
                .usage
                .map_or(SettleWith::KeepReserved, Usage::settle_with);
            held.settle(how);
        }
    }
}

/// The client-facing body of a streamed response.
pub fn metered(
    response: reqwest::Response,
    held: Held,
    api: Api,
    strip_usage_chunk: bool,
    idle_timeout: Duration,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let state = State {
        upstream: Box::pin(response.bytes_stream()),
        scanner: SseScanner::default(),
        held: Some(held),
        api,
        strip_usage_chunk,
        idle_timeout,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        st.held.as_ref()?;
        loop {
            match tokio::time::timeout(st.idle_timeout, st.upstream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    let out = st.scanner.feed(&chunk, st.api, st.strip_usage_chunk);
                    if !out.is_empty() {
                        return Some((Ok(out), st));
                    }
                }
                Ok(None) => {
                    st.finish();
                    let rest = st.scanner.rest();
                    return (!rest.is_empty()).then_some((Ok(rest), st));
                }
                Ok(Some(Err(e))) => {
                    // Usage unknown: dropping the permits keeps the reservation.
                    st.held = None;
                    return Some((
                        Err(std::io::Error::other(format!("upstream stream broke: {e}"))),
                        st,
                    ));
                }
                Err(_) => {
                    st.held = None;
                    return Some((
                        Err(std::io::Error::other("upstream stream went silent")),
                        st,
                    ));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_chunk_is_stripped_only_when_asked_and_split_events_are_joined() {
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n";
        let content = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
        let all = format!("{content}{usage}data: [DONE]\n\n");
        let (a, b) = all.as_bytes().split_at(10);
        let mut s = SseScanner::default();
        let mut out = s.feed(a, Api::Chat, true).to_vec();
        out.extend_from_slice(&s.feed(b, Api::Chat, true));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{content}data: [DONE]\n\n")
        );
        assert_eq!(
            s.usage.unwrap().settle_with(),
            SettleWith::Usage {
                prompt: 5,
                completion: 2
            }
        );

        let mut keep = SseScanner::default();
        assert_eq!(
            keep.feed(all.as_bytes(), Api::Chat, false),
            Bytes::from(all.clone())
        );
    }
}
