//! Terminal signals while the guest runs. The first Ctrl-C (SIGINT), SIGTERM
//! or SIGHUP goes to the guest command, as in a local terminal; a second
//! stops the VM.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use nix::sys::signal::{SigSet, Signal};

/// The signals we take over.
fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGWINCH] {
        set.add(sig);
    }
    set
}

/// Blocks the handled signals in the calling thread and every thread (and
/// child process) started after it. Call first thing in `run`.
pub fn block() -> anyhow::Result<()> {
    handled().thread_block()?;
    Ok(())
}

/// Shared between the signal thread and the run loop.
#[derive(Default)]
pub struct Interrupts {
    count: AtomicU32,
    stopped: AtomicBool,
    /// The VM is gone: signals no longer concern the guest.
    vm_gone: AtomicBool,
    /// Nothing runs in the guest to take a signal: the first one stops.
    first_stops: AtomicBool,
}

impl Interrupts {
    /// Whether the user stopped the VM with a second signal.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The first interrupt stops the VM (a recovery runs no command to
    /// forward it to).
    pub fn first_stops(&self) {
        self.first_stops.store(true, Ordering::SeqCst);
    }

    /// From now on an interrupt ends stockade itself (the review of the
    /// changes): nothing is forwarded, no stale VMM pid is killed.
    pub fn vm_gone(&self) {
        self.vm_gone.store(true, Ordering::SeqCst);
    }
}

/// Waits for signals on a thread: a window change calls `resized`; the first
/// of the others is forwarded with `forward`, the second calls `stop`.
pub fn spawn(
    interrupts: Arc<Interrupts>,
    forward: impl Fn(Signal) + Send + 'static,
    resized: impl Fn() + Send + 'static,
    stop: impl Fn() + Send + 'static,
) -> anyhow::Result<()> {
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let set = handled();
        while let Ok(sig) = set.wait() {
            if sig == Signal::SIGWINCH {
                if !interrupts.vm_gone.load(Ordering::SeqCst) {
                    resized();
                }
                continue;
            }
            if interrupts.vm_gone.load(Ordering::SeqCst) {
                // Staged changes stay staged; an apply in progress is
                // journaled and the next `stockade apply` completes it.
                super::terminal::restore();
                eprintln!("\nstockade: interrupted; the changes stay staged (see `stockade sessions`)");
                std::process::exit(128 + sig as i32);
            }
            let first = interrupts.count.fetch_add(1, Ordering::SeqCst) == 0;
            if first && !interrupts.first_stops.load(Ordering::SeqCst) {
                forward(sig);
            } else {
                interrupts.stopped.store(true, Ordering::SeqCst);
                super::terminal::restore();
                eprintln!("\nstockade: stopping the VM");
                stop();
            }
        }
    })?;
    Ok(())
}
