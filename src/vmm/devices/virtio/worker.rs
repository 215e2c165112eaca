//! The one worker loop every device runs on its own thread: an epoll over
//! the queue kicks (token = queue index) and the device's own descriptors
//! (tokens after the queues), handing what is ready to the device's
//! `EventHandler` until the process exits.
//!
//! Every worker also watches a gate (see `Gate`): recording a template
//! parks them all between two events, so that none writes guest memory or
//! a used ring while the VM is saved.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

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

/// The epoll token of a worker's gate, past any queue or device source.
const GATE_TOKEN: u64 = u64::MAX;

/// Where a worker parks on request: one per worker, all of them listed in
/// `GATES` (one VM per VMM process, so a process-wide list is the VM's).
struct Gate {
    wake: EventFd,
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum GateState {
    Open,
    Closing,
    Parked,
}

static GATES: Mutex<Vec<Arc<Gate>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    /// Parks the calling worker until the gate opens again.
    fn park(&self) {
        let _ = self.wake.read();
        let mut state = lock(&self.state);
        if *state != GateState::Closing {
            return;
        }
        *state = GateState::Parked;
        self.changed.notify_all();
        while *state != GateState::Open {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Parks every worker between two events and returns once all are parked,
/// or fails after `timeout` (the gates are opened again then).
pub fn park_all(timeout: Duration) -> Result<(), String> {
    let gates = lock(&GATES).clone();
    for gate in &gates {
        *lock(&gate.state) = GateState::Closing;
        gate.wake.write(1).map_err(|e| format!("cannot wake a device worker: {e}"))?;
    }
    let deadline = Instant::now() + timeout;
    for gate in &gates {
        let mut state = lock(&gate.state);
        while *state != GateState::Parked {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(state);
                open_all();
                return Err(format!("a device worker did not pause within {timeout:?}"));
            }
            state = gate.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
    Ok(())
}

/// Lets every parked worker go on.
pub fn open_all() {
    for gate in lock(&GATES).iter() {
        *lock(&gate.state) = GateState::Open;
        gate.changed.notify_all();
    }
}

/// Starts the worker thread `thread` serving `handler`; the thread runs
/// under the seccomp allowlist `thread` declares once the jail is closed.
pub fn spawn(thread: &'static DeviceThread, handler: impl EventHandler) -> Result<(), ActivateError> {
    spawn_with_helpers(thread, handler, Vec::new())
}

/// [`spawn`], with `helpers` started beside the worker in its group (see
/// `jail::thread::spawn_group`): confined as the worker is, sharing its
/// descriptors. The gate knows only the worker: helpers must touch guest
/// memory only while the worker is inside `EventHandler::handle`, so that
/// a parked worker means parked helpers.
pub fn spawn_with_helpers(
    thread: &'static DeviceThread,
    handler: impl EventHandler,
    helpers: Vec<jail::thread::Job>,
) -> Result<(), ActivateError> {
    let wake = EventFd::new(EFD_NONBLOCK).map_err(ActivateError::Thread)?;
    let gate = Arc::new(Gate { wake, state: Mutex::new(GateState::Open), changed: Condvar::new() });
    lock(&GATES).push(gate.clone());
    let leader = Box::new(move || run(thread.name, handler, &gate));
    jail::thread::spawn_group(thread.name, ThreadKind::Device(thread), leader, helpers).map_err(ActivateError::Thread)
}

/// Runs until the process exits, or until epoll fails (logged).
fn run(name: &str, mut handler: impl EventHandler, gate: &Gate) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => return tracing::error!("{name}: epoll: {e}"),
    };
    let kicks = handler.queues().iter().enumerate().map(|(index, dq)| (dq.kick.as_raw_fd(), index as u64));
    let gate_fd = [(gate.wake.as_raw_fd(), GATE_TOKEN)];
    let watched: Vec<(RawFd, u64)> = kicks.chain(handler.sources()).chain(gate_fd).collect();
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
        let ready = &events[..n];
        // The gate fires once per recording: the usual wake-up is handled
        // as it came, without sorting anything out of it.
        if !ready.iter().any(|e| e.data() == GATE_TOKEN) {
            handler.handle(ready);
            continue;
        }
        let rest: Vec<EpollEvent> = ready.iter().filter(|e| e.data() != GATE_TOKEN).copied().collect();
        if !rest.is_empty() {
            handler.handle(&rest);
        }
        gate.park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_workers_wait_until_the_gates_open() {
        let gate = Arc::new(Gate {
            wake: EventFd::new(EFD_NONBLOCK).unwrap(),
            state: Mutex::new(GateState::Open),
            changed: Condvar::new(),
        });
        lock(&GATES).push(gate.clone());
        let worker = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let mut fds = [libc::pollfd { fd: gate.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
                // SAFETY: one pollfd on a live eventfd.
                unsafe { libc::poll(fds.as_mut_ptr(), 1, -1) };
                gate.park();
            })
        };
        park_all(Duration::from_secs(5)).unwrap();
        assert!(*lock(&gate.state) == GateState::Parked);
        open_all();
        worker.join().unwrap();
        lock(&GATES).retain(|g| !Arc::ptr_eq(g, &gate));
    }
}
