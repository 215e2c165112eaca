//! How a device reaches a host port while the VMM itself makes no
//! sockets: the VMM holds one Unix stream to the supervisor (opened before
//! the jail closes) and asks it for port P; the supervisor connects to its
//! own listener "{uds_base}_{P}" and passes the connected descriptor back.
//! A jailed VMM therefore cannot reach any other socket on the host, not
//! even a Unix socket its Landlock rules would not stop it from naming.
//!
//! The VMM also tells the supervisor, through the same channel, of
//! connections the guest was refused on the init's ports (a guest process
//! trying to speak for the init), so that the run can report them.
//!
//! Wire: a request is three u32 little-endian: the kind, then two
//! arguments. A dial (kind 0, port, 0) is answered with an errno as 4 bytes
//! little-endian, 0 with the descriptor attached. A refusal notice (kind 1,
//! host port, guest port) has no answer.

use std::ffi::OsString;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};

const KIND_DIAL: u32 = 0;
const KIND_REFUSED: u32 = 1;

fn request(kind: u32, a: u32, b: u32) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..4].copy_from_slice(&kind.to_le_bytes());
    out[4..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

fn send_all(channel: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        sent += socket::send(channel.as_raw_fd(), &bytes[sent..], MsgFlags::MSG_NOSIGNAL)?;
    }
    Ok(())
}

/// The VMM's end: turns a port into a connected, non-blocking stream.
/// Clones share the one channel (vsock and net both dial through it), one
/// request at a time.
#[derive(Clone)]
pub struct Dialer {
    channel: Arc<Mutex<UnixStream>>,
}

impl Dialer {
    /// Connects to the supervisor's broker socket.
    pub fn connect(path: &Path) -> io::Result<Dialer> {
        Ok(Dialer { channel: Arc::new(Mutex::new(UnixStream::connect(path)?)) })
    }

    #[cfg(test)]
    pub fn from_stream(channel: UnixStream) -> Dialer {
        Dialer { channel: Arc::new(Mutex::new(channel)) }
    }

    /// A stream connected to host port `port`, or the supervisor's errno.
    pub fn dial(&mut self, port: u32) -> io::Result<UnixStream> {
        let mut channel = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        send_all(&channel, &request(KIND_DIAL, port, 0))?;
        let mut reply = [0u8; 4];
        let mut space = nix::cmsg_space!(RawFd);
        let (got, fd) = {
            let mut iov = [IoSliceMut::new(&mut reply)];
            let msg =
                socket::recvmsg::<()>(channel.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
            let mut fd = None;
            for cmsg in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for raw in fds {
                        // SAFETY: the kernel just installed `raw` in our fd
                        // table for this message; nothing else owns it.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        fd.get_or_insert(owned);
                    }
                }
            }
            (msg.bytes, fd)
        };
        if got < reply.len() {
            // A reply split across reads only happens on a broken channel.
            channel.read_exact(&mut reply[got..])?;
        }
        match (i32::from_le_bytes(reply), fd) {
            (0, Some(fd)) => Ok(UnixStream::from(fd)),
            (0, None) => Err(io::Error::other("the supervisor answered without a descriptor")),
            (errno, _) => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    /// Tells the supervisor that the guest was refused `host_port` from
    /// `guest_port` (see `vsock::HostPorts`).
    pub fn report_refused(&mut self, host_port: u32, guest_port: u32) -> io::Result<()> {
        let channel = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        send_all(&channel, &request(KIND_REFUSED, host_port, guest_port))
    }
}

/// The supervisor's end: serves dial requests on `channel` until the VMM
/// closes it, and hands refusal notices (host port, guest port) to
/// `on_refused`.
pub fn serve(mut channel: UnixStream, uds_base: &Path, on_refused: impl Fn(u32, u32)) {
    loop {
        let mut request = [0u8; 12];
        if channel.read_exact(&mut request).is_err() {
            return;
        }
        let word = |i: usize| u32::from_le_bytes([request[i], request[i + 1], request[i + 2], request[i + 3]]);
        let (kind, port) = (word(0), word(4));
        if kind == KIND_REFUSED {
            on_refused(port, word(8));
            continue;
        }
        if kind != KIND_DIAL {
            tracing::warn!("the VMM sent an unknown broker request ({kind}); closing its channel");
            return;
        }
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
    let bytes = errno.to_le_bytes();
    let iov = [IoSlice::new(&bytes)];
    let fds = fd.map(|fd| [fd.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage> = fds.as_ref().map(|f| ControlMessage::ScmRights(f)).into_iter().collect();
    let sent = socket::sendmsg::<()>(channel.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(io::Error::other("short reply to the VMM"));
    }
    Ok(())
}

/// "{uds_base}_{port}", the Firecracker hybrid-vsock convention.
pub fn socket_path(uds_base: &Path, port: u32) -> PathBuf {
    let mut path = OsString::from(uds_base.as_os_str());
    path.push(format!("_{port}"));
    PathBuf::from(path)
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
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn dials_listening_ports_and_reports_the_others() {
        let dir = std::env::temp_dir().join(format!("stockade-broker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("vsock");
        let listener = UnixListener::bind(socket_path(&base, 1024)).unwrap();
        let (vmm, supervisor) = UnixStream::pair().unwrap();
        let (tx, refused) = std::sync::mpsc::channel();
        let serving = std::thread::spawn(move || serve(supervisor, &base, move |h, g| tx.send((h, g)).unwrap()));
        let mut dialer = Dialer::from_stream(vmm);

        let mut stream = dialer.dial(1024).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        accepted.write_all(b"hello").unwrap();
        stream.set_nonblocking(false).unwrap();
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");

        let err = dialer.dial(9).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");

        // A notice has no answer: the next dial still gets its own.
        dialer.report_refused(1026, 50_000).unwrap();
        assert!(dialer.dial(1024).is_ok());
        assert_eq!(refused.recv().unwrap(), (1026, 50_000));
        drop(dialer);
        serving.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
