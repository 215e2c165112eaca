//! CONNECT tunnels that are not intercepted: the guest's bytes go to the
//! server untouched, except that the first ones are read first: a TLS
//! ClientHello must name the host the tunnel was opened for, and an SSH
//! client's connection goes to `ssh`, which checks the server's host key.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Shared;
use super::sni::{self, Inspection};
use super::ssh;
use crate::policy::Host;
use crate::protocol::audit::{Decision, Record};

/// Copy buffer per direction: large enough for loopback-speed transfers.
const BUFFER: usize = 64 * 1024;

/// Relays a tunnel until both sides are done, then writes its record.
pub async fn relay<C>(shared: &Shared, mut client: C, mut server: TcpStream, host: &Host, mut record: Record)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = Vec::with_capacity(4096);
    let mut buf = vec![0u8; BUFFER];
    let mut down = 0u64;
    // What the server said before the client did (an SSH server's version).
    let mut greeting = Vec::new();
    // Until the client has said enough to judge, only the server may speak
    // (some protocols greet first); nothing of the client's is forwarded.
    let inspection = loop {
        tokio::select! {
            read = client.read_buf(&mut hello) => match read {
                Ok(0) | Err(_) => break None,
                Ok(_) => match sni::inspect(&hello) {
                    Inspection::NeedMore => continue,
                    done => break Some(done),
                },
            },
            read = server.read(&mut buf) => match read {
                Ok(0) | Err(_) => break None,
                Ok(n) => {
                    if client.write_all(&buf[..n]).await.is_err() {
                        break None;
                    }
                    if greeting.len() < BUFFER {
                        greeting.extend_from_slice(&buf[..n]);
                    }
                    down += n as u64;
                }
            },
        }
    };
    if let Some(refusal) = inspection.as_ref().and_then(|i| refusal(i, host)) {
        record.decision = Decision::Deny;
        record.reason = Some(refusal);
        record.bytes_down = down;
        shared.audit.record(&record);
        return;
    }
    if matches!(inspection, Some(Inspection::NotTls)) && ssh::is_ssh(&hello) {
        return ssh::relay(shared, client, server, hello, greeting, record).await;
    }
    let mut up = 0u64;
    if inspection.is_some() && server.write_all(&hello).await.is_ok() {
        up = hello.len() as u64;
        drop(hello);
        drop(buf);
        if let Ok((a, b)) = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, BUFFER, BUFFER).await {
            up += a;
            down += b;
        }
    }
    record.bytes_up = up;
    record.bytes_down = down;
    shared.audit.record(&record);
}

/// Why the first bytes of a tunnel to `host` are refused, if they are.
fn refusal(inspection: &Inspection, host: &Host) -> Option<String> {
    match inspection {
        // A plain protocol: nothing names another host at this layer.
        Inspection::NotTls | Inspection::NeedMore => None,
        Inspection::Malformed => Some("the tunnel began with a malformed TLS ClientHello".into()),
        Inspection::ClientHello { sni: Some(name) } => match Host::parse(name) {
            Ok(named) if named == *host => None,
            _ => Some(format!("TLS server name {name:?} does not match the CONNECT host {host}")),
        },
        // Clients send no SNI for IP addresses; for a name its absence
        // would let the server pick any site it hosts.
        Inspection::ClientHello { sni: None } => match host {
            Host::Ip(_) => None,
            Host::Name(_) => Some(format!("TLS ClientHello without a server name for {host}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_must_be_the_connect_host() {
        let host = Host::parse("api.example.com").unwrap();
        let hello = |sni: Option<&str>| Inspection::ClientHello { sni: sni.map(String::from) };
        assert_eq!(refusal(&hello(Some("API.example.com")), &host), None);
        assert!(refusal(&hello(Some("evil.example.net")), &host).unwrap().contains("does not match"));
        assert!(refusal(&hello(None), &host).unwrap().contains("without a server name"));
        assert_eq!(refusal(&hello(None), &Host::parse("10.0.0.1").unwrap()), None);
        assert_eq!(refusal(&Inspection::NotTls, &host), None);
        assert!(refusal(&Inspection::Malformed, &host).is_some());
    }
}
