//! The landed record: what an apply during the run wrote is neither offered
//! again nor a conflict later, while a host edit after it still is.

use std::fs;
use std::path::Path;

use super::*;
use crate::changes::seen::Seen;
use crate::changes::testutil::Set;
use crate::changes::{ApplyOptions, apply};
use crate::util::digest::Sha256;

/// A session whose guest saw the workspace as it is now, and the store a
/// checkpoint of it stages into.
struct Fx {
    _tmp: tempfile::TempDir,
    ws: std::path::PathBuf,
    session: Store,
    checkpoint: Store,
}

fn fx(files: &[(&str, &[u8])]) -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    for (path, content) in files {
        fs::write(ws.join(path), content).unwrap();
    }
    let dir = tmp.path().join("session");
    let session = Store::open(&dir).unwrap();
    let checkpoint = Store::open(&dir.join(CHECKPOINT_DIR)).unwrap();
    let seen = Seen::everything(&ws).unwrap();
    session.save_seen(&seen).unwrap();
    checkpoint.save_seen(&seen).unwrap();
    Fx { ws, session, checkpoint, _tmp: tmp }
}

/// Applies everything staged in `store` and records what landed, as
/// `stockade apply` on a running session does.
fn apply_live(store: &Store, ws: &Path) -> Vec<String> {
    let report = apply(store, ws, &ApplyOptions::all()).unwrap();
    Landed::record(store, ws, &report.landings()).unwrap();
    report.applied.iter().map(ToString::to_string).collect()
}

fn staged(store: &Store) -> Vec<String> {
    let entries = store.entries().unwrap();
    entries.iter().filter(|e| e.state == EntryState::Staged).map(|e| e.entry.path.to_string()).collect()
}

#[test]
fn both_stores_of_a_session_share_one_record() {
    let f = fx(&[]);
    assert_eq!(Landed::path_for(&f.session), Landed::path_for(&f.checkpoint));
    assert!(Landed::load(&f.session).unwrap().is_empty());
}

#[test]
fn what_landed_is_not_offered_again_and_its_host_copy_is_the_new_base() {
    let f = fx(&[("a.txt", b"v0\n")]);
    Set::new(&f.ws).file("a.txt", b"v1\n", 0o644).file("new.txt", b"n1\n", 0o644).stage(&f.checkpoint);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["a.txt", "new.txt"]);

    // The final export: new.txt as it landed, a.txt changed again.
    Set::new(&f.ws).file("a.txt", b"v2\n", 0o644).file("new.txt", b"n1\n", 0o644).stage(&f.session);
    assert_eq!(Landed::load(&f.session).unwrap().settle(&f.session).unwrap(), 1);
    assert_eq!(staged(&f.session), ["a.txt"], "new.txt landed already");
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert!(report.conflicts.is_empty(), "{:?}", report.conflicts);
    assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"v2\n");
    assert_eq!(fs::read(f.ws.join("new.txt")).unwrap(), b"n1\n");
}

/// The run's final export was staged (and settled against the record)
/// while an apply of a checkpoint was still landing: what that apply
/// landed is not offered again.
#[test]
fn an_apply_that_ends_after_the_final_export_settled_is_not_offered_again() {
    let f = fx(&[("a.txt", b"v0\n")]);
    Set::new(&f.ws).file("a.txt", b"v1\n", 0o644).file("new.txt", b"n1\n", 0o644).stage(&f.checkpoint);
    Set::new(&f.ws).file("a.txt", b"v1\n", 0o644).file("new.txt", b"n1\n", 0o644).stage(&f.session);
    assert_eq!(Landed::load(&f.session).unwrap().settle(&f.session).unwrap(), 0, "nothing landed yet");
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["a.txt", "new.txt"]);
    assert!(staged(&f.session).is_empty(), "the final set offers again what the apply landed");
}

#[test]
fn a_host_edit_after_the_landing_is_still_a_conflict() {
    let f = fx(&[("a.txt", b"v0\n")]);
    Set::new(&f.ws).file("a.txt", b"v1\n", 0o644).stage(&f.checkpoint);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["a.txt"]);
    fs::write(f.ws.join("a.txt"), b"the user's edit\n").unwrap();

    Set::new(&f.ws).file("a.txt", b"v2\n", 0o644).stage(&f.session);
    Landed::load(&f.session).unwrap().settle(&f.session).unwrap();
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"the user's edit\n");
}

#[test]
fn a_change_the_host_held_already_is_not_offered_again_but_licenses_nothing() {
    let f = fx(&[("a.txt", b"v0\n")]);
    // The user's edit after the guest saw the file; the guest copies it.
    fs::write(f.ws.join("a.txt"), b"the user's edit\n").unwrap();
    Set::new(&f.ws).file("a.txt", b"the user's edit\n", 0o644).stage(&f.checkpoint);
    assert!(apply_live(&f.checkpoint, &f.ws).is_empty(), "nothing was written");

    // Carried again unchanged: settled, not offered.
    Set::new(&f.ws).file("a.txt", b"the user's edit\n", 0o644).stage(&f.session);
    assert_eq!(Landed::load(&f.session).unwrap().settle(&f.session).unwrap(), 1);
    assert!(staged(&f.session).is_empty());
    // Changed since, it is no base: judged against what the guest first saw.
    let landed = Landed::load(&f.checkpoint).unwrap();
    let path = RelPath::new(b"a.txt").unwrap();
    let root = Root::open(&f.ws).unwrap();
    let dir = root.parent_of(&path).unwrap();
    let stat = dirfd::stat_at(&dir, b"a.txt").unwrap();
    let host = HostPath { dir: &dir, name: b"a.txt", stat };
    let kind =
        Kind::File { mode: crate::protocol::change_set::Mode::from_raw(0o644), size: 3, sha256: Sha256::of(b"v2\n") };
    assert!(!landed.holds(&host, &path, &kind), "a change the apply did not write is no base");
}

#[test]
fn the_last_landing_of_a_path_wins_and_a_cut_line_is_ignored() {
    let f = fx(&[]);
    let path = RelPath::new(b"a.txt").unwrap();
    let kind = |c: &[u8]| Kind::File {
        mode: crate::protocol::change_set::Mode::from_raw(0o644),
        size: c.len() as u64,
        sha256: Sha256::of(c),
    };
    let land = |c: &[u8]| {
        fs::write(f.ws.join("a.txt"), c).unwrap();
        fs::set_permissions(f.ws.join("a.txt"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    };
    land(b"1");
    Landed::record_states(&f.session, &f.ws, [(&path, &kind(b"1"), true)].into_iter()).unwrap();
    land(b"2");
    Landed::record_states(&f.checkpoint, &f.ws, [(&path, &kind(b"2"), true)].into_iter()).unwrap();
    let mut file = fs::OpenOptions::new().append(true).open(Landed::path_for(&f.session)).unwrap();
    std::io::Write::write_all(&mut file, b"{\"path\":\"a.t").unwrap();
    let landed = Landed::load(&f.session).unwrap();
    assert_eq!(landed.paths.get(&path).map(|r| &r.kind), Some(&kind(b"2")));
}

#[test]
fn a_landed_directory_does_not_license_wiping_what_the_user_put_in_it_since() {
    let f = fx(&[]);
    // Both exports as the guest makes them, against the workspace it first
    // saw (no `d`): `mkdir d` by the checkpoint, then `rm -rf d` and a file
    // in its place by the end.
    Set::new(&f.ws).dir("d", 0o755).stage(&f.checkpoint);
    Set::new(&f.ws).file("d", b"guest\n", 0o644).stage(&f.session);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["d"]);
    // The user works in the directory that landed.
    fs::write(f.ws.join("d/mine.txt"), b"the user's work\n").unwrap();

    Landed::load(&f.session).unwrap().settle(&f.session).unwrap();
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert_eq!(
        fs::read(f.ws.join("d/mine.txt")).ok().as_deref(),
        Some(&b"the user's work\n"[..]),
        "a host edit below a landed directory was lost: {report:?}"
    );
}

#[test]
fn a_landed_mode_change_does_not_license_overwriting_a_later_host_edit() {
    let f = fx(&[("run.sh", b"echo v0\n")]);
    fs::set_permissions(f.ws.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let seen = Seen::everything(&f.ws).unwrap();
    f.session.save_seen(&seen).unwrap();
    f.checkpoint.save_seen(&seen).unwrap();
    // The guest's `chmod +x run.sh` by the checkpoint, new content by the
    // end, both against the workspace it first saw.
    Set::new(&f.ws).mode("run.sh", 0o755).stage(&f.checkpoint);
    Set::new(&f.ws).file("run.sh", b"echo guest\n", 0o755).stage(&f.session);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["run.sh"]);
    // The user edits the file after the mode landed.
    fs::write(f.ws.join("run.sh"), b"echo the user's edit\n").unwrap();

    Landed::load(&f.session).unwrap().settle(&f.session).unwrap();
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert_eq!(
        fs::read(f.ws.join("run.sh")).unwrap(),
        b"echo the user's edit\n",
        "a host edit after a landed mode change was overwritten: {report:?}"
    );
}

#[test]
fn a_landed_directory_all_of_whose_content_landed_is_the_base_of_its_replacement() {
    let f = fx(&[]);
    // Exports against the workspace the guest first saw (no `d`).
    let second = Set::new(&f.ws).dir("d", 0o755).file("d/x", b"x\n", 0o644).file("d/y", b"y\n", 0o644);
    Set::new(&f.ws).file("d", b"guest\n", 0o644).stage(&f.session);
    Set::new(&f.ws).dir("d", 0o755).file("d/x", b"x\n", 0o644).stage(&f.checkpoint);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["d", "d/x"]);
    // A second checkpoint, applied during the run, lands more in it.
    let dir = f.checkpoint.dir().parent().unwrap().to_path_buf();
    fs::remove_dir_all(&dir).unwrap();
    let checkpoint = Store::open(&dir).unwrap();
    checkpoint.save_seen(&f.session.load_seen().unwrap().unwrap()).unwrap();
    second.stage(&checkpoint);
    Landed::load(&checkpoint).unwrap().settle(&checkpoint).unwrap();
    assert_eq!(apply_live(&checkpoint, &f.ws), ["d/y"]);

    Landed::load(&f.session).unwrap().settle(&f.session).unwrap();
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(fs::read(f.ws.join("d")).unwrap(), b"guest\n");
}

#[test]
fn a_landed_mode_change_is_the_base_of_new_content_while_the_host_keeps_it() {
    let f = fx(&[("run.sh", b"echo v0\n")]);
    fs::set_permissions(f.ws.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let seen = Seen::everything(&f.ws).unwrap();
    f.session.save_seen(&seen).unwrap();
    f.checkpoint.save_seen(&seen).unwrap();
    Set::new(&f.ws).mode("run.sh", 0o755).stage(&f.checkpoint);
    Set::new(&f.ws).file("run.sh", b"echo guest\n", 0o755).stage(&f.session);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["run.sh"]);

    Landed::load(&f.session).unwrap().settle(&f.session).unwrap();
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(fs::read(f.ws.join("run.sh")).unwrap(), b"echo guest\n");
}

#[test]
fn a_landed_directory_mode_does_not_license_removing_what_was_in_it_before() {
    let f = fx(&[]);
    fs::create_dir(f.ws.join("d")).unwrap();
    fs::set_permissions(f.ws.join("d"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    fs::write(f.ws.join("d/u.txt"), b"the user's\n").unwrap();
    let seen = Seen::everything(&f.ws).unwrap();
    f.session.save_seen(&seen).unwrap();
    f.checkpoint.save_seen(&seen).unwrap();
    Set::new(&f.ws).dir("d", 0o700).stage(&f.checkpoint);
    Set::new(&f.ws).file("d", b"guest\n", 0o644).stage(&f.session);
    assert_eq!(apply_live(&f.checkpoint, &f.ws), ["d"]);
    // The user edits what was in the directory before the landing.
    fs::write(f.ws.join("d/u.txt"), b"the user's, edited\n").unwrap();

    Landed::load(&f.session).unwrap().settle(&f.session).unwrap();
    let report = apply(&f.session, &f.ws, &ApplyOptions::all()).unwrap();
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert_eq!(fs::read(f.ws.join("d/u.txt")).unwrap(), b"the user's, edited\n");
}
