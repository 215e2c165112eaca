//! Attacks on sign-in tokens through the proxy, against fake servers that
//! do what real ones may: echo a request's body or headers (many error
//! answers do), answer in a form, in pieces, compressed or very large. The
//! guest must never get a real token back, and the host's token file must
//! change only from the real answer to a refresh the proxy itself sent.

use std::io::Write as _;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio_rustls::TlsAcceptor;

use super::tests::{
    Answer, Seen, Setup, TestCa, audit_records, connect, json, loopback_server, policy_for, runtime, seen_text, send,
    start_proxy_with_home, tls_over,
};

const FILE: &str = ".claude/.credentials.json";
const TOKENS: &str =
    r#"{"claudeAiOauth":{"accessToken":"real-access-1","refreshToken":"real-refresh-1","expiresAt":1000}}"#;
const TOKEN_PATH: &str = "/v1/oauth/token";

/// The agent's API and its sign-in server, both under one sign-in rule
/// whose token endpoint is `https://auth.test:PORT/v1/oauth/token`.
struct World {
    setup: Setup,
    api: u16,
    auth: u16,
    auth_seen: Seen,
    proxy_ca: CertificateDer<'static>,
    access: String,
    refresh: String,
}

fn world(rt: &Runtime, name: &str, api: Option<u16>) -> World {
    let ca = TestCa::new();
    let api = match api {
        Some(port) => port,
        None => rt.block_on(loopback_server(Some(ca.server_config("api.test", &[b"http/1.1"])), fake)).0,
    };
    let (auth, auth_seen) = rt.block_on(loopback_server(Some(ca.server_config("auth.test", &[b"http/1.1"])), fake));
    world_with(rt, name, &ca, api, auth, auth_seen)
}

fn world_with(rt: &Runtime, name: &str, ca: &TestCa, api: u16, auth: u16, auth_seen: Seen) -> World {
    let _ = rt;
    let mut text = policy_for(&[("api.test", api), ("auth.test", auth)], None, "");
    text.push_str(&format!(
        "[[signin]]\nfile = \"~/{FILE}\"\n\
         tokens = [\"claudeAiOauth.accessToken\", \"claudeAiOauth.refreshToken\"]\n\
         hosts = [\"api.test:{api}\", \"auth.test:{auth}\"]\n\
         token_urls = [\"https://auth.test:{auth}{TOKEN_PATH}\"]\n"
    ));
    let setup = start_proxy_with_home(name, &text, vec![ca.der.clone()], &[(FILE, TOKENS)]).unwrap();
    let pem = setup.proxy.guest_trust().expect("a sign-in rule means interception").ca_pem;
    let proxy_ca = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    let copy = json(&String::from_utf8(setup.proxy.signin_files()[0].content.clone()).unwrap());
    let access = copy["claudeAiOauth"]["accessToken"].as_str().unwrap().to_string();
    let refresh = copy["claudeAiOauth"]["refreshToken"].as_str().unwrap().to_string();
    World { setup, api, auth, auth_seen, proxy_ca, access, refresh }
}

impl World {
    async fn request(
        &self,
        host: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let port = if host == "api.test" { self.api } else { self.auth };
        let (status, refusal, tcp) = connect(self.setup.addr, &format!("{host}:{port}")).await;
        assert_eq!(status, 200, "{refusal}");
        let tls = tls_over(tcp, host, &self.proxy_ca, &[b"http/1.1"]).await.unwrap();
        let authority = format!("{host}:{port}");
        let mut all = vec![("host", authority.as_str())];
        all.extend_from_slice(headers);
        send(tls, method, path, &all, body).await
    }

    fn host_file(&self) -> String {
        std::fs::read_to_string(self.setup.dir.join("home").join(FILE)).unwrap()
    }

    fn refresh_json(&self, extra: &str) -> String {
        format!(r#"{{"grant_type":"refresh_token","refresh_token":"{}","client_id":"agent"{extra}}}"#, self.refresh)
    }
}

/// What the fake servers answer, chosen by the request's `x-answer`:
/// `form` (a form-encoded token answer), `big` (over 1 MiB), `gzip` (an
/// echo compressed although the proxy asked for none), `json-echo` (the
/// body back as JSON, status from `x-status`); any other request to the
/// token endpoint is refreshed as a sign-in server does (only its own
/// real refresh tokens), and any other path echoes its request's headers
/// and body as text with status 400, as error pages often do.
async fn fake(seen: Seen, req: Request<Incoming>) -> Answer {
    let mut echo = format!("{} {}\n", req.method(), req.uri());
    for (name, value) in req.headers() {
        echo.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
    }
    let mode = req.headers().get("x-answer").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let status: u16 = req.headers().get("x-status").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(200);
    let token_path = req.uri().path() == TOKEN_PATH;
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body = String::from_utf8_lossy(&body).to_string();
    echo.push_str(&format!("body: {body}\n"));
    seen.lock().unwrap().push(echo.clone());
    let next = (1..5).find(|n| body.contains(&format!("real-refresh-{n}"))).map(|n| n + 1);
    let answer = |status: u16, kind: &str, body: Vec<u8>| {
        Ok(Response::builder().status(status).header("content-type", kind).body(Full::new(Bytes::from(body))).unwrap())
    };
    match mode.as_str() {
        "form" => {
            let n = next.unwrap_or(0);
            let form = format!("access_token=real-access-{n}&refresh_token=real-refresh-{n}&expires_in=3600");
            answer(200, "application/x-www-form-urlencoded", form.into_bytes())
        }
        "big" => {
            let n = next.unwrap_or(0);
            let pad = "x".repeat((1 << 20) + 10);
            let big =
                format!(r#"{{"access_token":"real-access-{n}","refresh_token":"real-refresh-{n}","pad":"{pad}"}}"#);
            answer(200, "application/json", big.into_bytes())
        }
        "gzip" => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(echo.as_bytes()).unwrap();
            let mut response = answer(200, "text/plain", gz.finish().unwrap())?;
            response.headers_mut().insert("content-encoding", http::HeaderValue::from_static("gzip"));
            Ok(response)
        }
        "json-echo" => answer(status, "application/json", body.into_bytes()),
        _ if token_path => match next {
            Some(n) => {
                let tokens = format!(
                    r#"{{"access_token":"real-access-{n}","refresh_token":"real-refresh-{n}","expires_in":3600}}"#
                );
                answer(200, "application/json", tokens.into_bytes())
            }
            None => answer(400, "application/json", br#"{"error":"invalid_grant"}"#.to_vec()),
        },
        _ => answer(400, "text/plain", echo.into_bytes()),
    }
}

fn gunzip(data: &[u8]) -> String {
    let mut out = String::new();
    let _ = std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(data), &mut out);
    out
}

#[test]
fn a_token_request_sent_to_another_path_is_not_given_the_real_refresh_token() {
    let rt = runtime();
    let world = world(&rt, "signin-echo-path", None);
    let form = format!("grant_type=refresh_token&refresh_token={}", world.refresh);
    let answers = rt.block_on(async {
        let as_form = [("content-type", "application/x-www-form-urlencoded")];
        let as_json = [("content-type", "application/json")];
        [
            world.request("auth.test", "POST", "/v1/echo", &as_form, &form).await,
            world.request("auth.test", "POST", "/v1/oauth/token?x=1", &as_form, &form).await,
            world.request("auth.test", "PUT", TOKEN_PATH, &as_form, &form).await,
            world.request("api.test", "POST", "/v1/messages", &as_json, &world.refresh_json("")).await,
        ]
    });
    for (status, body) in &answers {
        assert!(!body.contains("real-"), "a real token came back ({status}): {body}");
    }
    let seen = seen_text(&world.auth_seen);
    assert!(!seen.contains("real-refresh"), "the real refresh token left for a request that is not a refresh: {seen}");
}

#[test]
fn an_echo_of_the_authorization_header_is_scrubbed_from_any_answer() {
    let rt = runtime();
    let world = world(&rt, "signin-echo-header", None);
    let bearer = format!("Bearer {}", world.access);
    let (status, body) = rt.block_on(world.request("api.test", "GET", "/v1/models", &[("authorization", &bearer)], ""));
    assert_eq!(status, 400);
    assert!(body.contains(&format!("authorization: Bearer {}", world.access)), "{body}");
    assert!(!body.contains("real-"), "the real access token came back: {body}");
    // The server had it, though.
    let records = audit_records(&world.setup);
    assert!(records.iter().any(|r| r.signin.is_some()), "{records:?}");

    // A refresh placeholder in the Authorization header is not a bearer
    // token: it stays a placeholder.
    let bearer = format!("Bearer {}", world.refresh);
    let (_, body) = rt.block_on(world.request("api.test", "GET", "/v1/models", &[("authorization", &bearer)], ""));
    assert!(body.contains(&world.refresh) && !body.contains("real-"), "{body}");
}

#[test]
fn a_compressed_echo_is_refused() {
    let rt = runtime();
    let world = world(&rt, "signin-gzip", None);
    let bearer = format!("Bearer {}", world.access);
    let (status, body) = rt.block_on(async {
        let headers = [("authorization", bearer.as_str()), ("x-answer", "gzip")];
        world.request("api.test", "GET", "/v1/models", &headers, "").await
    });
    let plain = gunzip(body.as_bytes());
    assert!(!plain.contains("real-") && !body.contains("real-"), "a compressed real token came back: {plain}");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("compressed"), "{body}");
}

#[test]
fn a_form_encoded_token_answer_gets_placeholders() {
    let rt = runtime();
    let world = world(&rt, "signin-form-answer", None);
    let (status, body) = rt.block_on(async {
        let headers = [("content-type", "application/json"), ("x-answer", "form")];
        world.request("auth.test", "POST", TOKEN_PATH, &headers, &world.refresh_json("")).await
    });
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("real-"), "a real token came back in a form: {body}");
    assert!(body.starts_with("access_token=stockade-signin-") && body.ends_with("&expires_in=3600"), "{body}");
    let host = json(&world.host_file());
    assert_eq!(host["claudeAiOauth"]["refreshToken"], "real-refresh-2", "a form answer to a refresh is saved too");
}

#[test]
fn a_token_answer_over_the_limit_is_refused() {
    let rt = runtime();
    let world = world(&rt, "signin-big-answer", None);
    let (status, body) = rt.block_on(async {
        let headers = [("content-type", "application/json"), ("x-answer", "big")];
        world.request("auth.test", "POST", TOKEN_PATH, &headers, &world.refresh_json("")).await
    });
    assert!(!body.contains("real-"), "a real token came back in a large answer ({} bytes)", body.len());
    assert_eq!(status, 502, "{}", &body[..body.len().min(300)]);
}

#[test]
fn an_answer_that_looks_like_a_refresh_never_reaches_the_host_file() {
    let rt = runtime();
    let world = world(&rt, "signin-fake-refresh", None);
    let planted = r#","access_token":"guest-chosen","expires_in":99"#;
    let answers = rt.block_on(async {
        let mut answers = Vec::new();
        // The host's own refresh placeholder, sent where the server echoes
        // it back as if it were a refresh answer: elsewhere on the host,
        // and at the token endpoint as an error.
        for (path, status) in [("/v1/echo", "200"), (TOKEN_PATH, "400"), (TOKEN_PATH, "200")] {
            let headers = [("content-type", "application/json"), ("x-answer", "json-echo"), ("x-status", status)];
            answers.push(world.request("auth.test", "POST", path, &headers, &world.refresh_json(planted)).await);
        }
        // A refresh with a token of the guest's own, answered genuinely.
        let own = r#"{"grant_type":"refresh_token","refresh_token":"real-refresh-3"}"#;
        answers
            .push(world.request("auth.test", "POST", TOKEN_PATH, &[("content-type", "application/json")], own).await);
        answers
    });
    for (status, body) in &answers[..3] {
        assert!(!body.contains("real-refresh-1"), "the real refresh token came back ({status}): {body}");
    }
    assert_eq!(answers[3].0, 200, "{}", answers[3].1);
    assert!(!answers[3].1.contains("real-"), "{}", answers[3].1);
    let host = world.host_file();
    assert!(
        !host.contains("guest-chosen") && !host.contains("real-access-4"),
        "the host file took a guest's token: {host}"
    );
    let records = audit_records(&world.setup);
    let saved: Vec<_> = records.iter().filter_map(|r| r.signin_saved.as_deref()).collect();
    assert!(saved.iter().all(|s| !s.starts_with("saved")), "{saved:?}");
}

#[test]
fn a_token_request_body_is_capped() {
    let rt = runtime();
    let world = world(&rt, "signin-big-request", None);
    let big = world.refresh_json(&format!(r#","pad":"{}""#, "x".repeat(1 << 20)));
    let answer = rt.block_on(async {
        let (_, _, tcp) = connect(world.setup.addr, &format!("auth.test:{}", world.auth)).await;
        let tls = tls_over(tcp, "auth.test", &world.proxy_ca, &[b"http/1.1"]).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::post(TOKEN_PATH)
            .header("host", format!("auth.test:{}", world.auth))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(big)))
            .unwrap();
        sender.send_request(req).await.map(|r| r.status().as_u16())
    });
    // The proxy answers before reading the rest, so the guest may see the
    // connection close while it still sends instead.
    assert!(matches!(answer, Ok(413) | Err(_)), "{answer:?}");
    assert!(world.auth_seen.lock().unwrap().is_empty(), "{}", seen_text(&world.auth_seen));
}

/// An HTTPS server that answers every request with its headers echoed in
/// an event stream, sent in chunks of `piece` bytes with a flush between.
async fn chunked_echo(config: std::sync::Arc<rustls::ServerConfig>, piece: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let config = config.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = TlsAcceptor::from(config).accept(tcp).await else { return };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let event = format!("data: {}\n\n", String::from_utf8_lossy(&head).replace("\r\n", " | "));
                let start = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let _ = tls.write_all(start.as_bytes()).await;
                for chunk in event.as_bytes().chunks(piece) {
                    let _ = tls.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await;
                    let _ = tls.write_all(chunk).await;
                    let _ = tls.write_all(b"\r\n").await;
                    let _ = tls.flush().await;
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                let _ = tls.write_all(b"0\r\n\r\n").await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

#[test]
fn a_streamed_echo_split_across_chunks_is_scrubbed() {
    let rt = runtime();
    let ca = TestCa::new();
    for piece in [1, 5, 4096] {
        let api = rt.block_on(chunked_echo(ca.server_config("api.test", &[b"http/1.1"]), piece));
        let (auth, auth_seen) = rt.block_on(loopback_server(Some(ca.server_config("auth.test", &[b"http/1.1"])), fake));
        let world = world_with(&rt, &format!("signin-chunks-{piece}"), &ca, api, auth, auth_seen);
        let bearer = format!("Bearer {}", world.access);
        let (status, body) =
            rt.block_on(world.request("api.test", "GET", "/v1/stream", &[("authorization", &bearer)], ""));
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with("data: GET /v1/stream") && body.ends_with("\n\n"), "{body}");
        assert!(!body.contains("real-"), "chunks of {piece}: the real access token came back: {body}");
        assert!(body.contains(&world.access), "{body}");
    }
}

/// Attack: the echo check compares the answer's tokens with the guest's
/// bytes as sent, but the proxy re-serializes a JSON token request before
/// sending it on. A token the guest writes with a JSON escape
/// (`\u0067uest-chosen`) reaches the server as plain `guest-chosen`; an
/// echoing token endpoint hands it back as a refresh answer, the bytes the
/// guest sent do not contain it, and the host file takes it.
#[test]
fn an_escaped_guest_token_echoed_by_the_token_url_never_reaches_the_host_file() {
    let rt = runtime();
    let world = world(&rt, "signin-escaped-echo", None);
    let planted = r#","access_token":"\u0067uest-chosen","expires_in":99999999"#;
    let (status, body) = rt.block_on(async {
        let headers = [("content-type", "application/json"), ("x-answer", "json-echo"), ("x-status", "200")];
        world.request("auth.test", "POST", TOKEN_PATH, &headers, &world.refresh_json(planted)).await
    });
    assert!(!body.contains("real-refresh-1"), "the real refresh token came back ({status}): {body}");
    let host = world.host_file();
    assert!(!host.contains("guest-chosen"), "the host file took a guest's token: {host}");
}
