//! What the proxy told the guest: every address it gave in a DNS answer,
//! with the names it gave it for. A transparent connection arrives with an
//! address only; this is how the proxy knows which names the guest may
//! mean by it (and that an address it never gave names nothing).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;

use crate::policy::Host;

/// Addresses remembered at most; past this an arbitrary one is forgotten
/// (a guest that resolves that many names can resolve again).
const MAX_ADDRESSES: usize = 16 * 1024;
/// Names remembered per address (a shared CDN address serves many).
const MAX_NAMES_PER_ADDRESS: usize = 64;

#[derive(Default)]
pub struct Names {
    by_addr: Mutex<HashMap<IpAddr, HashSet<Host>>>,
}

impl Names {
    /// Remembers that `name` was answered with `addr`.
    pub fn learn(&self, addr: IpAddr, name: &Host) {
        let mut map = self.by_addr.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&addr) {
            if let Some(old) = map.keys().next().copied() {
                map.remove(&old);
            }
        }
        let names = map.entry(addr).or_default();
        if names.len() < MAX_NAMES_PER_ADDRESS {
            names.insert(name.clone());
        }
    }

    /// The names `addr` was given for.
    pub fn of(&self, addr: IpAddr) -> HashSet<Host> {
        let map = self.by_addr.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&addr).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_every_name_an_address_was_given_for() {
        let names = Names::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(names.of(ip).is_empty());
        names.learn(ip, &Host::parse("a.example").unwrap());
        names.learn(ip, &Host::parse("b.example").unwrap());
        let got = names.of(ip);
        assert!(got.contains(&Host::parse("A.example.").unwrap()) && got.len() == 2, "{got:?}");
    }
}
