//! Free space where sessions live: scratch disks and change sets grow there.

use std::path::{Path, PathBuf};

/// Free bytes available to this user on the filesystem holding `path`, found
/// through the nearest existing ancestor (the data dir may not exist yet).
pub fn available_bytes(path: &Path) -> std::io::Result<(PathBuf, u64)> {
    let mut probe = path.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            probe = PathBuf::from("/");
            break;
        }
    }
    let stat = nix::sys::statvfs::statvfs(&probe).map_err(std::io::Error::from)?;
    let bytes = stat.blocks_available().saturating_mul(stat.fragment_size());
    Ok((probe, bytes))
}

/// Free bytes available to this user and the size, in bytes, of the
/// filesystem holding `path` (which must exist).
pub fn filesystem(path: &Path) -> std::io::Result<(u64, u64)> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    let available = stat.blocks_available().saturating_mul(stat.fragment_size());
    let total = stat.blocks().saturating_mul(stat.fragment_size());
    Ok((available, total))
}

/// The free space staging a change set must leave on the data directory's
/// filesystem: 1 GiB, what the host needs to keep working (and what `doctor`
/// asks for), or 5% of a filesystem smaller than 20 GiB, so a small one is
/// still usable. A change set that would go below it is refused; the
/// guest's changes stay on the run's scratch disk.
pub fn staging_margin(filesystem_size: u64) -> u64 {
    (filesystem_size / 20).min(1 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_margin_is_a_gib_or_five_percent_of_a_small_filesystem() {
        assert_eq!(staging_margin(1 << 40), 1 << 30);
        assert_eq!(staging_margin(100 << 20), 5 << 20);
    }

    #[test]
    fn walks_up_to_an_existing_directory() {
        let (found, bytes) = available_bytes(Path::new("/nonexistent/a/b")).unwrap();
        assert_eq!(found, PathBuf::from("/"));
        assert!(bytes > 0);
    }
}
