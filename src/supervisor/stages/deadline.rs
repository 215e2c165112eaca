//! `--timeout`: when the time is up the command gets SIGTERM, then SIGKILL
//! after a grace period, and if the guest still has not ended, the VM is
//! killed. Its changes are exported as after any other end, and stockade
//! exits with 124 as timeout(1) does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

/// Between SIGTERM and SIGKILL, and between SIGKILL and killing the VM.
const GRACE: Duration = Duration::from_secs(10);

/// What stockade exits with when the time ran out.
pub const EXIT_TIMEOUT: u8 = 124;

/// Whether the time ran out; shared with the thread that watches it.
#[derive(Default, Clone)]
pub struct Expired(Arc<AtomicBool>);

impl Expired {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Ends the watch when dropped (the conversation is over).
pub struct Watch {
    _cancel: Sender<()>,
}

/// Watches `limit`: `signal` delivers a signal to the command, `kill_vm`
/// ends the VM.
pub fn watch(
    limit: Duration,
    expired: Expired,
    signal: impl Fn(i32) + Send + 'static,
    kill_vm: impl FnOnce() + Send + 'static,
) -> std::io::Result<Watch> {
    let (cancel, cancelled) = mpsc::channel::<()>();
    let ended = move |wait: Duration| !matches!(cancelled.recv_timeout(wait), Err(RecvTimeoutError::Timeout));
    std::thread::Builder::new().name("timeout".into()).spawn(move || {
        if ended(limit) {
            return;
        }
        expired.0.store(true, Ordering::SeqCst);
        eprintln!("\nstockade: the command ran out of time (--timeout {}); stopping it", describe(limit));
        signal(libc::SIGTERM);
        if ended(GRACE) {
            return;
        }
        signal(libc::SIGKILL);
        if ended(GRACE) {
            return;
        }
        eprintln!("stockade: the guest did not end after SIGKILL; stopping the VM");
        kill_vm();
    })?;
    Ok(Watch { _cancel: cancel })
}

/// "90s", "1.5s": how the limit reads in messages.
pub fn describe(limit: Duration) -> String {
    let secs = limit.as_secs_f64();
    if secs.fract() == 0.0 { format!("{}s", limit.as_secs()) } else { format!("{secs}s") }
}
