//! HTTP plumbing shared by the forwarding paths: one body type, the
//! proxy's own text responses, hop-by-hop header removal, and byte counting
//! that writes the audit record when both bodies of an exchange are done.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, SizeHint};
use thiserror::Error;

use super::audit::AuditLog;
use super::budget::{Budget, Charge, Exhausted};
use crate::protocol::audit::{Decision, Record};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every body the proxy sends or forwards.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A response written by the proxy itself, for the guest's user to read.
pub fn text(status: StatusCode, message: String) -> Response<ProxyBody> {
    let mut body = message;
    body.push('\n');
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// Removes the headers that describe one hop, not the message (RFC 9110
/// 7.6.1), including those the Connection header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// A body read whole, or one past the limit (left unread, its start freed).
pub enum Buffered {
    Whole(Bytes),
    Larger,
}

/// Why a body could not be read whole.
#[derive(Debug, Error)]
pub enum BufferError {
    #[error(transparent)]
    Budget(#[from] Exhausted),
    #[error("it did not arrive whole within {} s, the proxy's limit", .0.as_secs())]
    Deadline(Duration),
    #[error(transparent)]
    Body(BoxError),
}

/// Reads a body whole when it holds at most `limit` bytes, with every byte
/// held charged to `budget` (the charge comes back with a body read whole;
/// keep it while the bytes are kept) and the whole read bounded by
/// `deadline`, so neither a thousand bodies at once nor one that trickles
/// in can hold the host's memory. Trailers are dropped (token endpoints and
/// registries send none).
pub async fn buffer_within<B>(
    mut body: B,
    limit: usize,
    budget: &Budget,
    deadline: Duration,
) -> Result<(Buffered, Charge), BufferError>
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit as u64 {
        return Ok((Buffered::Larger, budget.charge()));
    }
    let read = async {
        let mut charge = budget.charge();
        let mut read: Vec<Bytes> = Vec::new();
        let mut len = 0;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|e| BufferError::Body(e.into()))?.into_data() else { continue };
            charge.grow(data.len() as u64)?;
            len += data.len();
            read.push(data);
            if len > limit {
                return Ok((read, charge, false));
            }
        }
        Ok::<_, BufferError>((read, charge, true))
    };
    let (read, charge, whole) =
        tokio::time::timeout(deadline, read).await.map_err(|_| BufferError::Deadline(deadline))??;
    if whole {
        return Ok((Buffered::Whole(read.concat().into()), charge));
    }
    Ok((Buffered::Larger, budget.charge()))
}

/// A body of bytes already in hand.
pub fn full(data: impl Into<Bytes>) -> ProxyBody {
    Full::new(data.into()).map_err(|never| match never {}).boxed()
}

/// One request/response exchange's audit record, written when the last
/// body holding it is dropped (so the byte counts are final).
pub struct Flow {
    audit: Arc<AuditLog>,
    record: Mutex<Record>,
    up: AtomicU64,
    down: AtomicU64,
}

impl Flow {
    pub fn new(audit: Arc<AuditLog>, record: Record) -> Arc<Flow> {
        Arc::new(Flow { audit, record: Mutex::new(record), up: AtomicU64::new(0), down: AtomicU64::new(0) })
    }

    pub fn update(&self, f: impl FnOnce(&mut Record)) {
        f(&mut self.record.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Marks the exchange failed, with the reason.
    pub fn fail(&self, reason: String) {
        self.update(|r| {
            r.decision = Decision::Fail;
            r.reason = Some(reason);
        });
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner()).clone();
        record.bytes_up = self.up.load(Ordering::Relaxed);
        record.bytes_down = self.down.load(Ordering::Relaxed);
        self.audit.record(&record);
    }
}

#[derive(Clone, Copy)]
pub enum Direction {
    Up,
    Down,
}

/// A body that adds its data bytes to a flow's count.
pub struct Counted<B> {
    inner: B,
    flow: Arc<Flow>,
    direction: Direction,
}

impl<B> Counted<B>
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    pub fn boxed(inner: B, flow: Arc<Flow>, direction: Direction) -> ProxyBody {
        Counted { inner, flow, direction }.map_err(Into::into).boxed()
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &poll {
            if let Some(data) = frame.data_ref() {
                let counter = match this.direction {
                    Direction::Up => &this.flow.up,
                    Direction::Down => &this.flow.down,
                };
                counter.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        poll
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

    #[test]
    fn strips_hop_by_hop_headers_and_those_connection_names() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret-hop"));
        headers.insert("x-secret-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::PROXY_AUTHORIZATION, HeaderValue::from_static("Basic Zm9v"));
        headers.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key(header::ACCEPT));
    }
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    /// A body that sends one byte every 10 ms and never ends.
    struct Trickle(tokio::time::Interval);

    impl Body for Trickle {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            std::task::ready!(self.0.poll_tick(cx));
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }
    }

    /// A body sent in the chunks it holds.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|data| Ok(Frame::data(data))))
        }
    }

    /// A body of `frames` frames of `size` bytes.
    fn frames(frames: usize, size: usize) -> Chunks {
        Chunks((0..frames).map(|_| Bytes::from(vec![b'a'; size])).collect())
    }

    #[tokio::test]
    async fn a_trickling_body_is_not_held_past_its_deadline() {
        let budget = Budget::new(1 << 20);
        let trickle = Trickle(tokio::time::interval(Duration::from_millis(10)));
        let started = std::time::Instant::now();
        let read = buffer_within(trickle, 1 << 20, &budget, Duration::from_millis(200)).await;
        assert!(matches!(read, Err(BufferError::Deadline(_))), "{:?}", read.err());
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(budget.used(), 0, "what it had sent is freed");
    }

    #[tokio::test]
    async fn bodies_beyond_the_budget_are_refused_and_freed_when_dropped() {
        let budget = Budget::new(100 << 10);
        let deadline = Duration::from_secs(10);
        let (first, charge) = buffer_within(frames(6, 10 << 10), 1 << 20, &budget, deadline).await.unwrap();
        assert!(matches!(first, Buffered::Whole(ref b) if b.len() == 60 << 10));
        // Together with the first, the second would pass the budget.
        let second = buffer_within(frames(6, 10 << 10), 1 << 20, &budget, deadline).await;
        let error = second.err().expect("refused past the budget");
        assert!(matches!(error, BufferError::Budget(_)));
        assert!(error.to_string().contains("100.0 KiB"), "{error}");
        assert_eq!(budget.used(), 60 << 10, "the refused body's bytes are freed");
        drop((first, charge));
        let (second, _charge) = buffer_within(frames(6, 10 << 10), 1 << 20, &budget, deadline).await.unwrap();
        assert!(matches!(second, Buffered::Whole(_)));
    }

    #[tokio::test]
    async fn a_body_past_its_limit_holds_nothing_of_the_budget() {
        let budget = Budget::new(1 << 20);
        let (larger, _) = buffer_within(frames(4, 10 << 10), 15 << 10, &budget, Duration::from_secs(10)).await.unwrap();
        assert!(matches!(larger, Buffered::Larger), "read whole past its limit");
        assert_eq!(budget.used(), 0);
    }
}
