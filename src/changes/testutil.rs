//! Test fixtures: a host workspace and a session store holding a change set
//! built by hand against the workspace's current state, as the guest's
//! exporter would build it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::changes::store::Store;
use crate::changes::tree;
use crate::protocol::change_set::entry::{Base, Mode, SymlinkTarget};
use crate::protocol::change_set::path::RelPath;
use crate::protocol::change_set::stream::{Limits, Writer};
use crate::util::digest::Sha256;

pub fn p(s: &str) -> RelPath {
    RelPath::new(s.as_bytes()).unwrap()
}

pub struct Fx {
    pub _tmp: tempfile::TempDir,
    pub ws: PathBuf,
    pub store: Store,
}

pub fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let store = Store::open(&tmp.path().join("session")).unwrap();
    Fx { ws, store, _tmp: tmp }
}

pub fn write(path: &Path, content: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(path, content).unwrap();
}

/// What the host holds at `path`, as a guest exporting now would record it.
pub fn base_of(ws: &Path, path: &str) -> Base {
    let full = ws.join(path);
    let Ok(meta) = fs::symlink_metadata(&full) else { return Base::Absent };
    let mode = Mode::from_raw(meta.permissions().mode());
    if meta.file_type().is_symlink() {
        let target = fs::read_link(&full).unwrap();
        Base::Symlink { target: SymlinkTarget::new(target.as_os_str().as_encoded_bytes()).unwrap() }
    } else if meta.is_dir() {
        let parent = fs::File::open(full.parent().unwrap()).unwrap();
        let tree = tree::digest_at(&parent, full.file_name().unwrap().as_encoded_bytes()).unwrap();
        Base::Dir { mode, tree: Some(tree) }
    } else if meta.is_file() {
        let content = fs::read(&full).unwrap();
        Base::File { mode, size: content.len() as u64, sha256: Sha256::of(&content) }
    } else {
        Base::Special
    }
}

/// Builds a change stream against the workspace's current state.
pub struct Set<'a> {
    ws: &'a Path,
    w: Writer<Vec<u8>>,
}

impl<'a> Set<'a> {
    pub fn new(ws: &'a Path) -> Set<'a> {
        Set { ws, w: Writer::new(Vec::new()).unwrap() }
    }
    pub fn file(mut self, path: &str, content: &[u8], mode: u32) -> Self {
        let base = base_of(self.ws, path);
        self.w.file(&p(path), mode, content.len() as u64, &mut &content[..], &base).unwrap();
        self
    }
    pub fn dir(mut self, path: &str, mode: u32) -> Self {
        let base = match base_of(self.ws, path) {
            Base::Dir { mode, .. } => Base::Dir { mode, tree: None },
            other => other,
        };
        self.w.dir(&p(path), mode, &base).unwrap();
        self
    }
    pub fn opaque(mut self, path: &str, mode: u32) -> Self {
        let base = base_of(self.ws, path);
        self.w.opaque_dir(&p(path), mode, &base).unwrap();
        self
    }
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let base = base_of(self.ws, path);
        self.w.symlink(&p(path), &SymlinkTarget::new(target.as_bytes()).unwrap(), &base).unwrap();
        self
    }
    pub fn delete(mut self, path: &str) -> Self {
        let base = base_of(self.ws, path);
        self.w.delete(&p(path), &base).unwrap();
        self
    }
    pub fn mode(mut self, path: &str, mode: u32) -> Self {
        let base = base_of(self.ws, path);
        self.w.mode(&p(path), mode, &base).unwrap();
        self
    }
    pub fn stage(self, store: &Store) {
        let bytes = self.w.finish().unwrap().0;
        store.stage(&bytes[..], Limits::default()).unwrap();
    }
}

/// Whether `git` can be run here; tests that need it skip (saying so) when not.
pub fn have_git() -> bool {
    let ok = Command::new("git").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: git is not installed");
    }
    ok
}

/// Runs git in `dir` with a fixed identity and no user or system config.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stages the difference between `ws` (the host) and `guest` (a copy the
/// "guest" changed), as the exporter would: new and changed files and
/// symlinks, new directories, deletions.
pub fn stage_difference(ws: &Path, guest: &Path, store: &Store) {
    let mut set = Set::new(ws);
    set = diff_dir(ws, guest, "", set);
    set.stage(store);
}

fn diff_dir<'a>(ws: &Path, guest: &Path, rel: &str, mut set: Set<'a>) -> Set<'a> {
    let join = |name: &str| if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
    let mut names: Vec<String> =
        fs::read_dir(guest.join(rel)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    for name in &names {
        let path = join(name);
        let g = guest.join(&path);
        let h = ws.join(&path);
        let gm = fs::symlink_metadata(&g).unwrap();
        let hm = fs::symlink_metadata(&h).ok();
        let mode = gm.permissions().mode() & 0o777;
        if gm.file_type().is_symlink() {
            let target = fs::read_link(&g).unwrap();
            let same = hm.as_ref().is_some_and(|m| m.file_type().is_symlink()) && fs::read_link(&h).unwrap() == target;
            if !same {
                set = set.symlink(&path, target.to_str().unwrap());
            }
        } else if gm.is_dir() {
            if !hm.as_ref().is_some_and(|m| m.is_dir()) {
                set = set.dir(&path, mode);
            }
            set = diff_dir(ws, guest, &path, set);
        } else {
            let content = fs::read(&g).unwrap();
            let same = hm.as_ref().is_some_and(|m| m.is_file())
                && fs::read(&h).unwrap() == content
                && hm.as_ref().unwrap().permissions().mode() & 0o777 == mode;
            if !same {
                set = set.file(&path, &content, mode);
            }
        }
    }
    if let Ok(host) = fs::read_dir(ws.join(rel)) {
        let mut gone: Vec<String> =
            host.map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| !names.contains(n)).collect();
        gone.sort();
        for name in gone {
            set = set.delete(&join(&name));
        }
    }
    set
}
