//! Diff tests: exact output for small cases, and patches checked by `git
//! apply` against a copy of the host workspace.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use super::*;
use crate::changes::Host;
use crate::changes::testutil::{fx, p, stage_difference, write};
use crate::protocol::change_set::entry::Mode;
use crate::review::content::FileData;
use crate::review::summary::Summary;
use crate::review::testutil::options;
use crate::review::view::View;

fn file(bytes: &[u8], mode: u32) -> Side {
    Side::File(FileData { mode: Mode::from_raw(mode), size: bytes.len() as u64, bytes: Some(bytes.to_vec()) })
}

fn render(format: Format, path: &str, old: &Side, new: &Side) -> String {
    let mut out = Vec::new();
    write_change(&mut out, format, &Change { path: &p(path), old, new, notes: &[] }).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn terminal() -> Format {
    Format::Terminal(Painter::plain())
}

#[test]
fn a_modification_is_a_unified_diff_with_context() {
    let old = file(b"1\n2\n3\n4\n5\n6\n7\n8\n9\n", 0o644);
    let new = file(b"1\n2\n3\n4\nfive\n6\n7\n8\n9\n", 0o644);
    let out = render(terminal(), "n.txt", &old, &new);
    assert_eq!(
        out,
        "diff --git a/n.txt b/n.txt\n--- a/n.txt\n+++ b/n.txt\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
    );
}

#[test]
fn additions_and_deletions_are_whole_file_diffs() {
    let added = render(Format::Patch, "new.txt", &Side::Absent, &file(b"a\nb\n", 0o755));
    assert_eq!(
        added,
        "diff --git a/new.txt b/new.txt\nnew file mode 100755\n\
         index 0000000000000000000000000000000000000000..422c2b7ab3b3c668038da977e4e93a5fc623169c\n\
         --- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    );
    let deleted = render(terminal(), "old.txt", &file(b"only\n", 0o644), &Side::Absent);
    assert!(
        deleted.contains("deleted file mode 100644\n--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-only\n"),
        "{deleted}"
    );
    let no_newline = render(terminal(), "x", &file(b"a", 0o644), &file(b"b", 0o644));
    assert!(
        no_newline.ends_with("-a\n\\ No newline at end of file\n+b\n\\ No newline at end of file\n"),
        "{no_newline}"
    );
}

#[test]
fn binary_files_are_shown_by_size_and_hash() {
    let out = render(terminal(), "img.png", &Side::Absent, &file(b"\x89PNG\0\x01\x02", 0o644));
    assert!(out.contains("new file mode 100644"), "{out}");
    assert!(out.contains("binary file: nothing → 7 B, sha256 "), "{out}");
    assert!(!out.contains("@@"), "{out}");
    let large = Side::File(FileData { mode: Mode::from_raw(0o644), size: 1 << 30, bytes: None });
    let out = render(terminal(), "big", &file(b"x\n", 0o644), &large);
    assert!(out.contains("large file, not shown: 2 B, sha256 ") && out.contains("→ 1.0 GiB"), "{out}");
}

#[test]
fn symlinks_diff_their_targets() {
    let out = render(terminal(), "link", &Side::Symlink(b"a".to_vec()), &Side::Symlink(b"/etc/passwd".to_vec()));
    assert!(out.contains("-a\n\\ No newline at end of file\n+/etc/passwd\n"), "{out}");
    let swapped = render(Format::Patch, "x", &file(b"x\n", 0o644), &Side::Symlink(b"y".to_vec()));
    assert!(swapped.contains("deleted file mode 100644") && swapped.contains("new file mode 120000"), "{swapped}");
}

#[test]
fn mode_only_changes_have_no_hunks() {
    let out = render(Format::Patch, "run.sh", &file(b"#!/bin/sh\n", 0o644), &file(b"#!/bin/sh\n", 0o755));
    assert_eq!(out, "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n");
}

#[test]
fn terminal_controls_and_invisible_marks_are_escaped() {
    let hostile = "ok\n\x1b[2J\x1b]0;pwned\x07\nif admin \u{202E} }\u{2066}\nzero\u{200B}width\n\u{fffd}\n".as_bytes();
    let mut with_bad_byte = hostile.to_vec();
    with_bad_byte.extend_from_slice(b"\xff\n");
    for painter in [Painter::plain(), Painter::new(true)] {
        let out = render(Format::Terminal(painter), "evil.txt", &Side::Absent, &file(&with_bad_byte, 0o644));
        assert!(!out.contains("\x1b[2J") && !out.contains("\x1b]0") && !out.contains('\x07'), "{out:?}");
        assert!(!out.contains('\u{202E}') && !out.contains('\u{2066}') && !out.contains('\u{200B}'), "{out:?}");
        assert!(out.contains("<U+202E>") && out.contains("<U+200B>") && out.contains("\\xff"), "{out:?}");
        assert!(out.contains("\\u{1b}"), "{out:?}");
    }
    let plain = render(terminal(), "evil.txt", &Side::Absent, &file(&with_bad_byte, 0o644));
    assert!(plain.contains("+\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\n"), "{plain:?}");
    // A patch carries the bytes as they are.
    let patch = render(Format::Patch, "evil.txt", &Side::Absent, &file(&with_bad_byte, 0o644));
    assert!(patch.contains("\x1b[2J"));
}

#[test]
fn odd_paths_are_quoted_like_git_in_patches() {
    let out = render(Format::Patch, "dir/tab\there \"q\"", &Side::Absent, &file(b"x\n", 0o644));
    assert!(out.starts_with("diff --git \"a/dir/tab\\there \\\"q\\\"\" \"b/dir/tab\\there \\\"q\\\"\"\n"), "{out}");
    assert_eq!(quoted("a/", &p("caf\u{e9}"), true), "\"a/caf\\303\\251\"");
    assert_eq!(quoted("a/", &p("with space"), true), "a/with space");
}

#[test]
fn line_stats_count_changed_lines() {
    let deadline = Instant::now() + Duration::from_secs(1);
    let stat = line_stat(&file(b"a\nb\nc\n", 0o644), &file(b"a\nB\nc\nd\n", 0o644), deadline).unwrap();
    assert_eq!(stat, LineStat { added: 2, removed: 1 });
    assert_eq!(line_stat(&Side::Absent, &file(b"1\n2", 0o644), deadline), Some(LineStat { added: 2, removed: 0 }));
    assert_eq!(line_stat(&file(b"x\n", 0o644), &Side::Absent, deadline), Some(LineStat { added: 0, removed: 1 }));
    assert_eq!(line_stat(&Side::Absent, &file(b"\0bin", 0o644), deadline), None);
}

#[test]
fn hunk_ranges_follow_gits_conventions() {
    assert_eq!(hunk_range(&(0..0)), "0,0");
    assert_eq!(hunk_range(&(4..5)), "5");
    assert_eq!(hunk_range(&(4..9)), "5,5");
    assert_eq!(base85(&[0, 0, 0, 0]), b"00000");
    assert_eq!(base85(&[0xff, 0xff, 0xff, 0xff]), b"|NsC0");
}

fn git_apply(dir: &Path, patch: &[u8], check: bool) -> std::process::Output {
    let mut cmd = Command::new("git");
    cmd.arg("apply");
    if check {
        cmd.arg("--check");
    }
    let mut child = cmd
        .arg("-")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), patch).unwrap();
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

/// Every file, symlink and mode below `dir`, for comparing trees.
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                found.push((rel, format!("-> {}", fs::read_link(&path).unwrap().display())));
            } else if meta.is_dir() {
                stack.push(path);
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                found.push((rel, format!("{exec} {:?}", fs::read(&path).unwrap())));
            }
        }
    }
    found.sort();
    found
}

/// The `--patch` output, applied by git to a copy of the host, gives the
/// guest's tree.
#[test]
fn patches_apply_with_git_and_give_the_guests_tree() {
    if !crate::changes::testutil::have_git() {
        return;
    }
    let f = fx();
    let ws = &f.ws;
    write(&ws.join("src/main.rs"), b"fn main() {\n    println!(\"hi\");\n}\n");
    write(&ws.join("gone.txt"), b"bye\n");
    write(&ws.join("old/dir/a.txt"), b"a\n");
    write(&ws.join("old/dir/b.txt"), b"b\n");
    write(&ws.join("img.bin"), &[0u8, 1, 2, 3, 255, 0, 7]);
    write(&ws.join("script.sh"), b"#!/bin/sh\necho hi\n");
    write(&ws.join("noeol.txt"), b"last line");
    write(&ws.join("becomes-link"), b"file\n");
    symlink("src", ws.join("link")).unwrap();

    let guest = f._tmp.path().join("guest");
    assert!(Command::new("cp").arg("-a").arg(ws).arg(&guest).status().unwrap().success());
    write(&guest.join("src/main.rs"), b"fn main() {\n    println!(\"hello\");\n    done();\n}\n");
    write(&guest.join("src/new file \u{e9}.rs"), b"// new\n");
    fs::remove_file(guest.join("gone.txt")).unwrap();
    fs::remove_dir_all(guest.join("old")).unwrap();
    let mut bin: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    bin[10] = 0;
    write(&guest.join("img.bin"), &bin);
    write(&guest.join("new.bin"), &[0u8; 300]);
    fs::set_permissions(guest.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&guest.join("noeol.txt"), b"last line, edited");
    write(&guest.join("empty"), b"");
    fs::remove_file(guest.join("link")).unwrap();
    symlink("src/main.rs", guest.join("link")).unwrap();
    fs::remove_file(guest.join("becomes-link")).unwrap();
    symlink("noeol.txt", guest.join("becomes-link")).unwrap();
    write(&guest.join("deep/er/file.txt"), b"deep\n");
    // Flagged paths carry notes on the terminal, never in a patch.
    write(&guest.join(".envrc"), b"use nix\n");
    symlink("/etc/passwd", guest.join("outside")).unwrap();
    stage_difference(ws, &guest, &f.store);

    let summary = Summary::build(&f.store, ws, &options()).unwrap();
    let host = Host::open(ws);
    let view = View { summary: &summary, store: &f.store, host: &host, format: Format::Patch, session: None };
    let mut patch = Vec::new();
    view.write_all(&mut patch, true).unwrap();
    assert!(!patch.contains(&0x1b), "no colour in a patch");

    let check = git_apply(ws, &patch, true);
    assert!(
        check.status.success(),
        "git apply --check: {}\n{}",
        String::from_utf8_lossy(&check.stderr),
        String::from_utf8_lossy(&patch)
    );
    let applied = git_apply(ws, &patch, false);
    assert!(applied.status.success(), "git apply: {}", String::from_utf8_lossy(&applied.stderr));
    // git apply leaves no empty directories behind and creates none; compare files.
    assert_eq!(tree(ws), tree(&guest), "patch:\n{}", String::from_utf8_lossy(&patch));
}
