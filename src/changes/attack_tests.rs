//! Attacks on `apply --branch` and `--commit` from a hostile repository:
//! its `.git` is not the user's choice, so what it holds must not decide
//! where a branch lands or which paths a commit may hold.

use std::fs;
use std::path::Path;

use super::git::{LeftOut, Repo};
use super::store::Store;
use super::testutil::{Set, git, have_git, write};
use crate::protocol::change_set::Entry;

/// A repository at `dir` with one commit; its id.
fn repo(dir: &Path) -> String {
    git(dir, &["init", "-q"]);
    git(dir, &["config", "user.name", "Test"]);
    git(dir, &["config", "user.email", "test@example.com"]);
    write(&dir.join("README"), b"readme\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    git(dir, &["rev-parse", "HEAD"]).trim().to_string()
}

fn entries(store: &Store) -> Vec<Entry> {
    store.entries().unwrap().into_iter().map(|e| e.entry).collect()
}

/// The repository's refs, `name id` a line.
fn refs(ws: &Path) -> String {
    git(ws, &["for-each-ref", "--format=%(refname) %(objectname)"])
}

/// `refs/heads/NAME` left as a dangling symbolic ref by the repository:
/// `rev-parse --verify` calls it absent, and `update-ref` writes through
/// it, so the commit lands on whatever ref the repository chose (a tag,
/// a remote-tracking ref, another branch yet to be made) and NAME itself
/// never holds it.
#[test]
fn a_dangling_symbolic_ref_does_not_send_the_branch_elsewhere() {
    if !have_git() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let base = repo(&ws);
    git(&ws, &["symbolic-ref", "refs/heads/fix", "refs/tags/v1.0"]);
    let store = Store::open(&tmp.path().join("session")).unwrap();
    Set::new(&ws).file("fix.txt", b"fixed\n", 0o644).stage(&store);
    let entries = entries(&store);
    let chosen: Vec<&Entry> = entries.iter().collect();
    let before = refs(&ws);

    let repo = Repo::open(&ws).unwrap();
    let made =
        repo.new_branch("fix").and_then(|reference| repo.branch(&store, &reference, Some(&base), &chosen, "m\n"));
    let after = refs(&ws);
    assert!(!after.contains("refs/tags/v1.0"), "the commit landed on a ref the repository chose:\n{after}");
    if made.is_ok() {
        assert_ne!(before, after, "a branch was reported but nothing holds it");
    }
}

/// git refuses `GIT~1/` and `.git./` in its index only while
/// `core.protectNTFS` is on; the repository's config turns it off, and the
/// names some file systems read as `.git` go into the branch.
#[test]
fn the_repository_cannot_switch_off_gits_refusal_of_names_that_stand_for_dot_git() {
    if !have_git() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let base = repo(&ws);
    git(&ws, &["config", "core.protectNTFS", "false"]);
    let store = Store::open(&tmp.path().join("session")).unwrap();
    Set::new(&ws)
        .dir("GIT~1", 0o755)
        .file("GIT~1/config", b"[core]\n\tfsmonitor = touch /tmp/pwned\n", 0o644)
        .file("ok.txt", b"ok\n", 0o644)
        .stage(&store);
    let entries = entries(&store);
    let chosen: Vec<&Entry> = entries.iter().collect();

    let repo = Repo::open(&ws).unwrap();
    let reference = repo.new_branch("b").unwrap();
    let landed = repo.branch(&store, &reference, Some(&base), &chosen, "m\n").unwrap();
    let listing = git(&ws, &["ls-tree", "-r", "--name-only", "b"]);
    assert!(!listing.contains("GIT~1"), "the branch holds a name that stands for .git:\n{listing}");
    assert!(
        landed.left.iter().any(|(p, why)| p.to_string() == "GIT~1/config" && *why == LeftOut::Refused),
        "{:?}",
        landed.left
    );
}

/// `--commit` moves `HEAD`, then updates git's index for the committed
/// paths. When the index cannot be written (a `.git/index.lock` left by a
/// crashed git, an editor's git running at that moment, or planted by the
/// repository), it fails after `HEAD` moved: the index still holds the old
/// content of those paths, so it now stages the commit's reversal, and a
/// plain `git commit` quietly undoes the guest's changes.
#[test]
fn a_commit_whose_index_cannot_be_updated_leaves_head_where_it_was() {
    if !have_git() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let base = repo(&ws);
    let store = Store::open(&tmp.path().join("session")).unwrap();
    Set::new(&ws).file("README", b"changed by the guest\n", 0o644).stage(&store);
    let entries = entries(&store);
    let chosen: Vec<&Entry> = entries.iter().collect();
    // What the plain apply before the commit wrote.
    write(&ws.join("README"), b"changed by the guest\n");
    write(&ws.join(".git/index.lock"), b"");

    let repo = Repo::open(&ws).unwrap();
    let result = repo.commit_on_head(&store, Some(&base), &chosen, "m\n");
    fs::remove_file(ws.join(".git/index.lock")).unwrap();
    let head = git(&ws, &["rev-parse", "HEAD"]).trim().to_string();
    let staged = git(&ws, &["diff", "--cached", "--stat"]);
    if result.is_err() {
        assert_eq!(head, base, "HEAD moved although the commit failed; the index now stages: {staged}");
    }
    assert!(staged.trim().is_empty(), "the index stages a change the user never made: {staged}");
}

/// The guest saw `notes.txt` as `H`; the user then edits it to `U`, which
/// makes any later guest change of it a conflict. The guest reads the
/// user's `U` through its lower layer and writes exactly that; the user
/// runs `stockade apply` on the running session (for anything: every path
/// is looked at), `notes.txt` counts as already applied and lands in the
/// record of what landed, with the host holding `U`. The guest then
/// writes its own content, and the final export overwrites the user's
/// edit with no conflict: the record licenses it.
#[test]
fn a_host_edit_made_after_the_guest_saw_the_file_stays_a_conflict_through_a_live_apply() {
    use super::apply::{ApplyOptions, apply};
    use super::landed::{CHECKPOINT_DIR, Landed};
    use super::seen::Seen;

    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join("notes.txt"), b"H\n").unwrap();
    let dir = tmp.path().join("session");
    let session = Store::open(&dir).unwrap();
    let checkpoint = Store::open(&dir.join(CHECKPOINT_DIR)).unwrap();
    // The guest looks at the file first, as it was.
    let seen = Seen::everything(&ws).unwrap();
    session.save_seen(&seen).unwrap();
    checkpoint.save_seen(&seen).unwrap();

    // The user's edit, after the guest saw the file.
    fs::write(ws.join("notes.txt"), b"U: the user's own work\n").unwrap();

    // A checkpoint where the guest holds exactly the user's version, and a
    // live `stockade apply` recording what landed, as the CLI does.
    Set::new(&ws).file("notes.txt", b"U: the user's own work\n", 0o644).stage(&checkpoint);
    let report = apply(&checkpoint, &ws, &ApplyOptions::all()).unwrap();
    Landed::record(&checkpoint, &ws, &report.landings()).unwrap();

    // The final export: the guest's own content over the user's edit.
    Set::new(&ws).file("notes.txt", b"EVIL\n", 0o644).stage(&session);
    Landed::load(&session).unwrap().settle(&session).unwrap();
    let report = apply(&session, &ws, &ApplyOptions::all()).unwrap();
    assert_eq!(
        fs::read(ws.join("notes.txt")).unwrap(),
        b"U: the user's own work\n",
        "the user's edit was overwritten without a conflict: {report:?}"
    );
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
}

/// As above, with a file the user creates during the run: the guest copies
/// it into a checkpoint, a live `stockade apply` finds it already there and
/// records it as landed, and the guest's final export deletes it with no
/// conflict. The user's new file is gone.
#[test]
fn a_file_the_user_created_during_the_run_is_not_deleted_through_a_live_apply() {
    use super::apply::{ApplyOptions, apply};
    use super::landed::{CHECKPOINT_DIR, Landed};
    use super::seen::Seen;

    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let dir = tmp.path().join("session");
    let session = Store::open(&dir).unwrap();
    let checkpoint = Store::open(&dir.join(CHECKPOINT_DIR)).unwrap();
    let seen = Seen::everything(&ws).unwrap();
    session.save_seen(&seen).unwrap();
    checkpoint.save_seen(&seen).unwrap();

    fs::write(ws.join("mine.txt"), b"precious\n").unwrap();

    Set::new(&ws).file("mine.txt", b"precious\n", 0o644).stage(&checkpoint);
    let report = apply(&checkpoint, &ws, &ApplyOptions::all()).unwrap();
    Landed::record(&checkpoint, &ws, &report.landings()).unwrap();

    Set::new(&ws).delete("mine.txt").stage(&session);
    Landed::load(&session).unwrap().settle(&session).unwrap();
    let report = apply(&session, &ws, &ApplyOptions::all()).unwrap();
    assert!(ws.join("mine.txt").exists(), "the user's new file was deleted without a conflict: {report:?}");
}
