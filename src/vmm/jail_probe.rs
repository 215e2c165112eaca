//! A test aid (`stockade vmm --jail-probe`): makes the VMM's devices as
//! the VMM makes them (so the descriptors they open before the jail are
//! there), closes the same jail the VMM closes, then attempts one
//! forbidden operation from a device worker thread and prints what
//! happened. Operations that seccomp forbids never return: the SIGSYS
//! report ends the process.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use kvm_ioctls::Kvm;
use thiserror::Error;

use super::devices::broker::Dialer;
use super::devices::virtio::{blk, device_threads, fs, vsock};
use super::template::{Recorder, RecorderParts, TemplateError};
use super::{VmmError, memory};
use crate::jail::{self, DeviceThread, JailError, Openat, ThreadKind, thread};
use crate::protocol::vm_config::VmConfig;

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
    /// [`Probe::Chmod`] on a thread the read-only worker has the
    /// launcher start under the launcher's own kind, as any thread's code
    /// can ask it (the launcher's filter is every kind's together, and
    /// it takes up no Landlock layer).
    LaunchChmod(PathBuf),
    /// [`Probe::Chmod`] on a thread the read-only worker has the launcher
    /// start as a device thread it made up: named as the writable shares'
    /// worker (its filter), but with `Openat::Never` (no Landlock layer).
    ForgedChmod(PathBuf),
    /// From a thread the read-only worker has the launcher start under its
    /// own kind, fork a process (clone without CLONE_VM or CLONE_THREAD)
    /// that lets go of stdout and stderr, waits two seconds and then makes
    /// the file at the path: what outlives the VMM.
    Fork(PathBuf),
    /// From a writable share's worker, fchmod the descriptor of the
    /// guest's init (the host's stockade binary) that the boot device
    /// opened before the jail closed, setting its setuid and
    /// world-writable bits. The path is the init, to know it by identity.
    InitChmod(PathBuf),
    /// From a writable share's worker, hard-link the boot device's
    /// descriptor of the init (linkat with AT_EMPTY_PATH) at the path, in
    /// a writable share, where it could be opened for writing.
    InitLink(PathBuf),
    /// From the read-only worker, write the start of a template recording's
    /// memory file (made in the directory before the jail closes, as a
    /// recording VM makes it; KVM needed) through the descriptor the
    /// recording holds open for the whole run.
    TemplateWrite(PathBuf),
    /// From a writable share's worker, change a read-only share (whose
    /// root is the path) through the descriptors of it the read-only
    /// device opened before the jail closed: each change the worker's
    /// filter allows, on the descriptor or beneath it.
    Roots(PathBuf),
    /// From a writable share's worker, have the kernel send SIGTERM to
    /// the process `pid` when a file is made in the writable share's
    /// directory `dir` (fcntl F_SETOWN, F_SETSIG and F_NOTIFY), then make
    /// one there.
    Signal { pid: i32, dir: PathBuf },
    /// Read a file's `user.origin` extended attribute by its path (getxattr,
    /// which Landlock does not govern), from the read-only worker.
    Xattr(PathBuf),
    /// Read where a symlink leads (readlinkat by path, which Landlock does
    /// not govern), from the read-only worker.
    Readlink(PathBuf),
    /// Run a program through the 32-bit system call entry (`int 0x80`,
    /// whose execve has the number of the 64-bit munmap, which every filter
    /// allows): a filter that did not check the architecture would let it.
    Exec32(PathBuf),
    /// From a vCPU thread, write this many bytes (zeros) to stderr, the
    /// vmm.log the supervisor hands the VMM, past the cap its log writer
    /// keeps.
    Flood(u64),
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
            Some(("launch-chmod", path)) => Ok(Probe::LaunchChmod(path.into())),
            Some(("forged-chmod", path)) => Ok(Probe::ForgedChmod(path.into())),
            Some(("fork", path)) => Ok(Probe::Fork(path.into())),
            Some(("init-chmod", path)) => Ok(Probe::InitChmod(path.into())),
            Some(("init-link", path)) => Ok(Probe::InitLink(path.into())),
            Some(("template-write", path)) => Ok(Probe::TemplateWrite(path.into())),
            Some(("roots", path)) => Ok(Probe::Roots(path.into())),
            Some(("xattr", path)) => Ok(Probe::Xattr(path.into())),
            Some(("exec32", path)) => Ok(Probe::Exec32(path.into())),
            Some(("flood", bytes)) => Ok(Probe::Flood(bytes.parse().map_err(|_| "flood:BYTES takes a number")?)),
            Some(("readlink", path)) => Ok(Probe::Readlink(path.into())),
            Some(("signal", rest)) => {
                let (pid, dir) = rest.split_once(':').ok_or("use signal:PID:DIR")?;
                Ok(Probe::Signal { pid: pid.parse().map_err(|_| "signal:PID:DIR takes a number")?, dir: dir.into() })
            }
            None if s == "socket" => Ok(Probe::Socket),
            None if s == "fds" => Ok(Probe::Fds),
            None if s == "heap-trim" => Ok(Probe::HeapTrim),
            _ => Err("use open:PATH, write:PATH, truncate:PATH, truncate-rw:PATH, openat2:PATH, chmod:PATH, \
                      chown:PATH, touch:PATH, chmod-at:PATH, chown-at:PATH, touch-at:PATH, reach:PATH, exec:PATH, \
                      launch-chmod:PATH, forged-chmod:PATH, fork:PATH, init-chmod:PATH, init-link:PATH, \
                      template-write:DIR, roots:PATH, signal:PID:DIR, xattr:PATH, readlink:PATH, exec32:PATH, \
                      flood:BYTES, socket, fds or heap-trim"
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
            | Probe::TouchAt(_)
            | Probe::InitChmod(_)
            | Probe::InitLink(_)
            | Probe::Roots(_)
            | Probe::Signal { .. } => ThreadKind::Device(&fs::WRITABLE_THREAD),
            Probe::Flood(_) => ThreadKind::Vcpu,
            Probe::HeapTrim => ThreadKind::Device(&blk::THREAD),
            _ => ThreadKind::Device(&fs::READ_ONLY_THREAD),
        }
    }
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error(transparent)]
    Jail(#[from] JailError),
    #[error(transparent)]
    Vmm(#[from] VmmError),
    #[error("cannot start the template recording the probe writes")]
    Template(#[from] TemplateError),
}

/// Makes the VMM's devices from `config` (its vsock broker socket must
/// accept a connection), closes the jail of `config`, runs `probe` on a
/// virtio-fs worker thread and returns its one-line result.
pub fn run(config: &VmConfig, probe: Probe) -> Result<String, ProbeError> {
    let dialer = Dialer::connect(&config.vsock_broker, Instant::now())
        .map_err(|source| VmmError::Device { device: vsock::THREAD.name, source })?;
    let _devices = super::virtio_devices(config, &dialer)?;
    let recording = match &probe {
        Probe::TemplateWrite(dir) => Some(recording(dir)?),
        _ => None,
    };
    jail::enter(&super::jail_rules(config), &device_threads())?;
    // The guest reached the template point: the recording is over before
    // its command runs (the probe's code stands for the command's).
    if let Some(recorder) = &recording {
        recorder.finish();
    }
    let (tx, rx) = mpsc::channel();
    let init = config.init.clone();
    match probe {
        Probe::Reach(path) => reach(path, tx).map_err(JailError::Launcher)?,
        probe => thread::spawn("probe", probe.thread_kind(), move || {
            let _ = tx.send(attempt(&probe, &init));
        })
        .map_err(JailError::Launcher)?,
    }
    thread::confine_current(ThreadKind::Main);
    Ok(rx.recv().unwrap_or_else(|_| "the probe thread ended without a result".into()))
}

/// A template recording in `dir`, as a recording VM starts one before its
/// jail closes (a VM of 2 MiB with one vCPU): its files stay open while
/// it lives.
fn recording(dir: &Path) -> Result<Recorder, ProbeError> {
    let kvm = Kvm::new().map_err(VmmError::Kvm)?;
    let vm = kvm.create_vm().map_err(super::setup("create the VM"))?;
    let parts = RecorderParts {
        vm: Arc::new(vm),
        mem: memory::create(&[(0, 2 << 20)]).map_err(VmmError::Memory)?,
        cpuid: vec![String::new()],
        transports: Vec::new(),
        uart: Box::new(|| unreachable!("the probe saves no template")),
    };
    Ok(Recorder::create(&kvm, dir, parts)?)
}

fn attempt(probe: &Probe, init: &Path) -> String {
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
        Probe::LaunchChmod(path) => outcome(launched(ThreadKind::Launcher, path.clone(), |path| {
            opened(&path).and_then(|f| flip_owner_execute(f.as_raw_fd()))
        })),
        Probe::ForgedChmod(path) => outcome(launched(ThreadKind::Device(forged()), path.clone(), |path| {
            opened(&path).and_then(|f| flip_owner_execute(f.as_raw_fd()))
        })),
        Probe::Fork(marker) => {
            outcome(launched(ThreadKind::Launcher, marker.clone(), |marker| fork_outliving(&marker)))
        }
        Probe::InitChmod(path) => outcome(descriptor_of(path).and_then(|fd| {
            let mode = fstat(fd)?.st_mode;
            // SAFETY: fchmod touches no memory of ours.
            check(unsafe { libc::fchmod(fd, (mode | libc::S_ISUID | libc::S_IWOTH) & 0o7777) })
        })),
        Probe::InitLink(at) => outcome(descriptor_of(init).and_then(|fd| {
            let at = c_path(at)?;
            // SAFETY: both strings are NUL-terminated; linkat reads them only.
            check(unsafe { libc::linkat(fd, c"".as_ptr(), libc::AT_FDCWD, at.as_ptr(), libc::AT_EMPTY_PATH) })
        })),
        Probe::TemplateWrite(dir) => outcome(descriptor_of(&dir.join(super::template::MEMORY_FILE)).and_then(|fd| {
            // SAFETY: lseek moves the descriptor's offset only.
            if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: write only reads `POISON`, which outlives the call.
            let wrote = unsafe { libc::write(fd, POISON.as_ptr().cast(), POISON.len()) };
            if wrote < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
        })),
        Probe::Roots(root) => changes_through_roots(root),
        Probe::Signal { pid, dir } => outcome(signal_on_notify(*pid, dir)),
        Probe::Xattr(path) => read_outcome(c_path(path).and_then(|path| {
            let mut value = [0u8; 256];
            // SAFETY: the strings are NUL-terminated; getxattr writes at
            // most `value.len()` bytes into `value`.
            let n = unsafe {
                libc::getxattr(path.as_ptr(), c"user.origin".as_ptr(), value.as_mut_ptr().cast(), value.len())
            };
            let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
            Ok(value[..n].to_vec())
        })),
        Probe::Readlink(path) => read_outcome(c_path(path).and_then(|path| {
            let mut target = [0u8; 256];
            // SAFETY: `path` is NUL-terminated; readlinkat writes at most
            // `target.len()` bytes into `target`.
            let n =
                unsafe { libc::readlinkat(libc::AT_FDCWD, path.as_ptr(), target.as_mut_ptr().cast(), target.len()) };
            let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
            Ok(target[..n].to_vec())
        })),
        Probe::Exec32(path) => outcome(exec_32(path)),
        Probe::Flood(bytes) => outcome(flood_stderr(*bytes)),
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

/// "read: " and what was read, or why not.
fn read_outcome(read: io::Result<Vec<u8>>) -> String {
    match read {
        Ok(bytes) => format!("read: {}", String::from_utf8_lossy(&bytes)),
        Err(e) => format!("denied: {e}"),
    }
}

/// What [`Probe::TemplateWrite`] writes at the start of guest memory.
pub const POISON: &[u8] = b"POISONED";

/// `f(arg)` on a thread of `kind` that the launcher starts at this
/// thread's request (as any thread's code may ask it), and its result.
fn launched<A: Send + 'static>(
    kind: ThreadKind,
    arg: A,
    f: impl FnOnce(A) -> io::Result<()> + Send + 'static,
) -> io::Result<()> {
    let (tx, rx) = mpsc::channel();
    thread::spawn("probe (launched)", kind, move || {
        let _ = tx.send(f(arg));
    })?;
    rx.recv().map_err(|_| io::Error::other("the launched thread ended without a result"))?
}

/// A device thread made up at run time: the writable shares' worker by
/// its name (so its filter), without the Landlock layer its `Openat` brings.
fn forged() -> &'static DeviceThread {
    Box::leak(Box::new(DeviceThread {
        name: fs::WRITABLE_THREAD.name,
        syscalls: &[],
        openat: Openat::Never,
        on_descriptor: &[],
    }))
}

/// Forks a process that closes stdin, stdout and stderr (so whoever
/// waits for the VMM's output stops waiting when the VMM exits), sleeps
/// two seconds, then makes `marker`.
fn fork_outliving(marker: &Path) -> io::Result<()> {
    let marker = c_path(marker)?;
    // SAFETY: a clone without CLONE_VM gives the child a copy of this
    // address space with only this thread; the child makes raw system
    // calls only, on memory that outlives them, then exits.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let pause = libc::timespec { tv_sec: 2, tv_nsec: 0 };
        // SAFETY: see above; `marker` and `pause` live in the child's copy.
        unsafe {
            for fd in 0..3 {
                libc::close(fd);
            }
            libc::nanosleep(&raw const pause, std::ptr::null_mut());
            let fd = libc::openat(
                libc::AT_FDCWD,
                marker.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o644,
            );
            if fd >= 0 {
                libc::write(fd, b"outlived\n".as_ptr().cast(), 9);
            }
            libc::_exit(0);
        }
    }
    Ok(())
}

/// [`Probe::Signal`].
fn signal_on_notify(pid: i32, dir: &Path) -> io::Result<()> {
    /// `F_SETSIG`, `F_NOTIFY`, `DN_CREATE` and `DN_MULTISHOT` (Linux),
    /// which the libc crate does not name.
    const F_SETSIG: libc::c_int = 10;
    const F_NOTIFY: libc::c_int = 1026;
    const DN_CREATE: libc::c_int = 4;
    const DN_MULTISHOT: libc::c_int = i32::MIN;
    let watched = File::open(dir)?;
    let fd = watched.as_raw_fd();
    // SAFETY: these fcntl commands take integers, no pointers.
    unsafe {
        check(libc::fcntl(fd, libc::F_SETOWN, pid))?;
        check(libc::fcntl(fd, F_SETSIG, libc::SIGTERM))?;
        check(libc::fcntl(fd, F_NOTIFY, DN_CREATE | DN_MULTISHOT))?;
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join("notified"))?;
    // The signal goes when the event is handled: give it time to.
    std::thread::sleep(std::time::Duration::from_millis(200));
    Ok(())
}

/// [`Probe::Exec32`]: execve through `int 0x80`, its path and argv below
/// 4 GiB as 32-bit pointers must be. Returns only if the call failed.
fn exec_32(path: &Path) -> io::Result<()> {
    /// execve's number in the 32-bit table.
    const EXECVE_32: u64 = 11;
    let path = c_path(path)?;
    let len = path.as_bytes_with_nul().len();
    // SAFETY: an anonymous private mapping below 4 GiB, new memory no
    // other code uses; never unmapped (the probe ends with the process).
    let low = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_32BIT,
            -1,
            0,
        )
    };
    if low == libc::MAP_FAILED || len > 4096 - 8 {
        return Err(io::Error::other("no memory below 4 GiB for the path"));
    }
    let base = low as u64;
    let argv = base + 4096 - 8;
    // SAFETY: the mapping is 4096 bytes: the path at its start (it fits,
    // checked above) and argv, two 32-bit words, at its end.
    unsafe {
        std::ptr::copy_nonoverlapping(path.as_ptr().cast::<u8>(), low.cast::<u8>(), len);
        let words = low.cast::<u8>().add(4096 - 8).cast::<u32>();
        words.write(u32::try_from(base).map_err(io::Error::other)?);
        words.add(1).write(0);
    }
    let ret: u64;
    // SAFETY: int 0x80 with execve's 32-bit number and pointers into the
    // mapping above; rbx, which LLVM reserves, is swapped in and back.
    unsafe {
        std::arch::asm!(
            "xchg {b}, rbx",
            "int 0x80",
            "xchg {b}, rbx",
            b = inout(reg) base => _,
            inlateout("rax") EXECVE_32 => ret,
            in("rcx") argv,
            in("rdx") 0u64,
        );
    }
    let errno = i32::try_from(ret.wrapping_neg()).unwrap_or(libc::EIO);
    Err(io::Error::from_raw_os_error(errno))
}

/// [`Probe::Flood`]: `bytes` zeros written to stderr by its number.
fn flood_stderr(bytes: u64) -> io::Result<()> {
    let chunk = vec![0u8; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(chunk.len());
        // SAFETY: write reads `n` bytes of `chunk`, which holds more.
        let wrote = unsafe { libc::write(libc::STDERR_FILENO, chunk.as_ptr().cast(), n) };
        let wrote = u64::try_from(wrote).map_err(|_| io::Error::last_os_error())?;
        left = left.saturating_sub(wrote);
    }
    Ok(())
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::other("NUL in path"))
}

/// Every descriptor number of this thread's table that is open on the
/// file at `path` (stat, which Landlock does not govern, knows it).
fn descriptors_of(path: &Path) -> io::Result<Vec<RawFd>> {
    let meta = std::fs::metadata(path)?;
    Ok((3..4096).filter(|fd| fstat(*fd).is_ok_and(|st| (st.st_dev, st.st_ino) == (meta.dev(), meta.ino()))).collect())
}

/// The first of [`descriptors_of`].
fn descriptor_of(path: &Path) -> io::Result<RawFd> {
    descriptors_of(path)?.first().copied().ok_or_else(|| io::Error::other("no descriptor of it here"))
}

/// [`Probe::Roots`]: every change tried through every descriptor of `root`.
fn changes_through_roots(root: &Path) -> String {
    let fds = match descriptors_of(root) {
        Ok(fds) if !fds.is_empty() => fds,
        Ok(_) => return "no descriptor of the share here".into(),
        Err(e) => return format!("cannot stat the share: {e}"),
    };
    let (uid, gid) = match std::fs::metadata(root) {
        Ok(m) => (m.uid(), m.gid()),
        Err(e) => return format!("cannot stat the share: {e}"),
    };
    let mut allowed = Vec::new();
    for fd in fds {
        let reopened = |name: &CStr, flags| -> io::Result<File> {
            // SAFETY: `name` is NUL-terminated; openat returns a new descriptor or -1.
            let new = unsafe { libc::openat(fd, name.as_ptr(), flags | libc::O_CLOEXEC) };
            if new < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `new` was just opened and nothing else owns it.
            Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(new) })
        };
        let tries: [(&str, io::Result<()>); 12] = [
            // SAFETY: the call takes no pointers.
            ("fchmod", check(unsafe { libc::fchmod(fd, 0o700) })),
            // SAFETY: the call takes no pointers.
            ("fchown", check(unsafe { libc::fchown(fd, uid, gid) })),
            // SAFETY: futimens only reads the static `TIMES`.
            ("futimens", check(unsafe { libc::futimens(fd, TIMES.as_ptr()) })),
            (
                "open a file beneath, then fchmod",
                reopened(c"file", libc::O_RDONLY).and_then(|f| flip_owner_execute(f.as_raw_fd())),
            ),
            (
                "open the directory, then fchmod",
                reopened(c".", libc::O_RDONLY | libc::O_DIRECTORY).and_then(|f| flip_owner_execute(f.as_raw_fd())),
            ),
            (
                "reopen through /proc, then fchmod",
                File::open(format!("/proc/thread-self/fd/{fd}")).and_then(|f| flip_owner_execute(f.as_raw_fd())),
            ),
            // SAFETY: the names are NUL-terminated literals, which the call only reads.
            ("mknodat", check(unsafe { libc::mknodat(fd, c"made".as_ptr(), libc::S_IFREG | 0o600, 0) })),
            // SAFETY: the names are NUL-terminated literals, which the call only reads.
            ("mkdirat", check(unsafe { libc::mkdirat(fd, c"made-dir".as_ptr(), 0o700) })),
            // SAFETY: the names are NUL-terminated literals, which the call only reads.
            ("symlinkat", check(unsafe { libc::symlinkat(c"file".as_ptr(), fd, c"made-link".as_ptr()) })),
            // SAFETY: the names are NUL-terminated literals, which the call only reads.
            ("unlinkat", check(unsafe { libc::unlinkat(fd, c"file".as_ptr(), 0) })),
            // SAFETY: the names are NUL-terminated literals, which the call only reads.
            ("renameat", check(unsafe { libc::renameat(fd, c"file".as_ptr(), fd, c"renamed".as_ptr()) })),
            // SAFETY: the names are NUL-terminated literals, which the call only reads.
            ("linkat", check(unsafe { libc::linkat(fd, c"file".as_ptr(), fd, c"linked".as_ptr(), 0) })),
        ];
        allowed.extend(tries.into_iter().filter(|(_, r)| r.is_ok()).map(|(name, _)| format!("{name} on {fd}")));
    }
    if allowed.is_empty() { "denied: every change".into() } else { format!("allowed: {}", allowed.join(", ")) }
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
