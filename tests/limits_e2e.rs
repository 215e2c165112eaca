//! Limits on the guest, end to end: --timeout, --pids, --memory, and output
//! a slow reader cannot drain (host memory stays bounded).

use crate::rig;
use crate::run_e2e::{T, script};

#[test]
fn timeout_stops_the_command_keeps_its_changes_and_exits_124() {
    let Some(rig) = rig::require("timeout_stops_the_command_keeps_its_changes_and_exits_124") else { return };
    let out = rig.sh(
        &script(
            r#"start=$(date +%s)
             $S run --apply=all --timeout 3 -- sh -c 'echo kept > out.txt; echo started; sleep 120'; echo "rc=$?"
             echo "took=$(( $(date +%s) - start ))"
             cat out.txt
             start=$(date +%s)
             $S run --timeout 2s -- sh -c 'trap "" TERM; sleep 120'; echo "stubborn=$?"
             echo "took2=$(( $(date +%s) - start ))""#,
        ),
        T,
    );
    assert!(out.stdout.contains("started\nrc=124"), "{out}");
    assert!(out.stdout.contains("\nkept\n"), "the changes made before the timeout must be kept\n{out}");
    assert!(out.stderr.contains("ran out of time (--timeout 3s)"), "{out}");
    assert!(out.stdout.contains("stubborn=124"), "SIGKILL follows an ignored SIGTERM\n{out}");
    for (key, limit) in [("took=", 100), ("took2=", 100)] {
        let took: u64 = out.stdout.split(key).nth(1).and_then(|s| s.lines().next()?.parse().ok()).unwrap_or(999);
        assert!(took < limit, "{key}{took}: the command was not stopped\n{out}");
    }
}

#[test]
fn pids_caps_the_commands_processes() {
    let Some(rig) = rig::require("pids_caps_the_commands_processes") else { return };
    let out = rig.sh(
        &script(
            r#"$S run --pids 16 -- sh -c 'cat /proc/self/cgroup /sys/fs/cgroup/command/pids.max; for i in $(seq 1 40); do sleep 30 & done; echo "all forty started"'; echo "rc=$?"
             $S run -- sh -c 'for i in $(seq 1 40); do sleep 1 & done; wait; echo "forty=ok"'"#,
        ),
        T,
    );
    assert!(out.stdout.contains("0::/command\n16\n"), "the command runs in its own cgroup, capped\n{out}");
    assert!(
        !out.stdout.contains("all forty started") && out.stderr.contains("fork"),
        "the cap must refuse forks\n{out}"
    );
    assert!(out.stdout.contains("forty=ok"), "without --pids there is no cap\n{out}");
}

#[test]
fn memory_cap_ends_in_a_guest_oom_not_a_host_one() {
    let Some(rig) = rig::require("memory_cap_ends_in_a_guest_oom_not_a_host_one") else { return };
    let out = rig.sh(
        &script(
            r#"$S run --memory 256M -- python3 -c 'b = b"x" * (600 << 20); print(len(b))'; echo "rc=$?"
             $S run --memory 256M -- sh -c 'echo after=ok'"#,
        ),
        T,
    );
    assert!(out.stdout.contains("rc=137") || out.stdout.contains("rc=1\n"), "the guest must refuse the memory\n{out}");
    assert!(!out.stdout.contains("629145600"), "600 MiB fit in a 256 MiB guest?\n{out}");
    assert!(out.stdout.contains("after=ok"), "{out}");
}

#[test]
fn a_slow_reader_holds_back_a_flood_without_host_memory_growing() {
    let Some(rig) = rig::require("a_slow_reader_holds_back_a_flood_without_host_memory_growing") else { return };
    let out = rig.sh(
        &script(
            r#"rss() { awk '/VmRSS/ { print $2 }' /proc/$1/status 2>/dev/null || echo 0; }
             ($S run --memory 256M -- sh -c 'head -c 200000000 /dev/zero' | (sleep 25; wc -c) > count.txt) &
             sleep 18
             sup=$(pgrep -f 'stockade run --memory 256M' | head -n 1); vmm=$(pgrep -f 'stockade vmm' | head -n 1)
             echo "supervisor_kb=$(rss $sup)"; echo "vmm_kb=$(rss $vmm)"
             wait
             echo "count=$(cat count.txt)""#,
        ),
        T,
    );
    let kb = |key: &str| -> u64 {
        out.stdout.split(key).nth(1).and_then(|s| s.lines().next()?.trim().parse().ok()).unwrap_or(u64::MAX)
    };
    assert!(out.stdout.contains("count=200000000"), "every byte arrives once the reader reads\n{out}");
    assert!(kb("supervisor_kb=") < 64 * 1024, "the supervisor buffered the flood\n{out}");
    // The guest memory the VMM has touched (about 70 MiB) plus its own: a
    // VMM holding the flood would be far above. The flood is no larger
    // because 400 MB of it crashed the rig's L1 (nested SVM on the software
    // CPU) about every other run.
    assert!(kb("vmm_kb=") < 200 * 1024, "the VMM buffered the flood\n{out}");
}
