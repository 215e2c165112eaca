//! Keeping the session store bounded. Every run leaves a session directory;
//! those whose changes were all applied or discarded (or that changed
//! nothing) are removed once they fall out of the retention: beyond the
//! newest `keep` such sessions, or older than `max_age`. A session holding
//! changes that await review is never removed here unless the user says so
//! (`stockade sessions --prune --include-staged`), and a run in progress
//! never is.
//!
//! Pruning runs before every run, so it stays cheap: it lists the session
//! directories and reads each one's small run record and a few file
//! attributes. A change store's review state needs its manifest, which can
//! be large, so the state found is cached in `sessions/.states.json` by the
//! manifest's inode, size and modification time, and a manifest is read
//! again only when it changed. What it costs beyond that is the removing.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::changes::{SetState, Store};
use crate::session::{self, RunRecord};

/// Finished sessions with nothing staged kept by default.
pub const DEFAULT_KEEP: u32 = 100;
/// Days a finished session with nothing staged is kept by default.
pub const DEFAULT_KEEP_DAYS: u32 = 14;
/// A session without a final run record may be a run that is still going
/// (from a stockade without the run lock, or one that has not written its
/// record yet): spared until it is this old.
pub const IN_PROGRESS_GRACE: Duration = Duration::from_secs(3600);

/// Serialises pruners; a run that finds it taken skips pruning.
const PRUNE_LOCK: &str = ".prune.lock";
const STATE_CACHE: &str = ".states.json";
const STATE_CACHE_VERSION: u32 = 1;
/// A session is renamed to this prefix before it is removed, so it leaves
/// the listing at once and a removal cut short is finished next time.
const REMOVING_PREFIX: &str = ".removing-";

/// How much of the store to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished sessions kept, newest first.
    pub keep: u32,
    /// Finished sessions older than this go, whatever `keep` says.
    pub max_age: Duration,
}

impl Retention {
    pub fn new(keep: u32, keep_days: u32) -> Retention {
        Retention { keep, max_age: Duration::from_secs(u64::from(keep_days) * 86_400) }
    }
}

impl Default for Retention {
    fn default() -> Retention {
        Retention::new(DEFAULT_KEEP, DEFAULT_KEEP_DAYS)
    }
}

#[derive(Debug, Error)]
pub enum RetentionError {
    #[error("cannot list the sessions in {}", path.display())]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot lock {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("another stockade is pruning the sessions in {}", .0.display())]
    Busy(PathBuf),
}

/// Where a session stands, for pruning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A run is going on (its lock is held), or may be (no final record, young).
    Running,
    /// Changes await review (staged, partly applied or discarded, an
    /// interrupted apply), or its change store cannot be read: only the
    /// user removes it.
    Staged(&'static str),
    /// Nothing awaits review: applied, discarded, or no changes.
    Done(&'static str),
}

impl Standing {
    pub fn state(self) -> &'static str {
        match self {
            Standing::Running => "running",
            Standing::Staged(word) | Standing::Done(word) => word,
        }
    }
}

/// One session as pruning sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    /// When the run started (or, without a record, when its directory changed last).
    pub when: SystemTime,
    pub standing: Standing,
    pub command: Vec<String>,
}

/// Why a session was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Beyond the newest `keep`.
    Count,
    /// Older than `max_age`.
    Age,
}

/// Which sessions to remove, given every session newest first.
pub fn choose(entries: &[Entry], retention: &Retention, include_staged: bool, now: SystemTime) -> Vec<(usize, Why)> {
    let mut kept = 0u32;
    let mut chosen = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let eligible = match entry.standing {
            Standing::Running => false,
            Standing::Staged(_) => include_staged,
            Standing::Done(_) => true,
        };
        if !eligible {
            continue;
        }
        let age = now.duration_since(entry.when).unwrap_or_default();
        if age > retention.max_age {
            chosen.push((i, Why::Age));
        } else if kept >= retention.keep {
            chosen.push((i, Why::Count));
        } else {
            kept += 1;
        }
    }
    chosen
}

/// A session that was removed.
#[derive(Debug, Clone, Serialize)]
pub struct Removed {
    pub id: String,
    /// Its state when removed ("applied", "none", "staged", ...).
    pub state: &'static str,
    pub why: Why,
    /// Disk space freed.
    pub bytes: u64,
    pub command: Vec<String>,
    /// It held changes awaiting review.
    pub had_staged: bool,
}

/// What a prune did.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub removed: Vec<Removed>,
    /// Sessions left, of each kind.
    pub kept_done: usize,
    pub kept_staged: usize,
    pub running: usize,
    /// Sessions that could not be removed, and why.
    pub failed: Vec<(String, String)>,
}

impl Report {
    pub fn freed(&self) -> u64 {
        self.removed.iter().map(|r| r.bytes).sum()
    }
}

/// At most this many sessions are removed by the prune before a run, so
/// that the first run after a long time (or an upgrade) does not wait for
/// thousands; the rest go in the runs after it.
pub const RUN_START_REMOVALS: usize = 25;

/// Removes what falls out of `retention` from the store in `data_dir`,
/// oldest first. `wait`: wait for another pruner rather than give up
/// ([`RetentionError::Busy`]).
pub fn prune(
    data_dir: &Path,
    retention: &Retention,
    include_staged: bool,
    wait: bool,
    now: SystemTime,
) -> Result<Report, RetentionError> {
    prune_at_most(data_dir, retention, include_staged, wait, usize::MAX, now)
}

/// [`prune`], removing no more than `limit` sessions this time.
pub fn prune_at_most(
    data_dir: &Path,
    retention: &Retention,
    include_staged: bool,
    wait: bool,
    limit: usize,
    now: SystemTime,
) -> Result<Report, RetentionError> {
    let parent = session::sessions_dir(data_dir);
    if !parent.is_dir() {
        return Ok(Report::default());
    }
    let _lock = lock(&parent, wait)?;
    let mut cache = StateCache::load(&parent);
    let (entries, leftovers) = scan(&parent, &mut cache, now)?;
    for leftover in leftovers {
        if let Err(e) = fs::remove_dir_all(&leftover) {
            tracing::warn!("cannot finish removing {}: {e}", leftover.display());
        }
    }
    let chosen = choose(&entries, retention, include_staged, now);
    let mut report = Report::default();
    let mut removed_ids = Vec::new();
    for &(i, why) in chosen.iter().rev().take(limit) {
        let entry = &entries[i];
        match remove(&parent, entry, include_staged) {
            Ok(Some(bytes)) => {
                removed_ids.push(i);
                report.removed.push(Removed {
                    id: entry.id.clone(),
                    state: entry.standing.state(),
                    why,
                    bytes,
                    command: entry.command.clone(),
                    had_staged: matches!(entry.standing, Standing::Staged(_)),
                });
                cache.sessions.remove(&entry.id);
            }
            Ok(None) => {}
            Err(e) => report.failed.push((entry.id.clone(), e.to_string())),
        }
    }
    for (i, entry) in entries.iter().enumerate() {
        if removed_ids.contains(&i) {
            continue;
        }
        match entry.standing {
            Standing::Running => report.running += 1,
            Standing::Staged(_) => report.kept_staged += 1,
            Standing::Done(_) => report.kept_done += 1,
        }
    }
    cache.retain(|id| entries.iter().any(|e| e.id == id));
    cache.save(&parent);
    if !report.removed.is_empty() {
        tracing::info!("removed {} old sessions, freeing {} bytes", report.removed.len(), report.freed());
    }
    Ok(report)
}

/// What the store holds, for `stockade doctor`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Survey {
    pub sessions: usize,
    pub staged: usize,
    pub running: usize,
    /// Disk space the sessions take.
    pub bytes: u64,
}

/// Counts the sessions and measures them (reads every session's tree: for
/// doctor, not for every run). Uses the state cache without updating it.
pub fn survey(data_dir: &Path, now: SystemTime) -> Result<Survey, RetentionError> {
    let parent = session::sessions_dir(data_dir);
    if !parent.is_dir() {
        return Ok(Survey::default());
    }
    let mut cache = StateCache::load(&parent);
    let (entries, _) = scan(&parent, &mut cache, now)?;
    let mut survey = Survey { sessions: entries.len(), ..Survey::default() };
    for entry in &entries {
        match entry.standing {
            Standing::Staged(_) => survey.staged += 1,
            Standing::Running => survey.running += 1,
            Standing::Done(_) => {}
        }
        survey.bytes += disk_usage(&parent.join(&entry.id));
    }
    Ok(survey)
}

fn lock(parent: &Path, wait: bool) -> Result<Flock<File>, RetentionError> {
    let path = parent.join(PRUNE_LOCK);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|source| RetentionError::Lock { path: path.clone(), source })?;
    let how = if wait { FlockArg::LockExclusive } else { FlockArg::LockExclusiveNonblock };
    Flock::lock(file, how).map_err(|(_, errno)| match errno {
        nix::errno::Errno::EWOULDBLOCK => RetentionError::Busy(parent.to_path_buf()),
        other => RetentionError::Lock { path, source: other.into() },
    })
}

/// Every session, newest first, and the leftovers of removals cut short.
fn scan(parent: &Path, cache: &mut StateCache, now: SystemTime) -> Result<(Vec<Entry>, Vec<PathBuf>), RetentionError> {
    let list_error = |source| RetentionError::List { path: parent.to_path_buf(), source };
    let mut entries = Vec::new();
    let mut leftovers = Vec::new();
    for item in fs::read_dir(parent).map_err(list_error)? {
        let item = item.map_err(list_error)?;
        let Ok(name) = item.file_name().into_string() else { continue };
        // lstat: a symlink here is not a session of ours, whatever it points at.
        let Ok(meta) = fs::symlink_metadata(item.path()) else { continue };
        if !meta.file_type().is_dir() {
            continue;
        }
        if name.starts_with(REMOVING_PREFIX) {
            leftovers.push(item.path());
            continue;
        }
        if name.starts_with('.') {
            continue;
        }
        entries.push(look_at(parent, name, &meta, cache, now));
    }
    entries.sort_by(|a, b| b.id.cmp(&a.id));
    Ok((entries, leftovers))
}

/// One session, from its run record, its lock and its change store's state.
fn look_at(parent: &Path, id: String, meta: &fs::Metadata, cache: &mut StateCache, now: SystemTime) -> Entry {
    let dir = parent.join(&id);
    let record: Option<RunRecord> = read_small(&dir.join("run.json")).and_then(|b| serde_json::from_slice(&b).ok());
    let changed = meta.modified().unwrap_or(now);
    let started = record.as_ref().and_then(|r| humantime::parse_rfc3339(&r.started).ok());
    let when = started.or_else(|| id_time(&id)).unwrap_or(changed);
    let command = record.as_ref().map(|r| r.command.clone()).unwrap_or_default();
    let finished = record.as_ref().is_some_and(|r| r.status.is_some());
    let latest = started.map_or(changed, |s| s.max(changed));
    let standing = if session::is_running(&dir)
        || (!finished && now.duration_since(latest).unwrap_or_default() < IN_PROGRESS_GRACE)
    {
        Standing::Running
    } else {
        review_state(&id, &dir, cache)
    };
    Entry { id, when, standing, command }
}

/// Reads a run record, refusing anything too large to be one.
fn read_small(path: &Path) -> Option<Vec<u8>> {
    const MAX_RECORD: u64 = 1 << 20;
    let meta = fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_RECORD {
        return None;
    }
    fs::read(path).ok()
}

/// The start time in a session id (`YYYYMMDD-HHMMSS-xxxx`).
fn id_time(id: &str) -> Option<SystemTime> {
    let (date, rest) = id.split_at_checked(8)?;
    let time = rest.strip_prefix('-')?.get(..6)?;
    let text = format!(
        "{}-{}-{}T{}:{}:{}Z",
        date.get(..4)?,
        date.get(4..6)?,
        date.get(6..8)?,
        time.get(..2)?,
        time.get(2..4)?,
        time.get(4..6)?
    );
    humantime::parse_rfc3339(&text).ok()
}

/// Where a session's changes are, from the cache when its manifest is unchanged.
fn review_state(id: &str, dir: &Path, cache: &mut StateCache) -> Standing {
    let changes = dir.join("changes");
    if fs::symlink_metadata(changes.join("journal")).is_ok() {
        return Standing::Staged("apply interrupted");
    }
    // Staging failed (a full disk) and the guest's changes are still on its
    // scratch disk; a run in progress is spared by its lock instead.
    if session::is_interrupted(dir) {
        return Standing::Staged(session::INTERRUPTED);
    }
    let manifest = match fs::symlink_metadata(changes.join("manifest")) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Standing::Done("none"),
        Err(_) => return Standing::Staged("unreadable"),
    };
    let key = ManifestKey { ino: manifest.ino(), size: manifest.size(), mtime_ns: mtime_ns(&manifest) };
    if let Some(cached) = cache.sessions.get(id).filter(|c| c.key == key) {
        return standing_of(&cached.state);
    }
    let word = match Store::open(dir).and_then(|store| store.state()) {
        Ok(SetState::Empty) => "none",
        Ok(SetState::Staged) => "staged",
        Ok(SetState::Partial) => "partly reviewed",
        Ok(SetState::Applied) => "applied",
        Ok(SetState::Discarded) => "discarded",
        // Unknown is treated as staged: the user decides.
        Err(_) => "damaged",
    };
    cache.sessions.insert(id.to_string(), CachedState { key, state: word.to_string() });
    cache.changed = true;
    standing_of(word)
}

fn standing_of(word: &str) -> Standing {
    match word {
        "none" => Standing::Done("none"),
        "applied" => Standing::Done("applied"),
        "discarded" => Standing::Done("discarded"),
        "staged" => Standing::Staged("staged"),
        "partly reviewed" => Standing::Staged("partly reviewed"),
        _ => Standing::Staged("damaged"),
    }
}

fn mtime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

/// Removes one session; `None` when it turned out to be in use or staged.
/// The session is renamed out of the listing first (a rename never
/// follows a symlink), then removed by `remove_dir_all`, which does not
/// follow symlinks inside it either.
fn remove(parent: &Path, entry: &Entry, include_staged: bool) -> io::Result<Option<u64>> {
    let dir = parent.join(&entry.id);
    if !fs::symlink_metadata(&dir)?.file_type().is_dir() || session::is_running(&dir) {
        return Ok(None);
    }
    // An apply or discard holds the store's lock: wait for none, take it,
    // and look again, so a session cannot gain staged changes meanwhile.
    let changes = dir.join("changes");
    let _store_lock = if fs::symlink_metadata(&changes).is_ok_and(|m| m.is_dir()) {
        match Store::open(&dir).and_then(|store| store.lock()) {
            Ok(lock) => Some(lock),
            Err(e) => {
                tracing::info!("session {} is in use, kept: {e}", entry.id);
                return Ok(None);
            }
        }
    } else {
        None
    };
    let held = fs::symlink_metadata(changes.join("journal")).is_ok() || session::holds_unstaged_disk(&dir);
    if !include_staged && held {
        return Ok(None);
    }
    let trash = parent.join(format!("{REMOVING_PREFIX}{}", entry.id));
    fs::rename(&dir, &trash)?;
    let bytes = disk_usage(&trash);
    fs::remove_dir_all(&trash)?;
    Ok(Some(bytes))
}

/// Disk space a tree takes (allocated blocks: sparse files count for what
/// they hold). Symlinks count as themselves and are never followed.
pub fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else { return 0 };
    let mut total = meta.blocks() * 512;
    if meta.file_type().is_dir() {
        if let Ok(reader) = fs::read_dir(path) {
            for item in reader.flatten() {
                total += disk_usage(&item.path());
            }
        }
    }
    total
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct ManifestKey {
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CachedState {
    key: ManifestKey,
    state: String,
}

/// Review states found in manifests, by session id.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateCache {
    version: u32,
    sessions: BTreeMap<String, CachedState>,
    #[serde(skip)]
    changed: bool,
}

impl StateCache {
    fn load(parent: &Path) -> StateCache {
        read_small(&parent.join(STATE_CACHE))
            .and_then(|bytes| serde_json::from_slice::<StateCache>(&bytes).ok())
            .filter(|c| c.version == STATE_CACHE_VERSION)
            .unwrap_or(StateCache { version: STATE_CACHE_VERSION, ..StateCache::default() })
    }

    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.sessions.len();
        self.sessions.retain(|id, _| keep(id));
        self.changed |= self.sessions.len() != before;
    }

    /// Best effort: a cache that cannot be written is rebuilt next time.
    fn save(&self, parent: &Path) {
        if !self.changed {
            return;
        }
        let path = parent.join(STATE_CACHE);
        let tmp = parent.join(format!("{STATE_CACHE}.tmp"));
        let result = serde_json::to_vec(self).map_err(io::Error::other).and_then(|bytes| {
            let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            file.write_all(&bytes)?;
            fs::rename(&tmp, &path)
        });
        if let Err(e) = result {
            tracing::debug!("cannot save {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
#[path = "retention_tests.rs"]
mod tests;
