//! What the guest saw of the workspace: for each path it looked up, the
//! host's `lstat` at that first look, or that the name did not exist. The
//! VMM's file server records these as the guest walks (see
//! `protocol::seen`); nothing else of the workspace is ever examined.
//!
//! The guest's lower layer is the live host workspace, so an export's base
//! already includes host edits made before the export; what the base cannot
//! tell is whether the guest built on the older state. A path whose host
//! stat now differs from what the guest first saw was touched on the host
//! after that, and apply treats it as a conflict. A path the guest never
//! looked up counts as absent when it looked: if the host has it now, the
//! host made it (or the guest never saw it), and that is a conflict too.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::ops::Bound;
use std::os::fd::AsFd;
use std::path::Path;

use nix::sys::stat::FileStat;

use super::dirfd::{self, FileType};
use crate::protocol::change_set::path::RelPath;
use crate::protocol::seen::{self as wire, HostStat};

/// What is kept of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatKey {
    pub kind: FileType,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    /// Moves with every write, rename and chmod, even one that restores
    /// size and mtime (`cp -p`, `rsync -t`).
    pub ctime_sec: i64,
    pub ctime_nsec: u32,
    pub ino: u64,
    pub mode: u32,
}

impl StatKey {
    pub fn of(stat: &FileStat) -> StatKey {
        StatKey::from_host(&host_stat(stat))
    }

    fn from_host(s: &HostStat) -> StatKey {
        StatKey {
            kind: FileType::of_mode(s.mode),
            size: s.size,
            mtime_sec: s.mtime_sec,
            mtime_nsec: s.mtime_nsec,
            ctime_sec: s.ctime_sec,
            ctime_nsec: s.ctime_nsec,
            ino: s.ino,
            mode: s.mode & 0o7777,
        }
    }

    fn to_host(self) -> HostStat {
        let kind = match self.kind {
            FileType::File => libc::S_IFREG,
            FileType::Dir => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            // Any type that is none of the above reads back as special.
            FileType::Special => libc::S_IFIFO,
        };
        HostStat {
            mode: kind | self.mode,
            size: self.size,
            mtime_sec: self.mtime_sec,
            mtime_nsec: self.mtime_nsec,
            ctime_sec: self.ctime_sec,
            ctime_nsec: self.ctime_nsec,
            ino: self.ino,
        }
    }

    /// Whether nothing was done to the path itself. A directory's size,
    /// mtime and ctime move with its contents, which have keys of their own.
    pub fn unchanged(&self, now: &StatKey) -> bool {
        match self.kind {
            FileType::Dir => self.kind == now.kind && self.ino == now.ino && self.mode == now.mode,
            _ => self == now,
        }
    }
}

fn host_stat(stat: &FileStat) -> HostStat {
    HostStat {
        mode: stat.st_mode,
        size: u64::try_from(stat.st_size).unwrap_or(0),
        mtime_sec: stat.st_mtime,
        mtime_nsec: u32::try_from(stat.st_mtime_nsec).unwrap_or(0),
        ctime_sec: stat.st_ctime,
        ctime_nsec: u32::try_from(stat.st_ctime_nsec).unwrap_or(0),
        ino: stat.st_ino,
    }
}

/// How the host touched a path after the guest saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionChange {
    Created,
    Edited,
    Deleted,
}

/// The paths the guest saw, each with its state then (None: absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    entries: BTreeMap<RelPath, Option<StatKey>>,
}

impl Seen {
    /// Every path of `workspace` as it is now, as if the guest had looked
    /// at all of them: what tests and benchmarks start from.
    #[cfg(test)]
    pub fn everything(workspace: &Path) -> io::Result<Seen> {
        let root = File::open(workspace)?;
        let mut seen = Seen::default();
        let mut dir = nix::dir::Dir::from_fd(root.into())?;
        walk(&mut dir, None, &mut seen)?;
        Ok(seen)
    }

    /// Reads a sightings file; the first record of a path wins.
    pub fn load(path: &Path) -> io::Result<Seen> {
        let mut input = BufReader::new(File::open(path)?);
        wire::read_magic(&mut input)?;
        let mut seen = Seen::default();
        while let Some(sighting) = wire::decode(&mut input)? {
            // Paths a change set cannot name cannot conflict either.
            let Ok(path) = RelPath::new(sighting.path) else { continue };
            seen.entries.entry(path).or_insert_with(|| sighting.state.as_ref().map(StatKey::from_host));
        }
        Ok(seen)
    }

    /// Writes every path once, in the format [`Seen::load`] reads.
    pub fn write_to(&self, out: impl Write) -> io::Result<()> {
        let mut out = BufWriter::new(out);
        out.write_all(&wire::MAGIC)?;
        let mut record = Vec::new();
        for (path, key) in &self.entries {
            record.clear();
            wire::encode(path.as_bytes(), key.map(StatKey::to_host).as_ref(), &mut record);
            out.write_all(&record)?;
        }
        out.flush()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The state the guest saw `path` in, if it saw it present.
    pub fn get(&self, path: &RelPath) -> Option<&StatKey> {
        self.entries.get(path).and_then(Option::as_ref)
    }

    /// How the host touched `path` after the guest first saw it, given its
    /// current stat. Unseen paths count as absent.
    pub fn change(&self, path: &RelPath, now: Option<&FileStat>) -> Option<SessionChange> {
        match (self.get(path), now) {
            (None, None) => None,
            (None, Some(_)) => Some(SessionChange::Created),
            (Some(_), None) => Some(SessionChange::Deleted),
            (Some(then), Some(now)) => (!then.unchanged(&StatKey::of(now))).then_some(SessionChange::Edited),
        }
    }

    /// The first path below the directory `name` (in `parent`, at `path`)
    /// that the host created or edited after the guest saw it. Deletions are
    /// not reported: a tree about to be removed lost nothing by them. This
    /// walks the host's tree, which the change removes: its cost is the
    /// change's own size.
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

    /// Records `path` as it is now (after apply wrote it), so a later partial
    /// apply does not take our own write for a host edit.
    pub fn record(&mut self, path: &RelPath, now: Option<&FileStat>) {
        self.entries.insert(path.clone(), now.map(StatKey::of));
    }
}

#[cfg(test)]
fn walk(dir: &mut nix::dir::Dir, prefix: Option<&RelPath>, seen: &mut Seen) -> io::Result<()> {
    for name in dirfd::list(dir)? {
        let Ok(path) = RelPath::child(prefix, &name) else { continue };
        let Some(stat) = dirfd::stat_at(dir, &name)? else { continue };
        seen.record(&path, Some(&stat));
        if FileType::of(&stat) == FileType::Dir {
            let mut sub = dirfd::open_dir(dir, &name)?;
            walk(&mut sub, Some(&path), seen)?;
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
    fn sightings_load_first_wins_and_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::write(ws.join("a.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("/usr", ws.join("usr-link")).unwrap();
        let mut bytes = wire::MAGIC.to_vec();
        let a = host_stat(&lstat(&ws.join("a.txt")));
        wire::encode(b"a.txt", Some(&a), &mut bytes);
        wire::encode(b"later", None, &mut bytes);
        wire::encode(b"usr-link", Some(&host_stat(&lstat(&ws.join("usr-link")))), &mut bytes);
        // Seen again after a host edit: the first sighting is what counts.
        wire::encode(b"a.txt", Some(&HostStat { size: 99, ..a }), &mut bytes);
        wire::encode(b"later", Some(&a), &mut bytes);
        let file = tmp.path().join("seen");
        fs::write(&file, &bytes).unwrap();

        let seen = Seen::load(&file).unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen.get(&p("a.txt")).unwrap().size, 5);
        assert_eq!(seen.get(&p("usr-link")).unwrap().kind, FileType::Symlink);
        assert!(seen.get(&p("later")).is_none(), "first seen absent");

        let mut again = Vec::new();
        seen.write_to(&mut again).unwrap();
        fs::write(&file, &again).unwrap();
        assert_eq!(Seen::load(&file).unwrap(), seen);
    }

    #[test]
    fn tells_created_edited_and_deleted_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::create_dir(ws.join("d")).unwrap();
        fs::write(ws.join("d/f"), b"one").unwrap();
        fs::write(ws.join("g"), b"one").unwrap();
        let mut seen = Seen::everything(ws).unwrap();
        assert_eq!(seen.change(&p("d/f"), Some(&lstat(&ws.join("d/f")))), None);

        // Same size, but a new file (editors write a temp and rename it over).
        fs::write(ws.join("d/f.tmp"), b"two").unwrap();
        fs::rename(ws.join("d/f.tmp"), ws.join("d/f")).unwrap();
        assert_eq!(seen.change(&p("d/f"), Some(&lstat(&ws.join("d/f")))), Some(SessionChange::Edited));
        assert_eq!(seen.change(&p("d"), Some(&lstat(&ws.join("d")))), None, "a directory's own mtime is not a change");
        assert_eq!(seen.change(&p("g"), None), Some(SessionChange::Deleted));
        assert_eq!(seen.change(&p("never-seen"), Some(&lstat(&ws.join("g")))), Some(SessionChange::Created));
        fs::write(ws.join("d/new"), b"").unwrap();
        let root = File::open(ws).unwrap();
        let found = seen.tree_change(&root, b"d", &p("d")).unwrap().unwrap();
        assert_eq!(found.1, SessionChange::Edited);

        seen.record(&p("d/f"), Some(&lstat(&ws.join("d/f"))));
        assert_eq!(seen.tree_change(&root, b"d", &p("d")).unwrap(), Some((p("d/new"), SessionChange::Created)));
        assert_eq!(seen.paths_under(&p("d")), [p("d"), p("d/f")]);
    }

    #[test]
    fn an_edit_that_keeps_size_and_mtime_is_still_an_edit() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        fs::write(&f, b"one").unwrap();
        let before = lstat(&f);
        let mtime = fs::symlink_metadata(&f).unwrap().modified().unwrap();
        let seen = Seen::everything(tmp.path()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&f, b"two").unwrap();
        File::options().write(true).open(&f).unwrap().set_modified(mtime).unwrap();
        let now = lstat(&f);
        assert_eq!(
            (now.st_size, now.st_mtime, now.st_mtime_nsec),
            (before.st_size, before.st_mtime, before.st_mtime_nsec)
        );
        assert_eq!(seen.change(&p("f"), Some(&now)), Some(SessionChange::Edited), "ctime tells");
    }
}
