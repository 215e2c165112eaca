//! virtio-vsock (virtio spec 5.10): stream sockets from the guest to the
//! host. Only the guest dials: a connection to the host (CID 2) on port P is
//! bridged to the Unix socket "{uds_base}_{P}", as in Firecracker's hybrid
//! vsock, through the supervisor's broker (`devices::broker`), since the jailed VMM
//! opens no sockets itself.
//!
//! Which ports the guest may dial, and from where, is `ports`: the init's
//! own ports only from privileged guest ports (see `protocol::auth`).
//!
//! `device` is what the transport sees, `event_handler` what the worker
//! does with kicks and connection readiness, `muxer` the protocol engine
//! over all connections, `connection` one bridged stream with its credit
//! accounting, `packet` the wire header.

mod connection;
mod device;
mod error;
mod event_handler;
mod muxer;
mod packet;
mod ports;

#[cfg(test)]
mod tests;

use super::{DeviceError, Env, Instance, Registration};
use crate::jail::seccomp::{BROKERED, WORKER};
use crate::jail::{DeviceThread, Openat};

pub use device::Vsock;
pub use ports::HostPorts;

/// Device type id (virtio spec 5).
pub const TYPE_VSOCK: u32 = 19;
/// Queue order (virtio spec 5.10.2): receive, transmit, events.
const RX_QUEUE: usize = 0;
const TX_QUEUE: usize = 1;
const EVENT_QUEUE: usize = 2;
const NUM_QUEUES: usize = EVENT_QUEUE + 1;
const QUEUE_SIZE: u16 = 256;
/// The receive buffer we advertise per connection: the most guest data we
/// ever hold for a Unix peer that is slow to read.
const BUF_ALLOC: u32 = 256 * 1024;

/// CIDs 0-2 are the hypervisor, local and host; u32::MAX is VMADDR_CID_ANY
/// and the upper 32 bits of guest_cid are reserved.
const MIN_GUEST_CID: u64 = 3;
const MAX_GUEST_CID: u64 = u32::MAX as u64 - 1;

/// The worker talks over Unix streams the supervisor's broker connected.
pub const THREAD: DeviceThread =
    DeviceThread { name: "virtio-vsock", syscalls: &[WORKER, BROKERED], openat: Openat::Never, on_descriptor: &[] };

pub const REGISTRATION: Registration = Registration { threads: &[&THREAD], create };

fn create(env: &Env) -> Result<Vec<Instance>, DeviceError> {
    let vsock = Vsock::new(crate::protocol::GUEST_CID, env.dialer.clone(), HostPorts::stockade())
        .map_err(DeviceError::io(THREAD.name))?;
    Ok(vec![Instance { name: THREAD.name, device: Box::new(vsock) }])
}
