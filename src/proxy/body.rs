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

use super::audit::{AuditLog, Decision, Record};

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

/// A body read whole, or one past the limit (left unread).
pub enum Buffered {
    Whole(Bytes),
    Larger,
}

/// Reads a body whole when it holds at most `limit` bytes. Trailers of a
/// body read whole are dropped (token endpoints and registries send none).
pub async fn buffer<B>(mut body: B, limit: usize) -> Result<Buffered, BoxError>
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit as u64 {
        return Ok(Buffered::Larger);
    }
    let mut read: Vec<Bytes> = Vec::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(Into::into)?.into_data() else { continue };
        len += data.len();
        read.push(data);
        if len > limit {
            return Ok(Buffered::Larger);
        }
    }
    Ok(Buffered::Whole(read.concat().into()))
}

/// [`buffer`] within a deadline: a body still arriving after it is an
/// error, so a guest or server trickling bytes cannot hold the proxy.
pub async fn buffer_within<B>(body: B, limit: usize, deadline: Duration) -> Result<Buffered, BoxError>
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    match tokio::time::timeout(deadline, buffer(body, limit)).await {
        Ok(read) => read,
        Err(_) => Err(format!("the body did not arrive within {}s", deadline.as_secs()).into()),
    }
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

    /// A body that sends one byte, then nothing, never ending.
    struct Trickle(bool);

    impl Body for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let this = self.get_mut();
            if std::mem::replace(&mut this.0, true) {
                Poll::Pending
            } else {
                Poll::Ready(Some(Ok(Frame::data("x".into()))))
            }
        }
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_given_up_at_the_deadline() {
        let err = buffer_within(Trickle(false), 100, Duration::from_millis(50)).await.err().unwrap();
        assert!(err.to_string().contains("did not arrive within"), "{err}");
        let Ok(Buffered::Whole(bytes)) = buffer_within(full("ok"), 100, Duration::from_secs(1)).await else { panic!() };
        assert_eq!(&bytes[..], b"ok");
    }

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
