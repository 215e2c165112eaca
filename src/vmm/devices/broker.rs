//! The VMM's end of the broker channel (see `protocol::broker`): how a
//! device reaches a host port while the VMM itself makes no sockets.

use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::sys::socket::{self, ControlMessageOwned, MsgFlags};

use crate::protocol::broker::{REPLY_LEN, Request, StartKind, decode_reply};

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
    /// When the VMM started, and whether the guest has dialed yet: its
    /// first dial is the init running, which the debug log times.
    started: Instant,
    dialed: Arc<AtomicBool>,
}

impl Dialer {
    /// Connects to the supervisor's broker socket.
    pub fn connect(path: &Path, started: Instant) -> io::Result<Dialer> {
        Ok(Dialer { channel: Arc::new(Mutex::new(UnixStream::connect(path)?)), started, dialed: Arc::default() })
    }

    #[cfg(test)]
    pub fn from_stream(channel: UnixStream) -> Dialer {
        Dialer { channel: Arc::new(Mutex::new(channel)), started: Instant::now(), dialed: Arc::default() }
    }

    /// A stream connected to host port `port`, or the supervisor's errno.
    pub fn dial(&mut self, port: u32) -> io::Result<UnixStream> {
        if !self.dialed.swap(true, Ordering::Relaxed) {
            tracing::debug!("the guest first dialed the host after {:?}", self.started.elapsed());
        }
        let mut channel = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        send_all(&channel, &Request::Dial { port }.encode())?;
        let mut reply = [0u8; REPLY_LEN];
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
        match (decode_reply(reply), fd) {
            (0, Some(fd)) => Ok(UnixStream::from(fd)),
            (0, None) => Err(io::Error::other("the supervisor answered without a descriptor")),
            (errno, _) => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    /// Tells the supervisor that the guest was refused `host_port` from
    /// `guest_port` (see `vsock::HostPorts`).
    pub fn report_refused(&mut self, host_port: u32, guest_port: u32) -> io::Result<()> {
        let channel = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        send_all(&channel, &Request::Refused { host_port, guest_port }.encode())
    }

    /// Tells the supervisor how the VM started.
    pub fn report_start(&self, kind: StartKind) -> io::Result<()> {
        let channel = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        send_all(&channel, &Request::Start(kind).encode())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    use super::*;
    use crate::protocol::broker::{Notice, serve, socket_path};

    #[test]
    fn dials_listening_ports_and_reports_the_others() {
        let dir = std::env::temp_dir().join(format!("stockade-broker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("vsock");
        let listener = UnixListener::bind(socket_path(&base, 1024)).unwrap();
        let (vmm, supervisor) = UnixStream::pair().unwrap();
        let (tx, refused) = std::sync::mpsc::channel();
        let serving = std::thread::spawn(move || serve(supervisor, &base, move |notice| tx.send(notice).unwrap()));
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
        dialer.report_start(StartKind::Restored).unwrap();
        assert!(dialer.dial(1024).is_ok());
        assert_eq!(refused.recv().unwrap(), Notice::Refused { host_port: 1026, guest_port: 50_000 });
        assert_eq!(refused.recv().unwrap(), Notice::Start(StartKind::Restored));
        drop(dialer);
        serving.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
