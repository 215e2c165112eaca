//! Records what the guest sees of the workspace share: every name it looks
//! up (or gets from a directory listing with attributes), with the host's
//! `lstat` at that moment, or its absence. Apply compares the host's state
//! then with what it has now, so only the paths a run touched are ever
//! examined (see `protocol::seen` for the file and `changes::seen` for the
//! comparison).
//!
//! [`Sightings`] is a watch (see `watched`) on the share's passthrough
//! filesystem, where attributes carry the host's inode numbers.
//!
//! The guest chooses what it looks up, so the record is bounded: each path
//! is written once (a keyed hash remembers which), and after [`MAX_PATHS`]
//! paths, [`MAX_PATHS`] directory inodes or [`MAX_BYTES`] written, recording
//! stops. A path the record lacks that exists
//! on the host counts as changed there, so stopping early can only add
//! conflicts, never hide one.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Write};
use std::sync::Mutex;

use fuse_backend_rs::abi::fuse_abi::stat64;
use fuse_backend_rs::api::filesystem::Entry;

use super::watched::Watch;
use crate::protocol::seen::{self, HostStat};

/// The passthrough's inode for the share's root.
const ROOT_INODE: u64 = 1;
/// Distinct paths recorded at most (tens of MB of hashes and directory
/// names in the VMM at worst).
pub const MAX_PATHS: usize = 2_000_000;
/// Bytes written to the sightings file at most (a path averages well under
/// 100 bytes; a guest making 4 KiB paths on purpose stops here).
pub const MAX_BYTES: u64 = 256 << 20;

/// The lookups of a share, recorded in a sightings file.
pub struct Sightings {
    record: Mutex<Record>,
}

struct Record {
    out: File,
    /// Directory inodes the guest holds, with their paths in the share.
    dirs: HashMap<u64, Vec<u8>>,
    /// Hashes of the paths already written.
    written: HashSet<u64>,
    bytes: u64,
    /// Records noted but not yet written (a listing writes its entries at once).
    pending: Vec<u8>,
    max_paths: usize,
    max_bytes: u64,
    keys: RandomState,
    /// Recording stopped: the limit was reached or the file could not be
    /// written.
    stopped: bool,
}

impl Sightings {
    /// Records the lookups to `out`, which already holds the magic (the
    /// supervisor writes it when it creates the file).
    pub fn new(out: File) -> Self {
        let record = Record {
            out,
            dirs: HashMap::from([(ROOT_INODE, Vec::new())]),
            written: HashSet::new(),
            bytes: 0,
            pending: Vec::new(),
            max_paths: MAX_PATHS,
            max_bytes: MAX_BYTES,
            keys: RandomState::new(),
            stopped: false,
        };
        Sightings { record: Mutex::new(record) }
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Watch for Sightings {
    fn looked_up(&self, parent: u64, name: &[u8], result: &io::Result<Entry>) {
        let seen = match result {
            Ok(entry) if entry.inode != 0 => Some(Some(entry)),
            Ok(_) => Some(None),
            Err(e) if is_enoent(e) => Some(None),
            Err(_) => None,
        };
        if let Some(entry) = seen {
            let mut record = self.record();
            record.note(parent, name, entry);
            record.write();
        }
    }

    /// Each entry the guest receives with its attributes is a lookup it
    /// will not send.
    fn listed(&self, parent: u64, name: &[u8], entry: &Entry, delivered: bool) {
        if delivered && entry.inode != 0 {
            self.record().note(parent, name, Some(entry));
        }
    }

    /// One write for the whole listing.
    fn listing_done(&self) {
        self.record().write();
    }
}

impl Record {
    /// Notes one sighting; [`Record::write`] puts it in the file.
    fn note(&mut self, parent: u64, name: &[u8], entry: Option<&Entry>) {
        if self.stopped || name == b"." || name == b".." {
            return;
        }
        // A parent we never handed out (or one over-long) cannot be named.
        let Some(prefix) = self.dirs.get(&parent) else { return };
        let mut path = Vec::with_capacity(prefix.len() + 1 + name.len());
        if !prefix.is_empty() {
            path.extend_from_slice(prefix);
            path.push(b'/');
        }
        path.extend_from_slice(name);
        if path.len() > seen::MAX_PATH {
            return;
        }
        let state = entry.map(|e| host_stat(&e.attr));
        if let Some(e) = entry
            && e.attr.st_mode & libc::S_IFMT == libc::S_IFDIR
        {
            // A directory forgotten and looked up again gets a new inode.
            self.dirs.entry(e.inode).or_insert_with(|| path.clone());
            if self.dirs.len() > self.max_paths {
                return self.stop_at_limit();
            }
        }
        if !self.written.insert(self.keys.hash_one(&path)) {
            return;
        }
        let before = self.pending.len();
        seen::encode(&path, state.as_ref(), &mut self.pending);
        self.bytes += (self.pending.len() - before) as u64;
        if self.written.len() > self.max_paths || self.bytes > self.max_bytes {
            self.pending.truncate(before);
            self.stop_at_limit();
        }
    }

    /// Writes what was noted before the request is answered, not later: the
    /// guest may power off right after its last lookup, and the process
    /// ends with it.
    fn write(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Err(e) = self.out.write_all(&self.pending) {
            self.stop(&format!("cannot record what the guest saw: {e}"));
        }
        self.pending.clear();
    }

    fn stop_at_limit(&mut self) {
        let why = format!(
            "the guest looked up more workspace paths than are recorded ({} paths or {} bytes)",
            self.max_paths, self.max_bytes
        );
        self.stop(&why);
    }

    /// Stops recording for good, freeing what the record held.
    fn stop(&mut self, why: &str) {
        tracing::warn!("virtio-fs: {why}; no more is recorded, so changes to other paths will count as conflicts");
        self.stopped = true;
        self.dirs = HashMap::new();
        self.written = HashSet::new();
    }
}

fn host_stat(attr: &stat64) -> HostStat {
    HostStat {
        mode: attr.st_mode,
        size: u64::try_from(attr.st_size).unwrap_or(0),
        mtime_sec: attr.st_mtime,
        mtime_nsec: u32::try_from(attr.st_mtime_nsec).unwrap_or(0),
        ctime_sec: attr.st_ctime,
        ctime_nsec: u32::try_from(attr.st_ctime_nsec).unwrap_or(0),
        ino: attr.st_ino,
    }
}

fn is_enoent(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fuse_backend_rs::abi::fuse_abi::Attr;

    use super::*;

    fn entry(inode: u64, mode: u32) -> Entry {
        let mut attr: stat64 = Attr::default().into();
        attr.st_mode = mode;
        attr.st_ino = inode + 1000;
        Entry { inode, generation: 0, attr, attr_flags: 0, attr_timeout: Duration::ZERO, entry_timeout: Duration::ZERO }
    }

    fn recorder(max_paths: usize, max_bytes: u64) -> (Record, tempfile::NamedTempFile) {
        let file = tempfile::NamedTempFile::new().unwrap();
        let out = file.reopen().unwrap();
        let record = Record {
            out,
            dirs: HashMap::from([(ROOT_INODE, Vec::new())]),
            written: HashSet::new(),
            bytes: 0,
            pending: Vec::new(),
            max_paths,
            max_bytes,
            keys: RandomState::new(),
            stopped: false,
        };
        (record, file)
    }

    fn paths(file: &tempfile::NamedTempFile) -> Vec<String> {
        let bytes = std::fs::read(file.path()).unwrap();
        let mut input = &bytes[..];
        let mut out = Vec::new();
        while let Some(s) = seen::decode(&mut input).unwrap() {
            out.push(String::from_utf8(s.path).unwrap());
        }
        out
    }

    #[test]
    fn a_flood_of_lookups_stops_at_the_limit() {
        let (mut record, file) = recorder(3, u64::MAX);
        for (i, name) in ["a", "b", "a", "c", "d", "e"].iter().enumerate() {
            record.note(ROOT_INODE, name.as_bytes(), Some(&entry(10 + i as u64, libc::S_IFREG)));
            record.write();
        }
        assert_eq!(paths(&file), ["a", "b", "c"], "each path once, then nothing");
        assert!(record.stopped);
    }

    #[test]
    fn a_directory_looked_up_again_and_again_cannot_grow_the_record() {
        let (mut record, _file) = recorder(100, u64::MAX);
        // Forgotten and looked up again, a directory gets a new inode each time.
        for inode in 2..1000 {
            record.note(ROOT_INODE, b"d", Some(&entry(inode, libc::S_IFDIR)));
            record.note(inode, b"x", None);
        }
        assert!(record.stopped);
        assert!(record.dirs.is_empty(), "stopping frees what it held");
    }

    #[test]
    fn long_paths_stop_at_the_byte_limit_and_unknown_parents_are_skipped() {
        let (mut record, file) = recorder(1000, 900);
        let name = [b'n'; 250];
        let mut parent = ROOT_INODE;
        for inode in 2..10 {
            record.note(parent, &name, Some(&entry(inode, libc::S_IFDIR)));
            parent = inode;
        }
        record.write();
        assert!(record.stopped);
        assert_eq!(paths(&file).len(), 2, "records of 297 and 548 bytes fit in 900");
        let (mut record, file) = recorder(10, 1 << 20);
        record.note(77, b"orphan", None);
        record.write();
        assert!(paths(&file).is_empty());
    }
}
