//! A digest of a directory tree as `stat` shows it: every name below, its
//! type and permission bits, and for files and symlinks their size and
//! mtime. The guest computes it over the lower layer for what a change would
//! remove; the host recomputes it before removing, so a file the host added,
//! removed or edited meanwhile is a conflict, not a loss.
//!
//! Directory sizes and mtimes are left out: they change whenever something
//! is created and removed inside (an editor's swap file), which the names
//! already cover.

use std::os::fd::AsFd;

use nix::sys::stat::FileStat;

use super::dirfd::{self, FileType};
use crate::protocol::change_set::entry::TreeDigest;
use crate::util::digest::Hasher;

/// Digests the tree of the directory `name` in `parent`.
pub fn digest_at(parent: &impl AsFd, name: &[u8]) -> std::io::Result<TreeDigest> {
    let mut state = Digest { hasher: Hasher::default(), entries: 0, path: Vec::new() };
    state.walk(parent, name)?;
    Ok(TreeDigest { entries: state.entries, sha256: state.hasher.finish() })
}

struct Digest {
    hasher: Hasher,
    entries: u64,
    /// The path below the root being visited, `/`-separated.
    path: Vec<u8>,
}

impl Digest {
    fn walk(&mut self, parent: &impl AsFd, name: &[u8]) -> std::io::Result<()> {
        let mut dir = dirfd::open_dir(parent, name)?;
        for child in dirfd::list(&mut dir)? {
            let Some(stat) = dirfd::stat_at(&dir, &child)? else { continue };
            let len = self.path.len();
            if len > 0 {
                self.path.push(b'/');
            }
            self.path.extend_from_slice(&child);
            self.record(&stat);
            if FileType::of(&stat) == FileType::Dir {
                self.walk(&dir, &child)?;
            }
            self.path.truncate(len);
        }
        Ok(())
    }

    fn record(&mut self, stat: &FileStat) {
        self.entries += 1;
        let kind = FileType::of(stat);
        let (size, sec, nsec) = match kind {
            FileType::Dir => (0, 0, 0),
            _ => (stat.st_size, stat.st_mtime, stat.st_mtime_nsec),
        };
        let h = &mut self.hasher;
        h.update(&(self.path.len() as u64).to_le_bytes());
        h.update(&self.path);
        h.update(&[kind as u8]);
        h.update(&(stat.st_mode & 0o7777).to_le_bytes());
        h.update(&size.to_le_bytes());
        h.update(&sec.to_le_bytes());
        h.update(&nsec.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn digest(path: &std::path::Path) -> TreeDigest {
        let parent = fs::File::open(path.parent().unwrap()).unwrap();
        digest_at(&parent, path.file_name().unwrap().as_encoded_bytes()).unwrap()
    }

    #[test]
    fn changes_when_anything_below_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path().join("t");
        fs::create_dir_all(t.join("a/b")).unwrap();
        fs::write(t.join("a/b/f"), b"one").unwrap();
        std::os::unix::fs::symlink("/nowhere", t.join("link")).unwrap();
        let first = digest(&t);
        assert_eq!(first.entries, 4);
        assert_eq!(digest(&t), first, "stable when nothing changed");

        // A temporary file created and removed again leaves no trace.
        fs::write(t.join("a/.swp"), b"").unwrap();
        fs::remove_file(t.join("a/.swp")).unwrap();
        assert_eq!(digest(&t), first);

        fs::write(t.join("a/new"), b"").unwrap();
        let added = digest(&t);
        assert_ne!(added, first);
        fs::remove_file(t.join("a/new")).unwrap();

        fs::write(t.join("a/b/f"), b"two").unwrap(); // same size, new mtime
        let f = fs::File::options().write(true).open(t.join("a/b/f")).unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(12345)).unwrap();
        assert_ne!(digest(&t), first);
    }
}
