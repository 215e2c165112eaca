//! How far the guest may grow a writable share on the host: never into the
//! free-space margin of the share's filesystem (the one staging keeps, see
//! `util::space::staging_margin`), and, for a share with a limit (an
//! agent's state), never past that limit.
//!
//! Growth is counted by logical size, so a sparse file costs what it could
//! come to hold, and each new name costs [`ENTRY_COST`]. Freeing space is
//! not counted as it happens: when the count reaches the limit, the share
//! is measured again (at most once every [`REMEASURE_EVERY`]; the files
//! removed while still open, which no name leads the walk to, added) and
//! only a share still over it refuses the growth, with ENOSPC.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag, fstatat};
use nix::sys::statvfs::fstatvfs;

/// What a name costs besides its file's bytes: an inode, a directory
/// entry, a block for a directory or a symlink's target.
pub const ENTRY_COST: u64 = 4096;
/// How often a share at its limit is measured again: a walk of the whole
/// share, which a guest hovering at the limit should not get on every write.
const REMEASURE_EVERY: Duration = Duration::from_secs(1);
/// How much growth passes between looks at the free space: the margin is
/// overrun by at most this much (or a quarter of the margin, if smaller).
const SPACE_CHECK_EVERY: u64 = 8 << 20;
/// A measure goes no deeper than this, and looks at no more names: a share
/// beyond either counts as full.
const MAX_DEPTH: usize = 256;
const MAX_NAMES: u64 = 4_000_000;

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

/// The growth allowed to one writable share.
pub struct Budget {
    /// The share's root directory, to measure it and its filesystem.
    root: OwnedFd,
    limit: Option<u64>,
    /// Bytes the share holds, as last measured plus growth since.
    used: u64,
    measured: Instant,
    /// Free bytes its filesystem must keep.
    margin: u64,
    every: u64,
    /// Growth since the free space was last seen above the margin.
    unchecked: u64,
}

impl Budget {
    /// The budget of the share at `root`, bounded by `limit` if given;
    /// `margin` replaces the staging margin (tests).
    pub fn new(root: &Path, limit: Option<u64>, margin: Option<u64>) -> io::Result<Budget> {
        let root: OwnedFd = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(root)?.into();
        let stat = fstatvfs(&root).map_err(io::Error::from)?;
        let total = stat.blocks().saturating_mul(stat.fragment_size());
        let margin = margin.unwrap_or_else(|| crate::util::space::staging_margin(total));
        let every = SPACE_CHECK_EVERY.min(margin / 4).max(64 << 10);
        let used = match limit {
            Some(_) => measure(&root),
            None => 0,
        };
        // The first growth looks at the free space.
        Ok(Budget { root, limit, used, measured: Instant::now(), margin, every, unchecked: every })
    }

    /// Whether the share may grow by `bytes`; ENOSPC if not. Growth allowed
    /// is counted. A measure adds `detached`: the bytes of files removed
    /// while open, which no name leads it to.
    pub fn grow(&mut self, bytes: u64, detached: impl FnOnce() -> u64) -> io::Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if let Some(limit) = self.limit
            && self.used.saturating_add(bytes) > limit
        {
            if self.measured.elapsed() < REMEASURE_EVERY {
                return Err(enospc());
            }
            self.used = measure(&self.root).saturating_add(detached());
            self.measured = Instant::now();
            if self.used.saturating_add(bytes) > limit {
                return Err(enospc());
            }
        }
        self.unchecked = self.unchecked.saturating_add(bytes);
        if self.unchecked >= self.every || bytes >= self.every {
            let stat = fstatvfs(&self.root).map_err(io::Error::from)?;
            let available = stat.blocks_available().saturating_mul(stat.fragment_size());
            if available.saturating_sub(bytes) < self.margin {
                return Err(enospc());
            }
            self.unchecked = 0;
        }
        self.used = self.used.saturating_add(bytes);
        Ok(())
    }
}

/// What the tree under `root` costs: [`ENTRY_COST`] a name, and each
/// regular file's logical size or allocation, whichever is larger. A tree
/// too deep or too wide to measure costs everything.
fn measure(root: &OwnedFd) -> u64 {
    let mut names = 0;
    match Dir::openat(root.as_fd(), ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(io::Error::from)
        .and_then(|dir| walk(dir, 0, &mut names))
    {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!("virtio-fs: cannot measure a writable share ({e}); it counts as full");
            u64::MAX
        }
    }
}

fn walk(mut dir: Dir, depth: usize, names: &mut u64) -> io::Result<u64> {
    let fd = dir.as_raw_fd();
    let mut bytes = 0u64;
    let mut subdirs = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(io::Error::from)?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        *names += 1;
        if *names > MAX_NAMES {
            return Err(io::Error::other("too many names"));
        }
        bytes = bytes.saturating_add(ENTRY_COST);
        // SAFETY: `fd` is the open directory `dir`, alive for this loop.
        let dir_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let stat = match fstatat(dir_fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Gone since it was listed.
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFREG {
            let allocated = u64::try_from(stat.st_blocks).unwrap_or(0).saturating_mul(512);
            bytes = bytes.saturating_add(u64::try_from(stat.st_size).unwrap_or(0).max(allocated));
        } else if kind == SFlag::S_IFDIR || entry.file_type() == Some(Type::Directory) {
            subdirs.push(name.to_owned());
        }
    }
    if !subdirs.is_empty() && depth >= MAX_DEPTH {
        return Err(io::Error::other("too deep"));
    }
    for name in subdirs {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        // SAFETY: as above.
        let dir_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        match Dir::openat(dir_fd, name.as_c_str(), flags, Mode::empty()) {
            Ok(sub) => bytes = bytes.saturating_add(walk(sub, depth + 1, names)?),
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR | nix::errno::Errno::ELOOP) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(bytes)
}
