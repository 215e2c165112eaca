//! The host's secrets under the shares (ssh host keys, shadow files; see
//! rootfs/host.toml), which the guest may see listed but never read, even
//! as root speaking FUSE itself: an open of one gets EACCES from the VMM,
//! whatever path, hard link or mount the guest reached it by.
//!
//! A secret is known by its host identity (device and inode, taken when
//! the VMM starts). The read-only shares' filesystem (`bounded`) knows the
//! identity of every node it holds and refuses the content of those that
//! are secrets where it opens them, whatever node id the guest names.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The host identities (device, inode) of the secrets.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    ids: Arc<HashSet<(u64, u64)>>,
}

impl Secrets {
    /// The secrets at `paths` on the host (symlinks followed); paths that
    /// do not exist are no secret.
    pub fn at(paths: &[PathBuf]) -> Secrets {
        let ids = paths.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| (m.dev(), m.ino())).collect();
        Secrets { ids: Arc::new(ids) }
    }

    /// Whether the host file `ino` on device `dev` is a secret.
    pub fn holds(&self, dev: u64, ino: u64) -> bool {
        self.ids.contains(&(dev, ino))
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::time::Duration;

    use fuse_backend_rs::api::filesystem::{Context, FileSystem};

    use super::super::bounded::{BoundedFs, HandleCount, ROOT};
    use super::*;

    /// A guest that looks a secret up and forgets it in a loop gets the
    /// same node each time, refused each time, and leaves nothing behind:
    /// the refusal is the node's own identity, not a memory of node ids.
    #[test]
    fn looking_a_secret_up_and_forgetting_it_keeps_it_closed_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("host_key"), b"HOST-PRIVATE-KEY").unwrap();
        let secrets = Secrets::at(&[dir.path().join("host_key")]);
        let fs = BoundedFs::new(dir.path(), &secrets, 16, &HandleCount::default(), 16, Duration::ZERO).unwrap();
        let ctx = Context::default();
        let name = CString::new("host_key").unwrap();
        const ROUNDS: usize = 10_000;
        let mut nodes = HashSet::new();
        for _ in 0..ROUNDS {
            let inode = fs.lookup(&ctx, ROOT, &name).unwrap().inode;
            nodes.insert(inode);
            let open = fs.open(&ctx, inode, libc::O_RDONLY as u32, 0).map(|_| ());
            assert_eq!(open.map_err(|e| e.raw_os_error()), Err(Some(libc::EACCES)), "the secret stays closed");
            fs.forget(&ctx, inode, 1);
        }
        assert_eq!(nodes.len(), 1, "one file is one node, however often it is looked up");
        let node = nodes.into_iter().next().unwrap();
        assert!(fs.getattr(&ctx, node, None).is_err(), "a forgotten node is gone");
        assert!(fs.open(&ctx, node, libc::O_RDONLY as u32, 0).is_err());
    }
}
