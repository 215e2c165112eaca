//! The guest's network: loopback; eth0, the virtio-net device, with a
//! static address and a default route via the VMM's gateway, which hands
//! every TCP connection and DNS question to the host's egress proxy; and an
//! HTTP proxy forwarder on 127.0.0.1:3128 over vsock to the same proxy, for
//! programs that honour the proxy variables. Both paths meet one policy.
//! When the host relays its ssh-agent, a Unix socket for `SSH_AUTH_SOCK`
//! forwarded the same way.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::thread;

use anyhow::Context;

use super::vsock::connect_host;
use crate::protocol::stream::pump;
use crate::protocol::transparent::{GATEWAY_IP, GUEST_IP, PREFIX_LEN};
use crate::protocol::{AGENT_PORT, GUEST_AGENT_SOCKET, PROXY_PORT};

pub const PROXY_ADDR: &str = "127.0.0.1:3128";
/// The virtio-net interface: the only NIC, named by the kernel.
const INTERFACE: &str = "eth0";

/// Brings up the interfaces: loopback, and eth0 with its address and
/// default route. The same in every run, so the init does it before the
/// template point and a resumed run finds the driver started (its receive
/// ring filled) instead of paying for it.
pub fn configure_links() -> anyhow::Result<()> {
    let sock = inet_socket().context("cannot make a socket to configure interfaces")?;
    interface_up(&sock, "lo").context("cannot bring up the loopback interface")?;
    configure_ethernet(&sock).with_context(|| format!("cannot configure {INTERFACE} ({GUEST_IP}/{PREFIX_LEN})"))
}

/// Starts the forwarder (it runs until power-off).
pub fn start() -> anyhow::Result<()> {
    let proxy = TcpListener::bind(PROXY_ADDR).with_context(|| format!("cannot listen on {PROXY_ADDR}"))?;
    spawn("proxy-fwd", move || {
        for conn in proxy.incoming().flatten() {
            let _ = spawn("proxy-conn", move || {
                let _ = bridge(conn.into(), PROXY_PORT);
            });
        }
    })?;
    Ok(())
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
    thread::Builder::new().name(name.into()).spawn(f).with_context(|| format!("cannot start the {name} thread"))?;
    Ok(())
}

/// Serves the ssh-agent relay at `GUEST_AGENT_SOCKET`, for the command's
/// user alone (it runs until power-off).
pub fn serve_agent(uid: u32, gid: u32) -> anyhow::Result<()> {
    let path = Path::new(GUEST_AGENT_SOCKET);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).with_context(|| format!("cannot chown {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    spawn("agent-fwd", move || {
        for conn in listener.incoming().flatten() {
            let _ = spawn("agent-conn", move || {
                let _ = bridge(conn.into(), AGENT_PORT);
            });
        }
    })
}

/// Copies both ways between a local stream socket and a new vsock stream
/// to the host's `port`; each direction's end is passed on as a half-close.
fn bridge(local: OwnedFd, port: u32) -> anyhow::Result<()> {
    let remote = connect_host(port)?;
    let local = File::from(local);
    let mut remote_in = remote.try_clone()?;
    let mut local_out = local.try_clone()?;
    let upstream = thread::Builder::new().name("fwd-up".into()).spawn(move || {
        let mut local_in = local;
        let mut remote_out = remote;
        let _ = pump(&mut local_in, &mut remote_out);
        let _ = nix::sys::socket::shutdown(remote_out.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    })?;
    let _ = pump(&mut remote_in, &mut local_out);
    let _ = nix::sys::socket::shutdown(local_out.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    let _ = upstream.join();
    Ok(())
}

fn configure_ethernet(sock: &OwnedFd) -> std::io::Result<()> {
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(PREFIX_LEN)));
    set_addr(sock, INTERFACE, libc::SIOCSIFADDR, GUEST_IP)?;
    set_addr(sock, INTERFACE, libc::SIOCSIFNETMASK, mask)?;
    interface_up(sock, INTERFACE)?;
    add_default_route(sock, GATEWAY_IP)
}

fn inet_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: socket() has no memory-safety preconditions; the result is
    // checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a socket we just created and own exclusively.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // The last byte stays NUL: names are shorter than IFNAMSIZ.
    for (dst, src) in req.ifr_name.iter_mut().take(libc::IFNAMSIZ - 1).zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

#[expect(clippy::cast_possible_truncation, reason = "AF_INET (2) fits sa_family_t")]
fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip.octets()) },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes of plain data;
    // the kernel reads this sockaddr as the sockaddr_in its family names.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

#[expect(clippy::cast_possible_truncation, reason = "IFF_UP | IFF_RUNNING (0x41) fits the short flags field")]
fn interface_up(sock: &OwnedFd, name: &str) -> std::io::Result<()> {
    let mut req = ifreq(name);
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

fn set_addr(sock: &OwnedFd, name: &str, request: libc::c_ulong, ip: Ipv4Addr) -> std::io::Result<()> {
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_addr = sockaddr(ip);
    // SAFETY: SIOCSIFADDR and SIOCSIFNETMASK read the name and address
    // from req, which lives for the whole call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, &req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's struct rtentry (include/uapi/linux/route.h); libc has it
/// only for musl.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

fn add_default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> std::io::Result<()> {
    let route = RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr(gateway),
        rt_genmask: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_flags: libc::RTF_UP | libc::RTF_GATEWAY,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: std::ptr::null_mut(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    // SAFETY: SIOCADDRT reads a struct rtentry, which RtEntry lays out
    // exactly; it lives for the whole call and its pointers are null.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &route) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
