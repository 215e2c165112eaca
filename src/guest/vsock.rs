//! How the init opens its connections to the host: from a privileged vsock
//! port, which only PID 1 (with CAP_NET_BIND_SERVICE) can bind; stdin and
//! change connections then start with this boot's token (see
//! `protocol::auth`).

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use anyhow::Context;
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, VsockAddr, bind, connect, socket};

use crate::protocol::HOST_CID;
use crate::protocol::auth::{PRIVILEGED_PORTS, Token};

/// Opens a vsock stream to the host on `port` from whatever port the kernel
/// picks (above 1023): for ports any guest process may use.
pub fn connect_host(port: u32) -> anyhow::Result<File> {
    let fd = socket(AddressFamily::Vsock, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .context("cannot create a vsock socket")?;
    connect(fd.as_raw_fd(), &VsockAddr::new(HOST_CID, port))
        .with_context(|| format!("cannot connect to the host on vsock port {port}"))?;
    Ok(File::from(fd))
}

/// How long the init's connect waits for the host's answer. Linux gives up
/// after 2 s, and the host answers only once the supervisor has dialed its
/// listener for the VMM: on a loaded host (a recovery booting beside a VMM
/// still freeing its gigabytes, the software-CPU test rig) that took longer,
/// and a recovery VM whose init could not call in reset without exporting.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// `SO_VM_SOCKETS_CONNECT_TIMEOUT_OLD` of <linux/vm_sockets.h>: a `timeval`.
const SO_VM_SOCKETS_CONNECT_TIMEOUT: libc::c_int = 6;

fn wait_for_answers(fd: &OwnedFd, timeout: Duration) -> anyhow::Result<()> {
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
    };
    // SAFETY: `fd` is an open socket for the whole call; the kernel reads
    // exactly `size_of::<timeval>()` bytes from `tv`, which lives across it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::AF_VSOCK,
            SO_VM_SOCKETS_CONNECT_TIMEOUT,
            std::ptr::from_ref(&tv).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::timeval>()).unwrap_or(0),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("cannot set the vsock connect timeout");
    }
    Ok(())
}

/// Opens a vsock stream to one of the init's host ports, bound first to a
/// free privileged port: the VMM refuses these ports from any other.
pub fn connect_as_init(port: u32) -> anyhow::Result<File> {
    let fd = socket(AddressFamily::Vsock, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .context("cannot create a vsock socket")?;
    wait_for_answers(&fd, CONNECT_TIMEOUT)?;
    let mut bound = None;
    // From the top down: low ports are where other services live.
    for local in (1..PRIVILEGED_PORTS).rev() {
        match bind(fd.as_raw_fd(), &VsockAddr::new(libc::VMADDR_CID_ANY, local)) {
            Ok(()) => {
                bound = Some(local);
                break;
            }
            Err(Errno::EADDRINUSE) => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot bind vsock port {local} to reach host port {port}"));
            }
        }
    }
    let local =
        bound.with_context(|| format!("every privileged vsock port is taken; cannot reach host port {port}"))?;
    connect(fd.as_raw_fd(), &VsockAddr::new(HOST_CID, port))
        .with_context(|| format!("cannot connect to the host on vsock port {port} from port {local}"))?;
    Ok(File::from(fd))
}

/// As `connect_as_init`, for the ports whose connections start with the
/// token.
pub fn connect_with_token(port: u32, token: &Token) -> anyhow::Result<File> {
    let mut stream = connect_as_init(port)?;
    token.present(&mut stream).with_context(|| format!("cannot write to the host on vsock port {port}"))?;
    Ok(stream)
}
