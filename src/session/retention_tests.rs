use std::path::Path;

use super::*;
use crate::changes::Selection;
use crate::changes::testutil::Set;
use crate::session::{Session, sessions_dir};

const DAY: Duration = Duration::from_secs(86_400);

fn entry(id: &str, days_old: u32, standing: Standing, now: SystemTime) -> Entry {
    Entry { id: id.into(), when: now - DAY * days_old, standing, command: Vec::new() }
}

#[test]
fn chooses_by_count_and_age_and_never_staged_or_running() {
    let now = SystemTime::now();
    let done = Standing::Done("applied");
    let staged = Standing::Staged("staged");
    let entries = vec![
        entry("e", 0, Standing::Running, now),
        entry("d", 1, done, now),
        entry("c", 2, staged, now),
        entry("b", 3, done, now),
        entry("a", 30, done, now),
        entry("0", 40, staged, now),
    ];
    let one = Retention::new(1, 14);
    assert_eq!(choose(&entries, &one, false, now), [(3, Why::Count), (4, Why::Age)]);
    assert_eq!(choose(&entries, &one, true, now), [(2, Why::Count), (3, Why::Count), (4, Why::Age), (5, Why::Age)]);
    assert_eq!(choose(&entries, &Retention::new(100, 14), false, now), [(4, Why::Age)]);
    assert_eq!(choose(&entries, &Retention::new(0, 0), false, now), [(1, Why::Age), (3, Why::Age), (4, Why::Age)]);
}

#[test]
fn reads_the_start_time_in_an_id() {
    let t = id_time("20250301-101500-3fa2").unwrap();
    assert_eq!(session::timestamp(t), "2025-03-01T10:15:00Z");
    assert_eq!(id_time("junk"), None);
    assert_eq!(id_time("2025030é-101500"), None);
}

/// A finished run's session, made the way `stockade run` makes one.
fn finished_run(data: &Path, started: SystemTime) -> Session {
    let session = loop {
        // Ids are unique to the second by a random suffix: hundreds in one
        // second may meet.
        if let Ok(session) = Session::create(data) {
            break session;
        }
    };
    session
        .write_record(&RunRecord {
            id: session.id.clone(),
            command: vec!["make".into()],
            workspace: "/w".into(),
            started: session::timestamp(started),
            duration_ms: Some(10),
            status: Some(0),
            outcome: Some("exited with 0".into()),
            agent_settings: None,
            git_head: None,
        })
        .unwrap();
    fs::write(session.kernel_log(), vec![b'k'; 8192]).unwrap();
    session
}

fn ids(data: &Path) -> Vec<String> {
    session::list(data).unwrap().into_iter().map(|s| s.id).collect()
}

#[test]
fn three_hundred_runs_leave_the_retention_and_every_staged_session() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ws) = (tmp.path().join("data"), tmp.path().join("ws"));
    fs::create_dir_all(&ws).unwrap();
    let now = SystemTime::now();
    let mut staged = Vec::new();
    for i in 0..300 {
        let session = finished_run(&data, now);
        if i % 50 == 0 {
            let store = Store::open(&session.dir).unwrap();
            Set::new(&ws).file(&format!("f{i}"), b"x\n", 0o644).stage(&store);
            staged.push(session.id.clone());
        } else if i % 50 == 1 {
            // Applied or discarded: nothing awaits review.
            let store = Store::open(&session.dir).unwrap();
            Set::new(&ws).file("g", b"y\n", 0o644).stage(&store);
            store.discard(&Selection::all()).unwrap();
        }
    }
    let retention = Retention::new(100, 14);
    let report = prune(&data, &retention, false, true, now).unwrap();
    assert_eq!(report.removed.len(), 300 - 6 - 100);
    assert!(report.removed.iter().all(|r| !r.had_staged && r.why == Why::Count));
    assert!(report.freed() >= 194 * 8192, "{} bytes freed", report.freed());
    assert_eq!((report.kept_done, report.kept_staged, report.running), (100, 6, 0));
    let left = ids(&data);
    assert_eq!(left.len(), 106);
    assert!(staged.iter().all(|id| left.contains(id)), "staged sessions survive");

    // Again, and again with nothing to keep: staged sessions stay.
    assert!(prune(&data, &retention, false, true, now).unwrap().removed.is_empty());
    let report = prune(&data, &Retention::new(0, 0), false, true, now + DAY).unwrap();
    assert_eq!(report.removed.len(), 100);
    assert_eq!(ids(&data).len(), 6);
    assert!(staged.iter().all(|id| ids(&data).contains(id)));
}

#[test]
fn a_limited_prune_removes_the_oldest_first() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let now = SystemTime::now();
    let mut made: Vec<String> = (0..10).map(|i| finished_run(&data, now - DAY * (30 + i)).id.clone()).collect();
    made.sort();
    let report = prune_at_most(&data, &Retention::default(), false, false, 4, now).unwrap();
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, made[..4].iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(ids(&data).len(), 6, "the rest go next time");
}

#[test]
fn old_sessions_expire_by_their_start_time() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let now = SystemTime::now();
    let old = finished_run(&data, now - DAY * 20).id.clone();
    let recent = finished_run(&data, now - DAY * 2).id.clone();
    let report = prune(&data, &Retention::default(), false, true, now).unwrap();
    let removed: Vec<(&str, Why)> = report.removed.iter().map(|r| (r.id.as_str(), r.why)).collect();
    assert_eq!(removed, [(old.as_str(), Why::Age)]);
    assert_eq!(ids(&data), [recent]);
}

#[test]
fn changes_left_on_a_scratch_disk_are_kept_until_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let now = SystemTime::now();
    // Staging failed (a full disk): the run kept its scratch disk.
    let session = finished_run(&data, now - DAY * 20);
    fs::write(session.scratch_disk(), b"ext4").unwrap();
    let kept = session.id.clone();
    drop(session);
    let report = prune(&data, &Retention::new(0, 0), false, true, now).unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(ids(&data), std::slice::from_ref(&kept));
    let report = prune(&data, &Retention::new(0, 0), true, true, now).unwrap();
    assert_eq!(report.removed.len(), 1);
    assert!(ids(&data).is_empty());
}

#[test]
fn runs_in_progress_are_never_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let now = SystemTime::now();
    // A live run: its process holds the lock, whatever its record says.
    let live = finished_run(&data, now - DAY * 30);
    let parent = sessions_dir(&data);
    // Older stockade: no lock; without a final record it is spared while young.
    let young = parent.join("20250301-101500-aaaa");
    fs::create_dir_all(&young).unwrap();
    let stale = parent.join("20250301-101500-bbbb");
    fs::create_dir_all(&stale).unwrap();
    let old = SystemTime::now() - IN_PROGRESS_GRACE * 2;
    File::open(&stale).unwrap().set_modified(old).unwrap();

    let report = prune(&data, &Retention::new(0, 0), false, true, now).unwrap();
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, ["20250301-101500-bbbb"], "only the stale one without a record");
    assert_eq!(report.running, 2);
    assert!(live.dir.exists() && young.exists());
    drop(live);
    let report = prune(&data, &Retention::new(0, 0), false, true, now).unwrap();
    assert_eq!(report.removed.len(), 1, "once its process is gone, a finished run may go");
}

#[test]
fn include_staged_removes_staged_sessions_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ws) = (tmp.path().join("data"), tmp.path().join("ws"));
    fs::create_dir_all(&ws).unwrap();
    let now = SystemTime::now();
    let session = finished_run(&data, now - DAY * 30);
    Set::new(&ws).file("a", b"1\n", 0o644).stage(&Store::open(&session.dir).unwrap());
    let id = session.id.clone();
    drop(session);
    assert!(prune(&data, &Retention::new(0, 0), false, true, now).unwrap().removed.is_empty());
    let report = prune(&data, &Retention::new(0, 0), true, true, now).unwrap();
    assert_eq!(report.removed.len(), 1);
    assert_eq!((report.removed[0].id.as_str(), report.removed[0].state), (id.as_str(), "staged"));
    assert!(report.removed[0].had_staged);
    assert!(ids(&data).is_empty());
    assert_eq!(fs::read(ws.join("a")).ok(), None, "the workspace is not touched");
}

#[test]
fn never_follows_a_symlinked_session_out_of_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let outside = tmp.path().join("precious");
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("sub/file"), b"keep me").unwrap();
    let parent = sessions_dir(&data);
    fs::create_dir_all(&parent).unwrap();
    std::os::unix::fs::symlink(&outside, parent.join("20200101-000000-0000")).unwrap();
    // A real old session holding a symlink to the same place.
    let session = finished_run(&data, SystemTime::now() - DAY * 30);
    std::os::unix::fs::symlink(&outside, session.dir.join("link")).unwrap();
    drop(session);
    let report = prune(&data, &Retention::new(0, 0), true, true, SystemTime::now()).unwrap();
    assert_eq!(report.removed.len(), 1, "the real one");
    assert_eq!(fs::read(outside.join("sub/file")).unwrap(), b"keep me");
    assert!(fs::symlink_metadata(parent.join("20200101-000000-0000")).is_ok(), "not ours to remove");
}

#[test]
fn a_removal_cut_short_is_finished_next_time() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let leftover = sessions_dir(&data).join(".removing-20250301-101500-aaaa");
    fs::create_dir_all(leftover.join("changes")).unwrap();
    prune(&data, &Retention::default(), false, true, SystemTime::now()).unwrap();
    assert!(!leftover.exists());
}

#[test]
fn an_unchanged_manifest_is_not_read_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ws) = (tmp.path().join("data"), tmp.path().join("ws"));
    fs::create_dir_all(&ws).unwrap();
    let now = SystemTime::now();
    let session = finished_run(&data, now);
    let store = Store::open(&session.dir).unwrap();
    Set::new(&ws).file("a", b"1\n", 0o644).stage(&store);
    drop(session);
    assert_eq!(prune(&data, &Retention::default(), false, true, now).unwrap().kept_staged, 1);
    // Same size, inode and time, other content: the cache answers.
    let manifest = store.dir().join("manifest");
    let meta = fs::metadata(&manifest).unwrap();
    let garbage = vec![b'#'; usize::try_from(meta.len()).unwrap()];
    let file = File::options().write(true).open(&manifest).unwrap();
    (&file).write_all(&garbage).unwrap();
    file.set_modified(meta.modified().unwrap()).unwrap();
    assert_eq!(prune(&data, &Retention::default(), false, true, now).unwrap().kept_staged, 1);
    // Changed: read again, found damaged, and still kept for the user.
    fs::write(&manifest, b"junk\n").unwrap();
    let report = prune(&data, &Retention::new(0, 0), false, true, now).unwrap();
    assert_eq!((report.kept_staged, report.removed.len()), (1, 0));
}

#[test]
fn surveys_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ws) = (tmp.path().join("data"), tmp.path().join("ws"));
    fs::create_dir_all(&ws).unwrap();
    let now = SystemTime::now();
    assert_eq!(survey(&data, now).unwrap(), Survey::default());
    for i in 0..3 {
        let session = finished_run(&data, now);
        if i == 0 {
            Set::new(&ws).file("a", b"1\n", 0o644).stage(&Store::open(&session.dir).unwrap());
        }
    }
    let found = survey(&data, now).unwrap();
    assert_eq!((found.sessions, found.staged, found.running), (3, 1, 0));
    assert!(found.bytes >= 3 * 8192, "{found:?}");
}

/// `benches/store.sh`: the store after 300 runs, with and without
/// retention, and what pruning costs. Numbers, not assertions.
#[test]
#[ignore = "benchmark: benches/store.sh"]
fn bench_store_after_300_runs() {
    let base = std::env::var_os("STOCKADE_BENCH_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let tmp = tempfile::tempdir_in(base).unwrap();
    let (data, ws) = (tmp.path().join("data"), tmp.path().join("ws"));
    fs::create_dir_all(&ws).unwrap();
    let now = SystemTime::now();
    let started = std::time::Instant::now();
    for i in 0..300u32 {
        let session = finished_run(&data, now - Duration::from_secs(u64::from(300 - i) * 120));
        // A boot's kernel log and the VMM's description, as a run leaves them.
        fs::write(session.kernel_log(), vec![b'k'; 48 << 10]).unwrap();
        fs::write(session.dir.join("vmm.json"), vec![b'{'; 2 << 10]).unwrap();
        let store = Store::open(&session.dir).unwrap();
        // What the guest saw of the workspace (a few hundred paths).
        fs::write(store.dir().join("seen"), vec![b's'; 16 << 10]).unwrap();
        if i % 3 == 0 {
            // A third of the runs changed 200 files, later applied or discarded.
            let mut set = Set::new(&ws);
            for f in 0..200 {
                set = set.file(&format!("src/f{f}.rs"), format!("fn f{i}_{f}() {{}}\n").as_bytes(), 0o644);
            }
            set.stage(&store);
            store.discard(&Selection::all()).unwrap();
        } else if i % 100 == 1 {
            Set::new(&ws).file("staged.txt", b"left for review\n", 0o644).stage(&store);
        }
    }
    let made = started.elapsed();
    let before = survey(&data, now).unwrap();
    println!(
        "\n300 runs without retention: {} sessions, {} staged, {:.1} MiB (made in {made:.1?})",
        before.sessions,
        before.staged,
        before.bytes as f64 / f64::from(1 << 20)
    );
    let t = std::time::Instant::now();
    let report = prune(&data, &Retention::default(), false, true, now).unwrap();
    let first = t.elapsed();
    let after = survey(&data, now).unwrap();
    println!(
        "after prune (keep 100, 14 days): {} sessions, {} staged, {:.1} MiB; removed {} ({:.1} MiB) in {first:.1?}",
        after.sessions,
        after.staged,
        after.bytes as f64 / f64::from(1 << 20),
        report.removed.len(),
        report.freed() as f64 / f64::from(1 << 20)
    );
    let t = std::time::Instant::now();
    let again = prune(&data, &Retention::default(), false, true, now).unwrap();
    println!(
        "prune at the start of a run, nothing to remove ({} sessions, states cached): {:.2?}",
        again.kept_done + again.kept_staged,
        t.elapsed()
    );
    let _ = fs::remove_file(sessions_dir(&data).join(STATE_CACHE));
    let t = std::time::Instant::now();
    prune(&data, &Retention::default(), false, true, now).unwrap();
    println!("the same without the state cache (every manifest read): {:.2?}", t.elapsed());
}
