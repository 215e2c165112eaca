#!/usr/bin/env bash
# What a run costs in a big workspace: p50/p90 of `stockade run -- true` in
# an empty workspace and in workspaces of 100,000 and 1,000,000 files (as
# ratios to the empty one, all in one boot), then a 10-file change in the
# 1,000,000-file workspace reviewed (`diff --stat`) and applied, with time and
# peak memory, and the size of what the run recorded of the workspace.
#
# Runs where a standard guest boots: here on hardware KVM, or in the rig:
#   benches/workspace.sh [RUNS]          # here (needs hardware KVM)
#   benches/workspace.sh --rig [RUNS]    # inside a fresh rig L1
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ "${1:-}" == --rig ]]; then
    shift
    exec "$here/tests/rig/run-in-l1.sh" env STOCKADE_BENCH_OWN_TMPFS=1 "$here/benches/workspace.sh" "$@"
fi
runs=${1:-5}
bin=${STOCKADE_BIN:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
kernel=${STOCKADE_KERNEL:-$("$here/guest-kernel/build.sh" 2>/dev/null | tail -n1)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# L1's /tmp holds 500,000 inodes; a million files need a tmpfs of their own.
if [[ -n "${STOCKADE_BENCH_OWN_TMPFS:-}" ]]; then
    mount -t tmpfs -o nr_inodes=3000000,size=3g bench "$work"
    trap 'umount "$work"; rm -rf "$work"' EXIT
fi
export STOCKADE_DATA_DIR="$work/data"
cp "$bin" "$work/stockade"
bin=$work/stockade
run=("$bin" run --cpus 1 --memory 1G --kernel "$kernel" --apply none)

# A git repository with `files` empty files under an ignored node_modules/
# (1,000 per directory) and a few tracked sources.
make_workspace() {
    local dir=$1 files=$2
    mkdir -p "$dir/src"
    git -C "$dir" init -q
    echo node_modules/ >"$dir/.gitignore"
    for i in 1 2 3; do echo "source $i" >"$dir/src/s$i.txt"; done
    git -C "$dir" add -A && git -C "$dir" -c user.email=b@example.com -c user.name=b commit -qm init
    python3 - "$dir" "$files" <<'PY'
import os, sys
root, files = sys.argv[1], int(sys.argv[2])
for i in range(files // 1000):
    d = os.path.join(root, "node_modules", "pkg%d" % i)
    os.makedirs(d)
    for j in range(1000):
        os.close(os.open(os.path.join(d, "f%d.js" % j), os.O_CREAT | os.O_WRONLY, 0o644))
PY
}

. "$here/benches/timing.sh"
bench_timeout=600

names=()
for files in 0 100000 1000000; do
    echo "creating a workspace of $files files" >&2
    make_workspace "$work/ws$files" "$files"
    name="run -- true, $files files"
    names+=("$name")
    time_runs "$name" env -C "$work/ws$files" "${run[@]}" -- true
done

printf '\n%-40s %8s %8s %10s\n' "what ($runs runs)" "p50 s" "p90 s" "p50 ratio"
for name in "${names[@]}"; do
    printf '%-40s %8.3f %8.3f %10.3f\n' "$name" "${p50[$name]}" "${p90[$name]}" \
        "$(echo "${p50[$name]} / ${p50[${names[0]}]}" | bc -l)"
done

# A 10-file change in the 1,000,000-file workspace, reviewed and applied.
big=$work/ws1000000
(cd "$big" && "${run[@]}" -- sh -c 'for i in 0 1 2 3 4 5 6 7 8 9; do echo "change $i" > src/c$i.txt; done' \
    >/dev/null 2>&1)
seen=$(ls -d "$STOCKADE_DATA_DIR"/sessions/*/ | tail -n1)changes/seen
measure() {
    local what=$1; shift
    (cd "$big" && /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>&1) || true
    read -r secs kib <"$work/time"
    printf '%-40s %8.3f s %8.1f MiB\n' "$what" "$secs" "$(echo "$kib / 1024" | bc -l)"
}
echo
measure "diff --stat, 10 files in 1,000,000" "$bin" diff --stat
measure "apply, 10 files in 1,000,000" "$bin" apply
printf '%-40s %8d bytes\n' "recorded of the workspace (seen)" "$(stat -c %s "$seen")"
if command -v strace >/dev/null; then
    (cd "$big" && strace -f -qq -c -o "$work/strace" -e trace=%stat,getdents64 "${run[@]}" -- true >/dev/null 2>&1) || true
    printf '%-40s %8d calls\n' "stat + getdents, run -- true in 1,000,000" \
        "$(awk '$NF ~ /stat|getdents/ { n += $4 } END { print n + 0 }' "$work/strace")"
fi
