//! The virtio-rng device as the transport sees it, and how one request is
//! filled.

use std::fs::File;
use std::io::{Read, Write};

use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;

use super::event_handler::RngHandler;
use super::{MAX_BYTES_PER_REQUEST, NUM_QUEUES, QUEUE_SIZE, THREAD, TYPE_RNG, worker};
use crate::vmm::devices::virtio::{ActivateError, Activation, DeviceQueue, VIRTIO_F_VERSION_1, VirtioDevice};

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

/// Fills every available request; returns whether the driver wants an interrupt.
pub(crate) fn process_queue(mem: &GuestMemoryMmap, dq: &mut DeviceQueue, source: &mut impl Read) -> bool {
    let mut used_any = false;
    while let Some(chain) = dq.queue.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        let written = match chain.writer(mem) {
            Ok(mut writer) => {
                let want = writer.available_bytes().min(MAX_BYTES_PER_REQUEST);
                let mut buf = vec![0u8; want];
                match source.read_exact(&mut buf).and_then(|()| writer.write_all(&buf)) {
                    Ok(()) => want,
                    Err(e) => {
                        tracing::warn!("virtio-rng: request failed: {e}");
                        0
                    }
                }
            }
            Err(e) => {
                tracing::warn!("virtio-rng: malformed request: {e:?}");
                0
            }
        };
        if let Err(e) = dq.queue.add_used(mem, head, u32::try_from(written).unwrap_or(u32::MAX)) {
            tracing::warn!("virtio-rng: cannot return a request: {e:?}");
        }
        used_any = true;
    }
    used_any && dq.queue.needs_notification(mem).unwrap_or(true)
}
