//! Stopping every vCPU at the template point. The vCPU that reached it asks
//! the others to park; each leaves KVM_RUN (kicked by a signal if it sits in
//! the guest), saves its own state on its own thread and waits until the
//! recording is over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::TemplateError;
use super::cpu::VcpuState;

/// The real-time signal that kicks a vCPU out of KVM_RUN; its handler does
/// nothing, the interruption is the point.
fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

extern "C" fn ignore_kick(_: libc::c_int) {}

/// Installs the kick handler; before the jail closes (no SA_RESTART, so
/// KVM_RUN returns EINTR).
pub fn install_kick_handler() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction with a handler that touches nothing; the
    // handler is a plain extern "C" function that lives for the process.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_kick as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(kick_signal(), &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[derive(Default)]
struct Slots {
    /// Each vCPU thread's id, for the kick.
    tids: Vec<Option<libc::pid_t>>,
    /// What each parked vCPU saved.
    parked: Vec<Option<Result<VcpuState, String>>>,
    /// Bumped when the recording is over: parked vCPUs go on.
    round: u64,
}

pub struct Pause {
    requested: AtomicBool,
    slots: Mutex<Slots>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pause {
    pub fn new(vcpus: usize) -> Pause {
        let slots = Slots { tids: vec![None; vcpus], parked: (0..vcpus).map(|_| None).collect(), round: 0 };
        Pause { requested: AtomicBool::new(false), slots: Mutex::new(slots), changed: Condvar::new() }
    }

    /// Called by each vCPU thread as it starts.
    pub fn register(&self, id: usize) {
        // SAFETY: gettid takes no arguments.
        let tid = unsafe { libc::gettid() };
        if let Some(slot) = lock(&self.slots).tids.get_mut(id) {
            *slot = Some(tid);
        }
    }

    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Parks vCPU `id` with the state `save` reads, until `release`.
    pub fn park(&self, id: usize, save: impl FnOnce() -> Result<VcpuState, TemplateError>) {
        let state = save().map_err(|e| e.to_string());
        let mut slots = lock(&self.slots);
        let round = slots.round;
        if let Some(slot) = slots.parked.get_mut(id) {
            *slot = Some(state);
        }
        self.changed.notify_all();
        while slots.round == round && self.requested() {
            slots = self.changed.wait(slots).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Stops every vCPU but `me` and returns their states by id.
    pub fn stop_others(&self, me: usize, timeout: Duration) -> Result<Vec<(usize, VcpuState)>, TemplateError> {
        self.requested.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        let mut slots = lock(&self.slots);
        loop {
            let waiting: Vec<usize> =
                (0..slots.parked.len()).filter(|&id| id != me && slots.parked[id].is_none()).collect();
            if waiting.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(TemplateError::Refused(format!("vCPUs {waiting:?} did not stop within {timeout:?}")));
            }
            // A kick that lands just before KVM_RUN is lost: kick again
            // until each one has parked.
            for &id in &waiting {
                if let Some(tid) = slots.tids[id] {
                    // SAFETY: tgkill to a thread of this process, with a
                    // signal whose handler does nothing.
                    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, kick_signal()) };
                }
            }
            slots = self.changed.wait_timeout(slots, Duration::from_millis(2)).unwrap_or_else(|p| p.into_inner()).0;
        }
        let mut states = Vec::new();
        for (id, slot) in slots.parked.iter_mut().enumerate() {
            if id == me {
                continue;
            }
            match slot.take() {
                Some(Ok(state)) => states.push((id, state)),
                Some(Err(e)) => return Err(TemplateError::Refused(format!("vCPU {id}: {e}"))),
                None => return Err(TemplateError::Refused(format!("vCPU {id} saved nothing"))),
            }
        }
        Ok(states)
    }

    /// Lets every parked vCPU go on; the template point is passed for good.
    pub fn release(&self) {
        self.requested.store(false, Ordering::SeqCst);
        let mut slots = lock(&self.slots);
        slots.round += 1;
        for slot in &mut slots.parked {
            *slot = None;
        }
        self.changed.notify_all();
    }
}
