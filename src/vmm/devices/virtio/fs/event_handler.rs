//! The worker's events: a kick on either queue (hiprio, requests) answers
//! every request on it, and those the guest adds meanwhile, with the help
//! of the device's pool if it has helpers.

use std::sync::Arc;

use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EpollEvent;

use super::linger::Linger;
use super::pool::Pool;
use super::request::{Access, Left, Served, Serving, serve_queue};
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
    /// How the worker watches the request queue after serving it (the
    /// hiprio queue, seldom used, gets no watch).
    pub linger: Linger,
}

/// The request queue's index; the hiprio queue's is 0.
const REQUESTS: usize = 1;

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
            let mut none = Linger::never();
            let linger = if event.data() == REQUESTS as u64 {
                self.linger.kicked();
                &mut self.linger
            } else {
                &mut none
            };
            let started = self.tally.notified();
            let interrupt = &self.interrupt;
            let signal = &mut || interrupt.signal_used_queue();
            let serving = &mut Serving { access: self.access, pool: &self.pool, tally: &mut self.tally, linger };
            let left = serve_queue(&self.server, &self.mem, &mut dq.queue, serving, signal);
            self.tally.done(started);
            // Kicks are still off: a kick of our own brings the worker back
            // to this queue after whatever else is ready.
            if left == Left::Requests
                && let Err(e) = dq.kick.write(1)
            {
                tracing::warn!("virtio-fs: cannot come back to the queue: {e}");
            }
        }
    }
}
