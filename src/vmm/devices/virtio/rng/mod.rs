//! virtio-rng (virtio spec 5.4): the guest's entropy source, fed from the
//! host's /dev/urandom.
//!
//! `device` is what the transport sees, `request` how a request is filled,
//! `event_handler` what the worker does on a kick.

mod device;
mod event_handler;
mod request;

use super::{DeviceError, Env, Instance, Registration, worker};
use crate::jail::{DeviceThread, Openat};

pub use device::Rng;

/// Device type id (virtio spec 5).
pub const TYPE_RNG: u32 = 4;
/// One request queue.
const REQUEST_QUEUE: usize = 0;
const NUM_QUEUES: usize = 1;
const QUEUE_SIZE: u16 = 64;
/// One request may ask for any amount; the host fills at most this much, so a
/// hostile driver cannot make us allocate or read without bound.
const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;

/// The worker reads /dev/urandom, opened before the jail closed.
pub const THREAD: DeviceThread = DeviceThread {
    name: "virtio-rng",
    syscalls: &[crate::jail::seccomp::WORKER],
    openat: Openat::Never,
    on_descriptor: &[],
};

pub const REGISTRATION: Registration = Registration { threads: &[&THREAD], create };

fn create(_env: &Env) -> Result<Vec<Instance>, DeviceError> {
    let rng = Rng::new().map_err(DeviceError::io(THREAD.name))?;
    Ok(vec![Instance { name: THREAD.name, device: Box::new(rng) }])
}
