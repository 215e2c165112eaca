//! The proxy end to end on loopback: real servers (plain HTTP, and HTTPS
//! with certificates from a test CA), the proxy on its own runtime, and
//! clients that speak to it as a guest's tools would. No VM, no network.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::audit;
use super::{Proxy, ProxyConfig, tls};
use crate::policy;
use crate::protocol::audit::{Decision, Kind};

const SECRET: &str = "s3cret-value-0123";

/// A CA for the test servers, standing in for the public roots.
pub(super) struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub(super) der: CertificateDer<'static>,
}

impl TestCa {
    pub(super) fn new() -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        TestCa { der: cert.der().clone(), issuer: Issuer::new(params, key) }
    }

    pub(super) fn server_config(&self, name: &str, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()]).unwrap().signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = (*tls::server_config(vec![cert.der().clone()], key).unwrap()).clone();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// What a test server received: one entry per request, "METHOD URI VERSION"
/// then "name: value" lines.
pub(super) type Seen = Arc<Mutex<Vec<String>>>;

pub(super) fn seen_text(seen: &Seen) -> String {
    seen.lock().unwrap().join("\n---\n")
}

async fn echo(seen: Seen, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let mut text = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
    for (name, value) in req.headers() {
        text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    text.push_str(&format!("body: {}\n", String::from_utf8_lossy(&body)));
    seen.lock().unwrap().push(text.clone());
    Ok(Response::new(Full::new(Bytes::from(text))))
}

pub(super) type Answer = Result<Response<Full<Bytes>>, std::convert::Infallible>;

/// An echo server on loopback; TLS when given a configuration.
async fn echo_server(tls: Option<Arc<rustls::ServerConfig>>) -> (u16, Seen) {
    loopback_server(tls, echo).await
}

/// A server on loopback answering each request with `handle`, which also
/// records what it saw; TLS when given a configuration.
pub(super) async fn loopback_server<F, A>(tls: Option<Arc<rustls::ServerConfig>>, handle: F) -> (u16, Seen)
where
    F: Fn(Seen, Request<Incoming>) -> A + Copy + Send + Sync + 'static,
    A: std::future::Future<Output = Answer> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (seen, tls) = (record.clone(), tls.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(seen.clone(), req));
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(config) => {
                        if let Ok(stream) = TlsAcceptor::from(config).accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                    }
                }
            });
        }
    });
    (port, seen)
}

pub(super) struct Setup {
    pub(super) proxy: Proxy,
    pub(super) addr: SocketAddr,
    pub(super) audit: PathBuf,
    pub(super) dir: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_proxy(name: &str, policy_text: &str, roots: Vec<CertificateDer<'static>>) -> Result<Setup, super::ProxyError> {
    start_proxy_with_home(name, policy_text, roots, &[])
}

/// [`start_proxy`] with `<dir>/home` as the home directory, holding `files`
/// (path under home, content) before the proxy starts.
pub(super) fn start_proxy_with_home(
    name: &str,
    policy_text: &str,
    roots: Vec<CertificateDer<'static>>,
    files: &[(&str, &str)],
) -> Result<Setup, super::ProxyError> {
    start_proxy_configured(name, policy_text, roots, files, |_| {})
}

/// [`start_proxy_with_home`], with `adjust` changing the configuration.
pub(super) fn start_proxy_configured(
    name: &str,
    policy_text: &str,
    roots: Vec<CertificateDer<'static>>,
    files: &[(&str, &str)],
    adjust: impl FnOnce(&mut ProxyConfig),
) -> Result<Setup, super::ProxyError> {
    let dir = std::env::temp_dir().join(format!("stockade-proxy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (path, content) in files {
        let path = dir.join("home").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let policy = policy::parse(policy_text, "test.toml").unwrap();
    let audit = dir.join("network.jsonl");
    let mut config = ProxyConfig::new(policy, &dir, Some(audit.clone()));
    config.upstream_roots = Some(roots);
    config.home = Some(dir.join("home"));
    adjust(&mut config);
    let proxy = Proxy::start(config)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    proxy.serve_tcp(listener).unwrap();
    Ok(Setup { proxy, addr, audit, dir })
}

/// A proxy with a credential rule for api.test:`port` (so it intercepts that
/// host), and the CA the guest must trust for it.
fn intercepting_proxy(name: &str, port: u16, roots: Vec<CertificateDer<'static>>) -> (Setup, CertificateDer<'static>) {
    let setup =
        start_proxy(name, &policy_for(&[("api.test", port)], Some(&format!("api.test:{port}")), ""), roots).unwrap();
    let pem = setup.proxy.guest_trust().expect("a credential rule means interception").ca_pem;
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    (setup, ca)
}

pub(super) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Sends CONNECT; returns the status, the body of a refusal, and the
/// stream (the tunnel, when it was opened).
pub(super) async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut body = String::new();
    if status != 200 {
        let len: usize = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0);
        let mut buf = vec![0u8; len];
        tcp.read_exact(&mut buf).await.unwrap();
        body = String::from_utf8_lossy(&buf).to_string();
    }
    (status, body, tcp)
}

/// TLS over a tunnel to `name`, trusting `ca`, offering `alpn`.
pub(super) async fn tls_over(
    tcp: TcpStream,
    sni: &str,
    ca: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = (*tls::client_config(Arc::new(roots)).unwrap()).clone();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config)).connect(ServerName::try_from(sni.to_string()).unwrap(), tcp).await
}

/// One GET over an established stream, HTTP/2 when ALPN said so.
async fn get<S>(stream: S, h2: bool, uri: &str, headers: &[(&str, &str)]) -> (u16, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut req = Request::get(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::<Bytes>::new()).unwrap();
    let response = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    };
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).to_string())
}

pub(super) fn audit_records(setup: &Setup) -> Vec<crate::protocol::audit::Record> {
    // Records are written as flows end; give the proxy's threads a moment.
    std::thread::sleep(Duration::from_millis(100));
    audit::read(&setup.audit).map(|(r, _)| r).unwrap_or_default()
}

pub(super) fn policy_for(hosts: &[(&str, u16)], credential: Option<&str>, extra: &str) -> String {
    let mut text = String::from("[network]\n");
    let rules: Vec<String> = hosts.iter().map(|(h, p)| format!("\"{h}:{p}\"")).collect();
    text.push_str(&format!("allow_private = [{}]\n{extra}\n[network.hosts]\n", rules.join(", ")));
    for (host, _) in hosts {
        text.push_str(&format!("\"{host}\" = \"127.0.0.1\"\n"));
    }
    if let Some(host) = credential {
        text.push_str(&format!(
            "[[credential]]\nhost = \"{host}\"\nheader = \"x-api-key\"\nvalue = {{ command = \"echo {SECRET}\" }}\n\
             guest_env = \"TEST_API_KEY\"\n"
        ));
    }
    text
}

#[test]
fn allowed_tunnel_carries_tls_to_the_server_and_is_audited() {
    let rt = runtime();
    let ca = TestCa::new();
    let (port, seen) = rt.block_on(echo_server(Some(ca.server_config("other.test", &[b"http/1.1"]))));
    let setup = start_proxy("tunnel", &policy_for(&[("other.test", port)], None, ""), vec![]).unwrap();
    let (status, body) = rt.block_on(async {
        let (status, body, tcp) = connect(setup.addr, &format!("other.test:{port}")).await;
        assert_eq!(status, 200, "{body}");
        let tls = tls_over(tcp, "other.test", &ca.der, &[b"http/1.1"]).await.unwrap();
        get(tls, false, "/hello", &[("host", "other.test")]).await
    });
    assert_eq!(status, 200);
    assert!(body.starts_with("GET /hello"), "{body}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    let records = audit_records(&setup);
    let tunnel = records.iter().find(|r| r.kind == Kind::Connect).expect("a connect record");
    assert_eq!((tunnel.decision, tunnel.host.as_str(), tunnel.port), (Decision::Allow, "other.test", port));
    assert!(tunnel.rule.as_deref().unwrap().contains("test.toml"), "{tunnel:?}");
    assert!(tunnel.bytes_up > 100 && tunnel.bytes_down > 100, "{tunnel:?}");
}

#[test]
fn denied_host_gets_403_saying_how_to_allow_it() {
    let rt = runtime();
    let setup = start_proxy("deny", "[network]\nallow = [\"allowed.test\"]\n", vec![]).unwrap();
    let (status, body, _) = rt.block_on(connect(setup.addr, "example.com:443"));
    assert_eq!(status, 403);
    assert_eq!(
        body.trim(),
        "stockade: blocked example.com:443 (not in the policy). \
         Allow it with --allow example.com or a [network] allow rule."
    );
    let (status, body, _) = rt.block_on(connect(setup.addr, "example.com:8443"));
    assert_eq!(status, 403);
    assert!(body.contains("--allow example.com:8443 "), "{body}");
    let records = audit_records(&setup);
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.decision == Decision::Deny && r.reason.as_deref() == Some("not in the policy")));
}

#[test]
fn deny_rules_win_over_allow_rules() {
    let rt = runtime();
    let setup =
        start_proxy("denywins", "[network]\nallow = [\"*.github.com\"]\ndeny = [\"gist.github.com\"]\n", vec![])
            .unwrap();
    let (status, body, _) = rt.block_on(connect(setup.addr, "gist.github.com:443"));
    assert_eq!(status, 403);
    assert!(body.contains("denied by gist.github.com:* (test.toml)"), "{body}");
}

#[test]
fn plain_http_is_forwarded_with_its_host_checked() {
    let rt = runtime();
    let (port, seen) = rt.block_on(echo_server(None));
    let setup = start_proxy("plain", &policy_for(&[("plain.test", port)], None, ""), vec![]).unwrap();
    let url = format!("http://plain.test:{port}/path?q=1");
    let host = format!("plain.test:{port}");
    let (status, body) = rt.block_on(async {
        let tcp = TcpStream::connect(setup.addr).await.unwrap();
        get(tcp, false, &url, &[("host", &host), ("proxy-authorization", "Basic eDp5"), ("x-keep", "1")]).await
    });
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /path?q=1 HTTP/1.1"), "origin form upstream: {body}");
    assert!(body.contains("x-keep: 1") && !body.contains("proxy-authorization"), "{body}");
    // A Host header naming another site is refused before anything is sent.
    let (status, body) = rt.block_on(async {
        let tcp = TcpStream::connect(setup.addr).await.unwrap();
        get(tcp, false, &url, &[("host", "elsewhere.example")]).await
    });
    assert_eq!(status, 400);
    assert!(body.contains("does not match"), "{body}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    // A denied host over plain HTTP gets the same message as over CONNECT.
    let (status, body) = rt.block_on(async {
        let tcp = TcpStream::connect(setup.addr).await.unwrap();
        get(tcp, false, "http://example.com/", &[("host", "example.com")]).await
    });
    assert_eq!(status, 403);
    assert!(body.starts_with("stockade: blocked example.com:80 (not in the policy)"), "{body}");
    let records = audit_records(&setup);
    let http = records.iter().find(|r| r.kind == Kind::Http && r.decision == Decision::Allow).unwrap();
    assert_eq!((http.method.as_deref(), http.path.as_deref(), http.status), (Some("GET"), Some("/path"), Some(200)));
    assert!(http.bytes_down > 0);
}

/// Three servers: api.test (credential rule), other.test (HTTPS, tunnel) and
/// plain.test (HTTP). The secret must reach api.test only.
#[test]
fn credential_is_written_only_for_its_host_and_guest_auth_is_stripped() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, api_seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let (other, other_seen) = rt.block_on(echo_server(Some(ca.server_config("other.test", &[b"http/1.1"]))));
    let (plain, plain_seen) = rt.block_on(echo_server(None));
    let policy = policy_for(
        &[("api.test", api), ("other.test", other), ("plain.test", plain)],
        Some(&format!("api.test:{api}")),
        "",
    );
    let setup = start_proxy("inject", &policy, vec![ca.der.clone()]).unwrap();
    let trust = setup.proxy.guest_trust().expect("a credential rule means interception");
    let proxy_ca = rustls::pki_types::pem::PemObject::from_pem_slice(trust.ca_pem.as_bytes()).unwrap();
    assert!(trust.bundle_pem.starts_with(&trust.ca_pem));
    assert_eq!(setup.proxy.placeholder_env(), [("TEST_API_KEY".to_string(), policy::PLACEHOLDER.to_string())]);

    let guest_headers =
        [("authorization", "Bearer guest-own-token"), ("x-api-key", policy::PLACEHOLDER), ("x-other", "kept")];
    rt.block_on(async {
        // The intercepted host: the guest trusts the proxy CA, not the test CA.
        let (status, _, tcp) = connect(setup.addr, &format!("api.test:{api}")).await;
        assert_eq!(status, 200);
        let tls = tls_over(tcp, "api.test", &proxy_ca, &[b"http/1.1"]).await.unwrap();
        let host = format!("api.test:{api}");
        let mut headers = guest_headers.to_vec();
        headers.push(("host", &host));
        let (status, body) = get(tls, false, "/v1/messages", &headers).await;
        assert_eq!(status, 200, "{body}");

        // A tunnelled host and a plain one get what the guest sent, no more.
        let (_, _, tcp) = connect(setup.addr, &format!("other.test:{other}")).await;
        let tls = tls_over(tcp, "other.test", &ca.der, &[b"http/1.1"]).await.unwrap();
        let (status, _) = get(tls, false, "/", &guest_headers).await;
        assert_eq!(status, 200);
        let tcp = TcpStream::connect(setup.addr).await.unwrap();
        let url = format!("http://plain.test:{plain}/");
        let (status, _) = get(tcp, false, &url, &guest_headers).await;
        assert_eq!(status, 200);
    });
    let api_text = seen_text(&api_seen);
    assert!(api_text.contains(&format!("x-api-key: {SECRET}")), "{api_text}");
    assert!(!api_text.contains("authorization"), "guest's Authorization reached the server: {api_text}");
    assert!(!api_text.contains(policy::PLACEHOLDER) && api_text.contains("x-other: kept"), "{api_text}");
    for (name, seen) in [("other.test", &other_seen), ("plain.test", &plain_seen)] {
        let text = seen_text(seen);
        assert!(!text.is_empty(), "{name} got no request");
        assert!(!text.contains(SECRET), "the secret reached {name}: {text}");
    }
    let records = audit_records(&setup);
    let https = records.iter().find(|r| r.kind == Kind::Https).expect("an https record");
    assert_eq!(https.path.as_deref(), Some("/v1/messages"));
    assert!(https.credential.as_deref().unwrap().starts_with("x-api-key for api.test"), "{https:?}");
    let log = std::fs::read_to_string(&setup.audit).unwrap();
    assert!(!log.contains(SECRET), "the secret is in the audit log");
}

#[test]
fn intercepted_connections_speak_http2_both_ways() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"h2", b"http/1.1"]))));
    let (setup, proxy_ca) = intercepting_proxy("h2", api, vec![ca.der.clone()]);
    let (status, body) = rt.block_on(async {
        let (_, _, tcp) = connect(setup.addr, &format!("api.test:{api}")).await;
        let tls = tls_over(tcp, "api.test", &proxy_ca, &[b"h2"]).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        get(tls, true, &format!("https://api.test:{api}/h2"), &[("authorization", "Bearer x")]).await
    });
    assert_eq!(status, 200, "{body}");
    let text = seen_text(&seen);
    assert!(text.contains("HTTP/2.0") && text.contains(&format!("x-api-key: {SECRET}")), "{text}");
    assert!(!text.contains("authorization"), "{text}");
}

/// A server that ends a close-delimited HTTP/1.0 body by dropping the
/// connection without TLS close_notify, as Python's http.server does.
async fn abrupt_close_server(config: Arc<rustls::ServerConfig>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = TlsAcceptor::from(config.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok\n").await;
                let _ = tls.flush().await;
                // Dropped without shutdown: the TCP FIN comes with no close_notify.
            });
        }
    });
    port
}

#[test]
fn a_body_ended_by_an_abrupt_close_reaches_the_guest_whole() {
    let rt = runtime();
    let ca = TestCa::new();
    let api = rt.block_on(abrupt_close_server(ca.server_config("api.test", &[b"http/1.1"])));
    let (setup, proxy_ca) = intercepting_proxy("abrupt", api, vec![ca.der.clone()]);
    for h2 in [true, false] {
        let (status, body) = rt.block_on(async {
            let (_, _, tcp) = connect(setup.addr, &format!("api.test:{api}")).await;
            let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
            let tls = tls_over(tcp, "api.test", &proxy_ca, alpn).await.unwrap();
            get(tls, h2, &format!("https://api.test:{api}/x"), &[("host", &format!("api.test:{api}"))]).await
        });
        assert_eq!((status, body.as_str()), (200, "ok\n"), "h2={h2}");
    }
}

#[test]
fn intercepted_connection_refuses_requests_for_another_host() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let (setup, proxy_ca) = intercepting_proxy("misdirect", api, vec![ca.der.clone()]);
    let (status, body) = rt.block_on(async {
        let (_, _, tcp) = connect(setup.addr, &format!("api.test:{api}")).await;
        let tls = tls_over(tcp, "api.test", &proxy_ca, &[b"http/1.1"]).await.unwrap();
        get(tls, false, "/", &[("host", "evil.example")]).await
    });
    assert_eq!(status, 421);
    assert!(body.contains("refused a request for evil.example"), "{body}");
    assert!(seen.lock().unwrap().is_empty(), "the server got {}", seen_text(&seen));
}

#[test]
fn upstream_certificate_is_verified_before_the_credential_is_sent() {
    let rt = runtime();
    let trusted = TestCa::new();
    let impostor = TestCa::new();
    let (api, seen) = rt.block_on(echo_server(Some(impostor.server_config("api.test", &[b"http/1.1"]))));
    let (setup, proxy_ca) = intercepting_proxy("verify", api, vec![trusted.der.clone()]);
    let (status, body) = rt.block_on(async {
        let (_, _, tcp) = connect(setup.addr, &format!("api.test:{api}")).await;
        let tls = tls_over(tcp, "api.test", &proxy_ca, &[b"http/1.1"]).await.unwrap();
        get(tls, false, "/", &[("host", &format!("api.test:{api}"))]).await
    });
    assert_eq!(status, 502);
    assert!(body.contains("the credential was not sent") && body.contains("TLS with api.test failed"), "{body}");
    assert!(seen.lock().unwrap().is_empty());
    let records = audit_records(&setup);
    assert!(records.iter().any(|r| r.kind == Kind::Https && r.decision == Decision::Fail), "{records:?}");
}

#[test]
fn tunnel_with_a_different_tls_server_name_is_refused() {
    let rt = runtime();
    let ca = TestCa::new();
    let (port, seen) = rt.block_on(echo_server(Some(ca.server_config("evil.test", &[b"http/1.1"]))));
    let setup = start_proxy("sni", &policy_for(&[("other.test", port)], None, ""), vec![]).unwrap();
    let result = rt.block_on(async {
        let (status, _, tcp) = connect(setup.addr, &format!("other.test:{port}")).await;
        assert_eq!(status, 200);
        // Fronting: a tunnel opened for other.test carrying TLS for evil.test.
        tls_over(tcp, "evil.test", &ca.der, &[b"http/1.1"]).await
    });
    assert!(result.is_err(), "the handshake for evil.test went through");
    assert!(seen.lock().unwrap().is_empty());
    let records = audit_records(&setup);
    let denied = records.iter().find(|r| r.kind == Kind::Connect).unwrap();
    assert_eq!(denied.decision, Decision::Deny);
    assert!(denied.reason.as_deref().unwrap().contains("\"evil.test\" does not match"), "{denied:?}");
}

#[test]
fn ip_literals_need_an_explicit_rule() {
    let rt = runtime();
    let (port, _seen) = rt.block_on(echo_server(None));
    let setup = start_proxy("iplit", "[network]\nallow = [\"*:*\"]\n", vec![]).unwrap();
    let (status, body, _) = rt.block_on(connect(setup.addr, &format!("127.0.0.1:{port}")));
    assert_eq!(status, 403);
    assert!(body.contains("an IP address needs an explicit rule"), "{body}");
    assert!(body.contains(&format!("--allow 127.0.0.1:{port}")), "{body}");
    drop(setup);
    let setup = start_proxy("iplit2", &format!("[network]\nallow = [\"127.0.0.1:{port}\"]\n"), vec![]).unwrap();
    let (status, body, _) = rt.block_on(connect(setup.addr, &format!("127.0.0.1:{port}")));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn names_resolving_to_loopback_or_private_addresses_are_refused() {
    let rt = runtime();
    let (port, seen) = rt.block_on(echo_server(None));
    // Allowed by name, but pinned to internal addresses, without allow_private.
    let text = format!(
        "[network]\nallow = [\"loop.test:{port}\", \"lan.test:{port}\"]\n\
         [network.hosts]\n\"loop.test\" = \"127.0.0.1\"\n\"lan.test\" = \"10.255.0.1\"\n"
    );
    let setup = start_proxy("private", &text, vec![]).unwrap();
    for (host, addr) in [("loop.test", "127.0.0.1"), ("lan.test", "10.255.0.1")] {
        let (status, body, _) = rt.block_on(connect(setup.addr, &format!("{host}:{port}")));
        assert_eq!(status, 403, "{host}: {body}");
        assert!(body.contains(&format!("resolves to the internal address {addr}")), "{body}");
        assert!(body.contains("allow_private"), "{body}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

fn dns_query(name: &str, kind: RecordType) -> Vec<u8> {
    let mut message = Message::new();
    message.set_id(4242).set_recursion_desired(true).add_query(Query::query(Name::from_str(name).unwrap(), kind));
    message.to_vec().unwrap()
}

#[test]
fn dns_answers_follow_the_policy() {
    let text = "[network]\nallow_private = [\"api.test\"]\nallow = [\"pub.test\"]\ndeny = [\"no.api.test\"]\n\
                [network.hosts]\n\"api.test\" = \"127.0.0.1\"\n\"pub.test\" = \"10.0.0.7\"\n";
    let setup = start_proxy("dns", text, vec![]).unwrap();
    let ask = |name: &str, kind| Message::from_vec(&setup.proxy.answer_dns(&dns_query(name, kind))).unwrap();

    let denied = ask("example.com.", RecordType::A);
    assert_eq!((denied.id(), denied.response_code()), (4242, ResponseCode::NXDomain));
    assert!(denied.answers().is_empty());
    assert_eq!(ask("no.api.test.", RecordType::A).response_code(), ResponseCode::NXDomain);

    let allowed = ask("api.test.", RecordType::A);
    assert_eq!(allowed.response_code(), ResponseCode::NoError);
    let addrs: Vec<_> = allowed.answers().iter().map(|r| r.data().clone()).collect();
    assert_eq!(addrs, [RData::A("127.0.0.1".parse::<std::net::Ipv4Addr>().unwrap().into())]);
    // Internal addresses are dropped for names without allow_private.
    let public = ask("pub.test.", RecordType::A);
    assert_eq!((public.response_code(), public.answers().len()), (ResponseCode::NoError, 0));
    // Allowed names get addresses only: no TXT to carry data.
    let txt = ask("api.test.", RecordType::TXT);
    assert_eq!((txt.response_code(), txt.answers().len()), (ResponseCode::NoError, 0));
    // Garbage gets FORMERR when it has an id, and no panic either way.
    let formerr = Message::from_vec(&setup.proxy.answer_dns(&[0x12, 0x34, 0xff])).unwrap();
    assert_eq!((formerr.id(), formerr.response_code()), (0x1234, ResponseCode::FormErr));
    assert!(setup.proxy.answer_dns(&[1]).is_empty());
    let records = audit_records(&setup);
    assert!(records.iter().any(|r| r.kind == Kind::Dns && r.host == "example.com" && r.decision == Decision::Deny));
}

#[test]
fn dns_over_a_unix_stream_is_framed_like_tcp() {
    use std::io::{Read, Write};
    let setup = start_proxy("dnsunix", "[network]\nallow = [\"ok.test\"]\n", vec![]).unwrap();
    let path = setup.dir.join("dns.sock");
    setup.proxy.serve_dns_unix(std::os::unix::net::UnixListener::bind(&path).unwrap()).unwrap();
    let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..2 {
        let query = dns_query("denied.test.", RecordType::AAAA);
        stream.write_all(&u16::try_from(query.len()).unwrap().to_be_bytes()).unwrap();
        stream.write_all(&query).unwrap();
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).unwrap();
        let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(Message::from_vec(&answer).unwrap().response_code(), ResponseCode::NXDomain);
    }
}

#[test]
fn proxy_connections_over_a_unix_socket_work_like_tcp() {
    use std::io::{Read, Write};
    let setup = start_proxy("unix", "", vec![]).unwrap();
    let path = setup.dir.join("proxy.sock");
    setup.proxy.serve_unix(std::os::unix::net::UnixListener::bind(&path).unwrap()).unwrap();
    let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    let n = stream.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 403"));
}

#[test]
fn a_credential_that_cannot_be_had_stops_the_start_naming_the_rule() {
    let text =
        "[[credential]]\nhost = \"api.test\"\nheader = \"x-api-key\"\nvalue = { env = \"STOCKADE_TEST_NOT_SET_X\" }\n";
    let err = start_proxy("credfail", text, vec![]).err().expect("the start failed").to_string();
    assert_eq!(err, "credential rule x-api-key for api.test:443 (test.toml): STOCKADE_TEST_NOT_SET_X is not set");
}

#[test]
fn without_credential_rules_nothing_is_intercepted_and_no_ca_is_made() {
    let setup = start_proxy("noca", "[network]\nallow = [\"a.test\"]\n", vec![]).unwrap();
    assert!(setup.proxy.guest_trust().is_none());
    assert!(setup.proxy.placeholder_env().is_empty());
    assert!(!setup.dir.join("ca").exists());
}

/// Latency and throughput on loopback; run with benches/proxy.sh.
#[test]
#[ignore = "benchmark: run benches/proxy.sh"]
fn bench() {
    let rt = runtime();
    let requests: usize = std::env::var("BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let megabytes: usize = std::env::var("BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    let ca = TestCa::new();
    let (port, _) = rt.block_on(echo_server(None));
    let (tls_port, _) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let sink_port = rt.block_on(sink_server());
    let api = format!("api.test:{tls_port}");
    let text = policy_for(&[("echo.test", port), ("sink.test", sink_port), ("api.test", tls_port)], Some(&api), "");
    let setup = start_proxy("bench", &text, vec![ca.der.clone()]).unwrap();
    let pem = setup.proxy.guest_trust().unwrap().ca_pem;
    let proxy_ca: CertificateDer<'static> = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    let echo = format!("echo.test:{port}");
    let n = requests / 4;

    // Rounds alternate the cases so that load from elsewhere on the machine
    // falls on all of them alike.
    let mut samples: [Vec<Duration>; 5] = Default::default();
    for _ in 0..4 {
        rt.block_on(async {
            let direct = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            samples[0].extend(time_requests(direct, "/", &echo, n).await);
            let proxied = TcpStream::connect(setup.addr).await.unwrap();
            samples[1].extend(time_requests(proxied, &format!("http://{echo}/"), &echo, n).await);
            let (_, _, tunnel) = connect(setup.addr, &echo).await;
            samples[2].extend(time_requests(tunnel, "/", &echo, n).await);
            let tcp = TcpStream::connect(("127.0.0.1", tls_port)).await.unwrap();
            let direct_tls = tls_over(tcp, "api.test", &ca.der, &[b"http/1.1"]).await.unwrap();
            samples[3].extend(time_requests(direct_tls, "/", &api, n).await);
            let (_, _, tunnel) = connect(setup.addr, &api).await;
            let intercepted = tls_over(tunnel, "api.test", &proxy_ca, &[b"http/1.1"]).await.unwrap();
            samples[4].extend(time_requests(intercepted, "/", &api, n).await);
        });
    }
    let [direct, proxied, tunnel, direct_tls, intercepted] = samples.map(|s| percentiles(&s));
    println!("{requests} requests per case, keep-alive HTTP/1.1, one client, loopback (microseconds)");
    println!("{:<36} {:>7} {:>7} {:>12}", "", "p50", "p99", "added p50");
    let line = |name: &str, (p50, p99): (f64, f64), base: (f64, f64)| {
        println!("{name:<36} {p50:>7.1} {p99:>7.1} {:>12.1}", p50 - base.0);
    };
    line("direct http", direct, direct);
    line("via proxy, absolute-URI http://", proxied, direct);
    line("via proxy, CONNECT tunnel", tunnel, direct);
    line("direct https", direct_tls, direct_tls);
    line("via proxy, intercepted https", intercepted, direct_tls);

    let total = megabytes << 20;
    let (tunnel_mbps, direct_mbps) = rt.block_on(async {
        let mut best = (0f64, 0f64);
        for _ in 0..3 {
            // The best of three: the run least disturbed by other work.
            best.0 = best.0.max(throughput(Some(setup.addr), sink_port, total).await);
            best.1 = best.1.max(throughput(None, sink_port, total).await);
        }
        best
    });
    println!(
        "CONNECT tunnel throughput, {megabytes} MiB, best of 3: {tunnel_mbps:.0} MB/s (direct {direct_mbps:.0} MB/s)"
    );
}

fn percentiles(samples: &[Duration]) -> (f64, f64) {
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let at = |percent: usize| us[(us.len() - 1) * percent / 100];
    (at(50), at(99))
}

/// Times `n` GETs (after a warm-up) on one keep-alive HTTP/1.1 connection.
async fn time_requests<S>(stream: S, uri: &str, host: &str, n: usize) -> Vec<Duration>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut out = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let req = Request::get(uri).header("host", host).body(Empty::<Bytes>::new()).unwrap();
        let start = Instant::now();
        sender.ready().await.unwrap();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
        if i >= 20 {
            out.push(start.elapsed());
        }
    }
    out
}

/// A server that reads everything and answers with the byte count.
async fn sink_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut total = 0u64;
                loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n as u64,
                    }
                }
                let _ = tcp.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    port
}

/// MB/s of `total` bytes sent to the sink, through a tunnel or directly.
async fn throughput(proxy: Option<SocketAddr>, port: u16, total: usize) -> f64 {
    let mut tcp = match proxy {
        Some(proxy) => {
            let (status, _, tcp) = connect(proxy, &format!("sink.test:{port}")).await;
            assert_eq!(status, 200);
            tcp
        }
        None => TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
    };
    let chunk = vec![0x5au8; 256 * 1024];
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        tcp.write_all(&chunk).await.unwrap();
        sent += chunk.len();
    }
    tcp.shutdown().await.unwrap();
    let mut count = [0u8; 8];
    tcp.read_exact(&mut count).await.unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    assert_eq!(u64::from_be_bytes(count), sent as u64);
    sent as f64 / elapsed / 1e6
}

/// A transparent connection to `dst` as the VMM opens it: the header, then
/// the guest's bytes.
async fn transparent(listener: SocketAddr, dst: SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(listener).await.unwrap();
    tcp.write_all(&crate::protocol::transparent::encode(dst)).await.unwrap();
    tcp
}

fn serve_transparent(setup: &Setup) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    setup.proxy.serve_transparent_tcp(listener).unwrap();
    addr
}

#[test]
fn transparent_http_is_named_by_a_host_the_dns_gave_for_its_address() {
    let rt = runtime();
    let (plain, seen) = rt.block_on(echo_server(None));
    let setup = start_proxy("transparent-http", &policy_for(&[("plain.test", plain)], None, ""), vec![]).unwrap();
    let entry = serve_transparent(&setup);
    let dst: SocketAddr = format!("127.0.0.1:{plain}").parse().unwrap();

    // Before any DNS answer the address names nothing but itself.
    let host = format!("plain.test:{plain}");
    let (status, body) =
        rt.block_on(async { get(transparent(entry, dst).await, false, "/a", &[("host", &host)]).await });
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("names no site"), "{body}");

    setup.proxy.answer_dns(&dns_query("plain.test.", RecordType::A));
    let (status, body) =
        rt.block_on(async { get(transparent(entry, dst).await, false, "/b", &[("host", &host)]).await });
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /b"), "{body}");
    let (status, body) =
        rt.block_on(async { get(transparent(entry, dst).await, false, "/c", &[("host", "evil.test")]).await });
    assert_eq!(status, 403, "a Host the DNS never gave for the address is refused: {body}");
    assert_eq!(seen.lock().unwrap().len(), 1);

    let records = audit_records(&setup);
    let allowed: Vec<_> = records.iter().filter(|r| r.decision == Decision::Allow && r.kind == Kind::Http).collect();
    assert_eq!(allowed.len(), 1, "{records:?}");
    assert_eq!(allowed[0].host, "plain.test");
    assert_eq!(records.iter().filter(|r| r.decision == Decision::Deny).count(), 2, "{records:?}");
}

#[test]
fn transparent_tls_is_named_by_sni_and_credential_hosts_are_intercepted() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, api_seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let (other, other_seen) = rt.block_on(echo_server(Some(ca.server_config("other.test", &[b"http/1.1"]))));
    let policy = policy_for(&[("api.test", api), ("other.test", other)], Some(&format!("api.test:{api}")), "");
    let setup = start_proxy("transparent-tls", &policy, vec![ca.der.clone()]).unwrap();
    let entry = serve_transparent(&setup);
    setup.proxy.answer_dns(&dns_query("api.test.", RecordType::A));
    setup.proxy.answer_dns(&dns_query("other.test.", RecordType::A));
    let proxy_ca =
        rustls::pki_types::pem::PemObject::from_pem_slice(setup.proxy.guest_trust().unwrap().ca_pem.as_bytes())
            .unwrap();
    let api_dst: SocketAddr = format!("127.0.0.1:{api}").parse().unwrap();
    let other_dst: SocketAddr = format!("127.0.0.1:{other}").parse().unwrap();
    rt.block_on(async {
        let tls = tls_over(transparent(entry, api_dst).await, "api.test", &proxy_ca, &[b"http/1.1"]).await.unwrap();
        let host = format!("api.test:{api}");
        let (status, body) = get(tls, false, "/v1", &[("host", &host), ("x-api-key", "guest-forged")]).await;
        assert_eq!(status, 200, "{body}");

        let tls = tls_over(transparent(entry, other_dst).await, "other.test", &ca.der, &[b"http/1.1"]).await.unwrap();
        let (status, _) = get(tls, false, "/tunnel", &[("host", "other.test")]).await;
        assert_eq!(status, 200);

        // A server name the DNS never gave for this address.
        let refused = tls_over(transparent(entry, other_dst).await, "api.test", &proxy_ca, &[b"http/1.1"]).await;
        assert!(refused.is_err());
    });
    let api_text = seen_text(&api_seen);
    assert!(api_text.contains(&format!("x-api-key: {SECRET}")), "{api_text}");
    assert!(!api_text.contains("guest-forged"), "{api_text}");
    assert_eq!(other_seen.lock().unwrap().len(), 1);
    let records = audit_records(&setup);
    assert!(records.iter().any(|r| r.kind == Kind::Https && r.host == "api.test" && r.decision == Decision::Allow));
    assert!(records.iter().any(|r| r.kind == Kind::Connect && r.host == "other.test" && r.decision == Decision::Allow));
    assert!(records.iter().any(|r| r.decision == Decision::Deny), "{records:?}");
}

/// A token endpoint standing in for an agent's sign-in server: it answers
/// a refresh only for the real refresh tokens it issued, so a placeholder
/// reaching it fails, and an authorization code with other tokens.
async fn token_server(tls: Arc<rustls::ServerConfig>) -> (u16, Seen) {
    loopback_server(Some(tls), token_answer).await
}

async fn token_answer(seen: Seen, req: Request<Incoming>) -> Answer {
    let mut text = format!("{} {}\n", req.method(), req.uri());
    for (name, value) in req.headers() {
        text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body = String::from_utf8_lossy(&body).to_string();
    text.push_str(&format!("body: {body}\n"));
    seen.lock().unwrap().push(text);
    let tokens = |n: u32| {
        format!(
            r#"{{"access_token":"real-access-{n}","refresh_token":"real-refresh-{n}","expires_in":3600,"token_type":"Bearer"}}"#
        )
    };
    let (status, answer) = if body.contains("authorization_code") {
        (200, tokens(9))
    } else if let Some(n) = (1..5).find(|n| body.contains(&format!("real-refresh-{n}"))) {
        (200, tokens(n + 1))
    } else {
        (400, r#"{"error":"invalid_grant"}"#.to_string())
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer)))
        .unwrap())
}

/// One HTTP/1.1 request over an established stream, with a body.
pub(super) async fn send<S>(stream: S, method: &str, uri: &str, headers: &[(&str, &str)], body: &str) -> (u16, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let response = sender.send_request(req).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).to_string())
}

const CLAUDE_FILE: &str = ".claude/.credentials.json";
const CLAUDE_TOKENS: &str = r#"{"claudeAiOauth":{"accessToken":"real-access-1","refreshToken":"real-refresh-1","expiresAt":1000,"scopes":["user:inference"],"subscriptionType":"max"}}"#;

/// api.test (the agent's API) and auth.test (its token endpoint) under a
/// sign-in rule; other.test, allowed and intercepted for a credential rule
/// of its own, and no sign-in host.
struct SigninWorld {
    setup: Setup,
    api: u16,
    auth: u16,
    other: u16,
    api_seen: Seen,
    auth_seen: Seen,
    other_seen: Seen,
    proxy_ca: CertificateDer<'static>,
}

fn signin_world(rt: &Runtime, name: &str, files: &[(&str, &str)]) -> SigninWorld {
    let ca = TestCa::new();
    let (api, api_seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let (auth, auth_seen) = rt.block_on(token_server(ca.server_config("auth.test", &[b"http/1.1"])));
    let (other, other_seen) = rt.block_on(echo_server(Some(ca.server_config("other.test", &[b"http/1.1"]))));
    let signin = format!(
        "[[signin]]\nfile = \"~/{CLAUDE_FILE}\"\n\
         tokens = [\"claudeAiOauth.accessToken\", \"claudeAiOauth.refreshToken\"]\n\
         hosts = [\"api.test:{api}\", \"auth.test:{auth}\"]\n\
         token_urls = [\"https://auth.test:{auth}/v1/oauth/token\"]\n"
    );
    let mut text = policy_for(
        &[("api.test", api), ("auth.test", auth), ("other.test", other)],
        Some(&format!("other.test:{other}")),
        "",
    );
    text.push_str(&signin);
    let setup = start_proxy_with_home(name, &text, vec![ca.der.clone()], files).unwrap();
    let pem = setup.proxy.guest_trust().expect("a sign-in rule means interception").ca_pem;
    let proxy_ca = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    SigninWorld { setup, api, auth, other, api_seen, auth_seen, other_seen, proxy_ca }
}

impl SigninWorld {
    /// A request through the proxy to `host` (one of the three), as a guest
    /// trusting the proxy CA sends it.
    async fn request(
        &self,
        host: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let port = match host {
            "api.test" => self.api,
            "auth.test" => self.auth,
            _ => self.other,
        };
        let (status, refusal, tcp) = connect(self.setup.addr, &format!("{host}:{port}")).await;
        assert_eq!(status, 200, "{refusal}");
        let tls = tls_over(tcp, host, &self.proxy_ca, &[b"http/1.1"]).await.unwrap();
        let authority = format!("{host}:{port}");
        let mut all = vec![("host", authority.as_str())];
        all.extend_from_slice(headers);
        send(tls, method, path, &all, body).await
    }

    fn host_file(&self) -> PathBuf {
        self.setup.dir.join("home").join(CLAUDE_FILE)
    }
}

pub(super) fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn refresh_body(token: &str) -> String {
    format!(r#"{{"grant_type":"refresh_token","refresh_token":"{token}","client_id":"agent"}}"#)
}

#[test]
fn signin_tokens_stay_on_the_host_through_a_refresh() {
    let rt = runtime();
    let world = signin_world(&rt, "signin-refresh", &[(CLAUDE_FILE, CLAUDE_TOKENS)]);
    let files = world.setup.proxy.signin_files();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].file, format!("~/{CLAUDE_FILE}"));
    let copy = String::from_utf8(files[0].content.clone()).unwrap();
    assert!(!copy.contains("real-"), "a secret is in the guest copy: {copy}");
    let copy = json(&copy);
    let oauth = &copy["claudeAiOauth"];
    assert_eq!((oauth["expiresAt"].as_u64(), oauth["subscriptionType"].as_str()), (Some(1000), Some("max")));
    let access = oauth["accessToken"].as_str().unwrap().to_string();
    let refresh = oauth["refreshToken"].as_str().unwrap().to_string();
    assert!(access.starts_with("stockade-signin-") && refresh.starts_with("stockade-signin-"), "{copy}");

    let before =
        u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    let (first, answer, second) = rt.block_on(async {
        let bearer = format!("Bearer {access}");
        let first = world.request("api.test", "POST", "/v1/messages", &[("authorization", &bearer)], "{}").await;
        let json_type = ("content-type", "application/json");
        let answer = world.request("auth.test", "POST", "/v1/oauth/token", &[json_type], &refresh_body(&refresh)).await;
        let new = json(&answer.1);
        let bearer = format!("Bearer {}", new["access_token"].as_str().unwrap());
        let second = world.request("api.test", "GET", "/v1/models", &[("authorization", &bearer)], "").await;
        (first, answer, second)
    });
    assert_eq!(first.0, 200, "{}", first.1);
    // The server got the real token; its echo gave the guest the placeholder.
    assert!(first.1.contains(&format!("authorization: Bearer {access}")), "{}", first.1);
    assert!(seen_text(&world.api_seen).contains("authorization: Bearer real-access-1"));
    // A placeholder in an API request's body stays one: the server (or a
    // model) could echo it back.
    let echoed = rt.block_on(world.request("api.test", "POST", "/v1/messages", &[("x-echo", &access)], &access));
    assert!(!echoed.1.contains("real-") && echoed.1.contains(&format!("body: {access}")), "{}", echoed.1);
    assert_eq!(answer.0, 200, "upstream did not get the real refresh token: {}", seen_text(&world.auth_seen));
    assert!(!answer.1.contains("real-"), "a real token reached the guest: {}", answer.1);
    let new = json(&answer.1);
    assert_eq!(new["expires_in"].as_u64(), Some(3600));
    let new_refresh = new["refresh_token"].as_str().unwrap().to_string();
    assert!(new_refresh.starts_with("stockade-signin-") && new_refresh != refresh);
    assert_eq!(second.0, 200);
    assert!(!second.1.contains("real-"), "{}", second.1);
    assert!(seen_text(&world.api_seen).contains("authorization: Bearer real-access-2"));

    // The host's file has the rotated tokens, its other fields, and 0600.
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(world.host_file()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let host = json(&std::fs::read_to_string(world.host_file()).unwrap());
    let oauth = &host["claudeAiOauth"];
    assert_eq!(oauth["accessToken"], "real-access-2");
    assert_eq!(oauth["refreshToken"], "real-refresh-2");
    assert_eq!(
        (oauth["scopes"][0].as_str(), oauth["subscriptionType"].as_str()),
        (Some("user:inference"), Some("max"))
    );
    let expires = oauth["expiresAt"].as_u64().unwrap();
    assert!(expires >= before + 3_600_000 && expires < before + 3_700_000, "{expires}");

    // The guest's new refresh token is the host's own now: refreshing again
    // rotates the host file again.
    let again = rt.block_on(async {
        let json_type = ("content-type", "application/x-www-form-urlencoded");
        let form = format!("grant_type=refresh_token&refresh_token={new_refresh}");
        world.request("auth.test", "POST", "/v1/oauth/token", &[json_type], &form).await
    });
    assert_eq!(again.0, 200, "{}", seen_text(&world.auth_seen));
    let host = json(&std::fs::read_to_string(world.host_file()).unwrap());
    assert_eq!(host["claudeAiOauth"]["refreshToken"], "real-refresh-3");

    let records = audit_records(&world.setup);
    let refreshes: Vec<_> = records.iter().filter(|r| r.path.as_deref() == Some("/v1/oauth/token")).collect();
    assert_eq!(refreshes.len(), 2, "{records:?}");
    for r in refreshes {
        assert_eq!(r.signin.as_deref(), Some("~/.claude/.credentials.json (test.toml)"), "{r:?}");
        assert!(r.signin_saved.as_deref().unwrap().starts_with("saved refreshed sign-in tokens"), "{r:?}");
    }
    let log = std::fs::read_to_string(&world.setup.audit).unwrap();
    assert!(!log.contains("real-") && !log.contains(&access), "a token is in the audit log: {log}");
}

#[test]
fn signin_placeholders_are_only_replaced_on_their_rules_hosts() {
    let rt = runtime();
    let world = signin_world(&rt, "signin-elsewhere", &[(CLAUDE_FILE, CLAUDE_TOKENS)]);
    let copy = json(&String::from_utf8(world.setup.proxy.signin_files()[0].content.clone()).unwrap());
    let access = copy["claudeAiOauth"]["accessToken"].as_str().unwrap().to_string();
    let (status, body) = rt.block_on(async {
        let bearer = format!("Bearer {access}");
        world
            .request("other.test", "POST", "/exfil", &[("authorization", &bearer), ("x-token", &access)], &access)
            .await
    });
    assert_eq!(status, 200, "{body}");
    let text = seen_text(&world.other_seen);
    assert!(text.contains(&format!("x-token: {access}")) && text.contains(&format!("body: {access}")), "{text}");
    assert!(!text.contains("real-"), "the secret reached another host: {text}");
    assert!(text.contains(&format!("x-api-key: {SECRET}")), "the other host's own credential still works: {text}");

    // Over a transparent connection too, the sign-in host is intercepted.
    let entry = serve_transparent(&world.setup);
    world.setup.proxy.answer_dns(&dns_query("api.test.", RecordType::A));
    let dst: SocketAddr = format!("127.0.0.1:{}", world.api).parse().unwrap();
    let (status, body) = rt.block_on(async {
        let tls = tls_over(transparent(entry, dst).await, "api.test", &world.proxy_ca, &[b"http/1.1"]).await.unwrap();
        let host = format!("api.test:{}", world.api);
        get(tls, false, "/v1/models", &[("host", &host), ("authorization", &format!("Bearer {access}"))]).await
    });
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("real-"), "{body}");
    assert!(seen_text(&world.api_seen).contains("authorization: Bearer real-access-1"));
    assert!(world.api_seen.lock().unwrap().len() == 1);
}

#[test]
fn a_code_exchange_from_the_guest_never_replaces_the_host_sign_in() {
    let rt = runtime();
    let world = signin_world(&rt, "signin-swap", &[(CLAUDE_FILE, CLAUDE_TOKENS)]);
    let copy = json(&String::from_utf8(world.setup.proxy.signin_files()[0].content.clone()).unwrap());
    let refresh = copy["claudeAiOauth"]["refreshToken"].as_str().unwrap().to_string();
    let form = ("content-type", "application/x-www-form-urlencoded");
    let answers = rt.block_on(async {
        // A sign-in to another account, once plainly and once carrying the
        // host's refresh placeholder to pass for a refresh.
        let plain = world
            .request("auth.test", "POST", "/v1/oauth/token", &[form], "grant_type=authorization_code&code=c")
            .await;
        let body = format!("grant_type=authorization_code&code=c&refresh_token={refresh}");
        let disguised = world.request("auth.test", "POST", "/v1/oauth/token", &[form], &body).await;
        [plain, disguised]
    });
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert!(!body.contains("real-"), "{body}");
    }
    assert_eq!(std::fs::read_to_string(world.host_file()).unwrap(), CLAUDE_TOKENS, "the host file changed");
    let records = audit_records(&world.setup);
    assert!(records.iter().all(|r| r.signin_saved.is_none()), "{records:?}");
}

#[test]
fn a_sign_in_in_the_guest_creates_the_host_file() {
    let rt = runtime();
    let world = signin_world(&rt, "signin-new", &[]);
    assert!(world.setup.proxy.signin_files().is_empty());
    let (status, body) = rt.block_on(async {
        let code = r#"{"grant_type":"authorization_code","code":"c","code_verifier":"v"}"#;
        world.request("auth.test", "POST", "/v1/oauth/token", &[("content-type", "application/json")], code).await
    });
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("real-"), "{body}");
    use std::os::unix::fs::PermissionsExt;
    let path = world.host_file();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    let host = json(&std::fs::read_to_string(&path).unwrap());
    let oauth = host["claudeAiOauth"].as_object().unwrap();
    assert_eq!(
        (oauth["accessToken"].as_str(), oauth["refreshToken"].as_str()),
        (Some("real-access-9"), Some("real-refresh-9"))
    );
    assert!(oauth["expiresAt"].as_u64().is_some(), "{host}");
    assert_eq!(oauth.len(), 3, "{host}");
    assert_eq!(host.as_object().unwrap().len(), 1, "{host}");

    // The guest's refresh token is the host's own from now on.
    let refresh = json(&body)["refresh_token"].as_str().unwrap().to_string();
    let (status, _) = rt.block_on(async {
        let json_type = ("content-type", "application/json");
        world.request("auth.test", "POST", "/v1/oauth/token", &[json_type], &refresh_body(&refresh)).await
    });
    assert_eq!(status, 400, "real-refresh-9 is not one the test server refreshes");
    let text = seen_text(&world.auth_seen);
    assert!(text.contains("\"refresh_token\":\"real-refresh-9\""), "{text}");
}

#[test]
fn a_refresh_over_http2_gets_placeholders_too() {
    let rt = runtime();
    let world = signin_world(&rt, "signin-h2", &[(CLAUDE_FILE, CLAUDE_TOKENS)]);
    let copy = json(&String::from_utf8(world.setup.proxy.signin_files()[0].content.clone()).unwrap());
    let refresh = copy["claudeAiOauth"]["refreshToken"].as_str().unwrap().to_string();
    let (status, body) = rt.block_on(async {
        let (_, _, tcp) = connect(world.setup.addr, &format!("auth.test:{}", world.auth)).await;
        let tls = tls_over(tcp, "auth.test", &world.proxy_ca, &[b"h2"]).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::post(format!("https://auth.test:{}/v1/oauth/token", world.auth))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(refresh_body(&refresh))))
            .unwrap();
        let response = sender.send_request(req).await.unwrap();
        let status = response.status().as_u16();
        (status, String::from_utf8_lossy(&response.into_body().collect().await.unwrap().to_bytes()).to_string())
    });
    assert_eq!(status, 200, "{body} / {}", seen_text(&world.auth_seen));
    assert!(!body.contains("real-") && json(&body)["access_token"].as_str().unwrap().starts_with("stockade-signin-"));
    let host = json(&std::fs::read_to_string(world.host_file()).unwrap());
    assert_eq!(host["claudeAiOauth"]["refreshToken"], "real-refresh-2");
}

/// Sends one request per (method, target) to `host:port` through the proxy,
/// each on a connection of its own, as a guest trusting `proxy_ca` does.
async fn intercepted_requests(
    proxy: SocketAddr,
    host: &str,
    port: u16,
    proxy_ca: &CertificateDer<'static>,
    requests: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> Vec<(u16, String)> {
    let authority = format!("{host}:{port}");
    let mut answers = Vec::new();
    for (method, target) in requests {
        let (status, refusal, tcp) = connect(proxy, &authority).await;
        assert_eq!(status, 200, "{refusal}");
        let tls = tls_over(tcp, host, proxy_ca, &[b"http/1.1"]).await.unwrap();
        let mut all = vec![("host", authority.as_str())];
        all.extend_from_slice(headers);
        answers.push(send(tls, method, target, &all, "").await);
    }
    answers
}

/// A `[[credential]]` rule writing `Bearer SECRET` for `host:port`, with
/// `scope` (`methods`, `paths`) added.
fn bearer_rule(host: &str, port: u16, scope: &str) -> String {
    format!(
        "[[credential]]\nhost = \"{host}:{port}\"\nheader = \"authorization\"\nformat = \"Bearer {{}}\"\n\
         value = {{ command = \"echo {SECRET}\" }}\nguest_env = \"TEST_TOKEN\"\n{scope}\n"
    )
}

/// A rule limited to GET under /repos/: other methods and paths, however
/// spelt, are sent on without the secret and without the guest's own
/// Authorization (so the placeholder never reaches the server).
#[test]
fn a_scoped_credential_is_written_only_for_requests_in_its_scope() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let mut policy = policy_for(&[("api.test", api)], None, "");
    policy.push_str(&bearer_rule("api.test", api, "methods = [\"get\"]\npaths = [\"/repos/\"]"));
    let setup = start_proxy("scope", &policy, vec![ca.der.clone()]).unwrap();
    let proxy_ca = rustls::pki_types::pem::PemObject::from_pem_slice(
        setup.proxy.guest_trust().expect("a credential rule means interception").ca_pem.as_bytes(),
    )
    .unwrap();
    let absolute = format!("https://api.test:{api}/repos/../user/keys");
    let outside: Vec<(&str, &str)> = vec![
        ("POST", "/repos/o/r/issues"),
        ("post", "/repos/o/r/issues"),
        ("DELETE", "/repos/o/r"),
        ("GET", "/user"),
        ("GET", "/repository"),
        ("GET", "/repos/../user/keys"),
        ("GET", "/repos/%2e%2e/user/keys"),
        ("GET", "/repos/%252E%252E/user/keys"),
        ("GET", "/repos/..%2fuser/keys"),
        ("GET", "/repos/..;/user/keys"),
        ("GET", "//repos/..//user/keys"),
        ("GET", "/REPOS/../user"),
        ("GET", &absolute),
    ];
    let guest = [("authorization", "Bearer guest-own-token")];
    let mut answers = rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &outside, &guest));
    // A GET asking the server to treat it as a DELETE.
    let overridden = [("authorization", "Bearer guest-own-token"), ("x-http-method-override", "DELETE")];
    let get = [("GET", "/repos/o/r")];
    answers.extend(rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &get, &overridden)));
    let outside: Vec<(&str, &str)> = outside.into_iter().chain(get).collect();
    for ((method, target), (status, body)) in outside.iter().zip(&answers) {
        assert_eq!(*status, 200, "{method} {target}: {body}");
        assert!(!body.contains(SECRET), "{method} {target} got the credential: {body}");
        assert!(!body.contains("authorization"), "{method} {target} kept the guest's Authorization: {body}");
    }
    let inside = [("GET", "/repos/o/r/pulls"), ("get", "/Repos/o/r"), ("GET", "/repos/o/r/contents/a%20b.txt")];
    let answers = rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &inside, &guest));
    for ((method, target), (status, body)) in inside.iter().zip(&answers) {
        assert_eq!(*status, 200, "{method} {target}: {body}");
        // The server got the secret; its echo gives the guest the placeholder.
        let placeholder = format!("authorization: Bearer {}", policy::PLACEHOLDER);
        assert!(body.contains(&placeholder) && !body.contains(SECRET), "{method} {target}: {body}");
    }
    let sent = seen.lock().unwrap().iter().filter(|s| s.contains(&format!("authorization: Bearer {SECRET}"))).count();
    assert_eq!(sent, inside.len(), "{}", seen_text(&seen));
    assert_eq!(seen.lock().unwrap().len(), outside.len() + inside.len());
    let records = audit_records(&setup);
    let without: Vec<_> = records.iter().filter(|r| r.kind == Kind::Https && r.credential.is_none()).collect();
    assert_eq!(without.len(), outside.len(), "{records:?}");
    assert!(without.iter().all(|r| r.reason.as_deref().unwrap_or("").contains("outside the scope")), "{without:?}");
}

/// Path deny rules on a host without a credential rule: the host is
/// intercepted all the same, and every spelling of a denied path is refused
/// with a 403 naming the host, path and rule, before anything reaches the
/// server; other paths pass.
#[test]
fn path_deny_rules_refuse_every_spelling_of_the_path() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let deny = format!("deny = [\"api.test:{api}/user/keys\", \"api.test:{api}/repos/*/*/keys\"]");
    let setup = start_proxy("denypath", &policy_for(&[("api.test", api)], None, &deny), vec![ca.der.clone()]).unwrap();
    let trust = setup.proxy.guest_trust().expect("a path deny rule means interception");
    let proxy_ca = rustls::pki_types::pem::PemObject::from_pem_slice(trust.ca_pem.as_bytes()).unwrap();
    let absolute = format!("https://api.test:{api}/user/keys");
    let denied: Vec<(&str, &str)> = vec![
        ("POST", "/user/keys"),
        ("post", "/user/keys"),
        ("GET", "/user/keys/1"),
        ("POST", "/USER/Keys"),
        ("POST", "/user//keys"),
        ("POST", "//user/keys"),
        ("POST", "/user/./keys"),
        ("POST", "/x/../user/keys"),
        ("POST", "/../user/keys"),
        ("POST", "/user/%6beys"),
        ("POST", "/user%2Fkeys"),
        ("POST", "/user/%252e/keys"),
        ("POST", "/x/%2e%2e/user/keys"),
        ("POST", "/x/..;/user/keys"),
        ("POST", "/user;a=b/keys"),
        ("POST", "/user/keys?x=1"),
        ("POST", &absolute),
        ("POST", "/repos/o/r/keys"),
        ("POST", "/repos/o/r%2fkeys/../r/keys"),
        ("DELETE", "/repos/O/R/keys/5"),
    ];
    let answers = rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &denied, &[]));
    for ((method, target), (status, body)) in denied.iter().zip(&answers) {
        assert_eq!(*status, 403, "{method} {target} was not refused: {body}");
        assert!(body.contains(&format!("api.test:{api}")) && body.contains("(test.toml)"), "{body}");
    }
    assert!(
        answers[0].1.contains(&format!("blocked POST api.test:{api}/user/keys (denied by api.test:{api}/user/keys"))
    );
    assert!(seen.lock().unwrap().is_empty(), "the server got {}", seen_text(&seen));

    let allowed = [("POST", "/user/emails"), ("GET", "/repos/o/r"), ("GET", "/users/keys")];
    let answers = rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &allowed, &[]));
    assert!(answers.iter().all(|(status, _)| *status == 200), "{answers:?}");
    assert_eq!(seen.lock().unwrap().len(), allowed.len());

    let records = audit_records(&setup);
    let refused: Vec<_> = records.iter().filter(|r| r.kind == Kind::Https && r.decision == Decision::Deny).collect();
    assert_eq!(refused.len(), denied.len(), "{records:?}");
    let rule = refused[0].rule.as_deref().unwrap_or("");
    assert_eq!(rule, format!("api.test:{api}/user/keys (test.toml)"), "{:?}", refused[0]);
    assert_eq!(refused[0].path.as_deref(), Some("/user/keys"));
}

/// A path deny rule holds for plain http:// too, and beside a credential
/// rule: the denied request is refused before the credential is written.
#[test]
fn path_deny_rules_hold_over_plain_http_and_on_credential_hosts() {
    let rt = runtime();
    let ca = TestCa::new();
    let (plain, plain_seen) = rt.block_on(echo_server(None));
    let (api, api_seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let deny = format!("deny = [\"plain.test:{plain}/gists\", \"api.test:{api}/gists\"]");
    let mut policy = policy_for(&[("plain.test", plain), ("api.test", api)], None, &deny);
    policy.push_str(&bearer_rule("api.test", api, ""));
    let setup = start_proxy("denyplain", &policy, vec![ca.der.clone()]).unwrap();
    let proxy_ca =
        rustls::pki_types::pem::PemObject::from_pem_slice(setup.proxy.guest_trust().unwrap().ca_pem.as_bytes())
            .unwrap();
    let (status, body) = rt.block_on(async {
        let tcp = TcpStream::connect(setup.addr).await.unwrap();
        let host = format!("plain.test:{plain}");
        send(tcp, "POST", &format!("http://{host}/x/../GISTS"), &[("host", &host)], "data").await
    });
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(&format!("denied by plain.test:{plain}/gists (test.toml)")), "{body}");
    assert!(plain_seen.lock().unwrap().is_empty());
    let answers = rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &[("POST", "/gists")], &[]));
    assert_eq!(answers[0].0, 403, "{answers:?}");
    assert!(api_seen.lock().unwrap().is_empty(), "{}", seen_text(&api_seen));
    let log = std::fs::read_to_string(&setup.audit).unwrap();
    assert!(!log.contains(SECRET));
}

/// A credential command that fails on a refresh: the guest's 502 and the
/// audit log say the credential could not be had, but quote neither the
/// command nor what it printed; a second request soon after does not run
/// the command again.
#[test]
fn a_failing_credential_command_is_never_quoted_to_the_guest() {
    let rt = runtime();
    let ca = TestCa::new();
    let (api, seen) = rt.block_on(echo_server(Some(ca.server_config("api.test", &[b"http/1.1"]))));
    let dir = std::env::temp_dir().join(format!("stockade-proxy-credfail-cmd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let runs = dir.join("runs");
    let command = format!(
        "echo x >> {0}; if [ $(wc -l < {0}) -gt 1 ]; then echo stderr-says-hunter2 >&2; exit 7; fi; echo {SECRET}",
        runs.display()
    );
    let mut policy = policy_for(&[("api.test", api)], None, "");
    policy.push_str(&format!(
        "[[credential]]\nhost = \"api.test:{api}\"\nheader = \"x-api-key\"\nvalue = {{ command = '{command}', ttl = \"1s\" }}\n"
    ));
    let setup = start_proxy("credfail-cmd", &policy, vec![ca.der.clone()]).unwrap();
    let proxy_ca =
        rustls::pki_types::pem::PemObject::from_pem_slice(setup.proxy.guest_trust().unwrap().ca_pem.as_bytes())
            .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let answers =
        rt.block_on(intercepted_requests(setup.addr, "api.test", api, &proxy_ca, &[("GET", "/a"), ("GET", "/b")], &[]));
    for (status, body) in &answers {
        assert_eq!(*status, 502, "{body}");
        assert!(body.contains(&format!("the credential for api.test:{api} could not be had")), "{body}");
        for leak in ["hunter2", "wc -l", "exit 7", "exited with", &runs.display().to_string()] {
            assert!(!body.contains(leak), "the guest was told {leak:?}: {body}");
        }
    }
    assert!(seen.lock().unwrap().is_empty());
    let log = std::fs::read_to_string(&setup.audit).unwrap();
    assert!(!log.contains("hunter2") && !log.contains("wc -l"), "{log}");
    let count = std::fs::read_to_string(&runs).unwrap().lines().count();
    assert_eq!(count, 2, "the command ran at the start and once for the refresh, not for each request");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A transparent connection that names no site, to a host with path deny
/// rules on that port: tunnelled, it would pass bytes the proxy cannot
/// read, so it is refused.
#[test]
fn transparent_raw_flows_to_a_host_with_path_rules_are_refused() {
    let rt = runtime();
    let (port, seen) = rt.block_on(echo_server(None));
    let deny = format!("deny = [\"raw.test:{port}/admin\"]");
    let setup = start_proxy("transparent-raw", &policy_for(&[("raw.test", port)], None, &deny), vec![]).unwrap();
    let entry = serve_transparent(&setup);
    setup.proxy.answer_dns(&dns_query("raw.test.", RecordType::A));
    let dst: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let got = rt.block_on(async {
        let mut tcp = transparent(entry, dst).await;
        tcp.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut buf)).await;
        buf
    });
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(seen.lock().unwrap().is_empty());
    let records = audit_records(&setup);
    assert!(
        records.iter().any(|r| r.decision == Decision::Deny && r.reason.as_deref().unwrap_or("").contains("path deny")),
        "{records:?}"
    );
}

/// `host_ports`: the guest reaches the host's loopback on exactly those
/// ports, as `host.stockade.internal` (through the proxy or transparently
/// at the gateway), and the refusal of any other says how to allow it.
#[test]
fn host_ports_reach_the_hosts_loopback_and_no_other_port() {
    use crate::protocol::transparent::{GATEWAY_IP, HOST_ALIAS};
    let rt = runtime();
    let (port, seen) = rt.block_on(echo_server(None));
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let setup = start_proxy("host-ports", &format!("[network]\nhost_ports = [{port}]\n"), vec![]).unwrap();

    let answer = Message::from_vec(&setup.proxy.answer_dns(&dns_query(&format!("{HOST_ALIAS}."), RecordType::A)));
    let addrs: Vec<_> = answer.unwrap().answers().iter().map(|r| r.data().clone()).collect();
    assert_eq!(addrs, [RData::A(GATEWAY_IP.into())], "the alias is the gateway, never the guest's own loopback");

    let (status, body, _) = rt.block_on(connect(setup.addr, &format!("{HOST_ALIAS}:{port}")));
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = rt.block_on(connect(setup.addr, &format!("{HOST_ALIAS}:{other}")));
    assert_eq!(status, 403);
    assert!(body.contains(&format!("run with --host-port {other} or put {other} in [network] host_ports")), "{body}");

    let entry = serve_transparent(&setup);
    let host = format!("{HOST_ALIAS}:{port}");
    let by_address = SocketAddr::from((GATEWAY_IP, port));
    let (status, body) =
        rt.block_on(async { get(transparent(entry, by_address).await, false, "/t", &[("host", &host)]).await });
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /t"), "{body}");
    assert_eq!(seen.lock().unwrap().len(), 1);

    let records = audit_records(&setup);
    assert!(
        records.iter().any(|r| r.host == HOST_ALIAS
            && r.decision == Decision::Allow
            && r.rule.as_deref().is_some_and(|rule| rule.starts_with(&format!("host port {port}")))),
        "{records:?}"
    );

    let none = start_proxy("no-host-ports", "[network]\nallow = [\"example.com\"]\n", vec![]).unwrap();
    let (status, body, _) = rt.block_on(connect(none.addr, &format!("{HOST_ALIAS}:{port}")));
    assert_eq!(status, 403, "without host ports every port is refused, saying how to allow it");
    assert!(body.contains(&format!("--host-port {port}")), "{body}");
}

const TARBALL: &[u8] = b"the a-1.0.0 tarball, as the registry published it";

/// A registry: a packument for `a` listing 1.0.0 (served as published)
/// and 2.0.0 (whose tarball is served altered).
async fn npm_registry(seen: Seen, req: Request<Incoming>) -> Answer {
    use base64::Engine as _;
    seen.lock().unwrap().push(req.uri().path().to_string());
    let integrity = |data: &[u8]| {
        let digest = <sha2::Sha512 as sha2::Digest>::digest(data);
        format!("sha512-{}", base64::engine::general_purpose::STANDARD.encode(digest))
    };
    let body = match req.uri().path() {
        "/a" => format!(
            r#"{{"name":"a","versions":{{
                "1.0.0":{{"dist":{{"tarball":"https://registry.test/a/-/a-1.0.0.tgz","integrity":"{}"}}}},
                "2.0.0":{{"dist":{{"tarball":"https://registry.test/a/-/a-2.0.0.tgz","integrity":"{}"}}}}}}}}"#,
            integrity(TARBALL),
            integrity(b"the real 2.0.0")
        )
        .into_bytes(),
        "/a/-/a-1.0.0.tgz" => TARBALL.to_vec(),
        "/a/-/a-2.0.0.tgz" => b"altered on the way".to_vec(),
        "/a/-/a-9.9.9.tgz" => b"a file the packument does not list".to_vec(),
        _ => return Ok(Response::builder().status(404).body(Full::new(Bytes::new())).unwrap()),
    };
    Ok(Response::new(Full::new(Bytes::from(body))))
}

/// A fresh proxy (a new run) with the package cache in `cache`.
fn registry_run(name: &str, port: u16, ca: &TestCa, cache: &std::path::Path) -> (Setup, CertificateDer<'static>) {
    let policy = policy_for(&[("registry.test", port)], None, "")
        + &format!("[[registry]]\nkind = \"npm\"\nurl = \"https://registry.test:{port}/\"\n");
    let cache = super::packages::CacheConfig { dir: cache.to_path_buf(), limit: 1 << 30 };
    let setup =
        start_proxy_configured(name, &policy, vec![ca.der.clone()], &[], |c| c.package_cache = Some(cache)).unwrap();
    let pem = setup.proxy.guest_trust().expect("a registry rule means interception").ca_pem;
    (setup, rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap())
}

/// The status and the body, or how the exchange failed: a download found
/// bad may be cut before or after its headers, depending on how much of it
/// had arrived when the server first asked for the body.
async fn fetch_package(
    setup: &Setup,
    port: u16,
    ca: &CertificateDer<'static>,
    path: &str,
) -> Result<(u16, String), String> {
    let (status, _, tcp) = connect(setup.addr, &format!("registry.test:{port}")).await;
    assert_eq!(status, 200);
    let tls = tls_over(tcp, "registry.test", ca, &[]).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get(path).header("host", format!("registry.test:{port}")).body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&body.to_bytes()).to_string()))
}

#[test]
fn package_downloads_are_checked_kept_and_served_to_the_next_run() {
    let rt = runtime();
    let ca = TestCa::new();
    let (port, seen) = rt.block_on(loopback_server(Some(ca.server_config("registry.test", &[])), npm_registry));
    let cache = std::env::temp_dir().join(format!("stockade-package-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let tarball = String::from_utf8_lossy(TARBALL).to_string();

    let (first, first_ca) = registry_run("cache-1", port, &ca, &cache);
    let got = rt.block_on(fetch_package(&first, port, &first_ca, "/a/-/a-1.0.0.tgz"));
    assert_eq!(got, Ok((200, tarball.clone())));
    assert_eq!(*seen.lock().unwrap(), ["/a", "/a/-/a-1.0.0.tgz"], "checksums, then the file");
    let records = audit_records(&first);
    assert!(records.iter().any(|r| r.cache.as_deref() == Some("stored") && r.status == Some(200)), "{records:?}");
    drop(first);

    let (second, second_ca) = registry_run("cache-2", port, &ca, &cache);
    let got = rt.block_on(fetch_package(&second, port, &second_ca, "/a/-/a-1.0.0.tgz"));
    assert_eq!(got, Ok((200, tarball.clone())));
    assert_eq!(seen.lock().unwrap().len(), 2, "the second run asked the registry nothing");
    let records = audit_records(&second);
    assert!(records.iter().any(|r| r.cache.as_deref() == Some("hit") && r.bytes_down == TARBALL.len() as u64));

    // A cached file changed on the host's disk is never served.
    for blob in std::fs::read_dir(cache.join("blobs")).unwrap() {
        std::fs::write(blob.unwrap().path(), b"poisoned").unwrap();
    }
    let got = rt.block_on(fetch_package(&second, port, &second_ca, "/a/-/a-1.0.0.tgz"));
    assert_eq!(got, Ok((200, tarball)));
    assert_eq!(seen.lock().unwrap().last().unwrap(), "/a/-/a-1.0.0.tgz", "fetched again");

    // Nor is a download that does not match the registry's integrity: it
    // never reaches the guest whole.
    let got = rt.block_on(fetch_package(&second, port, &second_ca, "/a/-/a-2.0.0.tgz"));
    assert!(got.is_err(), "{got:?}");
    assert_eq!(super::packages::store::usage(&cache).unwrap().files, 1, "only the good file is kept");
    let records = audit_records(&second);
    let refused = records.iter().find(|r| r.cache.as_deref() == Some("refused")).expect("a refused record");
    assert!(refused.reason.as_deref().is_some_and(|r| r.contains("not the registry's")), "{refused:?}");
    drop(second);
    std::fs::remove_dir_all(&cache).unwrap();
}

/// A guest asking for a file the registry publishes no digest for (a
/// version its packument does not list) gets the registry's answer, but the
/// file is never kept: nothing the guest chooses can enter the cache for a
/// later run.
#[test]
fn a_file_without_a_registry_digest_is_passed_on_and_never_kept() {
    let rt = runtime();
    let ca = TestCa::new();
    let (port, seen) = rt.block_on(loopback_server(Some(ca.server_config("registry.test", &[])), npm_registry));
    let cache = std::env::temp_dir().join(format!("stockade-package-cache-unlisted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    for run in ["unlisted-1", "unlisted-2"] {
        let (setup, setup_ca) = registry_run(run, port, &ca, &cache);
        let got = rt.block_on(fetch_package(&setup, port, &setup_ca, "/a/-/a-9.9.9.tgz"));
        assert_eq!(got, Ok((200, "a file the packument does not list".to_string())));
        assert!(audit_records(&setup).iter().all(|r| r.cache.as_deref() != Some("stored")));
    }
    let tarballs = seen.lock().unwrap().iter().filter(|p| p.ends_with(".tgz")).count();
    assert_eq!(tarballs, 2, "each run asked the registry");
    assert_eq!(super::packages::store::usage(&cache).map(|u| u.files).unwrap_or(0), 0);
    let _ = std::fs::remove_dir_all(&cache);
}
