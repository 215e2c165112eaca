//! The userspace TCP/IP stack behind the device: a smoltcp interface that
//! is the guest's gateway and, through `any_ip`, every address the guest
//! dials. A guest SYN to a new endpoint gets a listening socket made for it
//! just before smoltcp sees the SYN; once the handshake starts the
//! connection is bridged to the proxy with its original destination. The
//! guest has IPv4 only: its resolver gets AAAA answers but, with no IPv6
//! address or route, programs fall back to the IPv4 ones.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpCidr, IpListenEndpoint, IpProtocol, Ipv4Address,
    Ipv4Packet, TcpPacket,
};
use vmm_sys_util::epoll::{Epoll, EpollEvent};

use super::dns::DnsQuery;
use super::tcp::{Flow, TcpConn};
use crate::protocol::transparent::{self, GATEWAY_IP, GATEWAY_MAC, MTU, PREFIX_LEN};
use crate::protocol::{DNS_PORT, TRANSPARENT_PORT};
use crate::vmm::devices::broker::Dialer;

/// Guest TCP connections open at once; a SYN beyond this is reset.
pub(super) const MAX_CONNECTIONS: usize = 256;
/// DNS questions waiting for the host at once; more are dropped (the
/// guest's resolver asks again).
const MAX_DNS_QUERIES: usize = 64;
/// A DNS question the host has not answered by now is dropped.
const DNS_TIMEOUT: Duration = Duration::from_secs(15);
/// Per-direction buffer of one TCP connection: the receive window the guest
/// sees and what the proxy may run ahead of the guest.
const TCP_BUFFER: usize = 256 * 1024;
/// Frames queued in each direction; past this the stack stops taking tx
/// chains (the guest waits) or stops sending (TCP retransmits).
const MAX_QUEUED_FRAMES: usize = 128;
const DNS_PORT_UDP: u16 = 53;
const EVENT_BATCH: usize = 64;

/// Ethernet frames in flight between the virtqueues and smoltcp.
struct Frames {
    incoming: VecDeque<Vec<u8>>,
    outgoing: VecDeque<Vec<u8>>,
}

struct RxToken(Vec<u8>);
struct TxToken<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0u8; len];
        let result = f(&mut frame);
        self.0.push_back(frame);
        result
    }
}

impl phy::Device for Frames {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(RxToken, TxToken<'_>)> {
        let frame = self.incoming.pop_front()?;
        Some((RxToken(frame), TxToken(&mut self.outgoing)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<TxToken<'_>> {
        (self.outgoing.len() < MAX_QUEUED_FRAMES).then_some(TxToken(&mut self.outgoing))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = max_frame();
        caps
    }
}

/// An Ethernet frame of a full MTU.
fn max_frame() -> usize {
    usize::from(MTU) + 14
}

pub(super) struct Stack {
    iface: Interface,
    sockets: SocketSet<'static>,
    frames: Frames,
    dialer: Dialer,
    /// Readiness of every brokered stream; nested in the worker's epoll.
    epoll: Epoll,
    conns: HashMap<u64, TcpConn>,
    udp: SocketHandle,
    dns: HashMap<u64, DnsQuery>,
    next_token: u64,
    epoch: Instant,
}

impl Stack {
    pub fn new(dialer: Dialer) -> io::Result<Stack> {
        let mut frames = Frames { incoming: VecDeque::new(), outgoing: VecDeque::new() };
        let mut config = Config::new(EthernetAddress(GATEWAY_MAC).into());
        let mut seed = [0u8; 8];
        getrandom(&mut seed);
        config.random_seed = u64::from_le_bytes(seed);
        let epoch = Instant::now();
        let mut iface = Interface::new(config, &mut frames, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(GATEWAY_IP), PREFIX_LEN));
        });
        // any_ip takes a packet for a foreign address when the route to it
        // leads to one of our own addresses: send everything to ourselves.
        iface.routes_mut().add_default_ipv4_route(GATEWAY_IP).map_err(|_| io::Error::other("route table full"))?;
        iface.set_any_ip(true);
        let mut sockets = SocketSet::new(Vec::new());
        let mut udp = udp::Socket::new(
            udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 64], vec![0u8; 64 * 1024]),
            udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 64], vec![0u8; 64 * 1024]),
        );
        udp.bind(IpListenEndpoint { addr: None, port: DNS_PORT_UDP }).map_err(io::Error::other)?;
        let udp = sockets.add(udp);
        Ok(Stack {
            iface,
            sockets,
            frames,
            dialer,
            epoll: Epoll::new()?,
            conns: HashMap::new(),
            udp,
            dns: HashMap::new(),
            next_token: 0,
            epoch,
        })
    }

    pub fn max_frame(&self) -> usize {
        max_frame()
    }

    pub fn wants_frames(&self) -> bool {
        self.frames.incoming.len() < MAX_QUEUED_FRAMES
    }

    /// Takes a frame from the guest (without the virtio header).
    pub fn push_frame(&mut self, frame: Vec<u8>) {
        if is_foreign_icmp(&frame) {
            return;
        }
        if let Some(flow) = syn_of(&frame) {
            self.prepare_listener(flow);
        }
        self.frames.incoming.push_back(frame);
    }

    pub fn has_frames_out(&self) -> bool {
        !self.frames.outgoing.is_empty()
    }

    pub fn pop_frame(&mut self) -> Option<Vec<u8>> {
        self.frames.outgoing.pop_front()
    }

    /// Drains the readiness of the streams; `poll` looks at all of them.
    pub fn process_events(&mut self) {
        let mut events = [EpollEvent::default(); EVENT_BATCH];
        while let Ok(n) = self.epoll.wait(0, &mut events) {
            if n < EVENT_BATCH {
                break;
            }
        }
    }

    /// How long until smoltcp has timers to run; `None` waits for events.
    pub fn poll_delay(&mut self) -> Option<Duration> {
        let now = self.now();
        let tcp = self.iface.poll_delay(now, &self.sockets).map(|d| Duration::from_micros(d.total_micros()));
        let dns = (!self.dns.is_empty()).then_some(Duration::from_secs(1));
        match (tcp, dns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the stack over the queued frames, moves data between sockets
    /// and streams, and runs it again to send what that produced.
    pub fn poll(&mut self) {
        let now = self.now();
        self.iface.poll(now, &mut self.frames, &mut self.sockets);
        self.serve_tcp();
        self.serve_dns();
        let now = self.now();
        self.iface.poll(now, &mut self.frames, &mut self.sockets);
        self.reap();
    }

    /// A listening socket for a SYN the stack has no socket for, so that
    /// smoltcp accepts it instead of answering RST.
    fn prepare_listener(&mut self, flow: Flow) {
        if self.conns.values().any(|c| c.flow == flow) {
            return;
        }
        if self.conns.len() >= MAX_CONNECTIONS {
            tracing::warn!("virtio-net: refusing {} -> {}: {MAX_CONNECTIONS} connections open", flow.src, flow.dst);
            return;
        }
        let mut socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; TCP_BUFFER]),
            tcp::SocketBuffer::new(vec![0u8; TCP_BUFFER]),
        );
        // The proxy decides when to send; holding small writes back only
        // adds latency to request/response traffic.
        socket.set_nagle_enabled(false);
        let endpoint = IpListenEndpoint { addr: Some(to_smol(flow.dst.ip())), port: flow.dst.port() };
        if socket.listen(endpoint).is_err() {
            return;
        }
        let handle = self.sockets.add(socket);
        let token = self.take_token();
        self.conns.insert(token, TcpConn::new(handle, flow, token));
    }

    fn serve_tcp(&mut self) {
        for conn in self.conns.values_mut() {
            let socket = self.sockets.get_mut::<tcp::Socket>(conn.handle);
            if !conn.is_bridged() && matches!(socket.state(), tcp::State::SynReceived | tcp::State::Established) {
                match dial_proxy(&mut self.dialer, conn.flow.dst) {
                    Ok(stream) => conn.bridge(stream),
                    Err(e) => {
                        tracing::warn!("virtio-net: cannot reach the proxy for {}: {e}", conn.flow.dst);
                        socket.abort();
                        continue;
                    }
                }
            }
            let result = conn.pump(socket).and_then(|()| conn.sync_interest(socket, &self.epoll));
            if let Err(e) = result {
                tracing::debug!("virtio-net: {} -> {} aborted: {e}", conn.flow.src, conn.flow.dst);
                conn.deregister(&self.epoll);
                socket.abort();
            }
        }
    }

    fn serve_dns(&mut self) {
        let mut answered = Vec::new();
        for (token, query) in &mut self.dns {
            match query.read() {
                Ok(Some(answer)) => answered.push((*token, Some(answer))),
                Ok(None) if query.started.elapsed() > DNS_TIMEOUT => answered.push((*token, None)),
                Ok(None) => {}
                Err(_) => answered.push((*token, None)),
            }
        }
        for (token, answer) in answered {
            let Some(query) = self.dns.remove(&token) else { continue };
            query.deregister(&self.epoll);
            if let Some(answer) = answer {
                let socket = self.sockets.get_mut::<udp::Socket>(self.udp);
                if let Err(e) = socket.send_slice(&answer, query.reply_to) {
                    tracing::debug!("virtio-net: DNS answer dropped: {e}");
                }
            }
        }
        loop {
            let socket = self.sockets.get_mut::<udp::Socket>(self.udp);
            let Ok((question, meta)) = socket.recv() else { break };
            if self.dns.len() >= MAX_DNS_QUERIES {
                tracing::debug!("virtio-net: DNS question dropped: {MAX_DNS_QUERIES} waiting");
                continue;
            }
            let question = question.to_vec();
            let token = self.next_token;
            self.next_token += 1;
            let sent = self.dialer.dial(DNS_PORT).and_then(|s| DnsQuery::send(s, &question, meta, &self.epoll, token));
            match sent {
                Ok(query) => {
                    self.dns.insert(token, query);
                }
                Err(e) => tracing::warn!("virtio-net: cannot ask the host's DNS: {e}"),
            }
        }
    }

    /// Forgets connections that are over: reset and sent, or closed by
    /// both sides. Listeners whose SYN smoltcp refused are dropped too.
    fn reap(&mut self) {
        let sockets = &mut self.sockets;
        let epoll = &self.epoll;
        self.conns.retain(|_, conn| {
            let socket = sockets.get::<tcp::Socket>(conn.handle);
            let over = match socket.state() {
                tcp::State::Listen | tcp::State::TimeWait => true,
                tcp::State::Closed => socket.remote_endpoint().is_none(),
                _ => false,
            };
            if over {
                conn.deregister(epoll);
                sockets.remove(conn.handle);
            }
            !over
        });
    }

    fn take_token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX))
    }

    #[cfg(test)]
    pub fn connections(&self) -> usize {
        self.conns.len()
    }
}

impl AsRawFd for Stack {
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

/// A stream to the proxy that starts with the flow's original destination.
fn dial_proxy(dialer: &mut Dialer, dst: SocketAddr) -> io::Result<std::os::unix::net::UnixStream> {
    use std::io::Write;
    let mut stream = dialer.dial(TRANSPARENT_PORT)?;
    // A fresh stream's buffer always has room for the few header bytes.
    stream.write_all(&transparent::encode(dst))?;
    Ok(stream)
}

/// ICMP for anything but the gateway. With any_ip, smoltcp would answer a
/// ping to every address itself, telling the guest that hosts the policy
/// denies are up; the gateway answers its own pings, the rest are dropped.
fn is_foreign_icmp(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else { return false };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return false;
    }
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else { return false };
    ip.next_header() == IpProtocol::Icmp && ip.dst_addr() != GATEWAY_IP
}

/// The flow of a frame that opens a TCP connection (SYN without ACK).
fn syn_of(frame: &[u8]) -> Option<Flow> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    if !tcp.syn() || tcp.ack() {
        return None;
    }
    Some(Flow {
        src: SocketAddr::new(IpAddr::V4(ip.src_addr()), tcp.src_port()),
        dst: SocketAddr::new(IpAddr::V4(ip.dst_addr()), tcp.dst_port()),
    })
}

fn to_smol(ip: IpAddr) -> IpAddress {
    match ip {
        IpAddr::V4(v4) => IpAddress::Ipv4(v4),
        // The guest has no IPv6 address, so no IPv6 SYN reaches here.
        IpAddr::V6(_) => IpAddress::Ipv4(Ipv4Address::UNSPECIFIED),
    }
}

/// Seeds TCP sequence numbers; any value works, a random one avoids
/// collisions with an earlier run's connections.
fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(buf);
    }
}
