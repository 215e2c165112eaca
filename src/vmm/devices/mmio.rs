//! The virtio-mmio transport (virtio spec 4.2, version 2): the register
//! layout the driver programs, and nothing device-specific. It negotiates
//! features, collects queue addresses, and activates the device when the
//! driver sets DRIVER_OK.

use std::io;

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::bus::BusDevice;
use super::virtio::persist::{DeviceState, PersistError};
use super::virtio::{Activation, DeviceQueue, Interrupt, VirtioDevice};

/// Size of one device's MMIO window; the kernel command line declares it.
pub const MMIO_LEN: u64 = 0x1000;
/// Offset of QueueNotify, where the VMM registers the queues' ioeventfds.
pub const NOTIFY_OFFSET: u64 = 0x50;

const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
const VENDOR: u32 = 0x4b43_5453; // "STCK"
const CONFIG_OFFSET: u64 = 0x100;

// Device status bits.
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FEATURES_OK: u32 = 8;
const STATUS_NEEDS_RESET: u32 = 64;
const STATUS_FAILED: u32 = 128;

pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Interrupt,
    queues: Vec<Queue>,
    kicks: Vec<EventFd>,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
    activated: bool,
    config_generation: u32,
    /// The queues as the driver set them up, kept at activation for saving.
    activated_with: Vec<QueueState>,
}

/// `QueueState`'s fields, for serde (virtio_queue has no serde of its own).
#[derive(Serialize, Deserialize)]
#[serde(remote = "QueueState")]
struct QueueStateDef {
    max_size: u16,
    next_avail: u16,
    next_used: u16,
    event_idx_enabled: bool,
    size: u16,
    ready: bool,
    desc_table: u64,
    avail_ring: u64,
    used_ring: u64,
}

/// One queue of a transport in a template.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavedQueue(#[serde(with = "QueueStateDef")] QueueState);

/// A transport in a template: the registers the driver programmed and, for
/// an active device, its queues.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TransportState {
    device_type: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
    activated: bool,
    config_generation: u32,
    queues: Vec<SavedQueue>,
}

impl MmioTransport {
    /// Wraps `device`; `irqfd` raises its interrupt line.
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryMmap, irqfd: EventFd) -> io::Result<Self> {
        let mut queues = Vec::new();
        let mut kicks = Vec::new();
        for &max in device.queue_max_sizes() {
            queues.push(Queue::new(max).map_err(|e| io::Error::other(format!("queue size {max}: {e:?}")))?);
            kicks.push(EventFd::new(EFD_NONBLOCK)?);
        }
        Ok(MmioTransport {
            device,
            mem,
            interrupt: Interrupt::new(irqfd),
            queues,
            kicks,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            status: 0,
            activated: false,
            config_generation: 0,
            activated_with: Vec::new(),
        })
    }

    /// This transport's state, read while its device's worker is parked.
    /// An active device has used every request it took (its worker handles
    /// each kick to the end), so the used index in guest memory is where
    /// both its avail and used positions stand; buffers it had taken and
    /// not used yet are simply offered to the next device again.
    pub fn save(&self) -> TransportState {
        let queues = if self.activated {
            self.activated_with
                .iter()
                .map(|q| {
                    let used = self.mem.read_obj::<u16>(GuestAddress(q.used_ring + 2)).unwrap_or(q.next_used);
                    SavedQueue(QueueState { next_avail: used, next_used: used, ..*q })
                })
                .collect()
        } else {
            self.queues.iter().map(|q| SavedQueue(q.state())).collect()
        };
        TransportState {
            device_type: self.device.device_type(),
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            status: self.status,
            activated: self.activated,
            config_generation: self.config_generation,
            queues,
        }
    }

    /// Takes `state` from a template: the device must be of the same type
    /// with as many queues. An active device is started by `resume` once
    /// the VM is otherwise ready.
    pub fn restore(&mut self, state: &TransportState) -> io::Result<()> {
        if state.device_type != self.device.device_type() || state.queues.len() != self.queues.len() {
            return Err(io::Error::other(format!(
                "the template has a device of type {} with {} queues here, this VM one of type {} with {}",
                state.device_type,
                state.queues.len(),
                self.device.device_type(),
                self.queues.len()
            )));
        }
        let mut queues = Vec::new();
        for saved in &state.queues {
            queues.push(Queue::try_from(saved.0).map_err(|e| io::Error::other(format!("{e:?}")))?);
        }
        self.queues = queues;
        self.device_features_sel = state.device_features_sel;
        self.driver_features_sel = state.driver_features_sel;
        self.driver_features = state.driver_features;
        self.queue_sel = state.queue_sel;
        self.status = state.status;
        self.config_generation = state.config_generation;
        self.activated = false;
        Ok(())
    }

    /// The device's own state (`VirtioDevice::save_state`), read while its
    /// worker is parked.
    pub fn save_device_state(&self) -> Result<DeviceState, PersistError> {
        self.device.save_state()
    }

    /// Gives the device its own state from a template, before `resume`.
    pub fn restore_device_state(&mut self, state: &DeviceState) -> Result<(), PersistError> {
        self.device.restore_state(state)
    }

    /// Starts a restored device that was active in the template, then
    /// kicks each queue and raises its interrupt once: whatever the guest
    /// posted or was told just before the save is looked at again. The
    /// vCPUs may already run: a device the guest reset or started again
    /// by itself in the meantime is left as the guest made it.
    pub fn resume(&mut self, was_active: bool) {
        if !was_active || self.activated {
            return;
        }
        self.activate();
        if !self.activated {
            return;
        }
        for kick in &self.kicks {
            let _ = kick.write(1);
        }
        self.interrupt.signal_used_queue();
    }

    /// The device's interrupt line, for the VMM's lost-interrupt watchdog.
    pub fn interrupt(&self) -> Interrupt {
        self.interrupt.clone()
    }

    /// The eventfd each queue's notification signals, in queue order; the VMM
    /// registers them as KVM ioeventfds on QueueNotify.
    pub fn kick_fds(&self) -> &[EventFd] {
        &self.kicks
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        if self.activated {
            return None;
        }
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn read_u32(&self, offset: u64) -> u32 {
        match offset {
            0x000 => MAGIC,
            0x004 => VERSION,
            0x008 => self.device.device_type(),
            0x00c => VENDOR,
            0x010 => {
                let features = self.device.features();
                match self.device_features_sel {
                    0 => u32::try_from(features & u64::from(u32::MAX)).expect("masked to 32 bits"),
                    1 => (features >> 32) as u32,
                    _ => 0,
                }
            }
            0x034 => self.queues.get(self.queue_sel as usize).map_or(0, |q| u32::from(q.max_size())),
            0x044 => self.queues.get(self.queue_sel as usize).map_or(0, |q| u32::from(q.ready())),
            0x060 => self.interrupt.status(),
            0x070 => self.status,
            // No shared memory regions: length reads as "none" (all ones).
            0x0b0 | 0x0b4 => u32::MAX,
            0x0fc => self.config_generation,
            _ => {
                tracing::debug!("virtio-mmio: read of unknown register {offset:#x}");
                0
            }
        }
    }

    fn write_u32(&mut self, offset: u64, value: u32) {
        match offset {
            0x014 => self.device_features_sel = value,
            0x020 => {
                if self.status & STATUS_FEATURES_OK == 0 {
                    match self.driver_features_sel {
                        0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(value),
                        1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32),
                        _ => {}
                    }
                }
            }
            0x024 => self.driver_features_sel = value,
            0x030 => self.queue_sel = value,
            0x038 => {
                // A size past u16 is the driver's mistake: ignored, not truncated.
                if let (Ok(size), Some(q)) = (u16::try_from(value), self.selected_queue()) {
                    q.set_size(size);
                }
            }
            0x044 => {
                if let Some(q) = self.selected_queue() {
                    q.set_ready(value == 1);
                }
            }
            NOTIFY_OFFSET => {
                // Normally KVM's ioeventfd catches this write; this path
                // serves VMMs without ioeventfd support.
                if let Some(kick) = self.kicks.get(value as usize) {
                    let _ = kick.write(1);
                }
            }
            0x064 => self.interrupt.ack(value),
            0x070 => self.set_status(value),
            0x080 => self.with_queue(|q| q.set_desc_table_address(Some(value), None)),
            0x084 => self.with_queue(|q| q.set_desc_table_address(None, Some(value))),
            0x090 => self.with_queue(|q| q.set_avail_ring_address(Some(value), None)),
            0x094 => self.with_queue(|q| q.set_avail_ring_address(None, Some(value))),
            0x0a0 => self.with_queue(|q| q.set_used_ring_address(Some(value), None)),
            0x0a4 => self.with_queue(|q| q.set_used_ring_address(None, Some(value))),
            _ => tracing::debug!("virtio-mmio: write of unknown register {offset:#x}"),
        }
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.selected_queue() {
            f(q);
        }
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            if self.activated {
                // A running device cannot be torn down and restarted here;
                // the guest only does this on its way to a reboot.
                tracing::debug!("virtio-mmio: driver reset an active {} device", self.device.device_type());
                self.status |= STATUS_NEEDS_RESET;
            } else {
                self.status = 0;
                self.driver_features = 0;
                for q in &mut self.queues {
                    q.reset();
                }
            }
            return;
        }
        let newly = value & !self.status;
        if newly & STATUS_FEATURES_OK != 0 && self.driver_features & !self.device.features() != 0 {
            // The driver accepted a feature we never offered: refuse FEATURES_OK.
            self.status = value & !STATUS_FEATURES_OK;
            return;
        }
        self.status = value;
        if newly & STATUS_DRIVER_OK != 0 && !self.activated {
            self.activate();
        }
    }

    fn activate(&mut self) {
        self.activated_with.clear();
        let ready = self.queues.iter().all(|q| q.ready() && q.is_valid(&self.mem));
        if !ready {
            tracing::warn!("virtio-mmio: DRIVER_OK with queues not ready or invalid");
            self.status |= STATUS_FAILED;
            return;
        }
        let mut queues = Vec::new();
        for (q, kick) in self.queues.iter_mut().zip(&self.kicks) {
            let kick = match kick.try_clone() {
                Ok(k) => k,
                Err(e) => {
                    tracing::error!("virtio-mmio: cannot clone a queue eventfd: {e}");
                    self.status |= STATUS_NEEDS_RESET;
                    return;
                }
            };
            // The device owns the queue from now on; the transport keeps a
            // stand-in that reports the same size and readiness.
            let mut stand_in = match Queue::new(q.max_size()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("virtio-mmio: {e:?}");
                    self.status |= STATUS_NEEDS_RESET;
                    return;
                }
            };
            stand_in.set_ready(true);
            self.activated_with.push(q.state());
            queues.push(DeviceQueue { queue: std::mem::replace(q, stand_in), kick });
        }
        let activation = Activation {
            mem: self.mem.clone(),
            queues,
            interrupt: self.interrupt.clone(),
            acked_features: self.driver_features,
        };
        tracing::debug!(
            "virtio-mmio: activating device type {} with features {:#x}",
            self.device.device_type(),
            activation.acked_features
        );
        match self.device.activate(activation) {
            Ok(()) => self.activated = true,
            Err(e) => {
                tracing::error!("virtio-mmio: device {} failed to activate: {e}", self.device.device_type());
                self.status |= STATUS_NEEDS_RESET;
            }
        }
    }
}

impl TransportState {
    /// Whether the device was running when the template was saved.
    pub fn was_active(&self) -> bool {
        self.activated
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_OFFSET {
            self.device.read_config(offset - CONFIG_OFFSET, data);
            return;
        }
        if data.len() != 4 {
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_u32(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_OFFSET {
            self.device.write_config(offset - CONFIG_OFFSET, data);
            self.config_generation = self.config_generation.wrapping_add(1);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            tracing::debug!("virtio-mmio: {}-byte register write ignored", data.len());
            return;
        };
        self.write_u32(offset, u32::from_le_bytes(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::devices::virtio::{ActivateError, VIRTIO_F_VERSION_1};
    use std::sync::{Arc, Mutex};
    use vm_memory::GuestAddress;

    const STATUS_ACKNOWLEDGE: u32 = 1;
    const STATUS_DRIVER: u32 = 2;

    struct Fake {
        activated: Arc<Mutex<Option<u64>>>,
    }

    impl VirtioDevice for Fake {
        fn device_type(&self) -> u32 {
            4
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16]
        }
        fn features(&self) -> u64 {
            VIRTIO_F_VERSION_1
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            super::super::virtio::read_config_bytes(&[1, 2, 3, 4], offset, data);
        }
        fn activate(&mut self, a: Activation) -> Result<(), ActivateError> {
            *self.activated.lock().unwrap() = Some(a.acked_features);
            Ok(())
        }
    }

    fn transport() -> (MmioTransport, Arc<Mutex<Option<u64>>>) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let activated = Arc::new(Mutex::new(None));
        let dev = Fake { activated: activated.clone() };
        (MmioTransport::new(Box::new(dev), mem, EventFd::new(EFD_NONBLOCK).unwrap()).unwrap(), activated)
    }

    fn rd(t: &mut MmioTransport, off: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn wr(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    #[test]
    fn identifies_as_virtio_mmio_v2() {
        let (mut t, _) = transport();
        assert_eq!(rd(&mut t, 0), MAGIC);
        assert_eq!(rd(&mut t, 4), 2);
        assert_eq!(rd(&mut t, 8), 4);
        assert_eq!(rd(&mut t, 0x34), 16);
        let mut cfg = [0u8; 2];
        t.read(0x102, &mut cfg);
        assert_eq!(cfg, [3, 4]);
    }

    #[test]
    fn activates_after_a_full_handshake() {
        let (mut t, activated) = transport();
        wr(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        wr(&mut t, 0x14, 1);
        assert_eq!(rd(&mut t, 0x10), 1, "VERSION_1 is bit 32");
        wr(&mut t, 0x24, 1);
        wr(&mut t, 0x20, 1);
        wr(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
        assert_ne!(rd(&mut t, 0x70) & STATUS_FEATURES_OK, 0);
        wr(&mut t, 0x30, 0);
        wr(&mut t, 0x38, 16);
        wr(&mut t, 0x80, 0x1000);
        wr(&mut t, 0x90, 0x2000);
        wr(&mut t, 0xa0, 0x3000);
        wr(&mut t, 0x44, 1);
        wr(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
        assert_eq!(*activated.lock().unwrap(), Some(VIRTIO_F_VERSION_1));
    }

    #[test]
    fn refuses_features_it_never_offered() {
        let (mut t, _) = transport();
        wr(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        wr(&mut t, 0x24, 0);
        wr(&mut t, 0x20, 1 << 5);
        wr(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
        assert_eq!(rd(&mut t, 0x70) & STATUS_FEATURES_OK, 0);
    }

    #[test]
    fn does_not_activate_with_unready_queues() {
        let (mut t, activated) = transport();
        wr(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
        assert!(activated.lock().unwrap().is_none());
        assert_ne!(rd(&mut t, 0x70) & STATUS_FAILED, 0);
    }

    /// The driver's side of bringing up the fake device with one queue.
    fn handshake(t: &mut MmioTransport) {
        wr(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        wr(t, 0x24, 1);
        wr(t, 0x20, 1);
        wr(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
        wr(t, 0x30, 0);
        wr(t, 0x38, 16);
        wr(t, 0x80, 0x1000);
        wr(t, 0x90, 0x2000);
        wr(t, 0xa0, 0x3000);
        wr(t, 0x44, 1);
        wr(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
    }

    #[test]
    fn a_saved_active_transport_resumes_at_the_used_index() {
        let (mut t, activated) = transport();
        handshake(&mut t);
        // The device used five requests: the used index says so.
        t.mem.write_obj(5u16, GuestAddress(0x3002)).unwrap();
        let state = t.save();
        assert!(state.was_active());
        assert_eq!((state.queues[0].0.next_avail, state.queues[0].0.next_used), (5, 5));

        let (mut fresh, restarted) = transport();
        fresh.restore(&state).unwrap();
        assert!(restarted.lock().unwrap().is_none(), "restore alone starts nothing");
        fresh.resume(state.was_active());
        assert_eq!(*restarted.lock().unwrap(), Some(VIRTIO_F_VERSION_1));
        assert_eq!(rd(&mut fresh, 0x70) & STATUS_DRIVER_OK, STATUS_DRIVER_OK);
        assert_eq!(rd(&mut fresh, 0x60), 1, "the driver is told to look at its used rings");
        drop(activated);
    }

    #[test]
    fn a_device_the_guest_restarted_before_its_resume_is_not_started_twice() {
        let (mut t, _) = transport();
        handshake(&mut t);
        let state = t.save();

        let (mut fresh, activated) = transport();
        fresh.restore(&state).unwrap();
        // The vCPUs run before the devices resume: this guest resets the
        // device and brings it up again first.
        wr(&mut fresh, 0x70, 0);
        handshake(&mut fresh);
        assert_eq!(activated.lock().unwrap().take(), Some(VIRTIO_F_VERSION_1));
        fresh.resume(state.was_active());
        assert!(activated.lock().unwrap().is_none(), "resume started the running device again");
    }

    #[test]
    fn a_template_of_another_device_is_refused() {
        let (t, _) = transport();
        let mut state = t.save();
        state.device_type = 2;
        let (mut other, _) = transport();
        assert!(other.restore(&state).is_err());
    }

    #[test]
    fn interrupt_ack_clears_status_bits() {
        let (mut t, _) = transport();
        t.interrupt.signal_used_queue();
        assert_eq!(rd(&mut t, 0x60), 1);
        wr(&mut t, 0x64, 1);
        assert_eq!(rd(&mut t, 0x60), 0);
    }
}
