//! Work lands as git, end to end: two real runs from one commit become two
//! branches parented on that commit (recorded when each run started, though
//! HEAD moved since), and making them leaves the working tree and git's
//! index byte-identical.

use crate::rig;
use crate::run_e2e::{T, script};

#[test]
fn two_runs_from_one_commit_become_two_branches_on_it_and_touch_nothing() {
    let Some(rig) = rig::require("two_runs_from_one_commit_become_two_branches_on_it_and_touch_nothing") else {
        return;
    };
    let out = rig.sh(
        &script(
            r##"git init -q; git config user.email t@example.com; git config user.name t
             echo base > a; echo bye > d; git add -A; git commit -qm base
             start=$(git rev-parse HEAD); echo "start=$start"
             $S run --apply none -- sh -c 'echo one > a; rm d; printf "#!/bin/sh\n" > run.sh; chmod +x run.sh; ln -s a link'
             echo "run1=$?"
             $S run --apply none -- sh -c 'echo two > b'
             echo "run2=$?"
             echo host > h; git add h; git commit -qm moved
             echo mine > s; git add s; echo edit > a
             state() { find . -path ./.git -prune -o \( -type f -o -type l \) -print | sort | while read -r f; do
                 if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; else echo "$f $(stat -c %a "$f") $(sha256sum < "$f")"; fi
             done; sha256sum .git/index .git/HEAD; }
             before=$(state)
             $S apply --branch second; echo "branch1=$?"
             $S apply --branch first; echo "branch2=$?"
             $S apply --branch again; echo "nothing-left=$?"
             [ "$(state)" = "$before" ] && echo untouched || { echo changed; state; }
             echo "parents=$(git rev-parse second^ first^ | tr '\n' ' ')"
             echo "first=[$(git diff --name-status "$start" first | tr '\n\t' '; ')]"
             echo "second=[$(git diff --name-status "$start" second | tr '\n\t' '; ')]"
             echo "counts=$(git rev-list --count "$start..first") $(git rev-list --count "$start..second")"
             echo "modes=$(git ls-tree first run.sh link | cut -c1-6 | tr '\n' ' ')""##,
        ),
        T,
    );
    let start = out.stdout.lines().find_map(|l| l.strip_prefix("start=")).expect("start").to_string();
    assert!(out.stdout.contains("run1=0") && out.stdout.contains("run2=0"), "{out}");
    assert!(out.stdout.contains("branch1=0") && out.stdout.contains("branch2=0"), "{out}");
    assert!(out.stdout.contains("nothing-left=125"), "{out}");
    assert!(out.stdout.contains("untouched"), "{out}");
    assert!(out.stdout.contains(&format!("parents={start} {start} ")), "both on the starting commit\n{out}");
    assert!(out.stdout.contains("first=[M a;D d;A link;A run.sh;]"), "{out}");
    assert!(out.stdout.contains("second=[A b;]"), "{out}");
    assert!(out.stdout.contains("counts=1 1"), "{out}");
    assert!(out.stdout.contains("modes=100755 120000 ") || out.stdout.contains("modes=120000 100755 "), "{out}");
}
