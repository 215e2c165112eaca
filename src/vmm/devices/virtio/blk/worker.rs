//! The device's worker thread: waits for kicks and serves the queue.

use std::os::fd::AsRawFd;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::super::{DeviceQueue, Interrupt};
use super::request::{Disk, process_queue};

pub(super) fn run(mem: GuestMemoryMmap, mut dq: DeviceQueue, interrupt: Interrupt, disk: Disk) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => return tracing::error!("virtio-blk: epoll: {e}"),
    };
    if let Err(e) = epoll.ctl(ControlOperation::Add, dq.kick.as_raw_fd(), EpollEvent::new(EventSet::IN, 0)) {
        return tracing::error!("virtio-blk: epoll add: {e}");
    }
    let mut events = [EpollEvent::default(); 1];
    let mut bounce = Vec::new();
    loop {
        match epoll.wait(-1, &mut events) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return tracing::error!("virtio-blk: epoll wait: {e}"),
        }
        let _ = dq.kick.read();
        if process_queue(&mem, &mut dq.queue, &disk, &mut bounce) {
            interrupt.signal_used_queue();
        }
    }
}
