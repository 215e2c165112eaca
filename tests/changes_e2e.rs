//! The workspace overlay end to end: what the guest changes is staged, shown
//! and applied only on request, conflicts with host edits are kept apart.

use crate::rig;
use crate::run_e2e::{T, script};

#[test]
fn guest_changes_are_staged_then_applied_on_request() {
    let Some(rig) = rig::require("guest_changes_are_staged_then_applied_on_request") else { return };
    let out = rig.sh(
        &script(
            "git init -q; git config user.email t@example.com; git config user.name t
             echo original > f; mkdir gone; echo x > gone/x; echo keep > k; ln -s f link
             git add -A; git commit -qm init
             $S run -- sh -c 'echo changed > f; echo new > g; mkdir -p d/e; echo deep > d/e/h; rm -rf gone
                 chmod +x k; ln -sf g link; mkfifo pipe; git commit -qam guest-commit'
             echo \"run=$?\"
             echo \"host-f=$(cat f)\"; test -e g && echo g-leaked || echo g-absent
             $S diff --stat; echo \"stat=$?\"
             $S diff --patch > changes.patch; echo \"patch=$?\"
             $S apply; echo \"apply=$?\"
             echo \"after-f=$(cat f) g=$(cat g) h=$(cat d/e/h) link=$(readlink link)\"
             test -e gone && echo gone-still || echo gone-removed
             test -x k && echo k-executable
             test -e pipe && echo fifo-applied || echo no-fifo
             git log --format=%s | head -n 2 | tr '\\n' ' '; echo
             git status --porcelain --untracked-files=no | wc -l
             $S sessions",
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("host-f=original\ng-absent"), "nothing may land before apply\n{out}");
    assert!(out.stdout.contains("stat=0") && out.stdout.contains("patch=0"), "{out}");
    assert!(out.stdout.contains("apply=0"), "{out}");
    assert!(out.stdout.contains("after-f=changed g=new h=deep link=g"), "{out}");
    assert!(out.stdout.contains("gone-removed") && out.stdout.contains("k-executable"), "{out}");
    assert!(out.stdout.contains("no-fifo"), "special files are never applied\n{out}");
    assert!(out.stdout.contains("guest-commit init"), "the guest's commit must land as a commit\n{out}");
    assert!(out.stdout.contains("\n0\n"), "the work tree matches the guest's commit\n{out}");
    assert!(out.stderr.to_lowercase().contains("git"), "the summary must show the git change\n{out}");
}

#[test]
fn host_edits_during_a_session_are_conflicts_never_overwritten() {
    let Some(rig) = rig::require("host_edits_during_a_session_are_conflicts") else { return };
    let out = rig.sh(
        &script(
            "echo base > c; echo base > other
             $S run -- sh -c 'echo guest > c; echo guest > other; echo wrote; sleep 6' > guest.out &
             for i in $(seq 300); do grep -q wrote guest.out 2>/dev/null && break; sleep 0.2; done
             echo host > c
             wait; echo \"run=$?\"
             $S apply; echo \"apply=$?\"
             echo \"c=$(cat c) other=$(cat other)\"
             $S apply --force c; echo \"forced=$?\"
             echo \"c=$(cat c)\"",
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("apply=1"), "a conflict makes apply fail\n{out}");
    assert!(out.stdout.contains("c=host other=guest"), "the host edit is kept, the rest applied\n{out}");
    assert!(out.stdout.contains("forced=0\nc=guest"), "--force applies the named path\n{out}");
    assert!(out.stderr.contains("changed on the host"), "{out}");
}

#[test]
fn what_the_guest_saw_decides_conflicts() {
    let Some(rig) = rig::require("what_the_guest_saw_decides_conflicts") else { return };
    let out = rig.sh(
        &script(
            // `late` sits in a directory the guest looks into only when it
            // writes it: where a program has looked up several names, the
            // guest kernel lists the directory ahead (guest-kernel/patches),
            // and a listed name counts as seen.
            "mkdir later; for f in read-first looked-only later/late; do echo base > $f; done; mkdir tree; echo x > tree/x
             $S run -- sh -c 'cat read-first >/dev/null; stat looked-only >/dev/null; ls tree >/dev/null
                 echo looked; sleep 8
                 for f in read-first looked-only later/late; do echo guest > $f; done; rm -rf tree' > guest.out &
             for i in $(seq 300); do grep -q looked guest.out 2>/dev/null && break; sleep 0.2; done
             for f in read-first looked-only later/late; do echo host > $f; done; echo added > tree/added
             wait; echo \"run=$?\"
             $S apply; echo \"apply=$?\"
             for f in read-first looked-only later/late tree/added; do echo \"$f=$(cat $f)\"; done",
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("apply=1"), "{out}");
    assert!(
        out.stdout.contains("read-first=host\nlooked-only=host\nlater/late=guest\ntree/added=added"),
        "host edits after the guest read or looked up a file, and a file added to a tree the guest listed, \
         are kept; an edit before the guest's first look is what the guest built on\n{out}"
    );
    assert!(out.stdout.contains("looked-only was changed on the host after the guest saw it"), "{out}");
}

#[test]
fn a_run_in_a_big_workspace_looks_only_at_what_it_touches() {
    let Some(rig) = rig::require("a_run_in_a_big_workspace_looks_only_at_what_it_touches") else { return };
    let out = rig.sh(
        &script(
            "python3 -c '
import os
for i in range(100):
    d = \"node_modules/pkg%d\" % i
    os.makedirs(d)
    for j in range(1000):
        open(\"%s/f%d.js\" % (d, j), \"w\").close()
'
             echo \"files=$(find . -type f | wc -l)\"
             strace -f -qq -c -o stats.txt -e trace=%stat,getdents64 $S run -- sh -c 'echo hi > new.txt'
             echo \"run=$?\"
             awk '$NF ~ /stat|getdents/ { n += $4 } END { print \"stat-calls=\" n }' stats.txt",
        ),
        T,
    );
    assert!(out.stdout.contains("files=100000"), "{out}");
    assert!(out.stdout.contains("run=0"), "{out}");
    let calls: u64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("stat-calls="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("strace counted no calls\n{out}"));
    assert!(
        calls < 10_000,
        "a run must not stat the workspace's 100,000 files: {calls} stat and getdents calls\n{out}"
    );
}

#[test]
fn a_ten_thousand_file_change_set_round_trips() {
    let Some(rig) = rig::require("a_ten_thousand_file_change_set_round_trips") else { return };
    let out = rig.sh(
        &script(
            "echo seed > seed
             start=$(date +%s)
             $S run -- python3 -c '
import os
for i in range(100):
    d = \"node_modules/pkg%d/lib\" % i
    os.makedirs(d)
    for j in range(100):
        open(\"%s/f%d.js\" % (d, j), \"w\").write(\"module.exports = %d;\\n\" % j)
'
             echo \"run=$? in $(( $(date +%s) - start ))s\"
             start=$(date +%s)
             $S apply; echo \"apply=$? in $(( $(date +%s) - start ))s\"
             find node_modules -type f | wc -l
             cat node_modules/pkg99/lib/f99.js",
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("apply=0"), "{out}");
    assert!(out.stdout.contains("\n10000\nmodule.exports = 99;"), "{out}");
}

/// A hostile guest swaps `.git/hooks` for a symlink into the workspace (its
/// hook then looks like an ordinary new file), hides a real hook of a second
/// repository behind 50 decoy `.envrc` files, and writes `.git/info/exclude`.
/// Under `--ci --apply all` every one of them is shown and held back, the
/// ordinary change is applied, and the JSON summary names what was held back
/// and the command that applies it.
#[test]
fn a_hostile_guests_hooks_are_shown_and_held_back_under_ci_apply_all() {
    let Some(rig) = rig::require("a_hostile_guests_hooks_are_shown_and_held_back_under_ci_apply_all") else {
        return;
    };
    let out = rig.sh(
        &script(
            "git init -q; git config user.email t@example.com; git config user.name t
             echo base > README; git add -A; git commit -qm init
             $S run --ci --apply all --summary summary.json -- sh -c '
                 for i in $(seq -w 0 49); do mkdir -p d$i; echo \"echo hi\" > d$i/.envrc; done
                 mkdir -p tools/hooks lib
                 printf \"#!/bin/sh\\necho pwned\\n\" > tools/hooks/pre-commit; chmod +x tools/hooks/pre-commit
                 rm -rf .git/hooks; ln -s ../tools/hooks .git/hooks
                 echo \"*.secret\" >> .git/info/exclude
                 git init -q lib; printf \"#!/bin/sh\\necho pwned\\n\" > lib/.git/hooks/pre-push
                 chmod +x lib/.git/hooks/pre-push
                 echo guest > README'
             echo \"run=$?\"
             printf 'summary=%s\\n' \"$(cat summary.json)\"
             test -L .git/hooks && echo hooks-swapped || echo hooks-kept
             test -e tools/hooks/pre-commit && echo hook-applied || echo hook-held
             test -e lib/.git/hooks/pre-push && echo lib-hook-applied || echo lib-hook-held
             test -e d07/.envrc && echo envrc-applied || echo envrc-held
             grep -q secret .git/info/exclude && echo exclude-applied || echo exclude-held
             echo \"readme=$(cat README)\"
             $S apply --include-code; echo \"include=$?\"
             test -L .git/hooks && echo now-swapped
             test -e lib/.git/hooks/pre-push && echo lib-hook-now",
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    for kept in ["hooks-kept", "hook-held", "lib-hook-held", "envrc-held", "exclude-held"] {
        assert!(out.stdout.contains(kept), "{kept}\n{out}");
    }
    assert!(out.stdout.contains("readme=guest"), "ordinary changes are applied\n{out}");
    let attention = &out.stderr[out.stderr.find("runs code by itself").unwrap_or(0)..];
    assert!(!attention.contains("… and"), "nothing flagged is cut\n{out}");
    for line in [
        ".git/hooks  ",
        "symlink inside a git directory",
        "as .git/hooks/pre-commit",
        "lib/.git/hooks/pre-push",
        ".git/info/exclude",
        "d49/.envrc",
    ] {
        assert!(attention.contains(line), "{line} not shown\n{out}");
    }
    assert!(out.stderr.contains("held back") && out.stderr.contains("--include-code`"), "{out}");
    let summary_line = out.stdout.lines().find_map(|l| l.strip_prefix("summary=")).expect("the summary");
    let summary: serde_json::Value = serde_json::from_str(summary_line).expect("JSON summary");
    let held: Vec<&str> =
        summary["changes"]["held_back"].as_array().expect("held_back").iter().filter_map(|v| v.as_str()).collect();
    for path in [".git/hooks", "tools/hooks/pre-commit", "lib/.git/hooks/pre-push", ".git/info/exclude", "d00/.envrc"] {
        assert!(held.contains(&path), "{path} not in held_back {held:?}");
    }
    let session = summary["session"].as_str().expect("session");
    assert_eq!(summary["changes"]["apply_held_back"], format!("stockade apply {session} --include-code"));
    assert!(out.stdout.contains("include=0\nnow-swapped\nlib-hook-now"), "--include-code applies them\n{out}");
}
