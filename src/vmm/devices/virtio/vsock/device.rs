//! The virtio-vsock device as the transport sees it: identity, features,
//! config space, and activation, which starts the worker.

use std::io;

use super::event_handler::VsockHandler;
use super::muxer::Muxer;
use super::ports::HostPorts;
use super::{MAX_GUEST_CID, MIN_GUEST_CID, NUM_QUEUES, QUEUE_SIZE, THREAD, TYPE_VSOCK};
use crate::vmm::devices::broker::Dialer;
use crate::vmm::devices::virtio::{
    ActivateError, Activation, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes, worker,
};

/// A virtio-vsock device in the Firecracker "hybrid" style: the guest dials
/// the host (CID 2) on port P, the dialer gets a Unix stream to the host's
/// listener for P, and the device bridges the two.
pub struct Vsock {
    guest_cid: u64,
    /// Taken by the worker thread on activation.
    muxer: Option<Muxer>,
}

impl Vsock {
    /// guest_cid: the guest's context id; dialer: how host ports are
    /// reached; ports: which of them the guest may dial, from where.
    pub fn new(guest_cid: u64, dialer: Dialer, ports: HostPorts) -> io::Result<Vsock> {
        if !(MIN_GUEST_CID..=MAX_GUEST_CID).contains(&guest_cid) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("guest CID {guest_cid} is reserved or out of range"),
            ));
        }
        Ok(Vsock { guest_cid, muxer: Some(Muxer::new(guest_cid, dialer, ports)?) })
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        TYPE_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; NUM_QUEUES]
    }

    fn features(&self) -> u64 {
        // Stream sockets only: no VIRTIO_VSOCK_F_SEQPACKET.
        VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.guest_cid.to_le_bytes(), offset, data);
    }

    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError> {
        let Activation { mem, queues, interrupt, .. } = activation;
        if queues.len() != NUM_QUEUES {
            return Err(ActivateError::QueueCount { got: queues.len(), want: NUM_QUEUES });
        }
        let muxer = self.muxer.take().ok_or_else(|| ActivateError::Backend("activated twice".into()))?;
        let next_stall_check = std::time::Instant::now();
        worker::spawn(&THREAD, VsockHandler { mem, queues, interrupt, muxer, next_stall_check })
    }
}
