//! The workspace as `stat` saw it when the session started: size, mtime,
//! inode and mode of every path (symlinks not followed, nothing skipped).
//!
//! The guest's lower layer is the live host workspace, so an export's base
//! already includes host edits made during the session; what the base cannot
//! tell is whether the guest overwrote such an edit. A path whose host stat
//! differs from the snapshot was touched on the host during the session, and
//! apply treats it as a conflict.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::ops::Bound;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::stat::FileStat;

use super::dirfd::{self, FileType};
use super::path::RelPath;

const MAGIC: [u8; 8] = *b"STKSNAP1";

/// What the snapshot keeps of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatKey {
    pub kind: FileType,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub ino: u64,
    pub mode: u32,
}

impl StatKey {
    pub fn of(stat: &FileStat) -> StatKey {
        StatKey {
            kind: FileType::of(stat),
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mtime_sec: stat.st_mtime,
            mtime_nsec: u32::try_from(stat.st_mtime_nsec).unwrap_or(0),
            ino: stat.st_ino,
            mode: stat.st_mode & 0o7777,
        }
    }

    /// Whether nothing was done to the path itself. A directory's size and
    /// mtime move with its contents, which have keys of their own.
    pub fn unchanged(&self, now: &StatKey) -> bool {
        match self.kind {
            FileType::Dir => self.kind == now.kind && self.ino == now.ino && self.mode == now.mode,
            _ => self == now,
        }
    }

    fn kind_code(&self) -> u8 {
        match self.kind {
            FileType::File => 0,
            FileType::Dir => 1,
            FileType::Symlink => 2,
            FileType::Special => 3,
        }
    }
}

/// How the host touched a path during the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionChange {
    Created,
    Edited,
    Deleted,
}

/// The workspace's stat map at session start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    entries: BTreeMap<RelPath, StatKey>,
    /// Directories that could not be listed (their contents are missing).
    pub unreadable: u64,
}

impl Snapshot {
    /// Walks the workspace without following symlinks.
    pub fn capture(workspace: &Path) -> io::Result<Snapshot> {
        Snapshot::capture_counting(workspace, &AtomicU64::new(0))
    }

    /// [`Snapshot::capture`], counting the paths seen in `seen` as it goes
    /// (another thread may show how far it got).
    pub fn capture_counting(workspace: &Path, seen: &AtomicU64) -> io::Result<Snapshot> {
        let root = File::open(workspace)?;
        let mut found = Vec::new();
        let mut unreadable = 0;
        let mut dir = nix::dir::Dir::from_fd(root.into())?;
        walk(&mut dir, None, &mut found, &mut unreadable, seen)?;
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(Snapshot { entries: found.into_iter().collect(), unreadable })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, path: &RelPath) -> Option<&StatKey> {
        self.entries.get(path)
    }

    /// How the host touched `path`, given its current stat.
    pub fn change(&self, path: &RelPath, now: Option<&FileStat>) -> Option<SessionChange> {
        match (self.entries.get(path), now) {
            (None, None) => None,
            (None, Some(_)) => Some(SessionChange::Created),
            (Some(_), None) => Some(SessionChange::Deleted),
            (Some(then), Some(now)) => (!then.unchanged(&StatKey::of(now))).then_some(SessionChange::Edited),
        }
    }

    /// The first path below the directory `name` (in `parent`, at `path`)
    /// that the host created or edited during the session. Deletions are
    /// not reported: a tree about to be removed lost nothing by them.
    pub fn tree_change(
        &self,
        parent: &impl AsFd,
        name: &[u8],
        path: &RelPath,
    ) -> io::Result<Option<(RelPath, SessionChange)>> {
        let mut dir = dirfd::open_dir(parent, name)?;
        for child in dirfd::list(&mut dir)? {
            let Ok(child_path) = path.join(&child) else { continue };
            let Some(stat) = dirfd::stat_at(&dir, &child)? else { continue };
            if let Some(change @ (SessionChange::Created | SessionChange::Edited)) =
                self.change(&child_path, Some(&stat))
            {
                return Ok(Some((child_path, change)));
            }
            if FileType::of(&stat) == FileType::Dir
                && let Some(found) = self.tree_change(&dir, &child, &child_path)?
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// `path` and every recorded path below it.
    pub fn paths_under(&self, path: &RelPath) -> Vec<RelPath> {
        self.entries
            .range((Bound::Included(path.clone()), Bound::Unbounded))
            .take_while(|(p, _)| p.starts_with(path))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Drops `path` and everything below it.
    pub fn forget_tree(&mut self, path: &RelPath) {
        for p in self.paths_under(path) {
            self.entries.remove(&p);
        }
    }

    /// Records `path` as it is now (after apply wrote it), so a later partial
    /// apply does not take our own write for a host edit.
    pub fn record(&mut self, path: &RelPath, now: Option<&FileStat>) {
        match now {
            Some(stat) => {
                self.entries.insert(path.clone(), StatKey::of(stat));
            }
            None => {
                self.entries.remove(path);
            }
        }
    }

    pub fn write_to(&self, out: impl Write) -> io::Result<()> {
        let mut out = BufWriter::new(out);
        out.write_all(&MAGIC)?;
        out.write_all(&(self.entries.len() as u64).to_le_bytes())?;
        out.write_all(&self.unreadable.to_le_bytes())?;
        for (path, key) in &self.entries {
            let bytes = path.as_bytes();
            // Paths are at most MAX_PATH bytes, well within u16.
            let len = u16::try_from(bytes.len()).map_err(|_| io::Error::other("path too long for a snapshot"))?;
            out.write_all(&len.to_le_bytes())?;
            out.write_all(bytes)?;
            out.write_all(&[key.kind_code()])?;
            out.write_all(&key.size.to_le_bytes())?;
            out.write_all(&key.mtime_sec.to_le_bytes())?;
            out.write_all(&key.mtime_nsec.to_le_bytes())?;
            out.write_all(&key.ino.to_le_bytes())?;
            out.write_all(&key.mode.to_le_bytes())?;
        }
        out.flush()
    }

    pub fn read_from(input: impl Read) -> io::Result<Snapshot> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad workspace snapshot: {what}"));
        let mut input = BufReader::new(input);
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic)?;
        if magic != MAGIC {
            return Err(bad("wrong magic"));
        }
        let count = read_u64(&mut input)?;
        let unreadable = read_u64(&mut input)?;
        let mut entries = Vec::new();
        for _ in 0..count {
            let mut len = [0u8; 2];
            input.read_exact(&mut len)?;
            let mut bytes = vec![0u8; u16::from_le_bytes(len) as usize];
            input.read_exact(&mut bytes)?;
            let path = RelPath::new(bytes).map_err(|e| bad(&e.to_string()))?;
            let mut code = [0u8; 1];
            input.read_exact(&mut code)?;
            let kind = match code[0] {
                0 => FileType::File,
                1 => FileType::Dir,
                2 => FileType::Symlink,
                3 => FileType::Special,
                _ => return Err(bad("unknown file type")),
            };
            let size = read_u64(&mut input)?;
            let mtime_sec = read_u64(&mut input)? as i64;
            let mtime_nsec = read_u32(&mut input)?;
            let ino = read_u64(&mut input)?;
            let mode = read_u32(&mut input)?;
            entries.push((path, StatKey { kind, size, mtime_sec, mtime_nsec, ino, mode }));
        }
        Ok(Snapshot { entries: entries.into_iter().collect(), unreadable })
    }
}

fn read_u64(input: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    input.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_u32(input: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    input.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn walk(
    dir: &mut nix::dir::Dir,
    prefix: Option<&RelPath>,
    found: &mut Vec<(RelPath, StatKey)>,
    unreadable: &mut u64,
    seen: &AtomicU64,
) -> io::Result<()> {
    for name in dirfd::list(dir)? {
        // Paths a change set cannot name (over-long) cannot conflict either.
        let Ok(path) = RelPath::child(prefix, &name) else { continue };
        let Some(stat) = dirfd::stat_at(dir, &name)? else { continue };
        let key = StatKey::of(&stat);
        found.push((path.clone(), key));
        seen.fetch_add(1, Ordering::Relaxed);
        if key.kind == FileType::Dir {
            match dirfd::open_dir(dir, &name) {
                Ok(mut sub) => walk(&mut sub, Some(&path), found, unreadable, seen)?,
                Err(e) => {
                    tracing::warn!("workspace snapshot: cannot list {path}: {e}");
                    *unreadable += 1;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn p(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    fn lstat(path: &Path) -> FileStat {
        nix::sys::stat::lstat(path).unwrap()
    }

    #[test]
    fn captures_everything_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::create_dir_all(ws.join(".git/objects")).unwrap();
        fs::write(ws.join(".git/HEAD"), b"ref").unwrap();
        fs::write(ws.join("a.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("/usr", ws.join("usr-link")).unwrap();
        let snap = Snapshot::capture(ws).unwrap();
        assert_eq!(snap.len(), 5);
        assert_eq!(snap.get(&p("a.txt")).unwrap().size, 5);
        assert_eq!(snap.get(&p("usr-link")).unwrap().kind, FileType::Symlink);
        assert!(snap.get(&p("usr-link/bin")).is_none());

        let mut bytes = Vec::new();
        snap.write_to(&mut bytes).unwrap();
        assert_eq!(Snapshot::read_from(&bytes[..]).unwrap(), snap);
    }

    #[test]
    fn tells_created_edited_and_deleted_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::create_dir(ws.join("d")).unwrap();
        fs::write(ws.join("d/f"), b"one").unwrap();
        fs::write(ws.join("g"), b"one").unwrap();
        let mut snap = Snapshot::capture(ws).unwrap();
        assert_eq!(snap.change(&p("d/f"), Some(&lstat(&ws.join("d/f")))), None);

        // Same size, but a new file (editors write a temp and rename it over).
        fs::write(ws.join("d/f.tmp"), b"two").unwrap();
        fs::rename(ws.join("d/f.tmp"), ws.join("d/f")).unwrap();
        assert_eq!(snap.change(&p("d/f"), Some(&lstat(&ws.join("d/f")))), Some(SessionChange::Edited));
        assert_eq!(snap.change(&p("d"), Some(&lstat(&ws.join("d")))), None, "a directory's own mtime is not a change");
        assert_eq!(snap.change(&p("g"), None), Some(SessionChange::Deleted));
        fs::write(ws.join("d/new"), b"").unwrap();
        let root = File::open(ws).unwrap();
        let found = snap.tree_change(&root, b"d", &p("d")).unwrap().unwrap();
        assert_eq!(found.1, SessionChange::Edited);

        snap.record(&p("d/f"), Some(&lstat(&ws.join("d/f"))));
        assert_eq!(snap.tree_change(&root, b"d", &p("d")).unwrap(), Some((p("d/new"), SessionChange::Created)));
        snap.forget_tree(&p("d"));
        assert!(snap.get(&p("d")).is_none() && snap.get(&p("d/f")).is_none());
        assert!(snap.get(&p("g")).is_some());
    }
}
