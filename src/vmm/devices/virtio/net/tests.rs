//! The stack and the queues driven as a guest would drive them: a second
//! smoltcp interface plays the guest kernel, its frames pass through the
//! device's stack (and once through real virtqueues), and real Unix
//! listeners play the supervisor's proxy ports behind the broker.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, Icmpv4Packet,
    Icmpv4Repr, IpAddress, IpCidr, IpEndpoint, IpProtocol, Ipv4Address, Ipv4Packet, Ipv4Repr,
};
use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::NET_HDR_LEN;
use super::queues;
use super::stack::Stack;
use crate::protocol::broker;
use crate::protocol::transparent::{self, GATEWAY_IP, GATEWAY_MAC, GUEST_IP, GUEST_MAC, MTU, PREFIX_LEN};
use crate::protocol::{DNS_PORT, TRANSPARENT_PORT};
use crate::vmm::devices::broker::Dialer;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("stockade-net-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn dialer(&self) -> Dialer {
        let (vmm, supervisor) = UnixStream::pair().unwrap();
        let base = self.0.join("vsock");
        std::thread::spawn(move || broker::serve(supervisor, &base, |_| {}));
        Dialer::from_stream(vmm)
    }

    fn listen(&self, port: u32) -> UnixListener {
        let listener = UnixListener::bind(self.0.join(format!("vsock_{port}"))).unwrap();
        listener.set_nonblocking(true).unwrap();
        listener
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The guest kernel's side: frames it sends and receives.
#[derive(Default)]
struct Wire {
    to_stack: VecDeque<Vec<u8>>,
    from_stack: VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0u8; len];
        let r = f(&mut frame);
        self.0.push_back(frame);
        r
    }
}

impl phy::Device for Wire {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;
    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(Rx, Tx<'_>)> {
        let frame = self.from_stack.pop_front()?;
        Some((Rx(frame), Tx(&mut self.to_stack)))
    }
    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.to_stack))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = usize::from(MTU) + 14;
        caps
    }
}

struct Guest {
    iface: Interface,
    sockets: SocketSet<'static>,
    wire: Wire,
    epoch: Instant,
}

impl Guest {
    fn new() -> Guest {
        let mut wire = Wire::default();
        let mut config = Config::new(EthernetAddress(GUEST_MAC).into());
        config.random_seed = 7;
        let mut iface = Interface::new(config, &mut wire, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(GUEST_IP), PREFIX_LEN));
        });
        iface.routes_mut().add_default_ipv4_route(GATEWAY_IP).unwrap();
        Guest { iface, sockets: SocketSet::new(Vec::new()), wire, epoch: Instant::now() }
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(i64::try_from(self.epoch.elapsed().as_micros()).unwrap())
    }

    /// One round: the guest sends, the device's stack runs, the guest hears.
    fn exchange(&mut self, stack: &mut Stack) {
        let now = self.now();
        self.iface.poll(now, &mut self.wire, &mut self.sockets);
        while let Some(frame) = self.wire.to_stack.pop_front() {
            stack.push_frame(frame);
        }
        stack.poll();
        while let Some(frame) = stack.pop_frame() {
            self.wire.from_stack.push_back(frame);
        }
        let now = self.now();
        self.iface.poll(now, &mut self.wire, &mut self.sockets);
    }

    /// Runs rounds until `done` holds, failing after a few seconds.
    fn until(&mut self, stack: &mut Stack, what: &str, mut done: impl FnMut(&mut Guest) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            self.exchange(stack);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn tcp_socket() -> tcp::Socket<'static> {
    tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 65536]), tcp::SocketBuffer::new(vec![0; 65536]))
}

fn udp_socket() -> udp::Socket<'static> {
    udp::Socket::new(
        udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 8], vec![0; 8192]),
        udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 8], vec![0; 8192]),
    )
}

fn accept(listener: &UnixListener) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                return stream;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("no connection reached the proxy port: {e}"),
        }
    }
}

#[test]
fn guest_tcp_to_any_address_reaches_the_proxy_with_its_original_destination() {
    let dir = TempDir::new();
    let proxy = dir.listen(TRANSPARENT_PORT);
    let mut stack = Stack::new(dir.dialer()).unwrap();
    let mut guest = Guest::new();
    let handle = guest.sockets.add(tcp_socket());
    let dst = IpEndpoint::new(IpAddress::v4(93, 184, 216, 34), 443);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(handle).connect(cx, dst, 40_000).unwrap();
    guest.until(&mut stack, "the handshake", |g| g.sockets.get::<tcp::Socket>(handle).may_send());

    let mut host = accept(&proxy);
    let mut family = [0u8; 1];
    host.read_exact(&mut family).unwrap();
    let mut rest = vec![0u8; transparent::rest_len(family[0]).unwrap()];
    host.read_exact(&mut rest).unwrap();
    let original = transparent::decode(family[0], &rest).unwrap();
    assert_eq!(original, SocketAddr::new(IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34)), 443));

    guest.sockets.get_mut::<tcp::Socket>(handle).send_slice(b"hello").unwrap();
    guest.until(&mut stack, "the guest's bytes", |g| g.sockets.get::<tcp::Socket>(handle).send_queue() == 0);
    let mut got = [0u8; 5];
    host.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");

    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let mut host = host.try_clone().unwrap();
        let big = big.clone();
        std::thread::spawn(move || {
            host.write_all(&big).unwrap();
            host.shutdown(std::net::Shutdown::Write).unwrap();
        })
    };
    let mut received = 0;
    guest.until(&mut stack, "the proxy's bytes and its close", |g| {
        let socket = g.sockets.get_mut::<tcp::Socket>(handle);
        while let Ok(n) = socket.recv(|b| (b.len(), b.len())) {
            if n == 0 {
                break;
            }
            received += n;
        }
        !socket.may_recv()
    });
    writer.join().unwrap();
    assert_eq!(received, big.len());
    assert_eq!(stack.connections(), 1, "the guest has not closed yet");
    guest.sockets.get_mut::<tcp::Socket>(handle).close();
    guest.until(&mut stack, "the connection's end", |g| {
        matches!(g.sockets.get::<tcp::Socket>(handle).state(), tcp::State::Closed | tcp::State::TimeWait)
    });
    let mut rest = Vec::new();
    host.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "the guest's close reaches the proxy as EOF");
    guest.until(&mut stack, "the stack to forget the connection", |_| true);
    stack.poll();
    assert_eq!(stack.connections(), 0);
}

#[test]
fn every_byte_from_the_proxy_arrives_in_order() {
    let dir = TempDir::new();
    let proxy = dir.listen(TRANSPARENT_PORT);
    let mut stack = Stack::new(dir.dialer()).unwrap();
    let mut guest = Guest::new();
    let handle = guest.sockets.add(tcp_socket());
    let cx = guest.iface.context();
    let dst = IpEndpoint::new(IpAddress::v4(198, 51, 100, 1), 80);
    guest.sockets.get_mut::<tcp::Socket>(handle).connect(cx, dst, 40_001).unwrap();
    guest.until(&mut stack, "the handshake", |g| g.sockets.get::<tcp::Socket>(handle).may_send());
    let mut host = accept(&proxy);
    let mut header = [0u8; 7];
    host.read_exact(&mut header).unwrap();
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let expected = big.clone();
    let writer = std::thread::spawn(move || {
        host.write_all(&big).unwrap();
        host.shutdown(std::net::Shutdown::Write).unwrap();
        host
    });
    let mut received = Vec::new();
    guest.until(&mut stack, "a megabyte", |g| {
        let socket = g.sockets.get_mut::<tcp::Socket>(handle);
        while socket.can_recv() {
            socket
                .recv(|b| {
                    received.extend_from_slice(b);
                    (b.len(), ())
                })
                .unwrap();
        }
        !socket.may_recv()
    });
    let _host = writer.join().unwrap();
    assert!(received == expected, "got {} bytes, not the megabyte sent", received.len());
}

#[test]
fn dns_is_answered_by_the_host_from_the_address_asked() {
    let dir = TempDir::new();
    let dns = dir.listen(DNS_PORT);
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let mut s = accept(&dns);
            let mut len = [0u8; 2];
            s.read_exact(&mut len).unwrap();
            let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut q).unwrap();
            q.extend_from_slice(b"-answer");
            s.write_all(&u16::try_from(q.len()).unwrap().to_be_bytes()).unwrap();
            s.write_all(&q).unwrap();
        }
    });
    let mut stack = Stack::new(dir.dialer()).unwrap();
    let mut guest = Guest::new();
    let handle = guest.sockets.add(udp_socket());
    guest.sockets.get_mut::<udp::Socket>(handle).bind(5353).unwrap();
    for server_ip in [IpAddress::Ipv4(GATEWAY_IP), IpAddress::v4(8, 8, 8, 8)] {
        let to = IpEndpoint::new(server_ip, 53);
        guest.sockets.get_mut::<udp::Socket>(handle).send_slice(b"question", to).unwrap();
        let mut answer = None;
        guest.until(&mut stack, "the DNS answer", |g| {
            if let Ok((data, meta)) = g.sockets.get_mut::<udp::Socket>(handle).recv() {
                answer = Some((data.to_vec(), meta.endpoint));
            }
            answer.is_some()
        });
        let (data, from) = answer.unwrap();
        assert_eq!(data, b"question-answer");
        assert_eq!(from, to, "the answer comes from the address asked");
    }
    server.join().unwrap();
}

#[test]
fn udp_other_than_dns_goes_nowhere() {
    let dir = TempDir::new();
    let mut stack = Stack::new(dir.dialer()).unwrap();
    let mut guest = Guest::new();
    let handle = guest.sockets.add(udp_socket());
    guest.sockets.get_mut::<udp::Socket>(handle).bind(5353).unwrap();
    let to = IpEndpoint::new(IpAddress::v4(203, 0, 113, 9), 9999);
    guest.sockets.get_mut::<udp::Socket>(handle).send_slice(b"exfiltrate", to).unwrap();
    for _ in 0..50 {
        guest.exchange(&mut stack);
    }
    assert!(guest.sockets.get_mut::<udp::Socket>(handle).recv().is_err());
    assert_eq!(stack.connections(), 0);
}

/// A frame from the guest to `dst`: `payload` for `ethertype` after the header.
fn guest_frame(
    dst: EthernetAddress,
    ethertype: EthernetProtocol,
    payload_len: usize,
    emit: impl FnOnce(&mut [u8]),
) -> Vec<u8> {
    let eth = EthernetRepr { src_addr: EthernetAddress(GUEST_MAC), dst_addr: dst, ethertype };
    let mut frame = vec![0u8; eth.buffer_len() + payload_len];
    let mut eth_frame = EthernetFrame::new_unchecked(&mut frame);
    eth.emit(&mut eth_frame);
    emit(eth_frame.payload_mut());
    frame
}

/// The guest's broadcast asking who has the gateway's address.
fn who_has_the_gateway() -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: EthernetAddress(GUEST_MAC),
        source_protocol_addr: GUEST_IP,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: GATEWAY_IP,
    };
    guest_frame(EthernetAddress::BROADCAST, EthernetProtocol::Arp, arp.buffer_len(), |buf| {
        arp.emit(&mut ArpPacket::new_unchecked(buf))
    })
}

fn ping(to: Ipv4Address, seq_no: u16) -> Vec<u8> {
    let icmp = Icmpv4Repr::EchoRequest { ident: 7, seq_no, data: b"are you there" };
    let ip = Ipv4Repr {
        src_addr: GUEST_IP,
        dst_addr: to,
        next_header: IpProtocol::Icmp,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    guest_frame(EthernetAddress(GATEWAY_MAC), EthernetProtocol::Ipv4, ip.buffer_len() + icmp.buffer_len(), |buf| {
        let mut packet = Ipv4Packet::new_unchecked(buf);
        ip.emit(&mut packet, &smoltcp::phy::ChecksumCapabilities::default());
        icmp.emit(
            &mut Icmpv4Packet::new_unchecked(packet.payload_mut()),
            &smoltcp::phy::ChecksumCapabilities::default(),
        );
    })
}

/// The sequence numbers of the echo replies the stack sent.
fn echo_replies(stack: &mut Stack) -> Vec<u16> {
    let mut seqs = Vec::new();
    while let Some(frame) = stack.pop_frame() {
        let eth = EthernetFrame::new_checked(&frame).unwrap();
        if eth.ethertype() != EthernetProtocol::Ipv4 {
            continue;
        }
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        if ip.next_header() != IpProtocol::Icmp {
            continue;
        }
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        if let Ok(Icmpv4Repr::EchoReply { seq_no, .. }) =
            Icmpv4Repr::parse(&icmp, &smoltcp::phy::ChecksumCapabilities::default())
        {
            seqs.push(seq_no);
        }
    }
    seqs
}

#[test]
fn only_the_gateway_answers_pings() {
    let dir = TempDir::new();
    let mut stack = Stack::new(dir.dialer()).unwrap();
    // The stack learns the guest's MAC from its ARP request.
    stack.push_frame(who_has_the_gateway());
    stack.poll();
    while stack.pop_frame().is_some() {}

    stack.push_frame(ping(GATEWAY_IP, 1));
    stack.push_frame(ping(Ipv4Address::new(203, 0, 113, 9), 2));
    stack.push_frame(ping(Ipv4Address::new(8, 8, 8, 8), 3));
    stack.poll();
    assert_eq!(echo_replies(&mut stack), vec![1], "the gateway answers; other addresses look down");
}

/// Descriptors for one queue in test memory.
struct DriverQueue<'m> {
    mock: MockSplitQueue<'m, GuestMemoryMmap>,
    next_desc: u16,
}

const QSIZE: u16 = 16;

impl<'m> DriverQueue<'m> {
    fn push(&mut self, addr: u64, len: u32, writable: bool) {
        let index = self.next_desc;
        let flags = if writable { 2 } else { 0 };
        let desc = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0));
        self.mock.desc_table().store(index, desc).unwrap();
        self.next_desc += 1;
        let avail = self.mock.avail().idx().load();
        self.mock.avail().ring().ref_at(usize::from(avail % QSIZE)).unwrap().store(index);
        self.mock.avail().idx().store(avail.wrapping_add(1));
    }

    fn used(&self, n: u16) -> (u32, u32) {
        let elem = self.mock.used().ring().ref_at(usize::from(n)).unwrap().load();
        (elem.id(), elem.len())
    }
}

#[test]
fn frames_cross_the_virtqueues_with_the_virtio_header() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap();
    let mut rxq = DriverQueue { mock: MockSplitQueue::create(&mem, GuestAddress(0), QSIZE), next_desc: 0 };
    let mut txq = DriverQueue { mock: MockSplitQueue::create(&mem, GuestAddress(0x1_0000), QSIZE), next_desc: 0 };
    let dir = TempDir::new();
    let mut stack = Stack::new(dir.dialer()).unwrap();

    let frame = who_has_the_gateway();
    let mut tx_buf = vec![0u8; NET_HDR_LEN];
    tx_buf.extend_from_slice(&frame);
    mem.write_slice(&tx_buf, GuestAddress(0x10_0000)).unwrap();
    txq.push(0x10_0000, u32::try_from(tx_buf.len()).unwrap(), false);
    rxq.push(0x20_0000, 4096, true);

    let mut tx = txq.mock.create_queue().unwrap();
    let mut rx = rxq.mock.create_queue().unwrap();
    assert!(queues::process_tx(&mem, &mut tx, &mut stack).used);
    stack.poll();
    assert!(queues::process_rx(&mem, &mut rx, &mut stack).used);
    assert_eq!(txq.used(0), (0, 0));
    let (id, len) = rxq.used(0);
    assert_eq!(id, 0);
    let mut reply = vec![0u8; usize::try_from(len).unwrap()];
    mem.read_slice(&mut reply, GuestAddress(0x20_0000)).unwrap();
    assert_eq!(u16::from_le_bytes([reply[10], reply[11]]), 1, "num_buffers");
    let eth = EthernetFrame::new_checked(&reply[NET_HDR_LEN..]).unwrap();
    assert_eq!(eth.src_addr(), EthernetAddress(GATEWAY_MAC));
    let arp = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    assert!(matches!(arp, ArpRepr::EthernetIpv4 { operation: ArpOperation::Reply, .. }), "{arp:?}");
}
