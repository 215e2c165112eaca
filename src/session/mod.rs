//! The session store: one directory per run under
//! `~/.local/share/stockade/sessions/<id>`, holding the kernel log, the VMM's
//! own log, the vsock sockets while it runs, the run record, and the staged
//! changes (`changes/`). Ids start with the start time (`YYYYMMDD-HHMMSS-`),
//! so they sort by age and a prefix names a day or a minute.

pub mod lookup;
pub mod retention;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The scratch disk's name in a session; present after a run only when the
/// guest's changes were not staged (the run was interrupted, or staging
/// failed), until `stockade recover` stages them.
pub const SCRATCH_DISK: &str = "scratch.img";

/// What an interrupted session is said to be, in `stockade sessions`.
pub const INTERRUPTED: &str = "interrupted";

/// Whether the session in `dir` was interrupted: nothing runs it (its
/// supervisor may have died without a word: the run lock went with it),
/// and the guest's changes are only on its scratch disk.
pub fn is_interrupted(dir: &Path) -> bool {
    holds_unstaged_disk(dir) && !is_running(dir)
}

/// Whether the session in `dir` holds a scratch disk whose changes are not
/// staged. A disk beside a complete change set (the init exported, then
/// went silent) holds nothing more: the set is what the run changed.
pub fn holds_unstaged_disk(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join(SCRATCH_DISK)).is_ok_and(|m| m.is_file()) && !crate::changes::Store::is_staged_in(dir)
}

/// What a finished (or running) session did, as `run.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub command: Vec<String>,
    pub workspace: String,
    pub started: String,
    pub duration_ms: Option<u64>,
    /// The exit status stockade returned.
    pub status: Option<i32>,
    /// How the command ended, in words.
    pub outcome: Option<String>,
    /// The agent whose settings this session holds for the home directory
    /// (staged from its state after another session's run): applied only
    /// when named, never the default session of `diff`, `apply`, `discard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_settings: Option<String>,
    /// The commit the workspace's git repository had checked out when the
    /// run started (`HEAD`, full id): the parent of `stockade apply
    /// --branch`. Absent outside a repository, on an unborn branch, and in
    /// records older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_head: Option<String>,
}

/// The outcome recorded for an agent's settings before `agent_settings`
/// named them.
pub const AGENT_SETTINGS_OUTCOME: &str = "staged from the agent's state";

impl RunRecord {
    /// The agent whose settings for the home directory the session holds.
    pub fn agent_settings(&self) -> Option<&str> {
        match &self.agent_settings {
            Some(name) => Some(name),
            None if self.outcome.as_deref() == Some(AGENT_SETTINGS_OUTCOME) => Some(""),
            None => None,
        }
    }
}

/// Held (flock) by the process that runs a session, for as long as it
/// runs: the kernel drops it when that process ends, however it ends, so
/// pruning can tell a live run from a dead one.
const RUN_LOCK: &str = "run.lock";

pub struct Session {
    pub id: String,
    pub dir: PathBuf,
    pub started: SystemTime,
    /// `None` only if the lock could not be taken (the run goes on).
    _running: Option<Flock<fs::File>>,
}

impl Session {
    /// Creates a new session directory (0700: it will hold sockets and logs).
    pub fn create(data_dir: &Path) -> anyhow::Result<Session> {
        let started = SystemTime::now();
        let stamp = humantime::format_rfc3339_seconds(started).to_string();
        let compact: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
        let suffix = random_suffix();
        let id = format!("{}-{}-{suffix}", &compact[..8], &compact[8..14]);
        let parent = data_dir.join("sessions");
        fs::create_dir_all(&parent).with_context(|| format!("cannot create the session store {}", parent.display()))?;
        let dir = parent.join(&id);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create the session directory {}", dir.display()))?;
        let running = match take_run_lock(&dir) {
            Ok(lock) => Some(lock),
            Err(e) => {
                // Without it, pruning still spares a young session without a final record.
                tracing::warn!("cannot lock {}: {e}", dir.join(RUN_LOCK).display());
                None
            }
        };
        Ok(Session { id, dir, started, _running: running })
    }

    /// The guest's scratch disk (the upper layer of its workspace overlay).
    pub fn scratch_disk(&self) -> PathBuf {
        self.dir.join(SCRATCH_DISK)
    }

    pub fn kernel_log(&self) -> PathBuf {
        self.dir.join("kernel.log")
    }

    pub fn vmm_log(&self) -> PathBuf {
        self.dir.join("vmm.log")
    }

    /// dockerd's output, with `--docker`.
    pub fn dockerd_log(&self) -> PathBuf {
        self.dir.join("dockerd.log")
    }

    /// Writes the run record atomically (temp file, fsync, rename).
    pub fn write_record(&self, record: &RunRecord) -> anyhow::Result<()> {
        let path = self.dir.join("run.json");
        let tmp = self.dir.join(".run.json.tmp");
        // One write: serde_json writes each token on its own.
        let mut json = serde_json::to_vec_pretty(record)?;
        json.push(b'\n');
        let mut file = fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        file.write_all(&json)?;
        file.sync_all()?;
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }
}

impl Session {
    /// Takes over an interrupted session to recover it: holds its run lock
    /// (so that it reads as running, and nothing else takes it meanwhile).
    pub fn resume(dir: &Path, id: &str, started: SystemTime) -> anyhow::Result<Session> {
        let path = dir.join(RUN_LOCK);
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            anyhow::anyhow!("session {id} is in use by another stockade ({errno}); wait for it to end")
        })?;
        Ok(Session { id: id.to_string(), dir: dir.to_path_buf(), started, _running: Some(lock) })
    }
}

fn take_run_lock(dir: &Path) -> std::io::Result<Flock<fs::File>> {
    let file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dir.join(RUN_LOCK))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| errno.into())
}

/// Whether a process is running the session in `dir` now. Sessions made
/// before the lock existed have none, and read as not running.
pub fn is_running(dir: &Path) -> bool {
    let path = dir.join(RUN_LOCK);
    // O_NOFOLLOW: the lock is ours; a symlink in its place is not.
    let Ok(file) = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) else {
        return false;
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_) => false,
        Err((_, errno)) => errno == nix::errno::Errno::EWOULDBLOCK,
    }
}

fn random_suffix() -> String {
    let mut bytes = [0u8; 2];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    format!("{:02x}{:02x}", bytes[0], bytes[1])
}

/// The RFC 3339 form of a time, to the second.
pub fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Where the sessions live.
pub fn sessions_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("sessions")
}

/// A session found in the store.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: String,
    pub dir: PathBuf,
    /// `None` when `run.json` is missing or unreadable.
    pub record: Option<RunRecord>,
}

impl SessionInfo {
    pub fn started(&self) -> Option<SystemTime> {
        self.record.as_ref().and_then(|r| humantime::parse_rfc3339(&r.started).ok())
    }

    pub fn workspace(&self) -> Option<PathBuf> {
        self.record.as_ref().map(|r| PathBuf::from(&r.workspace))
    }
}

/// Every session, newest first.
pub fn list(data_dir: &Path) -> anyhow::Result<Vec<SessionInfo>> {
    let parent = sessions_dir(data_dir);
    let reader = match fs::read_dir(&parent) {
        Ok(reader) => reader,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot list the sessions in {}", parent.display())),
    };
    let mut sessions = Vec::new();
    for entry in reader {
        let entry = entry.with_context(|| format!("cannot list the sessions in {}", parent.display()))?;
        let Ok(id) = entry.file_name().into_string() else { continue };
        if id.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = entry.path();
        let record = fs::read(dir.join("run.json")).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
        sessions.push(SessionInfo { id, dir, record });
    }
    sessions.sort_by(|a, b| b.id.cmp(&a.id));
    Ok(sessions)
}

/// Why a session id given on the command line names no single session.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LookupError {
    #[error("there are no sessions yet; `stockade run` makes one")]
    NoSessions,
    #[error("no session matches {given:?}; the most recent are {}; `stockade sessions` lists them all", .recent.join(", "))]
    Unknown { given: String, recent: Vec<String> },
    #[error("{given:?} matches {} sessions ({}); give more of the id", .candidates.len(), .candidates.join(", "))]
    Ambiguous { given: String, candidates: Vec<String> },
}

/// The session whose id is `given` or starts with it (`sessions` newest first).
pub fn find<'a>(sessions: &'a [SessionInfo], given: &str) -> Result<&'a SessionInfo, LookupError> {
    if let Some(exact) = sessions.iter().find(|s| s.id == given) {
        return Ok(exact);
    }
    let matching: Vec<&SessionInfo> = sessions.iter().filter(|s| s.id.starts_with(given)).collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] if sessions.is_empty() => Err(LookupError::NoSessions),
        [] => Err(LookupError::Unknown {
            given: given.to_string(),
            recent: sessions.iter().take(3).map(|s| s.id.clone()).collect(),
        }),
        many => {
            let mut candidates: Vec<String> = many.iter().take(5).map(|s| s.id.clone()).collect();
            if many.len() > 5 {
                candidates.push(format!("{} more", many.len() - 5));
            }
            Err(LookupError::Ambiguous { given: given.to_string(), candidates })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(data: &Path, id: &str, workspace: &str) {
        let dir = sessions_dir(data).join(id);
        fs::create_dir_all(&dir).unwrap();
        let record = RunRecord {
            id: id.into(),
            command: vec!["true".into()],
            workspace: workspace.into(),
            started: "2025-03-01T10:15:00Z".into(),
            duration_ms: Some(5),
            status: Some(0),
            outcome: None,
            agent_settings: None,
            git_head: None,
        };
        fs::write(dir.join("run.json"), serde_json::to_vec(&record).unwrap()).unwrap();
    }

    #[test]
    fn finds_sessions_by_unique_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(list(tmp.path()).unwrap().len(), 0);
        make(tmp.path(), "20250301-101500-aaaa", "/w");
        make(tmp.path(), "20250301-101510-bbbb", "/w");
        make(tmp.path(), "20250302-090000-cccc", "/w");
        fs::create_dir_all(sessions_dir(tmp.path()).join("20250303-000000-dddd")).unwrap();
        let all = list(tmp.path()).unwrap();
        let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(
            ids,
            ["20250303-000000-dddd", "20250302-090000-cccc", "20250301-101510-bbbb", "20250301-101500-aaaa"]
        );
        assert!(all[0].record.is_none(), "a session without run.json is still listed");
        assert_eq!(all[1].workspace(), Some(PathBuf::from("/w")));
        assert!(all[1].started().is_some());

        assert_eq!(find(&all, "20250302").unwrap().id, "20250302-090000-cccc");
        assert_eq!(find(&all, "20250301-101500-aaaa").unwrap().id, "20250301-101500-aaaa");
        let ambiguous = find(&all, "20250301").unwrap_err();
        assert!(matches!(&ambiguous, LookupError::Ambiguous { candidates, .. } if candidates.len() == 2));
        assert!(ambiguous.to_string().contains("20250301-101510-bbbb"), "{ambiguous}");
        let unknown = find(&all, "1999").unwrap_err();
        assert!(unknown.to_string().contains("stockade sessions"), "{unknown}");
        assert_eq!(find(&[], "2025").unwrap_err(), LookupError::NoSessions);
    }

    #[test]
    fn a_session_reads_as_running_while_its_run_holds_it() {
        let tmp = tempfile::tempdir().unwrap();
        let session = Session::create(tmp.path()).unwrap();
        let dir = session.dir.clone();
        assert!(is_running(&dir));
        drop(session);
        assert!(!is_running(&dir), "the lock goes with the process's hold on it");
        assert!(!is_running(tmp.path()), "no lock file: not running");
    }
}
