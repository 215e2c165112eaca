//! Records what the guest sees of the workspace share: every name it looks
//! up (or gets from a directory listing with attributes), with the host's
//! `lstat` at that moment, or its absence. Apply compares the host's state
//! then with what it has now, so only the paths a run touched are ever
//! examined (see `protocol::seen` for the file and `changes::seen` for the
//! comparison).
//!
//! [`Sightings`] is a watch (see `watched`) on the share's bounded
//! filesystem, whose node ids are the host's inode numbers where they fit.
//!
//! The guest chooses what it looks up, so the record is bounded. Memory
//! follows the distinct things seen: each directory path is kept once, as
//! its parent and name; each inode the guest holds for one maps to it until
//! the guest forgets it (a directory forgotten and looked up again is held
//! again, and costs nothing more); each path is written once (a keyed
//! hash remembers which). Recording stops after [`MAX_PATHS`] paths or
//! directories, [`MAX_BYTES`] written, or when the session's filesystem
//! reaches the staging free-space margin. A path the record lacks that
//! exists on the host counts as changed there, so stopping early can only
//! add conflicts, never hide one.

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
/// The share's root among the directory paths.
const ROOT_NODE: u32 = 0;
/// Distinct paths recorded at most, and directories the guest may hold
/// (tens of MB of hashes and names in the VMM at worst).
pub const MAX_PATHS: usize = 2_000_000;
/// Bytes written to the sightings file at most (a path averages well under
/// 100 bytes; a guest making 4 KiB paths on purpose stops here).
pub const MAX_BYTES: u64 = 256 << 20;
/// Bytes written between looks at the free space of the session's
/// filesystem.
const SPACE_CHECK_EVERY: u64 = 1 << 20;

/// The lookups of a share, recorded in a sightings file.
pub struct Sightings {
    record: Mutex<Record>,
}

/// A directory path, kept once: its parent's index and its name.
struct Node {
    parent: u32,
    name: Box<[u8]>,
    /// The next path whose parent and name hash alike.
    next: Option<u32>,
}

/// A directory inode the guest holds.
struct Held {
    node: u32,
    /// Lookups the guest has not forgotten.
    lookups: u64,
}

struct Record {
    out: File,
    /// Every directory path seen; [`ROOT_NODE`] is the share's root.
    nodes: Vec<Node>,
    /// The first of `nodes` by the keyed hash of its parent and name.
    node_ids: HashMap<u64, u32>,
    /// Directory inodes the guest holds.
    dirs: HashMap<u64, Held>,
    /// Hashes of the paths already written.
    written: HashSet<u64>,
    bytes: u64,
    /// Bytes written since the free space was last looked at.
    unchecked: u64,
    /// Records noted but not yet written (a listing writes its entries at once).
    pending: Vec<u8>,
    max_paths: usize,
    max_bytes: u64,
    /// Free bytes the session's filesystem keeps; `None`: the staging margin.
    margin: Option<u64>,
    keys: RandomState,
    /// Recording stopped: a limit was reached or the file could not be
    /// written.
    stopped: bool,
}

impl Sightings {
    /// Records the lookups to `out`, which already holds the magic (the
    /// supervisor writes it when it creates the file).
    pub fn new(out: File) -> Self {
        Sightings { record: Mutex::new(Record::new(out, MAX_PATHS, MAX_BYTES, None)) }
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

    fn forgot(&self, inode: u64, count: u64) {
        self.record().forgot(inode, count);
    }
}

impl Record {
    fn new(out: File, max_paths: usize, max_bytes: u64, margin: Option<u64>) -> Record {
        Record {
            out,
            nodes: vec![Node { parent: ROOT_NODE, name: Box::default(), next: None }],
            node_ids: HashMap::new(),
            dirs: HashMap::from([(ROOT_INODE, Held { node: ROOT_NODE, lookups: 1 })]),
            written: HashSet::new(),
            bytes: 0,
            // The first write looks at the free space.
            unchecked: SPACE_CHECK_EVERY,
            pending: Vec::new(),
            max_paths,
            max_bytes,
            margin,
            keys: RandomState::new(),
            stopped: false,
        }
    }

    /// The path of directory `node` in the share ("" for its root).
    fn path_of(&self, node: u32, out: &mut Vec<u8>) {
        let mut names = Vec::new();
        let mut at = node;
        while at != ROOT_NODE {
            let n = &self.nodes[at as usize];
            names.push(&n.name);
            at = n.parent;
        }
        for (i, name) in names.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(name);
        }
    }

    /// The index of directory `name` in `parent`, added if new; `None` past
    /// the limit.
    fn intern(&mut self, parent: u32, name: &[u8]) -> Option<u32> {
        let hash = self.keys.hash_one((parent, name));
        let mut candidate = self.node_ids.get(&hash).copied();
        while let Some(id) = candidate {
            let n = &self.nodes[id as usize];
            if n.parent == parent && *n.name == *name {
                return Some(id);
            }
            candidate = n.next;
        }
        if self.nodes.len() > self.max_paths {
            return None;
        }
        let id = u32::try_from(self.nodes.len()).ok()?;
        let next = self.node_ids.insert(hash, id);
        self.nodes.push(Node { parent, name: name.into(), next });
        Some(id)
    }

    /// Notes one sighting; [`Record::write`] puts it in the file.
    fn note(&mut self, parent: u64, name: &[u8], entry: Option<&Entry>) {
        if self.stopped || name == b"." || name == b".." {
            return;
        }
        // A parent we never handed out (or one over-long) cannot be named.
        let Some(prefix) = self.dirs.get(&parent).map(|held| held.node) else { return };
        let mut path = Vec::new();
        self.path_of(prefix, &mut path);
        if prefix != ROOT_NODE {
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
            let Some(node) = self.intern(prefix, name) else { return self.stop_at_limit() };
            // Each lookup the guest gets is one it forgets later.
            self.dirs.entry(e.inode).or_insert(Held { node, lookups: 0 }).lookups += 1;
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

    /// The guest forgot `count` lookups of `inode`; a directory it no
    /// longer holds is let go (its path stays, for the next inode).
    fn forgot(&mut self, inode: u64, count: u64) {
        if inode == ROOT_INODE {
            return;
        }
        if let Some(held) = self.dirs.get_mut(&inode) {
            held.lookups = held.lookups.saturating_sub(count);
            if held.lookups == 0 {
                self.dirs.remove(&inode);
            }
        }
    }

    /// Writes what was noted before the request is answered, not later: the
    /// guest may power off right after its last lookup, and the process
    /// ends with it.
    fn write(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.unchecked += self.pending.len() as u64;
        if self.unchecked >= SPACE_CHECK_EVERY {
            self.unchecked = 0;
            if let Err(why) = self.room() {
                self.pending.clear();
                return self.stop(&why);
            }
        }
        if let Err(e) = self.out.write_all(&self.pending) {
            self.stop(&format!("cannot record what the guest saw: {e}"));
        }
        self.pending.clear();
    }

    /// Whether the session's filesystem has room for more above its margin.
    fn room(&self) -> Result<(), String> {
        let stat = nix::sys::statvfs::fstatvfs(&self.out)
            .map_err(|e| format!("cannot see the free space left for the record of what the guest saw: {e}"))?;
        let available = stat.blocks_available().saturating_mul(stat.fragment_size());
        let total = stat.blocks().saturating_mul(stat.fragment_size());
        let margin = self.margin.unwrap_or_else(|| crate::util::space::staging_margin(total));
        if available < margin.saturating_add(self.pending.len() as u64) {
            return Err(format!(
                "the session's filesystem is down to its free-space margin ({} left)",
                crate::util::text::human_bytes(available)
            ));
        }
        Ok(())
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
        self.nodes = Vec::new();
        self.node_ids = HashMap::new();
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
        (Record::new(out, max_paths, max_bytes, Some(0)), file)
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
    fn a_directory_forgotten_and_looked_up_again_costs_nothing_more() {
        let (mut record, file) = recorder(100, u64::MAX);
        // Ten levels of 200-byte names: a 2 KiB path, which each inode of
        // the last directory used to carry a copy of.
        let name = [b'n'; 200];
        let mut parent = ROOT_INODE;
        for inode in 2..12 {
            record.note(parent, &name, Some(&entry(inode, libc::S_IFDIR)));
            parent = inode;
        }
        for inode in 100..20_000 {
            record.note(parent, b"d", Some(&entry(inode, libc::S_IFDIR)));
            record.note(inode, b"x", None);
            record.forgot(inode, 1);
            record.write();
        }
        assert!(!record.stopped);
        assert_eq!(record.dirs.len(), 11, "the root and the ten levels the guest still holds");
        assert_eq!(record.nodes.len(), 12, "each directory path once");
        let names: usize = record.nodes.iter().map(|n| n.name.len()).sum();
        assert_eq!(names, 10 * 200 + 1);
        let recorded = paths(&file);
        assert_eq!(recorded.len(), 12, "each path written once");
        assert!(recorded[11].ends_with("/d/x"));
        // A lookup forgotten in part keeps its inode.
        record.note(parent, b"e", Some(&entry(500_000, libc::S_IFDIR)));
        record.note(parent, b"e", Some(&entry(500_000, libc::S_IFDIR)));
        record.forgot(500_000, 1);
        record.note(500_000, b"y", None);
        record.write();
        assert!(paths(&file).last().unwrap().ends_with("/e/y"));
    }

    #[test]
    fn recording_stops_at_the_free_space_margin() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut record = Record::new(file.reopen().unwrap(), 100, u64::MAX, Some(u64::MAX));
        record.note(ROOT_INODE, b"a", None);
        record.write();
        assert!(record.stopped, "no disk has that much free");
        assert!(paths(&file).is_empty(), "nothing written past the margin");
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
