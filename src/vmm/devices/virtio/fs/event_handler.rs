//! The worker's events: a kick on either queue (hiprio, requests) answers
//! every request on it, and those the guest adds meanwhile.

use std::sync::Arc;

use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::request::{Access, serve_queue};
use super::tally::Tally;
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

pub(super) struct FsHandler<F: FileSystem + Send + Sync + 'static> {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub server: Arc<Server<F>>,
    pub access: Access,
    /// The device's tag, naming its totals in the log.
    pub tag: String,
    pub tally: Tally,
}

impl<F: FileSystem + Send + Sync + 'static> EventHandler for FsHandler<F> {
    fn queues(&self) -> &[DeviceQueue] {
        &self.queues
    }

    fn timeout_ms(&mut self) -> i32 {
        self.tally.timeout_ms()
    }

    fn handle(&mut self, ready: &[EpollEvent]) {
        if ready.is_empty() {
            return self.tally.report(&self.tag);
        }
        for event in ready {
            let Some(dq) = usize::try_from(event.data()).ok().and_then(|i| self.queues.get_mut(i)) else {
                continue;
            };
            let _ = dq.kick.read();
            let started = self.tally.notified();
            let interrupt = &self.interrupt;
            serve_queue(&self.server, &self.mem, &mut dq.queue, self.access, &mut self.tally, &mut || {
                interrupt.signal_used_queue()
            });
            self.tally.done(started);
        }
    }
}
