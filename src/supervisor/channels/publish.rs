//! Published ports, host side (`run -p`): the host listeners, bound before
//! the VM boots so that a taken port fails the run at once; and, once the
//! command runs, one guest connection per host client.
//!
//! For each client the host asks the init on the control connection
//! (`HostMsg::Connect`) and waits for its dial-back on `PUBLISH_PORT`
//! (token first, see `admission`); then bytes flow both ways until both
//! sides are done. Clients that come while the guest boots wait in the
//! listen backlog, so a browser opened early is answered once the server is.

use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::admission::{self, Channel, Tampering, Watching};
use crate::protocol::auth::Token;
use crate::protocol::publish::{Callback, Published};
use crate::protocol::{HostMsg, write_frame};

/// How long a client waits for the init's dial-back before it is closed.
const DIAL_BACK_WAIT: Duration = Duration::from_secs(30);
/// Clients waiting for a dial-back at once; past this new ones are closed
/// (a guest that never dials back must not pile up host sockets).
const MAX_WAITING: usize = 256;

/// The host listeners of every `-p`, and what was seen on them.
pub struct Bound {
    listeners: Vec<(Published, TcpListener)>,
    pub seen: Seen,
}

/// What the user hears at the end: per published port, how many clients
/// came and how many found nothing listening in the guest.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<BTreeMap<String, (Published, Counts)>>>);

#[derive(Clone, Copy, Default)]
struct Counts {
    clients: u64,
    unreached: u64,
}

impl Seen {
    fn count(&self, port: &Published, reached: bool) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (_, counts) = seen.entry(port.host()).or_insert((*port, Counts::default()));
        counts.clients += 1;
        counts.unreached += u64::from(!reached);
    }

    /// A warning per port some client found closed in the guest.
    pub fn warnings(&self) -> Vec<String> {
        let seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.values()
            .filter(|(_, counts)| counts.unreached > 0)
            .map(|(port, counts)| {
                format!(
                    "{} of {} connections to {} found nothing listening on guest port {}: start the server in \
                     the guest on 127.0.0.1 or 0.0.0.0, port {}",
                    counts.unreached,
                    counts.clients,
                    port.host(),
                    port.guest_port,
                    port.guest_port
                )
            })
            .collect()
    }
}

/// Binds every `-p` now, so that a port another program holds fails the
/// run before the VM boots. The default address is the host's loopback,
/// IPv4 and IPv6 both (browsers try `localhost` either way).
pub fn bind(ports: &[Published]) -> anyhow::Result<Bound> {
    let mut listeners = Vec::new();
    for port in ports {
        match port.addr {
            Some(addr) => listeners.push((*port, listen(port, addr)?)),
            None => {
                listeners.push((*port, listen(port, IpAddr::V4(Ipv4Addr::LOCALHOST))?));
                match TcpListener::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, port.host_port))) {
                    Ok(listener) => listeners.push((*port, listener)),
                    // A host without IPv6 loopback: IPv4 serves alone.
                    Err(e) if matches!(e.kind(), ErrorKind::AddrNotAvailable | ErrorKind::Unsupported) => {
                        tracing::debug!("published port {port}: no IPv6 loopback here ({e})");
                    }
                    Err(e) => return Err(refusal(port, IpAddr::V6(Ipv6Addr::LOCALHOST), e)),
                }
            }
        }
        tracing::info!("published {port}");
    }
    Ok(Bound { listeners, seen: Seen::default() })
}

fn listen(port: &Published, addr: IpAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(SocketAddr::from((addr, port.host_port))).map_err(|e| refusal(port, addr, e))
}

fn refusal(port: &Published, addr: IpAddr, e: std::io::Error) -> anyhow::Error {
    let at = SocketAddr::from((addr, port.host_port));
    let fix = match e.kind() {
        ErrorKind::AddrInUse => {
            format!(
                "another program on this host is listening on {at}; pick a free host port: -p PORT:{}",
                port.guest_port
            )
        }
        ErrorKind::PermissionDenied => {
            format!("host ports below 1024 need privileges; pick one above 1023, e.g. -p 8080:{}", port.guest_port)
        }
        ErrorKind::AddrNotAvailable => format!("{addr} is not an address of this host"),
        _ => format!("cannot listen on {at}: {e}"),
    };
    anyhow::anyhow!("cannot publish {port}: {fix}")
}

/// The published ports being served; dropping it stops taking clients.
pub struct Serving {
    _accepts: Vec<admission::Listening>,
    _callbacks: admission::Listening,
}

/// A client waiting for its dial-back.
struct Waiting {
    client: TcpStream,
    port: Published,
    since: Instant,
}

#[derive(Default)]
struct Clients {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
}

impl Bound {
    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty()
    }

    /// Serves the clients: asks the init on `control` for each, and pairs
    /// its dial-backs on `callbacks` (which must carry `token`).
    pub fn serve(
        self,
        control: Arc<Mutex<UnixStream>>,
        callbacks: UnixListener,
        token: Token,
        tampering: Tampering,
    ) -> anyhow::Result<Serving> {
        let clients = Arc::new(Clients::default());
        let seen = self.seen.clone();
        let pairing = clients.clone();
        let reports = tampering.clone();
        let callbacks = admission::admit_each(callbacks, Channel::Publish, token, tampering, move |stream, _| {
            pair(stream, &pairing, &seen, &reports);
        })?;
        let mut accepts = Vec::new();
        for (port, listener) in self.listeners {
            accepts.push(accept(port, listener, clients.clone(), control.clone())?);
        }
        Ok(Serving { _accepts: accepts, _callbacks: callbacks })
    }
}

/// Takes clients on `listener` until the conversation is over.
fn accept(
    port: Published,
    listener: TcpListener,
    clients: Arc<Clients>,
    control: Arc<Mutex<UnixStream>>,
) -> anyhow::Result<admission::Listening> {
    listener.set_nonblocking(true).context("cannot set up a published port")?;
    admission::watch(listener, "publish-accept", move |listener| match listener.accept() {
        Ok((client, from)) => {
            tracing::debug!("published port {port}: client {from}");
            // The control connection gone: no guest to ask any more.
            if client.set_nonblocking(false).is_ok() && !ask(port, client, &clients, &control) {
                return Watching::Stop;
            }
            Watching::Go
        }
        Err(e) => {
            if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) {
                tracing::warn!("published port {port}: cannot accept a client: {e}");
            }
            Watching::Go
        }
    })
}

/// Asks the init to connect `client`; false once the control connection
/// is gone.
fn ask(port: Published, client: TcpStream, clients: &Clients, control: &Mutex<UnixStream>) -> bool {
    let id = clients.next.fetch_add(1, Ordering::SeqCst);
    {
        let mut waiting = clients.waiting.lock().unwrap_or_else(|p| p.into_inner());
        // Clients whose dial-back never came are closed here.
        waiting.retain(|_, w| w.since.elapsed() < DIAL_BACK_WAIT);
        if waiting.len() >= MAX_WAITING {
            tracing::warn!("published port {port}: {MAX_WAITING} clients await the guest; closing a new one");
            return true;
        }
        waiting.insert(id, Waiting { client, port, since: Instant::now() });
    }
    let mut control = control.lock().unwrap_or_else(|p| p.into_inner());
    write_frame(&mut *control, &HostMsg::Connect { id, port: port.guest_port }).is_ok() && control.flush().is_ok()
}

/// Pairs a dial-back with its waiting client and carries the bytes.
fn pair(mut guest: UnixStream, clients: &Clients, seen: &Seen, tampering: &Tampering) {
    let _ = guest.set_read_timeout(Some(DIAL_BACK_WAIT));
    let Ok(callback) = Callback::read(&mut guest) else {
        tampering.report("a publish connection with this run's token sent no valid header (only guest root can)");
        return;
    };
    let waiting = clients.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&callback.id);
    let Some(Waiting { client, port, .. }) = waiting else {
        // An id we gave out may have waited too long and been closed, which
        // a slow guest can cause; one we never gave out, the init never sends.
        if callback.id >= clients.next.load(Ordering::SeqCst) {
            tampering.report(
                "a publish connection named a host client that was not waiting for one (only guest root can forge it)",
            );
        }
        return;
    };
    seen.count(&port, callback.reached);
    if !callback.reached {
        tracing::info!("published port {port}: nothing listens on guest port {}", port.guest_port);
        return;
    }
    let _ = guest.set_read_timeout(None);
    if let Err(e) = splice(client, guest) {
        tracing::debug!("published port {port}: {e}");
    }
}

/// Carries bytes both ways; each direction's end is passed on as a
/// half-close, so a client that stops sending still gets its answer.
fn splice(client: TcpStream, guest: UnixStream) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let (mut client_in, mut guest_out) = (client.try_clone()?, guest.try_clone()?);
    let upstream = std::thread::Builder::new().name("publish-up".into()).spawn(move || {
        copy(&mut client_in, &mut guest_out);
        let _ = guest_out.shutdown(Shutdown::Write);
    })?;
    let (mut guest_in, mut client_out) = (guest, client);
    copy(&mut guest_in, &mut client_out);
    let _ = client_out.shutdown(Shutdown::Write);
    let _ = upstream.join();
    Ok(())
}

fn copy(from: &mut impl Read, to: &mut impl Write) {
    let _ = crate::protocol::stream::pump(from, to);
}

/// Never a port on the host's outside: a check for the tests.
#[cfg(test)]
fn loopback_only(bound: &Bound) -> bool {
    bound.listeners.iter().all(|(_, l)| l.local_addr().is_ok_and(|a| a.ip().is_loopback()))
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;

    use super::*;
    use crate::protocol::read_frame;

    fn published(text: &str) -> Published {
        text.parse().unwrap()
    }

    #[test]
    fn a_taken_port_fails_with_the_fix() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = bind(&[published(&format!("{port}:80"))]).err().unwrap().to_string();
        assert!(err.contains(&format!("cannot publish localhost:{port} -> guest port 80")), "{err}");
        assert!(err.contains("another program on this host is listening on 127.0.0.1"), "{err}");
        assert!(err.contains("pick a free host port: -p PORT:80"), "{err}");
    }

    #[test]
    fn the_default_address_is_loopback_only() {
        let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let bound = bind(&[published(&format!("{free}:8000"))]).unwrap();
        assert!(!bound.is_empty());
        assert!(loopback_only(&bound));
    }

    #[test]
    fn warnings_name_the_port_and_the_fix() {
        let seen = Seen::default();
        let port = published("8080:3000");
        seen.count(&port, true);
        assert!(seen.warnings().is_empty(), "every client reached the server");
        seen.count(&port, false);
        let warnings = seen.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].starts_with("1 of 2 connections to localhost:8080 found nothing listening on guest port 3000")
        );
    }

    /// The host half against a stand-in init on the other end of the
    /// control connection: a client gets the guest server's answer, one that
    /// finds nothing listening is closed and counted, and a dial-back for no
    /// waiting client is reported.
    #[test]
    fn clients_are_paired_with_the_inits_dial_backs() {
        let tmp = tempfile::tempdir().unwrap();
        let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let bound = bind(&[published(&format!("{free}:8000"))]).unwrap();
        let seen = bound.seen.clone();
        let (host_end, init_end) = UnixStream::pair().unwrap();
        let callbacks_path = tmp.path().join("v.sock_1030");
        let callbacks = UnixListener::bind(&callbacks_path).unwrap();
        let token = Token::from_bytes([7; 32]);
        let tampering = Tampering::default();
        let serving = bound.serve(Arc::new(Mutex::new(host_end)), callbacks, token.clone(), tampering.clone());
        let _serving = serving.unwrap();
        let dial_back = move |callback: Callback| {
            let mut back = UnixStream::connect(&callbacks_path).unwrap();
            token.present(&mut back).unwrap();
            callback.write(&mut back).unwrap();
            back
        };
        let init = std::thread::spawn(move || {
            let mut control = BufReader::new(init_end);
            for reached in [true, false] {
                let HostMsg::Connect { id, port } = read_frame::<HostMsg>(&mut control).unwrap() else {
                    panic!("the host asks only for connections here");
                };
                assert_eq!(port, 8000);
                let mut back = dial_back(Callback { id, reached });
                if reached {
                    let mut request = String::new();
                    back.read_to_string(&mut request).unwrap();
                    back.write_all(format!("echo:{request}").as_bytes()).unwrap();
                }
            }
            dial_back(Callback { id: 999, reached: true })
        });

        let mut client = TcpStream::connect(("127.0.0.1", free)).unwrap();
        client.write_all(b"hello").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut reply = String::new();
        client.read_to_string(&mut reply).unwrap();
        assert_eq!(reply, "echo:hello", "the answer comes after the client's half-close");

        let mut unanswered = TcpStream::connect(("localhost", free)).unwrap();
        let mut nothing = Vec::new();
        unanswered.read_to_end(&mut nothing).unwrap();
        assert!(nothing.is_empty());
        let warnings = seen.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with(&format!("1 of 2 connections to localhost:{free}")), "{warnings:?}");

        let forged = init.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while tampering.lines().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(forged);
        let lines = tampering.lines();
        assert!(lines.iter().any(|l| l.contains("not waiting")), "{lines:?}");
    }
}
