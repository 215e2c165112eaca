//! The virtio-net device as the transport sees it: identity, features, the
//! MAC and MTU in config space, and activation, which starts the worker.

use std::io;

use super::event_handler::NetHandler;
use super::stack::Stack;
use super::{NUM_QUEUES, QUEUE_SIZE, THREAD, TYPE_NET, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MTU};
use crate::protocol::transparent::{GUEST_MAC, MTU};
use crate::vmm::devices::broker::Dialer;
use crate::vmm::devices::virtio::{
    ActivateError, Activation, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes, worker,
};

pub struct Net {
    /// Taken by the worker thread on activation.
    stack: Option<Stack>,
}

impl Net {
    /// dialer: how the proxy's ports are reached.
    pub fn new(dialer: Dialer) -> io::Result<Net> {
        Ok(Net { stack: Some(Stack::new(dialer)?) })
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; NUM_QUEUES]
    }

    fn features(&self) -> u64 {
        // No checksum or segmentation offloads: the guest sends finished
        // frames, and the stack checks each one as a real peer would.
        VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC | VIRTIO_NET_F_MTU
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // mac[6], status, max_virtqueue_pairs, mtu (virtio spec 5.1.4).
        let mut config = [0u8; 12];
        config[..6].copy_from_slice(&GUEST_MAC);
        config[8..10].copy_from_slice(&1u16.to_le_bytes());
        config[10..12].copy_from_slice(&MTU.to_le_bytes());
        read_config_bytes(&config, offset, data);
    }

    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError> {
        let Activation { mem, queues, interrupt, .. } = activation;
        if queues.len() != NUM_QUEUES {
            return Err(ActivateError::QueueCount { got: queues.len(), want: NUM_QUEUES });
        }
        let stack = self.stack.take().ok_or_else(|| ActivateError::Backend("activated twice".into()))?;
        worker::spawn(&THREAD, NetHandler { mem, queues, interrupt, stack })
    }
}
