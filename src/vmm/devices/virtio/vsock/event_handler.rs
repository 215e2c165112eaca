//! The worker's events: queue kicks and the muxer's connection readiness;
//! after any of them the muxer runs over the queues.

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::muxer::Muxer;
use super::{NUM_QUEUES, RX_QUEUE, TX_QUEUE};
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

/// Epoll token of the muxer; the kicks use their queue index.
const MUXER_TOKEN: u64 = NUM_QUEUES as u64;
/// How often the worker looks for stalled connections (`Muxer::stalls`).
const STALL_CHECK_EVERY: Duration = Duration::from_secs(5);

/// `queues` holds NUM_QUEUES queues.
pub(super) struct VsockHandler {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub muxer: Muxer,
    /// When to look for stalled connections next.
    pub next_stall_check: Instant,
}

impl EventHandler for VsockHandler {
    fn queues(&self) -> &[DeviceQueue] {
        &self.queues
    }

    fn sources(&self) -> Vec<(RawFd, u64)> {
        vec![(self.muxer.as_raw_fd(), MUXER_TOKEN)]
    }

    fn timeout_ms(&mut self) -> i32 {
        let left = self.next_stall_check.saturating_duration_since(Instant::now());
        i32::try_from(left.as_millis()).unwrap_or(i32::MAX)
    }

    fn handle(&mut self, ready: &[EpollEvent]) {
        for event in ready {
            match event.data() {
                MUXER_TOKEN => self.muxer.process_events(),
                // A kick only says "look again"; the event queue's buffers
                // stay with us since we never post transport events.
                token => {
                    if let Some(dq) = usize::try_from(token).ok().and_then(|i| self.queues.get(i)) {
                        let _ = dq.kick.read();
                    }
                }
            }
        }
        service_queues(&self.mem, &mut self.queues, &self.interrupt, &mut self.muxer);
        let now = Instant::now();
        if now >= self.next_stall_check {
            self.next_stall_check = now + STALL_CHECK_EVERY;
            // The VMM's log is how a stalled transfer is told apart: a host
            // reader that stopped (a warning: never the guest's doing), or
            // a guest that takes nothing (its own business).
            for stall in self.muxer.stalls(now) {
                if stall.host_reader {
                    tracing::warn!("virtio-vsock: {}", stall.state);
                } else {
                    tracing::info!("virtio-vsock: {}", stall.state);
                }
            }
        }
    }
}

fn service_queues(mem: &GuestMemoryMmap, queues: &mut [DeviceQueue], interrupt: &Interrupt, muxer: &mut Muxer) {
    loop {
        let tx = muxer.process_tx(mem, &mut queues[TX_QUEUE].queue);
        let throttled = muxer.tx_throttled();
        let rx = muxer.process_rx(mem, &mut queues[RX_QUEUE].queue);
        if tx.notify || rx.notify {
            interrupt.signal_used_queue();
        }
        // Tx stopped for want of rx buffers; go on while rx takes replies.
        if !(throttled && rx.used) {
            break;
        }
    }
}
