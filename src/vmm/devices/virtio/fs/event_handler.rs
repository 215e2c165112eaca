//! The worker's events: a kick on either queue (hiprio, requests) answers
//! every request on it.

use std::sync::Arc;

use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::request::{Access, process_queue};
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

pub(super) struct FsHandler<F: FileSystem + Send + Sync + 'static> {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub server: Arc<Server<F>>,
    pub access: Access,
}

impl<F: FileSystem + Send + Sync + 'static> EventHandler for FsHandler<F> {
    fn queues(&self) -> &[DeviceQueue] {
        &self.queues
    }

    fn handle(&mut self, ready: &[EpollEvent]) {
        let mut notify = false;
        for event in ready {
            let Some(dq) = usize::try_from(event.data()).ok().and_then(|i| self.queues.get_mut(i)) else {
                continue;
            };
            let _ = dq.kick.read();
            notify |= process_queue(&self.server, &self.mem, &mut dq.queue, self.access);
        }
        if notify {
            self.interrupt.signal_used_queue();
        }
    }
}
