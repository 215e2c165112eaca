//! The two sides of a change as review shows them: the host's current state
//! at a path (old) and what applying the staged entry makes of it (new).
//! Content is loaded up to a limit; beyond it a file is shown by size.

use std::io::Read;

use crate::changes::Store;
use crate::protocol::change_set::entry::{Entry, Kind, Mode};
use crate::util::digest::Sha256;

use crate::changes::{Host, HostState};

/// Files larger than this are not diffed on the terminal (size and hash only).
pub const DISPLAY_LIMIT: u64 = 8 << 20;
/// Git decides "binary" by a NUL byte in the first 8000 bytes; so do we, so
/// a patch we write and git's view of the same file agree.
const BINARY_PROBE: usize = 8000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileData {
    pub mode: Mode,
    pub size: u64,
    /// `None` when the file is over the load limit.
    pub bytes: Option<Vec<u8>>,
}

impl FileData {
    pub fn is_binary(&self) -> bool {
        self.bytes.as_deref().is_some_and(is_binary)
    }

    pub fn is_executable(&self) -> bool {
        self.mode.bits() & 0o111 != 0
    }

    /// SHA-256 of the content, when loaded.
    pub fn sha256(&self) -> Option<Sha256> {
        self.bytes.as_deref().map(Sha256::of)
    }
}

/// One side of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    Absent,
    File(FileData),
    Symlink(Vec<u8>),
    Dir(Mode),
    Special,
    Unreadable(String),
}

impl Side {
    /// The file or symlink a patch line describes; directories and special
    /// files have no content in a diff.
    pub fn has_content(&self) -> bool {
        matches!(self, Side::File(_) | Side::Symlink(_))
    }

    pub fn word(&self) -> &'static str {
        match self {
            Side::Absent => "nothing",
            Side::File(_) => "file",
            Side::Symlink(_) => "symlink",
            Side::Dir(_) => "directory",
            Side::Special => "special file",
            Side::Unreadable(_) => "unreadable",
        }
    }
}

pub fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_PROBE)].contains(&0)
}

/// The host's current state at the entry's path.
pub fn old_side(host: &Host, entry: &Entry, limit: u64) -> Side {
    match host.state(&entry.path) {
        HostState::Absent => Side::Absent,
        HostState::File { mode, size } => {
            if size > limit {
                return Side::File(FileData { mode, size, bytes: None });
            }
            match host.read(&entry.path, limit) {
                Ok(Some(bytes)) => Side::File(FileData { mode, size: bytes.len() as u64, bytes: Some(bytes) }),
                Ok(None) => Side::Absent,
                Err(e) => Side::Unreadable(e.to_string()),
            }
        }
        HostState::Dir { mode } => Side::Dir(mode),
        HostState::Symlink { target } => Side::Symlink(target),
        HostState::Special => Side::Special,
        HostState::Unreachable(why) => Side::Unreadable(why),
    }
}

/// What the path holds once the entry is applied. `old` is the host side
/// (a mode change keeps its content).
pub fn new_side(store: &Store, entry: &Entry, old: &Side, limit: u64) -> Side {
    match &entry.kind {
        Kind::File { mode, size, sha256 } => {
            if *size > limit {
                return Side::File(FileData { mode: *mode, size: *size, bytes: None });
            }
            let read = store.open_blob(sha256).map_err(|e| e.to_string()).and_then(|file| {
                let mut bytes = Vec::new();
                file.take(limit).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
                Ok(bytes)
            });
            match read {
                Ok(bytes) => Side::File(FileData { mode: *mode, size: *size, bytes: Some(bytes) }),
                Err(e) => Side::Unreadable(e),
            }
        }
        Kind::Dir { mode } | Kind::OpaqueDir { mode } => Side::Dir(*mode),
        Kind::Symlink { target } => Side::Symlink(target.as_bytes().to_vec()),
        Kind::Delete => Side::Absent,
        Kind::Mode { mode } => match old {
            Side::File(data) => Side::File(FileData { mode: *mode, ..data.clone() }),
            other => other.clone(),
        },
    }
}

/// Bytes for people: 999 B, 12.3 KiB, 4.0 MiB.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_ls_h() {
        assert_eq!(human_size(999), "999 B");
        assert_eq!(human_size(12_595), "12.3 KiB");
        assert_eq!(human_size(4 << 20), "4.0 MiB");
    }

    #[test]
    fn a_nul_byte_early_means_binary() {
        assert!(is_binary(b"PNG\0\x01"));
        assert!(!is_binary("héllo\n".as_bytes()));
        let mut late = vec![b'a'; 9000];
        late.push(0);
        assert!(!is_binary(&late), "git only looks at the first 8000 bytes");
    }
}
