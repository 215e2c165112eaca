//! virtio-fs: host directories shared with the guest, read-only unless a
//! policy mounts them writable (a second device, `Fs::writable`).
//!
//! One virtio-fs device serves one FUSE filesystem. Each [`Share`] is a host
//! directory, served by its own [`bounded::BoundedFs`], mounted at the share's
//! guest path inside a `Vfs` whose other directories are synthetic. The
//! guest mounts the whole tree with
//! `mount -t virtiofs -o ro <tag> <mountpoint>`.
//!
//! The read-only device's shares are read-only whatever the guest kernel
//! sends: mutating FUSE opcodes are refused with EROFS before they reach
//! the FUSE server ([`readonly::gate`]), and the filesystem the server
//! dispatches to ([`readonly::ReadOnlyFs`]) refuses them again and forwards
//! only the read-side operations.
//!
//! Every share is served by [`bounded::BoundedFs`], whose host descriptors
//! stay within a budget taken from RLIMIT_NOFILE whatever the guest looks
//! up or changes (inodes are found again by parent and name, never by file
//! handles, which need CAP_DAC_READ_SEARCH); the writable shares' device
//! gets half the read-only one's budget, and [`Fs::new`] and
//! [`Fs::writable`] raise the soft RLIMIT_NOFILE to the hard limit.
//!
//! `device` is what the transport sees and builds the filesystem,
//! `request` serves one FUSE request, `event_handler` what the worker does
//! on a kick, `pool` the threads serving a read-only device's requests
//! beside its worker; `readonly` wraps the Vfs, and `watched` a recorded
//! share's filesystem, with `sightings` (what the guest saw of the
//! workspace) as its watch; `secrets` are the host files the bounded
//! filesystem never lets the guest read.

mod boot;
pub mod bounded;
mod budget;
mod device;
mod event_handler;
mod linger;
mod pool;
pub mod readonly;
mod request;
mod secrets;
mod sightings;
mod tally;
mod watched;
mod writable;

#[cfg(test)]
mod attack_tests;
#[cfg(test)]
mod concurrency_attack_tests;
#[cfg(test)]
mod eof_attack_tests;
#[cfg(test)]
mod linger_attack_tests;
#[cfg(test)]
mod list_attack_tests;
#[cfg(test)]
mod pool_attack_tests;
#[cfg(test)]
mod queue_attack_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_attack_tests;
#[cfg(test)]
mod write_attack_tests;

use std::time::Duration;

use super::{DeviceError, Env, Instance, Registration};
use crate::jail::seccomp::WORKER;
use crate::jail::{DeviceThread, Openat};
use crate::protocol::shares::{BOOT_TAG, FS_TAG, FS_TAG_RW};

use device::helpers_beside;
pub use device::{Fs, FsError, Share};
pub use secrets::Secrets;

/// Device type id (virtio spec 5).
pub const TYPE_FS: u32 = 26;
/// Size of each virtqueue (hiprio and request).
const QUEUE_SIZE: u16 = 1024;
const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE, QUEUE_SIZE];
/// Length of the tag field of `struct virtio_fs_config`.
pub const TAG_LEN: usize = 36;
/// `struct virtio_fs_config`: the tag, then `num_request_queues`.
const CONFIG_LEN: usize = TAG_LEN + 4;
/// How long the guest may cache names and attributes (and the absence of a
/// name). The guest never changes the shares; the host changing them under a
/// running guest shows up within this delay.
const CACHE_TIMEOUT: Duration = Duration::from_secs(300);

/// Looking up, reading and listing files beneath the shares (Landlock
/// decides which files; this decides which operations). `openat` is not
/// here: the read-only worker gets it only without modifying flags, the
/// writable one gets it plain; `openat2` likewise comes with the worker's
/// `Openat` (see `jail::seccomp`).
///
/// Landlock governs opens, not what a path tells without one, so nothing
/// here takes a path the servers do not need: no extended attributes (the
/// servers serve none; by path they read any host file's, where browsers
/// keep the URL of a download), no statfs or access by path (the servers
/// use fstatfs and their own check on a stat). The stat and readlinkat
/// calls the servers make relative to a descriptor they hold (one name,
/// or the descriptor itself) still take a path, which seccomp cannot read:
/// code in a worker can stat any host file and read any symlink's target.
const FS_READ: &[i64] = &[
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_lseek,
    libc::SYS_fstatfs,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fadvise64,
];

/// Changing files beneath the writable shares, as the host user (the
/// server never takes on another uid, and serves no extended attributes).
/// Modes, owners and times only through a descriptor (`fchmod`, `fchown`,
/// `utimensat` on a null path, see `FS_WRITE_ON_DESCRIPTOR`): Landlock does
/// not govern those changes, and a path could name a read-only share's
/// file; this worker's own Landlock layer keeps it from opening one (see
/// `jail::thread`). A symlink, which cannot be opened, keeps its times.
const FS_WRITE: &[i64] = &[
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_fchmod,
    libc::SYS_fchown,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
];

/// `futimens`, which is `utimensat` with a null path.
const FS_WRITE_ON_DESCRIPTOR: &[i64] = &[libc::SYS_utimensat];

/// The worker of the read-only shares.
pub const READ_ONLY_THREAD: DeviceThread =
    DeviceThread { name: "virtio-fs", syscalls: &[WORKER, FS_READ], openat: Openat::ReadOnly, on_descriptor: &[] };

/// The worker of the shares a policy mounts writable.
pub const WRITABLE_THREAD: DeviceThread = DeviceThread {
    name: "virtio-fs (rw)",
    syscalls: &[WORKER, FS_READ, FS_WRITE],
    openat: Openat::Any,
    on_descriptor: FS_WRITE_ON_DESCRIPTOR,
};

pub const REGISTRATION: Registration = Registration { threads: &[&READ_ONLY_THREAD, &WRITABLE_THREAD], create };

/// The device of the guest's first root (see `boot`), one for the
/// read-only shares and one for the writable ones, each only if it has
/// shares.
fn create(env: &Env) -> Result<Vec<Instance>, DeviceError> {
    let mut devices =
        vec![Instance { name: READ_ONLY_THREAD.name, device: Box::new(Fs::boot(BOOT_TAG, &env.config.init)?) }];
    let shares = |writable: bool| -> Vec<Share> {
        env.config
            .shares
            .iter()
            .filter(|s| s.writable == writable)
            .map(|s| Share {
                guest_path: s.guest_path.clone(),
                host_path: s.host_path.clone(),
                record: s.record.clone(),
                limit: s.limit,
            })
            .collect()
    };
    let secrets = Secrets::at(&env.config.secrets);
    let read_only = shares(false);
    let vcpus = env.config.vcpus;
    let helpers = helpers_beside(vcpus);
    if !read_only.is_empty() {
        let linger = linger::longest_beside(vcpus, helpers);
        devices.push(Instance {
            name: READ_ONLY_THREAD.name,
            device: Box::new(Fs::new(FS_TAG, &read_only, &secrets)?.with_helpers(helpers).with_linger(linger)),
        });
    }
    let writable = shares(true);
    if !writable.is_empty() {
        // The read-only worker may be watching too: it needs a CPU of its own.
        let others = if read_only.is_empty() { 0 } else { helpers + 1 };
        let linger = linger::longest_beside(vcpus, others);
        devices.push(Instance {
            name: WRITABLE_THREAD.name,
            device: Box::new(Fs::writable(FS_TAG_RW, &writable, &secrets)?.with_linger(linger)),
        });
    }
    Ok(devices)
}
