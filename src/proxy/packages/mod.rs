//! The package cache: downloads from the registries a policy names
//! (`[[registry]]`) are served from the host's cache when an earlier run
//! fetched them, so a fresh VM's second `npm install` or `cargo fetch`
//! downloads nothing again.
//!
//! A file enters the cache only after the proxy found it to have the digest
//! the registry itself publishes, read by the proxy from the registry (the
//! packument, the sparse index, the file's path), never from anything the
//! guest sent; and it is checked again each time it is served. A hostile
//! run can ask for any file but cannot put bytes of its choosing in front
//! of the next run. Requests the cache cannot vouch for (no digest, a
//! private registry's metadata it cannot read) go to the registry as
//! before.

mod registries;
pub mod store;

use std::fs::File;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

use super::Shared;
use super::body::{self, BoxError, Buffered, Counted, Direction, Flow, ProxyBody};
use super::intercept::Interception;
use super::resolve::{self, Unreachable};
use super::upstream::{self, TlsUpstream};
use crate::policy::{RegistryUrl, Verdict};
use crate::protocol::audit::{Decision, Kind, Record};
pub use registries::Download;
use registries::Source;
use store::{Store, Tampered};

/// The largest packument or index file read (popular npm packages have
/// packuments of tens of MB even abbreviated).
const MAX_METADATA: usize = 128 << 20;
/// How long the proxy's own metadata request may take, body and all; past
/// it the download goes to the registry uncached.
const METADATA_DEADLINE: Duration = Duration::from_secs(120);
/// npm's abbreviated packument: versions with their `dist`, little else.
const NPM_ACCEPT: &str = "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8";

/// Where the cache is and how large it may grow.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub limit: u64,
}

/// The download a guest request is, when the cache may serve it.
pub fn recognize<B>(shared: &Shared, this: &Interception, req: &Request<B>) -> Option<Download> {
    shared.packages.as_ref()?;
    if req.method() != Method::GET || req.uri().query().is_some() {
        return None;
    }
    let rule = shared.policy.registry_at(&this.host, this.port)?;
    registries::recognize(rule, &this.host, this.port, req.uri().path())
}

/// Serves a download from the cache, or fetches, checks and keeps it;
/// `None` when the cache cannot vouch for it and the request should go to
/// the registry as any other would.
pub async fn serve(this: &Interception, download: Download, record: Record) -> Option<Response<ProxyBody>> {
    let shared = &this.shared;
    let store = &shared.packages.as_ref()?.store;
    let mut record = record;
    let known = match &download.source {
        Source::Known(digest) => Some(digest.clone()),
        _ => store.entry(&download.key),
    };
    if let Some(digest) = &known {
        match blocking({
            let (shared, digest) = (shared.clone(), digest.clone());
            move || shared.packages.as_ref().map(|p| p.store.verified(&digest))
        })
        .await
        {
            Some(Ok(Ok(Some((file, size))))) => {
                record.cache = Some("hit".into());
                record.status = Some(200);
                return Some(from_file(shared, record, file, size));
            }
            Some(Ok(Err(Tampered { found }))) => {
                tracing::warn!(
                    "the cached copy of {} had changed on disk ({found}, not {digest}); removed it and fetched it again",
                    download.label
                );
                record.reason = Some(format!("cached copy had changed on disk ({found}); removed, fetched again"));
            }
            Some(Err(e)) => tracing::warn!("cannot read the package cache: {e}"),
            Some(Ok(Ok(None))) | None => {}
        }
    }
    let expected = match known {
        Some(digest) => digest,
        None => match expected_digest(this, &download).await {
            Ok(digest) => digest,
            Err(reason) => {
                tracing::debug!("not cached: {}: {reason}", download.label);
                return None;
            }
        },
    };
    Some(fill(this, download, expected, record).await)
}

/// Fetches the registry's metadata for a download and reads its digest.
async fn expected_digest(this: &Interception, download: &Download) -> Result<store::Digest, String> {
    let shared = &this.shared;
    let rule = shared.policy.registry_at(&this.host, this.port).ok_or("no registry rule")?;
    let (url, path, accept) = match &download.source {
        Source::Known(digest) => return Ok(digest.clone()),
        Source::Npm { path, .. } => (&rule.url, path, NPM_ACCEPT),
        Source::Crates { path, .. } => (rule.index.as_ref().ok_or("no index")?, path, "*/*"),
    };
    digest_from(shared, url, path, accept, &download.source).await
}

/// A GET of registry metadata by the proxy itself, under the same policy
/// as the guest's requests, and logged like them (a failure to fetch it,
/// not one to find the digest in it, fails the record); the digest it
/// gives for `source`.
async fn digest_from(
    shared: &Shared,
    url: &RegistryUrl,
    path: &str,
    accept: &str,
    source: &Source,
) -> Result<store::Digest, String> {
    let mut record = Record::new(Kind::Https, url.host.to_string(), url.port.get(), Decision::Allow);
    record.method = Some("GET".into());
    record.path = Some(path.to_string());
    record.cache = Some("checksums".into());
    let result = async {
        let private_ok = match shared.policy.verdict(&url.host, url.port) {
            Verdict::Allow { private_ok, rule } => {
                record.rule = Some(rule);
                private_ok
            }
            Verdict::Deny(denial) => return Err(format!("not allowed: {}", denial.reason())),
        };
        let addrs = match resolve::destination(&shared.policy, &shared.resolver, &url.host, url.port, private_ok).await
        {
            Ok(addrs) => addrs,
            Err(Unreachable::Denied(denial)) => return Err(denial.reason()),
            Err(Unreachable::NotFound(reason)) => return Err(reason),
        };
        let tcp = upstream::connect_any(&addrs).await?;
        let tls = shared.upstream_tls.clone().ok_or("no upstream TLS configuration")?;
        let upstream = TlsUpstream::new(url.host.clone(), url.port, addrs, tls, tcp);
        let req = Request::get(path)
            .header(header::ACCEPT, accept)
            .header(header::USER_AGENT, concat!("stockade/", env!("CARGO_PKG_VERSION")))
            .body(body::empty())
            .map_err(|e| e.to_string())?;
        let response = upstream.send(req).await?;
        record.status = Some(response.status().as_u16());
        if response.status() != StatusCode::OK {
            return Err(format!("{url}: status {}", response.status()));
        }
        // Parsed while its bytes are still charged to the budget.
        match body::buffer_within(response.into_body(), MAX_METADATA, &shared.buffers, METADATA_DEADLINE).await {
            Ok((Buffered::Whole(bytes), _charge)) => {
                record.bytes_down = bytes.len() as u64;
                Ok(registries::digest_in(source, &bytes))
            }
            Ok((Buffered::Larger, _)) => Err(format!("larger than {} MiB", MAX_METADATA >> 20)),
            Err(e) => Err(e.to_string()),
        }
    };
    let result = match tokio::time::timeout(METADATA_DEADLINE, result).await {
        Ok(result) => result,
        Err(_) => Err(format!("no whole answer within {} s", METADATA_DEADLINE.as_secs())),
    };
    if let Err(reason) = &result {
        record.decision = Decision::Fail;
        record.reason = Some(reason.clone());
    }
    shared.audit.record(&record);
    result?
}

/// Downloads the file from the registry into the cache, checking it on the
/// way, and serves it only if it has the registry's digest.
async fn fill(this: &Interception, download: Download, expected: store::Digest, record: Record) -> Response<ProxyBody> {
    let shared = &this.shared;
    let Some(packages) = shared.packages.as_ref() else {
        return body::text(StatusCode::INTERNAL_SERVER_ERROR, "stockade: no package cache".into());
    };
    let flow = Flow::new(shared.audit.clone(), record);
    let req = Request::get(download.path.as_str())
        .header(header::ACCEPT, "*/*")
        .header(header::ACCEPT_ENCODING, "identity")
        .header(header::USER_AGENT, concat!("stockade/", env!("CARGO_PKG_VERSION")))
        .body(body::empty());
    let req = match req {
        Ok(req) => req,
        Err(e) => return failed(&flow, format!("bad download path: {e}")),
    };
    let response = match this.upstream.send(req).await {
        Ok(response) => response,
        Err(reason) => return failed(&flow, reason),
    };
    flow.update(|r| r.status = Some(response.status().as_u16()));
    if response.status() != StatusCode::OK {
        // The registry's own answer (a 404, a redirect): nothing to keep.
        let (mut parts, incoming) = response.into_parts();
        body::strip_hop_by_hop(&mut parts.headers);
        return Response::from_parts(parts, Counted::boxed(incoming, flow, Direction::Down));
    }
    let length = response.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    let fill = packages.store.fill(expected.clone(), length);
    // Passed on as it arrives, so a large file is no slower than without
    // the cache; only its last frame waits for the check.
    let (mut parts, incoming) = response.into_parts();
    body::strip_hop_by_hop(&mut parts.headers);
    let tee = Tee {
        inner: incoming,
        state: TeeState::Filling(Box::new(fill)),
        held: None,
        shared: shared.clone(),
        download,
        expected,
        flow: flow.clone(),
    };
    Response::from_parts(parts, Counted::boxed(tee, flow, Direction::Down))
}

/// A download on its way to the guest, written to the cache as it passes.
/// Its last frame is held back until the whole file is found to have the
/// registry's digest: a file that does not never reaches the guest whole,
/// and is not kept.
struct Tee {
    inner: Incoming,
    state: TeeState,
    held: Option<Bytes>,
    shared: Arc<Shared>,
    download: Download,
    expected: store::Digest,
    flow: Arc<Flow>,
}

type Kept = Option<std::io::Result<Result<store::Kept, Tampered>>>;

enum TeeState {
    /// Boxed: a hasher's state is large beside the other states.
    Filling(Box<store::Fill>),
    Keeping(tokio::task::JoinHandle<Kept>),
    Done,
}

impl Tee {
    /// What the check at the end decided: the held frame, or an error.
    fn kept(&mut self, kept: Kept) -> Option<Result<Frame<Bytes>, BoxError>> {
        let label = &self.download.label;
        match kept {
            Some(Ok(Ok(store::Kept::Passed(skip)))) => {
                tracing::debug!("passed {label} on without keeping it: {skip}");
                self.flow.update(|r| {
                    r.cache = Some("passed".into());
                    r.reason = Some(format!("not kept: {skip}"));
                });
            }
            Some(Ok(Ok(store::Kept::Stored))) => {
                let recorded = match (&self.download.source, self.shared.packages.as_ref()) {
                    (Source::Known(_), _) | (_, None) => Ok(()),
                    (_, Some(packages)) => packages.store.set_entry(&self.download.key, &self.expected),
                };
                if let Err(e) = recorded {
                    tracing::warn!("cannot record {label} in the package cache: {e}");
                }
                self.flow.update(|r| r.cache = Some("stored".into()));
            }
            Some(Ok(Err(Tampered { found }))) => {
                let reason = format!("{label} has digest {found}, not the registry's {}", self.expected);
                tracing::warn!("refused a download: {reason}");
                self.flow.update(|r| r.cache = Some("refused".into()));
                self.flow.fail(reason.clone());
                self.held = None;
                return Some(Err(format!("stockade: package download refused: {reason}").into()));
            }
            // The digest matched; only keeping the file failed.
            Some(Err(e)) => tracing::warn!("cannot keep {label} in the package cache: {e}"),
            None => {}
        }
        self.held.take().map(|data| Ok(Frame::data(data)))
    }
}

impl Body for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                TeeState::Filling(fill) => match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        // Trailers are not passed on: a download has none.
                        let Ok(data) = frame.into_data() else { continue };
                        fill.write(&data);
                        if let Some(previous) = this.held.replace(data) {
                            return Poll::Ready(Some(Ok(Frame::data(previous))));
                        }
                    }
                    Some(Err(e)) => {
                        this.state = TeeState::Done;
                        this.held = None;
                        this.flow.fail(format!("the download of {} broke off: {e}", this.download.label));
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    None => {
                        let TeeState::Filling(fill) = std::mem::replace(&mut this.state, TeeState::Done) else {
                            continue;
                        };
                        let shared = this.shared.clone();
                        let keep = move || shared.packages.as_ref().map(|p| p.store.keep(*fill));
                        this.state = TeeState::Keeping(tokio::task::spawn_blocking(keep));
                    }
                },
                TeeState::Keeping(handle) => {
                    let kept = std::task::ready!(Pin::new(handle).poll(cx)).ok().flatten();
                    this.state = TeeState::Done;
                    return Poll::Ready(this.kept(kept));
                }
                TeeState::Done => return Poll::Ready(this.held.take().map(|data| Ok(Frame::data(data)))),
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        if let Some(held) = &self.held {
            let held = held.len() as u64;
            hint.set_lower(hint.lower() + held);
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + held);
            }
        }
        hint
    }
}

fn failed(flow: &std::sync::Arc<Flow>, reason: String) -> Response<ProxyBody> {
    flow.fail(reason.clone());
    body::text(StatusCode::BAD_GATEWAY, format!("stockade: package download refused: {reason}"))
}

fn from_file(shared: &Shared, record: Record, file: File, size: u64) -> Response<ProxyBody> {
    file_response(Flow::new(shared.audit.clone(), record), file, size)
}

fn file_response(flow: std::sync::Arc<Flow>, file: File, size: u64) -> Response<ProxyBody> {
    let body = FileBody { file: tokio::fs::File::from_std(file), left: size };
    let mut response = Response::new(Counted::boxed(body, flow, Direction::Down));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    response
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Option<T> + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok().flatten()
}

/// A cached file as a response body.
struct FileBody {
    file: tokio::fs::File,
    left: u64,
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.left.min(64 * 1024)).unwrap_or(64 * 1024);
        let mut buf = vec![0u8; want];
        let mut read = ReadBuf::new(&mut buf);
        match Pin::new(&mut this.file).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                if n == 0 {
                    return Poll::Ready(Some(Err("the cached file ended early".into())));
                }
                this.left -= n as u64;
                buf.truncate(n);
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// The cache a proxy serves from.
pub struct Packages {
    pub store: Store,
}

impl Packages {
    pub fn open(config: &CacheConfig) -> std::io::Result<Packages> {
        Ok(Packages { store: Store::open(&config.dir, config.limit)? })
    }
}
