//! Thread creation under the jail. A new thread starts with its creator's
//! seccomp filter and can only narrow it, so a device worker started from a
//! vCPU thread would be held to the vCPU's list. Once the jail is closed,
//! every thread is therefore created by the launcher, a thread whose filter
//! is the union of the others and that runs no guest-facing code; the new
//! thread installs the filter of its own kind before anything else.
//! Without a jail (`--no-jail`, unit tests) threads start directly.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};

use super::landlock;
use super::seccomp::{DeviceThread, Filters, Openat, ThreadKind};
use super::sigsys;

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Request {
    name: String,
    kind: ThreadKind,
    job: Job,
    started: SyncSender<io::Result<()>>,
}

struct Launcher {
    filters: Arc<Filters>,
    requests: Mutex<Sender<Request>>,
}

static LAUNCHER: OnceLock<Launcher> = OnceLock::new();

/// Starts a thread named `name` that runs `f` under the filter of `kind`
/// when the jail is closed.
pub fn spawn(name: impl Into<String>, kind: ThreadKind, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    let name = name.into();
    let Some(launcher) = LAUNCHER.get() else {
        std::thread::Builder::new().name(name).spawn(f)?;
        return Ok(());
    };
    let (started, result) = mpsc::sync_channel(1);
    let request = Request { name, kind, job: Box::new(f), started };
    let gone = || io::Error::other("the thread launcher has stopped");
    launcher.requests.lock().unwrap_or_else(|e| e.into_inner()).send(request).map_err(|_| gone())?;
    result.recv().map_err(|_| gone())?
}

/// Starts the launcher under its own filter; from now on `spawn` goes
/// through it.
pub(super) fn start_launcher(filters: Arc<Filters>) -> io::Result<()> {
    let (requests, incoming) = mpsc::channel();
    let launcher = Launcher { filters: filters.clone(), requests: Mutex::new(requests) };
    if LAUNCHER.set(launcher).is_err() {
        return Err(io::Error::other("the jail was entered twice"));
    }
    std::thread::Builder::new().name("launcher".into()).spawn(move || {
        confine_or_exit(&filters, ThreadKind::Launcher);
        serve(&filters, incoming);
    })?;
    Ok(())
}

fn serve(filters: &Arc<Filters>, incoming: Receiver<Request>) {
    for request in incoming {
        let filters = filters.clone();
        let (kind, job) = (request.kind, request.job);
        let result = std::thread::Builder::new().name(request.name).spawn(move || {
            confine_or_exit(&filters, kind);
            job();
        });
        let _ = request.started.send(result.map(drop));
    }
}

/// Confines the calling thread to `kind` if the jail is closed.
pub fn confine_current(kind: ThreadKind) {
    if let Some(launcher) = LAUNCHER.get() {
        confine_or_exit(&launcher.filters, kind);
    }
}

/// A thread that cannot be confined must not run at all. A worker whose
/// opens must change nothing gets a Landlock layer refusing it every
/// change first (see `Openat::allows_openat2`).
fn confine_or_exit(filters: &Filters, kind: ThreadKind) {
    sigsys::set_thread_kind(kind.name());
    let read_only = matches!(kind, ThreadKind::Device(DeviceThread { openat: Openat::ReadOnly, .. }));
    if read_only && let Err(e) = landlock::forbid_changes() {
        exit_with(&format!("cannot refuse the {} thread every change to files: {e}", kind.name()), &e);
    }
    if let Err(e) = filters.apply(kind) {
        exit_with(&e.to_string(), &e);
    }
}

/// Ends the process with `message` and the causes of `e`.
fn exit_with(message: &str, e: &dyn std::error::Error) -> ! {
    let mut message = message.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    eprintln!("stockade: error: {message}");
    std::process::exit(1);
}
