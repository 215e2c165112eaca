//! PVH boot: load the vmlinux, place the command line and `hvm_start_info`
//! in guest memory (no initramfs: the root is served over virtio-fs, see
//! `devices::virtio::fs::boot`), and put the boot vCPU in the state the PVH
//! entry point expects (32-bit protected mode, paging off, EBX pointing at
//! the start info).

use std::fs::File;
use std::path::Path;

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::KernelLoader;
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_start_info};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};

use super::layout::{CMDLINE_ADDR, CMDLINE_MAX, GDT_ADDR, HIMEM_START, MPTABLE_ADDR, PVH_INFO_ADDR, PVH_MEMMAP_ADDR};

const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
const E820_RAM: u32 = 1;

#[derive(Debug, Error)]
pub enum BootError {
    #[error("cannot open the guest kernel {path}")]
    OpenKernel {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load the guest kernel {path}: {reason}")]
    LoadKernel { path: String, reason: String },
    #[error("the guest kernel {0} has no PVH entry point; rebuild it with CONFIG_PVH=y")]
    NoPvh(String),
    #[error("the kernel command line is {0} bytes, more than the {CMDLINE_MAX} the kernel accepts")]
    CmdlineTooLong(usize),
    #[error("cannot write boot data to guest memory")]
    Memory(#[source] vm_memory::GuestMemoryError),
    #[error("cannot write the PVH boot parameters: {0}")]
    Params(String),
}

/// Where the boot vCPU starts.
pub struct BootEntry {
    pub entry: GuestAddress,
}

/// Loads everything the guest needs to boot and returns its entry point.
pub fn load(mem: &GuestMemoryMmap, kernel: &Path, cmdline: &str, ram: &[(u64, u64)]) -> Result<BootEntry, BootError> {
    let path = kernel.display().to_string();
    let mut file = File::open(kernel).map_err(|source| BootError::OpenKernel { path: path.clone(), source })?;
    let loaded = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
        .map_err(|e| BootError::LoadKernel { path: path.clone(), reason: e.to_string() })?;
    let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
        return Err(BootError::NoPvh(path));
    };

    let mut cmd = cmdline.as_bytes().to_vec();
    if cmd.len() + 1 > CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong(cmd.len()));
    }
    cmd.push(0);
    mem.write_slice(&cmd, GuestAddress(CMDLINE_ADDR)).map_err(BootError::Memory)?;

    let mut memmap = vec![hvm_memmap_table_entry { addr: 0, size: MPTABLE_ADDR, type_: E820_RAM, reserved: 0 }];
    for &(base, len) in ram {
        let start = base.max(HIMEM_START);
        let end = base + len;
        if end > start {
            memmap.push(hvm_memmap_table_entry { addr: start, size: end - start, type_: E820_RAM, reserved: 0 });
        }
    }
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: u32::try_from(memmap.len()).map_err(|_| BootError::Params("memory map too long".into()))?,
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, GuestAddress(PVH_INFO_ADDR));
    params.set_sections(&memmap, GuestAddress(PVH_MEMMAP_ADDR));
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)
        .map_err(|e| BootError::Params(e.to_string()))?;

    write_gdt(mem)?;
    debug_assert!(mem.address_in_range(entry));
    Ok(BootEntry { entry })
}

/// Flat 4 GiB segments: null, code, data, TSS.
const GDT: [u64; 4] = [0, 0x00cf_9b00_0000_ffff, 0x00cf_9300_0000_ffff, 0x008b_0000_0000_0067];
const CODE_SELECTOR: u16 = 0x08;
const DATA_SELECTOR: u16 = 0x10;
const TSS_SELECTOR: u16 = 0x18;

fn write_gdt(mem: &GuestMemoryMmap) -> Result<(), BootError> {
    let bytes: Vec<u8> = GDT.iter().flat_map(|e| e.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(GDT_ADDR)).map_err(BootError::Memory)
}

fn segment(selector: u16, type_: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// The boot vCPU's special registers for the PVH entry.
pub fn pvh_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    sregs.cs = segment(CODE_SELECTOR, 0xb);
    let data = segment(DATA_SELECTOR, 0x3);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment { s: 0, limit: 0x67, g: 0, db: 0, ..segment(TSS_SELECTOR, 0xb) };
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = u16::try_from(GDT.len() * 8 - 1).expect("a GDT of a few entries");
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    // Protected mode (PE) with the FPU present (ET); no paging, no long mode.
    sregs.cr0 = 0x11;
    sregs.cr4 = 0;
    sregs.efer = 0;
    sregs
}

/// The boot vCPU's general registers for the PVH entry.
pub fn pvh_regs(entry: GuestAddress) -> kvm_regs {
    kvm_regs { rip: entry.0, rbx: PVH_INFO_ADDR, rflags: 0x2, ..Default::default() }
}
