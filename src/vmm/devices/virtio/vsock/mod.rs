//! virtio-vsock (virtio spec 5.10): stream sockets from the guest to the
//! host. Only the guest dials: a connection to the host (CID 2) on port P is
//! bridged to the Unix socket "{uds_base}_{P}", as in Firecracker's hybrid
//! vsock, through the supervisor's broker (`devices::broker`), since the jailed VMM
//! opens no sockets itself.
//!
//! Which ports the guest may dial, and from where, is `ports`: the init's
//! own ports only from privileged guest ports (see `protocol::auth`).
//!
//! `device` is what the transport sees, `worker` the thread that serves the
//! queues, `muxer` the protocol engine over all connections, `connection`
//! one bridged stream with its credit accounting, `packet` the wire header.

mod connection;
mod device;
mod error;
mod muxer;
mod packet;
mod ports;
mod worker;

#[cfg(test)]
mod tests;

pub use device::Vsock;
pub use ports::HostPorts;
