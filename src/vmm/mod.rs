//! The virtual machine monitor: KVM, guest memory, vCPUs and devices.
//!
//! `run` is the boot sequence: create the VM and its memory, the interrupt
//! controllers, the legacy devices and the virtio devices on MMIO; load the
//! kernel for PVH boot, told to mount a virtio-fs root that holds our own
//! binary as /init; write the MP table; start the vCPUs; wait for the guest
//! to reset. The process exits right after, which ends every vCPU and
//! device thread with it. Given a template (`template`), it resumes that
//! instead of booting: memory mapped from the template, the KVM and device
//! state set, the same threads started.

// Casts between guest-sized and host-sized integers are where a VMM
// truncates silently: here each is a checked conversion (as in Firecracker).
#![warn(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_possible_wrap)]

pub mod boot;
pub mod cpuid;
pub mod devices;
pub mod jail_probe;
pub mod layout;
pub mod memory;
pub mod mptable;
pub mod probe;
#[cfg(test)]
mod seccomp_tests;
pub mod template;
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
use crate::protocol::broker::StartKind;
use crate::protocol::shares::{BOOT_INIT, BOOT_TAG};
use crate::protocol::vm_config::{TemplatePlan, VmConfig};
use devices::bus::Bus;
use devices::legacy::{I8042, I8042_BASE, I8042_LEN};
use devices::mmio::{MMIO_LEN, MmioTransport, NOTIFY_OFFSET};
use devices::serial::{COM1_BASE, COM1_IRQ, COM1_LEN, PowerDownWatch, SerialPort, UartState};
use devices::virtio::{DEVICES, Env, Instance, Interrupt, REASSERT_AFTER};
use template::{Recorder, RecorderParts, Template, TemplateError};
use vcpu::{Vcpu, VcpuStop};
use vm_memory::GuestMemoryMmap;

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

/// The supervisor's pid, in the VMM's environment: the VMM runs only while
/// that process is its parent.
pub const SUPERVISOR_PID: &str = "STOCKADE_SUPERVISOR_PID";

/// Runs the VM described by `config` (booted, or resumed from a template)
/// and returns when the guest resets.
pub fn run(config: &VmConfig) -> Result<(), VmmError> {
    // The VM must not outlive the supervisor that owns its session.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    // A supervisor that died before that line sent no signal: we were
    // orphaned already.
    let supervisor = std::env::var(SUPERVISOR_PID).ok().and_then(|pid| pid.parse::<i32>().ok());
    if supervisor.is_some_and(|pid| nix::unistd::getppid().as_raw() != pid) {
        return Err(VmmError::Stopped("its supervisor is gone".into()));
    }
    let started = std::time::Instant::now();
    let kvm = Kvm::new().map_err(VmmError::Kvm)?;
    let dialer = devices::broker::Dialer::connect(&config.vsock_broker, started)
        .map_err(|source| VmmError::Device { device: devices::virtio::vsock::THREAD.name, source })?;
    let (machine, kind) = match &config.template {
        Some(TemplatePlan::Restore(dir)) => match restore(config, &kvm, &dialer, dir) {
            Ok(machine) => (machine, StartKind::Restored),
            Err(RestoreError::Template(e)) => {
                tracing::warn!("cannot resume the template {}: {e}; booting instead", dir.display());
                (boot(config, &kvm, &dialer, None)?, e.start_kind())
            }
            Err(RestoreError::Vmm(e)) => return Err(e),
        },
        Some(TemplatePlan::Record(dir)) => {
            let machine = boot(config, &kvm, &dialer, Some(dir))?;
            let kind = if machine.recording { StartKind::Recording } else { StartKind::Booted };
            (machine, kind)
        }
        None => (boot(config, &kvm, &dialer, None)?, StartKind::Booted),
    };
    if let Err(e) = dialer.report_start(kind) {
        tracing::debug!("cannot tell the supervisor how the VM started: {e}");
    }
    tracing::debug!("{} after {:?}", kind.describe(), started.elapsed());
    machine.run(config, started)
}

type Uart = SerialPort<PowerDownWatch<LineWriter<Capped<File>>>>;

/// A VM ready to run: everything made and set, no thread started.
struct Machine {
    /// Kept open for as long as the VM runs.
    _vm: Arc<kvm_ioctls::VmFd>,
    pio: Bus,
    mmio: Bus,
    serial: Arc<Mutex<Uart>>,
    exit: Arc<EventFd>,
    reset_requested: Arc<AtomicBool>,
    interrupts: Vec<(&'static str, Interrupt)>,
    /// Each transport, and whether a template had it active (it is resumed
    /// once the vCPUs run).
    transports: Vec<(Arc<Mutex<MmioTransport>>, bool)>,
    vcpus: Vec<Vcpu>,
    /// Whether the vCPUs record a template at the template point.
    recording: bool,
}

/// What `assemble` makes, whether the VM boots or resumes.
struct Assembled {
    vm: Arc<kvm_ioctls::VmFd>,
    machine: Machine,
    cmdline: Vec<String>,
}

/// Why a restore did not happen: the template (the run boots instead) or
/// the VMM itself (the run fails as a boot would).
enum RestoreError {
    Template(TemplateError),
    Vmm(VmmError),
}

impl From<TemplateError> for RestoreError {
    fn from(e: TemplateError) -> Self {
        RestoreError::Template(e)
    }
}

/// The VM, its memory registered, its interrupt controllers, legacy devices
/// and virtio transports made: what booting and resuming share.
fn assemble(
    config: &VmConfig,
    vm: kvm_ioctls::VmFd,
    dialer: &devices::broker::Dialer,
    mem: &GuestMemoryMmap,
    uart: Option<&UartState>,
) -> Result<Assembled, VmmError> {
    memory::register(&vm, mem)?;
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
    let log = LineWriter::new(Capped::new(log, "kernel.log", Style::Text, KERNEL_LOG_CAP));
    let power_down = exit.try_clone().map_err(|source| VmmError::Device { device: "serial", source })?;
    let log = PowerDownWatch::new(log, power_down);
    let uart = match uart {
        Some(state) => SerialPort::restored(serial_irq, log, state)
            .map_err(|source| VmmError::Device { device: "serial", source })?,
        None => SerialPort::new(serial_irq, log),
    };
    let serial = Arc::new(Mutex::new(uart));
    pio.insert(COM1_BASE, COM1_LEN, serial.clone());
    let reset = exit.try_clone().map_err(|source| VmmError::Device { device: "i8042", source })?;
    let reset_requested = Arc::new(AtomicBool::new(false));
    pio.insert(I8042_BASE, I8042_LEN, Arc::new(Mutex::new(I8042::new(reset, reset_requested.clone()))));

    let mut cmdline = Vec::new();
    let mut interrupts = Vec::new();
    let mut transports = Vec::new();
    for (slot, instance) in virtio_devices(config, dialer)?.into_iter().enumerate() {
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
        let transport = Arc::new(Mutex::new(transport));
        mmio.insert(base, MMIO_LEN, transport.clone());
        transports.push((transport, false));
    }
    let vm = Arc::new(vm);
    let machine = Machine {
        _vm: vm.clone(),
        pio,
        mmio,
        serial,
        exit,
        reset_requested,
        interrupts,
        transports,
        vcpus: Vec::new(),
        recording: false,
    };
    Ok(Assembled { vm, machine, cmdline })
}

/// A VM that boots the kernel; with `record`, one that saves a template
/// into that directory when the guest reaches its template point.
fn boot(
    config: &VmConfig,
    kvm: &Kvm,
    dialer: &devices::broker::Dialer,
    record: Option<&std::path::Path>,
) -> Result<Machine, VmmError> {
    let ram = layout::ram_ranges(config.memory_bytes);
    let mem = memory::create(&ram)?;
    let vm = kvm.create_vm().map_err(setup("create VM"))?;
    let Assembled { vm, mut machine, cmdline: devices } = assemble(config, vm, dialer, &mem, None)?;

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
    if record.is_some() {
        cmdline.push(crate::protocol::template::RECORDING_ARG.into());
    }
    cmdline.extend(config.kernel_args.iter().cloned());
    cmdline.extend(devices);
    let entry = boot::load(&mem, &config.kernel, &cmdline.join(" "), &ram)?;
    mptable::write(&mem, config.vcpus)?;

    for id in 0..config.vcpus {
        machine.vcpus.push(Vcpu::new(kvm, &vm, id, config.vcpus, (id == 0).then_some(&entry))?);
    }
    if let Some(dir) = record {
        match recorder(config, kvm, &vm, &mem, &machine, dir) {
            Ok(recorder) => {
                let recorder = Arc::new(recorder);
                for vcpu in &mut machine.vcpus {
                    vcpu.record_with(recorder.clone());
                }
                machine.recording = true;
            }
            // The run goes on; only later runs miss the template.
            Err(e) => tracing::warn!("cannot record a template in {}: {e}", dir.display()),
        }
    }
    Ok(machine)
}

fn recorder(
    config: &VmConfig,
    kvm: &Kvm,
    vm: &Arc<kvm_ioctls::VmFd>,
    mem: &GuestMemoryMmap,
    machine: &Machine,
    dir: &std::path::Path,
) -> Result<Recorder, TemplateError> {
    let serial = machine.serial.clone();
    let parts = RecorderParts {
        vm: vm.clone(),
        mem: mem.clone(),
        cpuid: cpuid_digests(kvm, config.vcpus)?,
        transports: machine.transports.iter().map(|(t, _)| t.clone()).collect(),
        uart: Box::new(move || serial.lock().unwrap_or_else(|p| p.into_inner()).state()),
    };
    Recorder::create(kvm, dir, parts)
}

/// The digest of the CPUID each of `count` vCPUs is given.
fn cpuid_digests(kvm: &Kvm, count: u8) -> Result<Vec<String>, TemplateError> {
    (0..count)
        .map(|id| {
            cpuid::for_vcpu(kvm, id, count)
                .map(|c| template::cpuid_digest(&c))
                .map_err(|source| TemplateError::Kvm { step: "get supported CPUID", source })
        })
        .collect()
}

/// A VM resumed from the template in `dir`, or why not.
fn restore(
    config: &VmConfig,
    kvm: &Kvm,
    dialer: &devices::broker::Dialer,
    dir: &std::path::Path,
) -> Result<Machine, RestoreError> {
    // Creating a VM takes a while under nested virtualization: the template
    // is read and mapped meanwhile. The thread ends before the jail closes.
    let (vm, opened) = std::thread::scope(|scope| {
        let creating = scope.spawn(|| kvm.create_vm());
        let opened = (|| -> Result<_, RestoreError> {
            let cpuid = cpuid_digests(kvm, config.vcpus)?;
            let Template { saved, memory } = Template::open(dir, config.memory_bytes, &cpuid)?;
            let ram = layout::ram_ranges(config.memory_bytes);
            let mem = memory::create_from(&ram, &memory).map_err(|e| RestoreError::Vmm(e.into()))?;
            Ok((saved, mem))
        })();
        let vm = creating.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (vm, opened)
    });
    let (saved, mem) = opened?;
    let vm = vm.map_err(|e| RestoreError::Vmm(setup("create VM")(e)))?;
    let Assembled { vm, mut machine, .. } =
        assemble(config, vm, dialer, &mem, Some(&saved.uart)).map_err(RestoreError::Vmm)?;
    if saved.devices.len() != machine.transports.len() {
        return Err(TemplateError::Mismatch(format!(
            "the template has {} devices, this VM {}",
            saved.devices.len(),
            machine.transports.len()
        ))
        .into());
    }
    for (slot, ((transport, resume), device)) in machine.transports.iter_mut().zip(&saved.devices).enumerate() {
        let mut transport = transport.lock().unwrap_or_else(|p| p.into_inner());
        transport.restore(&device.transport).map_err(|e| TemplateError::Mismatch(e.to_string()))?;
        transport
            .restore_device_state(&device.state)
            .map_err(|e| TemplateError::Damaged(format!("the virtio device in slot {slot} cannot be restored: {e}")))?;
        *resume = device.transport.was_active();
    }
    saved.machine.restore(&vm)?;
    for (id, state) in (0..config.vcpus).zip(&saved.vcpus) {
        machine.vcpus.push(Vcpu::restored(kvm, &vm, id, config.vcpus, state, saved.tsc_khz)?);
    }
    Ok(machine)
}

impl Machine {
    /// Closes the jail, starts the vCPUs, then the devices a template had
    /// running, and waits for the guest to reset.
    fn run(self, config: &VmConfig, started: std::time::Instant) -> Result<(), VmmError> {
        let Machine { _vm, pio, mmio, serial, exit, reset_requested, interrupts, transports, vcpus, recording } = self;
        // Everything the VM needs is open: nothing more is reachable from here.
        if config.jail {
            let closed =
                jail::enter(&jail_rules(config), &devices::virtio::device_threads()).map_err(VmmError::Jail)?;
            tracing::debug!("jail closed (Landlock ABI {})", closed.landlock_abi);
        }
        watch_interrupts(interrupts).map_err(|source| VmmError::Device { device: "interrupt watchdog", source })?;

        let pio = Arc::new(pio);
        let mmio = Arc::new(mmio);
        let stop = Arc::new(Mutex::new(None));
        let kind = if recording { ThreadKind::RecordingVcpu } else { ThreadKind::Vcpu };
        for vcpu in vcpus {
            vcpu.spawn(kind, pio.clone(), mmio.clone(), exit.clone(), stop.clone())
                .map_err(|source| VmmError::Device { device: "vcpu thread", source })?;
        }
        tracing::debug!("vCPUs started after {:?}", started.elapsed());
        // Starting a device's threads takes a while under nested
        // virtualization, and a resumed guest runs on its own a good while
        // before it touches one: resume them while it does. Each transport's
        // lock orders its resume against the guest's register accesses, and
        // a queue kicked before its device runs is served at the resume.
        for (transport, resume) in &transports {
            transport.lock().unwrap_or_else(|p| p.into_inner()).resume(*resume);
        }

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
/// policy made them writable, and the init it serves, to read. Everything
/// else it needs is already open.
pub fn jail_rules(config: &VmConfig) -> FsRules {
    let (writable, read_only): (Vec<_>, Vec<_>) = config.shares.iter().partition(|s| s.writable);
    // The init, which the boot device reopens for reading from the
    // descriptor pinning it (see `BootFs`).
    let init = std::iter::once(config.init.clone());
    FsRules {
        read_only: read_only.into_iter().map(|s| s.host_path.clone()).chain(init).collect(),
        read_write: writable.into_iter().map(|s| s.host_path.clone()).collect(),
    }
}

/// The instances of every registered device, in slot order.
fn virtio_devices(config: &VmConfig, dialer: &devices::broker::Dialer) -> Result<Vec<Instance>, VmmError> {
    let env = Env { config, dialer };
    let mut instances = Vec::new();
    for registration in DEVICES {
        instances.extend((registration.create)(&env)?);
    }
    Ok(instances)
}
