//! Intercepted CONNECT tunnels, for hosts with a credential, sign-in or
//! path deny rule: the proxy ends the guest's TLS with a leaf from its CA,
//! refuses requests under a denied path, and sends the others on over TLS
//! it has verified itself, with the guest's auth headers removed and the
//! real credential written in where the rule's scope covers the request,
//! and sign-in placeholders replaced by the real tokens. Every answer on
//! such a host is scrubbed of every real value the proxy writes there
//! (`scrub`), so a server echoing a request hands back placeholders.
//! Requests for any other authority on that connection are refused, so a
//! secret only goes where its rule says.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio_rustls::TlsAcceptor;

use super::Shared;
use super::body::{self, BufferError, Buffered, Counted, Direction, Flow, ProxyBody};
use super::packages;
use super::scrub::{Scrub, Scrubbed};
use super::signin::{BODY_DEADLINE, MAX_ANSWER, MAX_REQUEST, TokenRequest};
use super::upstream::TlsUpstream;
use crate::policy::{Host, Port, RequestPath};
use crate::protocol::audit::{Decision, Kind, Record};

/// One intercepted guest connection.
pub struct Interception {
    pub shared: Arc<Shared>,
    pub host: Host,
    pub port: Port,
    /// The credential rule (index into `shared.credentials`).
    pub credential: Option<usize>,
    /// The sign-in rules for this host (indices into `shared.signins`).
    pub signin: Vec<usize>,
    /// The rule that allowed the host, for the audit log.
    pub rule: String,
    pub upstream: TlsUpstream,
}

/// Serves the guest's requests inside the intercepted TLS connection.
pub async fn serve<C>(this: Interception, client: C)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Some(ca) = this.shared.ca.as_ref() else { return };
    let config = match ca.server_config(&this.host) {
        Ok(config) => config,
        Err(e) => {
            tracing::warn!("cannot intercept {}: {e}", this.host);
            return;
        }
    };
    let tls = match TlsAcceptor::from(config).accept(client).await {
        Ok(tls) => tls,
        Err(e) => {
            // Most often the guest does not trust the CA (SSL_CERT_FILE unset).
            let mut record = Record::new(Kind::Https, this.host.to_string(), this.port.get(), Decision::Fail);
            record.reason = Some(format!("the guest's TLS handshake with the proxy failed: {e}"));
            this.shared.audit.record(&record);
            return;
        }
    };
    if let Some(sni) = tls.get_ref().1.server_name() {
        if Host::parse(sni).ok().as_ref() != Some(&this.host) {
            let mut record = Record::new(Kind::Https, this.host.to_string(), this.port.get(), Decision::Deny);
            record.reason = Some(format!("TLS server name {sni:?} does not match the CONNECT host {}", this.host));
            this.shared.audit.record(&record);
            return;
        }
    }
    let this = Arc::new(this);
    let service = service_fn(move |req| {
        let this = this.clone();
        async move { Ok::<_, Infallible>(handle(&this, req).await) }
    });
    if let Err(e) = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(tls), service).await {
        tracing::debug!("intercepted connection ended: {e}");
    }
}

async fn handle(this: &Interception, req: Request<Incoming>) -> Response<ProxyBody> {
    let shared = &this.shared;
    let mut record = Record::new(Kind::Https, this.host.to_string(), this.port.get(), Decision::Allow);
    record.method = Some(req.method().to_string());
    record.path = Some(req.uri().path().to_string());
    record.rule = Some(this.rule.clone());

    // HTTP/2 names the authority in the URI, HTTP/1.1 in Host.
    let named = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_string));
    if !names_destination(named.as_deref(), &this.host, this.port) {
        let message = format!(
            "stockade: refused a request for {} on the connection to {}:{}; \
             the credentials for {} are only sent to it",
            named.as_deref().unwrap_or("(no host)"),
            this.host,
            this.port,
            this.host
        );
        record.decision = Decision::Deny;
        record.reason = Some(format!("request for {} on a connection to {}", named.unwrap_or_default(), this.host));
        shared.audit.record(&record);
        return body::text(StatusCode::MISDIRECTED_REQUEST, message);
    }
    // Judged in every reading a server might give the path (`RequestPath`).
    let path = RequestPath::parse(req.uri().path());
    if let Some(rule) = shared.policy.denied_path(&this.host, this.port, &path) {
        let message = rule.message(req.method().as_str(), &this.host, this.port, req.uri().path());
        record.decision = Decision::Deny;
        record.rule = Some(rule.to_string());
        record.reason = Some(format!("denied by {rule}"));
        shared.audit.record(&record);
        return body::text(StatusCode::FORBIDDEN, message);
    }
    if let Some(download) = packages::recognize(shared, this, &req) {
        if let Some(response) = packages::serve(this, download, record.clone()).await {
            return response;
        }
    }
    let credential = match this.credential {
        Some(index) => match shared.credentials.rule(index) {
            Some(rule) => Some((index, rule)),
            None => return body::text(StatusCode::INTERNAL_SERVER_ERROR, "stockade: credential rule missing".into()),
        },
        None => None,
    };
    let in_scope = credential.is_some_and(|(_, rule)| rule.scope.covers(methods_named(&req), &path));
    match credential {
        Some((_, rule)) if in_scope => record.credential = Some(rule.name()),
        Some((_, rule)) => {
            record.reason = Some(format!("outside the scope of credential rule {}: sent without it", rule.name()))
        }
        None => {}
    }
    let flow = Flow::new(shared.audit.clone(), record);

    let (mut parts, incoming) = req.into_parts();
    body::strip_hop_by_hop(&mut parts.headers);
    let head = parts.method == http::Method::HEAD;
    if let Some((index, rule)) = credential {
        // Whatever the guest holds (a placeholder, or a key of its own) never
        // reaches the server, in the rule's scope or out of it: only the
        // rule's credential does, and only in its scope.
        parts.headers.remove(header::AUTHORIZATION);
        parts.headers.remove(&rule.header);
        if in_scope {
            let value = match shared.credentials.header_value(index).await {
                Ok(value) => value,
                Err(unavailable) => {
                    // The detail may quote the command and what it printed:
                    // the host's user reads it, the guest and the log do not.
                    if !unavailable.repeated {
                        tracing::warn!("credential rule {}: {}", unavailable.rule, unavailable.host_detail());
                    }
                    flow.fail(format!("the value of credential rule {} could not be had", unavailable.rule));
                    let message = format!(
                        "stockade: the credential for {}:{} could not be had on the host (stockade's warning \
                         there says why); the request was not sent",
                        this.host, this.port
                    );
                    return body::text(StatusCode::BAD_GATEWAY, message);
                }
            };
            parts.headers.insert(rule.header.clone(), value);
        }
        // Every answer on the host is scrubbed of the credential (a server
        // may quote it from this request or an earlier one), which a
        // compressed answer would hide.
        parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    let mut up = Counted::boxed(incoming, flow.clone(), Direction::Up);
    let mut token = None;
    if !this.signin.is_empty() {
        let signins = &shared.signins;
        let mut wrote = signins.substitute_headers(&this.signin, &mut parts.headers);
        // An answer the proxy cannot read could carry tokens past it.
        parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        // Only a token URL's request body is read, and only its refresh
        // token written: any other body (a prompt) keeps its placeholders.
        if let Some(rule) = signins.token_url(&this.signin, &this.host, this.port, &parts.method, target) {
            // The charge is held while the request's bytes are.
            let (bytes, _charge) = match body::buffer_within(up, MAX_REQUEST, &shared.buffers, BODY_DEADLINE).await {
                Ok((Buffered::Whole(bytes), charge)) => (bytes, charge),
                Ok((Buffered::Larger, _)) => {
                    flow.fail(format!("a token request larger than {MAX_REQUEST} bytes"));
                    let message = format!("stockade: a token request is at most {MAX_REQUEST} bytes; not sent");
                    return body::text(StatusCode::PAYLOAD_TOO_LARGE, message);
                }
                Err(e) => {
                    flow.fail(format!("reading the guest's token request: {e}"));
                    let status = match e {
                        BufferError::Budget(_) => StatusCode::SERVICE_UNAVAILABLE,
                        _ => StatusCode::BAD_REQUEST,
                    };
                    return body::text(status, format!("stockade: cannot read the request: {e}"));
                }
            };
            let content_type = match parts.headers.contains_key(header::CONTENT_ENCODING) {
                true => None,
                false => parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
            };
            let (real, request) = signins.token_request(rule, content_type, &bytes);
            wrote |= request.wrote;
            token = Some(request);
            parts.headers.remove(header::CONTENT_LENGTH);
            up = body::full(real.map_or(bytes, Bytes::from));
        }
        if wrote {
            let names: Vec<String> = this.signin.iter().map(|&i| signins.rule_name(i)).collect();
            flow.update(|r| r.signin = Some(names.join(", ")));
        }
    }
    let upstream_req = Request::from_parts(parts, up);

    match this.upstream.send(upstream_req).await {
        Ok(response) => {
            flow.update(|r| r.status = Some(response.status().as_u16()));
            let (mut parts, incoming) = response.into_parts();
            body::strip_hop_by_hop(&mut parts.headers);
            if this.signin.is_empty() && this.credential.is_none() {
                return Response::from_parts(parts, Counted::boxed(incoming, flow, Direction::Down));
            }
            match scrubbed_answer(this, &flow, token.as_ref(), head, &mut parts, incoming).await {
                Ok(down) => Response::from_parts(parts, Counted::boxed(down, flow, Direction::Down)),
                Err(reason) => {
                    flow.fail(reason.clone());
                    body::text(StatusCode::BAD_GATEWAY, format!("stockade: {}:{}: {reason}", this.host, this.port))
                }
            }
        }
        Err(reason) => {
            flow.fail(reason.clone());
            let message = format!(
                "stockade: {}:{} could not be reached safely ({reason}); the credential was not sent",
                this.host, this.port
            );
            body::text(StatusCode::BAD_GATEWAY, message)
        }
    }
}

/// Every real value the proxy writes on this connection's host (its
/// credential rule's, its sign-in rules'), each with its placeholder.
fn answer_scrub(this: &Interception) -> Scrub {
    let mut pairs = Vec::new();
    if this.credential.is_some() {
        pairs.extend(this.shared.credentials.scrub_pairs());
    }
    if !this.signin.is_empty() {
        pairs.extend(this.shared.signins.scrub_pairs());
    }
    Scrub::new(pairs)
}

/// An answer on a host with a credential or sign-in rule, made safe for the
/// guest: a token URL's read whole and given placeholders, any other
/// scrubbed of every real value as it streams; an error when it cannot be
/// passed on safely.
async fn scrubbed_answer(
    this: &Interception,
    flow: &Flow,
    token: Option<&TokenRequest>,
    head: bool,
    parts: &mut http::response::Parts,
    incoming: Incoming,
) -> Result<ProxyBody, String> {
    let signins = &this.shared.signins;
    // The request asked for identity; a compressed answer may hold tokens
    // the proxy cannot see.
    let encoded =
        parts.headers.get(header::CONTENT_ENCODING).is_some_and(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"));
    let Some(token) = token else {
        let scrub = answer_scrub(this);
        if scrub.is_empty() {
            return Ok(incoming.map_err(Into::into).boxed());
        }
        if encoded {
            return Err("the answer is compressed although the proxy asked for none; not passed on".into());
        }
        scrub.headers(&mut parts.headers);
        let status = parts.status;
        if head || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Ok(incoming.map_err(Into::into).boxed());
        }
        // A real value is replaced by a placeholder of another length.
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Scrubbed::new(incoming, Arc::new(scrub)).map_err(Into::into).boxed());
    };
    if encoded {
        return Err("the token endpoint's answer is compressed although the proxy asked for none; not passed on".into());
    }
    let (bytes, _charge) = match body::buffer_within(incoming, MAX_ANSWER, &this.shared.buffers, BODY_DEADLINE).await {
        Ok((Buffered::Whole(bytes), charge)) => (bytes, charge),
        Ok((Buffered::Larger, _)) => {
            return Err(format!("the token endpoint's answer is larger than {MAX_ANSWER} bytes; not passed on"));
        }
        Err(e) => return Err(format!("reading the token endpoint's answer: {e}")),
    };
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let (rewritten, saved) = signins.token_answer(token, parts.status.is_success(), content_type, &bytes)?;
    if let Some(saved) = saved {
        flow.update(|r| r.signin_saved = Some(saved.describe()));
    }
    // Tokens outside the fields read (and any the request was sent) too.
    let scrub = answer_scrub(this);
    let out = rewritten.unwrap_or_else(|| bytes.to_vec());
    let out = scrub.replace(&out).unwrap_or(out);
    scrub.headers(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(body::full(out))
}

/// Headers some servers take the request's real method from.
const METHOD_OVERRIDES: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// The methods a request names: its own, and any it asks a server to use
/// instead, so that a POST saying "DELETE" is judged as both.
fn methods_named<B>(req: &Request<B>) -> impl Iterator<Item = &str> {
    let overrides = METHOD_OVERRIDES
        .iter()
        .flat_map(|name| req.headers().get_all(*name))
        .map(|value| value.to_str().unwrap_or("(not text)").trim());
    std::iter::once(req.method().as_str()).chain(overrides)
}

/// Whether a request's authority is the intercepted destination.
fn names_destination(authority: Option<&str>, host: &Host, port: Port) -> bool {
    let Some(authority) = authority else { return false };
    let Ok(parsed) = authority.parse::<http::uri::Authority>() else { return false };
    let named_port = match parsed.port_u16() {
        Some(p) => Port::new(p),
        None => Some(Port::HTTPS),
    };
    Host::parse(parsed.host()).ok().as_ref() == Some(host) && named_port == Some(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_intercepted_authority_is_served() {
        let host = Host::parse("api.example.com").unwrap();
        assert!(names_destination(Some("api.example.com"), &host, Port::HTTPS));
        assert!(names_destination(Some("API.example.com:443"), &host, Port::HTTPS));
        assert!(!names_destination(Some("api.example.com:8443"), &host, Port::HTTPS));
        assert!(!names_destination(Some("evil.example.net"), &host, Port::HTTPS));
        assert!(!names_destination(None, &host, Port::HTTPS));
        assert!(!names_destination(Some("api.example.com@evil"), &host, Port::HTTPS));
    }
}
