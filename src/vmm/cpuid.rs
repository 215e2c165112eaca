//! CPUID for each vCPU: what KVM supports, plus the topology facts only the
//! VMM knows (APIC ids, CPU count) and the hypervisor bit.

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;

const LEAF_FEATURES: u32 = 0x1;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const ECX_HYPERVISOR: u32 = 1 << 31;
/// The LAPIC timer can be armed by TSC deadline. KVM implements it but leaves
/// the bit for the VMM to set. Without it Linux calibrates the LAPIC timer
/// against PIT ticks, a busy loop that never ends if a tick goes missing
/// (seen under nested virtualization), and boots slower in any case.
const ECX_TSC_DEADLINE: u32 = 1 << 24;
const EDX_HTT: u32 = 1 << 28;
/// CLFLUSH line size in 8-byte units (64 bytes), as real CPUs report.
const CLFLUSH_SIZE: u32 = 8;

/// The CPUID vCPU `id` of `count` is given: what KVM supports, adjusted.
pub fn for_vcpu(kvm: &Kvm, id: u8, count: u8) -> Result<CpuId, kvm_ioctls::Error> {
    let mut cpuid = kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)?;
    let tsc_deadline = kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer);
    configure(&mut cpuid, id, count, tsc_deadline);
    Ok(cpuid)
}

/// Adjusts KVM's supported CPUID for vCPU `id` of `count`; `tsc_deadline`
/// says whether KVM emulates the TSC-deadline LAPIC timer.
pub fn configure(cpuid: &mut CpuId, id: u8, count: u8, tsc_deadline: bool) {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            LEAF_FEATURES => {
                entry.ebx = (u32::from(id) << 24) | (u32::from(count) << 16) | (CLFLUSH_SIZE << 8);
                entry.ecx |= ECX_HYPERVISOR;
                if tsc_deadline {
                    entry.ecx |= ECX_TSC_DEADLINE;
                }
                if count > 1 {
                    entry.edx |= EDX_HTT;
                } else {
                    entry.edx &= !EDX_HTT;
                }
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => {
                // One thread per core, `count` cores in one package: level 0
                // (SMT) holds one logical CPU, level 1 (core) holds them all.
                let shift = u32::from(count).next_power_of_two().trailing_zeros();
                match entry.index {
                    0 => {
                        entry.eax = 0;
                        entry.ebx = 1;
                        entry.ecx = 1 << 8;
                    }
                    1 => {
                        entry.eax = shift;
                        entry.ebx = u32::from(count);
                        entry.ecx = (2 << 8) | 1;
                    }
                    n => {
                        entry.eax = 0;
                        entry.ebx = 0;
                        entry.ecx = n;
                    }
                }
                entry.edx = u32::from(id);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn sets_apic_id_count_and_hypervisor_bit() {
        let entries = [
            kvm_cpuid_entry2 { function: 1, ..Default::default() },
            kvm_cpuid_entry2 { function: 0xb, index: 1, ..Default::default() },
        ];
        let mut cpuid = CpuId::from_entries(&entries).unwrap();
        configure(&mut cpuid, 2, 4, true);
        let e = cpuid.as_slice();
        assert_eq!(e[0].ebx >> 24, 2);
        assert_eq!((e[0].ebx >> 16) & 0xff, 4);
        assert_ne!(e[0].ecx & ECX_HYPERVISOR, 0);
        assert_ne!(e[0].ecx & ECX_TSC_DEADLINE, 0);
        assert_eq!(e[1].edx, 2);
        assert_eq!(e[1].ebx, 4);
        assert_eq!(e[1].eax, 2);
    }
}
