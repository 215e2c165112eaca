//! The worker's events: a kick on the request queue serves what is there.

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::REQUEST_QUEUE;
use super::request::{Disk, process_queue};
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

pub(super) struct BlockHandler {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub disk: Disk,
    /// Reused between requests so a busy disk does not allocate each time.
    pub bounce: Vec<u8>,
}

impl EventHandler for BlockHandler {
    fn queues(&self) -> &[DeviceQueue] {
        &self.queues
    }

    fn handle(&mut self, _ready: &[EpollEvent]) {
        let dq = &mut self.queues[REQUEST_QUEUE];
        let _ = dq.kick.read();
        if process_queue(&self.mem, &mut dq.queue, &self.disk, &mut self.bounce) {
            self.interrupt.signal_used_queue();
        }
    }
}
