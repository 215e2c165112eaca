//! Attacks on `apply --branch` and `--commit` from a hostile repository:
//! its `.git` is not the user's choice, so what it holds must not decide
//! where a branch lands or which paths a commit may hold.

use std::fs;
use std::path::Path;

use super::git::{LeftOut, Repo};
use super::review::testutil::{Set, git, have_git, write};
use super::store::Store;
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
#[ignore = "finding: apply --branch writes through a dangling symbolic ref the repository planted"]
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
#[ignore = "finding: the repository's core.protectNTFS=false lets GIT~1/ paths into a branch"]
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
