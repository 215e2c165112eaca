//! An attack on live review: an apply of a running session cut short must
//! be completed by the next one, not lost with the checkpoint it read.

use std::fs;
use std::path::Path;

use super::live;

/// A running session whose init answers every checkpoint with `d/0` to
/// `d/9` holding `new N`; the session directory.
fn running_session(tmp: &Path) -> (std::path::PathBuf, live::Server) {
    use crate::protocol::change_set::{Base, RelPath};

    let dir = tmp.join("session");
    fs::create_dir(&dir).unwrap();
    crate::changes::Store::open(&dir).unwrap();
    let (server, _init) = super::fake_init::serve(
        &dir,
        Box::new(|_, w| {
            w.dir(&RelPath::new(b"d").unwrap(), 0o755, &Base::Absent).unwrap();
            for i in 0..10 {
                let content = format!("new {i}");
                let path = RelPath::new(format!("d/{i}")).unwrap();
                w.file(&path, 0o644, content.len() as u64, &mut content.as_bytes(), &Base::Absent).unwrap();
            }
            true
        }),
    );
    (dir, server)
}

/// The `.stockade-` temp files below `dir`.
fn temps(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().as_encoded_bytes().starts_with(b".stockade-") {
            found.push(entry.path());
        }
        if entry.file_type().unwrap().is_dir() {
            found.extend(temps(&entry.path()));
        }
    }
    found
}

/// An apply of a running session that is interrupted keeps its journal in
/// the checkpoint store; the next `stockade apply` asks for a checkpoint,
/// which replaces that store, journal and all. The interrupted apply is
/// never completed: its temp files (guest content, half written) stay in
/// the workspace for good.
#[test]
fn an_interrupted_apply_of_a_running_session_is_completed_by_the_next_one() {
    use crate::changes::ApplyOptions;
    use crate::changes::test_access::{apply, apply_with_hook, interrupted_journal};

    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let (dir, _server) = running_session(tmp.path());

    let reading = live::ask(&dir).unwrap().expect("running");
    let mut n = 0;
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut hook = |_: &crate::protocol::change_set::RelPath| {
            n += 1;
            assert!(n < 5, "simulated crash");
        };
        apply_with_hook(&reading.store, &ws, &ApplyOptions::all(), &mut hook, &mut crate::progress::Silent)
    }));
    assert!(crashed.is_err());
    let interrupted = interrupted_journal(reading.store.dir()).unwrap().expect("the journal stays");
    // The operation in flight left its temp file, as a crash does.
    let temp = ws.join("d").join(String::from_utf8(interrupted.plan.temp_name(interrupted.finished)).unwrap());
    fs::write(&temp, b"new ").unwrap();
    drop(reading);

    // The user applies again while the command still runs.
    let reading = live::ask(&dir).unwrap().expect("running");
    apply(&reading.store, &ws, &ApplyOptions::all()).unwrap();
    assert_eq!(fs::read(ws.join("d/9")).unwrap(), b"new 9");
    assert!(temps(&ws).is_empty(), "left in the workspace: {:?}", temps(&ws));
}
