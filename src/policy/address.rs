//! Which resolved addresses the guest may not reach through a name: this
//! machine, the local networks, and the cloud metadata service. A rule that
//! spells out the address, or `allow_private`, lifts this.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::pattern::canonical_ip;

/// Whether `ip` is loopback, private, link-local, shared (CGNAT),
/// unspecified, multicast, broadcast or reserved: anything that is not a
/// public unicast address.
pub fn is_internal(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => is_internal_v6(v6),
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || a == 0 // "this network"
        || ip.is_loopback() // 127/8
        || ip.is_private() // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local() // 169.254/16, with the metadata service 169.254.169.254
        || (a == 100 && (64..128).contains(&b)) // 100.64/10 shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // 192.0.0/24 IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // 198.18/15 benchmarking
        || ip.is_multicast() // 224/4
        || a >= 240 // 240/4 reserved, and the broadcast address
}

fn is_internal_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    // Addresses that carry an IPv4 address reach that address.
    let embedded = |hi: u16, lo: u16| {
        let ([a, b], [c, d]) = (hi.to_be_bytes(), lo.to_be_bytes());
        Ipv4Addr::new(a, b, c, d)
    };
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
        return is_internal_v4(embedded(seg[6], seg[7])); // NAT64 64:ff9b::/96
    }
    if seg[0] == 0x2002 {
        return is_internal_v4(embedded(seg[1], seg[2])); // 6to4 2002::/16
    }
    if seg[0..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        return is_internal_v4(embedded(seg[6], seg[7])); // deprecated IPv4-compatible ::a.b.c.d
    }
    ip.is_unspecified()
        || ip.is_loopback()
        || (seg[0] & 0xfe00) == 0xfc00 // fc00::/7 unique local (with AWS's fd00:ec2::254)
        || (seg[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
        || (seg[0] & 0xffc0) == 0xfec0 // fec0::/10 old site-local
        || ip.is_multicast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn internal(text: &str) -> bool {
        is_internal(text.parse().unwrap())
    }

    #[test]
    fn refuses_loopback_private_link_local_cgnat_and_metadata() {
        for addr in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:c0a8:101::1",
        ] {
            assert!(internal(addr), "{addr} should be internal");
        }
    }

    #[test]
    fn allows_public_addresses() {
        for addr in [
            "1.1.1.1",
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(!internal(addr), "{addr} should be public");
        }
    }
}
