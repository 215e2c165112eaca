#!/usr/bin/env bash
# Agent start-up benchmark: p50/p90 wall time of `claude --version` on the
# host and through `stockade run --policy claude`, and what the home
# toolchain shares add to a run (`run -- true` with and without them, with
# the agent CLIs and an nvm node on PATH). Prints a table and the ratios.
#
# The CLIs come from tests/agents/install.sh (npm registry, home prefix).
# Runs where a standard guest boots: here on hardware KVM, or in the rig:
#   benches/agents.sh [RUNS]          # here (needs hardware KVM)
#   benches/agents.sh --rig [RUNS]    # inside a fresh rig L1
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
agents=${STOCKADE_TEST_AGENTS:-$("$here/tests/agents/install.sh")}
if [[ "${1:-}" == --rig ]]; then
    shift
    exec "$here/tests/rig/run-in-l1.sh" env STOCKADE_TEST_AGENTS="$agents" "$here/benches/agents.sh" "$@"
fi
runs=${1:-7}
bin=${STOCKADE_BIN:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
kernel=${STOCKADE_KERNEL:-$("$here/guest-kernel/build.sh" 2>/dev/null | tail -n1)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STOCKADE_DATA_DIR="$work/data"
cp "$bin" "$work/stockade"
bin=$work/stockade
export PATH="$agents/nvm/versions/node/$(node --version)/bin:$agents/npm-global/bin:$PATH"

. "$here/benches/timing.sh"

mkdir -p "$work/ws" && cd "$work/ws"
run=("$bin" run --cpus 1 --memory 1G --kernel "$kernel" --apply none)
names=("host: claude --version" "stockade run --policy claude -- claude --version"
    "stockade run -- true" "stockade run --no-home-tools -- true")
time_runs "${names[0]}" claude --version
time_runs "${names[1]}" "${run[@]}" --policy claude -- claude --version
time_runs "${names[2]}" "${run[@]}" -- true
time_runs "${names[3]}" "${run[@]}" --no-home-tools -- true

printf '%-52s %8s %8s\n' "what ($runs runs)" "p50 s" "p90 s"
for name in "${names[@]}"; do
    printf '%-52s %8.3f %8.3f\n' "$name" "${p50[$name]}" "${p90[$name]}"
done
echo "claude --version through stockade / run -- true: $(echo "scale=2; ${p50[${names[1]}]} / ${p50[${names[2]}]}" | bc)x (p50)"
echo "home toolchain shares: run -- true with / without: $(echo "scale=3; ${p50[${names[2]}]} / ${p50[${names[3]}]}" | bc)x (p50)"
