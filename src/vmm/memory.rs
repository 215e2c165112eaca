//! Guest RAM: anonymous private mappings, touched lazily (MAP_NORESERVE), so
//! a 2 GiB guest costs only what it uses.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("cannot map {0} bytes of guest memory")]
    Map(u64, #[source] vm_memory::mmap::FromRangesError),
    #[error("cannot register guest memory with KVM")]
    Register(#[source] kvm_ioctls::Error),
}

/// Maps guest RAM for the given (base, length) ranges.
pub fn create(ranges: &[(u64, u64)]) -> Result<GuestMemoryMmap, MemoryError> {
    let total = ranges.iter().map(|r| r.1).sum();
    let regions: Vec<(GuestAddress, usize)> = ranges
        .iter()
        .map(|&(base, len)| (GuestAddress(base), len as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&regions).map_err(|e| MemoryError::Map(total, e))
}

/// Tells KVM where each region lives in our address space.
pub fn register(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), MemoryError> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| MemoryError::Register(kvm_ioctls::Error::new(libc::EFAULT)))?;
        let desc = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: `desc` covers exactly one region of `mem`, a mapping owned by
        // the GuestMemoryMmap that the VMM keeps alive until the process
        // exits, so KVM never sees memory that is unmapped or reused.
        unsafe { vm.set_user_memory_region(desc) }.map_err(MemoryError::Register)?;
    }
    Ok(())
}
