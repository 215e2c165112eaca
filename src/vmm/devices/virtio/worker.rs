//! The one worker loop every device runs on its own thread: an epoll over
//! the queue kicks (token = queue index) and the device's own descriptors
//! (tokens after the queues), handing what is ready to the device's
//! `EventHandler` until the process exits.

use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::{ActivateError, DeviceQueue};
use crate::jail::{self, DeviceThread, ThreadKind};

/// What a device's worker does with its events.
pub trait EventHandler: Send + 'static {
    /// The queues whose kicks wake the worker; a kick's token is its index.
    fn queues(&self) -> &[DeviceQueue];

    /// The device's own descriptors and their tokens, past the queues'.
    fn sources(&self) -> Vec<(RawFd, u64)> {
        Vec::new()
    }

    /// How long to wait at most, in milliseconds; -1 waits for an event.
    fn timeout_ms(&mut self) -> i32 {
        -1
    }

    /// Serves what woke the worker (nothing when the timeout passed).
    fn handle(&mut self, ready: &[EpollEvent]);
}

/// Starts the worker thread `thread` serving `handler`; the thread runs
/// under the seccomp allowlist `thread` declares once the jail is closed.
pub fn spawn(thread: &'static DeviceThread, handler: impl EventHandler) -> Result<(), ActivateError> {
    jail::thread::spawn(thread.name, ThreadKind::Device(thread), move || run(thread.name, handler))
        .map_err(ActivateError::Thread)
}

/// Runs until the process exits, or until epoll fails (logged).
fn run(name: &str, mut handler: impl EventHandler) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => return tracing::error!("{name}: epoll: {e}"),
    };
    let kicks = handler.queues().iter().enumerate().map(|(index, dq)| (dq.kick.as_raw_fd(), index as u64));
    let watched: Vec<(RawFd, u64)> = kicks.chain(handler.sources()).collect();
    for &(fd, token) in &watched {
        if let Err(e) = epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, token)) {
            return tracing::error!("{name}: epoll add: {e}");
        }
    }
    let mut events = vec![EpollEvent::default(); watched.len()];
    loop {
        let n = match epoll.wait(handler.timeout_ms(), &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return tracing::error!("{name}: epoll wait: {e}"),
        };
        handler.handle(&events[..n]);
    }
}
