//! The worker's events: queue kicks, the streams of the stack's
//! connections and the stack's timers; after any of them frames move.

use std::os::fd::{AsRawFd, RawFd};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::queues;
use super::stack::Stack;
use super::{NUM_QUEUES, RX_QUEUE, TX_QUEUE};
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

/// Epoll token of the stack's streams; the kicks use their queue index.
const STACK_TOKEN: u64 = NUM_QUEUES as u64;

/// `queues` holds NUM_QUEUES queues.
pub(super) struct NetHandler {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub stack: Stack,
}

impl EventHandler for NetHandler {
    fn queues(&self) -> &[DeviceQueue] {
        &self.queues
    }

    fn sources(&self) -> Vec<(RawFd, u64)> {
        vec![(self.stack.as_raw_fd(), STACK_TOKEN)]
    }

    /// Until the stack's next timer, if it has one.
    fn timeout_ms(&mut self) -> i32 {
        self.stack.poll_delay().map_or(-1, |d| i32::try_from(d.as_millis()).unwrap_or(i32::MAX))
    }

    fn handle(&mut self, ready: &[EpollEvent]) {
        for event in ready {
            match event.data() {
                STACK_TOKEN => self.stack.process_events(),
                token => {
                    if let Some(dq) = usize::try_from(token).ok().and_then(|i| self.queues.get(i)) {
                        let _ = dq.kick.read();
                    }
                }
            }
        }
        service(&self.mem, &mut self.queues, &self.interrupt, &mut self.stack);
    }
}

/// Frames in, the stack run, frames out, until neither queue moves.
fn service(mem: &GuestMemoryMmap, queues: &mut [DeviceQueue], interrupt: &Interrupt, stack: &mut Stack) {
    loop {
        let tx = queues::process_tx(mem, &mut queues[TX_QUEUE].queue, stack);
        stack.poll();
        let rx = queues::process_rx(mem, &mut queues[RX_QUEUE].queue, stack);
        if tx.notify || rx.notify {
            interrupt.signal_used_queue();
        }
        if !tx.used && !rx.used {
            break;
        }
    }
}
