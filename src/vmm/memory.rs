//! Guest RAM: anonymous private mappings, touched lazily (MAP_NORESERVE), so
//! a 2 GiB guest costs only what it uses.

use std::fs::File;
use std::os::fd::AsRawFd;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MmapRegion};

/// Guest RAM is mapped at 2 MiB-aligned host addresses and advised for
/// transparent huge pages, so that host and guest large pages line up: one
/// fault (and one EPT entry) maps 2 MiB instead of 4 KiB. Boot touches a lot
/// of fresh memory, and every fault is expensive under nested virtualization.
const HUGE_PAGE: usize = 2 << 20;

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("cannot map {0} bytes of guest memory")]
    Map(u64, #[source] std::io::Error),
    #[error("cannot describe guest memory")]
    Region(String),
    #[error("cannot register guest memory with KVM")]
    Register(#[source] kvm_ioctls::Error),
}

/// Maps guest RAM for the given (base, length) ranges.
pub fn create(ranges: &[(u64, u64)]) -> Result<GuestMemoryMmap, MemoryError> {
    map_ranges(ranges, None)
}

/// Maps guest RAM copy-on-write from `file`, which holds the ranges one
/// after another (a template's memory): pages load from it when the guest
/// first touches them, and the guest's writes stay in this process.
pub fn create_from(ranges: &[(u64, u64)], file: &File) -> Result<GuestMemoryMmap, MemoryError> {
    map_ranges(ranges, Some(file))
}

fn map_ranges(ranges: &[(u64, u64)], file: Option<&File>) -> Result<GuestMemoryMmap, MemoryError> {
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for &(base, len) in ranges {
        let size = usize::try_from(len).map_err(|_| MemoryError::Map(len, std::io::Error::other("too large")))?;
        let mut addr = map_aligned(size).map_err(|e| MemoryError::Map(len, e))?;
        if let Some(file) = file {
            addr = map_file_over(addr, size, file, offset).map_err(|e| MemoryError::Map(len, e))?;
        }
        offset += len;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: `addr` is a fresh private anonymous mapping of exactly
        // `size` bytes made by `map_aligned`, owned by nothing else; it is
        // never unmapped, so it outlives the region built on it.
        let mapping = unsafe { MmapRegion::build_raw(addr, size, prot, flags) }
            .map_err(|e| MemoryError::Region(e.to_string()))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(base))
            .ok_or_else(|| MemoryError::Region(format!("region at {base:#x} overflows")))?;
        regions.push(region);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Region(e.to_string()))
}

/// Maps `size` bytes of anonymous memory at a 2 MiB-aligned address and asks
/// for transparent huge pages. The mapping lives until the process exits.
fn map_aligned(size: usize) -> std::io::Result<*mut u8> {
    let reserve = size + HUGE_PAGE;
    // SAFETY: a new anonymous private mapping at an address of the kernel's
    // choosing; it aliases nothing.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let head = aligned - start;
    let tail = reserve - head - size;
    // SAFETY: both ranges lie inside the mapping just made and outside
    // [aligned, aligned + size), which is all we keep.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail);
        }
        // Advice only: without THP support the memory still works, in small pages.
        libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        // The guest's memory is the guest's: keep it out of a VMM core dump.
        libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_DONTDUMP);
    }
    Ok(aligned as *mut u8)
}

/// Replaces the anonymous mapping at `addr` with a private mapping of
/// `file` from `offset`.
fn map_file_over(addr: *mut u8, size: usize, file: &File, offset: u64) -> std::io::Result<*mut u8> {
    let offset = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    // SAFETY: MAP_FIXED over [addr, addr + size), the mapping `map_aligned`
    // just made for this region and that nothing references yet; the file
    // mapping is private, so guest writes never reach the file.
    let raw = unsafe {
        libc::mmap(
            addr.cast(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            offset,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: advice on the mapping just made.
    unsafe { libc::madvise(raw, size, libc::MADV_DONTDUMP) };
    Ok(raw.cast())
}

/// Tells KVM where each region lives in our address space.
pub fn register(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), MemoryError> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| MemoryError::Register(kvm_ioctls::Error::new(libc::EFAULT)))?;
        let desc = kvm_userspace_memory_region {
            slot: u32::try_from(slot).map_err(|_| MemoryError::Register(kvm_ioctls::Error::new(libc::EINVAL)))?,
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

#[cfg(test)]
mod tests {
    use vm_memory::GuestAddress;

    use super::*;

    /// The VmFlags of the mapping holding `addr`, from /proc/self/smaps.
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((start, end)) =
                range.and_then(|(s, e)| Some((usize::from_str_radix(s, 16).ok()?, usize::from_str_radix(e, 16).ok()?)))
            {
                inside = (start..end).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.trim().to_string());
            }
        }
        None
    }

    #[test]
    fn guest_memory_is_left_out_of_core_dumps() {
        let mem = create(&[(0, 4 << 20)]).unwrap();
        let host = mem.get_host_address(GuestAddress(0)).unwrap() as usize;
        assert_eq!(host % HUGE_PAGE, 0, "guest memory is 2 MiB aligned");
        let flags = vm_flags(host).expect("the guest memory's mapping in /proc/self/smaps");
        // "dd": do not include in a core dump (MADV_DONTDUMP).
        assert!(flags.split_whitespace().any(|f| f == "dd"), "VmFlags: {flags}");
    }
}
