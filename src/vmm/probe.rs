//! A tiny guest that proves KVM executes guest code here: four real-mode
//! instructions that write a byte to an I/O port and halt. `doctor` runs it;
//! it needs no kernel and finishes in milliseconds on working KVM.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};

/// Where the probe's code sits in guest-physical memory.
const CODE_ADDR: u64 = 0x1000;
const MEM_SIZE: usize = 0x1000;
/// The port and byte the probe writes; any value works, these are recognisable.
const PROBE_PORT: u16 = 0x3f8;
const PROBE_BYTE: u8 = b'K';
/// mov dx, 0x3f8; mov al, 'K'; out dx, al; hlt
const CODE: [u8; 7] = [0xba, 0xf8, 0x03, 0xb0, PROBE_BYTE, 0xee, 0xf4];
/// More exits than this means the guest is not doing what we wrote.
const MAX_EXITS: usize = 16;

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("cannot open /dev/kvm")]
    Open(#[source] kvm_ioctls::Error),
    #[error("cannot create a VM")]
    CreateVm(#[source] kvm_ioctls::Error),
    #[error("cannot allocate guest memory")]
    Memory(#[source] vm_memory::mmap::FromRangesError),
    #[error("cannot write guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
    #[error("cannot register guest memory with KVM")]
    SetMemory(#[source] kvm_ioctls::Error),
    #[error("cannot create a vCPU")]
    CreateVcpu(#[source] kvm_ioctls::Error),
    #[error("cannot set vCPU registers")]
    Registers(#[source] kvm_ioctls::Error),
    #[error("KVM_RUN failed")]
    Run(#[source] kvm_ioctls::Error),
    #[error("the guest stopped with an unexpected exit: {0}")]
    UnexpectedExit(String),
    #[error("the guest did not halt within {0:?}")]
    Timeout(Duration),
}

/// What the probe saw.
#[derive(Debug)]
pub struct ProbeOutcome {
    pub elapsed: Duration,
    /// VM exits the guest took (two when KVM works: the port write and the halt).
    pub exits: usize,
}

/// Runs the probe guest on its own thread and gives up after `timeout` (a
/// stuck KVM_RUN cannot be interrupted from here; the thread is left behind
/// and dies with the process).
pub fn run_with_timeout(timeout: Duration) -> Result<ProbeOutcome, ProbeError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("kvm-probe".into())
        .spawn(move || {
            let _ = tx.send(run());
        })
        .map_err(|e| ProbeError::UnexpectedExit(format!("cannot start probe thread: {e}")))?;
    rx.recv_timeout(timeout).unwrap_or(Err(ProbeError::Timeout(timeout)))
}

fn run() -> Result<ProbeOutcome, ProbeError> {
    let start = Instant::now();
    // Declared before the VM so that it is dropped after it: the mapping must
    // outlive every use KVM can make of it.
    let mem: GuestMemoryMmap<()> =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(CODE_ADDR), MEM_SIZE)]).map_err(ProbeError::Memory)?;
    let kvm = Kvm::new().map_err(ProbeError::Open)?;
    let vm = kvm.create_vm().map_err(ProbeError::CreateVm)?;
    mem.write_slice(&CODE, GuestAddress(CODE_ADDR)).map_err(ProbeError::Write)?;
    let host_addr = mem.get_host_address(GuestAddress(CODE_ADDR)).map_err(ProbeError::Write)?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: CODE_ADDR,
        memory_size: MEM_SIZE as u64,
        userspace_addr: host_addr as u64,
    };
    // SAFETY: the region is exactly `mem`'s anonymous mapping (MEM_SIZE bytes
    // at host_addr), which stays mapped until after `vm` and its vCPU are
    // dropped, so the guest can only ever touch memory we own.
    unsafe { vm.set_user_memory_region(region) }.map_err(ProbeError::SetMemory)?;

    let mut vcpu = vm.create_vcpu(0).map_err(ProbeError::CreateVcpu)?;
    let mut sregs = vcpu.get_sregs().map_err(ProbeError::Registers)?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(ProbeError::Registers)?;
    let mut regs = vcpu.get_regs().map_err(ProbeError::Registers)?;
    regs.rip = CODE_ADDR;
    regs.rflags = 0x2;
    vcpu.set_regs(&regs).map_err(ProbeError::Registers)?;

    let mut wrote = false;
    for exits in 1..=MAX_EXITS {
        match vcpu.run().map_err(ProbeError::Run)? {
            VcpuExit::IoOut(port, data) if port == PROBE_PORT && data == [PROBE_BYTE] => {
                wrote = true;
            }
            VcpuExit::Hlt if wrote => {
                return Ok(ProbeOutcome { elapsed: start.elapsed(), exits });
            }
            other => return Err(ProbeError::UnexpectedExit(format!("{other:?}"))),
        }
    }
    Err(ProbeError::UnexpectedExit(format!("more than {MAX_EXITS} exits for a four-instruction guest")))
}
