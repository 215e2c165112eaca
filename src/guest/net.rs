//! The guest's only way out: a loopback interface, an HTTP proxy forwarder
//! on 127.0.0.1:3128 and a DNS forwarder on 127.0.0.1:53, each carrying
//! its connections over vsock to the host's egress proxy, which applies the
//! policy. The guest has no other network device.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::thread;

use anyhow::Context;

use super::channel::connect_host;
use crate::protocol::{DNS_PORT, PROXY_PORT};

pub const PROXY_ADDR: &str = "127.0.0.1:3128";
const DNS_ADDR: &str = "127.0.0.1:53";
/// The largest DNS message over UDP we accept from a client.
const MAX_DNS_UDP: usize = 4096;

/// Brings up loopback and starts the forwarders (they run until power-off).
pub fn start() -> anyhow::Result<()> {
    loopback_up().context("cannot bring up the loopback interface")?;
    let proxy = TcpListener::bind(PROXY_ADDR).with_context(|| format!("cannot listen on {PROXY_ADDR}"))?;
    spawn("proxy-fwd", move || {
        for conn in proxy.incoming().flatten() {
            let _ = spawn("proxy-conn", move || {
                let _ = bridge(conn, PROXY_PORT);
            });
        }
    })?;
    let dns_tcp = TcpListener::bind(DNS_ADDR).with_context(|| format!("cannot listen on {DNS_ADDR} (tcp)"))?;
    spawn("dns-tcp", move || {
        // DNS over TCP is framed exactly as the host expects: pass it through.
        for conn in dns_tcp.incoming().flatten() {
            let _ = spawn("dns-conn", move || {
                let _ = bridge(conn, DNS_PORT);
            });
        }
    })?;
    let dns_udp = UdpSocket::bind(DNS_ADDR).with_context(|| format!("cannot listen on {DNS_ADDR} (udp)"))?;
    spawn("dns-udp", move || serve_udp(dns_udp))?;
    Ok(())
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
    thread::Builder::new().name(name.into()).spawn(f).with_context(|| format!("cannot start the {name} thread"))?;
    Ok(())
}

/// Copies both ways between a local TCP connection and a new vsock stream to
/// the host's `port`; each direction's end is passed on as a half-close.
fn bridge(local: TcpStream, port: u32) -> anyhow::Result<()> {
    let remote = connect_host(port)?;
    let mut remote_in = remote.try_clone()?;
    let mut local_out = local.try_clone()?;
    let upstream = thread::Builder::new().name("fwd-up".into()).spawn(move || {
        let mut local_in = local;
        let mut remote_out = remote;
        let _ = std::io::copy(&mut local_in, &mut remote_out);
        let _ = nix::sys::socket::shutdown(remote_out.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    })?;
    let _ = std::io::copy(&mut remote_in, &mut local_out);
    let _ = local_out.shutdown(Shutdown::Write);
    let _ = upstream.join();
    Ok(())
}

/// Answers UDP queries by asking the host over a vsock stream, one per
/// query so that a slow answer never holds up the others.
fn serve_udp(socket: UdpSocket) {
    let mut buf = vec![0u8; MAX_DNS_UDP];
    loop {
        let Ok((len, client)) = socket.recv_from(&mut buf) else { continue };
        let query = buf[..len].to_vec();
        let Ok(reply_socket) = socket.try_clone() else { continue };
        let _ = spawn("dns-query", move || {
            if let Ok(answer) = ask_host(&query) {
                let _ = reply_socket.send_to(&answer, client);
            }
        });
    }
}

fn ask_host(query: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut stream = connect_host(DNS_PORT)?;
    let len = u16::try_from(query.len()).context("DNS query too long")?;
    stream.write_all(&len.to_be_bytes())?;
    stream.write_all(query)?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len)?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut answer)?;
    Ok(answer)
}

fn loopback_up() -> std::io::Result<()> {
    // SAFETY: socket() has no memory-safety preconditions; the result is
    // checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a socket we just created and own exclusively.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the interface named in req and writes its
    // flags into req, which lives for the whole call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the union's flags member is the one SIOCGIFFLAGS filled in.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above, with the updated flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
