//! Drives the muxer (and once, the whole device) through descriptor chains
//! built the way a guest driver builds them, against real Unix sockets.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::BUF_ALLOC;
use super::muxer::{MAX_CONNECTIONS, MAX_INIT_CONNECTIONS, MAX_PENDING_CONTROL, Muxer};
use super::packet::{
    HEADER_SIZE, HOST_CID, MAX_PKT_DATA, OP_CREDIT_REQUEST, OP_CREDIT_UPDATE, OP_REQUEST, OP_RESPONSE, OP_RST, OP_RW,
    OP_SHUTDOWN, PacketHeader, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};
use super::{HostPorts, TYPE_VSOCK, Vsock};
use crate::protocol::broker;
use crate::protocol::{AGENT_PORT, CHANGES_PORT, DNS_PORT, GUEST_CID, PROXY_PORT, TRANSPARENT_PORT};
use crate::vmm::devices::broker::Dialer;
use crate::vmm::devices::virtio::{Activation, DeviceQueue, Interrupt, VIRTIO_F_VERSION_1, VirtioDevice};

const GUEST_PORT: u32 = 50_000;
const QSIZE: u16 = 256;
const RX_RING: u64 = 0;
const TX_RING: u64 = 0x1_0000;
const BUF_START: u64 = 0x10_0000;
const MEM_SIZE: usize = 0x400_0000;
/// HEADER_SIZE as a descriptor length.
const HDR_LEN: u32 = 44;
/// Buffers Linux posts on rx: one descriptor, header plus 4 KiB.
const RX_BUF_LEN: u32 = HDR_LEN + 4096;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const RX_BUFFERS: usize = 32;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("stockade-vsock-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn base(&self) -> PathBuf {
        self.0.join("vsock")
    }

    /// A dialer served by the supervisor's broker code on a thread.
    fn dialer(&self) -> Dialer {
        let (vmm, supervisor) = UnixStream::pair().unwrap();
        let base = self.base();
        std::thread::spawn(move || broker::serve(supervisor, &base, |_| {}));
        Dialer::from_stream(vmm)
    }

    /// A dialer whose broker passes on the VMM's refusal notices.
    fn reporting_dialer(&self) -> (Dialer, std::sync::mpsc::Receiver<(u32, u32)>) {
        let (vmm, supervisor) = UnixStream::pair().unwrap();
        let (tx, notices) = std::sync::mpsc::channel();
        let base = self.base();
        std::thread::spawn(move || {
            broker::serve(supervisor, &base, move |notice| {
                if let broker::Notice::Refused { host_port, guest_port } = notice {
                    let _ = tx.send((host_port, guest_port));
                }
            })
        });
        (Dialer::from_stream(vmm), notices)
    }

    fn listen(&self, port: u32) -> UnixListener {
        UnixListener::bind(self.0.join(format!("vsock_{port}"))).unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

/// (address, length, device-writable) of one descriptor.
type Desc = (u64, u32, bool);

/// The driver's side of one split queue.
/// Where a queue's used ring lives, from its base. The mock places it
/// right after the avail ring's first `len` bytes (not `2 * len`), over
/// the avail ring's upper half; a queue that ever posts more than half its
/// size would see its own avail entries as used ones.
const USED_RING_OFFSET: u64 = 0x2000;

struct DriverQueue<'m> {
    mock: MockSplitQueue<'m, GuestMemoryMmap>,
    mem: &'m GuestMemoryMmap,
    used_ring: u64,
    next_desc: u16,
    used_seen: u16,
}

impl<'m> DriverQueue<'m> {
    fn new(mem: &'m GuestMemoryMmap, ring: u64) -> DriverQueue<'m> {
        let used_ring = ring + USED_RING_OFFSET;
        mem.write_slice(&[0u8; 4], GuestAddress(used_ring)).unwrap();
        DriverQueue {
            mock: MockSplitQueue::create(mem, GuestAddress(ring), QSIZE),
            mem,
            used_ring,
            next_desc: 0,
            used_seen: 0,
        }
    }

    fn queue(&self) -> Queue {
        let mut queue: Queue = self.mock.create_queue().unwrap();
        queue.set_ready(false);
        queue.set_used_ring_address(Some(u32::try_from(self.used_ring).unwrap()), Some(0));
        queue.set_ready(true);
        queue
    }

    /// Makes a chain available; returns its head index.
    fn push(&mut self, descs: &[Desc]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in descs.iter().enumerate() {
            let index = (head + u16::try_from(i).unwrap()) % QSIZE;
            let mut flags = if writable { DESC_F_WRITE } else { 0 };
            let mut next = 0;
            if i + 1 < descs.len() {
                flags |= DESC_F_NEXT;
                next = (index + 1) % QSIZE;
            }
            let desc = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
            self.mock.desc_table().store(index, desc).unwrap();
        }
        self.next_desc = (head + u16::try_from(descs.len()).unwrap()) % QSIZE;
        let avail = self.mock.avail().idx().load();
        self.mock.avail().ring().ref_at(usize::from(avail % QSIZE)).unwrap().store(head);
        self.mock.avail().idx().store(avail.wrapping_add(1));
        head
    }

    /// Used entries since the last call: (head, length written).
    fn take_used(&mut self) -> Vec<(u16, u32)> {
        let mut out = Vec::new();
        let idx: u16 = self.mem.read_obj(GuestAddress(self.used_ring + 2)).unwrap();
        while self.used_seen != idx {
            let elem = GuestAddress(self.used_ring + 4 + 8 * u64::from(self.used_seen % QSIZE));
            let id: u32 = self.mem.read_obj(elem).unwrap();
            let len: u32 = self.mem.read_obj(GuestAddress(elem.0 + 4)).unwrap();
            out.push((u16::try_from(id).unwrap(), len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}

type Packet = (PacketHeader, Vec<u8>);

/// A guest driver talking to a muxer, with one rx buffer per descriptor.
struct Guest<'m> {
    mem: &'m GuestMemoryMmap,
    rx: DriverQueue<'m>,
    tx: DriverQueue<'m>,
    rxq: Queue,
    txq: Queue,
    muxer: Muxer,
    rx_bufs: HashMap<u16, u64>,
    next_buf: u64,
    /// What the guest advertises as its receive buffer.
    buf_alloc: u32,
    /// Payload bytes the guest has consumed.
    fwd_cnt: u32,
    /// Consume RW payload as soon as it arrives.
    auto_consume: bool,
}

impl<'m> Guest<'m> {
    fn new(mem: &'m GuestMemoryMmap, dir: &TempDir) -> Guest<'m> {
        Guest::with_ports(mem, dir, HostPorts::any_other())
    }

    fn with_ports(mem: &'m GuestMemoryMmap, dir: &TempDir, ports: HostPorts) -> Guest<'m> {
        Guest::with(mem, dir.dialer(), ports)
    }

    fn with(mem: &'m GuestMemoryMmap, dialer: Dialer, ports: HostPorts) -> Guest<'m> {
        let rx = DriverQueue::new(mem, RX_RING);
        let tx = DriverQueue::new(mem, TX_RING);
        let (rxq, txq) = (rx.queue(), tx.queue());
        Guest {
            mem,
            rx,
            tx,
            rxq,
            txq,
            muxer: Muxer::new(GUEST_CID, dialer, ports).unwrap(),
            rx_bufs: HashMap::new(),
            next_buf: BUF_START,
            buf_alloc: 64 * 1024,
            fwd_cnt: 0,
            auto_consume: true,
        }
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let len = u64::from(len).next_multiple_of(16);
        if self.next_buf + len > MEM_SIZE as u64 {
            self.next_buf = BUF_START;
        }
        let addr = self.next_buf;
        self.next_buf += len;
        addr
    }

    fn header(&self, op: u16, host_port: u32) -> PacketHeader {
        PacketHeader {
            src_cid: GUEST_CID,
            dst_cid: HOST_CID,
            src_port: GUEST_PORT,
            dst_port: host_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd_cnt,
            ..PacketHeader::default()
        }
    }

    /// Queues a packet as Linux does (header and payload descriptors) and
    /// lets the device process tx.
    fn send(&mut self, mut hdr: PacketHeader, data: &[u8]) {
        hdr.len = u32::try_from(data.len()).unwrap();
        let hdr_addr = self.alloc(HDR_LEN);
        self.mem.write_slice(&hdr.to_bytes(), GuestAddress(hdr_addr)).unwrap();
        let mut descs = vec![(hdr_addr, HDR_LEN, false)];
        if !data.is_empty() {
            let data_addr = self.alloc(hdr.len);
            self.mem.write_slice(data, GuestAddress(data_addr)).unwrap();
            descs.push((data_addr, hdr.len, false));
        }
        self.send_raw(&descs);
    }

    fn send_raw(&mut self, descs: &[Desc]) {
        self.tx.push(descs);
        let outcome = self.muxer.process_tx(self.mem, &mut self.txq);
        assert!(outcome.used, "the device must return every tx chain");
    }

    fn post_rx(&mut self, len: u32) {
        let addr = self.alloc(len);
        let head = self.rx.push(&[(addr, len, true)]);
        self.rx_bufs.insert(head, addr);
    }

    /// Lets the device deliver what it has, topping up rx buffers, until it
    /// has nothing more.
    fn recv(&mut self) -> Vec<Packet> {
        let mut packets = Vec::new();
        loop {
            while self.rx_bufs.len() < RX_BUFFERS {
                self.post_rx(RX_BUF_LEN);
            }
            self.muxer.process_events();
            self.muxer.process_rx(self.mem, &mut self.rxq);
            let used = self.rx.take_used();
            if used.is_empty() {
                return packets;
            }
            for (head, len) in used {
                let addr = self.rx_bufs.remove(&head).unwrap();
                assert!(len as usize >= HEADER_SIZE, "rx buffer returned with {len} bytes");
                let mut raw = [0u8; HEADER_SIZE];
                self.mem.read_slice(&mut raw, GuestAddress(addr)).unwrap();
                let hdr = PacketHeader::from_bytes(&raw);
                assert_eq!(len as usize, HEADER_SIZE + hdr.len as usize, "used length matches the header");
                let mut data = vec![0u8; hdr.len as usize];
                self.mem.read_slice(&mut data, GuestAddress(addr + HEADER_SIZE as u64)).unwrap();
                if hdr.op == OP_RW && self.auto_consume {
                    self.fwd_cnt = self.fwd_cnt.wrapping_add(hdr.len);
                }
                packets.push((hdr, data));
            }
        }
    }

    /// Receives until `done` holds for everything received so far.
    fn recv_until(&mut self, done: impl Fn(&[Packet]) -> bool) -> Vec<Packet> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut packets = Vec::new();
        while !done(&packets) {
            assert!(Instant::now() < deadline, "timed out; got {:?}", ops(&packets));
            packets.extend(self.recv());
            std::thread::sleep(Duration::from_millis(1));
        }
        packets
    }

    /// Opens a connection to `port` and returns the Unix peer's end.
    fn connect(&mut self, listener: &UnixListener, port: u32) -> UnixStream {
        self.send(self.header(OP_REQUEST, port), &[]);
        let packets = self.recv();
        assert_eq!(ops(&packets), [OP_RESPONSE]);
        let (peer, _) = listener.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        peer
    }
}

impl Guest<'_> {
    /// Asks for host port `host_port` from guest port `guest_port`; returns
    /// the ops of the answer.
    fn request_from(&mut self, guest_port: u32, host_port: u32) -> Vec<u16> {
        let mut hdr = self.header(OP_REQUEST, host_port);
        hdr.src_port = guest_port;
        self.send(hdr, &[]);
        // Other connections may speak meanwhile (a peer closing).
        let packets = self.recv();
        packets.iter().filter(|(h, _)| (h.src_port, h.dst_port) == (host_port, guest_port)).map(|(h, _)| h.op).collect()
    }
}

/// Whether a connection waits on `listener`, without blocking.
fn pending(listener: &UnixListener) -> Option<UnixStream> {
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Ok((stream, _)) => Some(stream),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("accept: {e}"),
    }
}

fn ops(packets: &[Packet]) -> Vec<u16> {
    packets.iter().map(|(h, _)| h.op).collect()
}

fn rw_payload(packets: &[Packet]) -> Vec<u8> {
    packets.iter().filter(|(h, _)| h.op == OP_RW).flat_map(|(_, d)| d.clone()).collect()
}

fn assert_reply_header(hdr: &PacketHeader, op: u16, port: u32) {
    assert_eq!(hdr.op, op);
    assert_eq!(hdr.src_cid, HOST_CID);
    assert_eq!(hdr.dst_cid, GUEST_CID);
    assert_eq!(hdr.src_port, port);
    assert_eq!(hdr.dst_port, GUEST_PORT);
    assert_eq!(hdr.type_, TYPE_STREAM);
}

#[test]
fn request_to_a_listening_socket_is_answered_with_response() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(1234);
    let mut g = Guest::new(&mem, &dir);
    g.send(g.header(OP_REQUEST, 1234), &[]);
    let packets = g.recv();
    assert_eq!(packets.len(), 1);
    let (hdr, _) = &packets[0];
    assert_reply_header(hdr, OP_RESPONSE, 1234);
    assert_eq!((hdr.len, hdr.buf_alloc, hdr.fwd_cnt), (0, BUF_ALLOC, 0));
    listener.accept().unwrap();
}

#[test]
fn request_to_a_missing_socket_is_answered_with_rst() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let mut g = Guest::new(&mem, &dir);
    g.send(g.header(OP_REQUEST, 4321), &[]);
    let packets = g.recv();
    assert_eq!(packets.len(), 1);
    assert_reply_header(&packets[0].0, OP_RST, 4321);
}

#[test]
fn other_cids_get_rst_and_spoofed_sources_are_dropped() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let _listener = dir.listen(1);
    let mut g = Guest::new(&mem, &dir);

    let mut to_other_vm = g.header(OP_REQUEST, 1);
    to_other_vm.dst_cid = 7;
    g.send(to_other_vm, &[]);
    let packets = g.recv();
    assert_eq!(ops(&packets), [OP_RST]);
    assert_eq!((packets[0].0.src_cid, packets[0].0.dst_cid), (7, GUEST_CID));

    let mut seqpacket = g.header(OP_REQUEST, 1);
    seqpacket.type_ = 2;
    g.send(seqpacket, &[]);
    assert_eq!(ops(&g.recv()), [OP_RST]);

    let mut spoofed = g.header(OP_REQUEST, 1);
    spoofed.src_cid = 9;
    g.send(spoofed, &[]);
    assert!(g.recv().is_empty());
}

#[test]
fn guest_data_reaches_the_unix_peer() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RW, 7), b"hello, ");
    g.send(g.header(OP_RW, 7), b"host");
    let mut got = [0u8; 11];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello, host");
}

#[test]
fn unix_peer_data_reaches_the_guest_as_rw() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RW, 7), b"ping!");
    let mut got = [0u8; 5];
    peer.read_exact(&mut got).unwrap();

    peer.write_all(b"world").unwrap();
    let packets = g.recv();
    assert_eq!(packets.len(), 1);
    let (hdr, data) = &packets[0];
    assert_reply_header(hdr, OP_RW, 7);
    assert_eq!(data, b"world");
    assert_eq!(hdr.len, 5);
    assert_eq!(hdr.buf_alloc, BUF_ALLOC);
    assert_eq!(hdr.fwd_cnt, 5, "the five guest bytes were forwarded");
}

#[test]
fn peer_half_close_sends_shutdown_send_after_the_data() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    peer.write_all(b"bye").unwrap();
    peer.shutdown(Shutdown::Write).unwrap();
    let packets = g.recv();
    assert_eq!(ops(&packets), [OP_RW, OP_SHUTDOWN]);
    assert_eq!(packets[0].1, b"bye");
    assert_eq!(packets[1].0.flags, SHUTDOWN_SEND);

    // The other direction still works.
    g.send(g.header(OP_RW, 7), b"still here");
    let mut got = [0u8; 10];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still here");
}

#[test]
fn peer_close_sends_shutdown_with_both_flags() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    peer.write_all(b"last words").unwrap();
    drop(peer);
    let packets = g.recv();
    assert_eq!(ops(&packets), [OP_RW, OP_SHUTDOWN]);
    assert_eq!(packets[0].1, b"last words");
    assert_eq!(packets[1].0.flags, SHUTDOWN_SEND | SHUTDOWN_RCV);

    // Linux answers a full shutdown with RST once it has read everything.
    g.send(g.header(OP_RST, 7), &[]);
    g.send(g.header(OP_RW, 7), b"late");
    assert_eq!(ops(&g.recv()), [OP_RST], "the connection is forgotten");
}

#[test]
fn guest_shutdown_send_gives_the_peer_eof_and_keeps_the_reverse_direction() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RW, 7), b"request");
    let mut shutdown = g.header(OP_SHUTDOWN, 7);
    shutdown.flags = SHUTDOWN_SEND;
    g.send(shutdown, &[]);
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");

    peer.write_all(b"response").unwrap();
    let packets = g.recv();
    assert_eq!(rw_payload(&packets), b"response");
}

#[test]
fn guest_full_shutdown_is_answered_with_rst_and_closes_the_stream() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RW, 7), b"done");
    let mut shutdown = g.header(OP_SHUTDOWN, 7);
    shutdown.flags = SHUTDOWN_SEND | SHUTDOWN_RCV;
    g.send(shutdown, &[]);
    let packets = g.recv();
    assert_eq!(ops(&packets), [OP_RST]);
    assert_reply_header(&packets[0].0, OP_RST, 7);
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"done");

    g.send(g.header(OP_RW, 7), b"late");
    assert_eq!(ops(&g.recv()), [OP_RST], "the connection is forgotten");
}

#[test]
fn guest_full_shutdown_still_delivers_buffered_data() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    // More than the socket buffer takes, so some waits in the device.
    let chunk: Vec<u8> = (0..MAX_PKT_DATA).map(|i| u8::try_from(i % 251).unwrap()).collect();
    for _ in 0..(BUF_ALLOC as usize / MAX_PKT_DATA) {
        g.send(g.header(OP_RW, 7), &chunk);
    }
    let mut shutdown = g.header(OP_SHUTDOWN, 7);
    shutdown.flags = SHUTDOWN_SEND | SHUTDOWN_RCV;
    g.send(shutdown, &[]);
    assert_eq!(ops(&g.recv()).last(), Some(&OP_RST));

    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        got
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reader.is_finished() {
        assert!(Instant::now() < deadline, "the peer never saw EOF");
        g.muxer.process_events();
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = reader.join().unwrap();
    assert_eq!(got.len(), BUF_ALLOC as usize);
    assert!(got.chunks(MAX_PKT_DATA).all(|c| c == chunk.as_slice()));
}

#[test]
fn guest_rst_forgets_the_connection() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RST, 7), &[]);
    assert!(g.recv().is_empty(), "an RST is never answered");
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert!(got.is_empty());
    g.send(g.header(OP_CREDIT_REQUEST, 7), &[]);
    assert_eq!(ops(&g.recv()), [OP_RST]);
}

#[test]
fn host_never_sends_more_than_the_guest_credit() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    g.buf_alloc = 1000;
    g.auto_consume = false;
    let mut peer = g.connect(&listener, 7);
    let sent: Vec<u8> = (0..10_000u32).map(|i| u8::try_from(i % 256).unwrap()).collect();
    peer.write_all(&sent).unwrap();

    let packets = g.recv();
    let data = rw_payload(&packets);
    assert_eq!(data.len(), 1000, "exactly the advertised buffer");
    assert!(ops(&packets).contains(&OP_CREDIT_REQUEST), "out of credit, the host asks for more");
    assert!(g.recv().is_empty(), "nothing more without credit");

    // The guest application reads 600 bytes and says so.
    g.fwd_cnt = 600;
    g.send(g.header(OP_CREDIT_UPDATE, 7), &[]);
    let more = rw_payload(&g.recv());
    assert_eq!(more.len(), 600);
    let mut all = data;
    all.extend(more);
    assert_eq!(all, sent[..1600]);
}

#[test]
fn a_guest_without_credit_backpressures_the_unix_peer() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    g.buf_alloc = 4096;
    g.auto_consume = false;
    let mut peer = g.connect(&listener, 7);
    peer.set_nonblocking(true).unwrap();
    let chunk = [0x5au8; 64 * 1024];
    let mut written = 0usize;
    let blocked = loop {
        match peer.write(&chunk) {
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
            Err(e) => panic!("peer write: {e}"),
        }
        if written > 64 * 1024 * 1024 {
            break false;
        }
        g.recv();
    };
    assert!(blocked, "the device kept reading from a peer the guest cannot take data from");
    assert_eq!(rw_payload(&g.recv()).len(), 0);
}

#[test]
fn forwarding_half_the_buffer_sends_a_credit_update() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        got.len()
    });
    let chunk = vec![1u8; MAX_PKT_DATA];
    let total = 3 * MAX_PKT_DATA;
    for _ in 0..3 {
        g.send(g.header(OP_RW, 7), &chunk);
    }
    let packets = g.recv_until(|p| p.iter().any(|(h, _)| h.op == OP_CREDIT_UPDATE));
    let update = packets.iter().find(|(h, _)| h.op == OP_CREDIT_UPDATE).unwrap();
    assert!(update.0.fwd_cnt >= BUF_ALLOC / 2, "fwd_cnt {}", update.0.fwd_cnt);

    let mut shutdown = g.header(OP_SHUTDOWN, 7);
    shutdown.flags = SHUTDOWN_SEND;
    g.send(shutdown, &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reader.is_finished() {
        assert!(Instant::now() < deadline, "the peer never saw EOF");
        g.recv();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(reader.join().unwrap(), total);
}

#[test]
fn credit_request_is_answered_with_credit_update() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RW, 7), b"12345678");
    let mut got = [0u8; 8];
    peer.read_exact(&mut got).unwrap();
    g.send(g.header(OP_CREDIT_REQUEST, 7), &[]);
    let packets = g.recv();
    assert_eq!(ops(&packets), [OP_CREDIT_UPDATE]);
    assert_reply_header(&packets[0].0, OP_CREDIT_UPDATE, 7);
    assert_eq!((packets[0].0.buf_alloc, packets[0].0.fwd_cnt), (BUF_ALLOC, 8));
}

#[test]
fn a_guest_ignoring_our_credit_is_reset() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    let chunk = vec![7u8; MAX_PKT_DATA];
    // The peer reads nothing: once the socket buffer and our BUF_ALLOC are
    // full, the next packet overruns the credit we granted.
    let mut packets = Vec::new();
    for _ in 0..64 {
        g.send(g.header(OP_RW, 7), &chunk);
        packets.extend(g.recv());
        if ops(&packets).contains(&OP_RST) {
            break;
        }
    }
    assert_eq!(ops(&packets).last(), Some(&OP_RST));
    // The device drops its end as it resets; on a loaded host the peer may
    // look before that happens, so it waits (bounded) for the end.
    peer.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match peer.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => panic!("the peer should see the stream end, got {e}"),
        }
    }
}

#[test]
fn malformed_tx_packets_are_returned_and_ignored() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let _peer = g.connect(&listener, 7);
    g.tx.take_used();
    let scratch = g.alloc(0x1000);

    // Header too short, device-writable, outside guest memory.
    g.send_raw(&[(scratch, 10, false)]);
    g.send_raw(&[(scratch, HDR_LEN, true)]);
    g.send_raw(&[(0xffff_0000_0000, HDR_LEN, false)]);
    assert!(g.recv().is_empty());

    // A header claiming more payload than its descriptors hold.
    let mut hdr = g.header(OP_RW, 7);
    hdr.len = 100;
    mem.write_slice(&hdr.to_bytes(), GuestAddress(scratch)).unwrap();
    g.send_raw(&[(scratch, HDR_LEN, false), (scratch + 0x100, 10, false)]);
    assert_eq!(ops(&g.recv()), [OP_RST], "a stream missing bytes is reset");

    // Payload beyond the packet limit, on a connection nobody opened.
    let mut hdr = g.header(OP_RW, 8);
    hdr.len = u32::MAX;
    mem.write_slice(&hdr.to_bytes(), GuestAddress(scratch)).unwrap();
    g.send_raw(&[(scratch, HDR_LEN, false), (scratch + 0x100, 0x100, false)]);
    assert_eq!(ops(&g.recv()), [OP_RST]);

    // Unknown and out-of-place ops on a live connection.
    let _peer = g.connect(&listener, 7);
    g.send(g.header(99, 7), &[]);
    assert_eq!(ops(&g.recv()), [OP_RST]);
    let _peer = g.connect(&listener, 7);
    g.send(g.header(OP_RESPONSE, 7), &[]);
    assert_eq!(ops(&g.recv()), [OP_RST]);

    // A second request on a live connection.
    let _peer = g.connect(&listener, 7);
    g.send(g.header(OP_REQUEST, 7), &[]);
    assert_eq!(ops(&g.recv()), [OP_RST]);

    let used = g.tx.take_used();
    assert!(used.iter().all(|&(_, len)| len == 0), "tx chains are returned with nothing written");

    // The device still works.
    let mut peer = g.connect(&listener, 7);
    g.send(g.header(OP_RW, 7), b"ok");
    let mut got = [0u8; 2];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ok");
}

#[test]
fn malformed_rx_buffers_are_returned_empty() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let mut g = Guest::new(&mem, &dir);
    g.send(g.header(OP_REQUEST, 99), &[]);
    let small = g.alloc(0x100);
    let read_only = g.alloc(0x100);
    let short = g.rx.push(&[(small, 20, true)]);
    let unwritable = g.rx.push(&[(read_only, RX_BUF_LEN, false)]);
    g.muxer.process_rx(&mem, &mut g.rxq);
    assert_eq!(g.rx.take_used(), [(short, 0), (unwritable, 0)]);
    assert_eq!(ops(&g.recv()), [OP_RST], "the reply waits for a usable buffer");
}

#[test]
fn replies_waiting_for_rx_buffers_hold_back_tx() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let mut g = Guest::new(&mem, &dir);
    let hdr_addr = g.alloc(HDR_LEN);
    mem.write_slice(&g.header(OP_REQUEST, 99).to_bytes(), GuestAddress(hdr_addr)).unwrap();
    let queue_requests = |g: &mut Guest, n: usize| {
        for _ in 0..n {
            g.tx.push(&[(hdr_addr, HDR_LEN, false)]);
        }
        g.muxer.process_tx(&mem, &mut g.txq);
        g.tx.take_used().len()
    };
    // No rx buffers: each request leaves an RST waiting.
    let first = MAX_PENDING_CONTROL - 56;
    assert_eq!(queue_requests(&mut g, first), first);
    assert_eq!(queue_requests(&mut g, 100), 56, "tx stops while replies pile up");
    assert!(g.muxer.tx_throttled());
    let mut rsts = g.recv().len();
    assert_eq!(queue_requests(&mut g, 0), 44, "tx resumes once rx takes the replies");
    rsts += g.recv().len();
    assert_eq!(rsts, MAX_PENDING_CONTROL + 44);
}

#[test]
fn device_reports_identity_and_config() {
    let dir = TempDir::new();
    let dev = Vsock::new(GUEST_CID, dir.dialer(), HostPorts::stockade()).unwrap();
    assert_eq!(dev.device_type(), TYPE_VSOCK);
    assert_eq!(dev.queue_max_sizes(), [256, 256, 256]);
    assert_eq!(dev.features(), VIRTIO_F_VERSION_1);
    let mut cfg = [0xffu8; 8];
    dev.read_config(0, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg), GUEST_CID);
    let mut tail = [0xffu8; 4];
    dev.read_config(6, &mut tail);
    assert_eq!(tail, [0; 4]);
    assert!(Vsock::new(2, dir.dialer(), HostPorts::stockade()).is_err());
    assert!(Vsock::new(u64::from(u32::MAX), dir.dialer(), HostPorts::stockade()).is_err());
}

#[test]
fn activated_device_serves_the_queues_from_its_worker() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(5);
    let mut rx = DriverQueue::new(&mem, RX_RING);
    let mut tx = DriverQueue::new(&mem, TX_RING);
    let events = DriverQueue::new(&mem, 0x2_0000);
    let kicks = [(); 3].map(|()| EventFd::new(EFD_NONBLOCK).unwrap());
    let irqfd = EventFd::new(EFD_NONBLOCK).unwrap();
    let queues = [&rx, &tx, &events]
        .iter()
        .zip(&kicks)
        .map(|(dq, kick)| DeviceQueue { queue: dq.queue(), kick: kick.try_clone().unwrap() })
        .collect();
    let mut dev = Vsock::new(GUEST_CID, dir.dialer(), HostPorts::any_other()).unwrap();
    dev.activate(Activation {
        mem: mem.clone(),
        queues,
        interrupt: Interrupt::new(irqfd.try_clone().unwrap()),
        acked_features: VIRTIO_F_VERSION_1,
    })
    .unwrap();

    let rx_addr = BUF_START;
    rx.push(&[(rx_addr, RX_BUF_LEN, true)]);
    kicks[0].write(1).unwrap();
    let hdr = PacketHeader {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port: GUEST_PORT,
        dst_port: 5,
        type_: TYPE_STREAM,
        op: OP_REQUEST,
        buf_alloc: 4096,
        ..PacketHeader::default()
    };
    let tx_addr = BUF_START + 0x1_0000;
    mem.write_slice(&hdr.to_bytes(), GuestAddress(tx_addr)).unwrap();
    tx.push(&[(tx_addr, HDR_LEN, false)]);
    kicks[1].write(1).unwrap();

    wait_for_interrupt(&irqfd);
    let deadline = Instant::now() + Duration::from_secs(10);
    let used = loop {
        let used = rx.take_used();
        if !used.is_empty() {
            break used;
        }
        assert!(Instant::now() < deadline, "no rx packet");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(used[0].1, HDR_LEN);
    let mut raw = [0u8; HEADER_SIZE];
    mem.read_slice(&mut raw, GuestAddress(rx_addr)).unwrap();
    assert_eq!(PacketHeader::from_bytes(&raw).op, OP_RESPONSE);
    listener.accept().unwrap();
}

fn wait_for_interrupt(irqfd: &EventFd) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while irqfd.read().is_err() {
        assert!(Instant::now() < deadline, "no interrupt");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn socket_paths_follow_the_hybrid_convention() {
    let dir = TempDir::new();
    let listener = UnixListener::bind(Path::new(&format!("{}_{}", dir.base().display(), u32::MAX))).unwrap();
    let mem = guest_memory();
    let mut g = Guest::new(&mem, &dir);
    g.connect(&listener, u32::MAX);
}

#[test]
fn the_inits_ports_refuse_unprivileged_guest_ports() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let (dialer, notices) = dir.reporting_dialer();
    let mut g = Guest::with(&mem, dialer, HostPorts::stockade());
    // Every init port, the published ports' dial-back included.
    for port in crate::protocol::auth::INIT_PORTS {
        let listener = dir.listen(port);
        // What an unprivileged process gets: an auto-bound port above 1023.
        for guest_port in [1024, 50_000, u32::MAX - 1] {
            assert_eq!(g.request_from(guest_port, port), [OP_RST], "host port {port} from {guest_port}");
            assert!(pending(&listener).is_none(), "host port {port} was dialled for guest port {guest_port}");
            let notice = notices.recv_timeout(Duration::from_secs(10)).expect("the supervisor hears of it");
            assert_eq!(notice, (port, guest_port));
        }
        // Only CAP_NET_BIND_SERVICE binds below 1024.
        for guest_port in [1023, 1] {
            assert_eq!(g.request_from(guest_port, port), [OP_RESPONSE], "host port {port} from {guest_port}");
            assert!(pending(&listener).is_some(), "host port {port} not dialled for guest port {guest_port}");
        }
    }
}

#[test]
fn the_proxy_and_agent_are_open_to_any_guest_port_and_the_net_devices_ports_to_none() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let mut g = Guest::with_ports(&mem, &dir, HostPorts::stockade());
    for port in [PROXY_PORT, AGENT_PORT] {
        let listener = dir.listen(port);
        assert_eq!(g.request_from(50_000, port), [OP_RESPONSE]);
        assert!(pending(&listener).is_some());
        assert_eq!(g.request_from(1000, port), [OP_RESPONSE]);
        assert!(pending(&listener).is_some());
    }
    // DNS and transparent TCP are dialled by the VMM's own network device,
    // which writes the transparent header itself; over vsock the guest
    // could forge it.
    for port in [DNS_PORT, TRANSPARENT_PORT, 7] {
        let listener = dir.listen(port);
        for guest_port in [50_000, 1000] {
            assert_eq!(g.request_from(guest_port, port), [OP_RST], "host port {port} from {guest_port}");
            assert!(pending(&listener).is_none(), "host port {port} was dialled");
        }
    }
}

#[test]
fn a_guest_holding_every_open_slot_cannot_crowd_out_the_init() {
    raise_fd_limit(4 * MAX_CONNECTIONS as u64);
    let (dir, mem) = (TempDir::new(), guest_memory());
    let mut g = Guest::with_ports(&mem, &dir, HostPorts::stockade());
    let proxy = dir.listen(PROXY_PORT);
    let mut peers = Vec::new();
    for i in 0..MAX_CONNECTIONS {
        let guest_port = 40_000 + u32::try_from(i).unwrap();
        assert_eq!(g.request_from(guest_port, PROXY_PORT), [OP_RESPONSE], "connection {i}");
        peers.push(pending(&proxy).expect("the proxy was dialled"));
    }
    assert_eq!(g.request_from(39_999, PROXY_PORT), [OP_RST], "the open slots are full");

    let changes = dir.listen(CHANGES_PORT);
    let mut init_peers = Vec::new();
    for i in 0..MAX_INIT_CONNECTIONS {
        let guest_port = 1000 - u32::try_from(i).unwrap();
        assert_eq!(g.request_from(guest_port, CHANGES_PORT), [OP_RESPONSE], "init connection {i}");
        init_peers.push(pending(&changes).expect("the change port was dialled"));
    }
    assert_eq!(g.request_from(1, CHANGES_PORT), [OP_RST], "the init's own slots are bounded too");
}

/// The slot test holds two descriptors per connection.
fn raise_fd_limit(want: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    if limit.rlim_cur >= want {
        return;
    }
    assert!(limit.rlim_max >= want, "this test needs {want} open files; the hard limit is {}", limit.rlim_max);
    limit.rlim_cur = want;
    // SAFETY: setrlimit reads the struct, which outlives the call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

/// The guest's side of one connection's credit: what it has sent, and the
/// host's buffer and consumption from the host's latest packet on it.
struct GuestCredit {
    port: u32,
    sent: u32,
    host_buf_alloc: u32,
    host_fwd_cnt: u32,
}

impl GuestCredit {
    /// As after the host's OP_RESPONSE.
    fn new(port: u32) -> GuestCredit {
        GuestCredit { port, sent: 0, host_buf_alloc: BUF_ALLOC, host_fwd_cnt: 0 }
    }

    fn credit(&self) -> u32 {
        self.host_buf_alloc.saturating_sub(self.sent.wrapping_sub(self.host_fwd_cnt))
    }

    /// Takes in the host's packets, as Linux does: every header updates the
    /// credit. The host must never reset the connection.
    fn hear(&mut self, packets: &[Packet]) {
        for (hdr, _) in packets.iter().filter(|(h, _)| h.src_port == self.port) {
            assert_ne!(hdr.op, OP_RST, "the host reset a connection that kept to its credit");
            self.host_buf_alloc = hdr.buf_alloc;
            self.host_fwd_cnt = hdr.fwd_cnt;
        }
    }

    /// Sends from `data[from..]` as much as the credit allows, in packets
    /// as big as Linux makes them; returns how much.
    fn send_what_fits(&mut self, g: &mut Guest<'_>, data: &[u8]) -> usize {
        let start = self.sent as usize;
        loop {
            let at = self.sent as usize;
            let n = (self.credit() as usize).min(MAX_PKT_DATA).min(data.len() - at);
            if n == 0 {
                return at - start;
            }
            g.send(g.header(OP_RW, self.port), &data[at..at + n]);
            self.sent += u32::try_from(n).unwrap();
        }
    }
}

/// Reads what the (non-blocking) Unix peer has, without waiting.
fn drain(peer: &mut UnixStream, into: &mut Vec<u8>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match peer.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) => panic!("peer read: {e}"),
        }
    }
}

/// A change set streamed to a host reader that keeps pausing (a store
/// write that takes a while): whenever the reader goes on, the guest gets
/// credit again, and every byte arrives in order.
#[test]
fn a_long_transfer_to_a_reader_that_pauses_never_stalls() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    peer.set_nonblocking(true).unwrap();
    let data: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| u8::try_from(i % 251).unwrap()).collect();
    let mut credit = GuestCredit::new(7);
    let mut got = Vec::with_capacity(data.len());
    let (mut round, mut still) = (0u32, 0u32);
    while got.len() < data.len() {
        round += 1;
        let before = (credit.sent, got.len());
        credit.send_what_fits(&mut g, &data);
        credit.hear(&g.recv());
        // The reader pauses two rounds in three: the guest runs out of
        // credit with its data held in the device.
        if round % 3 == 0 {
            drain(&mut peer, &mut got);
        }
        still = if (credit.sent, got.len()) == before { still + 1 } else { 0 };
        assert!(
            still < 10,
            "stalled: the guest sent {} bytes with {} of credit left, the reader has {}",
            credit.sent,
            credit.credit(),
            got.len()
        );
    }
    assert!(got == data, "the bytes arrived changed or out of order");
}

/// A connection whose Unix reader stopped is reported once, with its
/// credit state, after STALL_REPORTED_AFTER; so is one whose guest takes
/// nothing; neither is while data moves.
#[test]
fn stalled_connections_are_reported_once_with_their_credit_state() {
    let (dir, mem) = (TempDir::new(), guest_memory());
    let listener = dir.listen(7);
    let mut g = Guest::new(&mem, &dir);
    let mut peer = g.connect(&listener, 7);
    peer.set_nonblocking(true).unwrap();
    let data = vec![7u8; 64 * 1024 * 1024];
    let mut credit = GuestCredit::new(7);
    // The guest sends until the reader's socket and the device's buffer are
    // full and its credit is gone.
    while credit.send_what_fits(&mut g, &data) > 0 {
        credit.hear(&g.recv());
    }
    assert_eq!(credit.credit(), 0);
    assert!(g.muxer.stalls(Instant::now()).is_empty(), "reported before it was idle long");
    let later = Instant::now() + super::connection::STALL_REPORTED_AFTER + Duration::from_secs(1);
    let stalls = g.muxer.stalls(later);
    assert_eq!(stalls.len(), 1);
    assert!(stalls[0].host_reader, "{}", stalls[0].state);
    let waiting = format!("{BUF_ALLOC} bytes wait for the host's reader");
    assert!(stalls[0].state.contains(&waiting), "{}", stalls[0].state);
    assert!(g.muxer.stalls(later).is_empty(), "a stall is reported once");

    // The reader goes on: the data moves and nothing waits any more.
    let mut got = Vec::new();
    for round in 0.. {
        drain(&mut peer, &mut got);
        if got.len() == credit.sent as usize {
            break;
        }
        assert!(round < 1000, "the device keeps {} bytes", credit.sent as usize - got.len());
        credit.hear(&g.recv());
    }
    credit.hear(&g.recv());
    assert!(credit.credit() > 0);
    let after = Instant::now() + super::connection::STALL_REPORTED_AFTER + Duration::from_secs(1);
    assert!(g.muxer.stalls(after).is_empty(), "nothing waits once the reader took it all");

    // The other way: the peer's data waits for a guest that consumes none.
    g.auto_consume = false;
    g.buf_alloc = 1000;
    g.send(g.header(OP_CREDIT_UPDATE, 7), &[]);
    peer.write_all(&[1u8; 10_000]).unwrap();
    assert_eq!(rw_payload(&g.recv()).len(), 1000);
    let after = Instant::now() + super::connection::STALL_REPORTED_AFTER + Duration::from_secs(1);
    let stalls = g.muxer.stalls(after);
    assert_eq!(stalls.len(), 1);
    assert!(!stalls[0].host_reader, "{}", stalls[0].state);
    assert!(stalls[0].state.contains("credit 0"), "{}", stalls[0].state);
}
