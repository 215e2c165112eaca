//! virtio-net (virtio spec 5.1) without a host network interface: the
//! guest's frames go to a userspace TCP/IP stack (smoltcp) in the VMM,
//! which terminates every guest TCP connection, whatever its destination,
//! and hands it with its original destination to the host's egress proxy
//! over a brokered stream (`TRANSPARENT_PORT`). UDP to port 53 is answered
//! through the proxy's DNS (`DNS_PORT`); other UDP goes nowhere.
//!
//! `device` is what the transport sees, `worker` the thread, `queues` moves
//! frames between the virtqueues and the stack, `stack` is the smoltcp
//! interface and its sockets, `tcp` one terminated connection, `dns` one
//! guest DNS question on its way to the host.

mod device;
mod dns;
mod queues;
mod stack;
mod tcp;
mod worker;

#[cfg(test)]
mod tests;

pub use device::Net;
