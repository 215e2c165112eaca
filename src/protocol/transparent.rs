//! The guest's own network on the virtio-net device, and the header the VMM
//! puts before each transparent connection it hands to the host's proxy.
//!
//! Static addresses (no DHCP): the guest is `GUEST_IP`/`PREFIX_LEN`, the
//! VMM's userspace stack answers as `GATEWAY_IP` and, for TCP, as every
//! address the guest dials.
//!
//! Header wire format: one family byte (4 or 6), the address (4 or 16
//! bytes), the port (2 bytes big-endian).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const GATEWAY_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const PREFIX_LEN: u8 = 24;
/// The name the guest reaches the host's own services by (only the ports a
/// policy lists in `host_ports`): the proxy's DNS answers it with
/// `GATEWAY_IP`, and connections to the gateway go to the host's loopback.
pub const HOST_ALIAS: &str = "host.stockade.internal";
/// Locally administered unicast addresses.
pub const GUEST_MAC: [u8; 6] = [0x02, 0x57, 0x4b, 0x00, 0x00, 0x02];
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0x57, 0x4b, 0x00, 0x00, 0x01];
/// The guest interface's MTU. Far above Ethernet's 1500: every frame costs
/// a queue round trip, and nothing here is a real wire.
pub const MTU: u16 = 65_520;

/// The longest header: family, IPv6 address, port.
pub const MAX_HEADER: usize = 1 + 16 + 2;

/// Encodes the original destination of a transparent connection.
pub fn encode(dst: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_HEADER);
    match dst.ip() {
        IpAddr::V4(v4) => {
            out.push(4);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
    }
    out.extend_from_slice(&dst.port().to_be_bytes());
    out
}

/// How many bytes follow the family byte.
pub fn rest_len(family: u8) -> io::Result<usize> {
    match family {
        4 => Ok(4 + 2),
        6 => Ok(16 + 2),
        other => Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown address family {other}"))),
    }
}

/// The destination from the family byte and the `rest_len` bytes after it.
pub fn decode(family: u8, rest: &[u8]) -> io::Result<SocketAddr> {
    if rest.len() != rest_len(family)? {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "truncated transparent header"));
    }
    let (addr, port) = rest.split_at(rest.len() - 2);
    let ip = match family {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(addr).unwrap_or_default())),
        _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(addr).unwrap_or_default())),
    };
    Ok(SocketAddr::new(ip, u16::from_be_bytes([port[0], port[1]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        for dst in ["93.184.216.34:443", "[2001:db8::1]:8080"] {
            let dst: SocketAddr = dst.parse().unwrap();
            let wire = encode(dst);
            assert_eq!(wire.len(), 1 + rest_len(wire[0]).unwrap());
            assert_eq!(decode(wire[0], &wire[1..]).unwrap(), dst);
        }
        assert!(rest_len(5).is_err());
        assert!(decode(4, &[1, 2]).is_err());
    }
}
