//! The device's worker thread: waits on the queue kicks and on the muxer's
//! connection readiness, and runs the muxer over the queues.

use std::os::fd::AsRawFd;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::super::{DeviceQueue, Interrupt};
use super::device::{EVENT_QUEUE, NUM_QUEUES, RX_QUEUE, TX_QUEUE};
use super::muxer::Muxer;

/// Epoll token of the muxer; the kicks use their queue index.
const MUXER_TOKEN: u64 = NUM_QUEUES as u64;

/// Runs until the process exits. `queues` holds NUM_QUEUES queues.
pub(super) fn run(mem: GuestMemoryMmap, mut queues: Vec<DeviceQueue>, interrupt: Interrupt, mut muxer: Muxer) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => return tracing::error!("virtio-vsock: epoll: {e}"),
    };
    for index in [RX_QUEUE, TX_QUEUE, EVENT_QUEUE] {
        let fd = queues[index].kick.as_raw_fd();
        if let Err(e) = epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, index as u64)) {
            return tracing::error!("virtio-vsock: epoll add: {e}");
        }
    }
    if let Err(e) = epoll.ctl(ControlOperation::Add, muxer.as_raw_fd(), EpollEvent::new(EventSet::IN, MUXER_TOKEN)) {
        return tracing::error!("virtio-vsock: epoll add: {e}");
    }
    let mut events = [EpollEvent::default(); NUM_QUEUES + 1];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return tracing::error!("virtio-vsock: epoll wait: {e}"),
        };
        for event in &events[..n] {
            match event.data() {
                MUXER_TOKEN => muxer.process_events(),
                // A kick only says "look again"; the event queue's buffers
                // stay with us since we never post transport events.
                token => {
                    if let Some(dq) = usize::try_from(token).ok().and_then(|i| queues.get(i)) {
                        let _ = dq.kick.read();
                    }
                }
            }
        }
        service_queues(&mem, &mut queues, &interrupt, &mut muxer);
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
