#!/bin/sh
# The rig's agent in L1, running from this machine's own userland. It reads
# "run <id>" lines on ttyS1, runs /rig/jobs/<id>/cmd.sh with its output in
# files beside it, and answers "done <id> <status>". Jobs run in the
# background, so a diagnostic job can look at a stuck one.
export PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb
ln -sf /proc/self/fd /dev/fd 2>/dev/null
# Guests get one vCPU unless a test asks for more (--cpus 2). A two-vCPU
# guest on L1's two software CPUs leaves nothing for the supervisor, proxy
# and this agent; with them the suite lost L1 (soft lockups, stack-guard
# faults in L1's nested SVM code) about once per run.
mkdir -p /run/rig-config
echo 'cpus = 1' >/run/rig-config/config.toml
export STOCKADE_CONFIG_DIR=/run/rig-config
hostname rig-l1 2>/dev/null
exec 3<>/dev/ttyS1
echo "rig-ready $(uname -r)" >&3
# A heartbeat, so the harness can tell a stuck L1 (nested SVM on the software
# CPU occasionally soft-locks) from a slow script within seconds.
(while sleep 5; do echo alive >&3; done) &
while IFS= read -r line <&3; do
    set -- $line
    case "$1" in
    run)
        job=/rig/jobs/$2
        (
            (cd "$job" && exec /bin/sh ./cmd.sh) </dev/null >"$job/stdout" 2>"$job/stderr"
            echo "done $2 $?" >&3
        ) &
        ;;
    esac
done
