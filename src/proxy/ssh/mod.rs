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
//! whose session id one of those kept signatures verifies: the exchange hash
//! of a connection the proxy opened to an allowed host whose key it checked.
//! A signature is then of use on that connection alone, and each is logged.

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
use super::audit::{Decision, Record};
use crate::policy::{Host, Port};
use transport::{MSG_NEWKEYS, ServerFrames};

/// Copy buffer per direction while the key exchange is read.
const BUFFER: usize = 16 * 1024;
/// Copy buffer per direction afterwards, as for other tunnels.
const TUNNEL_BUFFER: usize = 64 * 1024;

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

/// The live connections whose host key was checked.
#[derive(Default)]
pub struct Sessions {
    live: Mutex<Vec<(u64, Checked)>>,
    next: AtomicU64,
}

/// One checked connection: its server's key and signature over the
/// exchange hash (the session id).
struct Checked {
    host: Host,
    port: Port,
    key: PublicKey,
    signature: Signature,
}

/// The connection a session id belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub host: Host,
    pub port: Port,
}

impl Sessions {
    fn register(&self, checked: Checked) -> Registration<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).push((id, checked));
        Registration { sessions: self, id }
    }

    /// The live checked connection whose server signed `session_id`.
    pub fn bound(&self, session_id: &[u8]) -> Option<Bound> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.iter()
            .map(|(_, c)| c)
            .find(|c| Verifier::verify(c.key.key_data(), session_id, &c.signature).is_ok())
            .map(|c| Bound { host: c.host.clone(), port: c.port })
    }
}

/// Removes its session when the connection ends.
struct Registration<'a> {
    sessions: &'a Sessions,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.sessions.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(id, _)| *id != self.id);
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
                    let checked = Checked { host: self.host.clone(), port: self.port, key, signature };
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
