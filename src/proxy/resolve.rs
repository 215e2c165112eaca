//! From an allowed host to the addresses the proxy connects to: pinned
//! `[network.hosts]` entries, IP literals, or DNS through hickory (no libc
//! resolver: the binary is static). Internal addresses are dropped unless
//! the rule allows them, and the proxy connects to exactly the addresses
//! returned here, so a second DNS answer cannot rebind the name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;

use crate::policy::is_internal;
use crate::policy::{Denial, Host, Policy, Port, canonical_ip, is_host_alias};

/// The TTL given to the guest for answers: short, so policy changes of the
/// next session and DNS changes upstream show quickly.
const MAX_TTL: Duration = Duration::from_secs(300);

/// Why there is nowhere to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// Every address is internal and the rule does not allow that.
    Denied(Denial),
    /// DNS had no address, or failed.
    NotFound(String),
}

/// A DNS answer for the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Addrs(Vec<IpAddr>, Duration),
    /// The name does not exist.
    NxDomain,
    Failed(String),
}

pub struct Resolver {
    /// The system's resolver configuration, or why it could not be read.
    system: Result<TokioResolver, String>,
}

impl Resolver {
    /// Reads /etc/resolv.conf and /etc/hosts. A host without them still
    /// gets a proxy: IP rules and pinned names work, and DNS lookups fail
    /// with the reason.
    pub fn from_system() -> Resolver {
        let system = TokioResolver::builder_tokio().map(|b| b.build()).map_err(|e| {
            tracing::warn!("no DNS resolver: {e}");
            format!("cannot read the system DNS configuration: {e}")
        });
        Resolver { system }
    }

    /// A resolver that knows no names (tests).
    #[cfg(test)]
    pub fn none() -> Resolver {
        Resolver { system: Err("no DNS in this test".into()) }
    }

    /// The addresses of a name, for the proxy.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        let resolver = self.system.as_ref().map_err(Clone::clone)?;
        // The trailing dot stops search-domain expansion: the guest's names
        // are asked as they are, and nothing else leaves the host.
        let lookup = resolver.lookup_ip(format!("{name}.")).await.map_err(|e| format!("cannot resolve {name}: {e}"))?;
        Ok(lookup.iter().map(canonical_ip).collect())
    }

    /// The A or AAAA records of a name, for a DNS answer.
    pub async fn records(&self, name: &str, kind: RecordType) -> Answer {
        let resolver = match &self.system {
            Ok(r) => r,
            Err(reason) => return Answer::Failed(reason.clone()),
        };
        match resolver.lookup(format!("{name}."), kind).await {
            Ok(lookup) => {
                let ttl = lookup.valid_until().saturating_duration_since(std::time::Instant::now()).min(MAX_TTL);
                let addrs = lookup
                    .iter()
                    .filter_map(|r| match r {
                        RData::A(a) => Some(IpAddr::V4(a.0)),
                        RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                        _ => None,
                    })
                    .collect();
                Answer::Addrs(addrs, ttl)
            }
            Err(e) if e.is_nx_domain() => Answer::NxDomain,
            Err(e) if e.is_no_records_found() => Answer::Addrs(Vec::new(), MAX_TTL),
            Err(e) => Answer::Failed(e.to_string()),
        }
    }
}

/// The addresses to connect to for an allowed destination.
pub async fn destination(
    policy: &Policy,
    resolver: &Resolver,
    host: &Host,
    port: Port,
    private_ok: bool,
) -> Result<Vec<SocketAddr>, Unreachable> {
    let addrs = match host {
        // The host's own services (`host_ports`): its loopback, both families.
        _ if is_host_alias(host) => vec![IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)],
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => match policy.pinned(name) {
            Some(ip) => vec![ip],
            None => resolver.lookup(name).await.map_err(Unreachable::NotFound)?,
        },
    };
    let addrs = permitted(addrs, private_ok)?;
    Ok(addrs.into_iter().map(|ip| SocketAddr::new(ip, port.get())).collect())
}

/// Drops internal addresses unless allowed; refuses when none is left.
pub fn permitted(addrs: Vec<IpAddr>, private_ok: bool) -> Result<Vec<IpAddr>, Unreachable> {
    let Some(&first) = addrs.first() else {
        return Err(Unreachable::NotFound("no address".into()));
    };
    if private_ok {
        return Ok(addrs);
    }
    let public: Vec<IpAddr> = addrs.into_iter().filter(|ip| !is_internal(*ip)).collect();
    if public.is_empty() {
        return Err(Unreachable::Denied(Denial::PrivateAddress(first)));
    }
    Ok(public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn pinned_names_resolve_without_dns_and_still_meet_the_address_check() {
        let policy =
            parse("[network.hosts]\n\"api.test\" = \"127.0.0.1\"\n\"lan.test\" = \"10.1.2.3\"\n", "t").unwrap();
        let resolver = Resolver::none();
        let api = Host::parse("api.test").unwrap();
        let refused = block_on(destination(&policy, &resolver, &api, Port::HTTPS, false));
        assert_eq!(refused, Err(Unreachable::Denied(Denial::PrivateAddress("127.0.0.1".parse().unwrap()))));
        let lan = Host::parse("lan.test").unwrap();
        assert!(matches!(
            block_on(destination(&policy, &resolver, &lan, Port::HTTPS, false)),
            Err(Unreachable::Denied(_))
        ));
        let allowed = block_on(destination(&policy, &resolver, &api, Port::HTTPS, true)).unwrap();
        assert_eq!(allowed, ["127.0.0.1:443".parse().unwrap()]);
    }

    #[test]
    fn internal_addresses_are_dropped_from_a_mixed_answer() {
        let addrs = vec!["127.0.0.1".parse().unwrap(), "93.184.216.34".parse().unwrap()];
        assert_eq!(permitted(addrs, false).unwrap(), ["93.184.216.34".parse::<IpAddr>().unwrap()]);
    }
}
