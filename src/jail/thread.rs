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

/// What a thread runs.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

struct Request {
    name: String,
    kind: ThreadKind,
    job: Job,
    helpers: Vec<Job>,
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
    spawn_group(name, kind, Box::new(f), Vec::new())
}

/// Starts a thread named `name` that runs `leader`, and, from it, one
/// thread per job of `helpers` (named `name-1`, `name-2`...): all of them
/// confined as `kind` when the jail is closed, the helpers sharing the
/// leader's descriptor table and Landlock layers. The result is the
/// leader's start; a helper that cannot be started is logged and left
/// out, and its job dropped.
pub fn spawn_group(name: impl Into<String>, kind: ThreadKind, leader: Job, helpers: Vec<Job>) -> io::Result<()> {
    let name = name.into();
    let Some(launcher) = LAUNCHER.get() else {
        std::thread::Builder::new().name(name.clone()).spawn(move || {
            start_helpers(None, kind, &name, helpers);
            leader();
        })?;
        return Ok(());
    };
    let (started, result) = mpsc::sync_channel(1);
    let request = Request { name, kind, job: leader, helpers, started };
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
        let Request { name, kind, job, helpers, started } = request;
        let result = std::thread::Builder::new().name(name.clone()).spawn(move || {
            take_up_layers_or_exit(&confinement, kind);
            start_helpers(Some(&confinement), kind, &name, helpers);
            apply_filter_or_exit(&confinement, kind);
            job();
        });
        let _ = started.send(result.map(drop));
    }
}

/// Starts `helpers` from the calling thread, their group's leader, which
/// has taken up `kind`'s Landlock layer and descriptor table but not yet
/// its filter. Each helper shares the leader's table (a thread made with
/// CLONE_FILES) and inherits its layers and its filters so far (the
/// launcher's), then takes up `kind`'s filter itself, when `confinement`
/// is given (the jail is closed), before its job.
fn start_helpers(confinement: Option<&Arc<Confinement>>, kind: ThreadKind, name: &str, helpers: Vec<Job>) {
    for (number, helper) in (1..).zip(helpers) {
        let confinement = confinement.cloned();
        let started = std::thread::Builder::new().name(format!("{name}-{number}")).spawn(move || {
            if let Some(confinement) = confinement {
                sigsys::set_thread_kind(kind.name());
                apply_filter_or_exit(&confinement, kind);
            }
            helper();
        });
        if let Err(e) = started {
            tracing::warn!("cannot start helper {number} of the {name} thread: {e}");
        }
    }
}

/// Confines the calling thread to `kind` if the jail is closed.
pub fn confine_current(kind: ThreadKind) {
    if let Some(launcher) = LAUNCHER.get() {
        confine_or_exit(&launcher.confinement, kind);
    }
}

/// A thread that cannot be confined must not run at all.
fn confine_or_exit(confinement: &Confinement, kind: ThreadKind) {
    take_up_layers_or_exit(confinement, kind);
    apply_filter_or_exit(confinement, kind);
}

/// What a thread of `kind` takes up before its filter (the launcher's
/// allows what this takes):
/// - a worker whose opens must change nothing gets a Landlock layer
///   refusing it every change (see `Openat::allows_openat2`), and a
///   descriptor table of its own (`own_descriptors`);
/// - a worker that may open with any flag gets the layer that reaches
///   only the writable shares: its filter allows fchmod, fchown and
///   futimens, which Landlock does not govern, on what it opens.
fn take_up_layers_or_exit(confinement: &Confinement, kind: ThreadKind) {
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
}

/// Installs `kind`'s filter on the calling thread, for good.
fn apply_filter_or_exit(confinement: &Confinement, kind: ThreadKind) {
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

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::jail::Landlocked;
    use crate::jail::seccomp::WORKER;

    /// A read-only worker's kind as a file server's is (the VMM's own
    /// kinds are the VMM's; the jail does not import them): it opens
    /// without modifying flags and stats what it opened.
    const READ_ONLY_WORKER: DeviceThread = DeviceThread {
        name: "read-only worker",
        syscalls: &[WORKER, &[libc::SYS_fstat, libc::SYS_newfstatat, libc::SYS_statx]],
        openat: Openat::ReadOnly,
        on_descriptor: &[],
    };

    /// What a thread tells of itself: its name and, from its status in
    /// procfs, its seccomp mode and how many filters it runs under.
    fn itself() -> Result<String, String> {
        let status = std::fs::read_to_string("/proc/thread-self/status").map_err(|e| e.to_string())?;
        let seccomp: Vec<&str> = status.lines().filter(|l| l.starts_with("Seccomp")).collect();
        Ok(format!("{} {}", std::thread::current().name().unwrap_or("?"), seccomp.join(" ")))
    }

    /// The inode of the file behind `fd` in the calling thread's table.
    fn inode_of(fd: RawFd) -> Result<u64, String> {
        // SAFETY: libc::stat is plain data, valid all zeros.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat only writes into `stat`, a valid struct we own.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(format!("fstat {fd}: {}", io::Error::last_os_error()));
        }
        Ok(stat.st_ino)
    }

    /// Without a jail a group's threads just start, named after it.
    #[test]
    fn a_group_starts_its_leader_and_its_helpers() {
        let (tx, rx) = mpsc::channel();
        let job = |tx: Sender<String>| -> Job {
            Box::new(move || tx.send(std::thread::current().name().unwrap_or("?").to_owned()).unwrap())
        };
        spawn_group("group", ThreadKind::Main, job(tx.clone()), vec![job(tx.clone()), job(tx)]).unwrap();
        let mut names: Vec<String> = rx.iter().collect();
        names.sort();
        assert_eq!(names, ["group", "group-1", "group-2"]);
    }

    /// Under the closed jail (the launcher running, as the VMM starts
    /// it), a read-only worker's helper reaches what the worker opened in
    /// its own descriptor table, and runs under the worker's filters, on
    /// top of the launcher's. Run in a child process: the launcher is for
    /// good.
    #[test]
    fn a_read_only_workers_helper_shares_its_descriptors_and_its_filter() {
        let Ok(abi) = super::landlock::abi_version() else {
            eprintln!("skipping: this kernel has no Landlock");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("opened by the worker");
        std::fs::write(&file, b"shared").unwrap();
        let filters = Filters::build(&[&READ_ONLY_WORKER], Landlocked { abi }).unwrap();
        let confinement = Confinement { filters, writable: Layer::only(&[]).unwrap() };
        // SAFETY: the child only runs `in_a_group` and ends with _exit,
        // never returning into the test harness; glibc's fork leaves its
        // allocator usable there.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = match in_a_group(confinement, &file) {
                Ok(()) => 0,
                Err(e) => {
                    // Past the harness's capture, which the parent would
                    // never print.
                    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{e}\n").as_bytes());
                    1
                }
            };
            // SAFETY: _exit ends the child without running the parent's
            // exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid writes the child's status into `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &raw mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child ended with {status:#x}");
    }

    /// The child's side: a read-only worker group of one helper started
    /// through the launcher.
    fn in_a_group(confinement: Confinement, file: &Path) -> Result<(), String> {
        start_launcher(Arc::new(confinement)).map_err(|e| e.to_string())?;
        let inode = std::fs::metadata(file).map_err(|e| e.to_string())?.ino();
        let (fd_tx, fd_rx) = mpsc::channel::<RawFd>();
        let (report_tx, report) = mpsc::channel::<Result<String, String>>();
        let (leader_report, file) = (report_tx.clone(), file.to_owned());
        let (ready_tx, ready) = mpsc::channel::<()>();
        // The worker opens once its helper runs its job: in a table the
        // helper would have copied before, the file would be missing.
        let leader: Job = Box::new(move || {
            let ready = ready.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string());
            let opened = ready.and_then(|()| std::fs::File::open(&file).map_err(|e| format!("the worker's open: {e}")));
            let said = opened.and_then(|f| {
                fd_tx.send(f.as_raw_fd()).map_err(|e| e.to_string())?;
                let _ = f.into_raw_fd();
                itself()
            });
            let _ = leader_report.send(said);
        });
        let helper: Job = Box::new(move || {
            let _ = ready_tx.send(());
            let said = fd_rx.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string()).and_then(|fd| {
                let found = inode_of(fd)?;
                if found != inode {
                    return Err(format!("the helper's descriptor {fd} is inode {found}, not the file's {inode}"));
                }
                itself()
            });
            let _ = report_tx.send(said);
        });
        spawn_group("fs-group", ThreadKind::Device(&READ_ONLY_WORKER), leader, vec![helper])
            .map_err(|e| e.to_string())?;
        let mut said = Vec::new();
        for _ in 0..2 {
            said.push(report.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string())??);
        }
        said.sort();
        let [leader, helper] = &said[..] else { unreachable!() };
        let filters = |said: &str| said.split_once(' ').map(|(_, seccomp)| seccomp.to_owned());
        if !leader.starts_with("fs-group ") || !helper.starts_with("fs-group-1 ") {
            return Err(format!("the group's threads are misnamed: {said:?}"));
        }
        if filters(leader) != filters(helper) || !leader.contains("Seccomp:\t2") {
            return Err(format!("the helper's filters are not the worker's: {said:?}"));
        }
        Ok(())
    }
}
