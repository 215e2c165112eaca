//! The apply journal, `<session>/changes/journal`: the planned operations,
//! written and fsynced before the workspace is touched, then one `done N`
//! line per finished operation; removed when the apply completes.
//!
//! Semantics are roll-forward: an interrupted apply is completed by the next
//! apply of the session (see `apply::recover`). Completing is always possible
//! because file content lives in the store's blobs, not only in the temp
//! files, which are named from the journal (`.stockade-<id>-<op>`) so
//! recovery can remove any it finds.
//!
//! Progress lines are written with one `write` each and not fsynced: they
//! survive the process being killed. After a power loss they may be missing,
//! and recovery then re-checks each operation against the host's state.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ChangesError;
use super::dirfd;
use super::store::write_atomically;
use crate::protocol::change_set::path::{RelPath, escape};

const JOURNAL_VERSION: u32 = 1;

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Make the path what the entry says (directories are created 0700).
    Write,
    /// Give a directory its final mode, after everything inside was written.
    DirMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub path: RelPath,
    pub step: Step,
    /// Applied over a conflict because the user said so.
    pub forced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub version: u32,
    pub id: String,
    /// The workspace path, escaped like change-set paths.
    pub workspace: String,
    pub ops: Vec<Op>,
}

impl Plan {
    pub fn new(workspace: &Path, ops: Vec<Op>) -> Plan {
        Plan { version: JOURNAL_VERSION, id: random_id(), workspace: escape(workspace.as_os_str().as_bytes()), ops }
    }

    /// The temp name operation `index` writes before renaming into place.
    pub fn temp_name(&self, index: usize) -> Vec<u8> {
        format!(".stockade-{}-{index}", self.id).into_bytes()
    }
}

/// An open journal, recording progress.
pub struct Journal {
    file: File,
    path: PathBuf,
}

pub fn journal_path(store_dir: &Path) -> PathBuf {
    store_dir.join("journal")
}

impl Journal {
    /// Makes the plan durable before anything in the workspace changes.
    pub fn begin(store_dir: &Path, plan: &Plan) -> Result<Journal, ChangesError> {
        let path = journal_path(store_dir);
        write_atomically(&path, |out| {
            let mut out = io::BufWriter::new(out);
            serde_json::to_writer(&mut out, plan)?;
            out.write_all(b"\n")?;
            out.flush()
        })
        .map_err(ChangesError::io("write the apply journal", &path))?;
        Journal::reopen(path)
    }

    /// Continues an interrupted journal.
    pub fn reopen(path: PathBuf) -> Result<Journal, ChangesError> {
        let file =
            OpenOptions::new().append(true).open(&path).map_err(ChangesError::io("open the apply journal", &path))?;
        Ok(Journal { file, path })
    }

    /// Records that operation `index` finished, and whether its entry is
    /// now applied. One `write` per line: a killed process leaves whole
    /// lines; a line cut short by a power loss is ignored when reading.
    pub fn done(&mut self, index: usize, applied: bool) -> Result<(), ChangesError> {
        let flag = if applied { 'a' } else { 's' };
        self.file
            .write_all(format!("done {index} {flag}\n").as_bytes())
            .map_err(ChangesError::io("record progress in the apply journal", &self.path))
    }

    /// The apply is complete and durable: forget it.
    pub fn finish(self) -> Result<(), ChangesError> {
        drop(self.file);
        fs::remove_file(&self.path).map_err(ChangesError::io("remove the apply journal", &self.path))?;
        if let Some(dir) = self.path.parent() {
            dirfd::fsync_dir(dir).map_err(ChangesError::io("flush", dir))?;
        }
        Ok(())
    }
}

/// An interrupted apply: its plan and how far it got.
#[derive(Debug)]
pub struct Interrupted {
    pub plan: Plan,
    /// Operations `0..finished` are done.
    pub finished: usize,
    /// For each finished operation, whether its entry was applied.
    pub succeeded: Vec<bool>,
}

/// Reads the journal left by an interrupted apply, if any.
pub fn load(store_dir: &Path) -> Result<Option<Interrupted>, ChangesError> {
    let path = journal_path(store_dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ChangesError::io("read the apply journal", &path)(e)),
    };
    let corrupt = |detail: String| ChangesError::Corrupt { path: path.clone(), detail };
    let mut reader = BufReader::new(file);
    let mut first = String::new();
    reader.read_line(&mut first).map_err(ChangesError::io("read the apply journal", &path))?;
    let plan: Plan = serde_json::from_str(&first).map_err(|e| corrupt(format!("plan: {e}")))?;
    if plan.version != JOURNAL_VERSION {
        return Err(corrupt(format!("journal version {}", plan.version)));
    }
    let mut rest = Vec::new();
    io::Read::read_to_end(&mut reader, &mut rest).map_err(ChangesError::io("read the apply journal", &path))?;
    // Only whole lines count: a line cut short by a crash is not done.
    let complete = rest.iter().rposition(|&b| b == b'\n').map_or(&rest[..0], |end| &rest[..end]);
    let mut succeeded = Vec::new();
    for line in complete.split(|&b| b == b'\n') {
        let parsed = std::str::from_utf8(line).ok().and_then(|l| l.strip_prefix("done ")).and_then(|rest| {
            let (index, flag) = rest.split_once(' ')?;
            Some((index.parse::<usize>().ok()?, flag == "a"))
        });
        // Operations finish in order.
        match parsed {
            Some((i, applied)) if i == succeeded.len() => succeeded.push(applied),
            _ => break,
        }
    }
    Ok(Some(Interrupted { plan, finished: succeeded.len(), succeeded }))
}

fn random_id() -> String {
    let mut bytes = [0u8; 8];
    let filled = File::open("/dev/urandom").and_then(|mut f| io::Read::read_exact(&mut f, &mut bytes)).is_ok();
    if !filled {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let low = u64::try_from(nanos & u128::from(u64::MAX)).unwrap_or(0);
        bytes = (low ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_survives_and_torn_lines_are_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let op = |s: &str| Op { path: RelPath::new(s.as_bytes()).unwrap(), step: Step::Write, forced: false };
        let plan = Plan::new(Path::new("/w/ws"), vec![op("a"), op("b"), op("c")]);
        let mut journal = Journal::begin(tmp.path(), &plan).unwrap();
        journal.done(0, true).unwrap();
        journal.done(1, false).unwrap();
        drop(journal);
        let mut raw = OpenOptions::new().append(true).open(journal_path(tmp.path())).unwrap();
        raw.write_all(b"done 2 a").unwrap(); // cut short by a crash
        let got = load(tmp.path()).unwrap().unwrap();
        assert_eq!(got.plan, plan);
        assert_eq!(got.finished, 2);
        assert_eq!(got.succeeded, [true, false]);
        raw.write_all(b"\n").unwrap();
        assert_eq!(load(tmp.path()).unwrap().unwrap().finished, 3);
        assert!(plan.temp_name(7).starts_with(b".stockade-"));
        Journal::reopen(journal_path(tmp.path())).unwrap().finish().unwrap();
        assert!(load(tmp.path()).unwrap().is_none());
    }
}
