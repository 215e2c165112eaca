//! The virtual machine monitor: KVM, guest memory, vCPUs and devices.
//!
//! `run` is the boot sequence: create the VM and its memory, the interrupt
//! controllers, the legacy devices and the virtio devices on MMIO; load the
//! kernel for PVH boot, told to mount a virtio-fs root that holds our own
//! binary as /init; write the MP table; start the vCPUs; wait for the guest
//! to reset. The process exits right after, which ends every vCPU and
//! device thread with it.

// Casts between guest-sized and host-sized integers are where a VMM
// truncates silently: here each is a checked conversion (as in Firecracker).
#![warn(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_possible_wrap)]

pub mod boot;
pub mod cpuid;
pub mod devices;
pub mod layout;
pub mod memory;
pub mod mptable;
pub mod probe;
pub mod vcpu;

use std::fs::File;
use std::io::LineWriter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kvm_bindings::{KVM_PIT_SPEAKER_DUMMY, kvm_pit_config};
use kvm_ioctls::{IoEventAddress, Kvm};
use thiserror::Error;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::jail::{self, FsRules, ThreadKind};
use crate::logcap::{Capped, KERNEL_LOG_CAP, Style};
use crate::protocol::shares::{BOOT_INIT, BOOT_TAG};
use crate::protocol::vm_config::VmConfig;
use devices::bus::Bus;
use devices::legacy::{I8042, I8042_BASE, I8042_LEN};
use devices::mmio::{MMIO_LEN, MmioTransport, NOTIFY_OFFSET};
use devices::serial::{COM1_BASE, COM1_IRQ, COM1_LEN, SerialPort};
use devices::virtio::{DEVICES, Env, Instance, Interrupt, REASSERT_AFTER};
use vcpu::{Vcpu, VcpuStop};

#[derive(Debug, Error)]
pub enum VmmError {
    #[error("cannot open /dev/kvm")]
    Kvm(#[source] kvm_ioctls::Error),
    #[error("KVM setup failed: {step}")]
    Setup {
        step: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    #[error(transparent)]
    Mptable(#[from] mptable::MptableError),
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    #[error("cannot create the kernel log {path}")]
    KernelLog {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the {device} device")]
    Device {
        device: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Virtio(#[from] devices::virtio::DeviceError),
    #[error("too many devices for the interrupt lines")]
    TooManyDevices,
    #[error("cannot close the VMM's jail (run `stockade doctor`; --no-jail runs without it)")]
    Jail(#[source] jail::JailError),
    #[error("the VM stopped: {0}")]
    Stopped(String),
}

fn setup(step: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Setup { step, source }
}

/// Boots the VM described by `config` and returns when the guest resets.
pub fn run(config: &VmConfig) -> Result<(), VmmError> {
    // The VM must not outlive the supervisor that owns its session.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let started = std::time::Instant::now();
    let kvm = Kvm::new().map_err(VmmError::Kvm)?;
    let vm = kvm.create_vm().map_err(setup("create VM"))?;
    let ram = layout::ram_ranges(config.memory_bytes);
    let mem = memory::create(&ram)?;
    memory::register(&vm, &mem)?;
    vm.set_tss_address(layout::KVM_TSS_ADDR).map_err(setup("set TSS address"))?;
    vm.create_irq_chip().map_err(setup("create interrupt controllers"))?;
    let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
    vm.create_pit2(pit).map_err(setup("create PIT"))?;

    let exit = Arc::new(EventFd::new(0).map_err(|source| VmmError::Device { device: "exit", source })?);
    let mut pio = Bus::default();
    let mut mmio = Bus::default();

    let log = File::create(&config.kernel_log)
        .map_err(|source| VmmError::KernelLog { path: config.kernel_log.display().to_string(), source })?;
    let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(|source| VmmError::Device { device: "serial", source })?;
    vm.register_irqfd(&serial_irq, COM1_IRQ).map_err(setup("register serial irqfd"))?;
    // A guest printing forever must not fill the host's disk.
    let log = Capped::new(log, "kernel.log", Style::Text, KERNEL_LOG_CAP);
    let serial = Arc::new(Mutex::new(SerialPort::new(serial_irq, LineWriter::new(log))));
    pio.insert(COM1_BASE, COM1_LEN, serial.clone());
    let reset = exit.try_clone().map_err(|source| VmmError::Device { device: "i8042", source })?;
    let reset_requested = Arc::new(AtomicBool::new(false));
    pio.insert(I8042_BASE, I8042_LEN, Arc::new(Mutex::new(I8042::new(reset, reset_requested.clone()))));

    let mut cmdline = vec![
        "console=ttyS0".to_string(),
        "reboot=k".into(),
        "panic=-1".into(),
        "8250.nr_uarts=1".into(),
        "random.trust_cpu=on".into(),
        // No initramfs: the kernel mounts the boot tree itself and maps
        // the init's pages from it as they are needed.
        format!("root={BOOT_TAG}"),
        "rootfstype=virtiofs".into(),
        "ro".into(),
        format!("init={BOOT_INIT}"),
    ];
    if !config.verbose_kernel {
        cmdline.push("quiet".into());
    }
    cmdline.extend(config.kernel_args.iter().cloned());

    let devices = virtio_devices(config)?;
    tracing::debug!("VM and devices created after {:?}", started.elapsed());
    let mut interrupts = Vec::new();
    for (slot, instance) in devices.into_iter().enumerate() {
        let name = instance.name;
        let slot = u32::try_from(slot).map_err(|_| VmmError::TooManyDevices)?;
        let irq = layout::VIRTIO_IRQ_BASE + slot;
        if irq >= layout::IOAPIC_PINS {
            return Err(VmmError::TooManyDevices);
        }
        let base = layout::VIRTIO_MMIO_BASE + u64::from(slot) * MMIO_LEN;
        let irqfd = EventFd::new(EFD_NONBLOCK).map_err(|source| VmmError::Device { device: name, source })?;
        vm.register_irqfd(&irqfd, irq).map_err(setup("register virtio irqfd"))?;
        cmdline.push(instance.cmdline(base, irq));
        let transport = MmioTransport::new(instance.device, mem.clone(), irqfd)
            .map_err(|source| VmmError::Device { device: name, source })?;
        for (index, kick) in transport.kick_fds().iter().enumerate() {
            // QueueNotify carries the queue index; a device has a handful.
            let index = u32::try_from(index).map_err(|_| VmmError::TooManyDevices)?;
            vm.register_ioevent(kick, &IoEventAddress::Mmio(base + NOTIFY_OFFSET), index)
                .map_err(setup("register virtio ioeventfd"))?;
        }
        interrupts.push((name, transport.interrupt()));
        mmio.insert(base, MMIO_LEN, Arc::new(Mutex::new(transport)));
    }

    let entry = boot::load(&mem, &config.kernel, &cmdline.join(" "), &ram)?;
    tracing::debug!("kernel loaded after {:?}", started.elapsed());
    mptable::write(&mem, config.vcpus)?;

    // Everything the VM needs is open: nothing more is reachable from here.
    if config.jail {
        let closed = jail::enter(&jail_rules(config), &devices::virtio::device_threads()).map_err(VmmError::Jail)?;
        tracing::debug!("jail closed (Landlock ABI {})", closed.landlock_abi);
    }
    watch_interrupts(interrupts).map_err(|source| VmmError::Device { device: "interrupt watchdog", source })?;

    let pio = Arc::new(pio);
    let mmio = Arc::new(mmio);
    let stop = Arc::new(Mutex::new(None));
    for id in 0..config.vcpus {
        let vcpu = Vcpu::new(&kvm, &vm, id, config.vcpus, (id == 0).then_some(&entry))?;
        vcpu.spawn(pio.clone(), mmio.clone(), exit.clone(), stop.clone())
            .map_err(|source| VmmError::Device { device: "vcpu thread", source })?;
    }
    tracing::debug!("vCPUs started after {:?}", started.elapsed());

    jail::thread::confine_current(ThreadKind::Main);
    let _ = exit.read();
    tracing::debug!("guest ended after {:?}", started.elapsed());
    if let Ok(mut serial) = serial.lock() {
        serial.flush();
    }
    let why = stop.lock().unwrap_or_else(|p| p.into_inner()).take();
    match why {
        None | Some(VcpuStop::GuestReset) => Ok(()),
        Some(VcpuStop::TripleFault) if reset_requested.load(Ordering::SeqCst) => Ok(()),
        Some(VcpuStop::TripleFault) => {
            Err(VmmError::Stopped("the guest kernel crashed (a triple fault, before it could log anything)".into()))
        }
        Some(VcpuStop::Failed(reason)) => Err(VmmError::Stopped(reason)),
    }
}

/// Re-raises device interrupts the guest has left unacknowledged too long
/// (see `REASSERT_AFTER`), so one lost edge cannot stall a device forever.
fn watch_interrupts(lines: Vec<(&'static str, Interrupt)>) -> std::io::Result<()> {
    jail::thread::spawn("irq-watch", ThreadKind::IrqWatch, move || {
        loop {
            std::thread::sleep(REASSERT_AFTER / 2);
            for (name, line) in &lines {
                if line.reassert_if_stale() {
                    tracing::debug!("{name}: interrupt not acknowledged for {REASSERT_AFTER:?}; raised again");
                }
            }
        }
    })?;
    Ok(())
}

/// The files the jailed VMM may still reach: the shares, read-only unless a
/// policy made them writable. Everything else it needs is already open (the
/// init it serves too).
pub fn jail_rules(config: &VmConfig) -> FsRules {
    let (writable, read_only): (Vec<_>, Vec<_>) = config.shares.iter().partition(|s| s.writable);
    FsRules {
        read_only: read_only.into_iter().map(|s| s.host_path.clone()).collect(),
        read_write: writable.into_iter().map(|s| s.host_path.clone()).collect(),
    }
}

/// The instances of every registered device, in slot order.
fn virtio_devices(config: &VmConfig) -> Result<Vec<Instance>, VmmError> {
    let dialer = devices::broker::Dialer::connect(&config.vsock_broker)
        .map_err(|source| VmmError::Device { device: devices::virtio::vsock::THREAD.name, source })?;
    let env = Env { config, dialer: &dialer };
    let mut instances = Vec::new();
    for registration in DEVICES {
        instances.extend((registration.create)(&env)?);
    }
    Ok(instances)
}
