//! What `apply` landed from a running session's checkpoints, in
//! `<session>/landed`: one JSON line per applied path with the state that
//! landed there, the last line of a path winning.
//!
//! The guest still holds those changes, so each later checkpoint and the
//! final export carry them again. There they are marked applied when the
//! guest's state is still the one that landed (never offered twice), and a
//! host path that still holds exactly what landed is the base a newer guest
//! change builds on: no conflict, although the host changed the path after
//! the guest first saw it. A host edit made after the landing is a conflict
//! as ever: the record holds the host's whole state after the landing (a
//! file's content even when only its mode landed), and a directory's record
//! covers what is below it only when all of that landed too.
//!
//! Only what the apply wrote is a base. A change the host held already
//! (the guest copied the user's own edit, or file, made after it first saw
//! it) is recorded so that it is not offered again, but it licenses nothing:
//! the guest's later change there is judged against what it first saw.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ChangesError;
use super::conflict::HostPath;
use super::dirfd::{self, FileType, Root};
use super::store::Store;
use super::tree;
use crate::protocol::change_set::entry::{Base, EntryState, Kind, TreeDigest};
use crate::protocol::change_set::path::RelPath;

/// Where a running session keeps its checkpoint store, below the session
/// directory (`Store::open` of it is `<session>/checkpoint/changes`).
pub const CHECKPOINT_DIR: &str = "checkpoint";
const FILE_NAME: &str = "landed";

#[derive(Serialize, Deserialize)]
struct Line {
    path: RelPath,
    /// The guest's change that landed.
    kind: Kind,
    /// What the host held at the path right after it landed.
    host: Base,
    /// The apply wrote it (else the host held it already). Lines written
    /// before this field was kept are of writes.
    #[serde(default = "wrote")]
    wrote: bool,
}

fn wrote() -> bool {
    true
}

/// One path's landing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    kind: Kind,
    /// Complete for a file and a symlink; for a directory, a digest of what
    /// is below only when all of it landed too (else nothing below is
    /// covered: the record never licenses removing it).
    host: Base,
    /// Whether the apply wrote it: only then is it a base later changes
    /// build on.
    wrote: bool,
}

/// The states that landed, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Landed {
    paths: BTreeMap<RelPath, Record>,
}

/// The session directory of a session's store or of its checkpoint store.
fn session_dir(store: &Store) -> PathBuf {
    let above = store.dir().parent().unwrap_or(Path::new("."));
    match above.file_name() {
        Some(name) if name == CHECKPOINT_DIR => above.parent().unwrap_or(above).to_path_buf(),
        _ => above.to_path_buf(),
    }
}

/// Whether a change of this kind removes what is below a host directory
/// at its path.
fn removes_below(kind: &Kind) -> bool {
    !matches!(kind, Kind::Dir { .. } | Kind::Mode { .. })
}

/// A directory's state without what is below it.
fn shallow(state: &Base) -> Base {
    match state {
        Base::Dir { mode, .. } => Base::Dir { mode: *mode, tree: None },
        other => other.clone(),
    }
}

impl Landed {
    pub fn path_for(store: &Store) -> PathBuf {
        session_dir(store).join(FILE_NAME)
    }

    /// The record of `store`'s session; empty when nothing landed while it
    /// ran. A line cut short by a crash, or of an older format, is ignored
    /// (it licenses nothing).
    pub fn load(store: &Store) -> Result<Landed, ChangesError> {
        let path = Landed::path_for(store);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Landed::default()),
            Err(e) => return Err(ChangesError::io("read", &path)(e)),
        };
        let mut landed = Landed::default();
        for line in BufReader::new(file).lines() {
            let line = line.map_err(ChangesError::io("read", &path))?;
            if let Ok(Line { path, kind, host, wrote }) = serde_json::from_str::<Line>(&line) {
                landed.paths.insert(path, Record { kind, host, wrote });
            }
        }
        Ok(landed)
    }

    /// Records what an apply of `store` did in `workspace`: each path it
    /// landed, true where it wrote it, false where the host held it already
    /// (settled later, but licensing nothing); see [`ApplyReport::landings`].
    ///
    /// [`ApplyReport::landings`]: super::ApplyReport::landings
    pub fn record(store: &Store, workspace: &Path, wrote: &HashMap<RelPath, bool>) -> Result<(), ChangesError> {
        if wrote.is_empty() {
            return Ok(());
        }
        let entries = store.entries()?;
        let landed = entries.iter().filter_map(|e| Some((&e.entry.path, &e.entry.kind, *wrote.get(&e.entry.path)?)));
        Landed::record_states(store, workspace, landed)?;
        // The run's final export may have been staged, and settled against
        // the record, while this apply of a checkpoint ran: settle it again
        // now, or what this apply landed is offered a second time.
        let session = session_dir(store);
        if store.dir() != session.join("changes") && Store::is_staged_in(&session) {
            let last = Store::open(&session)?;
            Landed::load(&last)?.settle(&last)?;
        }
        Ok(())
    }

    /// Appends what landed in `workspace` (and flushes it to disk before
    /// returning), each path with the host's state read back right after
    /// the apply and whether the apply wrote it. A path whose host state is
    /// not what the change made (the host moved on meanwhile) is not
    /// recorded: it licenses nothing. Directories that landed earlier above
    /// these paths are recorded anew, so their digest includes what landed
    /// in them now.
    fn record_states<'a>(
        store: &Store,
        workspace: &Path,
        landed: impl Iterator<Item = (&'a RelPath, &'a Kind, bool)>,
    ) -> Result<(), ChangesError> {
        let root = Root::open(workspace).map_err(ChangesError::io("open the workspace", workspace))?;
        let mut all = Landed::load(store)?;
        let mut fresh = HashSet::new();
        for (path, kind, wrote) in landed {
            if let Some(host) = landed_state(&root, path, kind) {
                all.paths.insert(path.clone(), Record { kind: kind.clone(), host, wrote });
                fresh.insert(path.clone());
            }
        }
        let mut dirs: Vec<RelPath> = fresh
            .iter()
            .flat_map(|p| std::iter::once(p.clone()).chain(p.ancestors()))
            .filter(|p| all.paths.get(p).is_some_and(|r| matches!(r.host, Base::Dir { .. })))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        // Deepest first: a directory's answer builds on those below it.
        dirs.sort_by_key(|p| std::cmp::Reverse(p.depth()));
        let mut covered = HashMap::new();
        for dir in &dirs {
            let tree = all.digest_if_covered(&root, dir, &fresh, &mut covered);
            if let Some(record) = all.paths.get_mut(dir)
                && let Base::Dir { tree: digest, .. } = &mut record.host
            {
                *digest = tree;
            }
        }
        let written: HashSet<&RelPath> = fresh.iter().chain(&dirs).collect();
        let path = Landed::path_for(store);
        let mut text = Vec::new();
        for (path, record) in all.paths.iter().filter(|(p, _)| written.contains(p)) {
            let line =
                Line { path: path.clone(), kind: record.kind.clone(), host: record.host.clone(), wrote: record.wrote };
            serde_json::to_writer(&mut text, &line)
                .map_err(|e| ChangesError::io("encode", Path::new(FILE_NAME))(io::Error::other(e)))?;
            text.push(b'\n');
        }
        if text.is_empty() {
            return Ok(());
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(ChangesError::io("write", &path))?;
        file.write_all(&text).and_then(|()| file.sync_all()).map_err(ChangesError::io("write", &path))
    }

    /// The digest of the host directory `dir` when everything below it
    /// landed and still holds what landed; `None` otherwise.
    fn digest_if_covered(
        &self,
        root: &Root,
        dir: &RelPath,
        fresh: &HashSet<RelPath>,
        covered: &mut HashMap<RelPath, bool>,
    ) -> Option<TreeDigest> {
        let parent = root.parent_of(dir).ok()?;
        if !self.covers(&parent, dir, fresh, covered).unwrap_or(false) {
            return None;
        }
        tree::digest_at(&parent, dir.file_name()).ok()
    }

    /// Whether every path below the host directory `dir` (in `parent`) is
    /// recorded and holds what landed there.
    fn covers(
        &self,
        parent: &impl AsFd,
        dir: &RelPath,
        fresh: &HashSet<RelPath>,
        covered: &mut HashMap<RelPath, bool>,
    ) -> io::Result<bool> {
        if let Some(&known) = covered.get(dir) {
            return Ok(known);
        }
        let mut handle = dirfd::open_dir(parent, dir.file_name())?;
        let mut answer = true;
        for name in dirfd::list(&mut handle)? {
            let Ok(path) = dir.join(&name) else {
                answer = false;
                break;
            };
            let Some(record) = self.paths.get(&path).filter(|r| r.wrote) else {
                answer = false;
                break;
            };
            let stat = dirfd::stat_at(&handle, &name)?;
            let host = HostPath { dir: &handle, name: &name, stat };
            // What landed just now was read back already.
            let holds = fresh.contains(&path) || host.check_base(&shallow(&record.host)).is_ok();
            if !holds || (host.file_type() == Some(FileType::Dir) && !self.covers(&handle, &path, fresh, covered)?) {
                answer = false;
                break;
            }
        }
        covered.insert(dir.clone(), answer);
        Ok(answer)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Whether the host still holds at `path` exactly what landed there, as
    /// far as a change of `kind` there would reach: a file's mode and
    /// content, a symlink's target, a directory's mode and, for a change
    /// that removes what is below it, everything below (which must all have
    /// landed, unchanged since).
    pub fn holds<D: AsFd>(&self, host: &HostPath<'_, D>, path: &RelPath, kind: &Kind) -> bool {
        let Some(record) = self.paths.get(path).filter(|r| r.wrote) else { return false };
        let state = match &record.host {
            Base::Dir { tree: None, .. } if removes_below(kind) && host.file_type() == Some(FileType::Dir) => {
                return false;
            }
            state if removes_below(kind) => state.clone(),
            state => shallow(state),
        };
        host.check_base(&state).is_ok()
    }

    /// Marks applied the staged entries of `store` that are exactly what
    /// landed at their path; returns how many.
    pub fn settle(&self, store: &Store) -> Result<usize, ChangesError> {
        if self.paths.is_empty() || !store.is_staged() {
            return Ok(0);
        }
        let _lock = store.lock()?;
        let (header, mut entries) = store.read_all()?;
        let same: Vec<RelPath> = entries
            .iter()
            .filter(|e| {
                e.state == EntryState::Staged && self.paths.get(&e.entry.path).is_some_and(|r| r.kind == e.entry.kind)
            })
            .map(|e| e.entry.path.clone())
            .collect();
        store.set_states_in(header, &mut entries, same.iter(), EntryState::Applied)
    }
}

/// The host's state at `path` when it is what `kind` made there; `None`
/// when the host moved on since (or cannot be read).
fn landed_state(root: &Root, path: &RelPath, kind: &Kind) -> Option<Base> {
    let dir = root.parent_of(path).ok()?;
    let stat = dirfd::stat_at(&dir, path.file_name()).ok()?;
    let state = HostPath { dir: &dir, name: path.file_name(), stat }.state().ok()?;
    let made = match (kind, &state) {
        (Kind::File { mode, size, sha256 }, Base::File { mode: m, size: s, sha256: h }) => {
            (mode, size, sha256) == (m, s, h)
        }
        (Kind::Symlink { target }, Base::Symlink { target: t }) => target == t,
        (Kind::Dir { mode } | Kind::OpaqueDir { mode }, Base::Dir { mode: m, .. }) => mode == m,
        (Kind::Mode { mode }, Base::File { mode: m, .. }) => mode == m,
        (Kind::Delete, Base::Absent) => true,
        _ => false,
    };
    made.then_some(state)
}

#[cfg(test)]
#[path = "landed_tests.rs"]
mod tests;
