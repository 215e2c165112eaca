//! The guest's end of published ports: for each host client the host
//! announces, connect to the port on the guest's loopback, dial back on
//! `PUBLISH_PORT`, and carry bytes both ways until both sides are done.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{Shutdown, shutdown};

use crate::protocol::PUBLISH_PORT;
use crate::protocol::auth::Token;
use crate::protocol::publish::Callback;

/// A server on the guest's loopback answers at once; this only bounds a
/// firewall rule that drops instead of refusing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one host client on a thread of its own.
pub fn connect(id: u64, port: u16, token: Token) {
    let spawned = std::thread::Builder::new().name("publish".into()).spawn(move || {
        if let Err(e) = serve(id, port, &token) {
            eprintln!("stockade-init: published port {port}: {e:#}");
        }
    });
    if let Err(e) = spawned {
        eprintln!("stockade-init: cannot serve a connection to published port {port}: {e}");
    }
}

fn serve(id: u64, port: u16, token: &Token) -> anyhow::Result<()> {
    // Dev servers listen on 127.0.0.1, on ::1 (Vite on Node 18+ resolves
    // localhost that way) or on both; either answers.
    let local = [SocketAddr::from((Ipv4Addr::LOCALHOST, port)), SocketAddr::from((Ipv6Addr::LOCALHOST, port))]
        .iter()
        .find_map(|addr| TcpStream::connect_timeout(addr, CONNECT_TIMEOUT).ok());
    let mut host = super::vsock::connect_with_token(PUBLISH_PORT, token)?;
    Callback { id, reached: local.is_some() }.write(&mut host)?;
    let Some(local) = local else { return Ok(()) };
    let _ = local.set_nodelay(true);
    let (to_host, from_local) = (host.try_clone()?, local.try_clone()?);
    let upstream = std::thread::Builder::new().name("publish-up".into()).spawn(move || {
        pipe(from_local, to_host, close_write);
    })?;
    pipe(host, local, |s| {
        let _ = s.shutdown(std::net::Shutdown::Write);
    });
    let _ = upstream.join();
    Ok(())
}

/// Copies until the end of `from`, then ends the write side of `to`, so
/// a half-closed HTTP request still gets its answer.
fn pipe<R: Read, W: Write>(mut from: R, mut to: W, close: impl FnOnce(&W)) {
    let _ = crate::protocol::stream::pump(&mut from, &mut to);
    close(&to);
}

fn close_write(socket: &File) {
    let _ = shutdown(socket.as_raw_fd(), Shutdown::Write);
}
