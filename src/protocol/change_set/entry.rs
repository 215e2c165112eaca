//! What a change set says: per workspace path, the new state (`Kind`) and what
//! the guest saw there in the read-only lower layer when it exported (`Base`),
//! which the host compares with its own state to find conflicts.
//!
//! The types make the rules structural: there is no kind for device nodes,
//! fifos or sockets, a `Mode` holds permission bits only (setuid, setgid and
//! sticky cannot be represented), and hard links do not exist (each path
//! carries its own content).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use super::path::{MAX_PATH, RelPath, escape, unescape};
use crate::util::digest::Sha256;
use crate::util::text::display_bytes;

/// Permission bits only: `rwxrwxrwx`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "u32", into = "u32")]
pub struct Mode(u32);

impl Mode {
    pub const MASK: u32 = 0o777;

    /// Keeps the permission bits of a raw `st_mode`; file type, setuid,
    /// setgid and sticky bits are dropped.
    pub fn from_raw(raw: u32) -> Mode {
        Mode(raw & Mode::MASK)
    }

    /// Whether `raw` carries bits that `from_raw` drops (besides the file type).
    pub fn strips(raw: u32) -> bool {
        raw & 0o7000 != 0
    }

    pub fn bits(self) -> u32 {
        self.0
    }
}

impl From<u32> for Mode {
    fn from(raw: u32) -> Mode {
        Mode::from_raw(raw)
    }
}

impl From<Mode> for u32 {
    fn from(m: Mode) -> u32 {
        m.0
    }
}

impl fmt::Debug for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:03o}", self.0)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:03o}", self.0)
    }
}

/// Why bytes are not an acceptable symlink target.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TargetError {
    #[error("a symlink target is empty")]
    Empty,
    #[error("a symlink target contains a NUL byte")]
    Nul,
    #[error("a symlink target is {0} bytes long; the limit is {MAX_PATH}")]
    TooLong(usize),
}

/// A symlink's target, verbatim. It may point anywhere, even outside the
/// workspace: it is only ever created as a link, never followed when writing.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SymlinkTarget(Vec<u8>);

impl SymlinkTarget {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<SymlinkTarget, TargetError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(TargetError::Empty);
        }
        if bytes.contains(&0) {
            return Err(TargetError::Nul);
        }
        if bytes.len() > MAX_PATH {
            return Err(TargetError::TooLong(bytes.len()));
        }
        Ok(SymlinkTarget(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for SymlinkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&display_bytes(&self.0))
    }
}

impl fmt::Debug for SymlinkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", display_bytes(&self.0))
    }
}

impl Serialize for SymlinkTarget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&escape(&self.0))
    }
}

impl<'de> Deserialize<'de> for SymlinkTarget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        let bytes = unescape(&text).map_err(serde::de::Error::custom)?;
        SymlinkTarget::new(bytes).map_err(serde::de::Error::custom)
    }
}

/// A summary of a directory tree's names, types, permission bits, and file
/// sizes and mtimes (see `tree.rs`); equal digests mean nobody added,
/// removed or edited anything below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeDigest {
    /// Entries below the directory, at any depth.
    pub entries: u64,
    pub sha256: Sha256,
}

/// What the lower (host) layer held at a path when the guest exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Base {
    Absent,
    File {
        mode: Mode,
        size: u64,
        sha256: Sha256,
    },
    Symlink {
        target: SymlinkTarget,
    },
    /// `tree` is present where the change would remove what is below (delete,
    /// opaque directory, a directory replaced by a file).
    Dir {
        mode: Mode,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tree: Option<TreeDigest>,
    },
    /// A device node, fifo or socket (which the change replaces or deletes).
    Special,
}

/// The new state of a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    /// A regular file; its content is the blob named by `sha256`.
    File {
        mode: Mode,
        size: u64,
        sha256: Sha256,
    },
    Dir {
        mode: Mode,
    },
    Symlink {
        target: SymlinkTarget,
    },
    /// The path and everything below it are removed.
    Delete,
    /// A directory whose previous contents are all removed; the set lists
    /// everything it now holds.
    OpaqueDir {
        mode: Mode,
    },
    /// Only the permission bits of an otherwise unchanged file.
    Mode {
        mode: Mode,
    },
}

impl Kind {
    /// A short word for summaries.
    pub fn word(&self) -> &'static str {
        match self {
            Kind::File { .. } => "file",
            Kind::Dir { .. } => "dir",
            Kind::Symlink { .. } => "symlink",
            Kind::Delete => "delete",
            Kind::OpaqueDir { .. } => "replaced dir",
            Kind::Mode { .. } => "mode",
        }
    }

    /// Whether entries may live below a path of this kind.
    pub fn holds_children(&self) -> bool {
        matches!(self, Kind::Dir { .. } | Kind::OpaqueDir { .. })
    }
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: RelPath,
    pub kind: Kind,
    pub base: Base,
}

/// Where a staged entry is in review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    Staged,
    Applied,
    Discarded,
}

/// A file the guest made that a change set cannot carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    /// A name the path rules reject (too long, for instance).
    BadName,
}

impl fmt::Display for SpecialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecialKind::Fifo => "fifo",
            SpecialKind::Socket => "socket",
            SpecialKind::CharDevice => "character device",
            SpecialKind::BlockDevice => "block device",
            SpecialKind::BadName => "unacceptable name",
        })
    }
}

/// A path the guest did not export, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Escaped bytes (see `RelPath::escaped`); not a `RelPath`, since a bad
    /// name is one reason to skip.
    pub path: String,
    pub what: SpecialKind,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_keeps_permission_bits_only() {
        assert_eq!(Mode::from_raw(0o104755).bits(), 0o755);
        assert_eq!(Mode::from_raw(0o6777).bits(), 0o777);
        assert!(Mode::strips(0o4755));
        assert!(!Mode::strips(0o100644));
        let m: Mode = serde_json::from_str("2541").unwrap(); // 0o4755
        assert_eq!(m.bits(), 0o755);
    }

    #[test]
    fn symlink_targets_are_verbatim_but_bounded() {
        assert!(SymlinkTarget::new(&b"/etc/passwd"[..]).is_ok());
        assert!(SymlinkTarget::new(&b"../../outside"[..]).is_ok());
        assert_eq!(SymlinkTarget::new(&b""[..]), Err(TargetError::Empty));
        assert_eq!(SymlinkTarget::new(&b"a\0b"[..]), Err(TargetError::Nul));
        assert!(matches!(SymlinkTarget::new(vec![b'a'; 5000]), Err(TargetError::TooLong(5000))));
    }

    #[test]
    fn entries_serialize_with_tags() {
        let e = Entry {
            path: RelPath::new(&b"src/main.rs"[..]).unwrap(),
            kind: Kind::File { mode: Mode::from_raw(0o644), size: 3, sha256: Sha256::of(b"abc") },
            base: Base::Absent,
        };
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""type":"file""#), "{json}");
        assert_eq!(serde_json::from_str::<Entry>(&json).unwrap(), e);
        // A device cannot be expressed.
        let dev = r#"{"path":"x","kind":{"type":"char_device","major":1},"base":{"type":"absent"}}"#;
        assert!(serde_json::from_str::<Entry>(dev).is_err());
    }
}
