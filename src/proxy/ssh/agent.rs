//! The guest's ssh-agent: a relay to the host's agent (PROTOCOL.agent,
//! draft-ietf-sshm-ssh-agent) that lists the host's keys and signs only
//! user-authentication requests bound to a connection the proxy checked,
//! once per connection (`Sessions::claim`). Every other request (adding, removing or exporting
//! keys, locking, extensions) is answered with a failure, and the guest
//! never sees a private key.

use std::path::Path;
use std::sync::Arc;

use ssh_key::{HashAlg, PublicKey};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use super::wire::Reader;
use crate::protocol::audit::{Decision, Kind, Record};
use crate::proxy::Shared;

/// The largest agent message either side may send.
const MAX_MESSAGE: usize = 256 * 1024;
const FAILURE: u8 = 5;
const REQUEST_IDENTITIES: u8 = 11;
const SIGN_REQUEST: u8 = 13;
const SIGN_RESPONSE: u8 = 14;
/// SSH_MSG_USERAUTH_REQUEST, which the data to sign must be.
const USERAUTH_REQUEST: u8 = 50;
/// The lengths of an exchange hash (SHA-1 to SHA-512).
const SESSION_ID_LEN: std::ops::RangeInclusive<usize> = 20..=64;
/// The longest user name signed for (git hosts use "git").
const MAX_USER: usize = 64;
/// The host name in records of signatures bound to no connection.
const UNBOUND: &str = "ssh-agent";

/// What the guest asked to have signed, once bound to a connection.
#[derive(Debug, PartialEq, Eq)]
struct Signing {
    host: String,
    port: u16,
    user: String,
    key: String,
}

/// Serves one guest agent connection until it closes.
pub async fn serve<S>(shared: Arc<Shared>, mut guest: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(socket) = shared.ssh.agent.clone() else { return };
    let mut host: Option<UnixStream> = None;
    while let Ok(request) = read_message(&mut guest).await {
        let answer = match request.first() {
            Some(&REQUEST_IDENTITIES) => ask(&mut host, &socket, &request).await,
            Some(&SIGN_REQUEST) => match judge(&shared, &request) {
                Ok(signing) => {
                    let answer = ask(&mut host, &socket, &request).await;
                    let signed = answer.as_ref().is_some_and(|a| a.first() == Some(&SIGN_RESPONSE));
                    let outcome = if signed { Ok(()) } else { Err("the host's ssh-agent did not sign") };
                    record(&shared, &signing, outcome);
                    answer
                }
                Err(reason) => {
                    let mut record = Record::new(Kind::Agent, UNBOUND, 0, Decision::Deny);
                    record.method = Some("sign".into());
                    record.reason = Some(reason);
                    shared.audit.record(&record);
                    None
                }
            },
            _ => None,
        };
        if write_message(&mut guest, answer.as_deref().unwrap_or(&[FAILURE])).await.is_err() {
            return;
        }
    }
}

fn record(shared: &Shared, signing: &Signing, outcome: Result<(), &str>) {
    let decision = if outcome.is_ok() { Decision::Allow } else { Decision::Fail };
    let mut record = Record::new(Kind::Agent, signing.host.clone(), signing.port, decision);
    record.method = Some("sign".into());
    record.path = Some(format!("as {} with {}", signing.user, signing.key));
    record.reason = outcome.err().map(String::from);
    shared.audit.record(&record);
}

/// Whether a sign request may go to the host's agent: its data must be
/// exactly an SSH user-authentication request, as ssh makes one, for the
/// key the request names, and its session id must take the one signature of
/// a checked live connection (`Sessions::claim`).
fn judge(shared: &Shared, request: &[u8]) -> Result<Signing, String> {
    let not_auth = || "the data to sign is not an SSH user authentication request".to_string();
    let mut r = Reader::new(request);
    r.byte();
    let key_blob = r.string().ok_or_else(not_auth)?;
    let data = r.string().ok_or_else(not_auth)?;
    let mut d = Reader::new(data);
    let session_id = d.string().ok_or_else(not_auth)?;
    if !SESSION_ID_LEN.contains(&session_id.len()) || d.byte() != Some(USERAUTH_REQUEST) {
        return Err(not_auth());
    }
    let user = d.string().ok_or_else(not_auth)?;
    let user = std::str::from_utf8(user)
        .ok()
        .filter(|u| !u.is_empty() && u.len() <= MAX_USER && !u.chars().any(char::is_control))
        .ok_or_else(|| "the user name to sign in as is empty, too long or not plain text".to_string())?;
    if d.string() != Some(b"ssh-connection") {
        return Err("the user authentication is for another service than ssh-connection".into());
    }
    let hostbound = match d.string().ok_or_else(not_auth)? {
        b"publickey" => false,
        b"publickey-hostbound-v00@openssh.com" => true,
        _ => return Err(not_auth()),
    };
    if d.boolean() != Some(true) {
        return Err(not_auth());
    }
    let _algorithm = d.string().ok_or_else(not_auth)?;
    if d.string() != Some(key_blob) {
        return Err("the key to sign with is not the key the request names".into());
    }
    let host_key = if hostbound { Some(d.string().ok_or_else(not_auth)?) } else { None };
    if !d.is_empty() {
        return Err(not_auth());
    }
    let bound = shared.ssh.sessions.claim(session_id, host_key).map_err(|refusal| refusal.to_string())?;
    let key = PublicKey::from_bytes(key_blob)
        .map(|k| format!("{} {}", k.algorithm(), k.fingerprint(HashAlg::Sha256)))
        .unwrap_or_else(|_| "an unknown key type".into());
    Ok(Signing { host: bound.host.to_string(), port: bound.port.get(), user: user.to_string(), key })
}

/// Sends one request to the host's agent and returns its answer; `None`
/// when the agent cannot be reached (the guest then gets a failure).
async fn ask(host: &mut Option<UnixStream>, socket: &Path, request: &[u8]) -> Option<Vec<u8>> {
    if host.is_none() {
        match UnixStream::connect(socket).await {
            Ok(stream) => *host = Some(stream),
            Err(e) => {
                tracing::warn!("cannot reach the host's ssh-agent at {}: {e}", socket.display());
                return None;
            }
        }
    }
    let stream = host.as_mut()?;
    let answer = match write_message(stream, request).await {
        Ok(()) => read_message(stream).await.ok(),
        Err(_) => None,
    };
    if answer.is_none() {
        *host = None;
    }
    answer
}

async fn read_message<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Vec<u8>> {
    let len = usize::try_from(stream.read_u32().await?).unwrap_or(usize::MAX);
    if len == 0 || len > MAX_MESSAGE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "agent message of a bad length"));
    }
    let mut message = vec![0u8; len];
    stream.read_exact(&mut message).await?;
    Ok(message)
}

async fn write_message<S: AsyncWrite + Unpin>(stream: &mut S, message: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(message.len()).map_err(|_| std::io::Error::other("agent message too long"))?;
    let mut framed = Vec::with_capacity(message.len() + 4);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await
}
