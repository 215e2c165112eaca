//! The host's secrets under the shares (ssh host keys, shadow files; see
//! rootfs/host.toml), which the guest may see listed but never read, even
//! as root speaking FUSE itself: an open of one gets EACCES from the VMM,
//! whatever path, hard link or mount the guest reached it by.
//!
//! A secret is known by its host identity (device and inode, taken when
//! the VMM starts) and by its place: the identity of the directory it is
//! in and its name there. The place keeps a secret the host replaces
//! during a run (passwd rewrites /etc/shadow by rename, ssh-keygen writes
//! new host keys) a secret, and one created during the run as well. The
//! read-only shares' filesystem (`bounded`) knows the identity and names of
//! every node it holds and refuses the content of those that are secrets
//! where it opens them, whatever node id the guest names.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::util::text::wildcard_match;

/// A host file's or directory's identity: (device, inode).
type Identity = (u64, u64);

/// The host identities and places of the secrets.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    ids: Arc<HashSet<Identity>>,
    /// The names of secrets in a directory, by the directory's identity.
    places: Arc<HashMap<Identity, Vec<Vec<u8>>>>,
}

impl Secrets {
    /// The secrets at `paths` on the host (symlinks followed). A path that
    /// does not exist is a secret if it comes to exist in a directory that
    /// does; one whose file name holds `*` wildcards (a hide pattern),
    /// each file whose name it matches there, whenever it comes to be.
    pub fn at(paths: &[PathBuf]) -> Secrets {
        let ids = paths.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| (m.dev(), m.ino())).collect();
        let mut places: HashMap<_, Vec<_>> = HashMap::new();
        for (dir, name) in paths.iter().filter_map(|p| place(p)) {
            places.entry(dir).or_default().push(name);
        }
        Secrets { ids: Arc::new(ids), places: Arc::new(places) }
    }

    /// Whether the host file `ino` on device `dev` is a secret.
    pub fn holds(&self, dev: u64, ino: u64) -> bool {
        self.ids.contains(&(dev, ino))
    }

    /// Whether `name` in the host directory `ino` on device `dev` is where
    /// a secret is: a name given, or one a given name with `*` wildcards
    /// matches.
    pub fn placed(&self, dev: u64, ino: u64, name: &CStr) -> bool {
        self.places.get(&(dev, ino)).is_some_and(|names| names.iter().any(|n| wildcard_match(n, name.to_bytes())))
    }
}

/// The directory identity and name `path` leads to, symlinks followed
/// (those of the directory even when the file itself does not exist).
fn place(path: &Path) -> Option<(Identity, Vec<u8>)> {
    let resolved = std::fs::canonicalize(path).ok().or_else(|| {
        let parent = std::fs::canonicalize(path.parent()?).ok()?;
        Some(parent.join(path.file_name()?))
    })?;
    let name: &OsStr = resolved.file_name()?;
    let dir = std::fs::metadata(resolved.parent()?).ok()?;
    Some(((dir.dev(), dir.ino()), name.as_bytes().to_vec()))
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
