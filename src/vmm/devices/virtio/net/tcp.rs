//! One terminated guest TCP connection: the smoltcp socket that plays the
//! server the guest dialed, and the brokered stream to the host's proxy
//! that carries its bytes. Data moves straight between the socket's
//! buffers and the stream; each side's end is passed on as a half-close.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{Socket, State};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// What the guest's SYN asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Flow {
    /// The guest's end.
    pub src: SocketAddr,
    /// The original destination, which the proxy needs to name the flow.
    pub dst: SocketAddr,
}

pub(super) struct TcpConn {
    pub handle: SocketHandle,
    pub flow: Flow,
    pub token: u64,
    /// The proxy's end; dialed once the handshake has started.
    stream: Option<UnixStream>,
    /// The proxy closed its sending side; the guest got our FIN.
    host_done: bool,
    /// The guest's FIN was passed on to the proxy.
    guest_done: bool,
    /// The proxy's stream is full: wait for it to take more.
    blocked_up: bool,
    /// The events the stream is registered for, if any.
    interest: Option<EventSet>,
}

impl TcpConn {
    pub fn new(handle: SocketHandle, flow: Flow, token: u64) -> TcpConn {
        TcpConn {
            handle,
            flow,
            token,
            stream: None,
            host_done: false,
            guest_done: false,
            blocked_up: false,
            interest: None,
        }
    }

    pub fn is_bridged(&self) -> bool {
        self.stream.is_some()
    }

    pub fn bridge(&mut self, stream: UnixStream) {
        self.stream = Some(stream);
    }

    /// Moves what each side has for the other. Errors mean the connection
    /// is beyond repair; the caller aborts it.
    pub fn pump(&mut self, socket: &mut Socket<'_>) -> io::Result<()> {
        let Some(stream) = self.stream.as_mut() else { return Ok(()) };
        self.blocked_up = false;
        while socket.can_recv() {
            let wrote = socket.recv(|buf| match stream.write(buf) {
                Ok(n) => (n, Ok(n)),
                Err(e) => (0, Err(e)),
            });
            match wrote {
                Ok(Ok(0)) => break,
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.blocked_up = true;
                    break;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => break,
            }
        }
        let guest_finished =
            matches!(socket.state(), State::CloseWait | State::LastAck | State::Closing | State::TimeWait);
        if guest_finished && !self.guest_done && socket.recv_queue() == 0 {
            self.guest_done = true;
            let _ = stream.shutdown(Shutdown::Write);
        }
        while !self.host_done && socket.can_send() {
            let read = socket.send(|buf| match stream.read(buf) {
                Ok(n) => (n, Ok(n)),
                Err(e) => (0, Err(e)),
            });
            match read {
                Ok(Ok(0)) => {
                    self.host_done = true;
                    socket.close();
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                Ok(Err(e)) => return Err(e),
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Registers the stream for what the connection waits on: data from
    /// the proxy while the guest has window for it, room in the stream
    /// while the guest's data waits.
    pub fn sync_interest(&mut self, socket: &Socket<'_>, epoll: &Epoll) -> io::Result<()> {
        let Some(stream) = self.stream.as_ref() else { return Ok(()) };
        let mut want = EventSet::empty();
        if !self.host_done && socket.can_send() {
            want |= EventSet::IN;
        }
        if self.blocked_up {
            want |= EventSet::OUT;
        }
        let want = (!want.is_empty()).then_some(want);
        if want == self.interest {
            return Ok(());
        }
        let fd = stream.as_raw_fd();
        match (self.interest, want) {
            (None, Some(w)) => epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(w, self.token))?,
            (Some(_), Some(w)) => epoll.ctl(ControlOperation::Modify, fd, EpollEvent::new(w, self.token))?,
            (Some(_), None) => epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default())?,
            (None, None) => {}
        }
        self.interest = want;
        Ok(())
    }

    pub fn deregister(&mut self, epoll: &Epoll) {
        if let (Some(stream), Some(_)) = (self.stream.as_ref(), self.interest.take()) {
            let _ = epoll.ctl(ControlOperation::Delete, stream.as_raw_fd(), EpollEvent::default());
        }
    }
}
