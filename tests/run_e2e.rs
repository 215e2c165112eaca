//! `stockade run` end to end: a real guest boots (in the rig where this
//! host's KVM cannot boot it) and runs host commands.

use std::time::Duration;

use crate::rig;
use crate::util::stockade_bin;

/// Several VM boots per script on a software CPU: be generous.
pub(crate) const T: Duration = Duration::from_secs(180);

/// A script prelude: `S` runs stockade, `ws` is a fresh workspace and the cwd.
/// On exit it appends the logs of any session stockade itself failed in
/// (status 125) during the script, and L1's free memory and /tmp, to stderr,
/// so a failure explains itself; then it removes `$ws` and `$ws.*` (scripts
/// keep their other files there), since L1's /tmp is memory that the later
/// tests' guests need.
pub(crate) fn script(body: &str) -> String {
    format!("set -u\nS={bin}\nws=$(mktemp -d /tmp/ws.XXXXXX)\ncd \"$ws\"\n{DIAGNOSE}\n{body}\n", bin = stockade_bin())
}

/// Guest shell (no single quotes: it goes inside `sh -c '...'`): `leaks
/// PATTERN [FILE...]` names the files holding PATTERN among every process's
/// environment, the FILEs, and all the guest could write to or be handed
/// ($HOME, /tmp, /run, /etc), less the read-only host shares mounted there
/// (home toolchains): the guest cannot put anything in them, and reading
/// their gigabytes takes the better part of an hour on the rig's software
/// CPU.
pub(crate) const LEAKS: &str = r#"leaks() {
                     pattern=$1; shift
                     ro=; while read -r _ mnt _ opts _; do case ",$opts," in *,ro,*) ro="$ro -o -path $mnt";; esac; done < /proc/mounts
                     find "$HOME" /tmp /run /etc \( -path /nonexistent $ro \) -prune -o -type f -print 2>/dev/null |
                         xargs grep -ls "$pattern" /proc/[0-9]*/environ "$@" 2>/dev/null
                 }"#;

const DIAGNOSE: &str = r#": > "$ws.started"
diagnose() {
  for s in "${STOCKADE_DATA_DIR:-$HOME/.local/share/stockade}"/sessions/*/; do
    [ "$s/run.json" -nt "$ws.started" ] || continue
    grep -q '"status": 125' "$s/run.json" 2>/dev/null || continue
    echo "=== failed session $s" >&2
    echo "--- vmm.log" >&2; cat "$s/vmm.log" >&2
    echo "--- kernel.log (tail)" >&2; tail -n 15 "$s/kernel.log" >&2
  done
  echo "--- L1 dmesg (tail)" >&2; dmesg | tail -n 8 >&2
  echo "--- L1 memory and /tmp" >&2; free -m >&2; df -h /tmp >&2
  cd /; rm -rf "$ws" "$ws".*
}
trap diagnose EXIT"#;

#[test]
fn exit_statuses_are_the_commands_own() {
    let Some(rig) = rig::require("exit_statuses_are_the_commands_own") else { return };
    let out = rig.sh(
        &script(
            "printf '#!/bin/sh\\n' > notexec.sh; chmod 644 notexec.sh
             $S run -- true; echo \"true=$?\"
             $S run -- false; echo \"false=$?\"
             $S run -- sh -c 'exit 7'; echo \"seven=$?\"
             $S run -- ./notexec.sh; echo \"notexec=$?\"
             $S run -- no-such-command-xyz; echo \"notfound=$?\"
             $S run -- sh -c 'kill -INT $$'; echo \"sigint=$?\"
             $S run --cpus 2 -- nproc | sed 's/^/nproc=/'",
        ),
        T,
    );
    for expected in ["true=0", "false=1", "seven=7", "notexec=126", "notfound=127", "sigint=130", "nproc=2"] {
        assert!(out.stdout.contains(expected), "missing {expected}\n{out}");
    }
    assert!(out.stderr.contains("no-such-command-xyz: command not found"), "{out}");
    assert!(out.stderr.contains("notexec.sh: permission denied"), "{out}");
}

#[test]
fn stdout_and_stderr_stay_separate_and_stdin_reaches_the_command() {
    let Some(rig) = rig::require("stdout_and_stderr_stay_separate") else { return };
    let out = rig.sh(
        &script(
            "$S run -- sh -c 'echo to-out; echo to-err >&2' >out.txt 2>err.txt
             echo \"out=$(cat out.txt) err=$(cat err.txt)\"
             echo hi | $S run -- cat > cat.txt; echo \"cat=$(cat cat.txt) status=$?\"
             $S run -- cat < /dev/null; echo \"eof=$?\"",
        ),
        T,
    );
    assert!(out.stdout.contains("out=to-out err=to-err"), "{out}");
    assert!(out.stdout.contains("cat=hi status=0"), "{out}");
    assert!(out.stdout.contains("eof=0"), "{out}");
}

#[test]
fn hundred_megabytes_of_output_arrive_intact() {
    let Some(rig) = rig::require("hundred_megabytes_of_output_arrive_intact") else { return };
    let out = rig.sh(
        &script(
            "gen='i=0; while [ $i -lt 20 ]; do i=$((i+1)); echo line-$i; done; yes 0123456789abcdef | head -c 100000000'
             want=$(sh -c \"$gen\" | sha256sum | cut -c1-64)
             got=$($S run -- sh -c \"$gen\" | sha256sum | cut -c1-64)
             echo \"want=$want\"; echo \"got=$got\"",
        ),
        T,
    );
    let line = |p: &str| out.stdout.lines().find(|l| l.starts_with(p)).map(|l| l[p.len()..].to_string());
    assert!(line("want=").is_some(), "{out}");
    assert_eq!(line("want="), line("got="), "{out}");
}

#[test]
fn workspace_is_visible_writes_are_staged_and_home_is_not() {
    let Some(rig) = rig::require("workspace_is_visible_writes_are_staged_and_home_is_not") else { return };
    let out = rig.sh(
        &script(
            "git init -q; echo workspace-content > file.txt; mkdir -p sub; touch \"$HOME/host-secret\"
             cd sub
             $S run -- cat \"$ws/file.txt\"; echo \"read=$?\"
             $S run -- sh -c \"echo x > $ws/new.txt\"; echo \"write=$?\"
             test -e \"$ws/new.txt\" && echo leaked || echo not-leaked
             $S run -- sh -c 'pwd; ls -A \"$HOME\" | grep -c host-secret'
             $S run --no-home-tools -- sh -c 'ls -A \"$HOME\" | wc -l; echo listed'
             $S run -- uname -r",
        ),
        T,
    );
    assert!(out.stdout.contains("workspace-content\nread=0"), "{out}");
    assert!(out.stdout.contains("write=0"), "the guest writes to its copy-on-write workspace\n{out}");
    assert!(out.stdout.contains("not-leaked"), "a guest write reached the host before review\n{out}");
    assert!(out.stderr.contains("staged"), "the run must say its changes are staged\n{out}");
    assert!(out.stdout.contains("/sub\n0\n"), "cwd must follow and the host's home files stay out\n{out}");
    assert!(out.stdout.contains("\n0\nlisted"), "without home toolchains $HOME is empty\n{out}");
    assert!(out.stdout.contains("6.12."), "uname -r must show the guest kernel\n{out}");
}

#[test]
fn interrupt_reaches_the_command_and_a_second_stops_the_vm() {
    let Some(rig) = rig::require("interrupt_reaches_the_command") else { return };
    let out = rig.sh(
        &script(
            "wait_for() { i=0; until grep -q started \"$1\" 2>/dev/null; do i=$((i+1)); [ $i -gt 1200 ] && return 1; sleep 0.1; done; }
             $S run -- sh -c 'echo started; exec sleep 100' > a.txt & pid=$!
             wait_for a.txt; kill -INT $pid; wait $pid; echo \"first=$?\"
             $S run -- sh -c 'trap \"\" INT; echo started; sleep 100' > b.txt & pid=$!
             wait_for b.txt; kill -INT $pid; sleep 1; kill -INT $pid; wait $pid; echo \"second=$?\"",
        ),
        T,
    );
    assert!(out.stdout.contains("first=130"), "{out}");
    assert!(out.stdout.contains("second=130"), "{out}");
    assert!(out.stderr.contains("stopping the VM"), "{out}");
}

#[test]
fn guest_kernel_panic_gives_125_and_names_the_log() {
    let Some(rig) = rig::require("guest_kernel_panic_gives_125_and_names_the_log") else { return };
    let out = rig.sh(&script("$S run --kernel-arg init=/nonexistent -- true; echo \"panic=$?\""), T);
    assert!(out.stdout.contains("panic=125"), "{out}");
    assert!(out.stderr.contains("panicked"), "{out}");
    assert!(out.stderr.contains("kernel.log"), "{out}");
}

#[test]
fn unusable_kvm_is_refused_with_the_fix() {
    let Some(rig) = rig::require("unusable_kvm_is_refused_with_the_fix") else { return };
    let out =
        rig.sh(&script("setpriv --reuid=65534 --regid=65534 --clear-groups $S run -- true; echo \"status=$?\""), T);
    assert!(out.stdout.contains("status=125"), "{out}");
    assert!(out.stderr.contains("usermod -aG kvm"), "{out}");
}
