//! How one request is filled: guest-sized, capped at
//! `MAX_BYTES_PER_REQUEST`, and a bad chain returned empty.

use std::io::{Read, Write};

use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;

use super::MAX_BYTES_PER_REQUEST;
use crate::vmm::devices::virtio::DeviceQueue;

/// Fills every available request; returns whether the driver wants an interrupt.
pub(super) fn process_queue(mem: &GuestMemoryMmap, dq: &mut DeviceQueue, source: &mut impl Read) -> bool {
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
