//! Published ports (`run -p [HOST_ADDR:]HOST_PORT:GUEST_PORT`): what the user
//! asks for, and the header the init's dial-back on `PUBLISH_PORT` starts
//! with (after the token).
//!
//! A host client connects; the host sends `HostMsg::Connect { id, port }`;
//! the init connects to `port` on the guest's loopback, dials back with a
//! [`Callback`] saying whether anything answered, and then the connection
//! carries the client's bytes both ways. Ids are the host's and matched
//! once: a dial-back naming no waiting client is refused and reported.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::str::FromStr;

/// One `-p`: a host address and port forwarded to a guest port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// `None`: the host's loopback, IPv4 and IPv6 both.
    pub addr: Option<IpAddr>,
    pub host_port: u16,
    pub guest_port: u16,
}

impl Published {
    /// The host side as users type it into a browser.
    pub fn host(&self) -> String {
        match self.addr {
            None => format!("localhost:{}", self.host_port),
            Some(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.host_port),
            Some(IpAddr::V4(ip)) => format!("{ip}:{}", self.host_port),
        }
    }
}

impl fmt::Display for Published {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> guest port {}", self.host(), self.guest_port)
    }
}

impl FromStr for Published {
    type Err = String;

    fn from_str(text: &str) -> Result<Published, String> {
        let usage = || {
            format!("{text:?} is not [HOST_ADDR:]HOST_PORT:GUEST_PORT: say e.g. -p 8080:8080 or -p 127.0.0.1:3000:3000")
        };
        let (rest, guest) = text.rsplit_once(':').ok_or_else(usage)?;
        let (addr, host) = match rest.rsplit_once(':') {
            // An IPv6 address has colons of its own: it comes in brackets.
            Some((addr, host)) if !rest.ends_with(']') => (Some(addr), host),
            _ => (None, rest),
        };
        let port = |what: &str, value: &str| match value.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("{text:?}: the {what} port {value:?} is not a port from 1 to 65535")),
            Ok(port) => Ok(port),
        };
        let host_port = port("host", host)?;
        let guest_port = port("guest", guest)?;
        let addr = match addr {
            None => None,
            Some(addr) => {
                let bare = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(addr);
                let ip = bare.parse::<IpAddr>().map_err(|_| {
                    format!("{text:?}: {addr:?} is not an IP address (IPv6 goes in brackets: [::1]:8080:8080)")
                })?;
                Some(ip)
            }
        };
        Ok(Published { addr, host_port, guest_port })
    }
}

/// What a dial-back starts with, after the token: which host client it is
/// for, and whether the guest port answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Callback {
    pub id: u64,
    /// False when nothing listens on the guest port: the host then closes
    /// the client's connection and tells the user at the end of the run.
    pub reached: bool,
}

impl Callback {
    const LEN: usize = 9;

    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut bytes = [0u8; Self::LEN];
        bytes[..8].copy_from_slice(&self.id.to_le_bytes());
        bytes[8] = u8::from(self.reached);
        out.write_all(&bytes)?;
        out.flush()
    }

    pub fn read(input: &mut impl Read) -> io::Result<Callback> {
        let mut bytes = [0u8; Self::LEN];
        input.read_exact(&mut bytes)?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[..8]);
        let reached = match bytes[8] {
            0 => false,
            1 => true,
            other => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad reached byte {other}"))),
        };
        Ok(Callback { id: u64::from_le_bytes(id), reached })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Published, String> {
        text.parse()
    }

    #[test]
    fn ports_parse_with_and_without_an_address() {
        assert_eq!(parse("8080:80"), Ok(Published { addr: None, host_port: 8080, guest_port: 80 }));
        let v4 = parse("0.0.0.0:3000:3000").unwrap();
        assert_eq!(v4.addr, Some("0.0.0.0".parse().unwrap()));
        assert_eq!(v4.host(), "0.0.0.0:3000");
        let v6 = parse("[::1]:8443:443").unwrap();
        assert_eq!((v6.addr, v6.host_port, v6.guest_port), (Some("::1".parse().unwrap()), 8443, 443));
        assert_eq!(v6.host(), "[::1]:8443");
        assert_eq!(parse("5173:5173").unwrap().to_string(), "localhost:5173 -> guest port 5173");
    }

    #[test]
    fn bad_ports_say_what_to_type() {
        for (text, says) in [
            ("8080", "HOST_PORT:GUEST_PORT"),
            ("0:80", "host port \"0\""),
            ("80:70000", "guest port \"70000\""),
            ("localhost:80:80", "not an IP address"),
            (":80", "host port \"\""),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_callback_round_trips_and_refuses_junk() {
        let mut wire = Vec::new();
        Callback { id: 7, reached: true }.write(&mut wire).unwrap();
        assert_eq!(Callback::read(&mut wire.as_slice()).unwrap(), Callback { id: 7, reached: true });
        wire[8] = 9;
        assert!(Callback::read(&mut wire.as_slice()).is_err());
        assert!(Callback::read(&mut &wire[..4]).is_err());
    }
}
