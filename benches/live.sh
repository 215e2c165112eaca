#!/usr/bin/env bash
# What a checkpoint of a running session costs: the wall time of
# `stockade diff --stat` (ask the supervisor, the guest freezes its scratch
# filesystem and exports, the host stages and summarises) on a session that
# has written 10,000 files, then one that has written a 1 GiB file; then
# what a recovery costs: the wall time of `stockade recover` of a session
# killed (SIGKILL) after it wrote a 1 GiB file, a new session each run. The
# guest's writers are paused for the export part of it (the filesystem is
# frozen while the overlay is walked and sent): a probe in the guest appends
# a timestamp to a workspace file every 50 ms meanwhile, and its longest gap
# is printed (`writers paused`) beside its median gap (the probe's own pace).
#
# Runs where a standard guest boots: here on hardware KVM, or in the rig:
#   benches/live.sh [RUNS]          # here (needs hardware KVM)
#   benches/live.sh --rig [RUNS]    # inside a fresh rig L1
# LIVE_BENCH=files|file|recover (or several, comma-separated) picks the
# measurements; all by default. Each prints its runs, then p50 and p90.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ "${1:-}" == --rig ]]; then
    shift
    exec "$here/tests/rig/run-in-l1.sh" env LIVE_BENCH_IN_RIG=1 ${LIVE_BENCH:+LIVE_BENCH="$LIVE_BENCH"} ${STOCKADE_BIN:+STOCKADE_BIN="$STOCKADE_BIN"} \
        ${STOCKADE_KERNEL:+STOCKADE_KERNEL="$STOCKADE_KERNEL"} "$here/benches/live.sh" "$@"
fi
runs=${1:-3}
only=${LIVE_BENCH:-files,file,recover}
bin=${STOCKADE_BIN:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
kernel=${STOCKADE_KERNEL:-$("$here/guest-kernel/build.sh" 2>/dev/null | tail -n1)}
memory=2G
if [[ -n "${LIVE_BENCH_IN_RIG:-}" ]]; then
    # The rig's /tmp is a tmpfs of half its 4 GiB: it holds the scratch disk
    # and the staged checkpoint, 1 GiB each; a smaller guest leaves memory.
    mount -o remount,size=3G /tmp
    memory=1G
fi
work=$(mktemp -d)
trap 'exec 3>&- 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
export STOCKADE_DATA_DIR="$work/data"
# The recovery VM's memory is the config's (a run's is its flag).
# Settings already in force (the rig's one vCPU) are kept.
config="$work/config"
mkdir -p "$config"
{
    grep -v '^memory' "${STOCKADE_CONFIG_DIR:-/nonexistent}/config.toml" 2>/dev/null
    echo "memory = \"$memory\""
} >"$config/config.toml"
export STOCKADE_CONFIG_DIR="$config"
cp "$bin" "$work/stockade"
bin=$work/stockade

# percentiles NAME WHAT < seconds, one a line: prints p50 and p90 (nearest rank).
percentiles() {
    sort -n | awk -v name="$1" -v what="$2" '{ v[NR] = $1 }
        END { if (NR == 0) exit; i50 = int(NR * 0.5 + 0.999); i90 = int(NR * 0.9 + 0.999)
              printf "%-22s %s: p50 %.2f s, p90 %.2f s over %d runs\n", name, what, v[i50], v[i90], NR }'
}

# measure NAME GUEST-SCRIPT: runs GUEST-SCRIPT in a session that then waits
# on its stdin, times `diff --stat` RUNS times, and lets the session end.
measure() {
    local name=$1 body=$2 ws="$work/ws-$1"
    mkdir -p "$ws" && cd "$ws"
    mkfifo ctl
    local probe='while :; do date +%s%N >> .probe; sleep 0.05; done'
    local gaps="awk 'NR > 1 { print (\$1 - p) / 1e6 } { p = \$1 }' .probe | sort -n | awk '{ g[NR] = \$1 }
        END { printf \"writers paused: longest gap %.0f ms (median gap %.0f ms)\\n\", g[NR], g[int((NR + 1) / 2)] }'"
    "$bin" run --cpus 1 --memory "$memory" --disk 4G --kernel "$kernel" --apply none -- \
        sh -c "$body; ($probe) & p=\$!; echo written; read go; kill \$p; $gaps" <ctl >guest.out 2>guest.err &
    exec 3>ctl
    for _ in $(seq 3000); do grep -q written guest.out 2>/dev/null && break; sleep 0.2; done
    for i in $(seq "$runs"); do
        local start end
        start=$(date +%s.%N)
        "$bin" diff --stat >"diff.$i" 2>&1 || { cat "diff.$i" >&2; exit 1; }
        end=$(date +%s.%N)
        awk -v a="$start" -v b="$end" 'BEGIN { print b - a }' >>times
        printf '%-22s run %d: diff --stat %6.2f s  (%s)\n' "$name" "$i" "$(tail -n1 times)" \
            "$(grep -m1 -o '[0-9,]* staged change[s]*' "diff.$i" || echo '?')"
    done
    percentiles "$name" "diff --stat" <times
    echo go >&3
    exec 3>&-
    wait
    printf '%-22s %s\n' "$name" "$(grep -m1 'writers paused' guest.out || echo 'writers paused: ?')"
    cd "$work"
}

# recovery NAME GUEST-SCRIPT: RUNS times, a session runs GUEST-SCRIPT,
# flushes it to its scratch disk and is killed with its supervisor; times
# `stockade recover`, checks the staged change names big.bin, discards it.
# Beside each, in the same boot, two controls: a bare `stockade run -- true`
# (the boot and end a recovery also pays) and copying a file of the same
# size on this host (`cp` and `sync`, what staging it costs at least).
recovery() {
    local name=$1 body=$2 ws="$work/ws-$1" failed=0 rebooted=0
    mkdir -p "$ws" && cd "$ws"
    for i in $(seq "$runs"); do
        local t0 t1 t2 t3
        t0=$(date +%s.%N)
        "$bin" run --cpus 1 --memory "$memory" --kernel "$kernel" --apply none -- true >/dev/null 2>&1
        t1=$(date +%s.%N)
        # Made and removed each run: the rig's tmpfs holds the scratch disk
        # and the staged copy as well.
        head -c 1073741824 /dev/urandom >"$work/control.bin"
        t2=$(date +%s.%N)
        cp "$work/control.bin" "$work/control.copy" || { df -h "$work"; du -sh "$STOCKADE_DATA_DIR"/sessions/*/* | sort -h | tail -n 8; exit 1; } >&2
        sync
        t3=$(date +%s.%N)
        rm -f "$work/control.copy" "$work/control.bin"
        awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }' >>bare
        awk -v a="$t2" -v b="$t3" 'BEGIN { print b - a }' >>copy
        "$bin" run --cpus 1 --memory "$memory" --disk 4G --kernel "$kernel" --apply none -- \
            sh -c "$body; sync; echo written; exec sleep 100000" >guest.out 2>guest.err &
        local pid=$! start end
        for _ in $(seq 3000); do grep -q written guest.out 2>/dev/null && break; sleep 0.2; done
        kill -9 "$pid"; wait "$pid" 2>/dev/null || true
        start=$(date +%s.%N)
        if ! "$bin" recover --kernel "$kernel" >"recover.$i" 2>&1; then
            local dir
            dir=$(ls -td "$STOCKADE_DATA_DIR"/sessions/*/ | head -n1)
            echo "$name run $i: recovery failed: $(grep -v 'so far' "recover.$i" | tail -n1)" >&2
            tail -n 5 "$dir"recover-vmm.log "$dir"recover-kernel.log >&2
            free -m >&2
            df -h "$work" >&2
            failed=$((failed + 1))
            # Timed from the second try: the disk stays for it.
            start=$(date +%s.%N)
            "$bin" recover --kernel "$kernel" >"recover.$i" 2>&1 || { grep -v 'so far' "recover.$i" >&2; exit 1; }
        fi
        end=$(date +%s.%N)
        # A recovery VM that dies on its way up is booted again by
        # `recover` itself; its time is in the measurement.
        if grep -q 'trying again' "recover.$i"; then
            rebooted=$((rebooted + 1))
            grep 'trying again' "recover.$i" >&2
        fi
        "$bin" diff --stat 2>&1 | grep -q big.bin || { echo "recovery $i staged no big.bin" >&2; exit 1; }
        "$bin" discard >/dev/null 2>&1 || true
        awk -v a="$start" -v b="$end" 'BEGIN { print b - a }' >>times
        printf '%-22s run %d: recover %6.2f s (bare run %.2f s, host copy %.2f s)\n' "$name" "$i" \
            "$(tail -n1 times)" "$(tail -n1 bare)" "$(tail -n1 copy)"
    done
    percentiles "$name" "recover" <times
    printf '%-22s recoveries whose VM recover booted twice: %d of %d\n' "$name" "$rebooted" "$runs"
    printf '%-22s recover commands that failed (then run again): %d of %d\n' "$name" "$failed" "$runs"
    percentiles "$name" "bare run (control)" <bare
    percentiles "$name" "host copy (control)" <copy
    paste times bare copy | awk '{ r = ($1 - $2) / $3; print r }' | sort -n |
        awk -v name="$name" '{ v[NR] = $1 } END { printf "%-22s recover minus a bare run, over a host copy: p50 %.1fx, p90 %.1fx\n",
            name, v[int(NR * 0.5 + 0.999)], v[int(NR * 0.9 + 0.999)] }'
    cd "$work"
}

want() { [[ ",$only," == *",$1,"* ]]; }
if want files; then
    measure files-10000 'mkdir -p gen; i=0; while [ $i -lt 10000 ]; do echo $i > gen/f$i; i=$((i+1)); done'
fi
if want file; then
    measure file-1GiB 'head -c 1073741824 /dev/urandom > big.bin'
fi
if want recover; then
    recovery recover-1GiB 'head -c 1073741824 /dev/urandom > big.bin'
fi
