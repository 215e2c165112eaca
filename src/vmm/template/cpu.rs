//! One vCPU's state as KVM holds it: saved at the template point, set again
//! on a fresh vCPU of the same CPUID before it first runs.

use kvm_bindings::{
    Msrs, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave,
};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

use super::TemplateError;

/// KVM refuses KVM_GET_MSRS and KVM_SET_MSRS calls of 256 entries or more.
const MSR_BATCH: usize = 255;
/// IA32_TSC_DEADLINE is only meaningful once IA32_TSC is set: it goes last.
const MSR_TSC_DEADLINE: u32 = 0x6e0;

#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    mp_state: kvm_mp_state,
    regs: kvm_regs,
    sregs: kvm_sregs,
    xsave: kvm_xsave,
    xcrs: kvm_xcrs,
    debugregs: kvm_debugregs,
    lapic: kvm_lapic_state,
    msrs: Vec<(u32, u64)>,
    events: kvm_vcpu_events,
}

fn get(step: &'static str) -> impl Fn(kvm_ioctls::Error) -> TemplateError {
    move |source| TemplateError::Kvm { step, source }
}

/// The MSRs KVM can save for a guest, in the order they are to be set.
pub fn msr_list(kvm: &Kvm) -> Result<Vec<u32>, TemplateError> {
    let mut list = kvm.get_msr_index_list().map_err(get("list MSRs"))?.as_slice().to_vec();
    list.sort_by_key(|&index| index == MSR_TSC_DEADLINE);
    Ok(list)
}

impl VcpuState {
    /// Reads the state of a vCPU that is not running; a pending I/O exit
    /// must have been completed first (see `vcpu::Vcpu::settle`).
    pub fn save(fd: &VcpuFd, msr_list: &[u32]) -> Result<VcpuState, TemplateError> {
        Ok(VcpuState {
            mp_state: fd.get_mp_state().map_err(get("get MP state"))?,
            regs: fd.get_regs().map_err(get("get registers"))?,
            sregs: fd.get_sregs().map_err(get("get special registers"))?,
            xsave: fd.get_xsave().map_err(get("get XSAVE"))?,
            xcrs: fd.get_xcrs().map_err(get("get XCRs"))?,
            debugregs: fd.get_debug_regs().map_err(get("get debug registers"))?,
            lapic: fd.get_lapic().map_err(get("get LAPIC"))?,
            msrs: read_msrs(fd, msr_list)?,
            events: fd.get_vcpu_events().map_err(get("get vCPU events"))?,
        })
    }

    /// Sets this state on `fd`, whose CPUID is already set.
    pub fn restore(&self, fd: &VcpuFd) -> Result<(), TemplateError> {
        fd.set_mp_state(self.mp_state).map_err(get("set MP state"))?;
        fd.set_regs(&self.regs).map_err(get("set registers"))?;
        fd.set_sregs(&self.sregs).map_err(get("set special registers"))?;
        // SAFETY: a kvm_xsave read by KVM_GET_XSAVE on a vCPU of the same
        // CPUID (the template's key), so its size is what KVM expects.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(get("set XSAVE"))?;
        fd.set_xcrs(&self.xcrs).map_err(get("set XCRs"))?;
        fd.set_debug_regs(&self.debugregs).map_err(get("set debug registers"))?;
        fd.set_lapic(&self.lapic).map_err(get("set LAPIC"))?;
        for batch in self.msrs.chunks(MSR_BATCH) {
            let msrs = msrs_of(batch.iter().map(|&(index, data)| (index, data)))?;
            let set = fd.set_msrs(&msrs).map_err(get("set MSRs"))?;
            if set != batch.len() {
                let index = batch.get(set).map_or(0, |m| m.0);
                return Err(TemplateError::Refused(format!("KVM refused MSR {index:#x}")));
            }
        }
        fd.set_vcpu_events(&self.events).map_err(get("set vCPU events"))?;
        Ok(())
    }
}

fn msrs_of(entries: impl Iterator<Item = (u32, u64)>) -> Result<Msrs, TemplateError> {
    let entries: Vec<kvm_msr_entry> =
        entries.map(|(index, data)| kvm_msr_entry { index, data, ..Default::default() }).collect();
    Msrs::from_entries(&entries).map_err(|e| TemplateError::Refused(format!("MSR list: {e:?}")))
}

/// Reads `list` in batches; an MSR KVM cannot read on this vCPU is left out
/// (KVM stops a batch at the first one it refuses).
fn read_msrs(fd: &VcpuFd, list: &[u32]) -> Result<Vec<(u32, u64)>, TemplateError> {
    let mut saved = Vec::with_capacity(list.len());
    let mut next = 0;
    while next < list.len() {
        let batch = &list[next..(next + MSR_BATCH).min(list.len())];
        let mut msrs = msrs_of(batch.iter().map(|&index| (index, 0)))?;
        let read = fd.get_msrs(&mut msrs).map_err(get("get MSRs"))?;
        saved.extend(msrs.as_slice()[..read].iter().map(|m| (m.index, m.data)));
        next += read;
        if read < batch.len() {
            // KVM stopped at one it refuses: leave that one out.
            next += 1;
        }
    }
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tsc_deadline_is_set_after_everything_else() {
        let mut list = vec![0x10, MSR_TSC_DEADLINE, 0xc000_0080, 0x1b];
        list.sort_by_key(|&index| index == MSR_TSC_DEADLINE);
        assert_eq!(list, [0x10, 0xc000_0080, 0x1b, MSR_TSC_DEADLINE]);
    }

    #[test]
    fn msr_batches_stay_under_kvms_limit() {
        let entries: Vec<(u32, u64)> = (0..600).map(|i| (i, u64::from(i))).collect();
        let batches: Vec<usize> = entries.chunks(MSR_BATCH).map(<[_]>::len).collect();
        assert_eq!(batches, [255, 255, 90]);
        assert!(msrs_of(entries[..MSR_BATCH].iter().copied()).is_ok());
    }
}
