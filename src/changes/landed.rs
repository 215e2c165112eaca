//! What `apply` landed from a running session's checkpoints, in
//! `<session>/landed`: one JSON line per applied path with the state that
//! landed there, the last line of a path winning.
//!
//! The guest still holds those changes, so each later checkpoint and the
//! final export carry them again. There they are marked applied when the
//! guest's state is still the one that landed (never offered twice), and a
//! host path that still holds what landed is the base a newer guest change
//! builds on: no conflict, although the host changed the path after the
//! guest first saw it. A host edit made after the landing is a conflict as
//! ever.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ChangesError;
use super::conflict::HostPath;
use super::model::{EntryState, Kind};
use super::path::RelPath;
use super::store::Store;

/// Where a running session keeps its checkpoint store, below the session
/// directory (`Store::open` of it is `<session>/checkpoint/changes`).
pub const CHECKPOINT_DIR: &str = "checkpoint";
const FILE_NAME: &str = "landed";

#[derive(Serialize, Deserialize)]
struct Line {
    path: RelPath,
    kind: Kind,
}

/// The states that landed, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Landed {
    paths: BTreeMap<RelPath, Kind>,
}

/// The session directory of a session's store or of its checkpoint store.
fn session_dir(store: &Store) -> PathBuf {
    let above = store.dir().parent().unwrap_or(Path::new("."));
    match above.file_name() {
        Some(name) if name == CHECKPOINT_DIR => above.parent().unwrap_or(above).to_path_buf(),
        _ => above.to_path_buf(),
    }
}

impl Landed {
    pub fn path_for(store: &Store) -> PathBuf {
        session_dir(store).join(FILE_NAME)
    }

    /// The record of `store`'s session; empty when nothing landed while it
    /// ran. A line cut short by a crash is ignored.
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
            if let Ok(Line { path, kind }) = serde_json::from_str::<Line>(&line) {
                landed.paths.insert(path, kind);
            }
        }
        Ok(landed)
    }

    /// Appends what landed (and flushes it to disk before returning).
    pub fn record<'a>(
        store: &Store,
        landed: impl Iterator<Item = (&'a RelPath, &'a Kind)>,
    ) -> Result<(), ChangesError> {
        let path = Landed::path_for(store);
        let mut text = Vec::new();
        for (path, kind) in landed {
            serde_json::to_writer(&mut text, &Line { path: path.clone(), kind: kind.clone() })
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

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Whether the host still holds at `path` what landed there.
    pub fn holds<D: AsFd>(&self, host: &HostPath<'_, D>, path: &RelPath) -> bool {
        self.paths.get(path).is_some_and(|kind| host.reached(kind, None))
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
            .filter(|e| e.state == EntryState::Staged && self.paths.get(&e.entry.path) == Some(&e.entry.kind))
            .map(|e| e.entry.path.clone())
            .collect();
        store.set_states_in(header, &mut entries, same.iter(), EntryState::Applied)
    }
}

#[cfg(test)]
#[path = "landed_tests.rs"]
mod tests;
