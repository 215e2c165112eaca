//! A test aid (`stockade vmm --jail-probe`): closes the same jail the VMM
//! closes, then attempts one forbidden operation from a device worker
//! thread and prints what happened. Operations that seccomp forbids never
//! return: the SIGSYS report ends the process.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::mpsc;

use super::devices::virtio::{blk, device_threads, fs};
use crate::jail::{self, FsRules, JailError, ThreadKind, thread};

#[derive(Debug, Clone)]
pub enum Probe {
    /// Open a file for reading.
    Open(PathBuf),
    /// Open a file for writing, from a writable share's worker.
    Write(PathBuf),
    /// Open a file read-only with `O_TRUNC`, from the read-only worker (what
    /// Landlock below ABI 3 would not stop).
    Truncate(PathBuf),
    /// Open a file read-only with `O_TRUNC` through `openat2`, from the
    /// read-only worker, whose filter allows that call only where Landlock
    /// refuses the truncation itself.
    Openat2(PathBuf),
    /// Open a file read-only with `O_TRUNC`, from a writable share's
    /// worker, whose filter refuses the flag (Landlock below ABI 3 would
    /// judge the open a read, on any share).
    TruncateRw(PathBuf),
    /// Change a file's mode (its owner's execute bit flipped), from a
    /// writable share's worker, as its file server does: open the file,
    /// then fchmod. Landlock does not govern chmod, the worker's own
    /// layer governs the open.
    Chmod(PathBuf),
    /// Give a file to its own owner and group (which changes its ctime),
    /// from a writable share's worker, as its file server does: open,
    /// then fchown.
    Chown(PathBuf),
    /// Set a file's modification time to 2001-09-09, from a writable
    /// share's worker, as its file server does: open, then futimens.
    Touch(PathBuf),
    /// [`Probe::Chmod`] by path (fchmodat), which that worker's filter
    /// refuses.
    ChmodAt(PathBuf),
    /// [`Probe::Chown`] by path (fchownat), likewise refused.
    ChownAt(PathBuf),
    /// [`Probe::Touch`] by path (utimensat with a path), likewise refused.
    TouchAt(PathBuf),
    /// Open a file for reading on the read-only shares' worker, as its
    /// file server does to read it, then fchmod that descriptor's number
    /// from a writable share's worker.
    Reach(PathBuf),
    /// Make a TCP socket.
    Socket,
    /// Run a program.
    Exec(PathBuf),
    /// List inherited descriptors that would survive an exec.
    Fds,
    /// Allocate many small blocks and free them all, on the disk worker
    /// (which may not open files), as a burst of guest writes does: the
    /// C library gives the freed memory back, and must not open a file
    /// to decide how.
    HeapTrim,
}

impl FromStr for Probe {
    type Err = String;

    fn from_str(s: &str) -> Result<Probe, String> {
        match s.split_once(':') {
            Some(("open", path)) => Ok(Probe::Open(path.into())),
            Some(("write", path)) => Ok(Probe::Write(path.into())),
            Some(("truncate", path)) => Ok(Probe::Truncate(path.into())),
            Some(("truncate-rw", path)) => Ok(Probe::TruncateRw(path.into())),
            Some(("openat2", path)) => Ok(Probe::Openat2(path.into())),
            Some(("chmod", path)) => Ok(Probe::Chmod(path.into())),
            Some(("chown", path)) => Ok(Probe::Chown(path.into())),
            Some(("touch", path)) => Ok(Probe::Touch(path.into())),
            Some(("chmod-at", path)) => Ok(Probe::ChmodAt(path.into())),
            Some(("chown-at", path)) => Ok(Probe::ChownAt(path.into())),
            Some(("touch-at", path)) => Ok(Probe::TouchAt(path.into())),
            Some(("reach", path)) => Ok(Probe::Reach(path.into())),
            Some(("exec", path)) => Ok(Probe::Exec(path.into())),
            None if s == "socket" => Ok(Probe::Socket),
            None if s == "fds" => Ok(Probe::Fds),
            None if s == "heap-trim" => Ok(Probe::HeapTrim),
            _ => Err("use open:PATH, write:PATH, truncate:PATH, truncate-rw:PATH, openat2:PATH, chmod:PATH, \
                      chown:PATH, touch:PATH, chmod-at:PATH, chown-at:PATH, touch-at:PATH, reach:PATH, exec:PATH, \
                      socket, fds or heap-trim"
                .into()),
        }
    }
}

impl Probe {
    /// The worker that would make this call: writes come from a writable
    /// share's worker, everything else from the read-only one.
    fn thread_kind(&self) -> ThreadKind {
        match self {
            Probe::Write(_)
            | Probe::TruncateRw(_)
            | Probe::Chmod(_)
            | Probe::Chown(_)
            | Probe::Touch(_)
            | Probe::ChmodAt(_)
            | Probe::ChownAt(_)
            | Probe::TouchAt(_) => ThreadKind::Device(&fs::WRITABLE_THREAD),
            Probe::HeapTrim => ThreadKind::Device(&blk::THREAD),
            _ => ThreadKind::Device(&fs::READ_ONLY_THREAD),
        }
    }
}

/// Closes the jail with `rules`, runs `probe` on a virtio-fs worker thread
/// and returns its one-line result.
pub fn run(rules: &FsRules, probe: Probe) -> Result<String, JailError> {
    jail::enter(rules, &device_threads())?;
    let (tx, rx) = mpsc::channel();
    match probe {
        Probe::Reach(path) => reach(path, tx).map_err(JailError::Launcher)?,
        probe => thread::spawn("probe", probe.thread_kind(), move || {
            let _ = tx.send(attempt(&probe));
        })
        .map_err(JailError::Launcher)?,
    }
    thread::confine_current(ThreadKind::Main);
    Ok(rx.recv().unwrap_or_else(|_| "the probe thread ended without a result".into()))
}

fn attempt(probe: &Probe) -> String {
    let outcome = |r: std::io::Result<()>| match r {
        Ok(()) => "allowed".to_string(),
        Err(e) => format!("denied: {e}"),
    };
    match probe {
        Probe::Open(path) => outcome(std::fs::File::open(path).map(drop)),
        Probe::Write(path) => outcome(std::fs::OpenOptions::new().write(true).open(path).map(drop)),
        Probe::Truncate(path) | Probe::TruncateRw(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            outcome(std::fs::OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(path).map(drop))
        }
        Probe::Openat2(path) => outcome(openat2_truncating(path)),
        Probe::Chmod(path) => outcome(opened(path).and_then(|f| flip_owner_execute(f.as_raw_fd()))),
        Probe::Chown(path) => outcome(opened(path).and_then(|f| give_to_its_owner(f.as_raw_fd()))),
        Probe::Touch(path) => outcome(opened(path).and_then(|f| set_mtime(f.as_raw_fd()))),
        Probe::ChmodAt(path) => outcome(by_path(path, |path, mode| {
            // SAFETY: `path` is NUL-terminated; fchmodat touches no memory of ours.
            unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), (mode ^ 0o100) & 0o7777, 0) }
        })),
        Probe::ChownAt(path) => {
            let owner = std::fs::symlink_metadata(path).map(|m| (m.uid(), m.gid()));
            outcome(owner.and_then(|(uid, gid)| {
                by_path(path, |path, _| {
                    // SAFETY: `path` is NUL-terminated; fchownat touches no memory of ours.
                    unsafe { libc::fchownat(libc::AT_FDCWD, path.as_ptr(), uid, gid, 0) }
                })
            }))
        }
        Probe::TouchAt(path) => outcome(by_path(path, |path, _| {
            // SAFETY: `path` is NUL-terminated; utimensat only reads `TIMES`.
            unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), TIMES.as_ptr(), 0) }
        })),
        Probe::Reach(_) => "reach runs on two threads".into(),
        Probe::Socket => outcome(std::net::TcpListener::bind("127.0.0.1:0").map(drop)),
        Probe::Exec(path) => {
            let Ok(program) = CString::new(path.as_os_str().as_encoded_bytes()) else {
                return "denied: the path has a NUL byte".into();
            };
            let argv = [program.as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null()];
            // SAFETY: NUL-terminated argv and envp arrays of valid C strings
            // that outlive the call; execve only returns on failure.
            unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            outcome(Err(std::io::Error::last_os_error()))
        }
        Probe::Fds => inheritable_fds(),
        Probe::HeapTrim => {
            let blocks: Vec<Vec<u8>> = (0..8192).map(|_| vec![1u8; 1024]).collect();
            drop(std::hint::black_box(blocks));
            "freed".into()
        }
    }
}

/// `openat2(path, O_RDONLY | O_TRUNC)`, closed again if it opened.
fn openat2_truncating(path: &std::path::Path) -> std::io::Result<()> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| std::io::Error::other("NUL in path"))?;
    let flags = u64::try_from(libc::O_RDONLY | libc::O_TRUNC | libc::O_CLOEXEC).unwrap_or_default();
    let how = OpenHow { flags, mode: 0, resolve: 0 };
    // SAFETY: `path` is NUL-terminated and `how` an open_how of the size
    // passed with it; the kernel only reads both.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, path.as_ptr(), &raw const how, std::mem::size_of::<OpenHow>())
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| std::io::Error::other("descriptor out of range"))?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    Ok(())
}

/// The times [`Probe::Touch`] sets: the access time left, the
/// modification time at 1,000,000,000 seconds.
const TIMES: [libc::timespec; 2] =
    [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, libc::timespec { tv_sec: 1_000_000_000, tv_nsec: 0 }];

/// `path` opened for reading as the file servers open a node: found with
/// `O_PATH`, then opened through its link in /proc/thread-self/fd (where
/// Landlock judges the file reached).
fn opened(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let found = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(path)?;
    File::open(format!("/proc/thread-self/fd/{}", found.as_raw_fd()))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// fchmod of `fd` flipping its owner's execute bit.
fn flip_owner_execute(fd: RawFd) -> io::Result<()> {
    let mode = fstat(fd)?.st_mode;
    // SAFETY: fchmod touches no memory of ours.
    check(unsafe { libc::fchmod(fd, (mode ^ 0o100) & 0o7777) })
}

/// fchown of `fd` to the owner and group it has.
fn give_to_its_owner(fd: RawFd) -> io::Result<()> {
    let st = fstat(fd)?;
    // SAFETY: fchown touches no memory of ours.
    check(unsafe { libc::fchown(fd, st.st_uid, st.st_gid) })
}

/// futimens of `fd` to [`TIMES`].
fn set_mtime(fd: RawFd) -> io::Result<()> {
    // SAFETY: futimens only reads `TIMES`.
    check(unsafe { libc::futimens(fd, TIMES.as_ptr()) })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one stat into `st`, which outlives the call.
    check(unsafe { libc::fstat(fd, &raw mut st) })?;
    Ok(st)
}

/// `call` with `path` as a C string and its mode: a change by path.
fn by_path(path: &Path, call: impl FnOnce(&CString, u32) -> libc::c_int) -> io::Result<()> {
    let mode = std::fs::symlink_metadata(path)?.permissions().mode();
    let path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::other("NUL in path"))?;
    check(call(&path, mode))
}

/// [`Probe::Reach`]: the read-only worker opens `path` for reading and
/// holds it open while a writable worker tries to fchmod the descriptor
/// by its number; the result goes to `result`.
fn reach(path: PathBuf, result: mpsc::Sender<String>) -> io::Result<()> {
    let (opened_tx, opened_rx) = mpsc::channel::<Result<(RawFd, (u64, u64)), String>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    thread::spawn("probe (read-only)", ThreadKind::Device(&fs::READ_ONLY_THREAD), move || {
        let file = opened(&path).and_then(|f| f.metadata().map(|m| (m.dev(), m.ino(), f)));
        match file {
            Ok((dev, ino, file)) => {
                let _ = opened_tx.send(Ok((file.as_raw_fd(), (dev, ino))));
                let _ = done_rx.recv();
                drop(file);
            }
            Err(e) => {
                let _ = opened_tx.send(Err(format!("the read-only worker could not open it: {e}")));
            }
        }
    })?;
    thread::spawn("probe", ThreadKind::Device(&fs::WRITABLE_THREAD), move || {
        let outcome = match opened_rx.recv() {
            Ok(Ok((fd, identity))) => match fstat(fd) {
                // Another file by that number here: never changed.
                Ok(st) if (st.st_dev, st.st_ino) != identity => format!("denied: descriptor {fd} is another file"),
                Ok(_) => match flip_owner_execute(fd) {
                    Ok(()) => "allowed".into(),
                    Err(e) => format!("denied: {e}"),
                },
                Err(e) => format!("denied: {e}"),
            },
            Ok(Err(e)) => e,
            Err(_) => "the read-only probe ended without a descriptor".into(),
        };
        let _ = done_tx.send(());
        let _ = result.send(outcome);
    })
}

/// Descriptors without close-on-exec, beyond stdin, stdout and stderr.
fn inheritable_fds() -> String {
    let leaky: Vec<String> = (3..4096)
        .filter(|fd| {
            // SAFETY: F_GETFD only reads a descriptor's flags (EBADF if none).
            let flags = unsafe { libc::fcntl(*fd, libc::F_GETFD) };
            flags >= 0 && flags & libc::FD_CLOEXEC == 0
        })
        .map(|fd| fd.to_string())
        .collect();
    if leaky.is_empty() {
        "fds: all close-on-exec".into()
    } else {
        format!("fds without close-on-exec: {}", leaky.join(" "))
    }
}
