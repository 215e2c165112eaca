#!/usr/bin/env bash
# Per-run cost of a small change in a big workspace (issue #22): a 10-file
# change exported against a workspace of 1,000,000 files (900,000 in an
# ignored node_modules/, 100,000 committed), then, each in a fresh process,
#   summary  the review's summary (`stockade diff`): classification, line
#            counts, conflict check;
#   review   summary and apply (`stockade run --apply all`);
#   apply    `stockade apply`;
# printing the median wall time and the largest peak resident memory of
# RUNS runs; first, for comparison, what the review does not do (git over
# the workspace) and what a removed directory's tree digest costs.
#   benches/review.sh [RUNS] [WORKSPACE]
# The workspace (default: $TMPDIR/stockade-bigws, about 4 GiB) is created
# once and reused; each run applies a different change to it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-5}
ws=${2:-${TMPDIR:-/tmp}/stockade-bigws}
cd "$here"
nice cargo test --release --bin stockade --no-run >/dev/null 2>&1
bench() {
    nice cargo test --release --bin stockade "changes_bench::$1" -- --ignored --nocapture --exact --test-threads=1 2>/dev/null |
        grep -vE '^(running|test |$)|test result'
}
export STOCKADE_BENCH_WORKSPACE=$ws

echo "== for comparison, in $ws"
bench review_big_workspace_context

echo
echo "== a 10-file change in $ws, median of $runs runs"
printf '%-8s %10s %12s  %s\n' mode "time" "peak RSS" "workspace work (last run)"
for mode in summary review apply; do
    results=()
    for _ in $(seq "$runs"); do
        results+=("$(STOCKADE_BENCH_MODE=$mode bench review_big_workspace | grep '^RESULT')")
    done
    field() { printf '%s\n' "${results[@]}" | grep -o " $1=[^ ]*" | cut -d= -f2 | sort -n; }
    mapfile -t ms < <(field ms)
    peak=$(field peak_kib | tail -1)
    work=$(printf '%s\n' "${results[-1]}" | sed 's/.*work="\([^"]*\)".*/\1/')
    printf '%-8s %8s ms %8s MiB  %s\n' "$mode" "${ms[$(((${#ms[@]} - 1) / 2))]}" \
        "$(awk -v k="$peak" 'BEGIN { printf "%.1f", k / 1024 }')" "$work"
done
