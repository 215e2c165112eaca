//! Which host ports the guest may dial, and from which guest ports.
//!
//! The init's ports (control, stdin, changes) take connections only from a
//! privileged guest port (below 1024), which in Linux only a process with
//! CAP_NET_BIND_SERVICE can bind; a process running as the user's uid is
//! refused with RST before the host hears of it. They also have connection
//! slots of their own, so the guest cannot crowd the init out by holding
//! every other slot open. Ports offered to any guest process (the proxy,
//! the ssh-agent relay) are named; any other port, among them the ones only the VMM's own
//! network device dials (DNS, transparent TCP), is refused.

use crate::protocol::auth::{INIT_PORTS, PRIVILEGED_PORTS};

/// Why a connection request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The host offers the guest nothing on this port.
    NotOffered,
    /// An init port asked from a port any guest process can bind.
    Unprivileged,
}

/// Which slots a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Init,
    Open,
}

#[derive(Debug, Clone)]
pub struct HostPorts {
    init: Vec<u32>,
    /// `None`: every other port (for tests of the device itself).
    open: Option<Vec<u32>>,
}

impl HostPorts {
    /// stockade's guest: the init's ports, the egress proxy for its
    /// forwarder and the ssh-agent relay for its socket (and any program
    /// that speaks vsock to them directly; they meet the same policy).
    pub fn stockade() -> HostPorts {
        let open = vec![crate::protocol::PROXY_PORT, crate::protocol::AGENT_PORT];
        HostPorts { init: INIT_PORTS.to_vec(), open: Some(open) }
    }

    /// The init's ports as in `stockade`, every other port open.
    #[cfg(test)]
    pub fn any_other() -> HostPorts {
        HostPorts { init: INIT_PORTS.to_vec(), open: None }
    }

    pub(super) fn is_init(&self, host_port: u32) -> bool {
        self.init.contains(&host_port)
    }

    pub(super) fn admit(&self, host_port: u32, guest_port: u32) -> Result<Class, Refusal> {
        if self.is_init(host_port) {
            return if guest_port < PRIVILEGED_PORTS { Ok(Class::Init) } else { Err(Refusal::Unprivileged) };
        }
        match &self.open {
            Some(open) if !open.contains(&host_port) => Err(Refusal::NotOffered),
            _ => Ok(Class::Open),
        }
    }
}
