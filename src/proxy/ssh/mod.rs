//! SSH through the proxy: git over SSH with the key kept on the host.
//!
//! A connection whose client opens with an SSH version line is relayed with
//! the server's side read until its keys change (`transport`): the host key
//! in the key-exchange reply must be one the host's known_hosts lists for
//! that host (`known_hosts`), or the connection is refused. The host key and
//! its signature over the exchange hash are kept while the connection lives.
//!
//! The guest's `SSH_AUTH_SOCK` leads to `agent`, a relay to the host's
//! ssh-agent that lists its keys and signs only user-authentication requests
//! whose session id one of those kept signatures verifies, once per
//! connection and per session id, at most `MAX_SIGNATURES` in a run.
//!
//! The proxy does not take part in the key exchange, so it cannot compute
//! the exchange hash: a server may sign any id in its reply, another
//! session's included, and the binding is only "the server of a connection
//! the proxy relayed signed this". The bounds above limit what a hostile
//! allowed server can get for a colluding guest; the README says so.

pub mod agent;
pub mod known_hosts;
mod transport;
mod wire;

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use signature::Verifier;
use ssh_key::{PublicKey, Signature};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Shared;
use crate::policy::{Host, Port};
use crate::protocol::audit::{Decision, Record};
use transport::{MSG_NEWKEYS, ServerFrames};

/// Copy buffer per direction while the key exchange is read.
const BUFFER: usize = 16 * 1024;
/// Copy buffer per direction afterwards, as for other tunnels.
const TUNNEL_BUFFER: usize = 64 * 1024;
/// The most signatures the host's agent makes in one run: a git command
/// opens one connection a fetch or push, and each signature may be of use
/// to a hostile allowed server elsewhere (see the README's security model).
const MAX_SIGNATURES: usize = 64;

/// Whether a client's first bytes are an SSH version line.
pub fn is_ssh(first: &[u8]) -> bool {
    first.starts_with(b"SSH-")
}

/// What SSH needs on the host.
pub struct Ssh {
    /// The known_hosts files server keys are checked against.
    pub known_hosts: Vec<PathBuf>,
    /// The host's ssh-agent socket; `None`: the guest gets no agent.
    pub agent: Option<PathBuf>,
    pub sessions: Sessions,
}

/// The live connections whose host key was checked, and what was signed
/// for them.
#[derive(Default)]
pub struct Sessions {
    state: Mutex<State>,
    next: AtomicU64,
}

#[derive(Default)]
struct State {
    live: Vec<(u64, Checked)>,
    /// The session ids signed for in this run (at most `MAX_SIGNATURES`).
    signed: Vec<Vec<u8>>,
}

/// One checked connection: its server's key and signature over the
/// exchange hash (the session id).
struct Checked {
    host: Host,
    port: Port,
    key: PublicKey,
    signature: Signature,
    /// The server's keys changed: its client may authenticate.
    keyed: bool,
    /// A signature was made for it.
    used: bool,
}

/// The connection a signature is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub host: Host,
    pub port: Port,
}

/// Why no signature is made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the session id belongs to no SSH connection stockade relayed to an allowed host with a checked host key \
         whose key exchange is done"
    )]
    NoConnection,
    #[error("stockade signs once per SSH connection, and this connection's signature was made already")]
    Again,
    #[error("the request names another host key than that of {0}, the server of this connection")]
    OtherHostKey(String),
    #[error("stockade signs at most {MAX_SIGNATURES} times in one run, and this run had them all")]
    Spent,
}

impl Sessions {
    fn register(&self, checked: Checked) -> Registration<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().live.push((id, checked));
        Registration { sessions: self, id }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn keyed(&self, id: u64) {
        if let Some((_, checked)) = self.lock().live.iter_mut().find(|(i, _)| *i == id) {
            checked.keyed = true;
        }
    }

    /// Takes the one signature of the live, keyed connection whose server
    /// signed `session_id`. A session id is signed for once in a run, by
    /// whichever connections' servers signed it, and a run has at most
    /// `MAX_SIGNATURES`. `host_key`: the server key a hostbound request
    /// names, which must be that connection's.
    pub fn claim(&self, session_id: &[u8], host_key: Option<&[u8]>) -> Result<Bound, Refusal> {
        let mut state = self.lock();
        let State { live, signed } = &mut *state;
        let checked = live
            .iter_mut()
            .map(|(_, c)| c)
            .find(|c| c.keyed && Verifier::verify(c.key.key_data(), session_id, &c.signature).is_ok())
            .ok_or(Refusal::NoConnection)?;
        if checked.used || signed.iter().any(|id| id == session_id) {
            return Err(Refusal::Again);
        }
        if host_key.is_some_and(|blob| {
            PublicKey::from_bytes(blob).map(|k| k.key_data() != checked.key.key_data()).unwrap_or(true)
        }) {
            return Err(Refusal::OtherHostKey(format!("{}:{}", checked.host, checked.port)));
        }
        if signed.len() >= MAX_SIGNATURES {
            return Err(Refusal::Spent);
        }
        checked.used = true;
        signed.push(session_id.to_vec());
        Ok(Bound { host: checked.host.clone(), port: checked.port })
    }
}

/// Removes its session when the connection ends.
struct Registration<'a> {
    sessions: &'a Sessions,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.sessions.lock().live.retain(|(id, _)| *id != self.id);
    }
}

/// Reads the server's side until its keys change.
struct Inspector<'a> {
    ssh: &'a Ssh,
    host: &'a Host,
    port: Port,
    frames: ServerFrames,
    registration: Option<Registration<'a>>,
}

enum Fed {
    /// Forward these bytes to the client and read on.
    More(Vec<u8>),
    /// Forward these; the server's keys changed.
    Keyed(Vec<u8>),
}

impl Fed {
    /// Without the first `forwarded` bytes (sent already), which it counts down.
    fn after(self, forwarded: &mut usize) -> Fed {
        let skip = |mut out: Vec<u8>, forwarded: &mut usize| {
            let n = (*forwarded).min(out.len());
            *forwarded -= n;
            out.drain(..n);
            out
        };
        match self {
            Fed::More(out) => Fed::More(skip(out, forwarded)),
            Fed::Keyed(out) => Fed::Keyed(skip(out, forwarded)),
        }
    }
}

impl<'a> Inspector<'a> {
    fn feed(&mut self, data: &[u8]) -> Result<Fed, String> {
        self.frames.push(data);
        let mut out = Vec::new();
        while let Some(frame) = self.frames.next()? {
            if let Some((key, signature)) = frame.exchange_reply() {
                if self.registration.is_none() {
                    known_hosts::check(&self.ssh.known_hosts, self.host, self.port, &key)?;
                    let checked =
                        Checked { host: self.host.clone(), port: self.port, key, signature, keyed: false, used: false };
                    self.registration = Some(self.ssh.sessions.register(checked));
                }
            }
            if frame.msg == Some(MSG_NEWKEYS) {
                if self.registration.is_none() {
                    return Err(format!(
                        "the SSH key exchange with {} was not understood, so its host key could not be checked",
                        self.host
                    ));
                }
                if let Some(registration) = &self.registration {
                    registration.sessions.keyed(registration.id);
                }
                out.extend_from_slice(&frame.bytes);
                out.extend(std::mem::take(&mut self.frames).rest());
                return Ok(Fed::Keyed(out));
            }
            out.extend_from_slice(&frame.bytes);
        }
        Ok(Fed::More(out))
    }
}

/// Relays an SSH connection whose client has sent `hello` so far, and to
/// which the server has sent `greeting` (already forwarded): refused (and
/// recorded) when the server's host key is not the known one.
pub async fn relay<C>(
    shared: &Shared,
    mut client: C,
    mut server: TcpStream,
    hello: Vec<u8>,
    greeting: Vec<u8>,
    mut record: Record,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(host) = Host::parse(&record.host) else { return };
    let Some(port) = Port::new(record.port) else { return };
    let mut inspector =
        Inspector { ssh: &shared.ssh, host: &host, port, frames: ServerFrames::default(), registration: None };
    let (mut up, mut down) = (0u64, greeting.len() as u64);
    // Frames that end past the greeting are forwarded from where it ended.
    let mut forwarded = greeting.len();
    let first = inspector.feed(&greeting).map(|fed| fed.after(&mut forwarded));
    let mut from_client = vec![0u8; BUFFER];
    let mut from_server = vec![0u8; BUFFER];
    let mut open = server.write_all(&hello).await.is_ok();
    up += hello.len() as u64;
    if let Err(reason) = &first {
        record.decision = Decision::Deny;
        record.reason = Some(reason.clone());
        open = false;
    }
    while open {
        tokio::select! {
            read = client.read(&mut from_client) => match read {
                Ok(0) | Err(_) => open = false,
                Ok(n) => {
                    open = server.write_all(&from_client[..n]).await.is_ok();
                    up += n as u64;
                }
            },
            read = server.read(&mut from_server) => match read {
                Ok(0) | Err(_) => open = false,
                Ok(n) => match inspector.feed(&from_server[..n]).map(|fed| fed.after(&mut forwarded)) {
                    Ok(Fed::More(out)) => {
                        open = client.write_all(&out).await.is_ok();
                        down += out.len() as u64;
                    }
                    Ok(Fed::Keyed(out)) => {
                        if client.write_all(&out).await.is_ok() {
                            down += out.len() as u64;
                            if let Ok((a, b)) = tokio::io::copy_bidirectional_with_sizes(
                                &mut client, &mut server, TUNNEL_BUFFER, TUNNEL_BUFFER).await
                            {
                                up += a;
                                down += b;
                            }
                        }
                        open = false;
                    }
                    Err(reason) => {
                        record.decision = Decision::Deny;
                        record.reason = Some(reason);
                        open = false;
                    }
                },
            },
        }
    }
    record.bytes_up = up;
    record.bytes_down = down;
    shared.audit.record(&record);
}

#[cfg(test)]
mod tests;
