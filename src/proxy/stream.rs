//! Streaming responses: upstream SSE bytes pass through to the client event by event
//! while the gateway reads the usage out of them; the permits travel with the stream
//! and are settled when it ends.
//!
//! A task of its own pumps the upstream's events to the client's body through a
//! small channel, so that the stream ends on time whatever the client does: hyper
//! stops polling a body whose client has stopped reading, and a body that is not
//! polled could hold its permits, its slots and the node's in-flight slot for
//! good. The stream is cut, its permits dropped (the reservation kept: usage
//! unknown), its upstream connection closed and the client's body ended with an
//! error when:
//! - the upstream breaks, or stays silent for its `stream_idle_timeout`;
//! - the client takes nothing for as long (it stopped reading), or goes away;
//! - the request's deadline (`server.request_timeout`) passes.

use super::charges::Charges;
use super::request::Api;
use super::usage::{OpenAiEvent, Usage, anthropic_event, openai_event, responses_event};
use crate::actor::SettleWith;
use crate::upstream_http::{UpstreamBody, describe};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http_body_util::BodyDataStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Pieces of a stream on their way to the client at once: the rest waits at the
/// upstream (TCP backpressure), not in the node.
const PUMPED_PIECES: usize = 8;

/// Largest event kept whole while its end has not arrived. An upstream that
/// never ends an event (not SSE) is passed through unparsed beyond it, its
/// usage unknown, instead of growing the buffer without bound.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Splits SSE bytes into events and decides, per event, to keep or strip it.
/// Each byte is looked at once while its event is unfinished: the scan
/// resumes where the last chunk left it, so an event sent in many small
/// writes costs its length, not its length times its writes.
#[derive(Default)]
pub struct SseScanner {
    buffer: BytesMut,
    /// How far the unfinished event in `buffer` has been scanned.
    scan: Scan,
    /// Bytes the scans looked at (their cost, which tests bound).
    examined: u64,
    /// Usage seen so far.
    pub usage: Option<Usage>,
    /// Whether `usage` is the response's final figure (OpenAI's usage chunk,
    /// Anthropic's `message_delta`, the Responses API's `response.completed`);
    /// else the stream settles as reserved.
    pub complete: bool,
}

/// Where a scan of the buffer's unfinished event stopped: the next byte to
/// look at, and where the line it is in began.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Scan {
    at: usize,
    line_start: usize,
}

/// Where the first complete event in `buffer` ends (after its blank line), if one
/// has, scanning from `scan` (where the last call stopped, over the same
/// buffer grown since) and leaving it where this one stops: lines end with
/// CRLF, LF or CR, as the SSE spec allows (sse-starlette, for one, writes
/// CRLF). A CR last in the buffer that ends a line with text waits: its LF
/// may be in the next chunk. `examined` counts the bytes looked at.
fn event_end(buffer: &[u8], scan: &mut Scan, examined: &mut u64) -> Option<usize> {
    let Scan {
        mut at,
        mut line_start,
    } = *scan;
    while let Some(offset) = buffer[at..].iter().position(|b| *b == b'\n' || *b == b'\r') {
        let i = at + offset;
        *examined += offset as u64 + 1;
        let end = match (buffer[i], buffer.get(i + 1)) {
            // A blank line's CR ends the event even if an LF follows (it then
            // starts the next one as an empty line, which SSE ignores).
            (b'\r', None) if i == line_start => i + 1,
            (b'\r', None) => {
                *scan = Scan { at: i, line_start };
                return None;
            }
            (b'\r', Some(b'\n')) => i + 2,
            _ => i + 1,
        };
        if i == line_start {
            *scan = Scan::default();
            return Some(end);
        }
        (at, line_start) = (end, end);
    }
    *examined += (buffer.len() - at) as u64;
    *scan = Scan {
        at: buffer.len(),
        line_start,
    };
    None
}

fn data_lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event
        .split(|b| *b == b'\n' || *b == b'\r')
        .filter_map(|line| {
            line.strip_prefix(b"data:")
                .map(|d| d.strip_prefix(b" ").unwrap_or(d))
        })
}

impl SseScanner {
    /// Feeds upstream bytes; returns the bytes to forward now.
    pub fn feed(&mut self, chunk: &[u8], api: Api, strip_usage_chunk: bool) -> Bytes {
        self.buffer.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = event_end(&self.buffer, &mut self.scan, &mut self.examined) {
            let event = self.buffer.split_to(end);
            if self.keep(&event, api, strip_usage_chunk) {
                out.extend_from_slice(&event);
            }
        }
        if self.buffer.len() > MAX_EVENT_BYTES {
            out.extend_from_slice(&self.buffer.split());
            self.scan = Scan::default();
        }
        out.freeze()
    }

    fn keep(&mut self, event: &[u8], api: Api, strip_usage_chunk: bool) -> bool {
        let mut keep = true;
        for data in data_lines(event) {
            if api == Api::Messages {
                self.complete |= anthropic_event(data, &mut self.usage);
            } else if api == Api::Responses {
                self.complete |= responses_event(data, &mut self.usage);
            } else if let OpenAiEvent::Usage { usage, usage_only } = openai_event(data) {
                self.usage = Some(usage);
                self.complete = true;
                keep &= !(strip_usage_chunk && usage_only);
            }
        }
        keep
    }

    /// At the end of the stream: the bytes after the last complete event, read
    /// as an event (an upstream may end without the final blank line) and
    /// forwarded unless stripped.
    pub fn rest(&mut self, api: Api, strip_usage_chunk: bool) -> Bytes {
        let rest = self.buffer.split();
        self.scan = Scan::default();
        match self.keep(&rest, api, strip_usage_chunk) {
            true => rest.freeze(),
            false => Bytes::new(),
        }
    }

    /// Bytes the scans looked at so far: a scan costs each byte about once,
    /// however the stream is chunked (the fuzz target bounds it).
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// How the stream's permits settle once it ended: from the final usage, or
    /// as reserved without one.
    pub fn settlement(&self) -> SettleWith {
        (self.usage)
            .filter(|_| self.complete)
            .map_or(SettleWith::KeepReserved, Usage::settle_with)
    }
}

/// Limits on a streamed response (the module's doc says what each cuts).
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Longest silence of the upstream, and longest the client may take nothing.
    pub idle_timeout: Duration,
    /// The request's deadline.
    pub deadline: Instant,
}

type Piece = Result<Bytes, std::io::Error>;

struct Pump {
    upstream: BodyDataStream<UpstreamBody>,
    scanner: SseScanner,
    held: Option<Charges>,
    api: Api,
    strip_usage_chunk: bool,
    limits: StreamLimits,
    /// Set once the stream ended whole: a body whose pump stopped without it
    /// ends with an error, not as if complete.
    whole: Arc<AtomicBool>,
}

impl Pump {
    /// Pumps until the stream ends or is cut. Dropping `self` (its upstream
    /// stream, and any permits not settled) is how a cut stream lets go.
    async fn run(mut self, to_client: mpsc::Sender<Piece>) {
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(self.limits.idle_timeout, self.upstream.next()) => next,
                // The client went away: let go at once, not at the next chunk.
                () = to_client.closed() => return,
                () = tokio::time::sleep_until(self.limits.deadline) => {
                    let _ = to_client.try_send(Err(cut("the request's deadline passed")));
                    return;
                }
            };
            // The piece, and whether it is the last: `Some(true)` if the stream
            // ended whole with it, `Some(false)` if it is an error.
            let (piece, last) = match next {
                Ok(Some(Ok(chunk))) => {
                    let out = self.scanner.feed(&chunk, self.api, self.strip_usage_chunk);
                    if out.is_empty() {
                        continue;
                    }
                    (Ok(out), None)
                }
                Ok(None) => {
                    let rest = self.scanner.rest(self.api, self.strip_usage_chunk);
                    if let Some(held) = self.held.take() {
                        held.settle(self.scanner.settlement());
                    }
                    if rest.is_empty() {
                        self.whole.store(true, Ordering::Release);
                        return;
                    }
                    (Ok(rest), Some(true))
                }
                Ok(Some(Err(e))) => (
                    Err(cut(&format!("upstream stream broke: {}", describe(&*e)))),
                    Some(false),
                ),
                Err(_) => (Err(cut("upstream stream went silent")), Some(false)),
            };
            let delivered = tokio::select! {
                sent = tokio::time::timeout(self.limits.idle_timeout, to_client.send(piece)) => {
                    matches!(sent, Ok(Ok(())))
                }
                () = tokio::time::sleep_until(self.limits.deadline) => false,
            };
            if delivered && last == Some(true) {
                self.whole.store(true, Ordering::Release);
            }
            if !delivered || last.is_some() {
                return;
            }
        }
    }
}

fn cut(why: &str) -> std::io::Error {
    std::io::Error::other(why.to_owned())
}

/// The client-facing body of a streamed response, pumped by a task of its own.
pub fn metered(
    upstream: UpstreamBody,
    held: Charges,
    api: Api,
    strip_usage_chunk: bool,
    limits: StreamLimits,
) -> impl Stream<Item = Piece> + Send {
    let (to_client, from_pump) = mpsc::channel(PUMPED_PIECES);
    let whole = Arc::new(AtomicBool::new(false));
    let pump = Pump {
        upstream: BodyDataStream::new(upstream),
        scanner: SseScanner::default(),
        held: Some(held),
        api,
        strip_usage_chunk,
        limits,
        whole: whole.clone(),
    };
    tokio::spawn(pump.run(to_client));
    futures_util::stream::unfold(Some(from_pump), move |from_pump| {
        let whole = whole.clone();
        async move {
            let mut from_pump = from_pump?;
            match from_pump.recv().await {
                // An error is the body's last piece.
                Some(Err(e)) => Some((Err(e), None)),
                Some(piece) => Some((piece, Some(from_pump))),
                // The pump stopped: whole, or cut with its error already sent
                // or not (the client was not reading), and then it is sent now.
                None if whole.load(Ordering::Acquire) => None,
                None => Some((Err(cut("the stream was cut")), None)),
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
                cache_read: 0,
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

    #[test]
    fn events_end_with_any_of_the_line_endings_sse_allows() {
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}";
        for eol in ["\r\n", "\r", "\n"] {
            let stream = format!(
                "data: {{\"choices\":[{{}}]}}{eol}{eol}{usage}{eol}{eol}data: [DONE]{eol}{eol}"
            );
            // Cut everywhere, a CR and its LF in different chunks included: every
            // byte passes, and the usage is read.
            for at in 0..stream.len() {
                let (a, b) = stream.as_bytes().split_at(at);
                let mut s = SseScanner::default();
                let mut out = s.feed(a, Api::Chat, false).to_vec();
                out.extend_from_slice(&s.feed(b, Api::Chat, false));
                out.extend_from_slice(&s.rest(Api::Chat, false));
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    stream,
                    "{eol:?} cut at {at}"
                );
                assert_eq!(
                    s.settlement(),
                    SettleWith::Usage {
                        cache_read: 0,
                        prompt: 5,
                        completion: 2
                    },
                    "{eol:?} cut at {at}"
                );
            }
            // The usage-only chunk is stripped when asked.
            let mut s = SseScanner::default();
            let mut out = s.feed(stream.as_bytes(), Api::Chat, true).to_vec();
            out.extend_from_slice(&s.rest(Api::Chat, true));
            let expected = stream.replace(&format!("{usage}{eol}{eol}"), "");
            assert_eq!(String::from_utf8(out).unwrap(), expected, "{eol:?}");
            // An upstream that ends without the last blank line: its last event
            // is still read.
            let mut s = SseScanner::default();
            let unended = format!("data: {{\"choices\":[{{}}]}}{eol}{eol}{usage}");
            let mut out = s.feed(unended.as_bytes(), Api::Chat, false).to_vec();
            out.extend_from_slice(&s.rest(Api::Chat, false));
            assert_eq!(String::from_utf8(out).unwrap(), unended);
            assert!(s.complete, "{eol:?}");
        }
    }

    #[test]
    fn an_anthropic_stream_without_its_final_count_settles_as_reserved() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n";
        let text = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n";
        let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
        let end = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n";
        let mut cut_short = SseScanner::default();
        cut_short.feed(
            format!("{start}{text}{error}").as_bytes(),
            Api::Messages,
            false,
        );
        assert_eq!(cut_short.settlement(), SettleWith::KeepReserved);
        let mut whole = SseScanner::default();
        whole.feed(
            format!("{start}{text}{end}").as_bytes(),
            Api::Messages,
            false,
        );
        assert_eq!(
            whole.settlement(),
            SettleWith::Usage {
                cache_read: 0,
                prompt: 9,
                completion: 40
            }
        );
    }

    /// A 512 KiB event sent 64 bytes at a time is scanned about once, not
    /// once per write (which would look at 2 GiB), and passes whole.
    #[test]
    fn an_event_in_many_small_writes_is_scanned_once() {
        let text = "x".repeat(512 * 1024);
        let event = format!("data: {{\"choices\":[],\"t\":\"{text}\"}}\r\n\r\n");
        let mut s = SseScanner::default();
        let mut out = Vec::new();
        for piece in event.as_bytes().chunks(64) {
            out.extend_from_slice(&s.feed(piece, Api::Chat, false));
        }
        assert_eq!(out, event.as_bytes());
        let fed = event.len() as u64;
        assert!(
            s.examined <= 2 * fed,
            "{} bytes looked at for {fed}",
            s.examined
        );
    }

    #[test]
    fn bytes_that_never_end_an_event_pass_through_beyond_the_bound() {
        let mut s = SseScanner::default();
        let chunk = vec![b'x'; 64 * 1024];
        let mut passed = 0;
        for _ in 0..(MAX_EVENT_BYTES / chunk.len() + 2) {
            passed += s.feed(&chunk, Api::Chat, false).len();
            assert!(s.buffer.len() <= MAX_EVENT_BYTES);
        }
        assert!(passed > 0, "held back for good");
        assert_eq!(s.settlement(), SettleWith::KeepReserved);
    }
}
