#!/usr/bin/env bash
# The workspace's files in the guest against the same files on the host: a
# git repository of DIRS directories of 50 small files and one big file, its
# index committed on the host, and for each row (git status first and second
# in a run, find, stat of every file, cat of every file, grep -r, reading the
# big file, writing 5,000 small files and one 128 MiB file) the host's time,
# the guest's time (timed inside the guest of one `stockade run`) and their
# ratio, next to a CPU-only control (sha256 of 64 MiB in tmpfs) that shows
# how much of a ratio is just the guest's CPU, and the guest's time for the
# same row on a copy of the workspace in its own tmpfs, which shows how much
# is the nested machine's memory and system calls rather than the shared
# files (the rig's software CPU slows those more than it slows hashing).
# The guest drops its caches before each row but the second git status, so
# each row starts as the first touch of those files in a run does. Then the
# first git status in a repository of MANY files.
#
# p50 and p90 over RUNS runs (one `stockade run` each). Runs where a
# standard guest boots: here on hardware KVM, or in the rig:
#   benches/workspace_files.sh [--small] [--no-count] [RUNS]          # here
#   benches/workspace_files.sh --rig [--small] [--no-count] [RUNS]    # in a rig L1
# --small: 40 directories, a 32 MiB big file and 10,000 files for the last
# row, instead of 400, 192 MiB and 100,000. --no-count: no request counts;
# --no-many: not the last row.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${STOCKADE_BIN:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
kernel=${STOCKADE_KERNEL:-$("$here/guest-kernel/build.sh" 2>/dev/null | tail -n1)}
if [[ "${1:-}" == --rig ]]; then
    shift
    exec "$here/tests/rig/run-in-l1.sh" env STOCKADE_BENCH_OWN_TMPFS=1 STOCKADE_BIN="$bin" STOCKADE_KERNEL="$kernel" \
        "$here/benches/workspace_files.sh" "$@"
fi
dirs=400 big_mib=192 many=100000 count=1
while [[ "${1:-}" == --* ]]; do
    case $1 in
        --small) dirs=40 big_mib=32 many=10000 ;;
        --no-count) count=0 ;;
        --no-many) many=0 ;;
        *) echo "usage: $0 [--rig] [--small] [--no-count] [--no-many] [RUNS]" >&2; exit 2 ;;
    esac
    shift
done
runs=${1:-3}
# Seconds a row waits after the guest drops its caches (see `t` below): in
# the rig a FORGET costs the file server about half a millisecond.
export BENCH_SETTLE=${BENCH_SETTLE:-$((1 + dirs / 20))}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# L1's root is an overlay; the workspaces get a tmpfs of their own, as a
# host's would sit in its page cache.
if [[ -n "${STOCKADE_BENCH_OWN_TMPFS:-}" ]]; then
    mount -t tmpfs -o nr_inodes=1000000,size=2g bench "$work"
    trap 'umount "$work"; rm -rf "$work"' EXIT
fi
# As on a desktop session (hard limit 524,288), where the issue measured: the
# file server holds a descriptor per inode the guest keeps. Raising the hard
# limit needs root; elsewhere the soft limit goes as high as it may.
ulimit -Hn 524288 2>/dev/null || true
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true
export STOCKADE_DATA_DIR="$work/data"
cp "$bin" "$work/stockade"
run=("$work/stockade" run --cpus 1 --memory 1G --kernel "$kernel" --apply none)

# A committed repository of `dirs` directories of 50 files of 1 to 3 KiB and,
# with a size in MiB, one big file. Git identity comes from the command line.
make_repo() {
    local dir=$1 ndirs=$2 mib=$3
    mkdir -p "$dir"
    python3 - "$dir" "$ndirs" <<'PY'
import os, sys
root, ndirs = sys.argv[1], int(sys.argv[2])
for i in range(ndirs):
    d = os.path.join(root, "d%03d" % i)
    os.makedirs(d)
    for j in range(50):
        line = "line %d of file %d in directory %d: some text a build would read\n" % (0, j, i)
        with open(os.path.join(d, "f%02d.txt" % j), "w") as f:
            f.write(line * (16 + (i * 50 + j) % 32))
PY
    ((mib)) && head -c "${mib}M" /dev/urandom >"$dir/big.bin"
    git -C "$dir" init -q
    # No automatic gc: past 6,700 loose objects a commit packs them in the
    # background, and the tree would change under the rows.
    git -C "$dir" config gc.auto 0
    git -C "$dir" add -A
    git -C "$dir" -c user.email=b@example.com -c user.name=b commit -qm init
    # What a host's own git status does once: the index written again after
    # the files, so no entry is racily clean.
    sleep 1
    git -C "$dir" status --porcelain >/dev/null
}

# The rows, run in the workspace by bash on the host and in the guest alike;
# each prints "T<tab>row<tab>seconds". Only the guest drops its caches
# (BENCH_DROP): the host's workspace sits in its page cache.
rows=$(
    cat <<'ROWS'
set -u
shm=/dev/shm/stockade-bench; mkdir -p "$shm"
# A row run with DROP=1 starts with the guest's caches dropped. The guest
# forgets every file it dropped, one FORGET request each, sent after the
# drop returns: the row waits until the file server has heard them all, or
# they would be served during the row.
t() {
    local name=$1; shift
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    if [ -n "${BENCH_DROP:-}" ] && [ -n "${DROP:-}" ]; then
        { sync; echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || true
        sleep "${BENCH_SETTLE:-3}"
    fi
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || true
    end=$(date +%s.%N)
    printf '%s\t%s\t%s\n' "${TAG:-T}" "$name" "$(echo "$end - $start" | bc)"
}
head -c 64M /dev/zero >"$shm/control"
t "sha256 of 64 MiB in tmpfs (control)" sha256sum "$shm/control"
rm -f "$shm/control"
t "git status, first in the run" git status --porcelain
t "git status, second in the run" git status --porcelain
DROP=1 t "find of every file" find . -type f
DROP=1 t "stat of every file (os.walk + stat)" /usr/bin/python3 -c '
import os
for d, _, fs in os.walk("."):
    for f in fs: os.lstat(os.path.join(d, f))'
DROP=1 t "cat of every small file" sh -c 'cat d*/*'
DROP=1 t "grep -r of the small files" grep -r needle-not-there d*
if [ -f big.bin ]; then DROP=1 t "read the big file" cat big.bin; fi
DROP=1 t "write 5,000 small files" bash -c 'mkdir w; for i in $(seq 5000); do echo "$i" >w/f$i; done'
rm -rf w
t "write one 128 MiB file" sh -c 'head -c 128M /dev/zero >out.bin'
rm -f out.bin
ROWS
)

declare -A host guest copy
order=()
# Lines tagged T are the side's own; C, the guest's rows on its tmpfs copy.
record() {
    local side=$1 name secs
    while IFS=$'\t' read -r tag name secs; do
        [[ $tag == T || $tag == C ]] || continue
        [[ -v "host[$name]" || -v "guest[$name]" ]] || order+=("$name")
        if [[ $side == host ]]; then
            host[$name]+="$secs "
        elif [[ $tag == C ]]; then
            copy[$name]+="$secs "
        else
            guest[$name]+="$secs "
        fi
    done
}
# The same rows on a copy of the workspace in the guest's tmpfs, its index
# refreshed there first: the guest's own cost of the work (its CPU, memory
# and system calls in the nested machine) without the file server, against
# which the workspace's rows show what the shared files alone cost. The
# big file stays out: the guest's tmpfs (half its memory) does not hold it
# beside 20,000 small files and their objects.
in_copy='mkdir /dev/shm/ws-copy && cp -a $(ls -A | grep -vx big.bin) /dev/shm/ws-copy/ && cd /dev/shm/ws-copy &&
    git status --porcelain >/dev/null 2>&1 && TAG=C bash -c "$ROWS"'

# p50 and p90 of a list of numbers.
pct() {
    local sorted n
    sorted=$(printf '%s\n' $1 | sort -n)
    n=$(echo "$sorted" | wc -l)
    echo "$(echo "$sorted" | awk -v n="$n" 'NR == int((n + 1) / 2)') $(echo "$sorted" | awk -v n="$n" 'NR == int((n * 9 + 9) / 10)')"
}

ws=$work/ws
echo "creating a repository of $((dirs * 50)) files and a ${big_mib} MiB file" >&2
make_repo "$ws" "$dirs" "$big_mib"
for i in $(seq "$runs"); do
    echo "round $i of $runs" >&2
    record host < <(cd "$ws" && bash -c "$rows")
    record guest < <(cd "$ws" && "${run[@]}" -- env BENCH_DROP=1 BENCH_SETTLE="$BENCH_SETTLE" ROWS="$rows" bash -c "$rows; $in_copy")
done

# ratio: guest ÷ host; /control: that ÷ the control's; tmpfs: the row on
# the guest's tmpfs copy; /tmpfs: the guest's time ÷ that, what the shared
# files cost over the same work on files of the guest's own.
printf '\n%-40s %14s %14s %8s %10s %8s %8s\n' "work ($((dirs * 50)) files, $runs runs)" "host p50/p90" "guest p50/p90" \
    "ratio" "/control" "tmpfs" "/tmpfs"
control=
for name in "${order[@]}"; do
    read -r h50 h90 <<<"$(pct "${host[$name]:-}")"
    read -r g50 g90 <<<"$(pct "${guest[$name]:-}")"
    read -r c50 _ <<<"$(pct "${copy[$name]:-}")"
    ratio=$(echo "$g50 / $h50" | bc -l)
    [[ -n $control ]] || control=$ratio
    if [[ -n $c50 ]]; then by_copy=$(printf '%7.2fx' "$(echo "$g50 / $c50" | bc -l)"); else c50=0 by_copy='     -'; fi
    printf '%-40s %6.2f/%6.2f %6.2f/%6.2f %7.2fx %9.2fx %8.2f %8s\n' "$name" "$h50" "$h90" "$g50" "$g90" "$ratio" \
        "$(echo "$ratio / $control" | bc -l)" "$c50" "$by_copy"
done

# What each row costs the workspace's file server: requests by opcode and
# guest notifications (each a round trip, at least one VM exit), counted by
# the VMM, one fresh run per row less a run that runs no row. The second git
# status is left out: alone in a run it would be the first. Forget and
# BatchForget come from the guest's cache drop before the row (the row
# waits for them to be served; nothing waits for their answer). Beside them, the row's time in that run and the
# seconds the server spent serving it (busy): the host's own filesystem
# work, at host speed. What is left of the row's time over its tmpfs time
# and busy is the trips themselves, shown per notification (trip ms): the
# part a hardware host shrinks to tens of microseconds.
fs_counts() {
    local log
    log=$(ls -td "$STOCKADE_DATA_DIR"/sessions/*/ | head -n1)vmm.log
    grep -a 'virtio-fs "host" requests:' "$log" | tail -n1 | sed 's/.*requests: //'
}
count_run() {
    # The file server writes its totals once the guest has been quiet for
    # a moment: the run waits for that before it ends.
    local secs
    secs=$(cd "$ws" && RUST_LOG=stockade::vmm::devices::virtio::fs=info "${run[@]}" -- env BENCH_DROP=1 BENCH_SETTLE="$BENCH_SETTLE" ONLY="$1" \
        bash -c "$rows; sleep 1" 2>/dev/null | awk -F'\t' '$1 == "T" { print $3 }') || true
    sleep 1
    echo "secs=${secs:-0} $(fs_counts)"
}
if ((count)); then
    echo "counting requests" >&2
    base=$(count_run none)
    printf '\n%-40s %s\n' "requests (less a bare run)" \
        "secs busy_s trip_ms total notifications Lookup Getattr Open Release Opendir Releasedir Read Readdir Readdirplus Flush Getxattr Statfs Forget BatchForget"
fi
field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2 + 0; f = 1 } END { if (!f) print 0 }'; }
for name in "${order[@]}"; do
    ((count)) || break
    [[ $name == *second* ]] && continue
    got=$(count_run "$name")
    secs=$(field "$got" secs)
    busy=$(echo "($(field "$got" busy_us) - $(field "$base" busy_us)) / 1000000" | bc -l)
    notes=$(($(field "$got" notifications) - $(field "$base" notifications)))
    read -r c50 _ <<<"$(pct "${copy[$name]:-0}")"
    trip=$(echo "t = ($secs - $c50 - $busy) * 1000 / ($notes + 1); if (t < 0) t = 0; t" | bc -l)
    line=$(printf ' %5.2f %6.2f %7.2f' "$secs" "$busy" "$trip")
    for k in total notifications Lookup Getattr Open Release Opendir Releasedir Read Readdir Readdirplus Flush Getxattr Statfs Forget BatchForget; do
        line+=" $(($(field "$got" "$k") - $(field "$base" "$k")))"
    done
    printf '%-40s%s\n' "$name" "$line"
done

# The first git status in a bigger repository, once.
((many)) || exit 0
many_ws=$work/many
echo "creating a repository of $many files" >&2
make_repo "$many_ws" "$((many / 50))" 0
status='s=$(date +%s.%N); git status --porcelain >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc'
h=$(cd "$many_ws" && bash -c "$status")
g=$(cd "$many_ws" && "${run[@]}" -- bash -c "$status" | tail -n1)
printf '%-40s %14.2f %14.2f %7.2fx %9.2fx\n' "git status, first, $many files" "$h" "$g" \
    "$(echo "$g / $h" | bc -l)" "$(echo "$g / $h / $control" | bc -l)"
