//! The session store stays bounded: `stockade sessions --prune` on a store
//! laid out as runs leave it (run record, logs, change store). No VM is
//! started.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::util::{TempDir, stockade_in, text};

const DAY: Duration = Duration::from_secs(86_400);

/// How a run left its changes.
#[derive(Clone, Copy, PartialEq)]
enum Changes {
    None,
    /// An apply was cut short: changes still await review.
    ApplyInterrupted,
}

/// A finished run's session as `stockade run` leaves it; returns its id.
fn finished_run(dir: &Path, n: usize, started: SystemTime, changes: Changes) -> String {
    let stamp = humantime::format_rfc3339_seconds(started).to_string();
    let digits: String = stamp.chars().filter(char::is_ascii_digit).collect();
    let id = format!("{}-{}-{:04x}", &digits[..8], &digits[8..14], n);
    let session = sessions(dir).join(&id);
    std::fs::create_dir_all(&session).unwrap();
    let record = serde_json::json!({
        "id": id, "command": ["make", "test"], "workspace": "/w", "started": stamp,
        "duration_ms": 1200, "status": 0, "outcome": "exited with 0",
    });
    std::fs::write(session.join("run.json"), serde_json::to_vec_pretty(&record).unwrap()).unwrap();
    std::fs::write(session.join("kernel.log"), vec![b'k'; 16 << 10]).unwrap();
    std::fs::write(session.join("vmm.log"), b"").unwrap();
    std::fs::write(session.join("run.lock"), b"").unwrap();
    if changes == Changes::ApplyInterrupted {
        std::fs::create_dir_all(session.join("changes")).unwrap();
        std::fs::write(session.join("changes/journal"), b"{}\n").unwrap();
    }
    id
}

fn sessions(dir: &Path) -> PathBuf {
    dir.join("data/sessions")
}

fn left(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(sessions(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| !name.starts_with('.'))
        .collect();
    ids.sort();
    ids
}

#[test]
fn three_hundred_runs_leave_at_most_the_retention() {
    let dir = TempDir::new("sessions-300");
    let now = SystemTime::now();
    let mut staged = Vec::new();
    for n in 0..300 {
        let changes = if n % 60 == 0 { Changes::ApplyInterrupted } else { Changes::None };
        let id = finished_run(dir.path(), n, now - Duration::from_secs(60 * n as u64), changes);
        if changes != Changes::None {
            staged.push(id);
        }
    }
    let out = stockade_in(dir.path(), &["sessions", "--prune"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(report.contains("removed 195 session(s), freed "), "{report}");
    assert!(report.contains("kept 100 finished, 5 with staged changes, 0 running"), "{report}");
    assert!(report.contains("beyond the newest 100"), "{report}");
    let ids = left(dir.path());
    assert_eq!(ids.len(), 105);
    for id in &staged {
        assert!(ids.contains(id), "staged session {id} survives");
    }

    // Again: nothing more goes, staged sessions included.
    let out = stockade_in(dir.path(), &["sessions", "--prune", "--keep-sessions", "0", "--keep-days", "0"]);
    assert!(text(&out.stdout).contains("removed 100 session(s)"), "{}", text(&out.stdout));
    staged.sort();
    assert_eq!(left(dir.path()), staged);
    let listed = text(&stockade_in(dir.path(), &["sessions"]).stdout);
    assert!(listed.contains("apply interrupted"), "{listed}");
}

#[test]
fn sessions_older_than_keep_days_expire() {
    let dir = TempDir::new("sessions-age");
    let now = SystemTime::now();
    let old = finished_run(dir.path(), 1, now - 20 * DAY, Changes::None);
    let recent = finished_run(dir.path(), 2, now - 2 * DAY, Changes::None);
    let staged = finished_run(dir.path(), 3, now - 200 * DAY, Changes::ApplyInterrupted);

    // The config file keeps a month: nothing is old enough.
    let config = dir.path().join("xdg/stockade/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "keep_days = 30\n").unwrap();
    let out = stockade_in(dir.path(), &["sessions", "--prune"]);
    assert!(text(&out.stdout).starts_with("removed 0 session(s)"), "{}", text(&out.stdout));

    std::fs::write(&config, "keep_days = 14\n").unwrap();
    let out = stockade_in(dir.path(), &["sessions", "--prune"]);
    let report = text(&out.stdout);
    assert!(report.starts_with(&format!("removed {old}  none")), "{report}");
    assert!(report.contains("older than 14 days"), "{report}");
    let mut expected = vec![recent, staged];
    expected.sort();
    assert_eq!(left(dir.path()), expected);
}

#[test]
fn include_staged_lists_each_staged_session_it_drops() {
    let dir = TempDir::new("sessions-staged");
    let now = SystemTime::now();
    let staged = finished_run(dir.path(), 1, now - 30 * DAY, Changes::ApplyInterrupted);
    let out = stockade_in(dir.path(), &["sessions", "--prune", "--include-staged", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["removed"][0]["id"], staged.as_str());
    assert_eq!(report["removed"][0]["had_staged"], true);
    assert_eq!(report["removed"][0]["why"], "age");
    assert!(left(dir.path()).is_empty());

    let staged = finished_run(dir.path(), 2, now - 30 * DAY, Changes::ApplyInterrupted);
    let out = stockade_in(dir.path(), &["sessions", "--prune", "--include-staged"]);
    let report = text(&out.stdout);
    assert!(report.contains(&format!("removed {staged}  apply interrupted")), "{report}");
    assert!(report.contains(&format!("dropped the unapplied changes of 1 session(s): {staged}")), "{report}");
}

#[test]
fn a_symlink_in_the_store_is_never_followed() {
    let dir = TempDir::new("sessions-symlink");
    let precious = dir.path().join("precious");
    std::fs::create_dir_all(&precious).unwrap();
    std::fs::write(precious.join("file"), b"keep me").unwrap();
    std::fs::create_dir_all(sessions(dir.path())).unwrap();
    std::os::unix::fs::symlink(&precious, sessions(dir.path()).join("20200101-000000-0000")).unwrap();
    let out = stockade_in(dir.path(), &["sessions", "--prune", "--include-staged", "--keep-sessions", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(precious.join("file")).unwrap(), b"keep me");
}

#[test]
fn prune_flags_need_prune() {
    let dir = TempDir::new("sessions-flags");
    let out = stockade_in(dir.path(), &["sessions", "--include-staged"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("--prune"), "{}", text(&out.stderr));
}
