#!/usr/bin/env bash
# The package cache, cold against warm, in one run: `npm install` of express
# (about 65 packages) and `cargo fetch` of axum (about 53 crates), each in a
# fresh VM per round, with the cache emptied before each cold round and kept
# for each warm one. Prints p50/p90 wall time per row, the warm/cold ratio,
# and what the last round's proxy took from the registry and from the cache.
# Run in the rig, where absolute times are a software CPU's:
#   tests/rig/run-in-l1.sh benches/package_cache.sh [ROUNDS]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=${STOCKADE:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
rounds=${1:-3}
ws=$(mktemp -d /tmp/bench.XXXXXX)
# A cache of the benchmark's own (the guest kernel comes from STOCKADE_KERNEL).
export STOCKADE_CACHE=$ws/cache
cd "$ws"
mkdir npm crate crate/src
echo '{"name":"b","version":"1.0.0","dependencies":{"express":"4.21.2"}}' >npm/package.json
printf '[package]\nname = "b"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\naxum = "=0.7.9"\n' >crate/Cargo.toml
echo 'fn main() {}' >crate/src/main.rs

# APPLY is "all" for the untimed first runs (which write the lock files)
# and "none" for the timed ones, which then all install the same set.
APPLY=all
npm_install() {
    (cd npm && "$S" run --apply "$APPLY" --policy npm -- npm install --no-audit --no-fund --loglevel=error)
}
cargo_fetch() {
    (cd crate && "$S" run --apply "$APPLY" --policy cargo -- sh -c 'CARGO_HOME=/tmp/cargo-home cargo fetch -q')
}

# One run, its seconds appended to $1; its package files counted into $1.files.
timed() {
    local out=$1
    shift
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>"$ws/run.err" || {
        cat "$ws/run.err" >&2
        exit 1
    }
    end=$(date +%s.%N)
    echo "$start $end" | awk '{print $2 - $1}' >>"$out"
    local log
    log=$(ls -dt "$HOME"/.local/share/stockade/sessions/*/ | head -n1)network.jsonl
    python3 - "$log" >"$out.files" <<'PY'
import json, sys
stored = hit = 0
up = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    path = r.get("path") or ""
    if not (path.endswith(".tgz") or path.endswith("/download")):
        continue
    if r.get("cache") == "hit":
        hit += 1
    else:
        stored += r.get("cache") == "stored"
        up += r.get("bytes_down", 0)
print(f"{stored} fetched ({up / 1048576:.1f} MiB from the registry), {hit} from the cache")
PY
}

npm_install >/dev/null 2>&1
cargo_fetch >/dev/null 2>&1
# Only the lock file stays: with node_modules in the workspace every timed
# install would find everything in place and download nothing.
rm -rf npm/node_modules
APPLY=none

for _ in $(seq "$rounds"); do
    "$S" cache clear >/dev/null
    timed npm.cold npm_install
    timed npm.warm npm_install
    "$S" cache clear >/dev/null
    timed cargo.cold cargo_fetch
    timed cargo.warm cargo_fetch
done

python3 - "$rounds" <<'PY'
import sys
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]
def load(name):
    return [float(x) for x in open(name)]
print(f"{sys.argv[1]} rounds, one fresh VM per run")
print(f"{'run':<22} {'p50 s':>7} {'p90 s':>7}  last round")
for tool in ("npm", "cargo"):
    rows = {}
    for kind in ("cold", "warm"):
        xs = load(f"{tool}.{kind}")
        rows[kind] = pct(xs, 0.5)
        label = {"npm": "npm install express", "cargo": "cargo fetch axum"}[tool]
        print(f"{label + ' ' + kind:<22} {pct(xs, 0.5):7.2f} {pct(xs, 0.9):7.2f}  {open(f'{tool}.{kind}.files').read().strip()}")
    print(f"{'':<22} warm/cold p50 {rows['warm'] / rows['cold']:.2f}x")
PY
