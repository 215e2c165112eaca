//! The worker's events: a kick on the request queue fills what is there.

use std::fs::File;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::REQUEST_QUEUE;
use super::request::process_queue;
use super::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

pub(super) struct RngHandler {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub source: File,
}

impl EventHandler for RngHandler {
    fn queues(&self) -> &[DeviceQueue] {
        &self.queues
    }

    fn handle(&mut self, _ready: &[EpollEvent]) {
        let dq = &mut self.queues[REQUEST_QUEUE];
        let _ = dq.kick.read();
        if process_queue(&self.mem, dq, &mut self.source) {
            self.interrupt.signal_used_queue();
        }
    }
}
