//! Connections to the real servers: TCP to the checked addresses, and for
//! intercepted hosts TLS verified against the host's trust store, speaking
//! HTTP/2 when the server offers it and HTTP/1.1 otherwise.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::body::ProxyBody;
use crate::policy::{Host, Port};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle HTTP/1.1 connections kept per intercepted guest connection.
const MAX_IDLE: usize = 8;

/// Connects to the first address that answers, in order.
pub async fn connect_any(addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: no answer within {}s", CONNECT_TIMEOUT.as_secs()),
        }
    }
    Err(last)
}

/// The authority to send for a destination: the port only when not the
/// scheme's default.
pub fn authority(host: &Host, port: Port, default: Port) -> String {
    if port == default { host.to_string() } else { format!("{host}:{port}") }
}

/// Puts a request into the form a connection of `version` sends: absolute
/// URI for HTTP/2 (:scheme and :authority), origin form and Host for 1.1.
pub fn shape(req: &mut Request<ProxyBody>, scheme: Scheme, authority: &str, version: Version) -> Result<(), String> {
    let path = req.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    let host = HeaderValue::from_str(authority).map_err(|_| format!("bad authority {authority}"))?;
    req.headers_mut().remove(header::HOST);
    if version == Version::HTTP_2 {
        let authority: Authority = authority.parse().map_err(|_| format!("bad authority {authority}"))?;
        *req.uri_mut() = Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query(path)
            .build()
            .map_err(|e| e.to_string())?;
    } else {
        *req.uri_mut() = Uri::from(path);
        req.headers_mut().insert(header::HOST, host);
    }
    *req.version_mut() = version;
    Ok(())
}

enum Sender {
    H1(http1::SendRequest<ProxyBody>),
    H2(http2::SendRequest<ProxyBody>),
}

#[derive(Default)]
struct Pool {
    h2: Option<http2::SendRequest<ProxyBody>>,
    idle: Vec<http1::SendRequest<ProxyBody>>,
}

/// The TLS connections to one intercepted destination, for one guest
/// connection: one HTTP/2 connection, or a few HTTP/1.1 ones.
pub struct TlsUpstream {
    host: Host,
    port: Port,
    addrs: Vec<SocketAddr>,
    tls: Arc<ClientConfig>,
    /// The connection made while answering CONNECT, used first.
    first: Mutex<Option<TcpStream>>,
    pool: Mutex<Pool>,
}

impl TlsUpstream {
    pub fn new(
        host: Host,
        port: Port,
        addrs: Vec<SocketAddr>,
        tls: Arc<ClientConfig>,
        first: TcpStream,
    ) -> TlsUpstream {
        TlsUpstream { host, port, addrs, tls, first: Mutex::new(Some(first)), pool: Mutex::new(Pool::default()) }
    }

    /// Sends a request; the error says what failed, for the guest.
    pub async fn send(&self, mut req: Request<ProxyBody>) -> Result<Response<Incoming>, String> {
        let authority = authority(&self.host, self.port, Port::HTTPS);
        match self.sender().await? {
            Sender::H2(mut sender) => {
                shape(&mut req, Scheme::HTTPS, &authority, Version::HTTP_2)?;
                sender.send_request(req).await.map_err(|e| format!("{authority}: {e}"))
            }
            Sender::H1(mut sender) => {
                shape(&mut req, Scheme::HTTPS, &authority, Version::HTTP_11)?;
                sender.ready().await.map_err(|e| format!("{authority}: {e}"))?;
                let response = sender.send_request(req).await.map_err(|e| format!("{authority}: {e}"));
                // Ready again once the response body is read; the pool
                // only hands out ready connections.
                let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
                if response.is_ok() && pool.idle.len() < MAX_IDLE {
                    pool.idle.push(sender);
                }
                response
            }
        }
    }

    async fn sender(&self) -> Result<Sender, String> {
        {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(h2) = &pool.h2 {
                if !h2.is_closed() {
                    return Ok(Sender::H2(h2.clone()));
                }
                pool.h2 = None;
            }
            pool.idle.retain(|s| !s.is_closed());
            if let Some(i) = pool.idle.iter().position(|s| s.is_ready()) {
                return Ok(Sender::H1(pool.idle.swap_remove(i)));
            }
        }
        self.connect().await
    }

    async fn connect(&self) -> Result<Sender, String> {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        let tcp = match first {
            Some(tcp) => tcp,
            None => connect_any(&self.addrs).await?,
        };
        let name = match &self.host {
            Host::Name(name) => ServerName::try_from(name.clone()).map_err(|e| e.to_string())?,
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, TlsConnector::from(self.tls.clone()).connect(name, tcp))
            .await
            .map_err(|_| format!("TLS with {} did not finish within {}s", self.host, CONNECT_TIMEOUT.as_secs()))?
            .map_err(|e| format!("TLS with {} failed: {e}", self.host))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(EofWithoutCloseNotify(tls));
        if h2 {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await
                .map_err(|e| format!("HTTP/2 with {} failed: {e}", self.host))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("upstream HTTP/2 connection ended: {e}");
                }
            });
            self.pool.lock().unwrap_or_else(|e| e.into_inner()).h2 = Some(sender.clone());
            Ok(Sender::H2(sender))
        } else {
            let (sender, conn) =
                http1::handshake(io).await.map_err(|e| format!("HTTP/1.1 with {} failed: {e}", self.host))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("upstream HTTP/1.1 connection ended: {e}");
                }
            });
            Ok(Sender::H1(sender))
        }
    }
}

/// A server's TLS stream on which a TCP close without close_notify reads as
/// the end of the stream. Many servers (Python's http.server among them) end
/// a close-delimited HTTP/1.0 body that way, and curl and browsers accept it;
/// bodies with a length are still checked by hyper, so truncation of those
/// is still an error.
struct EofWithoutCloseNotify(TlsStream<TcpStream>);

impl AsyncRead for EofWithoutCloseNotify {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.get_mut().0).poll_read(cx, buf) {
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

impl AsyncWrite for EofWithoutCloseNotify {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
