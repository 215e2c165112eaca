//! Whether the host touched a path after the guest saw it (judged by what
//! the host's file server recorded of the guest's lookups, never by what the
//! guest says it saw), whether the host already holds what an entry wants,
//! and, for sets the host built itself, whether the host still holds the
//! entry's base. `stat` decides first; content is hashed only when sizes and
//! types agree.

use std::fmt;
use std::io;
use std::os::fd::AsFd;

use nix::sys::stat::FileStat;

use super::dirfd::{self, FileType};
use super::seen::{Seen, SessionChange};
use super::tree;
use crate::protocol::change_set::entry::{Base, Kind, Mode, SymlinkTarget};
use crate::protocol::change_set::path::RelPath;
use crate::util::digest::{Hasher, Sha256};

/// Why a change is not applied without being forced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictReason {
    /// The host's state differs from what the guest saw when it exported.
    Changed { guest_saw: String, host_has: String },
    /// Something below a directory the change would remove differs from
    /// what the guest saw.
    TreeChanged,
    /// The host touched `path` (the entry's own path, or one below it)
    /// after the guest saw it.
    Session { path: RelPath, change: SessionChange },
    /// The host's state could not be read.
    Unreadable(String),
}

impl fmt::Display for ConflictReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConflictReason::Changed { guest_saw, host_has } => {
                write!(
                    f,
                    "changed on the host since the guest saw it (the guest saw {guest_saw}, the host has {host_has})"
                )
            }
            ConflictReason::TreeChanged => f.write_str("files below it changed on the host since the guest saw them"),
            ConflictReason::Session { path, change } => {
                let what = match change {
                    SessionChange::Created => "created on the host after the guest looked for it",
                    SessionChange::Edited => "changed on the host after the guest saw it",
                    SessionChange::Deleted => "deleted on the host after the guest saw it",
                };
                write!(f, "{path} was {what}")
            }
            ConflictReason::Unreadable(e) => write!(f, "cannot inspect it on the host: {e}"),
        }
    }
}

/// The host's current state at one path: its directory, name and `lstat`.
pub struct HostPath<'a, D: AsFd> {
    pub dir: &'a D,
    pub name: &'a [u8],
    pub stat: Option<FileStat>,
}

impl<D: AsFd> HostPath<'_, D> {
    pub fn file_type(&self) -> Option<FileType> {
        self.stat.as_ref().map(FileType::of)
    }

    fn mode(&self) -> Mode {
        Mode::from_raw(self.stat.as_ref().map_or(0, |s| s.st_mode))
    }

    fn size(&self) -> u64 {
        self.stat.as_ref().map_or(0, |s| u64::try_from(s.st_size).unwrap_or(0))
    }

    fn hash(&self) -> io::Result<Sha256> {
        let file = dirfd::open_file(self.dir, self.name)?;
        // The name may have been replaced since the stat; hash what we stat'ed.
        let meta = std::os::unix::fs::MetadataExt::ino(&file.metadata()?);
        if Some(meta) != self.stat.as_ref().map(|s| s.st_ino) {
            return Err(io::Error::other("replaced while being read"));
        }
        Hasher::of_reader(file)
    }

    fn link_target(&self) -> io::Result<Vec<u8>> {
        dirfd::read_link(self.dir, self.name)
    }

    pub(crate) fn describe(&self) -> String {
        match self.file_type() {
            None => "nothing".into(),
            Some(FileType::File) => format!("a file of {} bytes, mode {}", self.size(), self.mode()),
            Some(FileType::Dir) => format!("a directory, mode {}", self.mode()),
            Some(FileType::Symlink) => match self.link_target() {
                Ok(t) => format!("a symlink to {}", crate::util::text::display_bytes(&t)),
                Err(_) => "a symlink".into(),
            },
            Some(FileType::Special) => "a special file".into(),
        }
    }

    /// A file with exactly this mode and content.
    fn is_file(&self, mode: Mode, size: u64, sha256: &Sha256) -> Result<bool, ConflictReason> {
        if self.file_type() != Some(FileType::File) || self.size() != size || self.mode() != mode {
            return Ok(false);
        }
        Ok(self.hash().map_err(|e| ConflictReason::Unreadable(e.to_string()))? == *sha256)
    }

    fn is_symlink_to(&self, target: &[u8]) -> Result<bool, ConflictReason> {
        if self.file_type() != Some(FileType::Symlink) {
            return Ok(false);
        }
        Ok(self.link_target().map_err(|e| ConflictReason::Unreadable(e.to_string()))? == target)
    }

    /// What the host holds here, completely for a file (mode and content)
    /// and a symlink; for a directory its mode (a digest of what is below
    /// is the caller's to add).
    pub fn state(&self) -> io::Result<Base> {
        Ok(match self.file_type() {
            None => Base::Absent,
            Some(FileType::File) => Base::File { mode: self.mode(), size: self.size(), sha256: self.hash()? },
            Some(FileType::Symlink) => {
                Base::Symlink { target: SymlinkTarget::new(self.link_target()?).map_err(io::Error::other)? }
            }
            Some(FileType::Dir) => Base::Dir { mode: self.mode(), tree: None },
            Some(FileType::Special) => Base::Special,
        })
    }

    /// Whether the host still holds what the guest saw.
    pub fn check_base(&self, base: &Base) -> Result<(), ConflictReason> {
        let same = match base {
            Base::Absent => self.stat.is_none(),
            Base::File { mode, size, sha256 } => self.is_file(*mode, *size, sha256)?,
            Base::Symlink { target } => self.is_symlink_to(target.as_bytes())?,
            Base::Dir { mode, tree } => {
                if self.file_type() != Some(FileType::Dir) || self.mode() != *mode {
                    false
                } else if let Some(expected) = tree {
                    let now =
                        tree::digest_at(self.dir, self.name).map_err(|e| ConflictReason::Unreadable(e.to_string()))?;
                    if now != *expected {
                        return Err(ConflictReason::TreeChanged);
                    }
                    true
                } else {
                    true
                }
            }
            Base::Special => self.file_type() == Some(FileType::Special),
        };
        if same {
            Ok(())
        } else {
            Err(ConflictReason::Changed { guest_saw: describe_base(base), host_has: self.describe() })
        }
    }

    /// Whether the host has the kind of thing the base names (nothing, a
    /// file, a directory...). Review shows a change by its base (added,
    /// modified, a new directory), so apply must not do more than that shows:
    /// a file shown as added never replaces a host file, nor a "modified"
    /// file a host directory. Only the kind is compared: the base's content,
    /// mode and tree digest are the guest's word and decide nothing.
    pub fn check_base_kind(&self, base: &Base) -> Result<(), ConflictReason> {
        let named = match base {
            Base::Absent => None,
            Base::File { .. } => Some(FileType::File),
            Base::Symlink { .. } => Some(FileType::Symlink),
            Base::Dir { .. } => Some(FileType::Dir),
            Base::Special => Some(FileType::Special),
        };
        if named == self.file_type() {
            Ok(())
        } else {
            Err(ConflictReason::Changed { guest_saw: describe_base(base), host_has: self.describe() })
        }
    }

    /// Whether the host already holds what the entry wants (nothing to do).
    /// A mode change is there when the host's file has that mode; given the
    /// base (a set the host built), also its content.
    pub fn reached(&self, kind: &Kind, base: Option<&Base>) -> bool {
        let yes = |r: Result<bool, ConflictReason>| r.unwrap_or(false);
        match kind {
            Kind::File { mode, size, sha256 } => yes(self.is_file(*mode, *size, sha256)),
            Kind::Dir { mode } => self.file_type() == Some(FileType::Dir) && self.mode() == *mode,
            // Only the apply itself can tell what a replaced directory holds.
            Kind::OpaqueDir { .. } => false,
            Kind::Symlink { target } => yes(self.is_symlink_to(target.as_bytes())),
            Kind::Delete => self.stat.is_none(),
            Kind::Mode { mode } => match base {
                Some(Base::File { size, sha256, .. }) => yes(self.is_file(*mode, *size, sha256)),
                Some(_) => false,
                None => self.file_type() == Some(FileType::File) && self.mode() == *mode,
            },
        }
    }

    /// Whether the host touched this path, or (for changes that remove a
    /// directory) anything below it, after the guest saw it.
    pub fn check_session(&self, seen: &Seen, path: &RelPath, kind: &Kind) -> Result<(), ConflictReason> {
        if let Some(change) = seen.change(path, self.stat.as_ref()) {
            return Err(ConflictReason::Session { path: path.clone(), change });
        }
        let removes_below = !matches!(kind, Kind::Dir { .. } | Kind::Mode { .. });
        if removes_below && self.file_type() == Some(FileType::Dir) {
            match seen.tree_change(self.dir, self.name, path) {
                Ok(Some((below, change))) => return Err(ConflictReason::Session { path: below, change }),
                Ok(None) => {}
                Err(e) => return Err(ConflictReason::Unreadable(e.to_string())),
            }
        }
        Ok(())
    }
}

pub(crate) fn describe_base(base: &Base) -> String {
    match base {
        Base::Absent => "nothing".into(),
        Base::File { mode, size, .. } => format!("a file of {size} bytes, mode {mode}"),
        Base::Symlink { target } => format!("a symlink to {target}"),
        Base::Dir { mode, .. } => format!("a directory, mode {mode}"),
        Base::Special => "a special file".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::protocol::change_set::entry::TreeDigest;

    fn host<'a>(dir: &'a fs::File, name: &'a str) -> HostPath<'a, fs::File> {
        let stat = dirfd::stat_at(dir, name.as_bytes()).unwrap();
        HostPath { dir, name: name.as_bytes(), stat }
    }

    #[test]
    fn base_comparison_by_stat_then_content() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("f"), b"abc").unwrap();
        let dir = fs::File::open(tmp.path()).unwrap();
        let mode = Mode::from_raw(fs::metadata(tmp.path().join("f")).unwrap().permissions().mode_bits());
        let base = Base::File { mode, size: 3, sha256: Sha256::of(b"abc") };
        assert_eq!(host(&dir, "f").check_base(&base), Ok(()));

        fs::write(tmp.path().join("f"), b"abd").unwrap();
        let err = host(&dir, "f").check_base(&base).unwrap_err();
        assert!(matches!(err, ConflictReason::Changed { .. }), "{err}");
        assert!(host(&dir, "missing").check_base(&base).is_err());
        assert_eq!(host(&dir, "missing").check_base(&Base::Absent), Ok(()));
        assert!(host(&dir, "f").check_base(&Base::Absent).is_err());
    }

    #[test]
    fn a_directory_base_with_a_digest_sees_changes_below() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("d")).unwrap();
        fs::write(tmp.path().join("d/x"), b"1").unwrap();
        let dir = fs::File::open(tmp.path()).unwrap();
        let digest: TreeDigest = tree::digest_at(&dir, b"d").unwrap();
        let mode = Mode::from_raw(fs::metadata(tmp.path().join("d")).unwrap().permissions().mode_bits());
        let base = Base::Dir { mode, tree: Some(digest) };
        assert_eq!(host(&dir, "d").check_base(&base), Ok(()));
        fs::write(tmp.path().join("d/y"), b"2").unwrap();
        assert_eq!(host(&dir, "d").check_base(&base), Err(ConflictReason::TreeChanged));
    }

    trait ModeBits {
        fn mode_bits(&self) -> u32;
    }

    impl ModeBits for fs::Permissions {
        fn mode_bits(&self) -> u32 {
            std::os::unix::fs::PermissionsExt::mode(self)
        }
    }
}
