//! Answers scrubbed of secrets the proxy wrote into requests. A server may
//! echo what it was sent (an error page quoting the request, an endpoint
//! listing the headers it got), which would hand the guest the real value
//! the proxy put there; every answer on such a host passes through here,
//! each secret replaced by the placeholder the guest knows. A streamed
//! answer is scrubbed as it arrives: the end of a chunk that could begin a
//! secret is held back until the next chunk shows whether it does.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Frame};

/// The secrets to replace, each with its replacement.
pub struct Scrub {
    /// (secret, replacement), longest secret first so that the longest
    /// match at a position wins.
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// For each byte, the pairs whose secret begins with it.
    by_first: Vec<Vec<usize>>,
    longest: usize,
}

impl std::fmt::Debug for Scrub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrub({} secrets)", self.pairs.len())
    }
}

impl Scrub {
    /// Empty secrets are left out (they would match everywhere).
    pub fn new(pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Scrub {
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = pairs.into_iter().filter(|(secret, _)| !secret.is_empty()).collect();
        pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        pairs.dedup_by(|a, b| a.0 == b.0);
        let mut by_first = vec![Vec::new(); 256];
        for (index, (secret, _)) in pairs.iter().enumerate() {
            by_first[usize::from(secret[0])].push(index);
        }
        let longest = pairs.first().map_or(0, |(secret, _)| secret.len());
        Scrub { pairs, by_first, longest }
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `data` with every secret replaced; `None` when it held none.
    pub fn replace(&self, data: &[u8]) -> Option<Vec<u8>> {
        let (out, _, replaced) = self.scan(data, true);
        replaced.then_some(out)
    }

    /// Replaces the secrets in `data`, leftmost and longest first, up to
    /// where (unless it is the `last` of a stream) a secret may begin that
    /// more data would complete or lengthen: (the scrubbed bytes, how much
    /// of `data` they stand for, whether any secret was replaced).
    fn scan(&self, data: &[u8], last: bool) -> (Vec<u8>, usize, bool) {
        let open_from = match last {
            true => data.len(),
            false => data.len().saturating_sub(self.longest.saturating_sub(1)),
        };
        let mut out = Vec::with_capacity(data.len());
        let (mut copied, mut at, mut replaced) = (0, 0, false);
        while at < data.len() {
            let candidates = &self.by_first[usize::from(data[at])];
            let rest = &data[at..];
            if at >= open_from
                && candidates.iter().any(|&i| self.pairs[i].0.len() > rest.len() && self.pairs[i].0.starts_with(rest))
            {
                break;
            }
            match candidates.iter().find(|&&i| rest.starts_with(&self.pairs[i].0)) {
                Some(&i) => {
                    out.extend_from_slice(&data[copied..at]);
                    out.extend_from_slice(&self.pairs[i].1);
                    at += self.pairs[i].0.len();
                    copied = at;
                    replaced = true;
                }
                None => at += 1,
            }
        }
        out.extend_from_slice(&data[copied..at]);
        (out, at, replaced)
    }

    /// Replaces secrets in header values; a value that would no longer be
    /// a valid header is removed.
    pub fn headers(&self, headers: &mut HeaderMap) {
        let mut changed = Vec::new();
        for (name, value) in headers.iter() {
            if let Some(clean) = self.replace(value.as_bytes()) {
                changed.push((name.clone(), value.clone(), HeaderValue::from_bytes(&clean).ok()));
            }
        }
        for (name, old, new) in changed {
            let kept: Vec<HeaderValue> = headers.get_all(&name).iter().filter(|v| **v != old).cloned().collect();
            headers.remove(&name);
            for value in kept.into_iter().chain(new) {
                headers.append(name.clone(), value);
            }
        }
    }
}

/// A body passed on with every secret of a [`Scrub`] replaced.
pub struct Scrubbed<B> {
    inner: B,
    scrub: Arc<Scrub>,
    /// Data that may be the start of a secret.
    held: Vec<u8>,
    trailers: Option<HeaderMap>,
    ended: bool,
}

impl<B> Scrubbed<B> {
    pub fn new(inner: B, scrub: Arc<Scrub>) -> Scrubbed<B> {
        Scrubbed { inner, scrub, held: Vec::new(), trailers: None, ended: false }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Scrubbed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                if !this.held.is_empty() {
                    let (out, _, _) = this.scrub.scan(&std::mem::take(&mut this.held), true);
                    return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.ended = true;
                    continue;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            match frame.into_data() {
                Ok(data) => {
                    this.held.extend_from_slice(&data);
                    let (out, used, _) = this.scrub.scan(&this.held, false);
                    this.held.drain(..used);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
                Err(frame) => {
                    if let Ok(mut trailers) = frame.into_trailers() {
                        this.scrub.headers(&mut trailers);
                        this.trailers = Some(trailers);
                        this.ended = true;
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.held.is_empty() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn scrub() -> Scrub {
        Scrub::new([
            (b"real-secret".to_vec(), b"P1".to_vec()),
            (b"real-secret-longer".to_vec(), b"P2".to_vec()),
            (Vec::new(), b"never".to_vec()),
        ])
    }

    #[test]
    fn every_secret_is_replaced_longest_first() {
        let scrub = scrub();
        assert_eq!(scrub.replace(b"a real-secret b real-secret-longer c").unwrap(), b"a P1 b P2 c");
        assert_eq!(scrub.replace(b"real-secre"), None);
        // In a stream, what may still become a secret waits for more.
        assert_eq!(scrub.scan(b"xx real-sec", false), (b"xx ".to_vec(), 3, false));
        assert_eq!(scrub.scan(b"real-secret xx real-secret", false), (b"P1 xx ".to_vec(), 15, true));
        assert_eq!(scrub.scan(b"xx rea!", false), (b"xx rea!".to_vec(), 7, false));
        assert_eq!(scrub.scan(b"xx real-secret", true), (b"xx P1".to_vec(), 14, true));
        let mut headers = HeaderMap::new();
        headers.append("x-echo", HeaderValue::from_static("Bearer real-secret"));
        headers.append("x-echo", HeaderValue::from_static("other"));
        scrub.headers(&mut headers);
        let values: Vec<&str> = headers.get_all("x-echo").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(values, ["other", "Bearer P1"]);
    }

    /// A body that yields its chunks one by one.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }

    #[tokio::test]
    async fn a_secret_split_across_chunks_is_replaced_in_every_split() {
        let text = b"data: real-secret-longer and real-secret\n\ndata: end real-secret";
        for size in 1..text.len() {
            let chunks = text.chunks(size).map(Bytes::copy_from_slice).collect();
            let body = Scrubbed::new(Chunks(chunks), Arc::new(scrub()));
            let out = body.collect().await.unwrap().to_bytes();
            assert_eq!(&out[..], b"data: P2 and P1\n\ndata: end P1", "chunks of {size}");
        }
    }
}
