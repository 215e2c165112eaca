//! Review while it runs: a command writes files in steps; `diff` during
//! the run shows the first step, `apply` mid-run lands it, and the final
//! apply lands the rest without offering the first again or calling it a
//! conflict, while a host edit made meanwhile to a landed file still is one.

use std::time::Duration;

use crate::rig;
use crate::run_e2e::script;

/// Boots, a checkpoint and two applies on the software-CPU rig.
const T: Duration = Duration::from_secs(600);

#[test]
fn a_running_session_is_reviewed_and_applied_in_steps() {
    let Some(rig) = rig::require("a_running_session_is_reviewed_and_applied_in_steps") else { return };
    // The guest waits on its stdin (a fifo the script holds open) between
    // the steps: the host says when step 2 may begin.
    let out = rig.sh(
        &script(
            "echo v0 > a.txt; echo base > edited.txt
             mkfifo ctl
             $S run -- sh -c 'echo v1 > a.txt; echo s1 > step1.txt; echo one > edited.txt; echo step1-written
                 read go; echo v2 > a.txt; echo s2 > step2.txt; echo two > edited.txt; echo step2-written' \
                 < ctl > guest.out 2> guest.err &
             exec 3> ctl
             for i in $(seq 900); do grep -q step1-written guest.out 2>/dev/null && break; sleep 0.2; done
             $S diff --stat; echo \"diff=$?\"
             $S diff --patch > step1.patch; echo \"patch=$?\"; grep -c '^+++ ' step1.patch
             test -e step1.txt && echo step1-leaked || echo step1-absent
             $S sessions | grep running | sed 's/  */ /g'
             $S apply; echo \"live-apply=$?\"
             echo \"host: a=$(cat a.txt) step1=$(cat step1.txt) edited=$(cat edited.txt)\"
             echo 'the user edit' > edited.txt
             echo go >&3; exec 3>&-
             wait; echo \"run=$?\"; cat guest.out
             $S diff --stat; echo \"final-diff=$?\"
             $S apply; echo \"final-apply=$?\"
             echo \"final: a=$(cat a.txt) step1=$(cat step1.txt) step2=$(cat step2.txt) edited=$(cat edited.txt)\"",
        ),
        T,
    );
    assert!(out.stdout.contains("diff=0") && out.stdout.contains("patch=0\n3\n"), "{out}");
    assert!(out.stderr.contains("is running; these are its changes so far"), "{out}");
    assert!(out.stdout.contains("step1-absent"), "nothing lands before apply\n{out}");
    assert!(out.stdout.contains("running"), "`sessions` lists the running session\n{out}");
    assert!(out.stdout.contains("live-apply=0"), "{out}");
    assert!(out.stdout.contains("host: a=v1 step1=s1 edited=one"), "the first step landed mid-run\n{out}");
    assert!(out.stdout.contains("run=0") && out.stdout.contains("step2-written"), "{out}");
    assert!(out.stdout.contains("final-apply=1"), "the host edit is a conflict\n{out}");
    assert!(
        out.stdout.contains("final: a=v2 step1=s1 step2=s2 edited=the user edit"),
        "the rest lands over what landed mid-run, the user's edit is kept\n{out}"
    );
    let conflicts =
        out.stdout.matches("changed on the host").count() + out.stderr.matches("changed on the host").count();
    assert!(conflicts >= 1 && !out.stdout.contains("a.txt was changed"), "only edited.txt conflicts\n{out}");
}
