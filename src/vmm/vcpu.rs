//! vCPU threads: set up each vCPU, then run it, dispatching port and MMIO
//! exits to the buses until the guest resets or something fails.

use std::sync::Arc;

use kvm_bindings::kvm_fpu;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

use super::boot::{self, BootEntry};
use super::cpuid;
use super::devices::bus::Bus;
use super::template::cpu::VcpuState;
use super::template::{Recorder, TemplateError};
use crate::protocol::template::POINT_PORT;

/// Local APIC LVT registers and delivery modes (Intel SDM 10.5.1).
const APIC_LVT_LINT0: usize = 0x350;
const APIC_LVT_LINT1: usize = 0x360;
const APIC_MODE_EXTINT: u32 = 0x7;
const APIC_MODE_NMI: u32 = 0x4;

#[derive(Debug, Error)]
pub enum VcpuError {
    #[error("cannot create vCPU {0}")]
    Create(u8, #[source] kvm_ioctls::Error),
    #[error("cannot configure vCPU {id}: {step}")]
    Configure {
        id: u8,
        step: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
}

/// Why a vCPU stopped running.
#[derive(Debug)]
pub enum VcpuStop {
    /// The guest asked to reset or power off (system event, halt for good).
    GuestReset,
    /// The CPU shut down: a triple fault, which is how a kernel crashes too
    /// early or too badly to print anything, unless the guest had already
    /// asked for a reset (Linux falls back to one after the i8042 pulse).
    TripleFault,
    /// KVM reported something the VMM cannot continue from.
    Failed(String),
}

pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
    /// Set on every vCPU of a VM that records a template.
    recorder: Option<Arc<Recorder>>,
}

impl Vcpu {
    /// Creates vCPU `id` of `count` with CPUID and LAPIC configured; the boot
    /// vCPU also gets the PVH entry state.
    pub fn new(kvm: &Kvm, vm: &VmFd, id: u8, count: u8, boot: Option<&BootEntry>) -> Result<Vcpu, VcpuError> {
        let fd = vm.create_vcpu(u64::from(id)).map_err(|e| VcpuError::Create(id, e))?;
        let step = |step, source| VcpuError::Configure { id, step, source };

        let cpuid = cpuid::for_vcpu(kvm, id, count).map_err(|e| step("get supported CPUID", e))?;
        fd.set_cpuid2(&cpuid).map_err(|e| step("set CPUID", e))?;

        let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
        fd.set_fpu(&fpu).map_err(|e| step("set FPU", e))?;

        let mut lapic = fd.get_lapic().map_err(|e| step("get LAPIC", e))?;
        set_lvt_mode(&mut lapic.regs, APIC_LVT_LINT0, APIC_MODE_EXTINT);
        set_lvt_mode(&mut lapic.regs, APIC_LVT_LINT1, APIC_MODE_NMI);
        fd.set_lapic(&lapic).map_err(|e| step("set LAPIC", e))?;

        if let Some(boot) = boot {
            let sregs = fd.get_sregs().map_err(|e| step("get special registers", e))?;
            fd.set_sregs(&boot::pvh_sregs(sregs)).map_err(|e| step("set special registers", e))?;
            fd.set_regs(&boot::pvh_regs(boot.entry)).map_err(|e| step("set registers", e))?;
        }
        Ok(Vcpu { id, fd, recorder: None })
    }

    /// Creates vCPU `id` of `count` in the state a template saved.
    pub fn restored(
        kvm: &Kvm,
        vm: &VmFd,
        id: u8,
        count: u8,
        state: &VcpuState,
        tsc_khz: u32,
    ) -> Result<Vcpu, TemplateError> {
        let vcpu = Vcpu::new(kvm, vm, id, count, None).map_err(|e| TemplateError::Refused(e.to_string()))?;
        // A guest calibrated its clocks to the TSC it booted with.
        match vcpu.fd.get_tsc_khz() {
            Ok(khz) if khz == tsc_khz => {}
            Ok(khz) => {
                return Err(TemplateError::Mismatch(format!("the TSC runs at {khz} kHz, the template's at {tsc_khz}")));
            }
            Err(source) => return Err(TemplateError::Kvm { step: "get TSC frequency", source }),
        }
        state.restore(&vcpu.fd)?;
        Ok(vcpu)
    }

    /// Makes this vCPU record the template when the guest reaches its point.
    pub fn record_with(&mut self, recorder: Arc<Recorder>) {
        self.recorder = Some(recorder);
    }

    /// Completes an I/O exit KVM has not finished yet (it does so on the next
    /// KVM_RUN), without running the guest, so the saved state is whole.
    fn settle(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        let _ = self.fd.run();
        self.fd.set_kvm_immediate_exit(0);
    }

    /// The guest reached the template point on this vCPU: park the others,
    /// save the VM, go on. A failed recording only costs the template.
    fn record(&mut self, recorder: &Recorder) {
        if !recorder.first_arrival() {
            return;
        }
        let me = usize::from(self.id);
        let result = recorder.pause.stop_others(me, std::time::Duration::from_secs(2)).and_then(|others| {
            self.settle();
            let mine = VcpuState::save(&self.fd, &recorder.msr_list)?;
            let khz =
                self.fd.get_tsc_khz().map_err(|source| TemplateError::Kvm { step: "get TSC frequency", source })?;
            recorder.save(me, mine, others, khz)
        });
        recorder.pause.release();
        recorder.finish();
        if let Err(e) = result {
            tracing::warn!("no template recorded: {e}");
        }
    }

    /// Runs on a thread named `vcpu<N>` until the guest stops; then writes
    /// `exit` so the VMM's main thread ends the process.
    pub fn spawn(
        mut self,
        kind: crate::jail::ThreadKind,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        exit: Arc<EventFd>,
        stop: Arc<std::sync::Mutex<Option<VcpuStop>>>,
    ) -> std::io::Result<()> {
        crate::jail::thread::spawn(format!("vcpu{}", self.id), kind, move || {
            let why = self.run(&pio, &mmio);
            tracing::debug!("vcpu{} stopped: {why:?}", self.id);
            let mut slot = stop.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(why);
            drop(slot);
            let _ = exit.write(1);
        })?;
        Ok(())
    }

    fn run(&mut self, pio: &Bus, mmio: &Bus) -> VcpuStop {
        let recorder = self.recorder.clone();
        if let Some(r) = &recorder {
            r.pause.register(usize::from(self.id));
        }
        loop {
            if let Some(r) = &recorder
                && r.pause.requested()
            {
                r.pause.park(usize::from(self.id), || {
                    self.settle();
                    VcpuState::save(&self.fd, &r.msr_list)
                });
            }
            let mut at_point = false;
            match self.fd.run() {
                Ok(VcpuExit::IoOut(POINT_PORT, _)) => at_point = true,
                Ok(VcpuExit::IoOut(port, data)) => pio.write(u64::from(port), data),
                Ok(VcpuExit::IoIn(port, data)) => pio.read(u64::from(port), data),
                Ok(VcpuExit::MmioRead(addr, data)) => mmio.read(addr, data),
                Ok(VcpuExit::MmioWrite(addr, data)) => mmio.write(addr, data),
                Ok(VcpuExit::Hlt) => {
                    // With the in-kernel LAPIC a halt only exits here when the
                    // vCPU can never wake again.
                    return VcpuStop::GuestReset;
                }
                Ok(VcpuExit::Shutdown) => return VcpuStop::TripleFault,
                Ok(VcpuExit::SystemEvent(..)) => return VcpuStop::GuestReset,
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return VcpuStop::Failed(format!("KVM could not enter the guest (reason {reason:#x}, cpu {cpu})"));
                }
                Ok(VcpuExit::InternalError) => return VcpuStop::Failed("KVM internal error".into()),
                Ok(other) => {
                    return VcpuStop::Failed(format!("unexpected vCPU exit: {other:?}"));
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
                Err(e) => return VcpuStop::Failed(format!("KVM_RUN failed: {e}")),
            }
            if at_point && let Some(r) = &recorder {
                self.record(r);
            }
        }
    }
}

fn set_lvt_mode(regs: &mut [std::os::raw::c_char; 1024], offset: usize, mode: u32) {
    let bytes: [u8; 4] = std::array::from_fn(|i| u8::from_ne_bytes(regs[offset + i].to_ne_bytes()));
    let value = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
    for (i, b) in value.to_le_bytes().into_iter().enumerate() {
        regs[offset + i] = std::os::raw::c_char::from_ne_bytes([b]);
    }
}
