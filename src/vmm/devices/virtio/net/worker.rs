//! The device's worker thread: waits on the queue kicks, the streams of
//! the stack's connections and the stack's timers, and moves frames.

use std::os::fd::AsRawFd;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::super::{DeviceQueue, Interrupt};
use super::device::{NUM_QUEUES, RX_QUEUE, TX_QUEUE};
use super::queues;
use super::stack::Stack;

/// Epoll token of the stack's streams; the kicks use their queue index.
const STACK_TOKEN: u64 = NUM_QUEUES as u64;

/// Runs until the process exits. `queues` holds NUM_QUEUES queues.
pub(super) fn run(mem: GuestMemoryMmap, mut queues: Vec<DeviceQueue>, interrupt: Interrupt, mut stack: Stack) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => return tracing::error!("virtio-net: epoll: {e}"),
    };
    for index in [RX_QUEUE, TX_QUEUE] {
        let fd = queues[index].kick.as_raw_fd();
        if let Err(e) = epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, index as u64)) {
            return tracing::error!("virtio-net: epoll add: {e}");
        }
    }
    if let Err(e) = epoll.ctl(ControlOperation::Add, stack.as_raw_fd(), EpollEvent::new(EventSet::IN, STACK_TOKEN)) {
        return tracing::error!("virtio-net: epoll add: {e}");
    }
    let mut events = [EpollEvent::default(); NUM_QUEUES + 1];
    loop {
        let timeout = stack.poll_delay().map_or(-1, |d| i32::try_from(d.as_millis()).unwrap_or(i32::MAX));
        let n = match epoll.wait(timeout, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return tracing::error!("virtio-net: epoll wait: {e}"),
        };
        for event in &events[..n] {
            match event.data() {
                STACK_TOKEN => stack.process_events(),
                token => {
                    if let Some(dq) = usize::try_from(token).ok().and_then(|i| queues.get(i)) {
                        let _ = dq.kick.read();
                    }
                }
            }
        }
        service(&mem, &mut queues, &interrupt, &mut stack);
    }
}

/// Frames in, the stack run, frames out, until neither queue moves.
pub(super) fn service(mem: &GuestMemoryMmap, queues: &mut [DeviceQueue], interrupt: &Interrupt, stack: &mut Stack) {
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
