//! The packet engine behind the device: it turns tx-queue packets into
//! connection actions, Unix stream readiness into rx-queue packets, and owns
//! every connection. It knows nothing of threads or kicks, so tests drive it
//! directly.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{Epoll, EpollEvent};

use super::connection::{ConnKey, Connection, Stall};
use super::error::VsockError;
use super::packet::{
    HEADER_SIZE, HOST_CID, MAX_PKT_DATA, OP_CREDIT_REQUEST, OP_CREDIT_UPDATE, OP_REQUEST, OP_RST, OP_RW, OP_SHUTDOWN,
    PacketHeader, TYPE_STREAM,
};
use super::ports::{Class, HostPorts, Refusal};
use crate::vmm::devices::broker::Dialer;

/// Open Unix streams the guest may hold at once on ports open to any guest
/// process (each costs a host fd).
pub(super) const MAX_CONNECTIONS: usize = 1024;
/// Slots of the init's own ports, apart from the others: it holds at most
/// three at once; a guest filling every other slot cannot refuse it one.
pub(super) const MAX_INIT_CONNECTIONS: usize = 16;
/// Refusals logged at warning level; the rest at debug, so a guest
/// retrying in a loop cannot flood the VMM's log.
const REFUSALS_LOGGED: u32 = 16;
/// Replies not tied to a live connection (RSTs) waiting for rx buffers; past
/// this we stop taking tx packets until the guest supplies rx buffers.
pub(super) const MAX_PENDING_CONTROL: usize = 256;
/// Epoll events handled per `process_events` call.
const EVENT_BATCH: usize = 64;

/// What one pass over a queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct QueueOutcome {
    /// Chains were returned to the used ring.
    pub used: bool,
    /// The driver asked to be interrupted for them.
    pub notify: bool,
}

pub(super) struct Muxer {
    guest_cid: u64,
    dialer: Dialer,
    ports: HostPorts,
    refusals: u32,
    /// Readiness of every connection's Unix stream; its own fd is pollable,
    /// so the worker nests it in its epoll.
    epoll: Epoll,
    conns: HashMap<ConnKey, Connection>,
    by_token: HashMap<u64, ConnKey>,
    /// Connections the guest has closed whose data the Unix peer has not
    /// taken yet. They send nothing more to the guest.
    draining: HashMap<u64, Connection>,
    next_token: u64,
    /// RSTs for packets that have no connection (or just lost it).
    control: VecDeque<PacketHeader>,
    /// Connections with something for the guest, served round-robin.
    rx_ready: VecDeque<ConnKey>,
    /// Payload bounce buffer for both directions.
    scratch: Vec<u8>,
}

impl Muxer {
    pub fn new(guest_cid: u64, dialer: Dialer, ports: HostPorts) -> io::Result<Muxer> {
        Ok(Muxer {
            guest_cid,
            dialer,
            ports,
            refusals: 0,
            epoll: Epoll::new()?,
            conns: HashMap::new(),
            by_token: HashMap::new(),
            draining: HashMap::new(),
            next_token: 0,
            control: VecDeque::new(),
            rx_ready: VecDeque::new(),
            scratch: vec![0; MAX_PKT_DATA],
        })
    }

    /// Handles every packet the guest queued on tx. Stops early (leaving
    /// chains in the ring) while too many replies wait for rx buffers.
    pub fn process_tx(&mut self, mem: &GuestMemoryMmap, queue: &mut Queue) -> QueueOutcome {
        let mut used = false;
        while !self.tx_throttled() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            if let Err(e) = self.handle_tx_chain(mem, chain) {
                tracing::warn!("virtio-vsock: dropping tx packet: {e}");
            }
            if let Err(e) = queue.add_used(mem, head, 0) {
                tracing::warn!("virtio-vsock: cannot return a tx buffer: {e:?}");
            }
            used = true;
        }
        finish(mem, queue, used)
    }

    /// Whether `process_tx` is holding back until rx buffers drain replies.
    pub fn tx_throttled(&self) -> bool {
        self.control.len() >= MAX_PENDING_CONTROL
    }

    fn handle_tx_chain(
        &mut self,
        mem: &GuestMemoryMmap,
        chain: DescriptorChain<&GuestMemoryMmap>,
    ) -> Result<(), VsockError> {
        let mut reader = chain.reader(mem).map_err(VsockError::Chain)?;
        let hdr = PacketHeader::read_from(&mut reader).map_err(VsockError::Header)?;
        if hdr.src_cid != self.guest_cid {
            // Not the guest speaking for itself: nobody to answer.
            tracing::warn!("virtio-vsock: packet from CID {} dropped", hdr.src_cid);
            return Ok(());
        }
        if hdr.dst_cid != HOST_CID || hdr.type_ != TYPE_STREAM {
            self.reply_rst(&hdr);
            return Ok(());
        }
        let key = ConnKey { guest_port: hdr.src_port, host_port: hdr.dst_port };
        let payload = if hdr.op == OP_RW { self.read_payload(&hdr, &mut reader) } else { Ok(0) };
        let len = match payload {
            Ok(len) => len,
            Err(e) => {
                // The stream lost bytes it cannot get back.
                self.reset(key);
                return Err(e);
            }
        };
        match hdr.op {
            OP_REQUEST => self.connect(key, &hdr),
            OP_RST => {
                self.remove(key);
            }
            _ => self.handle_connected(key, &hdr, len)?,
        }
        Ok(())
    }

    /// Copies an OP_RW payload into `scratch`; returns its length.
    fn read_payload(&mut self, hdr: &PacketHeader, reader: &mut virtio_queue::Reader<'_>) -> Result<usize, VsockError> {
        let len = usize::try_from(hdr.len).unwrap_or(usize::MAX);
        if len > MAX_PKT_DATA {
            return Err(VsockError::PayloadTooLarge(hdr.len));
        }
        if len > reader.available_bytes() {
            return Err(VsockError::PayloadTruncated { len: hdr.len, available: reader.available_bytes() });
        }
        reader.read_exact(&mut self.scratch[..len]).map_err(VsockError::Payload)?;
        Ok(len)
    }

    fn handle_connected(&mut self, key: ConnKey, hdr: &PacketHeader, len: usize) -> Result<(), VsockError> {
        let Some(conn) = self.conns.get_mut(&key) else {
            self.reply_rst(hdr);
            return Ok(());
        };
        conn.update_peer_credit(hdr.buf_alloc, hdr.fwd_cnt);
        let result = match hdr.op {
            OP_RW => conn.push_guest_data(&self.scratch[..len]),
            OP_CREDIT_UPDATE => Ok(()),
            OP_CREDIT_REQUEST => {
                conn.request_credit_update();
                Ok(())
            }
            OP_SHUTDOWN => match conn.guest_shutdown(hdr.flags) {
                Ok(true) => {
                    self.close_by_guest(key);
                    return Ok(());
                }
                Ok(false) => Ok(()),
                Err(e) => Err(VsockError::Stream(e)),
            },
            // OP_RESPONSE (we never dial the guest), OP_INVALID, unknown ops.
            op => {
                tracing::warn!("virtio-vsock: unexpected op {op} on {key:?}");
                self.reset(key);
                return Ok(());
            }
        };
        match result {
            Ok(()) => {
                self.refresh(key);
                Ok(())
            }
            Err(e) => {
                self.reset(key);
                Err(e)
            }
        }
    }

    fn connect(&mut self, key: ConnKey, hdr: &PacketHeader) {
        if self.conns.contains_key(&key) {
            tracing::warn!("virtio-vsock: duplicate connection request on {key:?}");
            self.reset(key);
            return;
        }
        let class = match self.ports.admit(key.host_port, key.guest_port) {
            Ok(class) => class,
            Err(why) => {
                self.refused(key, why);
                self.push_rst(key);
                return;
            }
        };
        let (open, limit) = match class {
            Class::Init => (self.open_on(|port| self.ports.is_init(port)), MAX_INIT_CONNECTIONS),
            Class::Open => (self.open_on(|port| !self.ports.is_init(port)), MAX_CONNECTIONS),
        };
        if open >= limit {
            tracing::warn!("virtio-vsock: refusing {key:?}: {limit} connections open");
            self.push_rst(key);
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        match self.dialer.dial(key.host_port) {
            Ok(stream) => {
                self.conns.insert(key, Connection::new(stream, hdr, self.guest_cid, token));
                self.by_token.insert(token, key);
                self.refresh(key);
            }
            Err(e) => {
                tracing::debug!("virtio-vsock: cannot connect to host port {}: {e}", key.host_port);
                self.push_rst(key);
            }
        }
    }

    /// Connections (live or draining) whose host port satisfies `which`.
    fn open_on(&self, which: impl Fn(u32) -> bool) -> usize {
        let live = self.conns.keys().filter(|k| which(k.host_port)).count();
        live + self.draining.values().filter(|c| which(c.key().host_port)).count()
    }

    fn refused(&mut self, key: ConnKey, why: Refusal) {
        self.refusals = self.refusals.saturating_add(1);
        let what = match why {
            Refusal::NotOffered => "the host offers nothing there",
            Refusal::Unprivileged => "only the guest init may connect there, from a privileged port",
        };
        if self.refusals <= REFUSALS_LOGGED {
            // A guest process trying to speak for the init: the run reports it.
            if why == Refusal::Unprivileged {
                if let Err(e) = self.dialer.report_refused(key.host_port, key.guest_port) {
                    tracing::warn!("virtio-vsock: cannot report a refusal to the supervisor: {e}");
                }
            }
            tracing::warn!(
                "virtio-vsock: refused a connection from guest port {} to host port {}: {what}",
                key.guest_port,
                key.host_port
            );
        } else {
            tracing::debug!("virtio-vsock: refused {key:?}: {what}");
        }
    }

    /// The guest shut both directions: answer with RST, as Linux expects,
    /// and let the Unix peer still receive what the guest sent before.
    fn close_by_guest(&mut self, key: ConnKey) {
        self.push_rst(key);
        let Some(mut conn) = self.remove(key) else {
            return;
        };
        if conn.has_pending_write() && conn.sync_interest(&self.epoll).is_ok() {
            self.draining.insert(conn.token(), conn);
        }
    }

    /// Aborts a connection and tells the guest.
    fn reset(&mut self, key: ConnKey) {
        self.remove(key);
        self.push_rst(key);
    }

    fn remove(&mut self, key: ConnKey) -> Option<Connection> {
        let mut conn = self.conns.remove(&key)?;
        self.by_token.remove(&conn.token());
        conn.deregister(&self.epoll);
        Some(conn)
    }

    fn push_rst(&mut self, key: ConnKey) {
        self.control.push_back(PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.host_port,
            dst_port: key.guest_port,
            type_: TYPE_STREAM,
            op: OP_RST,
            ..PacketHeader::default()
        });
    }

    fn reply_rst(&mut self, hdr: &PacketHeader) {
        if let Some(rst) = hdr.reset_reply() {
            self.control.push_back(rst);
        }
    }

    /// After any change to a connection: update its epoll interest and queue
    /// it for rx if it has something for the guest.
    fn refresh(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        if let Err(e) = conn.sync_interest(&self.epoll) {
            tracing::warn!("virtio-vsock: {}", VsockError::Epoll(e));
            self.reset(key);
            return;
        }
        if conn.wants_rx() && !conn.queued {
            conn.queued = true;
            self.rx_ready.push_back(key);
        }
    }

    /// Handles the Unix streams epoll reports ready.
    pub fn process_events(&mut self) {
        let mut events = [EpollEvent::default(); EVENT_BATCH];
        let n = match self.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => return tracing::warn!("virtio-vsock: connection epoll: {e}"),
        };
        for event in &events[..n] {
            let token = event.data();
            if let Some(&key) = self.by_token.get(&token) {
                let Some(conn) = self.conns.get_mut(&key) else {
                    continue;
                };
                match conn.on_event(event.event_set()) {
                    Ok(()) => self.refresh(key),
                    Err(e) => {
                        tracing::debug!("virtio-vsock: {key:?}: {}", VsockError::Stream(e));
                        self.reset(key);
                    }
                }
            } else if let Some(conn) = self.draining.get_mut(&token) {
                let done = match conn.on_event(event.event_set()) {
                    Ok(()) => !conn.has_pending_write() || conn.sync_interest(&self.epoll).is_err(),
                    Err(_) => true,
                };
                if done {
                    if let Some(mut conn) = self.draining.remove(&token) {
                        conn.deregister(&self.epoll);
                    }
                }
            }
        }
    }

    /// Fills rx buffers with whatever the connections have for the guest.
    /// Stops when there is nothing left or no buffer; the rx kick resumes it.
    pub fn process_rx(&mut self, mem: &GuestMemoryMmap, queue: &mut Queue) -> QueueOutcome {
        let mut used = false;
        while !self.control.is_empty() || !self.rx_ready.is_empty() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let written = match self.fill_rx_chain(mem, chain) {
                Ok(Some(len)) => len,
                Ok(None) => {
                    // Nobody could send after all: keep the buffer for later.
                    queue.go_to_previous_position();
                    break;
                }
                Err(e) => {
                    tracing::warn!("virtio-vsock: rx buffer returned empty: {e}");
                    0
                }
            };
            if let Err(e) = queue.add_used(mem, head, written) {
                tracing::warn!("virtio-vsock: cannot return an rx buffer: {e:?}");
            }
            used = true;
        }
        finish(mem, queue, used)
    }

    /// Writes one packet into `chain`; returns its length, or None when no
    /// connection had anything after all.
    fn fill_rx_chain(
        &mut self,
        mem: &GuestMemoryMmap,
        chain: DescriptorChain<&GuestMemoryMmap>,
    ) -> Result<Option<u32>, VsockError> {
        let mut writer = chain.writer(mem).map_err(VsockError::Chain)?;
        let capacity = writer.available_bytes();
        let Some(room) = capacity.checked_sub(HEADER_SIZE) else {
            return Err(VsockError::RxBufferTooSmall(capacity));
        };
        // Each queued connection gets one chance per buffer, so one that
        // cannot produce anything does not spin us.
        let mut chances = self.rx_ready.len();
        loop {
            if let Some(hdr) = self.control.pop_front() {
                writer.write_all(&hdr.to_bytes()).map_err(VsockError::RxWrite)?;
                return Ok(Some(packet_len(0)));
            }
            if chances == 0 {
                return Ok(None);
            }
            chances -= 1;
            let Some(key) = self.rx_ready.pop_front() else {
                return Ok(None);
            };
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.queued = false;
            match conn.next_packet(&mut self.scratch, room) {
                Ok(Some((hdr, len))) => {
                    let written =
                        writer.write_all(&hdr.to_bytes()).and_then(|()| writer.write_all(&self.scratch[..len]));
                    if let Err(e) = written {
                        self.reset(key);
                        return Err(VsockError::RxWrite(e));
                    }
                    self.refresh(key);
                    return Ok(Some(packet_len(len)));
                }
                Ok(None) => self.refresh(key),
                Err(e) => {
                    tracing::debug!("virtio-vsock: {key:?}: {}", VsockError::Stream(e));
                    // The loop delivers the RST next.
                    self.reset(key);
                }
            }
        }
    }
}

impl Muxer {
    /// The connections (live or draining) on which data has waited, with
    /// nothing moving, for `connection::STALL_REPORTED_AFTER` as of `now`:
    /// each described once per stall, with what the muxer holds for the
    /// guest.
    pub fn stalls(&mut self, now: Instant) -> Vec<Stall> {
        let mut found: Vec<Stall> = self.conns.values_mut().filter_map(|c| c.stall(now)).collect();
        for conn in self.draining.values_mut() {
            found.extend(conn.stall(now).map(|s| Stall { state: format!("{} (draining)", s.state), ..s }));
        }
        let (ready, control) = (self.rx_ready.len(), self.control.len());
        for stall in &mut found {
            stall.state.push_str(&format!("; {ready} connections and {control} replies wait for rx buffers"));
        }
        found
    }
}

impl AsRawFd for Muxer {
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

fn packet_len(payload: usize) -> u32 {
    // Payloads are at most MAX_PKT_DATA, far below u32::MAX.
    u32::try_from(HEADER_SIZE + payload).unwrap_or(u32::MAX)
}

fn finish(mem: &GuestMemoryMmap, queue: &mut Queue, used: bool) -> QueueOutcome {
    let notify = used && queue.needs_notification(mem).unwrap_or(true);
    QueueOutcome { used, notify }
}
