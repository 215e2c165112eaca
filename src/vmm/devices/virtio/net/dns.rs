//! One guest DNS question on its way to the host: the UDP datagram is sent
//! on its own brokered stream to `DNS_PORT`, framed as over TCP, so a slow
//! answer holds up no other question; the answer goes back to the guest
//! from the address it asked.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use smoltcp::socket::udp::UdpMetadata;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

pub(super) struct DnsQuery {
    stream: UnixStream,
    pub reply_to: UdpMetadata,
    pub started: Instant,
    answer: Vec<u8>,
}

impl DnsQuery {
    /// Sends `query` on `stream` and waits for the answer through `epoll`.
    pub fn send(
        mut stream: UnixStream,
        query: &[u8],
        reply_to: UdpMetadata,
        epoll: &Epoll,
        token: u64,
    ) -> io::Result<DnsQuery> {
        let len = u16::try_from(query.len()).map_err(|_| io::Error::other("DNS query too long"))?;
        let mut framed = Vec::with_capacity(query.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(query);
        // A fresh stream's buffer takes a whole UDP-sized message.
        stream.write_all(&framed)?;
        epoll.ctl(ControlOperation::Add, stream.as_raw_fd(), EpollEvent::new(EventSet::IN, token))?;
        Ok(DnsQuery { stream, reply_to, started: Instant::now(), answer: Vec::new() })
    }

    /// The answer once it is complete; `Err` when the host gave none.
    pub fn read(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
            if let Some(answer) = self.complete() {
                return Ok(Some(answer));
            }
        }
        Ok(self.complete())
    }

    fn complete(&self) -> Option<Vec<u8>> {
        let len = usize::from(u16::from_be_bytes([*self.answer.first()?, *self.answer.get(1)?]));
        self.answer.get(2..2 + len).map(<[u8]>::to_vec)
    }

    pub fn deregister(&self, epoll: &Epoll) {
        let _ = epoll.ctl(ControlOperation::Delete, self.stream.as_raw_fd(), EpollEvent::default());
    }
}
