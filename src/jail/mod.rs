//! Confinement of the VMM process, closed once its devices are set up and
//! before the guest runs: Landlock limits the files it can reach to the
//! shares (read-only unless a policy made them writable) and the session
//! directory; seccomp limits each thread to the system calls of its kind
//! (`seccomp::ThreadKind`; each virtio device declares its worker's list,
//! see `vmm::devices::virtio`); no_new_privs comes with both. The VMM holds no
//! credentials and makes no sockets (see `vmm::devices::broker`).

pub mod landlock;
pub mod seccomp;
mod sigsys;
pub mod thread;

use std::sync::{Arc, OnceLock};

use thiserror::Error;

pub use landlock::FsRules;
pub use seccomp::{DeviceThread, Landlocked, Openat, ThreadKind};

#[derive(Debug, Error)]
pub enum JailError {
    #[error(transparent)]
    Landlock(#[from] landlock::LandlockError),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("cannot start the jail's thread launcher")]
    Launcher(#[source] std::io::Error),
    #[error("cannot install the SIGSYS report")]
    Sigsys(#[source] std::io::Error),
}

/// What the closed jail enforces, for the log.
#[derive(Debug)]
pub struct Closed {
    pub landlock_abi: u32,
}

/// Closes the jail on this process. Call it from the main thread before
/// any other thread exists: Landlock binds the caller and the threads it
/// creates afterwards. Threads must then be created with `thread::spawn`,
/// and the caller confines itself with `thread::confine_current`.
/// `devices`: the worker threads the VMM's devices will start.
pub fn enter(rules: &FsRules, devices: &[&'static DeviceThread]) -> Result<Closed, JailError> {
    keep_freed_heap();
    // Landlock first: what it enforces decides who may call openat2.
    let landlock_abi = landlock::restrict(rules)?;
    let landlocked = *CLOSED.get_or_init(|| Landlocked { abi: landlock_abi });
    let filters = seccomp::Filters::build(devices, landlocked)?;
    let writable = landlock::Layer::only(&rules.read_write)?;
    sigsys::install().map_err(JailError::Sigsys)?;
    thread::start_launcher(Arc::new(thread::Confinement { filters, writable })).map_err(JailError::Launcher)?;
    Ok(Closed { landlock_abi })
}

/// Stops the C library from shrinking heaps when memory is freed. The
/// first time glibc shrinks a thread's heap it opens
/// /proc/sys/vm/overcommit_memory, a call most workers' filters refuse: a
/// burst of guest disk writes freed on the disk worker stopped the VMM with
/// SIGSYS. Freed memory stays with the process for reuse instead (large
/// buffers are still mapped and unmapped on their own).
fn keep_freed_heap() {
    // SAFETY: mallopt only sets an allocator parameter; any value of
    // M_TRIM_THRESHOLD is valid.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) };
}

/// What the jail closed on this process enforces, once it is closed.
static CLOSED: OnceLock<Landlocked> = OnceLock::new();

/// Whether a worker with `openat` may call `openat2`: anyone may before the
/// jail closes (or without one); after, only where its filter allows it
/// (see [`Openat::allows_openat2`]), as a call its filter refuses ends the VMM.
pub fn may_openat2(openat: Openat) -> bool {
    CLOSED.get().is_none_or(|landlocked| openat.allows_openat2(*landlocked))
}

/// Closes every descriptor above stderr that this process inherited: the
/// VMM must hold only what it opens itself, not whatever its caller's
/// caller left open (a socket, a pipe to another program). Call first.
pub fn close_inherited_fds() -> std::io::Result<()> {
    // SAFETY: close_range takes no pointers; nothing in this process owns
    // a descriptor above 2 yet when this runs first thing.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Whether this host can close the jail; the reason when it cannot.
pub fn check_available() -> Result<(), String> {
    if let Err(e) = landlock::abi_version() {
        return Err(format!("Landlock is unavailable ({e}): {}", landlock::unavailable_fix(&e)));
    }
    match seccomp::available_actions() {
        Some(actions) if seccomp::filters_usable(&actions) => Ok(()),
        Some(_) => Err("this kernel's seccomp lacks the trap action".into()),
        None => Err("this kernel has no seccomp filters (needs CONFIG_SECCOMP_FILTER=y)".into()),
    }
}
