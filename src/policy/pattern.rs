//! Host patterns and ports as written in policy files and `--allow`, and the
//! destinations they are matched against.
//!
//! Syntax of a rule: `HOST[:PORT]` where HOST is a name (`github.com`), a
//! wildcard over subdomains (`*.crates.io`: any depth, not the apex itself),
//! `*` (any name, never an IP address), or an IP literal (`10.0.0.5`,
//! `[::1]`); PORT is a number or `*`. What a missing port means depends on the
//! list: allow rules mean the web ports 80 and 443, deny rules every port.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use thiserror::Error;

/// Why a host, port or rule was refused, in words that fit after the
/// offending text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PatternError {
    #[error("the host is empty")]
    Empty,
    #[error("{0:?} is not a host name: use letters, digits, '-' and '.' (non-ASCII names in their xn-- form)")]
    BadName(String),
    #[error("{0:?} is too long for a host name (at most 253 characters, 63 per label)")]
    TooLong(String),
    #[error("{0:?} is not a valid port: use 1-65535 or *")]
    BadPort(String),
    #[error("{0:?}: a wildcard must be a whole first label, as in *.example.com")]
    BadWildcard(String),
    #[error("{0:?} is not a host name: its last label is numeric (write IP addresses in dotted or [v6] form)")]
    NumericName(String),
}

/// A TCP port, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port(u16);

impl Port {
    pub const HTTP: Port = Port(80);
    pub const HTTPS: Port = Port(443);
    pub const SSH: Port = Port(22);

    pub fn new(port: u16) -> Option<Port> {
        (port != 0).then_some(Port(port))
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Port {
    type Err = PatternError;

    fn from_str(text: &str) -> Result<Port, PatternError> {
        text.parse::<u16>().ok().and_then(Port::new).ok_or_else(|| PatternError::BadPort(text.to_string()))
    }
}

/// A destination host: a normalized DNS name or an IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lower-case ASCII, no trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as a client names it (CONNECT target, URL authority,
    /// SNI, DNS question): IP literals with or without brackets, names
    /// normalized to lower case without a trailing dot.
    pub fn parse(text: &str) -> Result<Host, PatternError> {
        let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Host::Ip(canonical_ip(ip)));
        }
        normalize_name(text).map(Host::Name)
    }

    pub fn name(&self) -> Option<&str> {
        match self {
            Host::Name(name) => Some(name),
            Host::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(IpAddr::V4(ip)) => ip.fmt(f),
        }
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are the IPv4 address: the
/// kernel connects to the IPv4 host, so rules and address checks must see it.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Lower-cases and checks a DNS name: ASCII labels of letters, digits, '-'
/// and '_' (some service names use it), 1-63 characters each, 253 in all.
fn normalize_name(text: &str) -> Result<String, PatternError> {
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    if name.is_empty() {
        return Err(PatternError::Empty);
    }
    if name.len() > 253 {
        return Err(PatternError::TooLong(text.to_string()));
    }
    for label in name.split('.') {
        if label.is_empty() || !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(PatternError::BadName(text.to_string()));
        }
        if label.len() > 63 {
            return Err(PatternError::TooLong(text.to_string()));
        }
    }
    // "2130706433" or "10.1" are IP addresses to some resolvers: refusing them
    // as names keeps an IP literal from slipping past the IP-literal rules.
    if name.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit())) {
        return Err(PatternError::NumericName(text.to_string()));
    }
    Ok(name)
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name.
    Exact(String),
    /// Any strict subdomain of this name (`*.crates.io` stores `crates.io`).
    Subdomains(String),
    /// Any name at all (`*`); IP addresses still need their own rule.
    AnyName,
    /// Exactly this address.
    Ip(IpAddr),
}

impl HostPattern {
    pub fn parse(text: &str) -> Result<HostPattern, PatternError> {
        if text == "*" {
            return Ok(HostPattern::AnyName);
        }
        if let Some(rest) = text.strip_prefix("*.") {
            return match Host::parse(rest)? {
                Host::Name(name) => Ok(HostPattern::Subdomains(name)),
                Host::Ip(_) => Err(PatternError::BadWildcard(text.to_string())),
            };
        }
        if text.contains('*') {
            return Err(PatternError::BadWildcard(text.to_string()));
        }
        Ok(match Host::parse(text)? {
            Host::Name(name) => HostPattern::Exact(name),
            Host::Ip(ip) => HostPattern::Ip(ip),
        })
    }

    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(pattern), Host::Name(name)) => pattern == name,
            (HostPattern::Subdomains(parent), Host::Name(name)) => {
                name.len() > parent.len() + 1
                    && name.ends_with(parent.as_str())
                    && name.as_bytes()[name.len() - parent.len() - 1] == b'.'
            }
            (HostPattern::AnyName, Host::Name(_)) => true,
            (HostPattern::Ip(pattern), Host::Ip(ip)) => pattern == ip,
            _ => false,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Subdomains(parent) => write!(f, "*.{parent}"),
            HostPattern::AnyName => f.write_str("*"),
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            HostPattern::Ip(IpAddr::V4(ip)) => ip.fmt(f),
        }
    }
}

/// The port part of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpec {
    /// 80 and 443: what an allow rule without a port means.
    Web,
    /// Every port: what a deny rule without a port means, and `:*`.
    Any,
    One(Port),
}

impl PortSpec {
    pub fn matches(self, port: Port) -> bool {
        match self {
            PortSpec::Web => port == Port::HTTP || port == Port::HTTPS,
            PortSpec::Any => true,
            PortSpec::One(p) => p == port,
        }
    }
}

/// One `HOST[:PORT]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRule {
    pub host: HostPattern,
    pub ports: PortSpec,
}

impl HostRule {
    /// Parses `HOST[:PORT]`; `default_ports` is what a missing port means.
    pub fn parse(text: &str, default_ports: PortSpec) -> Result<HostRule, PatternError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(PatternError::Empty);
        }
        let (host, port) = split_host_port(text);
        let ports = match port {
            None => default_ports,
            Some("*") => PortSpec::Any,
            Some(p) => PortSpec::One(p.parse()?),
        };
        Ok(HostRule { host: HostPattern::parse(host)?, ports })
    }

    pub fn matches(&self, host: &Host, port: Port) -> bool {
        self.ports.matches(port) && self.host.matches(host)
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ports {
            PortSpec::Web => self.host.fmt(f),
            PortSpec::Any => write!(f, "{}:*", self.host),
            PortSpec::One(port) => write!(f, "{}:{port}", self.host),
        }
    }
}

/// Splits `host:port`, `[v6]:port`, `[v6]`, and a bare IPv6 address (which
/// has no port, since its colons are its own).
fn split_host_port(text: &str) -> (&str, Option<&str>) {
    if text.starts_with('[') {
        if let Some(end) = text.find(']') {
            let rest = &text[end + 1..];
            return (&text[..=end], rest.strip_prefix(':'));
        }
        return (text, None);
    }
    if text.parse::<Ipv6Addr>().is_ok() {
        return (text, None);
    }
    match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(text: &str) -> Host {
        Host::parse(text).unwrap()
    }

    fn rule(text: &str) -> HostRule {
        HostRule::parse(text, PortSpec::Web).unwrap()
    }

    #[test]
    fn exact_names_match_only_themselves_case_insensitively() {
        let r = rule("GitHub.com");
        assert!(r.matches(&host("github.com"), Port::HTTPS));
        assert!(r.matches(&host("GITHUB.COM."), Port::HTTP));
        assert!(!r.matches(&host("api.github.com"), Port::HTTPS));
        assert!(!r.matches(&host("evilgithub.com"), Port::HTTPS));
    }

    #[test]
    fn allow_rules_without_a_port_mean_the_web_ports() {
        let r = rule("example.com");
        assert!(r.matches(&host("example.com"), Port::HTTPS));
        assert!(!r.matches(&host("example.com"), Port::new(22).unwrap()));
        let any = rule("example.com:*");
        assert!(any.matches(&host("example.com"), Port::new(22).unwrap()));
        let one = rule("example.com:8443");
        assert!(one.matches(&host("example.com"), Port::new(8443).unwrap()));
        assert!(!one.matches(&host("example.com"), Port::HTTPS));
    }

    #[test]
    fn wildcards_match_subdomains_at_any_depth_but_not_the_apex() {
        let r = rule("*.crates.io");
        assert!(r.matches(&host("index.crates.io"), Port::HTTPS));
        assert!(r.matches(&host("a.b.crates.io"), Port::HTTPS));
        assert!(!r.matches(&host("crates.io"), Port::HTTPS));
        assert!(!r.matches(&host("evilcrates.io"), Port::HTTPS));
    }

    #[test]
    fn star_matches_names_but_not_ip_addresses() {
        let r = rule("*:*");
        assert!(r.matches(&host("anything.example"), Port::new(1).unwrap()));
        assert!(!r.matches(&host("10.0.0.1"), Port::HTTPS));
    }

    #[test]
    fn ip_literals_match_only_ip_rules() {
        assert!(rule("10.0.0.5:8080").matches(&host("10.0.0.5"), Port::new(8080).unwrap()));
        assert!(rule("[::1]:4873").matches(&host("[::1]"), Port::new(4873).unwrap()));
        assert!(rule("::1").matches(&host("::1"), Port::HTTPS));
        // The mapped form is the IPv4 address it maps.
        assert!(rule("10.0.0.5").matches(&host("[::ffff:10.0.0.5]"), Port::HTTPS));
        assert!(!rule("example.com").matches(&host("93.184.216.34"), Port::HTTPS));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["", "exa mple.com", "ex*ample.com", "*.10.0.0.1", "host:0", "host:70000", "host:x", "é.com", "a..b"]
        {
            assert!(HostRule::parse(bad, PortSpec::Web).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn numeric_names_are_not_names() {
        assert!(matches!(Host::parse("2130706433"), Err(PatternError::NumericName(_))));
        assert!(matches!(Host::parse("10.1"), Err(PatternError::NumericName(_))));
        assert!(Host::parse("1password.com").is_ok());
    }

    #[test]
    fn rules_print_as_written() {
        for text in ["github.com", "*.crates.io", "github.com:443", "[::1]:4873", "10.0.0.1", "*", "x.org:*"] {
            assert_eq!(rule(text).to_string(), text);
        }
    }
}
