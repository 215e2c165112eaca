//! Thread creation under the jail. A new thread starts with its creator's
//! seccomp filter and can only narrow it, so a device worker started from a
//! vCPU thread would be held to the vCPU's list. Once the jail is closed,
//! every thread is therefore created by the launcher, a thread whose filter
//! is the union of the others and that runs no guest-facing code; the new
//! thread installs the filter of its own kind before anything else.
//! Without a jail (`--no-jail`, unit tests) threads start directly.
//!
//! The file servers' workers take up more than a filter (see
//! `confine_or_exit`): the read-only shares' worker a Landlock layer that
//! refuses it every change and a descriptor table of its own, the writable
//! shares' worker a Landlock layer that reaches only the writable shares.
//! Together they keep a read-only share's files out of reach of the one
//! thread whose filter allows changing modes, owners and times (calls
//! Landlock does not govern): it cannot open them, and what the read-only
//! worker opens, it cannot name.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};

use super::landlock::{self, Layer};
use super::seccomp::{DeviceThread, Filters, Openat, ThreadKind};
use super::sigsys;

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Request {
    name: String,
    kind: ThreadKind,
    job: Job,
    started: SyncSender<io::Result<()>>,
}

/// What a thread takes up when it starts under the closed jail.
pub(super) struct Confinement {
    /// The seccomp filter of each kind.
    pub filters: Filters,
    /// The Landlock layer of a worker that may open with any flag: only
    /// the shares the jail opened read-write.
    pub writable: Layer,
}

struct Launcher {
    confinement: Arc<Confinement>,
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
pub(super) fn start_launcher(confinement: Arc<Confinement>) -> io::Result<()> {
    let (requests, incoming) = mpsc::channel();
    let launcher = Launcher { confinement: confinement.clone(), requests: Mutex::new(requests) };
    if LAUNCHER.set(launcher).is_err() {
        return Err(io::Error::other("the jail was entered twice"));
    }
    std::thread::Builder::new().name("launcher".into()).spawn(move || {
        confine_or_exit(&confinement, ThreadKind::Launcher);
        serve(&confinement, incoming);
    })?;
    Ok(())
}

fn serve(confinement: &Arc<Confinement>, incoming: Receiver<Request>) {
    for request in incoming {
        let confinement = confinement.clone();
        let (kind, job) = (request.kind, request.job);
        let result = std::thread::Builder::new().name(request.name).spawn(move || {
            confine_or_exit(&confinement, kind);
            job();
        });
        let _ = request.started.send(result.map(drop));
    }
}

/// Confines the calling thread to `kind` if the jail is closed.
pub fn confine_current(kind: ThreadKind) {
    if let Some(launcher) = LAUNCHER.get() {
        confine_or_exit(&launcher.confinement, kind);
    }
}

/// A thread that cannot be confined must not run at all. Before its
/// filter (the launcher's allows what this takes):
/// - a worker whose opens must change nothing gets a Landlock layer
///   refusing it every change (see `Openat::allows_openat2`), and a
///   descriptor table of its own (`own_descriptors`);
/// - a worker that may open with any flag gets the layer that reaches
///   only the writable shares: its filter allows fchmod, fchown and
///   futimens, which Landlock does not govern, on what it opens.
fn confine_or_exit(confinement: &Confinement, kind: ThreadKind) {
    sigsys::set_thread_kind(kind.name());
    match kind {
        ThreadKind::Device(DeviceThread { openat: Openat::ReadOnly, .. }) => {
            if let Err(e) = landlock::forbid_changes() {
                exit_with(&format!("cannot refuse the {} thread every change to files: {e}", kind.name()), &e);
            }
            if let Err(e) = own_descriptors() {
                exit_with(&format!("cannot give the {} thread descriptors of its own", kind.name()), &e);
            }
        }
        ThreadKind::Device(DeviceThread { openat: Openat::Any, .. }) => {
            if let Err(e) = confinement.writable.restrict_current() {
                exit_with(&format!("cannot keep the {} thread to the writable shares: {e}", kind.name()), &e);
            }
        }
        _ => {}
    }
    if let Err(e) = confinement.filters.apply(kind) {
        exit_with(&e.to_string(), &e);
    }
}

/// Gives the calling thread a descriptor table of its own, a copy of the
/// process's: what it opens from now on is out of every other thread's
/// reach. A read-only share's file opened for reading there cannot be
/// fchmod'ed, fchown'ed or futimens'ed by the writable shares' worker
/// (which could, by its number, in a shared table); the `O_PATH`
/// descriptors the tables share refuse those calls (EBADF). Such a
/// thread reopens a descriptor through /proc/thread-self/fd, its own
/// table's, not /proc/self/fd, the main thread's. What the process
/// opened before the jail closed stays in both tables.
fn own_descriptors() -> io::Result<()> {
    // SAFETY: unshare takes no pointers; the new table holds the same
    // descriptors under the same numbers, so every descriptor this
    // thread's objects hold stays valid.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
