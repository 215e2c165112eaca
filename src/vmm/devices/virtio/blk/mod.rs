//! virtio-blk (virtio spec 5.2): the session's scratch disk, where the guest
//! keeps the upper layer of the workspace overlay (a sparse file in the
//! session directory that lives only as long as the session's VM), and in
//! image mode the read-only root image.
//!
//! `device` is what the transport sees, `request` one request against the
//! disk file, `event_handler` what the worker does on a kick.

mod device;
mod event_handler;
mod request;

use super::{DeviceError, Env, Instance, Registration};
use crate::jail::seccomp::WORKER;
use crate::jail::{DeviceThread, Openat};

pub use device::{Block, BlockError};

/// Device type id (virtio spec 5).
pub const TYPE_BLOCK: u32 = 2;
/// One request queue.
const REQUEST_QUEUE: usize = 0;
const NUM_QUEUES: usize = 1;
const QUEUE_SIZE: u16 = 256;
/// Data segments per request; with the header and the status byte a chain
/// then still fits the queue without indirect descriptors.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;

/// Feature bits (virtio spec 5.2.3).
const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << 2;
const VIRTIO_BLK_F_RO: u64 = 1 << 5;
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;

/// Reading and writing the one disk image, opened before the jail closed.
const DISK_IO: &[i64] = &[
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
];

/// The worker of every disk, scratch or image.
pub const THREAD: DeviceThread =
    DeviceThread { name: "virtio-blk", syscalls: &[WORKER, DISK_IO], openat: Openat::Never, on_descriptor: &[] };

pub const REGISTRATION: Registration = Registration { threads: &[&THREAD], create };

/// The scratch disk, then the image: the guest sees them as
/// `vm_config::SCRATCH_DISK` and `vm_config::IMAGE_DISK`.
fn create(env: &Env) -> Result<Vec<Instance>, DeviceError> {
    let mut disks = Vec::new();
    if let Some(disk) = &env.config.disk {
        disks.push(Instance { name: THREAD.name, device: Box::new(Block::open(disk, false)?) });
    }
    if let Some(image) = &env.config.image {
        disks.push(Instance { name: "virtio-blk (image)", device: Box::new(Block::open(image, true)?) });
    }
    Ok(disks)
}
