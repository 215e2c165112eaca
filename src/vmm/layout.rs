//! Guest-physical address layout. Everything the VMM places in guest memory
//! has its address here, so overlaps show up in one file.

/// Boot GDT for the PVH entry (32-bit protected mode).
pub const GDT_ADDR: u64 = 0x500;
/// PVH `hvm_start_info`, then its memory map right after.
pub const PVH_INFO_ADDR: u64 = 0x6000;
pub const PVH_MEMMAP_ADDR: u64 = 0x7000;
/// Kernel command line (x86 COMMAND_LINE_SIZE is 2048).
pub const CMDLINE_ADDR: u64 = 0x20000;
pub const CMDLINE_MAX: usize = 2048;
/// The MP table lives in the last KiB of base memory, where Linux scans for it.
pub const MPTABLE_ADDR: u64 = 0x9fc00;
pub const MPTABLE_MAX: u64 = 0x400;
/// Start of memory above the legacy hole; the kernel loads above this.
pub const HIMEM_START: u64 = 0x10_0000;
/// The MMIO hole below 4 GiB: RAM stops here and resumes at 4 GiB.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// virtio-mmio devices, one 4 KiB window each, from here up.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// KVM needs three pages for the TSS on Intel, in the hole.
pub const KVM_TSS_ADDR: usize = 0xfffb_d000;
/// GSIs for virtio devices: after the legacy ISA lines, within the IOAPIC's 24.
pub const VIRTIO_IRQ_BASE: u32 = 5;
pub const IOAPIC_PINS: u32 = 24;
/// The MP table in MPTABLE_MAX bytes fits this many processor entries; the
/// CLI checks `--cpus` against the same limit.
pub use crate::protocol::limits::MAX_VCPUS;

/// The guest RAM ranges for `size` bytes of memory: below the MMIO hole, and
/// the rest above 4 GiB.
pub fn ram_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= MMIO_GAP_START {
        vec![(0, size)]
    } else {
        vec![(0, MMIO_GAP_START), (MMIO_GAP_END, size - MMIO_GAP_START)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_range() {
        assert_eq!(ram_ranges(2 << 30), vec![(0, 2 << 30)]);
    }

    #[test]
    fn large_memory_skips_the_mmio_hole() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r[0], (0, MMIO_GAP_START));
        assert_eq!(r[1].0, MMIO_GAP_END);
        assert_eq!(r[0].1 + r[1].1, 4 << 30);
    }

    // The fixed areas do not overlap: checked when the crate compiles.
    const _: () = {
        assert!(GDT_ADDR + 64 <= PVH_INFO_ADDR);
        assert!(PVH_INFO_ADDR + 0x100 <= PVH_MEMMAP_ADDR);
        assert!(PVH_MEMMAP_ADDR + 0x1000 <= CMDLINE_ADDR);
        assert!(CMDLINE_ADDR + CMDLINE_MAX as u64 <= MPTABLE_ADDR);
        assert!(MPTABLE_ADDR + MPTABLE_MAX <= 0xa0000);
        assert!(VIRTIO_MMIO_BASE >= MMIO_GAP_START);
    };
}
