//! Frames between the virtqueues and the stack: tx chains become frames
//! for the stack, the stack's frames fill rx chains. A bad chain is logged
//! and returned empty; it never stops the queue.

use std::io::{Read, Write};

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::NET_HDR_LEN;
use super::stack::Stack;

/// What one pass over a queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct QueueOutcome {
    pub used: bool,
    pub notify: bool,
}

/// Moves the guest's frames into the stack, while it takes them.
pub(super) fn process_tx(mem: &GuestMemoryMmap, queue: &mut Queue, stack: &mut Stack) -> QueueOutcome {
    let mut used = false;
    while stack.wants_frames() {
        let Some(chain) = queue.pop_descriptor_chain(mem) else { break };
        let head = chain.head_index();
        match chain.reader(mem) {
            Ok(mut reader) => {
                let len = reader.available_bytes();
                if len <= NET_HDR_LEN || len > NET_HDR_LEN + stack.max_frame() {
                    tracing::warn!("virtio-net: dropping a {len}-byte tx buffer");
                } else {
                    let mut buf = vec![0u8; len];
                    match reader.read_exact(&mut buf) {
                        Ok(()) => stack.push_frame(buf.split_off(NET_HDR_LEN)),
                        Err(e) => tracing::warn!("virtio-net: unreadable tx buffer: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("virtio-net: unusable tx chain: {e}"),
        }
        if let Err(e) = queue.add_used(mem, head, 0) {
            tracing::warn!("virtio-net: cannot return a tx buffer: {e:?}");
        }
        used = true;
    }
    finish(mem, queue, used)
}

/// Fills the guest's rx buffers with the stack's frames.
pub(super) fn process_rx(mem: &GuestMemoryMmap, queue: &mut Queue, stack: &mut Stack) -> QueueOutcome {
    let mut used = false;
    while stack.has_frames_out() {
        let Some(chain) = queue.pop_descriptor_chain(mem) else { break };
        let head = chain.head_index();
        let Some(frame) = stack.pop_frame() else { break };
        let written = match chain.writer(mem) {
            Ok(mut writer) if writer.available_bytes() >= NET_HDR_LEN + frame.len() => {
                let mut hdr = [0u8; NET_HDR_LEN];
                // num_buffers: the frame fits in this one chain.
                hdr[10..12].copy_from_slice(&1u16.to_le_bytes());
                match writer.write_all(&hdr).and_then(|()| writer.write_all(&frame)) {
                    Ok(()) => NET_HDR_LEN + frame.len(),
                    Err(e) => {
                        tracing::warn!("virtio-net: cannot write an rx buffer: {e}");
                        0
                    }
                }
            }
            Ok(writer) => {
                tracing::warn!(
                    "virtio-net: dropping a {}-byte frame: the rx buffer holds {}",
                    frame.len(),
                    writer.available_bytes()
                );
                0
            }
            Err(e) => {
                tracing::warn!("virtio-net: unusable rx chain: {e}");
                0
            }
        };
        let len = u32::try_from(written).unwrap_or(0);
        if let Err(e) = queue.add_used(mem, head, len) {
            tracing::warn!("virtio-net: cannot return an rx buffer: {e:?}");
        }
        used = true;
    }
    finish(mem, queue, used)
}

fn finish(mem: &GuestMemoryMmap, queue: &mut Queue, used: bool) -> QueueOutcome {
    let notify = used && queue.needs_notification(mem).unwrap_or(true);
    QueueOutcome { used, notify }
}
