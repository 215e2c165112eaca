//! The Intel MultiProcessor table: how a guest without ACPI learns its CPUs,
//! its IOAPIC and how ISA interrupts reach it. Linux scans the last KiB of
//! base memory for the floating pointer.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{IOAPIC_ADDR, IOAPIC_PINS, LAPIC_ADDR, MAX_VCPUS, MPTABLE_ADDR, MPTABLE_MAX};

const SPEC_REV: u8 = 4;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const CPU_ENABLED: u8 = 1;
const CPU_BSP: u8 = 2;
/// Family 6 signature with the FPU and APIC feature bits, as firmware reports.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;

#[derive(Debug, thiserror::Error)]
pub enum MptableError {
    #[error("{0} vCPUs do not fit the MP table (at most {MAX_VCPUS})")]
    TooManyCpus(u8),
    #[error("cannot write the MP table to guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b)))
}

/// The table's bytes for `cpus` vCPUs placed at `base`.
pub fn build(cpus: u8, base: u64) -> Result<Vec<u8>, MptableError> {
    if cpus == 0 || cpus > MAX_VCPUS {
        return Err(MptableError::TooManyCpus(cpus));
    }
    let ioapic_id = cpus;
    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for id in 0..cpus {
        entries.extend_from_slice(&[
            ENTRY_PROCESSOR,
            id,
            APIC_VERSION,
            CPU_ENABLED | if id == 0 { CPU_BSP } else { 0 },
        ]);
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0u8; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[ENTRY_BUS, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    count += 1;
    for pin in 0..u8::try_from(IOAPIC_PINS).expect("an IOAPIC has at most 255 pins") {
        // Flags 0: polarity and trigger conform to the ISA bus (active high, edge).
        entries.extend_from_slice(&[ENTRY_IO_INTERRUPT, INT_TYPE_INT, 0, 0, 0, pin, ioapic_id, pin]);
        count += 1;
    }
    // LINT0 of every local APIC takes the legacy PIC (ExtINT), LINT1 the NMI.
    entries.extend_from_slice(&[ENTRY_LOCAL_INTERRUPT, INT_TYPE_EXTINT, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[ENTRY_LOCAL_INTERRUPT, INT_TYPE_NMI, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    let table_addr = base + 16;
    let mut table = Vec::with_capacity(44 + entries.len());
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(
        &u16::try_from(44 + entries.len()).expect("entries are bounded by the vCPU cap").to_le_bytes(),
    );
    table.push(SPEC_REV);
    table.push(0); // checksum, filled below
    table.extend_from_slice(b"STOCKADE");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&LAPIC_ADDR.to_le_bytes());
    table.extend_from_slice(&0u16.to_le_bytes()); // extended table length
    table.push(0); // extended table checksum
    table.push(0); // reserved
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut floating = Vec::with_capacity(16);
    floating.extend_from_slice(b"_MP_");
    floating.extend_from_slice(&u32::try_from(table_addr).expect("the MP table lies below 1 MiB").to_le_bytes());
    floating.push(1); // length in 16-byte units
    floating.push(SPEC_REV);
    floating.push(0); // checksum
    floating.extend_from_slice(&[0u8; 5]);
    floating[10] = checksum(&floating);

    let mut all = floating;
    all.extend_from_slice(&table);
    debug_assert!(all.len() as u64 <= MPTABLE_MAX);
    Ok(all)
}

/// Writes the MP table for `cpus` vCPUs into guest memory.
pub fn write(mem: &GuestMemoryMmap, cpus: u8) -> Result<(), MptableError> {
    let bytes = build(cpus, MPTABLE_ADDR)?;
    mem.write_slice(&bytes, GuestAddress(MPTABLE_ADDR)).map_err(MptableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn checksums_are_zero_and_pointer_is_right() {
        let t = build(4, MPTABLE_ADDR).unwrap();
        assert_eq!(&t[..4], b"_MP_");
        assert_eq!(sum(&t[..16]), 0);
        let ptr = u32::from_le_bytes(t[4..8].try_into().unwrap()) as u64;
        assert_eq!(ptr, MPTABLE_ADDR + 16);
        let len = u16::from_le_bytes(t[20..22].try_into().unwrap()) as usize;
        assert_eq!(&t[16..20], b"PCMP");
        assert_eq!(16 + len, t.len());
        assert_eq!(sum(&t[16..]), 0);
    }

    #[test]
    fn one_processor_entry_per_cpu_with_bsp_first() {
        let t = build(3, MPTABLE_ADDR).unwrap();
        let first = &t[16 + 44..];
        assert_eq!(first[0], ENTRY_PROCESSOR);
        assert_eq!(first[3], CPU_ENABLED | CPU_BSP);
        assert_eq!(first[20], ENTRY_PROCESSOR);
        assert_eq!(first[23], CPU_ENABLED);
        let count = u16::from_le_bytes(t[16 + 34..16 + 36].try_into().unwrap());
        assert_eq!(count, 3 + 1 + 1 + 24 + 2);
    }

    #[test]
    fn most_cpus_fit_and_more_are_refused() {
        assert!(build(MAX_VCPUS, MPTABLE_ADDR).unwrap().len() as u64 <= MPTABLE_MAX);
        assert!(build(MAX_VCPUS + 1, MPTABLE_ADDR).is_err());
        assert!(build(0, MPTABLE_ADDR).is_err());
    }
}
