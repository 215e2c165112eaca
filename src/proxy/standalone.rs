//! `stockade policy serve`: the proxy on its own, for a program run on this
//! host, until SIGINT or SIGTERM. It prints the variables that point a
//! program at it and writes the guest's placeholder copies of sign-in files.

use std::fs;
use std::io::{self, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use thiserror::Error;

use super::{GuestTrust, Proxy, ProxyConfig, ProxyError};
use crate::policy::Policy;

#[derive(Debug, Error)]
pub enum ServeError {
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error("cannot block SIGINT and SIGTERM")]
    BlockSignals(#[source] nix::Error),
    #[error("cannot wait for a signal")]
    WaitSignal(#[source] nix::Error),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot answer DNS on {addr}")]
    Dns {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot write to {}", .dir.display())]
    Trust {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Serves `policy` on `listen` (a Unix socket path, or a TCP address), and
/// DNS on `dns` (a Unix socket path, or a UDP address) if given, with its
/// CA and sign-in copies under `data_dir`, until SIGINT or SIGTERM.
pub fn serve(
    policy: Policy,
    data_dir: &Path,
    listen: &str,
    dns: Option<String>,
    audit: Option<PathBuf>,
) -> Result<(), ServeError> {
    let sources = policy.sources.join(" + ");
    // Blocked before the proxy's threads start, so they inherit the mask
    // and the signal reaches the wait below.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block().map_err(ServeError::BlockSignals)?;
    let proxy = Proxy::start(ProxyConfig::new(policy, data_dir, audit.clone()))?;
    let listen_error = |source| ServeError::Listen { addr: listen.to_string(), source };
    let url = if listen.contains('/') {
        let _ = fs::remove_file(listen);
        let listener = UnixListener::bind(listen).map_err(listen_error)?;
        proxy.serve_unix(listener)?;
        listen.to_string()
    } else {
        let listener = TcpListener::bind(listen).map_err(listen_error)?;
        let url = format!("http://{}", listener.local_addr()?);
        proxy.serve_tcp(listener)?;
        url
    };
    eprintln!("stockade: proxy for {sources} at {url}; SIGINT or SIGTERM stops it");
    if let Some(path) = &audit {
        eprintln!("stockade: audit log {}", path.display());
    }
    let mut env = vec![("HTTPS_PROXY".to_string(), url.clone()), ("HTTP_PROXY".to_string(), url)];
    env.extend(proxy.placeholder_env());
    if let Some(trust) = proxy.guest_trust() {
        let dir = data_dir.join("ca");
        let (ca, bundle) = trust.write_to(&dir).map_err(|source| ServeError::Trust { dir: dir.clone(), source })?;
        env.extend(GuestTrust::env(&ca.display().to_string(), &bundle.display().to_string()));
    }
    for (name, value) in env {
        println!("export {name}='{value}'");
    }
    // What a guest would get instead of the host's sign-in token files, for
    // a program run with HOME pointed there.
    let signin_home = data_dir.join("serve-home");
    for file in proxy.signin_files() {
        let path = signin_home.join(file.file.trim_start_matches("~/").trim_start_matches('/'));
        write_private(&path, &file.content).map_err(|source| ServeError::Write { path: path.clone(), source })?;
        eprintln!("stockade: the guest's copy of {} (placeholders) is {}", file.file, path.display());
    }

    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<(), ServeError> {
        if let Some(path) = dns.as_deref().filter(|d| d.contains('/')) {
            let _ = fs::remove_file(path);
            let listener =
                UnixListener::bind(path).map_err(|source| ServeError::Listen { addr: path.to_string(), source })?;
            proxy.serve_dns_unix(listener)?;
            eprintln!("stockade: DNS on {path}");
        } else if let Some(addr) = dns {
            let socket = UdpSocket::bind(&addr).map_err(|source| ServeError::Dns { addr: addr.clone(), source })?;
            socket.set_read_timeout(Some(Duration::from_millis(200)))?;
            eprintln!("stockade: DNS on udp://{}", socket.local_addr()?);
            let (proxy, stop) = (&proxy, &stop);
            scope.spawn(move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(&proxy.answer_dns(&buf[..n]), peer);
                    }
                }
            });
        }
        let signal = signals.wait().map_err(ServeError::WaitSignal)?;
        eprintln!("stockade: {signal}, stopping");
        stop.store(true, Ordering::Relaxed);
        Ok(())
    })?;
    proxy.stop();
    Ok(())
}

/// Writes a file only its owner can read, making its directory.
fn write_private(path: &Path, content: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(content)
}
