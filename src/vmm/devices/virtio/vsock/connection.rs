//! One guest-initiated stream: the guest's vsock socket bridged to a Unix
//! stream on the host, with the credit accounting of both directions
//! (virtio spec 5.10.6.3).

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{self, MsgFlags};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::BUF_ALLOC;
use super::error::VsockError;
use super::packet::{
    HOST_CID, OP_CREDIT_REQUEST, OP_CREDIT_UPDATE, OP_RESPONSE, OP_RW, OP_SHUTDOWN, PacketHeader, SHUTDOWN_RCV,
    SHUTDOWN_SEND, TYPE_STREAM,
};

/// Forwarding this much since the guest last heard our fwd_cnt earns it an
/// unsolicited credit update, so a sender waiting for credit resumes.
const CREDIT_UPDATE_THRESHOLD: u32 = BUF_ALLOC / 2;

/// A connection with data waiting that has moved nothing for this long is
/// logged with its credit state: a stalled stream (a host reader that
/// stopped, a credit update the guest never got) then names itself.
pub(super) const STALL_REPORTED_AFTER: Duration = Duration::from_secs(10);

/// A connection on which data waited and nothing moved (`Connection::stall`).
pub(super) struct Stall {
    /// Guest data waits for the host's reader: the host stopped reading,
    /// which is never the guest's doing. Otherwise host data waits for a
    /// guest that takes nothing.
    pub host_reader: bool,
    /// The connection's credit state, for the log.
    pub state: String,
}

/// A connection's identity: the guest's port and the host port it dialled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct ConnKey {
    pub guest_port: u32,
    pub host_port: u32,
}

pub(super) struct Connection {
    stream: UnixStream,
    key: ConnKey,
    guest_cid: u64,
    /// Identifies the stream in the muxer's epoll.
    token: u64,
    /// What the stream is registered for in epoll; empty when unregistered,
    /// so a hung-up stream we are not reading cannot wake us in a loop.
    interest: EventSet,
    /// Whether the muxer has this connection in its rx work queue.
    pub queued: bool,

    // Host to guest.
    /// The guest's receive buffer and how much of it the guest has consumed,
    /// as of its last packet.
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Payload bytes sent to the guest.
    tx_cnt: u32,
    /// Epoll reported the stream readable and we have not yet drained it.
    readable: bool,
    /// The Unix peer shut its sending side (read returned 0).
    host_eof: bool,
    /// The Unix peer shut both directions (epoll reported a hang-up).
    host_hup: bool,
    shutdown_sent: bool,

    // Guest to host.
    /// Guest data the Unix peer has not taken yet; at most BUF_ALLOC bytes.
    pending_write: VecDeque<u8>,
    /// Guest bytes handed to the Unix peer.
    fwd_cnt: u32,
    /// The fwd_cnt the guest last saw from us.
    last_fwd_cnt_sent: u32,
    guest_shut_send: bool,
    guest_shut_rcv: bool,
    write_shut: bool,

    response_pending: bool,
    credit_update_pending: bool,
    credit_request_pending: bool,

    /// When bytes last moved either way, or the guest last consumed some.
    moved: Instant,
    /// A stall was logged, and the connection has not moved since: whether
    /// it was the host's reader that stopped.
    stall_reported: Option<bool>,
}

impl Connection {
    /// Bridges the connected host `stream` (non-blocking, from the broker)
    /// for the guest's OP_REQUEST `request`.
    pub fn new(stream: UnixStream, request: &PacketHeader, guest_cid: u64, token: u64) -> Connection {
        Connection {
            stream,
            key: ConnKey { guest_port: request.src_port, host_port: request.dst_port },
            guest_cid,
            token,
            interest: EventSet::empty(),
            queued: false,
            peer_buf_alloc: request.buf_alloc,
            peer_fwd_cnt: request.fwd_cnt,
            tx_cnt: 0,
            readable: false,
            host_eof: false,
            host_hup: false,
            shutdown_sent: false,
            pending_write: VecDeque::new(),
            fwd_cnt: 0,
            last_fwd_cnt_sent: 0,
            guest_shut_send: false,
            guest_shut_rcv: false,
            write_shut: false,
            response_pending: true,
            credit_update_pending: false,
            credit_request_pending: false,
            moved: Instant::now(),
            stall_reported: None,
        }
    }

    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn key(&self) -> ConnKey {
        self.key
    }

    pub fn has_pending_write(&self) -> bool {
        !self.pending_write.is_empty()
    }

    /// Every guest packet carries its current buffer size and consumption.
    pub fn update_peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        if fwd_cnt != self.peer_fwd_cnt {
            self.note_progress();
        }
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
        if self.peer_credit() > 0 {
            self.credit_request_pending = false;
        }
    }

    /// How many more bytes the guest can take. A guest reporting a fwd_cnt
    /// ahead of what we sent gets nothing rather than a huge window.
    pub fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc.saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    pub fn request_credit_update(&mut self) {
        self.credit_update_pending = true;
    }

    /// Takes guest payload: writes what the Unix peer accepts now and keeps
    /// the rest. A guest ignoring our credit is refused.
    pub fn push_guest_data(&mut self, data: &[u8]) -> Result<(), VsockError> {
        if self.guest_shut_send {
            return Err(VsockError::DataAfterShutdown);
        }
        if !data.is_empty() {
            self.note_progress();
        }
        let buffered = self.pending_write.len();
        if buffered + data.len() > BUF_ALLOC as usize {
            return Err(VsockError::CreditExceeded { len: data.len(), buffered });
        }
        let written = if buffered == 0 {
            let n = send_available(&self.stream, data).map_err(VsockError::Stream)?;
            self.forwarded(n);
            n
        } else {
            0
        };
        self.pending_write.extend(&data[written..]);
        Ok(())
    }

    /// Writes buffered guest data; once it is all out and the guest has
    /// finished sending, passes the EOF on to the Unix peer.
    pub fn flush(&mut self) -> io::Result<()> {
        while !self.pending_write.is_empty() {
            let (front, _) = self.pending_write.as_slices();
            let n = send_available(&self.stream, front)?;
            if n == 0 {
                break;
            }
            self.pending_write.drain(..n);
            self.forwarded(n);
        }
        if self.pending_write.is_empty() && self.guest_shut_send && !self.write_shut {
            self.write_shut = true;
            self.stream.shutdown(Shutdown::Write)?;
        }
        Ok(())
    }

    fn forwarded(&mut self, n: usize) {
        if n > 0 {
            self.note_progress();
        }
        self.fwd_cnt = self.fwd_cnt.wrapping_add(counter(n));
        if self.fwd_cnt.wrapping_sub(self.last_fwd_cnt_sent) >= CREDIT_UPDATE_THRESHOLD {
            self.credit_update_pending = true;
        }
    }

    /// Applies the guest's OP_SHUTDOWN flags; returns whether the guest has
    /// now shut both directions.
    pub fn guest_shutdown(&mut self, flags: u32) -> io::Result<bool> {
        if flags & SHUTDOWN_RCV != 0 && !self.guest_shut_rcv {
            self.guest_shut_rcv = true;
            // The Unix peer's writes now fail with EPIPE, as a Linux vsock
            // sender's do once its peer shuts receiving.
            self.stream.shutdown(Shutdown::Read)?;
        }
        if flags & SHUTDOWN_SEND != 0 {
            self.guest_shut_send = true;
        }
        if self.guest_shut_rcv && self.guest_shut_send {
            return Ok(true);
        }
        self.flush()?;
        Ok(false)
    }

    /// Records what epoll reported for the stream.
    pub fn on_event(&mut self, events: EventSet) -> io::Result<()> {
        if events.contains(EventSet::HANG_UP) {
            self.host_hup = true;
        }
        let trouble = EventSet::HANG_UP | EventSet::ERROR;
        if self.interest.contains(EventSet::IN) && events.intersects(EventSet::IN | trouble) {
            self.readable = true;
        }
        if self.has_pending_write() && events.intersects(EventSet::OUT | trouble) {
            self.flush()?;
        }
        Ok(())
    }

    fn may_read(&self) -> bool {
        !self.host_eof && !self.guest_shut_rcv && self.peer_credit() > 0
    }

    /// Whether `next_packet` has something for the guest.
    pub fn wants_rx(&self) -> bool {
        self.response_pending
            || self.credit_update_pending
            || self.credit_request_pending
            || (self.host_eof && !self.shutdown_sent)
            || (self.readable && self.may_read())
    }

    /// Produces the next packet for the guest, reading its payload (if any)
    /// into `scratch`; `room` is how much payload the rx buffer holds.
    /// Returns the header and the payload length. A stream error means the
    /// connection must be reset.
    pub fn next_packet(&mut self, scratch: &mut [u8], room: usize) -> io::Result<Option<(PacketHeader, usize)>> {
        if self.response_pending {
            self.response_pending = false;
            return Ok(Some((self.header(OP_RESPONSE), 0)));
        }
        if self.readable && self.may_read() && room > 0 {
            let want = usize::try_from(self.peer_credit()).unwrap_or(usize::MAX).min(room).min(scratch.len());
            match self.stream.read(&mut scratch[..want]) {
                Ok(0) => {
                    self.readable = false;
                    self.host_eof = true;
                }
                Ok(n) => {
                    self.note_progress();
                    self.tx_cnt = self.tx_cnt.wrapping_add(counter(n));
                    if self.peer_credit() == 0 {
                        // More may be waiting: ask the guest to tell us as
                        // soon as it has room.
                        self.credit_request_pending = true;
                    }
                    let mut hdr = self.header(OP_RW);
                    hdr.len = counter(n);
                    return Ok(Some((hdr, n)));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.readable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.credit_update_pending {
            return Ok(Some((self.header(OP_CREDIT_UPDATE), 0)));
        }
        if self.credit_request_pending {
            self.credit_request_pending = false;
            return Ok(Some((self.header(OP_CREDIT_REQUEST), 0)));
        }
        if self.host_eof && !self.shutdown_sent {
            self.shutdown_sent = true;
            let mut hdr = self.header(OP_SHUTDOWN);
            hdr.flags = SHUTDOWN_SEND | if self.host_hup { SHUTDOWN_RCV } else { 0 };
            return Ok(Some((hdr, 0)));
        }
        Ok(None)
    }

    /// A header for this connection. Every packet tells the guest our
    /// buffer and fwd_cnt, so any packet is also a credit update.
    fn header(&mut self, op: u16) -> PacketHeader {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        self.credit_update_pending = false;
        PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.key.host_port,
            dst_port: self.key.guest_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
            ..PacketHeader::default()
        }
    }

    fn note_progress(&mut self) {
        let now = Instant::now();
        if let Some(host_reader) = self.stall_reported.take() {
            let idle = now.saturating_duration_since(self.moved);
            let (key, fwd_cnt, tx_cnt) = (self.key, self.fwd_cnt, self.tx_cnt);
            let what = "moves again after";
            if host_reader {
                tracing::warn!("virtio-vsock: {key:?} {what} {idle:.0?} (forwarded {fwd_cnt}, sent {tx_cnt})");
            } else {
                tracing::info!("virtio-vsock: {key:?} {what} {idle:.0?} (forwarded {fwd_cnt}, sent {tx_cnt})");
            }
        }
        self.moved = now;
    }

    /// Data waits to move: guest bytes for the Unix peer, or the peer's
    /// bytes for a guest without credit.
    fn data_waiting(&self) -> bool {
        self.has_pending_write() || (self.readable && !self.host_eof && !self.guest_shut_rcv && self.peer_credit() == 0)
    }

    /// Once per stall: the connection's state if data has waited without
    /// anything moving for STALL_REPORTED_AFTER as of `now`.
    pub fn stall(&mut self, now: Instant) -> Option<Stall> {
        let idle = now.saturating_duration_since(self.moved);
        if self.stall_reported.is_some() || !self.data_waiting() || idle < STALL_REPORTED_AFTER {
            return None;
        }
        let host_reader = self.has_pending_write();
        self.stall_reported = Some(host_reader);
        let state = format!(
            "{:?} moved nothing for {:.0?} with data waiting: guest to host: {} bytes wait for the host's reader \
             (epoll {:?}), {} forwarded, the guest last told {} (credit update pending: {}); host to guest: {} sent, \
             the guest consumed {} of a {} byte buffer (credit {}), stream readable: {}, credit request pending: {}",
            self.key,
            idle,
            self.pending_write.len(),
            self.interest,
            self.fwd_cnt,
            self.last_fwd_cnt_sent,
            self.credit_update_pending,
            self.tx_cnt,
            self.peer_fwd_cnt,
            self.peer_buf_alloc,
            self.peer_credit(),
            self.readable,
            self.credit_request_pending,
        );
        Some(Stall { host_reader, state })
    }

    /// Registers in `epoll` for what the connection can act on now: reading
    /// while the guest has credit and we have not seen the stream readable,
    /// writing while guest data waits.
    pub fn sync_interest(&mut self, epoll: &Epoll) -> io::Result<()> {
        let mut want = EventSet::empty();
        if !self.readable && self.may_read() {
            want |= EventSet::IN;
        }
        if self.has_pending_write() {
            want |= EventSet::OUT;
        }
        if want == self.interest {
            return Ok(());
        }
        let op = if self.interest.is_empty() {
            ControlOperation::Add
        } else if want.is_empty() {
            ControlOperation::Delete
        } else {
            ControlOperation::Modify
        };
        epoll.ctl(op, self.stream.as_raw_fd(), EpollEvent::new(want, self.token))?;
        self.interest = want;
        Ok(())
    }

    pub fn deregister(&mut self, epoll: &Epoll) {
        if !self.interest.is_empty() {
            let _ = epoll.ctl(ControlOperation::Delete, self.stream.as_raw_fd(), EpollEvent::default());
            self.interest = EventSet::empty();
        }
    }
}

/// Writes as much of `buf` as the stream takes without blocking. MSG_NOSIGNAL:
/// a vanished peer is an EPIPE error for this connection, never a SIGPIPE.
fn send_available(stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match socket::send(stream.as_raw_fd(), &buf[done..], MsgFlags::MSG_NOSIGNAL) {
            Ok(0) | Err(Errno::EAGAIN) => break,
            Ok(n) => done += n,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Byte counts here never exceed BUF_ALLOC, so they fit the protocol's
/// wrapping 32-bit counters.
fn counter(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
