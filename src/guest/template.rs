//! The init's side of templates (see `protocol::template`): the point where
//! a template may be recorded, and what a run takes from the host after it
//! so that no two runs from one template share a clock or random state.

use std::os::fd::AsRawFd;

use anyhow::Context;

use crate::protocol::RunSpec;
use crate::protocol::template::{POINT_PORT, POINT_VALUE, RECORDING_ARG};

/// RNDADDENTROPY: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// RNDRESEEDCRNG: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
/// BLKFLSBUF: `_IO(0x12, 97)`.
const BLKFLSBUF: libc::c_ulong = 0x1261;

/// Tells the VMM that the guest is at its template point. A VMM that is not
/// recording ignores the write; one that is saves the VM here, and every run
/// restored from that template resumes right after this call.
pub fn point() {
    if recording() {
        page_in_own_image();
    }
    // SAFETY: ioperm only changes this process's I/O permission bitmap, for
    // one port that no guest device uses.
    if unsafe { libc::ioperm(libc::c_ulong::from(POINT_PORT), 1, 1) } != 0 {
        // Without the permission the write would fault; the run still works,
        // only no template is recorded.
        eprintln!("stockade-init: cannot reach the template port: {}", std::io::Error::last_os_error());
        return;
    }
    // SAFETY: a one-byte port write, permitted by the ioperm above; it has
    // no effect on this process's memory.
    unsafe {
        std::arch::asm!("out dx, al", in("dx") POINT_PORT, in("al") POINT_VALUE, options(nomem, nostack, preserves_flags));
    }
    // SAFETY: drops the permission again; nothing else in the guest needs it.
    unsafe { libc::ioperm(libc::c_ulong::from(POINT_PORT), 1, 0) };
}

/// Whether this boot records a template (the VMM says so on the kernel's
/// command line).
fn recording() -> bool {
    std::fs::read_to_string("/proc/cmdline").is_ok_and(|line| line.split_whitespace().any(|a| a == RECORDING_ARG))
}

/// Pages the init's own read-only mappings (code and constants) in from the
/// boot share and maps them, so that the template holds them: otherwise each
/// run resumed from it pages them in again, a round trip to the host at a
/// time, as its code first runs. Best effort: a page left out is only slower.
fn page_in_own_image() {
    use std::os::unix::fs::MetadataExt;
    let (Ok(exe), Ok(maps)) = (std::fs::metadata("/proc/self/exe"), std::fs::read_to_string("/proc/self/maps")) else {
        return;
    };
    for line in maps.lines() {
        // start-end, permissions, offset, device, inode, path.
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(inode)) = (fields.next(), fields.next(), fields.nth(2)) else {
            continue;
        };
        // Writable mappings are private copies, resident already.
        if inode.parse::<u64>().ok() != Some(exe.ino()) || perms.contains('w') {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else {
            continue;
        };
        // SAFETY: MADV_POPULATE_READ only faults in pages of a mapping this
        // process has; it changes no contents and no protections.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_READ) };
    }
}

/// Sets the clock from the host and mixes the host's entropy into the
/// random pool, forcing a reseed, before anything of the run draws from it.
pub fn adopt_host(spec: &RunSpec) -> anyhow::Result<()> {
    if let Some(clock) = spec.clock {
        let time = libc::timespec { tv_sec: clock.secs, tv_nsec: libc::c_long::from(clock.nanos) };
        // SAFETY: clock_settime reads the timespec we pass and nothing else.
        if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &time) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot set the guest clock");
        }
    }
    if !spec.seed.is_empty() {
        let random = std::fs::File::open("/dev/urandom").context("cannot open /dev/urandom")?;
        let len = i32::try_from(spec.seed.len()).context("the host's seed is too long")?;
        // struct rand_pool_info: entropy bits, buffer size, then the bytes.
        let mut info = Vec::with_capacity(8 + spec.seed.len());
        info.extend_from_slice(&(len * 8).to_ne_bytes());
        info.extend_from_slice(&len.to_ne_bytes());
        info.extend_from_slice(&spec.seed);
        // SAFETY: RNDADDENTROPY reads a rand_pool_info of the size its
        // header gives, which is exactly `info`.
        if unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot add the host's entropy");
        }
        // SAFETY: RNDRESEEDCRNG takes no argument.
        if unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot reseed the guest's random generator");
        }
    }
    Ok(())
}

/// Drops what the guest cached of `disk` before the template point (the
/// kernel reads each disk's first blocks when it finds it): this run's disk
/// is another file.
pub fn forget_cached_blocks(disk: &str) {
    if let Ok(dev) = std::fs::File::open(disk) {
        // SAFETY: BLKFLSBUF takes no argument; it only drops clean cache.
        unsafe { libc::ioctl(dev.as_raw_fd(), BLKFLSBUF) };
    }
}
