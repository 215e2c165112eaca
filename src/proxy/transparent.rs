//! Transparent connections: TCP the guest made without the proxy, handed
//! over by the VMM's virtio-net device with the address the guest dialed.
//! An address alone names nothing, so the flow is judged by what the guest
//! says first, as a proxied one would be: a TLS ClientHello by its server
//! name, plain HTTP by each request's Host. That name must be one the
//! proxy's own DNS answers gave for the address (`names`), or the address
//! itself when the guest asked no name; then the policy decides, with the
//! same audit records, tunnels and interception as the proxy path.
//! Protocols that name no site (SSH, databases, servers that greet first)
//! are named by the DNS alone: the address must be one the proxy gave for a
//! name the policy allows on that port.

use std::collections::HashSet;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::Shared;
use super::body::{self, ProxyBody};
use super::intercept::{self, Interception};
use super::server::{self, PlainConnection, Target};
use super::sni::{self, Inspection};
use super::tunnel;
use super::upstream::{self, TlsUpstream};
use crate::policy::{Host, Policy, Port, Verdict};
use crate::protocol::audit::{Decision, Kind, Record};
use crate::protocol::transparent as header_wire;

/// A guest that does not say which site it wants within this is dropped
/// (server-first protocols never do).
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(30);
/// The most the proxy reads before judging (a ClientHello is far smaller).
const MAX_FIRST_BYTES: usize = 16 * 1024;
/// Ports whose clients always speak first and name the site (HTTP, HTTPS).
const NAMING_PORTS: [u16; 2] = [80, 443];
/// Elsewhere a guest silent this long is taken to wait for the server's
/// greeting (SMTP, MySQL), and its flow is named by the DNS alone.
const GREETING_WAIT: Duration = Duration::from_secs(2);
/// How an HTTP/1 request (or HTTP/2 with prior knowledge) begins.
const HTTP_STARTS: [&[u8]; 10] =
    [b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ", b"PRI * HTTP/2"];

/// Serves one transparent connection.
pub async fn serve<S>(shared: Arc<Shared>, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let dst = match read_header(&mut stream).await {
        Ok(dst) => dst,
        Err(e) => return tracing::warn!("transparent connection without a usable header: {e}"),
    };
    let mut first = Vec::with_capacity(4096);
    let naming_port = NAMING_PORTS.contains(&dst.port());
    let wait = if naming_port { FIRST_BYTES_TIMEOUT } else { GREETING_WAIT };
    let inspection = tokio::time::timeout(wait, async {
        loop {
            match stream.read_buf(&mut first).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => match sni::inspect(&first) {
                    Inspection::NeedMore if first.len() < MAX_FIRST_BYTES => continue,
                    Inspection::NotTls => match http_start(&first) {
                        None => continue,
                        Some(true) => return Some(First::Http),
                        Some(false) => return Some(First::Other),
                    },
                    Inspection::ClientHello { sni } => return Some(First::Tls(sni)),
                    Inspection::Malformed | Inspection::NeedMore => return Some(First::Malformed),
                },
            }
        }
    })
    .await;
    let names = shared.names.of(dst.ip());
    let client = Prefixed { prefix: first, pos: 0, inner: stream };
    match inspection {
        Ok(Some(First::Tls(sni))) => tls(shared, client, dst, &names, sni).await,
        Ok(Some(First::Http)) => http(shared, client, dst, names).await,
        Ok(Some(First::Other)) => raw(shared, client, dst, &names).await,
        Err(_) if !naming_port => raw(shared, client, dst, &names).await,
        Ok(Some(First::Malformed)) => {
            deny(&shared, Kind::Connect, dst, "the connection began with a malformed TLS ClientHello".into());
        }
        Ok(None) => {}
        Err(_) => deny(&shared, Kind::Connect, dst, "the guest sent nothing that names a site".into()),
    }
}

/// What a guest's first bytes were.
enum First {
    Tls(Option<String>),
    Http,
    /// A protocol that names no site.
    Other,
    Malformed,
}

/// Whether `first` begins an HTTP request; `None` while too short to tell.
fn http_start(first: &[u8]) -> Option<bool> {
    if HTTP_STARTS.iter().any(|start| first.starts_with(start)) {
        Some(true)
    } else if HTTP_STARTS.iter().any(|start| start.starts_with(first)) {
        None
    } else {
        Some(false)
    }
}

async fn read_header<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<SocketAddr> {
    let family = stream.read_u8().await?;
    let mut rest = vec![0u8; header_wire::rest_len(family)?];
    stream.read_exact(&mut rest).await?;
    header_wire::decode(family, &rest)
}

/// The host a guest means by `claimed` (a server name or Host header) on a
/// connection to `dst`, or why it cannot be believed.
fn named(claimed: Option<&str>, dst: SocketAddr, names: &HashSet<Host>) -> Result<Host, String> {
    let Some(claimed) = claimed else {
        return if names.is_empty() {
            Ok(Host::Ip(dst.ip()))
        } else {
            Err(format!("the connection to {dst} names no site"))
        };
    };
    let host = Host::parse(claimed).map_err(|e| format!("bad host {claimed:?}: {e}"))?;
    match &host {
        Host::Ip(ip) if *ip == dst.ip() => Ok(host),
        _ if names.contains(&host) => Ok(host),
        _ if names.is_empty() => {
            Err(format!("{dst} was not given by stockade's DNS for any name, so it names no site"))
        }
        _ => Err(format!("{claimed} is not a name stockade's DNS gave {} for", dst.ip())),
    }
}

fn deny(shared: &Shared, kind: Kind, dst: SocketAddr, reason: String) {
    let mut record = Record::new(kind, dst.ip().to_string(), dst.port(), Decision::Deny);
    record.reason = Some(reason);
    shared.audit.record(&record);
}

/// The host a guest means on a connection that names no site: the first
/// (by name) of those the DNS gave for the address that the policy allows
/// on `port`; the address itself when the DNS gave it for none.
fn named_by_dns(policy: &Policy, dst: SocketAddr, names: &HashSet<Host>, port: Port) -> Result<Host, String> {
    if names.is_empty() {
        return Ok(Host::Ip(dst.ip()));
    }
    let mut candidates: Vec<&Host> = names.iter().collect();
    candidates.sort_by_key(|host| host.to_string());
    candidates
        .into_iter()
        .find(|host| matches!(policy.verdict(host, port), Verdict::Allow { .. }))
        .cloned()
        .ok_or_else(|| format!("no name stockade's DNS gave {} for is allowed on port {port}", dst.ip()))
}

/// Admits `target` and connects to it, preferring the address the guest
/// dialed; `None` once a refusal or failure is recorded.
async fn open(shared: &Shared, target: &Target, dst: SocketAddr) -> Option<(TcpStream, Vec<SocketAddr>, Record)> {
    let mut record = Record::new(Kind::Connect, target.host.to_string(), target.port.get(), Decision::Allow);
    let (addrs, rule) = server::admit(shared, target, record.clone()).await.ok()?;
    record.rule = Some(rule);
    match upstream::connect_any(&prefer(&addrs, dst)).await {
        Ok(server) => {
            record.addr = server.peer_addr().ok().map(|a| a.to_string());
            Some((server, addrs, record))
        }
        Err(reason) => {
            record.decision = Decision::Fail;
            record.reason = Some(reason);
            shared.audit.record(&record);
            None
        }
    }
}

/// A protocol that names no site, tunnelled to the host the DNS names. The
/// tunnel still refuses a late ClientHello naming another host.
async fn raw<S>(shared: Arc<Shared>, client: Prefixed<S>, dst: SocketAddr, names: &HashSet<Host>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(port) = Port::new(dst.port()) else { return };
    let host = match named_by_dns(&shared.policy, dst, names, port) {
        Ok(host) => host,
        Err(reason) => return deny(&shared, Kind::Connect, dst, reason),
    };
    // A host with path rules is only reached through requests the proxy reads.
    if shared.policy.has_path_rules(&host, port) {
        return deny(
            &shared,
            Kind::Connect,
            dst,
            format!("{host}:{port} has path deny rules, so only HTTP(S) reaches it"),
        );
    }
    let target = Target { host, port };
    let Some((server, _, record)) = open(&shared, &target, dst).await else { return };
    tunnel::relay(&shared, client, server, &target.host, record).await;
}

async fn tls<S>(shared: Arc<Shared>, client: Prefixed<S>, dst: SocketAddr, names: &HashSet<Host>, sni: Option<String>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let host = match named(sni.as_deref(), dst, names) {
        Ok(host) => host,
        Err(reason) => return deny(&shared, Kind::Connect, dst, reason),
    };
    let Some(port) = Port::new(dst.port()) else { return };
    let target = Target { host, port };
    let Some((server, addrs, record)) = open(&shared, &target, dst).await else { return };
    let rule = record.rule.clone().unwrap_or_default();
    match server::interception_for(&shared, &target.host, port) {
        Some((credential, signin, tls)) => {
            let upstream = TlsUpstream::new(target.host.clone(), port, addrs, tls, server);
            let this = Interception { shared, host: target.host, port, credential, signin, rule, upstream };
            intercept::serve(this, client).await;
        }
        None => tunnel::relay(&shared, client, server, &target.host, record).await,
    }
}

/// The guest's own choice first, when the policy's resolution agrees.
fn prefer(addrs: &[SocketAddr], dst: SocketAddr) -> Vec<SocketAddr> {
    if addrs.contains(&dst) { vec![dst] } else { addrs.to_vec() }
}

async fn http<S>(shared: Arc<Shared>, client: Prefixed<S>, dst: SocketAddr, names: HashSet<Host>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let plain: Arc<Mutex<PlainConnection>> = Arc::new(Mutex::new(None));
    let names = Arc::new(names);
    let service = service_fn(move |req| {
        let (shared, plain, names) = (shared.clone(), plain.clone(), names.clone());
        async move { Ok::<_, Infallible>(request(&shared, &plain, dst, &names, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(FIRST_BYTES_TIMEOUT)
        .serve_connection(TokioIo::new(client), service);
    if let Err(e) = conn.await {
        tracing::debug!("transparent http connection ended: {e}");
    }
}

/// One plain HTTP request: named by its Host, then forwarded exactly as a
/// proxied http:// request.
async fn request(
    shared: &Shared,
    plain: &Mutex<PlainConnection>,
    dst: SocketAddr,
    names: &HashSet<Host>,
    mut req: Request<Incoming>,
) -> Response<ProxyBody> {
    let claimed = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok())
        .map(|a| a.host().to_string());
    let host = match named(claimed.as_deref(), dst, names) {
        Ok(host) => host,
        Err(reason) => {
            deny(shared, Kind::Http, dst, reason.clone());
            return body::text(StatusCode::FORBIDDEN, format!("stockade: {reason}"));
        }
    };
    let Some(port) = Port::new(dst.port()) else {
        return body::text(StatusCode::BAD_REQUEST, "stockade: port 0".into());
    };
    let authority = upstream::authority(&host, port, Port::HTTP);
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    let uri = match format!("http://{authority}{path}").parse() {
        Ok(uri) => uri,
        Err(e) => return body::text(StatusCode::BAD_REQUEST, format!("stockade: bad request target: {e}")),
    };
    *req.uri_mut() = uri;
    if let Ok(value) = authority.parse() {
        req.headers_mut().insert(header::HOST, value);
    }
    server::forward(shared, plain, req).await
}

/// The bytes read to judge a connection, then the connection itself.
struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_must_be_one_the_dns_gave_for_the_address() {
        let dst: SocketAddr = "192.0.2.7:443".parse().unwrap();
        let names: HashSet<Host> = [Host::parse("api.example.com").unwrap()].into();
        assert_eq!(named(Some("API.example.com"), dst, &names).unwrap(), Host::parse("api.example.com").unwrap());
        assert!(named(Some("evil.example.net"), dst, &names).unwrap_err().contains("not a name"));
        assert!(named(None, dst, &names).is_err());
        assert!(named(Some("api.example.com"), dst, &HashSet::new()).unwrap_err().contains("names no site"));
        assert_eq!(named(None, dst, &HashSet::new()).unwrap(), Host::Ip(dst.ip()));
        assert_eq!(named(Some("192.0.2.7"), dst, &HashSet::new()).unwrap(), Host::Ip(dst.ip()));
        assert!(named(Some("192.0.2.8"), dst, &HashSet::new()).is_err());
    }

    #[test]
    fn http_is_told_from_other_protocols_by_its_first_bytes() {
        assert_eq!(http_start(b"GET / HTTP/1.1\r\n"), Some(true));
        assert_eq!(http_start(b"PRI * HTTP/2.0\r\n"), Some(true));
        assert_eq!(http_start(b"GE"), None, "too short to tell");
        assert_eq!(http_start(b"SSH-2.0-OpenSSH_9.2\r\n"), Some(false));
        assert_eq!(http_start(b"\x00\x00\x00\x08\x04\xd2\x16\x2f"), Some(false), "a Postgres SSLRequest");
        assert_eq!(http_start(b"GETTING"), Some(false));
    }

    #[test]
    fn a_site_less_flow_is_named_by_an_allowed_dns_name() {
        let policy =
            crate::policy::parse("[network]\nallow = [\"git.example.com:22\", \"www.example.com\"]\n", "t.toml")
                .unwrap();
        let dst: SocketAddr = "192.0.2.7:22".parse().unwrap();
        let host = |name: &str| Host::parse(name).unwrap();
        let names: HashSet<Host> = [host("www.example.com"), host("git.example.com")].into();
        let ssh = Port::new(22).unwrap();
        assert_eq!(named_by_dns(&policy, dst, &names, ssh).unwrap(), host("git.example.com"));
        let only_web: HashSet<Host> = [host("www.example.com")].into();
        assert!(named_by_dns(&policy, dst, &only_web, ssh).unwrap_err().contains("allowed on port 22"));
        assert_eq!(named_by_dns(&policy, dst, &HashSet::new(), ssh).unwrap(), Host::Ip(dst.ip()));
    }
}
