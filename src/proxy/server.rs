//! The guest-facing side: accept loops, and per connection an HTTP/1.1
//! proxy that answers CONNECT (tunnel or interception) and absolute-URI
//! http:// requests (forwarded with the Host checked), deny by default.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header;
use http::uri::Scheme;
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::Mutex;

use super::Shared;
use super::body::{self, Counted, Direction, Flow, ProxyBody};
use super::intercept::{self, Interception};
use super::resolve::{self, Unreachable};
use super::tunnel;
use super::upstream::{self, TlsUpstream};
use crate::policy::{Host, Port, RequestPath, Verdict};
use crate::protocol::audit::{Decision, Kind, Record};

/// A guest that sends no request head within this is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// A listener the proxy accepts guest connections from.
pub trait Listener: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Listener for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Stream> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Stream> {
        let (stream, _) = TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

/// Accepts connections until the runtime stops; each is served by `serve`
/// under the connection limit.
pub async fn accept_loop<L, F, Fut>(shared: Arc<Shared>, listener: L, serve: F)
where
    L: Listener,
    F: Fn(Arc<Shared>, L::Stream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        // Waiting for a permit before accepting pushes back on a guest that
        // opens connections without end.
        let Ok(permit) = shared.connections.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok(stream) => {
                let fut = serve(shared.clone(), stream);
                tokio::spawn(async move {
                    fut.await;
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!("proxy accept failed: {e}");
                // Out of descriptors and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The HTTP/1.1 connection to a plain http:// server last used on this
/// guest connection, kept for the guest's next request.
pub(super) type PlainConnection = Option<(String, SocketAddr, http1::SendRequest<ProxyBody>)>;

/// Serves one guest connection.
pub async fn serve_connection<S>(shared: Arc<Shared>, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let plain: Arc<Mutex<PlainConnection>> = Arc::new(Mutex::new(None));
    let service = service_fn(move |req| {
        let (shared, plain) = (shared.clone(), plain.clone());
        async move { Ok::<_, Infallible>(handle(shared, plain, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!("guest connection ended: {e}");
    }
}

async fn handle(
    shared: Arc<Shared>,
    plain: Arc<Mutex<PlainConnection>>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return connect(shared, req).await;
    }
    if req.uri().scheme().is_some() {
        return forward(&shared, &plain, req).await;
    }
    body::text(
        StatusCode::BAD_REQUEST,
        "stockade: this is the network proxy; send absolute-URI requests (http://host/path) or CONNECT host:port"
            .into(),
    )
}

/// A destination the guest asked for.
pub(super) struct Target {
    pub host: Host,
    pub port: Port,
}

fn parse_target(authority: &http::uri::Authority, default_port: Option<Port>) -> Result<Target, String> {
    let host = Host::parse(authority.host()).map_err(|e| format!("stockade: bad host {}: {e}", authority.host()))?;
    let port = match authority.port_u16() {
        Some(p) => Port::new(p).ok_or_else(|| format!("stockade: bad port in {authority}"))?,
        None => default_port.ok_or_else(|| format!("stockade: CONNECT {authority} needs a port"))?,
    };
    Ok(Target { host, port })
}

/// The policy and the resolver's answer for a target: addresses to connect
/// to, or the response the guest gets (already audited).
pub(super) async fn admit(
    shared: &Shared,
    target: &Target,
    mut record: Record,
) -> Result<(Vec<SocketAddr>, String), Response<ProxyBody>> {
    let private_ok;
    let rule = match shared.policy.verdict(&target.host, target.port) {
        Verdict::Allow { rule, private_ok: ok } => {
            private_ok = ok;
            rule
        }
        Verdict::Deny(denial) => {
            record.decision = Decision::Deny;
            record.reason = Some(denial.reason());
            shared.audit.record(&record);
            return Err(body::text(StatusCode::FORBIDDEN, denial.message(&target.host, target.port)));
        }
    };
    record.rule = Some(rule.clone());
    match resolve::destination(&shared.policy, &shared.resolver, &target.host, target.port, private_ok).await {
        Ok(addrs) => Ok((addrs, rule)),
        Err(Unreachable::Denied(denial)) => {
            record.decision = Decision::Deny;
            record.reason = Some(denial.reason());
            shared.audit.record(&record);
            Err(body::text(StatusCode::FORBIDDEN, denial.message(&target.host, target.port)))
        }
        Err(Unreachable::NotFound(reason)) => {
            record.decision = Decision::Fail;
            record.reason = Some(reason.clone());
            shared.audit.record(&record);
            Err(body::text(StatusCode::BAD_GATEWAY, format!("stockade: {reason}")))
        }
    }
}

async fn connect(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let Some(authority) = req.uri().authority().cloned() else {
        return body::text(StatusCode::BAD_REQUEST, "stockade: CONNECT needs host:port".into());
    };
    let target = match parse_target(&authority, None) {
        Ok(t) => t,
        Err(message) => return body::text(StatusCode::BAD_REQUEST, message),
    };
    let mut record = Record::new(Kind::Connect, target.host.to_string(), target.port.get(), Decision::Allow);
    let (addrs, rule) = match admit(&shared, &target, record.clone()).await {
        Ok(ok) => ok,
        Err(response) => return response,
    };
    record.rule = Some(rule.clone());
    // Connect before answering, so the guest learns of a dead server from
    // the status code rather than from a tunnel that closes.
    let server = match upstream::connect_any(&addrs).await {
        Ok(s) => s,
        Err(reason) => {
            record.decision = Decision::Fail;
            record.reason = Some(reason.clone());
            shared.audit.record(&record);
            let message = format!("stockade: cannot connect to {}:{} ({reason})", target.host, target.port);
            return body::text(StatusCode::BAD_GATEWAY, message);
        }
    };
    record.addr = server.peer_addr().ok().map(|a| a.to_string());
    let interception = interception_for(&shared, &target.host, target.port);
    tokio::spawn(async move {
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!("CONNECT {}:{} was not upgraded: {e}", target.host, target.port);
                return;
            }
        };
        match interception {
            Some((credential, signin, tls)) => {
                let upstream = TlsUpstream::new(target.host.clone(), target.port, addrs, tls, server);
                let (host, port) = (target.host, target.port);
                let this = Interception { shared, host, port, credential, signin, rule, upstream };
                intercept::serve(this, TokioIo::new(upgraded)).await;
            }
            None => tunnel::relay(&shared, TokioIo::new(upgraded), server, &target.host, record).await,
        }
    });
    Response::new(body::empty())
}

/// Whether a destination is intercepted, and for which rules: a host with
/// a credential, sign-in or path deny rule is, and a registry's download
/// host when the package cache is on (the CA and upstream trust exist
/// whenever such a rule does).
pub(super) fn interception_for(
    shared: &Shared,
    host: &Host,
    port: Port,
) -> Option<(Option<usize>, Vec<usize>, Arc<rustls::ClientConfig>)> {
    let credential = shared.credentials.rule_for(host, port);
    let signin = shared.signins.rules_for(host, port);
    // A path rule can only be kept where the proxy reads the requests.
    let paths = shared.policy.has_path_rules(host, port);
    let cached = shared.packages.is_some() && shared.policy.registry_at(host, port).is_some();
    if credential.is_none() && signin.is_empty() && !paths && !cached {
        return None;
    }
    shared.ca.as_ref()?;
    Some((credential, signin, shared.upstream_tls.clone()?))
}

pub(super) async fn forward(
    shared: &Shared,
    plain: &Mutex<PlainConnection>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    if req.uri().scheme() != Some(&Scheme::HTTP) {
        return body::text(
            StatusCode::BAD_REQUEST,
            format!("stockade: only http:// URLs are forwarded as is; use CONNECT for {}", req.uri()),
        );
    }
    let Some(authority) = req.uri().authority().cloned() else {
        return body::text(StatusCode::BAD_REQUEST, "stockade: the request URL has no host".into());
    };
    let target = match parse_target(&authority, Some(Port::HTTP)) {
        Ok(t) => t,
        Err(message) => return body::text(StatusCode::BAD_REQUEST, message),
    };
    // The server routes by Host: a Host naming another site would reach it
    // through a connection the policy allowed for this one.
    if let Some(host_header) = req.headers().get(header::HOST) {
        let same = host_header
            .to_str()
            .ok()
            .and_then(|h| h.parse::<http::uri::Authority>().ok())
            .and_then(|a| parse_target(&a, Some(Port::HTTP)).ok())
            .is_some_and(|t| t.host == target.host && t.port == target.port);
        if !same {
            let message = format!(
                "stockade: the Host header {:?} does not match the request URL {authority}",
                host_header.to_str().unwrap_or("?")
            );
            return body::text(StatusCode::BAD_REQUEST, message);
        }
    }
    let mut record = Record::new(Kind::Http, target.host.to_string(), target.port.get(), Decision::Allow);
    record.method = Some(req.method().to_string());
    record.path = Some(req.uri().path().to_string());
    let (addrs, rule) = match admit(shared, &target, record.clone()).await {
        Ok(ok) => ok,
        Err(response) => return response,
    };
    record.rule = Some(rule);
    let path = RequestPath::parse(req.uri().path());
    if let Some(rule) = shared.policy.denied_path(&target.host, target.port, &path) {
        let message = rule.message(req.method().as_str(), &target.host, target.port, req.uri().path());
        record.decision = Decision::Deny;
        record.rule = Some(rule.to_string());
        record.reason = Some(format!("denied by {rule}"));
        shared.audit.record(&record);
        return body::text(StatusCode::FORBIDDEN, message);
    }
    let key = format!("{}:{}", target.host, target.port);
    let flow = Flow::new(shared.audit.clone(), record);

    let mut slot = plain.lock().await;
    let reusable = match slot.take() {
        Some((k, addr, mut sender)) if k == key && addrs.contains(&addr) && !sender.is_closed() => {
            sender.ready().await.ok().map(|_| (addr, sender))
        }
        _ => None,
    };
    let (addr, mut sender) = match reusable {
        Some(s) => s,
        None => match open_plain(&addrs).await {
            Ok(s) => s,
            Err(reason) => {
                flow.fail(reason.clone());
                return body::text(StatusCode::BAD_GATEWAY, format!("stockade: cannot connect to {key} ({reason})"));
            }
        },
    };
    flow.update(|r| r.addr = Some(addr.to_string()));

    let (mut parts, incoming) = req.into_parts();
    body::strip_hop_by_hop(&mut parts.headers);
    let mut upstream_req = Request::from_parts(parts, Counted::boxed(incoming, flow.clone(), Direction::Up));
    let authority = upstream::authority(&target.host, target.port, Port::HTTP);
    if let Err(reason) = upstream::shape(&mut upstream_req, Scheme::HTTP, &authority, Version::HTTP_11) {
        flow.fail(reason.clone());
        return body::text(StatusCode::BAD_REQUEST, format!("stockade: {reason}"));
    }
    match sender.send_request(upstream_req).await {
        Ok(response) => {
            *slot = Some((key, addr, sender));
            flow.update(|r| r.status = Some(response.status().as_u16()));
            let (mut parts, incoming) = response.into_parts();
            body::strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Counted::boxed(incoming, flow, Direction::Down))
        }
        Err(e) => {
            flow.fail(e.to_string());
            body::text(StatusCode::BAD_GATEWAY, format!("stockade: {key} failed: {e}"))
        }
    }
}

async fn open_plain(addrs: &[SocketAddr]) -> Result<(SocketAddr, http1::SendRequest<ProxyBody>), String> {
    let tcp = upstream::connect_any(addrs).await?;
    let addr = tcp.peer_addr().map_err(|e| e.to_string())?;
    let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream http connection ended: {e}");
        }
    });
    Ok((addr, sender))
}
