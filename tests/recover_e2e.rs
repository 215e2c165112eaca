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
            "{}{PRELUDE}{}{RECOVER_AND_APPLY}",
            rig::STOPS_ITS_GUEST,
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
            "{}{PRELUDE}{}{RECOVER_AND_APPLY}",
            rig::STOPS_ITS_GUEST,
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
            "{}{PRELUDE}{}{RECOVER_AND_APPLY}",
            rig::STOPS_ITS_GUEST,
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
            "{}{PRELUDE}cat > stop_init.py <<'EOF'{STOP_INIT}EOF\n{}{RECOVER_AND_APPLY}",
            rig::STOPS_ITS_GUEST,
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

/// A command that writes a big file of random bytes, flushes it to the
/// scratch disk, prints its digest and then a tick every second; `$1` is
/// the size in bytes. Guest memory comes from `$STOCKADE_CONFIG_DIR`, which
/// keeps the rig's own settings (one vCPU: a two-vCPU guest stalled under
/// this I/O on L1's two software CPUs).
const BIG: &str = r##"config="$ws.config"; mkdir -p "$config"
{ grep -v '^memory' "${STOCKADE_CONFIG_DIR:-/nonexistent}/config.toml" 2>/dev/null; echo 'memory = "1G"'; } > "$config/config.toml"
export STOCKADE_CONFIG_DIR="$config"
big() {
  $S run -- sh -c "head -c $1 /dev/urandom > big.bin; sync; echo sum=\$(sha256sum big.bin | cut -c1-64); echo ready
    i=0; while :; do i=\$((i+1)); echo tick \$i; sleep 1; done" > out.txt 2> err.txt &
  pid=$!
  i=0; until grep -q ready out.txt || [ $i -ge 900 ]; do sleep 1; i=$((i+1)); done
}
# Times a checkpoint (`diff --stat` on the running session), then says
# whether the command still ticks.
checkpoint() {
  start=$(date +%s.%N)
  $S diff --stat > live.out 2> live.err; echo "live_diff=$?"
  echo "checkpoint_seconds=$(awk "BEGIN { print $(date +%s.%N) - $start }")"
  cat live.err >&2
  grep -c big.bin live.out | sed 's/^/live_big=/'
  before=$(grep -c tick out.txt); sleep 5
  [ "$(grep -c tick out.txt)" -gt "$before" ] && echo "goes_on=yes"
}
# Kills the supervisor, waits for its VMM to go, times the recovery and
# lands the file.
recover_and_apply() {
  kill -9 $pid; wait $pid
  i=0; while pgrep -f ' vmm --config' > /dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done
  start=$(date +%s.%N)
  $S recover 2> recover.err; echo "recover=$?"
  echo "recover_seconds=$(awk "BEGIN { print $(date +%s.%N) - $start }")"
  tail -c 2000 recover.err >&2
  $S diff --stat 2>&1 | grep -c big.bin | sed 's/^/diff=/'
  $S apply > /dev/null 2>&1; echo "apply=$?"
  [ "sum=$(sha256sum big.bin | cut -c1-64)" = "$(grep '^sum=' out.txt)" ] && echo "landed=the same bytes"
}
"##;

fn check_big(out: &rig::Output) {
    for line in ["live_diff=0", "live_big=1", "goes_on=yes", "recover=0", "diff=1", "apply=0", "landed=the same bytes"]
    {
        assert!(out.stdout.contains(line), "expected {line}\n{out}");
    }
}

/// A large file survives a checkpoint of the running session (the command
/// goes on), and then the supervisor's death: `recover` stages it whole and
/// `apply` lands the same bytes. It once stalled: `recover` held the stderr
/// lock while the staging thread's progress meter waited on it.
#[test]
fn a_large_file_survives_a_checkpoint_and_a_recovery() {
    let Some(rig) = rig::require("a_large_file_survives_a_checkpoint_and_a_recovery") else { return };
    let out = rig.sh(&script(&format!("{PRELUDE}{BIG}{}", "big 209715200\ncheckpoint\nrecover_and_apply\n")), LONG);
    check_big(&out);
}

/// Measure: a checkpoint of a running session whose change set holds a
/// 1 GiB file (`diff --stat`), then `stockade recover` of its kept scratch
/// disk once the supervisor is killed. Prints both times (`--nocapture`).
/// Run by hand (`--ignored`): it takes about ten minutes in the rig, and a
/// measurement must not fail the suite on time alone. The 1 GiB checkpoint
/// took 209 s in the rig with the command going on; the recovery has not
/// been timed since its stall was fixed.
#[test]
#[ignore = "measurement; about ten minutes in the rig"]
fn recovery_time_of_a_1gib_scratch_disk() {
    let Some(rig) = rig::require("recovery_time_of_a_1gib_scratch_disk") else { return };
    // The rig's /tmp (a tmpfs of half its 4 GiB) holds the kept disk, the
    // checkpoint and then the recovered copy: room for them.
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}{BIG}{}",
            "mount -o remount,size=3G /tmp\nbig 1073741824\ncheckpoint\nrecover_and_apply\n"
        )),
        Duration::from_secs(1800),
    );
    for what in ["checkpoint_seconds=", "recover_seconds="] {
        let line = out.stdout.lines().find(|l| l.starts_with(what)).unwrap_or(what);
        eprintln!("BENCH 1 GiB file: {line}");
    }
    check_big(&out);
}
