//! Apply tests: change sets are built by hand (not by the exporter), with
//! bases taken from the host as a guest would have seen it.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;
use crate::changes::dirfd::tests::without_openat2;
use crate::changes::seen::Seen;
use crate::changes::store::SetState;
use crate::changes::tree;
use crate::progress::Silent;
use crate::protocol::change_set::entry::{Mode, SymlinkTarget};
use crate::protocol::change_set::stream::{Limits, Writer};
use crate::util::digest::Sha256;

fn p(s: &str) -> RelPath {
    RelPath::new(s.as_bytes()).unwrap()
}

/// A workspace, a directory outside it, and a session store.
struct Fx {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
    store: Store,
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    fs::create_dir(&ws).unwrap();
    fs::create_dir(&outside).unwrap();
    let store = Store::open(&tmp.path().join("session")).unwrap();
    Fx { ws, outside, store, _tmp: tmp }
}

fn write(path: &Path, content: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(path, content).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// What the host holds at `path`, as a guest exporting now would record it.
fn base_of(ws: &Path, path: &str, with_tree: bool) -> Base {
    let full = ws.join(path);
    let Ok(meta) = fs::symlink_metadata(&full) else { return Base::Absent };
    let mode = Mode::from_raw(meta.permissions().mode());
    if meta.file_type().is_symlink() {
        let target = fs::read_link(&full).unwrap();
        Base::Symlink { target: SymlinkTarget::new(target.as_os_str().as_encoded_bytes()).unwrap() }
    } else if meta.is_dir() {
        let tree = with_tree.then(|| {
            let parent = fs::File::open(full.parent().unwrap()).unwrap();
            tree::digest_at(&parent, full.file_name().unwrap().as_encoded_bytes()).unwrap()
        });
        Base::Dir { mode, tree }
    } else if meta.is_file() {
        let content = fs::read(&full).unwrap();
        Base::File { mode, size: content.len() as u64, sha256: Sha256::of(&content) }
    } else {
        Base::Special
    }
}

/// Builds a change stream against the workspace's current state.
struct Set<'a> {
    ws: &'a Path,
    w: Writer<Vec<u8>>,
}

impl<'a> Set<'a> {
    fn new(ws: &'a Path) -> Set<'a> {
        Set { ws, w: Writer::new(Vec::new()).unwrap() }
    }
    fn file(mut self, path: &str, content: &[u8], mode: u32) -> Self {
        let base = base_of(self.ws, path, true);
        self.w.file(&p(path), mode, content.len() as u64, &mut &content[..], &base).unwrap();
        self
    }
    fn file_on(mut self, path: &str, content: &[u8], mode: u32, base: Base) -> Self {
        self.w.file(&p(path), mode, content.len() as u64, &mut &content[..], &base).unwrap();
        self
    }
    fn dir(mut self, path: &str, mode: u32) -> Self {
        let base = base_of(self.ws, path, false);
        self.w.dir(&p(path), mode, &base).unwrap();
        self
    }
    fn opaque(mut self, path: &str, mode: u32) -> Self {
        let base = base_of(self.ws, path, true);
        self.w.opaque_dir(&p(path), mode, &base).unwrap();
        self
    }
    fn symlink(mut self, path: &str, target: &str) -> Self {
        let base = base_of(self.ws, path, true);
        self.w.symlink(&p(path), &SymlinkTarget::new(target.as_bytes()).unwrap(), &base).unwrap();
        self
    }
    fn delete(mut self, path: &str) -> Self {
        let base = base_of(self.ws, path, true);
        self.w.delete(&p(path), &base).unwrap();
        self
    }
    fn mode(mut self, path: &str, mode: u32) -> Self {
        let base = base_of(self.ws, path, true);
        self.w.mode(&p(path), mode, &base).unwrap();
        self
    }
    fn bytes(self) -> Vec<u8> {
        self.w.finish().unwrap().0
    }
    fn stage(self, store: &Store) {
        store.stage(&self.bytes()[..], Limits::default()).unwrap();
    }
}

fn all() -> ApplyOptions {
    ApplyOptions::all()
}

fn only(paths: &[&str]) -> ApplyOptions {
    ApplyOptions { selection: Selection::paths(paths.iter().map(|s| p(s))), force: Selection::none() }
}

fn names(paths: &[RelPath]) -> Vec<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

/// Every `.stockade-*` temp name left in the tree.
fn temps(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if entry.file_name().as_encoded_bytes().starts_with(b".stockade-") {
            found.push(path.clone());
        }
        if entry.file_type().unwrap().is_dir() {
            found.extend(temps(&path));
        }
    }
    found
}

#[test]
fn applies_every_kind_of_change() {
    let f = fx();
    write(&f.ws.join("old.txt"), b"old");
    write(&f.ws.join("gone/a/b"), b"1");
    write(&f.ws.join("script.sh"), b"#!/bin/sh\n");
    fs::set_permissions(f.ws.join("script.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    Set::new(&f.ws)
        .dir("src", 0o750)
        .file("src/main.rs", b"fn main() {}\n", 0o644)
        .symlink("etc-link", "/etc/passwd")
        .delete("old.txt")
        .delete("gone")
        .mode("script.sh", 0o755)
        .file("src/run", b"x", 0o4755)
        .stage(&f.store);

    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.skipped(), 0, "{report:?}");
    assert_eq!(report.applied.len(), 7);
    assert_eq!(fs::read(f.ws.join("src/main.rs")).unwrap(), b"fn main() {}\n");
    assert_eq!(mode_of(&f.ws.join("src")), 0o750);
    assert_eq!(mode_of(&f.ws.join("src/run")), 0o755, "setuid is dropped");
    assert_eq!(fs::read_link(f.ws.join("etc-link")).unwrap(), Path::new("/etc/passwd"));
    assert!(!f.ws.join("old.txt").exists() && !f.ws.join("gone").exists());
    assert_eq!(mode_of(&f.ws.join("script.sh")), 0o755);
    assert_eq!(f.store.state().unwrap(), SetState::Applied);
    assert!(temps(&f.ws).is_empty());
    assert!(!journal::journal_path(f.store.dir()).exists());

    // Everything is applied: a second apply has nothing to do.
    let again = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!((again.applied.len(), again.not_selected), (0, 0));
}

#[test]
fn a_git_tree_applies_like_any_other() {
    let f = fx();
    write(&f.ws.join(".git/HEAD"), b"ref: refs/heads/main\n");
    write(&f.ws.join(".git/index"), b"old index");
    write(&f.ws.join(".git/refs/heads/main"), b"aaaa\n");
    Set::new(&f.ws)
        .dir(".git/objects", 0o755)
        .dir(".git/objects/ab", 0o755)
        .file(".git/objects/ab/cdef0123", b"blob", 0o444)
        .file(".git/index", b"new index", 0o644)
        .file(".git/refs/heads/main", b"bbbb\n", 0o644)
        .file(".git/COMMIT_EDITMSG", b"msg\n", 0o644)
        .stage(&f.store);
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.skipped(), 0, "{report:?}");
    assert_eq!(fs::read(f.ws.join(".git/refs/heads/main")).unwrap(), b"bbbb\n");
    assert_eq!(mode_of(&f.ws.join(".git/objects/ab/cdef0123")), 0o444);
}

#[test]
fn replaces_a_file_with_a_directory_and_a_directory_with_a_file() {
    let f = fx();
    write(&f.ws.join("was-file"), b"f");
    write(&f.ws.join("was-dir/x/y"), b"deep");
    symlink(&f.outside, f.ws.join("was-link")).unwrap();
    Set::new(&f.ws)
        .opaque("was-file", 0o755)
        .file("was-file/inside", b"i", 0o644)
        .file("was-dir", b"now a file", 0o644)
        .dir("was-link", 0o755)
        .file("was-link/in", b"not outside", 0o644)
        .stage(&f.store);
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.skipped(), 0, "{report:?}");
    assert_eq!(fs::read(f.ws.join("was-file/inside")).unwrap(), b"i");
    assert_eq!(fs::read(f.ws.join("was-dir")).unwrap(), b"now a file");
    assert!(fs::symlink_metadata(f.ws.join("was-link")).unwrap().is_dir());
    assert_eq!(fs::read_dir(&f.outside).unwrap().count(), 0);
}

#[test]
fn an_opaque_directory_keeps_only_what_the_set_lists() {
    let f = fx();
    write(&f.ws.join("nm/a/old.js"), b"old");
    write(&f.ws.join("nm/b/index.js"), b"b");
    write(&f.ws.join("nm/keep.json"), b"{}");
    Set::new(&f.ws)
        .opaque("nm", 0o755)
        .dir("nm/a", 0o755)
        .file("nm/a/new.js", b"new", 0o644)
        .file("nm/keep.json", b"{\"v\":2}", 0o644)
        .stage(&f.store);
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.skipped(), 0, "{report:?}");
    let mut left: Vec<String> = walk(&f.ws).into_keys().collect();
    left.sort();
    assert_eq!(left, ["nm", "nm/a", "nm/a/new.js", "nm/keep.json"]);
}

#[test]
fn an_opaque_directory_whose_host_contents_changed_is_a_conflict() {
    let f = fx();
    write(&f.ws.join("nm/a.js"), b"a");
    Set::new(&f.ws).opaque("nm", 0o755).file("nm/b.js", b"b", 0o644).stage(&f.store);
    write(&f.ws.join("nm/host-added.js"), b"mine");
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert_eq!(report.conflicts[0].reason, ConflictReason::TreeChanged);
    assert!(f.ws.join("nm/host-added.js").exists());
    // The child lands in the existing directory; nothing is removed.
    assert_eq!(names(&report.applied), ["nm/b.js"]);
}

#[test]
fn directory_modes_are_set_after_their_contents() {
    let f = fx();
    Set::new(&f.ws).dir("ro", 0o555).dir("ro/sub", 0o500).file("ro/sub/f", b"x", 0o400).stage(&f.store);
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.skipped(), 0, "{report:?}");
    assert_eq!(mode_of(&f.ws.join("ro")), 0o555);
    assert_eq!(mode_of(&f.ws.join("ro/sub")), 0o500);
    assert_eq!(mode_of(&f.ws.join("ro/sub/f")), 0o400);
}

#[test]
fn non_utf8_and_odd_names_apply() {
    let f = fx();
    let mut w = Writer::new(Vec::new()).unwrap();
    let odd = RelPath::new(&b"caf\xe9 %20\nname"[..]).unwrap();
    w.file(&odd, 0o644, 2, &mut &b"ok"[..], &Base::Absent).unwrap();
    f.store.stage(&w.finish().unwrap().0[..], Limits::default()).unwrap();
    apply(&f.store, &f.ws, &all()).unwrap();
    let name = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"caf\xe9 %20\nname");
    assert_eq!(fs::read(f.ws.join(name)).unwrap(), b"ok");
}

#[test]
fn refuses_to_write_through_a_host_symlink() {
    for fallback in [false, true] {
        let f = fx();
        symlink(&f.outside, f.ws.join("lib")).unwrap();
        write(&f.outside.join("victim"), b"precious");
        // A forged set: the exporter would never place entries below a symlink.
        Set::new(&f.ws)
            .file_on("lib/evil", b"pwned", 0o755, Base::Absent)
            .file_on("lib/victim", b"pwned", 0o644, base_of(&f.outside, "victim", false))
            .stage(&f.store);
        let run = || apply(&f.store, &f.ws, &all()).unwrap();
        let report = if fallback { without_openat2(run) } else { run() };
        assert_eq!(report.refused.len(), 2, "fallback={fallback}: {report:?}");
        assert_eq!(report.refused[0].reason, RefusalReason::Symlink(p("lib")));
        assert!(report.refused[0].to_string().contains("would write through the symlink lib"));
        assert!(!f.outside.join("evil").exists());
        assert_eq!(fs::read(f.outside.join("victim")).unwrap(), b"precious");
        assert_eq!(f.store.state().unwrap(), SetState::Staged);
    }
}

#[test]
fn a_symlink_swapped_in_between_check_and_write_is_not_followed() {
    for fallback in [false, true] {
        let f = fx();
        write(&f.ws.join("a/existing"), b"e");
        write(&f.ws.join("b/target"), b"old");
        write(&f.ws.join("c/inner/x"), b"x");
        write(&f.outside.join("secret"), b"keep me");
        write(&f.outside.join("inner/x"), b"keep me too");
        Set::new(&f.ws)
            .file("a/x", b"new", 0o644)
            .file("a/y", b"new", 0o644)
            .file("b/target", b"new", 0o644)
            .delete("c/inner")
            .stage(&f.store);
        let (ws, outside) = (f.ws.clone(), f.outside.clone());
        let mut hook = |path: &RelPath| match path.to_string().as_str() {
            // The directory is moved away and a symlink to outside takes its place.
            "a/x" => {
                fs::rename(ws.join("a"), ws.join("a-moved")).unwrap();
                symlink(&outside, ws.join("a")).unwrap();
            }
            // The target itself becomes a symlink to a file outside.
            "b/target" => {
                fs::remove_file(ws.join("b/target")).unwrap();
                symlink(outside.join("secret"), ws.join("b/target")).unwrap();
            }
            // A directory about to be removed becomes a symlink to outside.
            "c/inner" => {
                fs::remove_dir_all(ws.join("c/inner")).unwrap();
                symlink(&outside, ws.join("c/inner")).unwrap();
            }
            _ => {}
        };
        let mut run = || apply_with_hook(&f.store, &f.ws, &all(), &mut hook, &mut Silent).unwrap();
        let report = if fallback { without_openat2(&mut run) } else { run() };

        // Nothing outside changed: not through the parent, the target, or the tree.
        assert_eq!(fs::read(f.outside.join("secret")).unwrap(), b"keep me", "fallback={fallback}");
        assert_eq!(fs::read(f.outside.join("inner/x")).unwrap(), b"keep me too");
        assert!(!f.outside.join("x").exists() && !f.outside.join("y").exists(), "{report:?}");
        // a/x went into the directory it was checked in, wherever that moved.
        assert_eq!(fs::read(f.ws.join("a-moved/x")).unwrap(), b"new");
        // a/y now resolves through the symlink and is refused.
        assert_eq!(report.refused.len(), 1, "{report:?}");
        assert_eq!(report.refused[0].reason, RefusalReason::Symlink(p("a")));
        // The swapped-in symlinks themselves were replaced or removed.
        assert_eq!(fs::read(f.ws.join("b/target")).unwrap(), b"new");
        assert!(fs::symlink_metadata(f.ws.join("c/inner")).is_err());
        assert!(temps(&f.ws).is_empty());
    }
}

#[test]
fn a_host_edit_after_the_guest_looked_is_a_conflict_until_forced() {
    let f = fx();
    write(&f.ws.join("f.txt"), b"guest saw this");
    write(&f.ws.join("g.txt"), b"untouched");
    Set::new(&f.ws).file("f.txt", b"guest wrote this", 0o644).file("g.txt", b"guest too", 0o644).stage(&f.store);
    write(&f.ws.join("f.txt"), b"host wrote this meanwhile");

    let dry = check(&f.store, &f.ws, &all()).unwrap();
    assert_eq!((dry.applied.len(), dry.conflicts.len()), (1, 1));
    assert_eq!(fs::read(f.ws.join("g.txt")).unwrap(), b"untouched", "check writes nothing");

    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["g.txt"]);
    assert_eq!(report.conflicts.len(), 1);
    assert!(report.conflicts[0].to_string().contains("changed on the host since the guest saw it"));
    assert_eq!(fs::read(f.ws.join("f.txt")).unwrap(), b"host wrote this meanwhile");
    assert_eq!(f.store.state().unwrap(), SetState::Partial);

    let forced = ApplyOptions { selection: Selection::all(), force: Selection::paths([p("f.txt")]) };
    let report = apply(&f.store, &f.ws, &forced).unwrap();
    assert_eq!(names(&report.applied), ["f.txt"]);
    assert_eq!(fs::read(f.ws.join("f.txt")).unwrap(), b"guest wrote this");
    assert_eq!(f.store.state().unwrap(), SetState::Applied);
}

#[test]
fn what_the_guest_first_saw_decides_host_edits_during_the_run() {
    let f = fx();
    write(&f.ws.join("edited"), b"v1");
    write(&f.ws.join("calm"), b"v1");
    write(&f.ws.join("tree/x"), b"v1");
    f.store.save_seen(&Seen::everything(&f.ws).unwrap()).unwrap();
    // During the session the host edits a file and adds one; the guest's
    // lower layer is live, so its bases already show the host's version.
    write(&f.ws.join("edited"), b"v2");
    write(&f.ws.join("created"), b"host");
    write(&f.ws.join("tree/y"), b"host");
    Set::new(&f.ws)
        .file("edited", b"guest", 0o644)
        .file("calm", b"guest", 0o644)
        .file("created", b"guest", 0o644)
        .delete("tree")
        .stage(&f.store);

    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["calm"]);
    let reasons: BTreeMap<String, String> =
        report.conflicts.iter().map(|c| (c.path.to_string(), c.reason.to_string())).collect();
    assert_eq!(reasons["edited"], "edited was changed on the host after the guest saw it");
    assert_eq!(reasons["created"], "created was created on the host after the guest looked for it");
    assert_eq!(reasons["tree"], "tree/y was created on the host after the guest looked for it");

    let forced = ApplyOptions { selection: Selection::all(), force: Selection::paths([p("edited")]) };
    let report = apply(&f.store, &f.ws, &forced).unwrap();
    assert_eq!(names(&report.applied), ["edited"]);
    assert_eq!(fs::read(f.ws.join("edited")).unwrap(), b"guest");
}

#[test]
fn a_host_edit_before_the_guest_looked_is_what_it_built_on() {
    let f = fx();
    write(&f.ws.join("early"), b"v1");
    write(&f.ws.join("tree/x"), b"v1");
    // The host edits and adds before the guest's first look: the guest saw
    // (and changed or removed) the host's new version, so nothing conflicts.
    write(&f.ws.join("early"), b"v2");
    write(&f.ws.join("tree/y"), b"host");
    f.store.save_seen(&Seen::everything(&f.ws).unwrap()).unwrap();
    Set::new(&f.ws).file("early", b"guest", 0o644).delete("tree").stage(&f.store);

    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["early", "tree"], "{report:?}");
    assert!(!f.ws.join("tree").exists());
}

#[test]
fn a_path_the_guest_never_saw_that_the_host_has_is_a_conflict() {
    let f = fx();
    write(&f.ws.join("seen"), b"v1");
    f.store.save_seen(&Seen::everything(&f.ws).unwrap()).unwrap();
    // A change set naming a path no lookup recorded (a guest speaking the
    // export protocol itself, or one past the record's limit): the host's
    // file there cannot have been what the guest built on.
    write(&f.ws.join("unseen"), b"host");
    Set::new(&f.ws).file("unseen", b"guest", 0o644).stage(&f.store);

    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert!(report.applied.is_empty(), "{report:?}");
    assert_eq!(report.conflicts[0].reason.to_string(), "unseen was created on the host after the guest looked for it");
    assert_eq!(fs::read(f.ws.join("unseen")).unwrap(), b"host");
}

#[test]
fn applying_part_then_the_rest_is_not_mistaken_for_host_edits() {
    let f = fx();
    write(&f.ws.join("nm/a"), b"a");
    f.store.save_seen(&Seen::everything(&f.ws).unwrap()).unwrap();
    Set::new(&f.ws)
        .opaque("nm", 0o755)
        .file("nm/b", b"b", 0o644)
        .dir("src", 0o755)
        .file("src/x", b"x", 0o644)
        .stage(&f.store);
    let report = apply(&f.store, &f.ws, &only(&["src/x"])).unwrap();
    assert_eq!(names(&report.applied), ["src", "src/x"], "the new directory comes along");
    assert_eq!(report.not_selected, 2);
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["nm", "nm/b"], "{report:?}");
    assert!(!f.ws.join("nm/a").exists());
}

#[test]
fn children_of_a_refused_directory_say_why() {
    let f = fx();
    write(&f.ws.join("d"), b"host file");
    // The guest saw nothing at d and made it a directory; the host made it a file.
    let mut w = Writer::new(Vec::new()).unwrap();
    w.dir(&p("d"), 0o755, &Base::Absent).unwrap();
    w.file(&p("d/inner"), 0o644, 1, &mut &b"i"[..], &Base::Absent).unwrap();
    f.store.stage(&w.finish().unwrap().0[..], Limits::default()).unwrap();
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(report.conflicts.len(), 1);
    assert_eq!(report.refused, [Refusal { path: p("d/inner"), reason: RefusalReason::ParentNotApplied(p("d")) }]);
    assert_eq!(fs::read(f.ws.join("d")).unwrap(), b"host file");
}

#[test]
fn a_tampered_manifest_is_rejected_before_anything_is_written() {
    let f = fx();
    Set::new(&f.ws).file("a", b"x", 0o644).file("b", b"y", 0o644).stage(&f.store);
    let manifest = f.store.dir().join("manifest");
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(&manifest, text.replace("\"path\":\"b\"", "\"path\":\"../b\"")).unwrap();
    assert!(matches!(apply(&f.store, &f.ws, &all()), Err(ChangesError::Corrupt { .. })));
    assert_eq!(fs::read_dir(&f.ws).unwrap().count(), 0);
}

#[test]
fn an_interrupted_apply_is_completed_and_its_temps_removed() {
    let f = fx();
    for i in 0..20 {
        write(&f.ws.join(format!("d/{i}")), format!("old {i}").as_bytes());
    }
    let mut set = Set::new(&f.ws);
    for i in 0..20 {
        set = set.file(&format!("d/{i}"), format!("new content {i}").as_bytes(), 0o644);
    }
    set.stage(&f.store);

    // Interrupt before the 8th write (a panic stands in for the crash).
    let mut n = 0;
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut hook = |_: &RelPath| {
            n += 1;
            assert!(n < 8, "simulated crash");
        };
        apply_with_hook(&f.store, &f.ws, &all(), &mut hook, &mut Silent)
    }));
    assert!(crashed.is_err());
    let interrupted = journal::load(f.store.dir()).unwrap().expect("the journal stays");
    assert_eq!(interrupted.finished, 7);
    // The crash also left a half-written temp file for the operation in flight.
    let temp = f.ws.join("d").join(String::from_utf8(interrupted.plan.temp_name(7)).unwrap());
    fs::write(&temp, b"new con").unwrap();
    assert_eq!(fs::read(f.ws.join("d/7")).unwrap(), b"old 7");

    let recovered = recover(&f.store, &f.ws).unwrap().expect("something to recover");
    assert_eq!(recovered.applied.len(), 20, "{recovered:?}");
    for i in 0..20 {
        assert_eq!(fs::read(f.ws.join(format!("d/{i}"))).unwrap(), format!("new content {i}").as_bytes());
    }
    assert!(temps(&f.ws).is_empty());
    assert_eq!(f.store.state().unwrap(), SetState::Applied);
    assert!(recover(&f.store, &f.ws).unwrap().is_none());
}

#[test]
fn an_interrupted_apply_belongs_to_its_workspace() {
    let f = fx();
    Set::new(&f.ws).file("a", b"x", 0o644).stage(&f.store);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        apply_with_hook(&f.store, &f.ws, &all(), &mut |_| panic!("simulated crash"), &mut Silent)
    }));
    assert!(matches!(recover(&f.store, &f.outside), Err(ChangesError::OtherWorkspace { .. })));
    assert!(recover(&f.store, &f.ws).unwrap().is_some());
}

/// A file tree as content, for comparing workspaces.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
    Link(PathBuf),
}

fn walk(root: &Path) -> BTreeMap<String, Node> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(rel, Node::Link(fs::read_link(&path).unwrap()));
            } else if meta.is_dir() {
                out.insert(rel, Node::Dir);
                go(root, &path, out);
            } else {
                out.insert(rel, Node::File(fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out);
    out
}

const KILL_ENV: &str = "STOCKADE_TEST_KILL_APPLY";

/// Runs in a child process of `an_apply_killed_at_any_point_*`, which kills it.
#[test]
#[ignore = "a helper run (and killed) by the kill -9 test"]
fn kill_loop_child() {
    let Some(dirs) = std::env::var_os(KILL_ENV) else { return };
    let dirs = PathBuf::from(dirs);
    let store = Store::open(&dirs.join("session")).unwrap();
    apply(&store, &dirs.join("ws"), &all()).unwrap();
}

/// The kill test's workspace before and after, and its change set.
struct KillScenario {
    before: BTreeMap<String, Node>,
    after: BTreeMap<String, Node>,
}

const KEEP: usize = 600;
const DELETE: usize = 300;
const ADD: usize = 600;

fn kill_scenario_ws(ws: &Path) {
    for i in 0..KEEP {
        write(&ws.join(format!("keep/{}/{i}", i % 10)), format!("old {i}").as_bytes());
    }
    for i in 0..DELETE {
        write(&ws.join(format!("del/{i}")), b"to delete");
        write(&ws.join(format!("big/{}/{i}", i % 7)), b"tree to delete");
        write(&ws.join(format!("nm/{}/{i}", i % 5)), b"old module");
    }
    write(&ws.join("swap"), b"a file that becomes a directory");
}

fn kill_scenario_set(ws: &Path) -> Vec<u8> {
    let mut set = Set::new(ws);
    for i in 0..KEEP {
        set = set.file(
            &format!("keep/{}/{i}", i % 10),
            format!("new content {i} {}", "x".repeat(i % 50)).as_bytes(),
            0o644,
        );
    }
    for i in 0..DELETE {
        set = set.delete(&format!("del/{i}"));
    }
    set = set.dir("add", 0o755);
    for i in 0..ADD {
        set = set.file(&format!("add/{i}"), format!("added {i}").as_bytes(), 0o644);
    }
    set = set.delete("big").opaque("nm", 0o755).dir("nm/0", 0o755);
    for i in 0..100 {
        set = set.file(&format!("nm/0/new-{i}"), b"new module", 0o644);
    }
    set.opaque("swap", 0o755).file("swap/inside", b"i", 0o644).bytes()
}

fn kill_scenario() -> KillScenario {
    let tmp = fast_tempdir();
    let ws = tmp.path().join("ws");
    kill_scenario_ws(&ws);
    let before = walk(&ws);
    let store = Store::open(&tmp.path().join("session")).unwrap();
    store.stage(&kill_scenario_set(&ws)[..], Limits::default()).unwrap();
    let report = apply(&store, &ws, &all()).unwrap();
    assert_eq!(report.skipped(), 0, "{report:?}");
    KillScenario { before, after: walk(&ws) }
}

/// A temp dir on tmpfs where there is one: what is killed here is the
/// process, not the machine, so the filesystem does not matter, and creating
/// thousands of inodes per round on a slow virtual disk would dominate.
fn fast_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap()
}

/// A small deterministic generator for kill times.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn an_apply_killed_at_any_point_is_completed_by_the_next() {
    const ROUNDS: usize = 40;
    let scenario = kill_scenario();
    let exe = std::env::current_exe().unwrap();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    eprintln!("kill -9 loop seed {seed}");
    let mut rng = XorShift(u64::from(seed) | 1);
    let (mut window, mut journaled) = (Duration::ZERO, Duration::ZERO);
    let (mut interrupted, mut before_journal, mut finished) = (0, 0, 0);
    for round in 0..=ROUNDS {
        let tmp = fast_tempdir();
        let ws = tmp.path().join("ws");
        fs::create_dir(&ws).unwrap();
        kill_scenario_ws(&ws);
        let store = Store::open(&tmp.path().join("session")).unwrap();
        store.stage(&kill_scenario_set(&ws)[..], Limits::default()).unwrap();

        let start = Instant::now();
        let mut child = std::process::Command::new(&exe)
            .args(["changes::apply::tests::kill_loop_child", "--exact", "--ignored", "--test-threads=1"])
            .env(KILL_ENV, tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        if round == 0 {
            // Calibration: when the journal appears and when the run ends,
            // process start included.
            let journal = journal::journal_path(store.dir());
            while child.try_wait().unwrap().is_none() {
                if journaled.is_zero() && journal.exists() {
                    journaled = start.elapsed();
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(child.wait().unwrap().success());
            window = start.elapsed();
        } else {
            // Mostly while the workspace is being written, sometimes earlier.
            let from = if round % 5 == 0 { Duration::ZERO } else { journaled };
            let delay = from + (window.saturating_sub(from)).mul_f64((rng.next() % 1000) as f64 / 1000.0);
            std::thread::sleep(delay.saturating_sub(start.elapsed()));
            let _ = child.kill(); // SIGKILL
            let status = child.wait().unwrap();
            match (status.success(), journal::journal_path(store.dir()).exists()) {
                (true, _) => finished += 1,
                (false, true) => interrupted += 1,
                (false, false) => before_journal += 1,
            }
        }

        // Whatever happened, every file is wholly old or wholly new.
        let now = walk(&ws);
        for (path, node) in &now {
            if let Node::File(_) = node {
                if path.rsplit('/').next().is_some_and(|n| n.starts_with(".stockade-")) {
                    continue; // a temp, checked after recovery
                }
                let ok = scenario.before.get(path) == Some(node) || scenario.after.get(path) == Some(node);
                assert!(ok, "round {round}: {path} is neither old nor new: {node:?}");
            }
        }

        let report = apply(&store, &ws, &all()).unwrap();
        assert_eq!(report.skipped(), 0, "round {round}: {report:?}");
        if let Some(recovered) = &report.recovered {
            assert_eq!(recovered.skipped(), 0, "round {round}: {recovered:?}");
        }
        assert_eq!(walk(&ws), scenario.after, "round {round}: the workspace differs from a clean apply");
        assert!(temps(&ws).is_empty(), "round {round}");
        assert_eq!(store.state().unwrap(), SetState::Applied);
    }
    eprintln!(
        "kill -9 loop: {interrupted} killed mid-apply, {before_journal} before the journal, {finished} finished; \
         journal after {journaled:?}, run {window:?}"
    );
    assert!(interrupted > 0, "no round killed the apply while it ran");
}

#[test]
fn a_blob_changed_in_the_store_after_review_is_not_applied() {
    let f = fx();
    write(&f.ws.join("a.txt"), b"host");
    Set::new(&f.ws).file("a.txt", b"reviewed content", 0o644).file("b.txt", b"also reviewed", 0o644).stage(&f.store);
    // Between review and apply, something rewrites a staged blob: same
    // size, then a different size.
    let blob = f.store.blob_path(&Sha256::of(b"reviewed content"));
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&blob, b"tampered content").unwrap();
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["b.txt"], "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    let error = &report.failed[0].error;
    assert!(
        error.contains("not what was staged and reviewed") && error.contains(&blob.display().to_string()),
        "{error}"
    );
    assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"host", "nothing of it landed");
    assert!(temps(&f.ws).is_empty());
    assert_eq!(f.store.state().unwrap(), SetState::Partial, "it stays staged");

    fs::write(&blob, b"short").unwrap();
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert!(report.failed[0].error.contains("is 5 bytes, not 16"), "{report:?}");
    assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"host");
}

/// Stages `set` with sightings recorded before it (what a run does).
fn with_sightings(f: &Fx) {
    f.store.save_seen(&Seen::everything(&f.ws).unwrap()).unwrap();
}

#[test]
fn a_base_the_guest_forged_neither_makes_nor_hides_a_conflict() {
    let f = fx();
    write(&f.ws.join("calm.txt"), b"the host never touched this");
    write(&f.ws.join("edited.txt"), b"v1");
    with_sightings(&f);
    write(&f.ws.join("edited.txt"), b"the host's edit during the run");
    let lie = Base::File { mode: Mode::from_raw(0o600), size: 1, sha256: Sha256::of(b"?") };
    Set::new(&f.ws)
        // A false base on a path the host left alone: no conflict to push
        // the user towards --force.
        .file_on("calm.txt", b"guest", 0o644, lie)
        // The host's current version as the base: the host's edit after the
        // guest looked is still a conflict.
        .file("edited.txt", b"guest", 0o644)
        .stage(&f.store);
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["calm.txt"], "{report:?}");
    assert_eq!(report.conflicts.len(), 1);
    assert_eq!(report.conflicts[0].reason.to_string(), "edited.txt was changed on the host after the guest saw it");
    assert_eq!(fs::read(f.ws.join("edited.txt")).unwrap(), b"the host's edit during the run");
}

#[test]
fn a_directory_comes_along_only_where_the_host_has_none() {
    let f = fx();
    write(&f.ws.join("src/main.rs"), b"fn main() {}");
    write(&f.ws.join("src/lib.rs"), b"pub fn lib() {}");
    with_sightings(&f);
    // The guest says it saw no src/ and replaced it: choosing only the new
    // file must not bring along a replacement that empties the host's src/.
    let mut w = Writer::new(Vec::new()).unwrap();
    w.opaque_dir(&p("src"), 0o755, &Base::Absent).unwrap();
    w.file(&p("src/new.rs"), 0o644, 3, &mut &b"new"[..], &Base::Absent).unwrap();
    w.dir(&p("fresh"), 0o755, &Base::Absent).unwrap();
    w.file(&p("fresh/x"), 0o644, 1, &mut &b"x"[..], &Base::Absent).unwrap();
    f.store.stage(&w.finish().unwrap().0[..], Limits::default()).unwrap();
    let report = apply(&f.store, &f.ws, &only(&["src/new.rs", "fresh/x"])).unwrap();
    assert_eq!(names(&report.applied), ["fresh", "fresh/x", "src/new.rs"], "{report:?}");
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(fs::read(f.ws.join("src/main.rs")).unwrap(), b"fn main() {}");
    assert_eq!(fs::read(f.ws.join("src/lib.rs")).unwrap(), b"pub fn lib() {}");
}

#[test]
fn a_run_whose_sightings_are_lost_counts_as_having_seen_nothing() {
    let f = fx();
    write(&f.ws.join("notes.txt"), b"host");
    f.store.start_seen().unwrap();
    // The guest's base matches the host exactly; with the run's record gone,
    // only the host's view may decide, and it has no sighting of the file.
    Set::new(&f.ws).file("notes.txt", b"guest", 0o644).file("new.txt", b"guest", 0o644).stage(&f.store);
    fs::remove_file(f.store.dir().join("seen")).unwrap();
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    assert_eq!(names(&report.applied), ["new.txt"], "{report:?}");
    assert_eq!(
        report.conflicts[0].reason.to_string(),
        "notes.txt was created on the host after the guest looked for it"
    );
    assert_eq!(fs::read(f.ws.join("notes.txt")).unwrap(), b"host");
}

#[test]
fn apply_does_no_more_than_the_base_shows_in_review() {
    let f = fx();
    write(&f.ws.join("config.toml"), b"the host's");
    write(&f.ws.join("tree/deep/file"), b"the host's tree");
    fs::create_dir(f.ws.join("private")).unwrap();
    fs::set_permissions(f.ws.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    with_sightings(&f);
    let file = Base::File { mode: Mode::from_raw(0o644), size: 1, sha256: Sha256::of(b"x") };
    let mut w = Writer::new(Vec::new()).unwrap();
    // Shown as added, though the guest saw the host's file.
    w.file(&p("config.toml"), 0o644, 5, &mut &b"guest"[..], &Base::Absent).unwrap();
    // Shown as a modified file, though a directory tree is there.
    w.file(&p("tree"), 0o644, 5, &mut &b"guest"[..], &file).unwrap();
    // Shown as a new directory (and folded away), though it is a chmod.
    w.dir(&p("private"), 0o777, &Base::Absent).unwrap();
    w.file(&p("private/x"), 0o644, 1, &mut &b"x"[..], &Base::Absent).unwrap();
    f.store.stage(&w.finish().unwrap().0[..], Limits::default()).unwrap();
    let report = apply(&f.store, &f.ws, &all()).unwrap();
    let conflicted: Vec<String> = report.conflicts.iter().map(|c| c.path.to_string()).collect();
    assert_eq!(conflicted, ["config.toml", "private", "tree"], "{report:?}");
    assert_eq!(fs::read(f.ws.join("config.toml")).unwrap(), b"the host's");
    assert_eq!(fs::read(f.ws.join("tree/deep/file")).unwrap(), b"the host's tree");
    assert_eq!(mode_of(&f.ws.join("private")), 0o700);
}

/// Bytecode whose header matches the host's `x.py` runs in its place, and
/// a `.pyc` with no source beside it is importable by itself: none is
/// staged (so none can be applied, named or forced), the staging report
/// counts them, and the reviewed source is applied.
#[test]
fn compiled_python_is_never_staged_from_the_guest() {
    let f = fx();
    write(&f.ws.join("pkg/x.py"), b"print('reviewed')\n");
    Set::new(&f.ws)
        .file("pkg/x.py", b"print('reviewed, edited')\n", 0o644)
        .dir("pkg/__pycache__", 0o755)
        .file("pkg/__pycache__/x.cpython-312.pyc", b"\xcb\x0d\x0d\x0a planted", 0o644)
        .file("pkg/__pycache__/notes.txt", b"x", 0o644)
        .file("sourceless.pyc", b"planted", 0o644)
        .file("old.PYO", b"planted", 0o644)
        .symlink("lib/__pycache__", "../pkg")
        .stage(&f.store);
    let planted = [
        "lib/__pycache__",
        "old.PYO",
        "pkg/__pycache__",
        "pkg/__pycache__/notes.txt",
        "pkg/__pycache__/x.cpython-312.pyc",
        "sourceless.pyc",
    ];
    let staged = f.store.report().unwrap();
    assert_eq!(staged.bytecode_count, planted.len() as u64, "{staged:?}");
    let mut dropped: Vec<String> = staged.bytecode.iter().map(|p| p.to_string()).collect();
    dropped.sort();
    assert_eq!(dropped, planted);
    let named = ApplyOptions { selection: Selection::paths(planted.iter().map(|s| p(s))), force: Selection::all() };
    for options in [named, all()] {
        apply(&f.store, &f.ws, &options).unwrap();
    }
    assert_eq!(fs::read(f.ws.join("pkg/x.py")).unwrap(), b"print('reviewed, edited')\n");
    for path in planted {
        assert!(fs::symlink_metadata(f.ws.join(path)).is_err(), "{path} was applied");
    }
}
