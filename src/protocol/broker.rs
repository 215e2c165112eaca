//! The channel through which the VMM reaches host ports while it makes no
//! sockets itself: the VMM holds one Unix stream to the supervisor (opened
//! before the jail closes) and asks it for port P; the supervisor connects to
//! its own listener "{uds_base}_{P}" and passes the connected descriptor
//! back. A jailed VMM therefore cannot reach any other socket on the host,
//! not even a Unix socket its Landlock rules would not stop it from naming.
//!
//! The VMM also tells the supervisor, through the same channel, of
//! connections the guest was refused on the init's ports (a guest process
//! trying to speak for the init), so that the run can report them.
//!
//! It also says once how the VM started: booted, recording a template,
//! restored from one, or booted because the template it was given could not
//! be used (see `vmm::template`).
//!
//! Wire: a request is three u32 little-endian: the kind, then two
//! arguments. A dial (kind 0, port, 0) is answered with an errno as 4 bytes
//! little-endian, 0 with the descriptor attached. A refusal notice (kind 1,
//! host port, guest port) and a start notice (kind 2, how, 0) have no
//! answer.
//!
//! The VMM's end is `vmm::devices::broker`. The supervisor's end, `serve`,
//! lives here: it is plain socket code, and keeping it beside the format
//! lets the VMM's device tests run against the very code the supervisor runs.

use std::ffi::OsString;
use std::io::{self, IoSlice, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr};
use thiserror::Error;

const KIND_DIAL: u32 = 0;
const KIND_REFUSED: u32 = 1;
const KIND_START: u32 = 2;

/// Bytes in a request.
pub const REQUEST_LEN: usize = 12;
/// Bytes in the answer to a dial.
pub const REPLY_LEN: usize = 4;

/// What the VMM asks of the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A stream connected to host port `port`.
    Dial { port: u32 },
    /// The guest was refused `host_port` from `guest_port`; no answer.
    Refused { host_port: u32, guest_port: u32 },
    /// How the VM started; no answer.
    Start(StartKind),
}

/// How a VM started, as the VMM tells the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    /// It booted the kernel (no template asked for).
    Booted,
    /// It booted and records a template at the template point.
    Recording,
    /// It resumed a template.
    Restored,
    /// It booted because the template's files are damaged or unreadable.
    BootedDamaged,
    /// It booted because the template was made for another CPU or KVM.
    BootedMismatch,
    /// It booted because KVM refused the template's state.
    BootedRefused,
}

impl StartKind {
    const ALL: [StartKind; 6] = [
        StartKind::Booted,
        StartKind::Recording,
        StartKind::Restored,
        StartKind::BootedDamaged,
        StartKind::BootedMismatch,
        StartKind::BootedRefused,
    ];

    fn code(self) -> u32 {
        match self {
            StartKind::Booted => 0,
            StartKind::Recording => 1,
            StartKind::Restored => 2,
            StartKind::BootedDamaged => 3,
            StartKind::BootedMismatch => 4,
            StartKind::BootedRefused => 5,
        }
    }

    /// Whether the VM was given a template and could not use it.
    pub fn template_failed(self) -> bool {
        matches!(self, StartKind::BootedDamaged | StartKind::BootedMismatch | StartKind::BootedRefused)
    }

    /// A sentence for `-v`.
    pub fn describe(self) -> &'static str {
        match self {
            StartKind::Booted => "the VM booted (no template used)",
            StartKind::Recording => "the VM booted and records a template for later runs",
            StartKind::Restored => "the VM resumed a template instead of booting",
            StartKind::BootedDamaged => "the VM booted: its template is damaged and was removed",
            StartKind::BootedMismatch => "the VM booted: its template was made for another CPU or KVM and was removed",
            StartKind::BootedRefused => "the VM booted: KVM refused its template, which was removed",
        }
    }
}

/// What the VMM tells the supervisor without asking anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    Refused { host_port: u32, guest_port: u32 },
    Start(StartKind),
}

/// A request of a kind this build does not know.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown broker request kind {0}")]
pub struct UnknownKind(pub u32);

impl Request {
    pub fn encode(self) -> [u8; REQUEST_LEN] {
        let (kind, a, b) = match self {
            Request::Dial { port } => (KIND_DIAL, port, 0),
            Request::Refused { host_port, guest_port } => (KIND_REFUSED, host_port, guest_port),
            Request::Start(kind) => (KIND_START, kind.code(), 0),
        };
        let mut out = [0u8; REQUEST_LEN];
        out[..4].copy_from_slice(&kind.to_le_bytes());
        out[4..8].copy_from_slice(&a.to_le_bytes());
        out[8..].copy_from_slice(&b.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8; REQUEST_LEN]) -> Result<Request, UnknownKind> {
        let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        match word(0) {
            KIND_DIAL => Ok(Request::Dial { port: word(4) }),
            KIND_REFUSED => Ok(Request::Refused { host_port: word(4), guest_port: word(8) }),
            KIND_START => StartKind::ALL
                .into_iter()
                .find(|k| k.code() == word(4))
                .map(Request::Start)
                .ok_or(UnknownKind(KIND_START)),
            kind => Err(UnknownKind(kind)),
        }
    }
}

/// The answer to a dial: 0 when the descriptor rides along, else an errno.
pub fn encode_reply(errno: i32) -> [u8; REPLY_LEN] {
    errno.to_le_bytes()
}

pub fn decode_reply(reply: [u8; REPLY_LEN]) -> i32 {
    i32::from_le_bytes(reply)
}

/// "{uds_base}_{port}", the Firecracker hybrid-vsock convention: where the
/// supervisor listens for guest connections to host port `port`.
pub fn socket_path(uds_base: &Path, port: u32) -> PathBuf {
    let mut path = OsString::from(uds_base.as_os_str());
    path.push(format!("_{port}"));
    PathBuf::from(path)
}

/// The supervisor's end: serves dial requests on `channel` until the VMM
/// closes it, and hands notices to `on_notice`.
pub fn serve(mut channel: UnixStream, uds_base: &Path, on_notice: impl Fn(Notice)) {
    loop {
        let mut request = [0u8; REQUEST_LEN];
        if channel.read_exact(&mut request).is_err() {
            return;
        }
        let port = match Request::decode(&request) {
            Ok(Request::Refused { host_port, guest_port }) => {
                on_notice(Notice::Refused { host_port, guest_port });
                continue;
            }
            Ok(Request::Start(kind)) => {
                on_notice(Notice::Start(kind));
                continue;
            }
            Ok(Request::Dial { port }) => port,
            Err(e) => {
                tracing::warn!("the VMM sent an {e}; closing its channel");
                return;
            }
        };
        let reply = match connect_nonblocking(&socket_path(uds_base, port)) {
            Ok(fd) => send_reply(&channel, 0, Some(&fd)),
            Err(e) => send_reply(&channel, e.raw_os_error().unwrap_or(libc::EIO), None),
        };
        if reply.is_err() {
            return;
        }
    }
}

fn send_reply(channel: &UnixStream, errno: i32, fd: Option<&OwnedFd>) -> io::Result<()> {
    let bytes = encode_reply(errno);
    let iov = [IoSlice::new(&bytes)];
    let fds = fd.map(|fd| [fd.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage> = fds.as_ref().map(|f| ControlMessage::ScmRights(f)).into_iter().collect();
    let sent = socket::sendmsg::<()>(channel.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(io::Error::other("short reply to the VMM"));
    }
    Ok(())
}

/// A non-blocking connect: a listener whose backlog is full refuses (EAGAIN)
/// instead of stalling the VMM's device thread waiting on the reply.
fn connect_nonblocking(path: &Path) -> io::Result<OwnedFd> {
    let fd =
        socket::socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    socket::connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_unknown_kinds_are_refused() {
        let starts = StartKind::ALL.map(Request::Start);
        for request in [Request::Dial { port: 1024 }, Request::Refused { host_port: 1026, guest_port: 50_000 }]
            .into_iter()
            .chain(starts)
        {
            assert_eq!(Request::decode(&request.encode()), Ok(request));
        }
        assert_eq!(Request::Dial { port: 1 }.encode(), [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        let mut unknown = Request::Dial { port: 1 }.encode();
        unknown[0] = 7;
        assert_eq!(Request::decode(&unknown), Err(UnknownKind(7)));
        assert_eq!(decode_reply(encode_reply(-libc::ENOENT)), -libc::ENOENT);
    }

    #[test]
    fn socket_paths_follow_the_hybrid_convention() {
        assert_eq!(socket_path(Path::new("/s/vsock"), 1024), Path::new("/s/vsock_1024"));
    }
}
