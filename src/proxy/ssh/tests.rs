//! SSH through the proxy on loopback: a stand-in SSH server (its cleartext
//! key exchange only), a stand-in host ssh-agent, and a guest that speaks
//! to both as a hostile one would.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ssh_key::PublicKey;
use ssh_key::public::KeyData;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::transport::tests::{keypair, packet, reply};
use super::wire::put_string;
use crate::protocol::audit::{Decision, Kind};
use crate::proxy::tests::{Setup, audit_records, connect, policy_for, runtime, start_proxy_configured};

/// The exchange hash the stand-in server signs: the session id.
const SESSION_ID: &[u8] = b"0123456789abcdef0123456789abcdef";

/// A server that answers one connection's version line with its own, a
/// KEXINIT, a key-exchange reply signed by host key `seed`, NEWKEYS, and
/// then echoes.
async fn ssh_server(seed: u8) -> u16 {
    ssh_server_signing(seed, |_| SESSION_ID.to_vec()).await
}

/// [`ssh_server`] whose reply on its `n`th connection signs `id(n)`: a
/// hostile server signs whatever it likes.
async fn ssh_server_signing(seed: u8, id: fn(usize) -> Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((mut tcp, _)) = listener.accept().await {
            let session_id = id(accepted);
            accepted += 1;
            tokio::spawn(async move {
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while !line.ends_with(b"\n") {
                    if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    line.push(byte[0]);
                }
                let mut out = b"SSH-2.0-standin\r\n".to_vec();
                out.extend(packet(&[20, 0, 0, 0, 0]));
                out.extend(reply(&keypair(seed), &session_id));
                out.extend(packet(&[super::transport::MSG_NEWKEYS]));
                out.extend_from_slice(b"encrypted-from-here");
                if tcp.write_all(&out).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 || tcp.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A host agent: lists no keys, signs anything with "sig"; counts the
/// requests it got by message number.
async fn host_agent(path: std::path::PathBuf) -> Arc<[AtomicUsize; 32]> {
    let counts: Arc<[AtomicUsize; 32]> = Arc::new(std::array::from_fn(|_| AtomicUsize::new(0)));
    let listener = UnixListener::bind(path).unwrap();
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Ok(len) = stream.read_u32().await {
                    let mut msg = vec![0u8; len as usize];
                    if stream.read_exact(&mut msg).await.is_err() {
                        return;
                    }
                    seen[usize::from(msg[0]) % 32].fetch_add(1, Ordering::SeqCst);
                    let answer: Vec<u8> = match msg[0] {
                        11 => vec![12, 0, 0, 0, 0],
                        13 => {
                            let mut a = vec![14];
                            put_string(&mut a, b"sig");
                            a
                        }
                        _ => vec![6],
                    };
                    let _ = stream.write_u32(u32::try_from(answer.len()).unwrap()).await;
                    let _ = stream.write_all(&answer).await;
                }
            });
        }
    });
    counts
}

fn known_hosts_line(port: u16, seed: u8) -> String {
    let key = PublicKey::new(KeyData::Ed25519(keypair(seed).public), "");
    format!("[git.test]:{port} {}\n", key.to_openssh().unwrap())
}

/// A proxy allowing git.test on `port` (and on 22, which turns the agent
/// on) whose known_hosts lists host key `seed` for it, relaying the agent
/// at `<dir>/host-agent.sock`; its guest agent socket is served.
fn proxy(name: &str, port: u16, seed: u8) -> (Setup, std::path::PathBuf) {
    let policy =
        policy_for(&[("git.test", port)], None, "").replace("allow_private = [", "allow_private = [\"git.test:22\", ");
    let files = [(".ssh/known_hosts", known_hosts_line(port, seed))];
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
    let mut agent_path = None;
    let setup = start_proxy_configured(name, &policy, vec![], &files, |config| {
        let path = config.data_dir.join("host-agent.sock");
        config.ssh_agent = Some(path.clone());
        agent_path = Some(path);
    })
    .unwrap();
    let guest_agent = setup.dir.join("guest-agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&guest_agent).unwrap();
    assert!(setup.proxy.serve_agent_unix(listener).unwrap(), "the policy allows port 22: the agent is relayed");
    (setup, agent_path.unwrap())
}

/// Opens an SSH connection through the proxy; returns what the client got
/// (the stream stays open while held).
async fn ssh_through(setup: &Setup, port: u16) -> (Vec<u8>, TcpStream) {
    let (status, body, mut tcp) = connect(setup.addr, &format!("git.test:{port}")).await;
    assert_eq!(status, 200, "{body}");
    tcp.write_all(b"SSH-2.0-guest\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
        if got.ends_with(b"encrypted-from-here") {
            break;
        }
    }
    (got, tcp)
}

/// A sign request for `session_id` as the agent protocol frames it.
fn sign_request(session_id: &[u8], user: &str) -> Vec<u8> {
    auth_request(session_id, user.as_bytes(), b"ssh-connection", None)
}

/// A sign request for a user authentication as `user` to `service`, with
/// the publickey-hostbound method naming `host_key` when given.
fn auth_request(session_id: &[u8], user: &[u8], service: &[u8], host_key: Option<&[u8]>) -> Vec<u8> {
    let key = PublicKey::new(KeyData::Ed25519(keypair(9).public), "").to_bytes().unwrap();
    let mut data = Vec::new();
    put_string(&mut data, session_id);
    data.push(50);
    put_string(&mut data, user);
    put_string(&mut data, service);
    put_string(&mut data, if host_key.is_some() { &b"publickey-hostbound-v00@openssh.com"[..] } else { b"publickey" });
    data.push(1);
    put_string(&mut data, b"ssh-ed25519");
    put_string(&mut data, &key);
    if let Some(host_key) = host_key {
        put_string(&mut data, host_key);
    }
    sign_message(&key, &data)
}

fn sign_message(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut msg = vec![13];
    put_string(&mut msg, key);
    put_string(&mut msg, data);
    msg.extend_from_slice(&0u32.to_be_bytes());
    msg
}

fn host_key(seed: u8) -> Vec<u8> {
    PublicKey::new(KeyData::Ed25519(keypair(seed).public), "").to_bytes().unwrap()
}

async fn agent_ask(setup: &Setup, request: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(setup.dir.join("guest-agent.sock")).await.unwrap();
    stream.write_u32(u32::try_from(request.len()).unwrap()).await.unwrap();
    stream.write_all(request).await.unwrap();
    let len = stream.read_u32().await.unwrap();
    let mut answer = vec![0u8; len as usize];
    stream.read_exact(&mut answer).await.unwrap();
    answer
}

#[test]
fn the_agent_signs_only_for_a_checked_live_connection() {
    let rt = runtime();
    let port = rt.block_on(ssh_server(1));
    let (setup, host_agent_path) = proxy("ssh-sign", port, 1);
    let counts = rt.block_on(host_agent(host_agent_path));
    rt.block_on(async {
        // Before any connection: no session id is bound, nothing is signed.
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "git")).await, [5]);
        let (got, mut tcp) = ssh_through(&setup, port).await;
        assert!(got.starts_with(b"SSH-2.0-standin\r\n") && got.ends_with(b"encrypted-from-here"));
        assert_eq!(agent_ask(&setup, &[11]).await, [12, 0, 0, 0, 0], "keys are listed");
        let signed = agent_ask(&setup, &sign_request(SESSION_ID, "git")).await;
        assert_eq!(signed[0], 14, "a request bound to the live connection is signed");
        assert_eq!(agent_ask(&setup, &sign_request(b"some other session", "git")).await, [5]);
        assert_eq!(agent_ask(&setup, &[17, 0, 0, 0, 0]).await, [5], "adding a key is refused");
        let mut not_auth = vec![13];
        put_string(&mut not_auth, b"key");
        put_string(&mut not_auth, b"arbitrary data to sign");
        assert_eq!(agent_ask(&setup, &not_auth).await, [5], "only user authentication is signed");
        // The tunnel still carries bytes after the key exchange.
        tcp.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tcp.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        drop(tcp);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "git")).await, [5], "not once it closed");
    });
    assert_eq!(counts[13].load(Ordering::SeqCst), 1, "only the bound request reached the host's agent");
    assert_eq!(counts[17].load(Ordering::SeqCst), 0);
    let records = audit_records(&setup);
    let signs: Vec<_> = records.iter().filter(|r| r.kind == Kind::Agent).collect();
    assert!(
        signs.iter().any(|r| r.decision == Decision::Allow
            && r.host == "git.test"
            && r.path.as_deref().is_some_and(|p| p.starts_with("as git with ssh-ed25519 SHA256:"))),
        "{signs:?}"
    );
    assert!(signs.iter().filter(|r| r.decision == Decision::Deny).count() >= 4, "{signs:?}");
}

#[test]
fn a_server_whose_host_key_is_not_known_is_cut_off_before_its_reply() {
    let rt = runtime();
    let port = rt.block_on(ssh_server(2));
    let (setup, host_agent_path) = proxy("ssh-unknown", port, 1);
    let counts = rt.block_on(host_agent(host_agent_path));
    rt.block_on(async {
        let (got, _tcp) = ssh_through(&setup, port).await;
        assert!(!got.ends_with(b"encrypted-from-here"), "the reply and what follows never reach the guest");
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "git")).await, [5]);
    });
    assert_eq!(counts[13].load(Ordering::SeqCst), 0);
    let records = audit_records(&setup);
    let refused = records.iter().find(|r| r.kind == Kind::Connect && r.decision == Decision::Deny);
    let reason = refused.and_then(|r| r.reason.clone()).unwrap_or_default();
    assert!(reason.contains("is not the one the host's known_hosts lists"), "{records:?}");
}

#[test]
fn one_connection_gets_one_signature_for_its_own_user_authentication() {
    let rt = runtime();
    let port = rt.block_on(ssh_server(1));
    let (setup, host_agent_path) = proxy("ssh-once", port, 1);
    let counts = rt.block_on(host_agent(host_agent_path));
    rt.block_on(async {
        let (_, _tcp) = ssh_through(&setup, port).await;
        // Not a user authentication as ssh sends one: refused, and none of
        // these uses up the connection's signature.
        let refused = [
            auth_request(SESSION_ID, b"git", b"ssh-userauth", None),
            auth_request(SESSION_ID, b"", b"ssh-connection", None),
            auth_request(SESSION_ID, b"git\x1b[2J", b"ssh-connection", None),
            auth_request(SESSION_ID, &[b'u'; 300], b"ssh-connection", None),
            auth_request(SESSION_ID, b"git", b"ssh-connection", Some(&host_key(2))),
        ];
        for request in &refused {
            assert_eq!(agent_ask(&setup, request).await, [5]);
        }
        let mut trailing = sign_request(SESSION_ID, "git");
        // Bytes after the public key inside the data to sign.
        let key = host_key(9);
        let mut data = Vec::new();
        let mut r = super::wire::Reader::new(&trailing[1..]);
        r.string();
        data.extend_from_slice(r.string().unwrap());
        data.extend_from_slice(b"and more");
        trailing = sign_message(&key, &data);
        assert_eq!(agent_ask(&setup, &trailing).await, [5], "data past the request");
        let hostbound = auth_request(SESSION_ID, b"git", b"ssh-connection", Some(&host_key(1)));
        assert_eq!(agent_ask(&setup, &hostbound).await[0], 14, "the connection's own authentication is signed");
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "git")).await, [5], "a second signature");
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "other")).await, [5], "a second, as another user");
    });
    assert_eq!(counts[13].load(Ordering::SeqCst), 1, "one signature reached the host's agent");
    let records = audit_records(&setup);
    let reasons: Vec<String> =
        records.iter().filter(|r| r.kind == Kind::Agent).filter_map(|r| r.reason.clone()).collect();
    assert!(reasons.iter().any(|r| r.contains("once per SSH connection")), "{reasons:?}");
}

#[test]
fn a_session_id_signed_by_two_connections_is_signed_for_once() {
    let rt = runtime();
    // A hostile server signs the same id (another session's, elsewhere) on
    // each connection: the guest gets one signature over it, not one a
    // connection.
    let port = rt.block_on(ssh_server(1));
    let (setup, host_agent_path) = proxy("ssh-same-id", port, 1);
    let counts = rt.block_on(host_agent(host_agent_path));
    rt.block_on(async {
        let (_, _first) = ssh_through(&setup, port).await;
        let (_, _second) = ssh_through(&setup, port).await;
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "git")).await[0], 14);
        assert_eq!(agent_ask(&setup, &sign_request(SESSION_ID, "git")).await, [5]);
    });
    assert_eq!(counts[13].load(Ordering::SeqCst), 1);
}

#[test]
fn a_run_gets_a_bounded_number_of_signatures() {
    let rt = runtime();
    let port = rt.block_on(ssh_server_signing(1, |n| format!("session id of connection {n:08}").into_bytes()));
    let (setup, host_agent_path) = proxy("ssh-budget", port, 1);
    let counts = rt.block_on(host_agent(host_agent_path));
    rt.block_on(async {
        for n in 0..=super::MAX_SIGNATURES {
            let (_, _tcp) = ssh_through(&setup, port).await;
            let id = format!("session id of connection {n:08}");
            let answer = agent_ask(&setup, &sign_request(id.as_bytes(), "git")).await;
            assert_eq!(answer[0] == 14, n < super::MAX_SIGNATURES, "signature {n}");
        }
    });
    assert_eq!(counts[13].load(Ordering::SeqCst), super::MAX_SIGNATURES);
}
