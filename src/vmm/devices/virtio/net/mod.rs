//! virtio-net (virtio spec 5.1) without a host network interface: the
//! guest's frames go to a userspace TCP/IP stack (smoltcp) in the VMM,
//! which terminates every guest TCP connection, whatever its destination,
//! and hands it with its original destination to the host's egress proxy
//! over a brokered stream (`TRANSPARENT_PORT`). UDP to port 53 is answered
//! through the proxy's DNS (`DNS_PORT`); other UDP goes nowhere.
//!
//! `device` is what the transport sees, `event_handler` what the worker
//! does with kicks, stream readiness and timers, `queues` moves frames
//! between the virtqueues and the stack, `stack` is the smoltcp interface
//! and its sockets, `tcp` one terminated connection, `dns` one guest DNS
//! question on its way to the host.

mod device;
mod dns;
mod event_handler;
mod queues;
mod stack;
mod tcp;

#[cfg(test)]
mod tests;

use super::{DeviceError, Env, Instance, Registration};
use crate::jail::seccomp::{BROKERED, WORKER};
use crate::jail::{DeviceThread, Openat};

pub use device::Net;

/// Device type id (virtio spec 5).
pub const TYPE_NET: u32 = 1;
/// Queue order (virtio spec 5.1.2): one receive and one transmit queue.
const RX_QUEUE: usize = 0;
const TX_QUEUE: usize = 1;
const NUM_QUEUES: usize = TX_QUEUE + 1;
const QUEUE_SIZE: u16 = 256;

/// The device's MAC address is in config space.
const VIRTIO_NET_F_MAC: u64 = 1 << 5;
/// The device's MTU is in config space.
const VIRTIO_NET_F_MTU: u64 = 1 << 3;

/// The header before every frame in both directions (virtio_net_hdr_v1):
/// flags, gso type, header length, gso size, checksum start and offset,
/// buffer count. No offloads are offered, so only the buffer count matters.
const NET_HDR_LEN: usize = 12;

/// The worker talks to the proxy over streams the supervisor's broker
/// connected; smoltcp itself asks nothing of the kernel but the clock.
pub const THREAD: DeviceThread =
    DeviceThread { name: "virtio-net", syscalls: &[WORKER, BROKERED], openat: Openat::Never, on_descriptor: &[] };

pub const REGISTRATION: Registration = Registration { threads: &[&THREAD], create };

/// Only when the configuration asks for transparent networking.
fn create(env: &Env) -> Result<Vec<Instance>, DeviceError> {
    if !env.config.network {
        return Ok(Vec::new());
    }
    let net = Net::new(env.dialer.clone()).map_err(DeviceError::io(THREAD.name))?;
    Ok(vec![Instance { name: THREAD.name, device: Box::new(net) }])
}
