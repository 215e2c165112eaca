//! Attacks on `[[credential]]` values through servers that echo what they
//! are sent: an endpoint listing the request's headers (httpbin's
//! `/headers`), an error page quoting the request, one that decodes a
//! basic-auth header, one that remembers an earlier request, one that
//! compresses its echo. The proxy wrote the real value into the request;
//! the guest must only ever get the placeholder back.

use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rustls::pki_types::CertificateDer;
use tokio::runtime::Runtime;

use super::tests::{
    Answer, Seen, Setup, TestCa, connect, loopback_server, policy_for, runtime, seen_text, start_proxy_with_home,
    tls_over,
};
use crate::policy::PLACEHOLDER;

/// A raw key, with the characters JSON and forms spell otherwise.
const KEY: &str = "key/Abc+123=xyz-0001";
/// A bearer token.
const TOKEN: &str = "tok-real-0002";
/// The user and password behind a basic-auth rule.
const BASIC_USER: &str = "robot";
const BASIC_PASSWORD: &str = "pa55/word-real-0003";

/// Every spelling of a real value the guest must never see.
fn reals() -> Vec<String> {
    let basic = BASE64.encode(format!("{BASIC_USER}:{BASIC_PASSWORD}"));
    vec![
        KEY.to_string(),
        KEY.replace('/', "\\/"),
        "key%2FAbc%2B123%3Dxyz-0001".to_string(),
        TOKEN.to_string(),
        basic.clone(),
        basic.replace('/', "\\/"),
        BASIC_PASSWORD.to_string(),
        BASIC_PASSWORD.replace('/', "\\/"),
    ]
}

fn assert_no_real(what: &str, text: &str) {
    for real in reals() {
        assert!(!text.contains(&real), "{what}: the real value {real:?} came back: {text}");
    }
}

/// What the fake servers answer, by path: `/basic` decodes a basic-auth
/// header and prints user and password; `/last` quotes the auth headers of
/// the request before this one; `/gzip` is the echo compressed; any other
/// path echoes the request's headers as text, again with `/` escaped as
/// JSON may, and in answer headers (`x-echo-NAME`), with status from
/// `x-status`.
async fn echo(seen: Seen, req: Request<Incoming>) -> Answer {
    let mut echo = format!("{} {}\n", req.method(), req.uri());
    let mut echoed = Vec::new();
    for (name, value) in req.headers() {
        let value = value.to_str().unwrap_or("?");
        echo.push_str(&format!("{name}: {value}\njson {name}: \"{}\"\n", value.replace('/', "\\/")));
        if matches!(name.as_str(), "authorization" | "x-api-key") {
            echoed.push((format!("x-echo-{name}"), value.to_string()));
        }
    }
    let status: u16 = req.headers().get("x-status").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(200);
    let basic = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok()?.strip_prefix("Basic ").map(str::to_string))
        .and_then(|b| String::from_utf8(BASE64.decode(b).ok()?).ok());
    let path = req.uri().path().to_string();
    let earlier = seen.lock().unwrap().last().cloned().unwrap_or_default();
    seen.lock().unwrap().push(echo.clone());
    let body = match path.as_str() {
        "/basic" => match basic.as_deref().and_then(|b| b.split_once(':')) {
            Some((user, password)) => format!("user={user} password={password}\n").into_bytes(),
            None => b"no basic auth\n".to_vec(),
        },
        "/last" => earlier
            .lines()
            .filter(|l| l.starts_with("authorization:") || l.starts_with("x-api-key:"))
            .collect::<Vec<_>>()
            .join("\n")
            .into_bytes(),
        "/gzip" => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(echo.as_bytes()).unwrap();
            gz.finish().unwrap()
        }
        _ => echo.into_bytes(),
    };
    let mut response = Response::builder().status(status).header("content-type", "text/plain");
    for (name, value) in echoed {
        response = response.header(name, value);
    }
    if path == "/gzip" {
        response = response.header("content-encoding", "gzip");
    }
    Ok(response.body(Full::new(Bytes::from(body))).unwrap())
}

/// Three hosts behind echoing servers, each with a credential rule:
/// key.test a raw `x-api-key` limited to paths under /v1/, bearer.test an
/// `Authorization: Bearer`, basic.test an `Authorization: Basic`.
struct World {
    setup: Setup,
    ports: Vec<(&'static str, u16, Seen)>,
    proxy_ca: CertificateDer<'static>,
}

fn world(rt: &Runtime, name: &str) -> World {
    let ca = TestCa::new();
    let mut ports = Vec::new();
    for host in ["key.test", "bearer.test", "basic.test"] {
        let (port, seen) = rt.block_on(loopback_server(Some(ca.server_config(host, &[b"http/1.1"])), echo));
        ports.push((host, port, seen));
    }
    let hosts: Vec<(&str, u16)> = ports.iter().map(|(h, p, _)| (*h, *p)).collect();
    let mut text = policy_for(&hosts, None, "");
    let basic = BASE64.encode(format!("{BASIC_USER}:{BASIC_PASSWORD}"));
    text.push_str(&format!(
        "[[credential]]\nhost = \"key.test:{}\"\nheader = \"x-api-key\"\nvalue = {{ command = \"echo '{KEY}'\" }}\n\
         paths = [\"/v1/\"]\n\
         [[credential]]\nhost = \"bearer.test:{}\"\nheader = \"authorization\"\nformat = \"Bearer {{}}\"\n\
         value = {{ command = \"echo {TOKEN}\" }}\n\
         [[credential]]\nhost = \"basic.test:{}\"\nheader = \"authorization\"\nformat = \"Basic {{}}\"\n\
         value = {{ command = \"echo {basic}\" }}\n",
        hosts[0].1, hosts[1].1, hosts[2].1
    ));
    let setup = start_proxy_with_home(name, &text, vec![ca.der.clone()], &[]).unwrap();
    let pem = setup.proxy.guest_trust().expect("a credential rule means interception").ca_pem;
    let proxy_ca = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    World { setup, ports, proxy_ca }
}

/// An answer as the guest gets it: status, headers as text, body.
struct Got {
    status: u16,
    headers: String,
    body: String,
}

impl World {
    fn port(&self, host: &str) -> u16 {
        self.ports.iter().find(|(h, _, _)| *h == host).unwrap().1
    }

    fn seen(&self, host: &str) -> String {
        seen_text(&self.ports.iter().find(|(h, _, _)| *h == host).unwrap().2)
    }

    /// A GET through the proxy, with the placeholder as the guest's key.
    async fn get(&self, host: &str, path: &str, extra: &[(&str, &str)]) -> Got {
        let port = self.port(host);
        let (status, refusal, tcp) = connect(self.setup.addr, &format!("{host}:{port}")).await;
        assert_eq!(status, 200, "{refusal}");
        let tls = tls_over(tcp, host, &self.proxy_ca, &[b"http/1.1"]).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
        tokio::spawn(conn);
        let mut req = Request::get(path).header("host", format!("{host}:{port}"));
        for (name, value) in extra {
            req = req.header(*name, *value);
        }
        let response = sender.send_request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let headers = format!("{:?}", response.headers());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Got { status, headers, body: String::from_utf8_lossy(&body).to_string() }
    }
}

#[test]
fn an_echo_of_the_written_header_gives_back_the_placeholder() {
    let rt = runtime();
    let world = world(&rt, "cred-echo-headers");
    let bearer = format!("Bearer {PLACEHOLDER}");
    for (host, path, guest) in [
        ("key.test", "/v1/headers", ("x-api-key", PLACEHOLDER)),
        ("bearer.test", "/anything", ("authorization", bearer.as_str())),
        ("basic.test", "/headers", ("authorization", "Basic c3RvY2thZGU6cGxhY2Vob2xkZXI=")),
    ] {
        let got = rt.block_on(world.get(host, path, &[guest]));
        assert_eq!(got.status, 200, "{host}: {}", got.body);
        assert_no_real(&format!("{host} body"), &got.body);
        assert_no_real(&format!("{host} headers"), &got.headers);
        assert!(got.body.contains(PLACEHOLDER), "{host}: {}", got.body);
        // The server had the real value, though.
        assert!(!world.seen(host).contains(PLACEHOLDER), "{host}: {}", world.seen(host));
    }
    let got = rt.block_on(world.get("bearer.test", "/anything", &[]));
    assert!(got.body.contains(&format!("authorization: Bearer {PLACEHOLDER}")), "{}", got.body);
    let got = rt.block_on(world.get("key.test", "/v1/x", &[("x-status", "500")]));
    assert_eq!(got.status, 500);
    assert!(got.body.contains(&format!("x-api-key: {PLACEHOLDER}")), "an error page quoting the key: {}", got.body);
    assert_no_real("an error page", &got.body);
}

#[test]
fn a_decoded_basic_auth_password_is_scrubbed() {
    let rt = runtime();
    let world = world(&rt, "cred-echo-basic");
    let got = rt.block_on(world.get("basic.test", "/basic", &[]));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.body.starts_with(&format!("user={BASIC_USER} password=")), "{}", got.body);
    assert_no_real("a decoded basic auth", &got.body);
    assert!(world.seen("basic.test").contains(&BASE64.encode(format!("{BASIC_USER}:{BASIC_PASSWORD}"))));
}

#[test]
fn an_answer_outside_the_rule_scope_is_scrubbed_too() {
    let rt = runtime();
    let world = world(&rt, "cred-echo-scope");
    // A request in scope carries the key; one outside it asks the server
    // what the last request carried.
    rt.block_on(world.get("key.test", "/v1/models", &[]));
    let got = rt.block_on(world.get("key.test", "/last", &[]));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.body.contains("x-api-key"), "{}", got.body);
    assert_no_real("an answer outside the scope", &got.body);
}

#[test]
fn a_compressed_echo_of_a_credential_is_refused() {
    let rt = runtime();
    let world = world(&rt, "cred-echo-gzip");
    let got = rt.block_on(world.get("bearer.test", "/gzip", &[("accept-encoding", "gzip")]));
    let mut plain = String::new();
    let _ = std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(got.body.as_bytes()), &mut plain);
    assert_no_real("a compressed echo", &plain);
    assert_eq!(got.status, 502, "{}", got.body);
    assert!(got.body.contains("compressed"), "{}", got.body);
    let seen = world.seen("bearer.test");
    assert!(seen.contains("accept-encoding: identity") && !seen.contains("accept-encoding: gzip"), "{seen}");
}
