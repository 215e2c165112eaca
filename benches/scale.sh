#!/usr/bin/env bash
# Per-entry cost of big change sets (issue #17): for each shape, the set is
# generated once, then staged and applied, each step in a process of its
# own, with its wall time and peak resident memory (`/usr/bin/time -v`).
#   million  1,000,000 entries (1,000 directories of 999 files)
#   long     1,000,000 entries of 4 KiB paths (refused at the metadata cap)
#   deep     200,000 files in a chain of 1,500 directories
#   worst    61,000 files 2,040 levels deep: 4 KiB paths up to the cap
# With NO_CAP=1 the metadata cap is lifted, to show the cost beyond it.
# Runs in DIR (default: /dev/shm, so that the disk does not dominate).
#   benches/scale.sh [DIR] [SHAPE...]
# On a shared 2-core VM (load 4-6), release build, /dev/shm:
#   million  stage 1.3 s, 174 MiB; apply (1,000,000 files) 35 s, 435 MiB
#   long     refused after 65,552 entries: 1.3 s, 270 MiB
#   deep     refused after 189,791 entries: 1.4 s, 287 MiB
#            (NO_CAP=1: stage 7.6 s, 323 MiB; apply 45 s, 945 MiB)
#   worst    stage 2.4 s, 257 MiB; apply 26 s, 764 MiB
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-/dev/shm}
shift || true
shapes=("$@")
[[ ${#shapes[@]} -gt 0 ]] || shapes=(million long deep worst)
cd "$here"
nice cargo test --release --bin stockade --no-run >/dev/null 2>&1
exe=$(cargo test --release --bin stockade --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
printf '%-8s %-9s %9s %10s  %s\n' shape step "time" "max RSS" outcome
for shape in "${shapes[@]}"; do
    for step in generate stage apply; do
        nocap=()
        [[ -z "${NO_CAP:-}" ]] || nocap=(STOCKADE_BENCH_NO_CAP=1)
        out=$(env "${nocap[@]}" STOCKADE_BENCH_DIR="$dir" STOCKADE_BENCH_SHAPE="$shape" STOCKADE_BENCH_STEP="$step" \
            /usr/bin/time -v "$exe" changes_bench::scale --ignored --nocapture --exact --test-threads=1 2>&1)
        result=$(grep '^RESULT' <<<"$out" | head -1)
        rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' <<<"$out")
        secs=$(grep -o ' s=[^ ]*' <<<"$result" | cut -d= -f2)
        printf '%-8s %-9s %7s s %6s MiB  %s\n' "$shape" "$step" "$secs" "$((rss / 1024))" \
            "$(sed 's/.*peak_mib=[^ ]* //' <<<"$result" | cut -c1-110)"
    done
    rm -rf "$dir/stockade-scale-$shape"
done
