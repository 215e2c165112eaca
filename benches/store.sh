#!/usr/bin/env bash
# Session store benchmark: 300 runs' sessions made by the run's own code
# (session directory, run record, kernel log, what the guest saw, a third
# with an applied change set of 200 files, a few left staged), the store's
# size with and without retention, and what a prune costs: the first one,
# and the one at the start of every run when nothing is due.
# Runs in DIR (default: $TMPDIR or /tmp).
#   benches/store.sh [DIR]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-${TMPDIR:-/tmp}}
cd "$here"
nice cargo test --release --bin stockade --no-run >/dev/null 2>&1
echo "== $dir ($(stat -f -c %T "$dir"))"
STOCKADE_BENCH_DIR=$dir nice cargo test --release --bin stockade session::retention::tests::bench_ \
    -- --ignored --nocapture --test-threads=1 2>/dev/null | grep -vE '^(running|test |ok$|$)|test result'
