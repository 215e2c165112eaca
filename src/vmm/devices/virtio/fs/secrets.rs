//! The host's secrets under the shares (ssh host keys, shadow files; see
//! rootfs/host.toml), which the guest may see listed but never read, even
//! as root speaking FUSE itself: an open of one gets EACCES from the VMM,
//! whatever path, hard link or mount the guest reached it by.
//!
//! A secret is known by its host identity (device and inode, taken when
//! the VMM starts). [`Guard`] is a watch (see `watched`) on one share: each
//! inode a lookup or listing hands out that is a secret is remembered, and
//! opens of those inodes are refused. The guest can only name inodes the
//! filesystem handed out, so none slips past.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use fuse_backend_rs::api::filesystem::Entry;

use super::watched::Watch;

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

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The guard for one share.
    pub fn guard(&self) -> Guard {
        Guard { secrets: self.clone(), found: Mutex::default() }
    }
}

/// The secrets as one share's filesystem hands them out.
pub struct Guard {
    secrets: Secrets,
    /// The share's inodes that are secrets (inode numbers are each share's
    /// own).
    found: Mutex<HashSet<u64>>,
}

impl Guard {
    fn note(&self, entry: &Entry) {
        if entry.inode != 0 && self.secrets.ids.contains(&(entry.attr.st_dev, entry.attr.st_ino)) {
            self.found.lock().unwrap_or_else(|p| p.into_inner()).insert(entry.inode);
        }
    }
}

impl Watch for Guard {
    fn looked_up(&self, _parent: u64, _name: &[u8], result: &io::Result<Entry>) {
        if let Ok(entry) = result {
            self.note(entry);
        }
    }

    fn listed(&self, _parent: u64, _name: &[u8], entry: &Entry, _delivered: bool) {
        self.note(entry);
    }

    fn may_open(&self, inode: u64) -> io::Result<()> {
        if self.found.lock().unwrap_or_else(|p| p.into_inner()).contains(&inode) {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::time::Duration;

    use fuse_backend_rs::api::filesystem::{Context, FileSystem};

    use super::super::bounded::{BoundedFs, HandleCount, ROOT};
    use super::*;

    /// Attack: the guard remembers every node a lookup of a secret hands
    /// out and forgets none, while node ids are never reused: a guest that
    /// looks a secret up and forgets it in a loop grows the VMM's memory
    /// without bound (the sightings record bounds the same loop).
    #[test]
    fn attack_looking_a_secret_up_and_forgetting_it_grows_the_guard_without_bound() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("host_key"), b"HOST-PRIVATE-KEY").unwrap();
        let secrets = Secrets::at(&[dir.path().join("host_key")]);
        let fs = BoundedFs::new(dir.path(), 16, &HandleCount::default(), 16, Duration::ZERO).unwrap();
        // What `Watched` tells the guard of each request, as it does.
        let guard = secrets.guard();
        let ctx = Context::default();
        let name = CString::new("host_key").unwrap();
        const ROUNDS: usize = 10_000;
        let mut nodes = HashSet::new();
        for _ in 0..ROUNDS {
            let looked_up = fs.lookup(&ctx, ROOT, &name);
            guard.looked_up(ROOT, name.as_bytes(), &looked_up);
            let inode = looked_up.unwrap().inode;
            nodes.insert(inode);
            assert!(guard.may_open(inode).is_err(), "the secret stays closed");
            guard.forgot(inode, 1);
            fs.forget(&ctx, inode, 1);
        }
        assert_eq!(nodes.len(), ROUNDS, "each lookup after a forget is a new node");
        let remembered = guard.found.lock().unwrap().len();
        assert!(
            remembered <= 16,
            "the guard holds {remembered} node ids after {ROUNDS} lookups of one secret the guest no longer holds"
        );
    }
}
