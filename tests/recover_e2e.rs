//! Nothing is lost when something dies: the supervisor killed outright, the
//! guest rebooting, powering off or its init stopped. Each run ends (no VMM
//! is left), its session says it was interrupted, and `stockade recover`
//! stages the change the guest wrote before, which `diff` shows and
//! `apply` lands.
//!
//! Every script runs with a home directory of its own, so that each sees
//! only its own sessions.

use std::time::Duration;

use crate::rig;
use crate::run_e2e::script;

/// A run that ends by the guest's silence waits out the supervisor's bound
/// (60 s) after a boot, then a recovery boots again.
const LONG: Duration = Duration::from_secs(900);

/// A fresh home, and a command that writes the change and flushes it to the
/// scratch disk (an unflushed write is lost with the guest's memory).
const PRELUDE: &str = r##"export HOME="$ws.home"; mkdir -p "$HOME"
git init -q . && echo base > base.txt && git add . && git -c user.name=t -c user.email=t@t commit -qm base
WRITE='echo before-the-end > kept.txt; sync; echo ready'
"##;

/// After the run ended: no VMM left, the session interrupted, then
/// recovered, reviewed and applied.
const RECOVER_AND_APPLY: &str = r##"
i=0; while pgrep -f ' vmm --config' > /dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done
echo "vmm_left=$(pgrep -f ' vmm --config' | wc -l)"
$S sessions --json > sessions.json
echo "interrupted=$(grep -c '"state": "interrupted"' sessions.json)"
echo "hint=$(grep -c '"recover": "stockade recover ' sessions.json)"
$S doctor 2>&1 | grep -q 'stockade recover ' && echo "doctor=lists it"
start=$(date +%s)
$S recover 2> recover.err; echo "recover=$?"
echo "recover_seconds=$(( $(date +%s) - start ))"
cat recover.err >&2
$S sessions --json | grep -c '"state": "interrupted"' | sed 's/^/after=/'
$S diff --stat 2>&1 | grep -c kept.txt | sed 's/^/diff=/'
$S apply; echo "apply=$?"
echo "landed=$(cat kept.txt)"
$S recover 2>&1 | grep -o 'no session waits to be recovered' | head -n1
"##;

fn check(out: &rig::Output, ended: &str) {
    assert!(out.stdout.contains(ended), "the run did not end as expected\n{out}");
    for line in [
        "vmm_left=0",
        "interrupted=1",
        "hint=1",
        "doctor=lists it",
        "recover=0",
        "after=0",
        "diff=1",
        "apply=0",
        "landed=before-the-end",
        "no session waits to be recovered",
    ] {
        assert!(out.stdout.contains(line), "expected {line}\n{out}");
    }
}

#[test]
fn a_killed_supervisor_leaves_no_vmm_and_its_changes_are_recovered() {
    let Some(rig) = rig::require("a_killed_supervisor_leaves_no_vmm_and_its_changes_are_recovered") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}{}{RECOVER_AND_APPLY}",
            r##"$S run -- sh -c "$WRITE; exec sleep 100000" > out.txt 2> err.txt &
pid=$!
i=0; until grep -q ready out.txt || [ $i -ge 400 ]; do sleep 1; i=$((i+1)); done
kill -9 $pid; wait $pid; echo "killed=$?"
"##
        )),
        LONG,
    );
    check(&out, "killed=137");
}

#[test]
fn a_guest_reboot_ends_the_run_and_its_changes_are_recovered() {
    let Some(rig) = rig::require("a_guest_reboot_ends_the_run_and_its_changes_are_recovered") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}{}{RECOVER_AND_APPLY}",
            r##"$S run -- sh -c "$WRITE; python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0x01234567)'" 2> err.txt
echo "run=$?"
grep -q 'stockade recover ' err.txt && echo "told=how to recover"
"##
        )),
        LONG,
    );
    check(&out, "run=125");
    assert!(out.stdout.contains("told=how to recover"), "{out}");
}

#[test]
fn a_guest_power_off_ends_the_run_and_its_changes_are_recovered() {
    let Some(rig) = rig::require("a_guest_power_off_ends_the_run_and_its_changes_are_recovered") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}{}{RECOVER_AND_APPLY}",
            r##"start=$(date +%s)
$S run -- sh -c "$WRITE; python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0x4321fedc)'" 2> err.txt
echo "run=$?"
echo "run_seconds=$(( $(date +%s) - start ))"
cat err.txt >&2
grep -q 'stockade recover ' err.txt && echo "told=how to recover"
"##
        )),
        LONG,
    );
    check(&out, "run=125");
    assert!(out.stdout.contains("told=how to recover"), "{out}");
}

/// Stops every thread of the init (its heartbeat too) by ptrace: PID 1
/// ignores SIGSTOP, but a tracer can hold it. The tracer then waits, so the
/// threads stay stopped.
const STOP_INIT: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
for tid in os.listdir("/proc/1/task"):
    if libc.ptrace(PTRACE_SEIZE, int(tid), None, None) != 0:
        print("seize", tid, "failed", ctypes.get_errno(), flush=True)
    libc.ptrace(PTRACE_INTERRUPT, int(tid), None, None)
time.sleep(100000)
"#;

#[test]
fn a_stopped_init_ends_the_run_and_its_changes_are_recovered() {
    let Some(rig) = rig::require("a_stopped_init_ends_the_run_and_its_changes_are_recovered") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}cat > stop_init.py <<'EOF'{STOP_INIT}EOF\n{}{RECOVER_AND_APPLY}",
            r##"start=$(date +%s)
$S run -- sh -c "$WRITE; python3 stop_init.py" 2> err.txt
echo "run=$?"
echo "run_seconds=$(( $(date +%s) - start ))"
cat err.txt >&2
grep -q 'stopped answering' err.txt && echo "told=the guest stopped answering"
grep -q 'stockade recover ' err.txt && echo "told=how to recover"
"##
        )),
        LONG,
    );
    check(&out, "run=125");
    assert!(out.stdout.contains("told=the guest stopped answering"), "{out}");
    assert!(out.stdout.contains("told=how to recover"), "{out}");
}

/// Measure: how long `stockade recover` takes for a kept scratch disk
/// holding a 1 GiB file (the supervisor killed after the guest wrote it).
/// Prints the number (`--nocapture`); a recovery still going after six
/// minutes is stopped, with what the VMM's threads and the VM were doing.
/// Run by hand (`--ignored`): a measurement must not fail the suite, and in
/// the rig a 1 GiB recovery has not yet passed: once its export stopped
/// after about 90 MiB with the host's stream at its end and the guest idle
/// (not the disk margin: 860 MiB were free), once the recovery VM ended
/// within seconds. The logs and any OOM kill are printed for the next try.
#[test]
#[ignore = "measurement; the 1 GiB recovery in the rig does not complete yet (see above)"]
fn recovery_time_of_a_1gib_scratch_disk() {
    let Some(rig) = rig::require("recovery_time_of_a_1gib_scratch_disk") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}{}",
            r##"# The rig's /tmp (a tmpfs of half its 4 GiB) holds the kept disk and the
# staged copy: room for both.
mount -o remount,size=3G /tmp
$S run -- sh -c "yes 0123456789abcdef | head -c 1073741824 > big.bin; sync; echo ready; exec sleep 100000" > out.txt 2> err.txt &
pid=$!
i=0; until grep -q ready out.txt || [ $i -ge 800 ]; do sleep 1; i=$((i+1)); done
kill -9 $pid; wait $pid
s=$(ls -d "$HOME"/.local/share/stockade/sessions/*/)
echo "disk_used=$(du -k "$s/scratch.img" | cut -f1)"
start=$(date +%s.%N)
RUST_LOG=info,stockade::vmm::devices::virtio::vsock=debug $S recover 2> recover.err &
rp=$!
i=0; while kill -0 $rp 2>/dev/null && [ $i -lt 360 ]; do sleep 1; i=$((i+1)); done
if kill -0 $rp 2>/dev/null; then
  echo "recover=stalled"
  for p in $(pgrep -f ' vmm --config') $rp; do
    for t in /proc/$p/task/*; do echo "pid $p task $(cat $t/comm) $(cat $t/stat | cut -d' ' -f3) $(cat $t/wchan)"; done
  done >&2
  echo "--- recover-kernel.log" >&2; tail -n 40 "$s/recover-kernel.log" >&2
  echo "--- recover-vmm.log" >&2; tail -n 40 "$s/recover-vmm.log" >&2
  ls -la "$s" "$s/changes" >&2; df -k "$s" >&2
  kill -9 $rp
fi
wait $rp; echo "recover=$?"
echo "recover_seconds=$(awk "BEGIN { print $(date +%s.%N) - $start }")"
tail -c 2000 recover.err >&2
echo "--- recover-kernel.log" >&2; tail -n 30 "$s/recover-kernel.log" >&2
echo "--- recover-vmm.log" >&2; tail -n 30 "$s/recover-vmm.log" >&2
dmesg | grep -i -E 'oom|killed process|segfault' >&2
$S diff --stat 2>&1 | grep -c big.bin | sed 's/^/diff=/'
"##
        )),
        LONG,
    );
    let line = out.stdout.lines().find(|l| l.starts_with("recover_seconds=")).unwrap_or("recover_seconds=?");
    eprintln!("BENCH recovery of a kept scratch disk holding a 1 GiB file: {line}");
    assert!(out.stdout.contains("recover=0") && out.stdout.contains("diff=1"), "{out}");
}
