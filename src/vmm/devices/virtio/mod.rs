//! The contract between the virtio-mmio transport and a virtio device, and
//! the pieces every device shares: its queues with their kick eventfds, its
//! interrupt line, its worker thread and its registration.
//!
//! A device is configured by the transport until the driver sets DRIVER_OK;
//! then `activate` hands it guest memory, its queues and its interrupt, and
//! the device processes queues on its own worker thread from then on.
//!
//! Every device has the same shape, one folder per device:
//! - `<dev>/mod.rs`: the constants (device type id, queue count, sizes and
//!   indices, feature bits), the worker's seccomp allowlist (`DeviceThread`)
//!   and the device's `Registration`;
//! - `<dev>/device.rs`: the device the transport sees (config space,
//!   features, activation) and its queue handling;
//! - `<dev>/event_handler.rs`: what the worker does with its events, run by
//!   the one worker loop in `worker`;
//! - further files for what only that device has (vsock's muxer, net's stack);
//! - a device with state of its own that a template must keep implements
//!   `persist::Persist` in `device.rs` and forwards `save_state` and
//!   `restore_state` to it; the others keep the defaults (nothing).
//!
//! Adding a device is a new folder and one line in `DEVICES`: the VMM makes
//! its instances, gives each an MMIO slot and its kernel command-line entry,
//! and the jail builds a seccomp filter for each of its threads.

pub mod blk;
pub mod fs;
pub mod net;
pub mod persist;
pub mod rng;
pub mod vsock;
pub mod worker;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::jail::DeviceThread;
use crate::protocol::vm_config::VmConfig;
use crate::vmm::devices::broker::Dialer;
use persist::{DeviceState, PersistError};

/// Every device, in MMIO slot order (the guest numbers its disks and
/// devices in this order). Adding a device adds one line here.
pub const DEVICES: &[&Registration] =
    &[&vsock::REGISTRATION, &rng::REGISTRATION, &net::REGISTRATION, &fs::REGISTRATION, &blk::REGISTRATION];

/// How one device folder plugs into the VMM and its jail.
pub struct Registration {
    /// The worker threads its instances start: name and seccomp allowlist.
    pub threads: &'static [&'static DeviceThread],
    /// The instances the VM's configuration asks for, none or several.
    pub create: fn(&Env) -> Result<Vec<Instance>, DeviceError>,
}

/// What a device gets to make its instances from.
pub struct Env<'a> {
    pub config: &'a VmConfig,
    /// How host ports are reached (see `devices::broker`); one connection
    /// to the supervisor's broker shared by every device that dials.
    pub dialer: &'a Dialer,
}

/// One device the guest will see.
pub struct Instance {
    /// Its name in logs and errors.
    pub name: &'static str,
    pub device: Box<dyn VirtioDevice>,
}

impl Instance {
    /// The kernel command-line entry that tells the guest where the device
    /// sits: its 4 KiB register window at `base`, and its interrupt line.
    pub fn cmdline(&self, base: u64, irq: u32) -> String {
        format!("virtio_mmio.device=4K@{base:#x}:{irq}")
    }
}

/// The worker threads of every registered device, for the jail.
pub fn device_threads() -> Vec<&'static DeviceThread> {
    DEVICES.iter().flat_map(|r| r.threads.iter().copied()).collect()
}

/// Why a device could not be made.
#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("cannot set up the {device} device")]
    Io {
        device: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Fs(#[from] fs::FsError),
    #[error(transparent)]
    Block(#[from] blk::BlockError),
}

impl DeviceError {
    /// Labels an I/O error with the device it came from.
    pub fn io(device: &'static str) -> impl Fn(io::Error) -> DeviceError {
        move |source| DeviceError::Io { device, source }
    }
}

/// VIRTIO_F_VERSION_1: we only speak modern virtio.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// Interrupt status bits (virtio-mmio InterruptStatus).
pub const INT_USED_RING: u32 = 0x1;

/// The interrupt line of one device: the status bits the driver reads and
/// acknowledges through the transport, and the irqfd that raises its GSI.
#[derive(Clone)]
pub struct Interrupt {
    status: Arc<AtomicU32>,
    irqfd: Arc<EventFd>,
    /// When the line was last raised, in milliseconds since `epoch`.
    raised_ms: Arc<AtomicU64>,
    epoch: Instant,
}

/// An interrupt the driver has not acknowledged for this long is raised
/// again. Edge-triggered lines can lose a pulse (seen under nested
/// virtualization); the status bit is still set, so the repeat is never
/// spurious for the driver.
pub const REASSERT_AFTER: Duration = Duration::from_millis(200);

impl Interrupt {
    pub fn new(irqfd: EventFd) -> Interrupt {
        Interrupt {
            status: Arc::new(AtomicU32::new(0)),
            irqfd: Arc::new(irqfd),
            raised_ms: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
        }
    }

    /// Tells the driver that a used ring has new entries.
    pub fn signal_used_queue(&self) {
        self.raise(INT_USED_RING);
    }

    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        self.pulse();
    }

    fn pulse(&self) {
        self.raised_ms.store(self.now_ms(), Ordering::SeqCst);
        if let Err(e) = self.irqfd.write(1) {
            tracing::warn!("cannot raise virtio interrupt: {e}");
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Raises the line again if the driver has left it unacknowledged for
    /// REASSERT_AFTER; returns whether it did.
    pub fn reassert_if_stale(&self) -> bool {
        if self.status.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let since = self.now_ms().saturating_sub(self.raised_ms.load(Ordering::SeqCst));
        if u128::from(since) < REASSERT_AFTER.as_millis() {
            return false;
        }
        self.pulse();
        true
    }

    /// InterruptStatus as the driver reads it.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// InterruptACK: the driver clears the bits it handled.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }
}

/// One virtqueue as handed to an activated device: the queue state and the
/// eventfd the guest's QueueNotify writes signal (through a KVM ioeventfd).
pub struct DeviceQueue {
    pub queue: Queue,
    pub kick: EventFd,
}

/// What a device gets when the driver has finished setting it up.
pub struct Activation {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<DeviceQueue>,
    pub interrupt: Interrupt,
    /// Features the driver accepted (a subset of what the device offered).
    pub acked_features: u64,
}

#[derive(Debug, Error)]
pub enum ActivateError {
    #[error("the driver set up {got} queues, the device needs {want}")]
    QueueCount { got: usize, want: usize },
    #[error("cannot start the device worker thread")]
    Thread(#[source] std::io::Error),
    #[error("device backend failed to start: {0}")]
    Backend(String),
}

/// A virtio device behind the MMIO transport.
pub trait VirtioDevice: Send {
    /// The virtio device type id.
    fn device_type(&self) -> u32;
    /// The maximum size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits offered to the driver, including VIRTIO_F_VERSION_1.
    fn features(&self) -> u64;
    /// Reads the device-specific configuration space at `offset`. Bytes past
    /// its end read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the configuration space. Most devices have nothing writable.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts the device: from here on it owns its queues.
    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError>;
    /// The device's own state for a template (see `persist`), taken while
    /// its worker is parked. The transport saves the registers and queues.
    fn save_state(&self) -> Result<DeviceState, PersistError> {
        Ok(DeviceState::NONE)
    }
    /// Takes the device's own state back from a template, before it is
    /// activated again.
    fn restore_state(&mut self, state: &DeviceState) -> Result<(), PersistError> {
        state.expect_none()
    }
}

/// Copies `config[offset..]` into `data`, zero-filling what lies past the end.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = config.get(start..) {
        let n = src.len().min(data.len());
        data[..n].copy_from_slice(&src[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot order is what the guest sees: the scratch disk must stay
    /// /dev/vda, and the transport numbers devices in this order.
    #[test]
    fn devices_keep_their_slot_order() {
        let names: Vec<&str> = device_threads().iter().map(|t| t.name).collect();
        assert_eq!(names, ["virtio-vsock", "virtio-rng", "virtio-net", "virtio-fs", "virtio-fs (rw)", "virtio-blk"]);
    }
}
