#!/usr/bin/env bash
# Change pipeline benchmark: guest export of 10,000 files, staging them into
# a session store, applying them to an empty workspace, and a snapshot of
# 100,000 files; medians of RUNS runs, with the filesystem's own floor
# (temp + rename + syncfs of the same number of files) for comparison.
# Runs in each DIR given (default: $TMPDIR or /tmp); try /dev/shm to see the
# code without the disk.
#   benches/apply.sh [RUNS] [DIR...]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-5}
shift || true
dirs=("$@")
[[ ${#dirs[@]} -gt 0 ]] || dirs=("${TMPDIR:-/tmp}")
cd "$here"
nice cargo test --release --bin stockade --no-run >/dev/null 2>&1
for dir in "${dirs[@]}"; do
    echo "== $dir ($(stat -f -c %T "$dir"))"
    STOCKADE_BENCH_DIR=$dir STOCKADE_BENCH_RUNS=$runs nice cargo test --release --bin stockade changes_bench:: \
        -- --ignored --nocapture --test-threads=1 2>/dev/null | grep -vE '^(running|test |$)|test result'
done
