//! `stockade run --ci`: never ask, and report the run as JSON for CI: how it
//! ended, what it left staged, what it did on the network.
//!
//! The summary (schema_version 1) is one JSON object:
//!
//! ```json
//! { "schema_version": 1, "status": "passed" | "failed" | "error",
//!   "exit_code": 0, "command": ["make", "test"], "workspace": "/src/app",
//!   "session": "20260301-101500-3fa2", "session_dir": "...", "started": "...",
//!   "duration_ms": 4210, "error": null,
//!   "changes": { "staged": 3, "applied": 0, "discarded": 0, "added": 2, "modified": 1,
//!                "deleted": 0, "other": 0, "conflicts": 0, "runs_code": 0,
//!                "lines_added": 40, "lines_removed": 2,
//!                "held_back": [".git/hooks/pre-commit"],
//!                "apply_held_back": "stockade apply 20260301-101500-3fa2 --include-code" },
//!   "network": { "allowed": 12, "denied": 1, "failed": 0, "denied_hosts": ["example.com:443"] },
//!   "tampering": [] }
//! ```
//!
//! `status` is "passed" when the command exited 0, "failed" when it ended
//! otherwise (its own status, 126/127 when it could not start, 128+n when
//! killed), "error" when stockade itself failed (then `error` says why and
//! `exit_code` is 125). `tampering` lists what the guest did on the init's
//! channels that the init never does (a forged or second change set, a
//! second control connection...); when it is not empty the run is an
//! "error" whatever the command did, and exits 125 if the command's own
//! status was 0. `held_back` lists (in the change set's escaped form) the
//! files that run code by themselves which `--apply all` left staged for
//! want of `--include-code`, every one of them; `apply_held_back` is the
//! command that applies them (null when none were held back). New fields
//! may be added within a version; a change of meaning bumps it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::changes::Store;
use crate::protocol::audit::Decision;
use crate::protocol::exit::EXIT_STOCKADE;
use crate::proxy::audit;
use crate::review::{ApplyMode, CodeChoice, Summary, SummaryOptions, change_counts, include_code_command};
use crate::session::RunRecord;
use crate::supervisor::Finished;

pub const SCHEMA_VERSION: u32 = 1;

/// At most this many denied destinations are listed (the counts stay exact).
const DENIED_HOSTS_LISTED: usize = 50;

/// What `--apply` means under `--ci`: nothing is ever asked, and nothing is
/// applied unless the flag says so (the config file's `apply` is for people
/// at a terminal, not for CI runners).
pub fn apply_mode(flag: Option<ApplyMode>) -> anyhow::Result<ApplyMode> {
    match flag {
        Some(ApplyMode::Ask) => bail!("--ci never asks: give --apply all or --apply none (the default with --ci)"),
        Some(mode) => Ok(mode),
        None => Ok(ApplyMode::None),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Passed,
    Failed,
    Error,
}

#[derive(Debug, Serialize)]
pub struct RunSummary {
    pub schema_version: u32,
    pub status: Status,
    pub exit_code: u8,
    pub command: Vec<String>,
    pub workspace: Option<String>,
    pub session: Option<String>,
    pub session_dir: Option<PathBuf>,
    pub started: Option<String>,
    pub duration_ms: u64,
    pub error: Option<String>,
    pub changes: ChangeCounts,
    pub network: NetworkCounts,
    pub tampering: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct ChangeCounts {
    pub staged: usize,
    pub applied: usize,
    pub discarded: usize,
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Type, mode and directory-replacing changes.
    pub other: usize,
    pub conflicts: usize,
    /// Staged files that run code by themselves (git hooks, CI files, ...).
    pub runs_code: usize,
    pub lines_added: u64,
    pub lines_removed: u64,
    /// Files that run code, left staged by `--apply all` without
    /// `--include-code` (escaped paths), all of them.
    pub held_back: Vec<String>,
    /// The command that applies them.
    pub apply_held_back: Option<String>,
}

/// How the run was reviewed, for the summary.
#[derive(Debug, Clone, Default)]
pub struct Review {
    /// `--apply all` (under --ci, or from the config file).
    pub apply_all: bool,
    pub code: CodeChoice,
}

#[derive(Debug, Default, Serialize)]
pub struct NetworkCounts {
    pub allowed: usize,
    pub denied: usize,
    /// Allowed, but the connection or lookup failed.
    pub failed: usize,
    /// Denied destinations (`host:port`, DNS names as `name:0`), sorted.
    pub denied_hosts: Vec<String>,
}

impl RunSummary {
    /// The summary of a run that ended as `result` after `duration`.
    pub fn of(
        command: &[String],
        result: &anyhow::Result<Finished>,
        duration: Duration,
        review: &Review,
    ) -> RunSummary {
        let mut summary = RunSummary {
            schema_version: SCHEMA_VERSION,
            status: Status::Error,
            exit_code: EXIT_STOCKADE,
            command: command.to_vec(),
            workspace: None,
            session: None,
            session_dir: None,
            started: None,
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            error: None,
            changes: ChangeCounts::default(),
            network: NetworkCounts::default(),
            tampering: Vec::new(),
        };
        let finished = match result {
            Ok(finished) => finished,
            Err(e) => {
                summary.error = Some(format!("{e:#}"));
                return summary;
            }
        };
        summary.exit_code = finished.status;
        summary.status = match (&finished.failure, finished.status) {
            (Some(_), _) => Status::Error,
            (None, 0) => Status::Passed,
            (None, _) => Status::Failed,
        };
        summary.error = finished.failure.clone();
        if !finished.tampering.is_empty() {
            summary.status = Status::Error;
            summary.exit_code = exit_code(finished);
            summary.tampering = finished.tampering.clone();
            summary.error.get_or_insert_with(|| {
                format!("the guest tampered with the init's channels: {}", finished.tampering.join("; "))
            });
        }
        summary.session = Some(finished.session_id.clone());
        summary.session_dir = Some(finished.session_dir.clone());
        let record = read_record(&finished.session_dir);
        if let Some(record) = &record {
            summary.workspace = Some(record.workspace.clone());
            summary.started = Some(record.started.clone());
        }
        if let Some(workspace) = record.map(|r| PathBuf::from(r.workspace)) {
            match changes(&finished.session_dir, &workspace, &finished.session_id, review) {
                Ok(counts) => summary.changes = counts,
                Err(e) => eprintln!("stockade: warning: the summary has no change counts: {e:#}"),
            }
        }
        match network(&finished.session_dir.join(crate::protocol::audit::AUDIT_FILE)) {
            Ok(counts) => summary.network = counts,
            Err(e) => eprintln!("stockade: warning: the summary has no network counts: {e:#}"),
        }
        summary
    }
}

/// The exit status under `--ci`: the run's own, but never 0 when the guest
/// tampered with the init's channels.
pub fn exit_code(finished: &Finished) -> u8 {
    match (finished.tampering.is_empty(), finished.status) {
        (false, 0) => EXIT_STOCKADE,
        (_, status) => status,
    }
}

fn read_record(session_dir: &Path) -> Option<RunRecord> {
    let bytes = std::fs::read(session_dir.join("run.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn changes(session_dir: &Path, workspace: &Path, session: &str, review: &Review) -> anyhow::Result<ChangeCounts> {
    if !session_dir.join("changes").is_dir() {
        return Ok(ChangeCounts::default());
    }
    let store = Store::open(session_dir)?;
    if !store.is_staged() {
        return Ok(ChangeCounts::default());
    }
    let counts = change_counts(&store)?;
    let options = SummaryOptions { runs_code: review.code.runs_code.clone(), ..SummaryOptions::default() };
    let summary = Summary::build(&store, workspace, &options)?;
    let tally = summary.tally;
    let held_back: Vec<String> = if review.apply_all && !review.code.include_code {
        summary.items.iter().filter(|i| !i.implied && i.danger.is_some()).map(|i| i.path().escaped()).collect()
    } else {
        Vec::new()
    };
    let apply_held_back = (!held_back.is_empty()).then(|| include_code_command(session));
    Ok(ChangeCounts {
        staged: counts.staged,
        applied: counts.applied,
        discarded: counts.discarded,
        added: tally.added,
        modified: tally.modified,
        deleted: tally.deleted,
        other: tally.other,
        conflicts: summary.blocked().count(),
        runs_code: summary.items.iter().filter(|i| !i.implied && i.danger.is_some()).count(),
        lines_added: tally.lines.added,
        lines_removed: tally.lines.removed,
        held_back,
        apply_held_back,
    })
}

/// The proxy's decisions counted from a session's audit log.
pub(super) fn network(log: &Path) -> anyhow::Result<NetworkCounts> {
    if !log.exists() {
        return Ok(NetworkCounts::default());
    }
    let (records, unreadable) = audit::read(log).with_context(|| format!("cannot read {}", log.display()))?;
    if unreadable > 0 {
        eprintln!("stockade: warning: {unreadable} lines of {} could not be read", log.display());
    }
    let mut counts = NetworkCounts::default();
    let mut denied = std::collections::BTreeSet::new();
    for record in &records {
        // A line past the log's cap may sum many records.
        let n = usize::try_from(record.count()).unwrap_or(usize::MAX);
        match record.decision {
            Decision::Allow => counts.allowed += n,
            Decision::Fail => counts.failed += n,
            Decision::Deny => {
                counts.denied += n;
                denied.insert(format!("{}:{}", record.host, record.port));
            }
        }
    }
    counts.denied_hosts = denied.into_iter().take(DENIED_HOSTS_LISTED).collect();
    Ok(counts)
}

/// Writes the summary to `path` (atomically: a temporary file beside it,
/// renamed over it) or, without one, as the last line of stdout.
pub fn write(summary: &RunSummary, path: Option<&Path>) -> anyhow::Result<()> {
    let json = serde_json::to_string(summary).context("cannot encode the run summary")?;
    let Some(path) = path else {
        let mut out = std::io::stdout().lock();
        // Broken pipes included: the command's output may have ended the reader.
        let _ = writeln!(out, "{json}").and_then(|()| out.flush());
        return Ok(());
    };
    let name = path.file_name().with_context(|| format!("--summary {}: give a file name", path.display()))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = File::create(&tmp)
        .and_then(|mut file| {
            file.write_all(json.as_bytes()).and_then(|()| file.write_all(b"\n")).and_then(|()| file.sync_all())
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("--summary {}: cannot write the run summary", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::testutil::{Set, write as write_file};
    use crate::cli::sessions::fixture::{fixture, session};
    use crate::session::sessions_dir;

    const ID: &str = "20250301-101500-aaaa";

    fn finished(f: &crate::cli::sessions::fixture::Fixture, status: u8, failure: Option<&str>) -> Finished {
        Finished {
            status,
            session_id: ID.into(),
            session_dir: sessions_dir(&f.data).join(ID),
            failure: failure.map(str::to_string),
            tampering: Vec::new(),
        }
    }

    #[test]
    fn network_counts_are_exact_after_a_flood_past_the_logs_cap() {
        use crate::protocol::audit::{Kind, Record};
        use crate::proxy::audit::AuditLog;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::protocol::audit::AUDIT_FILE);
        {
            let log = AuditLog::open_capped(&path, 4096, 4096).unwrap();
            for n in 0..10_000 {
                log.record(&Record::new(Kind::Connect, format!("cdn{}.example", n % 7), 443, Decision::Allow));
            }
            log.record(&Record::new(Kind::Connect, "exfil.example", 443, Decision::Deny));
            let mut credential = Record::new(Kind::Https, "api.github.com", 443, Decision::Allow);
            credential.credential = Some("github".into());
            log.record(&credential);
            log.record(&Record::new(Kind::Connect, "down.example", 443, Decision::Fail));
        }
        let counts = network(&path).unwrap();
        assert_eq!((counts.allowed, counts.denied, counts.failed), (10_001, 1, 1));
        assert_eq!(counts.denied_hosts, ["exfil.example:443"]);
    }

    #[test]
    fn the_summary_keeps_its_schema() {
        let f = fixture();
        write_file(&f.ws.join("src/main.rs"), b"fn main() {}\n");
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .file("src/main.rs", b"fn main() { run() }\n", 0o644)
                .file("notes.txt", b"new\n", 0o644)
                .dir(".github", 0o755)
                .dir(".github/workflows", 0o755)
                .file(".github/workflows/ci.yml", b"on: push\n", 0o644)
                .stage(store)
        });
        let log = sessions_dir(&f.data).join(ID).join(crate::protocol::audit::AUDIT_FILE);
        std::fs::write(
            &log,
            concat!(
                r#"{"time":"2025-03-01T10:15:01.000Z","kind":"connect","host":"registry.npmjs.org","port":443,"decision":"allow"}"#,
                "\n",
                r#"{"time":"2025-03-01T10:15:02.000Z","kind":"connect","host":"evil.example","port":443,"decision":"deny"}"#,
                "\n",
                r#"{"time":"2025-03-01T10:15:03.000Z","kind":"dns","host":"evil.example","port":0,"decision":"deny"}"#,
                "\n",
            ),
        )
        .unwrap();
        let command = vec!["make".to_string(), "test".to_string()];
        let summary =
            RunSummary::of(&command, &Ok(finished(&f, 2, None)), Duration::from_millis(1500), &Review::default());
        let json: serde_json::Value = serde_json::to_value(&summary).unwrap();

        let mut keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "changes",
                "command",
                "duration_ms",
                "error",
                "exit_code",
                "network",
                "schema_version",
                "session",
                "session_dir",
                "started",
                "status",
                "tampering",
                "workspace"
            ]
        );
        assert_eq!(json["schema_version"], 1);
        assert_eq!(json["status"], "failed");
        assert_eq!(json["exit_code"], 2);
        assert_eq!(json["command"], serde_json::json!(["make", "test"]));
        assert_eq!(json["session"], ID);
        assert_eq!(json["started"], "2025-03-01T10:15:00Z");
        assert_eq!(json["workspace"], f.ws.display().to_string());
        assert_eq!(json["duration_ms"], 1500);
        assert!(json["error"].is_null());
        assert_eq!(
            json["changes"],
            serde_json::json!({
                "staged": 3, "applied": 0, "discarded": 0, "added": 2, "modified": 1, "deleted": 0,
                "other": 0, "conflicts": 0, "runs_code": 1, "lines_added": 3, "lines_removed": 1,
                "held_back": [], "apply_held_back": null
            })
        );
        assert_eq!(
            json["network"],
            serde_json::json!({
                "allowed": 1, "denied": 2, "failed": 0, "denied_hosts": ["evil.example:0", "evil.example:443"]
            })
        );
    }

    #[test]
    fn the_summary_names_every_file_apply_all_held_back_and_the_command() {
        let f = fixture();
        session(&f, ID, |ws, store| {
            let mut set = Set::new(ws).file("notes.txt", b"new\n", 0o644);
            for i in 0..50 {
                set = set.dir(&format!("d{i:02}"), 0o755).file(&format!("d{i:02}/.envrc"), b"x\n", 0o644);
            }
            set.dir(".git", 0o755)
                .dir(".git/hooks", 0o755)
                .file(".git/hooks/pre-commit", b"#!/bin/sh\n", 0o755)
                .stage(store)
        });
        let all = Review { apply_all: true, code: CodeChoice::default() };
        let summary = RunSummary::of(&[], &Ok(finished(&f, 0, None)), Duration::ZERO, &all);
        assert_eq!(summary.changes.held_back.len(), 51);
        assert!(summary.changes.held_back.contains(&".git/hooks/pre-commit".to_string()));
        assert_eq!(
            summary.changes.apply_held_back.as_deref(),
            Some("stockade apply 20250301-101500-aaaa --include-code")
        );
        let included = Review { apply_all: true, code: CodeChoice { include_code: true, ..CodeChoice::default() } };
        let summary = RunSummary::of(&[], &Ok(finished(&f, 0, None)), Duration::ZERO, &included);
        assert!(summary.changes.held_back.is_empty() && summary.changes.apply_held_back.is_none());
    }

    #[test]
    fn stockade_failures_are_errors_not_command_failures() {
        let f = fixture();
        session(&f, ID, |_, _| {});
        let vm_died =
            RunSummary::of(&[], &Ok(finished(&f, 125, Some("the VM stopped"))), Duration::ZERO, &Review::default());
        assert_eq!((vm_died.status, vm_died.error.as_deref()), (Status::Error, Some("the VM stopped")));
        let own_125 = RunSummary::of(&[], &Ok(finished(&f, 125, None)), Duration::ZERO, &Review::default());
        assert_eq!((own_125.status, own_125.changes.staged), (Status::Failed, 0));
        assert_eq!(
            RunSummary::of(&[], &Ok(finished(&f, 0, None)), Duration::ZERO, &Review::default()).status,
            Status::Passed
        );
        let early = RunSummary::of(&[], &Err(anyhow::anyhow!("no /dev/kvm")), Duration::ZERO, &Review::default());
        assert_eq!((early.status, early.exit_code, early.session), (Status::Error, 125, None));
        assert_eq!(early.error.as_deref(), Some("no /dev/kvm"));
    }

    #[test]
    fn tampering_fails_the_run_and_says_why() {
        let f = fixture();
        session(&f, ID, |_, _| {});
        let mut run = finished(&f, 0, None);
        run.tampering = vec!["a second change set with this run's token was refused".into()];
        let summary = RunSummary::of(&[], &Ok(run.clone()), Duration::ZERO, &Review::default());
        assert_eq!((summary.status, summary.exit_code), (Status::Error, 125));
        assert_eq!(exit_code(&run), 125);
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["tampering"], serde_json::json!(["a second change set with this run's token was refused"]));
        assert!(json["error"].as_str().unwrap().contains("tampered"), "{json}");

        run.status = 3;
        assert_eq!(exit_code(&run), 3, "a failing command keeps its own status");
        let clean = finished(&f, 0, None);
        assert_eq!(exit_code(&clean), 0);
        assert_eq!(
            serde_json::to_value(RunSummary::of(&[], &Ok(clean), Duration::ZERO, &Review::default())).unwrap()["tampering"],
            serde_json::json!([])
        );
    }

    #[test]
    fn ci_never_asks_and_keeps_changes_staged_by_default() {
        assert_eq!(apply_mode(None).unwrap(), ApplyMode::None);
        assert_eq!(apply_mode(Some(ApplyMode::All)).unwrap(), ApplyMode::All);
        assert!(apply_mode(Some(ApplyMode::Ask)).unwrap_err().to_string().contains("--ci never asks"));
    }

    #[test]
    fn the_summary_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        std::fs::write(&path, "old").unwrap();
        let summary = RunSummary::of(&["true".into()], &Err(anyhow::anyhow!("x")), Duration::ZERO, &Review::default());
        write(&summary, Some(&path)).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back["status"], "error");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
        let err = write(&summary, Some(&dir.path().join("missing/s.json"))).unwrap_err();
        assert!(format!("{err:#}").contains("--summary"), "{err:#}");
    }
}
