//! A request body whose chunks must each arrive within a time of being asked
//! for: a client that starts a body and then trickles or stalls cannot hold a
//! handler (and the connection, and a descriptor) for longer.
//!
//! The clock runs only while the body is polled and has nothing ready: a
//! request that waits in a queue before its handler reads the body is not
//! charged for the wait.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why an idle body ended.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for {0:?} (server.body_idle_timeout)")]
pub struct BodyIdle(pub Duration);

/// `B`, failing with [`BodyIdle`] when a chunk takes longer than `idle`.
pub struct IdleBody<B> {
    inner: B,
    idle: Duration,
    /// Set while a poll found nothing ready: when the wait began to count.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<B> IdleBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, idle: Duration) -> Self {
        IdleBody {
            inner,
            idle,
            waiting: None,
        }
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let sleep = (this.waiting).get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(Instant::now() + idle))
                });
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.waiting = None;
                        Poll::Ready(Some(Err(Box::new(BodyIdle(idle)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, StreamBody};

    fn stalled_after_one_chunk() -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let first = futures_util::stream::iter([Ok::<_, std::io::Error>(Frame::data(
            Bytes::from_static(b"{\"a\":"),
        ))]);
        StreamBody::new(first.chain(futures_util::stream::pending()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_after_the_idle_time_and_not_before() {
        let mut body = IdleBody::new(stalled_after_one_chunk(), Duration::from_secs(5));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"{\"a\":"));
        let began = Instant::now();
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.is::<BodyIdle>(), "{error}");
        assert_eq!(began.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn time_before_the_body_is_read_is_not_counted() {
        let mut body = IdleBody::new(stalled_after_one_chunk(), Duration::from_secs(5));
        // A queue wait longer than the idle time, before the handler reads.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data(), "the waiting did not count");
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_body_reads_through() {
        let chunks = futures_util::stream::iter(
            [b"ab".as_slice(), b"cd"].map(|c| Ok::<_, std::io::Error>(Frame::data(Bytes::from(c)))),
        );
        let body = IdleBody::new(StreamBody::new(chunks), Duration::from_millis(1));
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all, Bytes::from_static(b"abcd"));
    }
}
