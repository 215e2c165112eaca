//! A test aid (`stockade vmm --jail-probe`): closes the same jail the VMM
//! closes, then attempts one forbidden operation from a device worker
//! thread and prints what happened. Operations that seccomp forbids never
//! return: the SIGSYS report ends the process.

use std::ffi::CString;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::mpsc;

use super::devices::virtio::{device_threads, fs};
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
    /// writable share's worker: Landlock does not govern chmod.
    Chmod(PathBuf),
    /// Make a TCP socket.
    Socket,
    /// Run a program.
    Exec(PathBuf),
    /// List inherited descriptors that would survive an exec.
    Fds,
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
            Some(("exec", path)) => Ok(Probe::Exec(path.into())),
            None if s == "socket" => Ok(Probe::Socket),
            None if s == "fds" => Ok(Probe::Fds),
            _ => {
                Err("use open:PATH, write:PATH, truncate:PATH, truncate-rw:PATH, openat2:PATH, chmod:PATH, exec:PATH, socket or fds"
                    .into())
            }
        }
    }
}

impl Probe {
    /// The worker that would make this call: writes come from a writable
    /// share's worker, everything else from the read-only one.
    fn thread_kind(&self) -> ThreadKind {
        match self {
            Probe::Write(_) | Probe::TruncateRw(_) | Probe::Chmod(_) => ThreadKind::Device(&fs::WRITABLE_THREAD),
            _ => ThreadKind::Device(&fs::READ_ONLY_THREAD),
        }
    }
}

/// Closes the jail with `rules`, runs `probe` on a virtio-fs worker thread
/// and returns its one-line result.
pub fn run(rules: &FsRules, probe: Probe) -> Result<String, JailError> {
    jail::enter(rules, &device_threads())?;
    let (tx, rx) = mpsc::channel();
    thread::spawn("probe", probe.thread_kind(), move || {
        let _ = tx.send(attempt(&probe));
    })
    .map_err(JailError::Launcher)?;
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
        Probe::Chmod(path) => outcome(flip_owner_execute(path)),
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

/// `fchmodat(path)` (the call the writable worker makes) flipping the
/// owner's execute bit.
fn flip_owner_execute(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::symlink_metadata(path)?.permissions().mode();
    let path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| std::io::Error::other("NUL in path"))?;
    // SAFETY: `path` is NUL-terminated; fchmodat touches no memory of ours.
    if unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), (mode ^ 0o100) & 0o7777, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
