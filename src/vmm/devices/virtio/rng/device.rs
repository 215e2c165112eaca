//! The virtio-rng device as the transport sees it.

use std::fs::File;

use super::event_handler::RngHandler;
use super::{NUM_QUEUES, QUEUE_SIZE, THREAD, TYPE_RNG, worker};
use crate::vmm::devices::virtio::{ActivateError, Activation, VIRTIO_F_VERSION_1, VirtioDevice};

pub struct Rng {
    source: Option<File>,
}

impl Rng {
    pub fn new() -> std::io::Result<Rng> {
        Ok(Rng { source: Some(File::open("/dev/urandom")?) })
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; NUM_QUEUES]
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError> {
        let Activation { mem, queues, interrupt, .. } = activation;
        if queues.len() != NUM_QUEUES {
            return Err(ActivateError::QueueCount { got: queues.len(), want: NUM_QUEUES });
        }
        let source = self.source.take().ok_or_else(|| ActivateError::Backend("activated twice".into()))?;
        worker::spawn(&THREAD, RngHandler { mem, queues, interrupt, source })
    }
}
