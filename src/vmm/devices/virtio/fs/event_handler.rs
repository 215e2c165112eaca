//! The worker's events: a kick on either queue (hiprio, requests) answers
//! every request on it, and those the guest adds meanwhile, with the help
//! of the device's pool if it has helpers.

use std::sync::Arc;

use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::pool::Pool;
use super::request::{Access, Served, serve_queue};
use super::tally::Tally;
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

pub(super) struct FsHandler<F: FileSystem + Send + Sync + 'static> {
    /// Shared with the requests the pool's helpers serve.
    pub mem: Arc<GuestMemoryMmap>,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    pub server: Arc<Server<F>>,
    pub access: Access,
    /// Helpers serving the requests of a notification beside the worker
    /// (none for the writable shares' device, whose worker is alone).
    pub pool: Pool<Served>,
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
            let signal = &mut || interrupt.signal_used_queue();
            serve_queue(&self.server, &self.mem, &mut dq.queue, self.access, &self.pool, &mut self.tally, signal);
            self.tally.done(started);
        }
    }
}
