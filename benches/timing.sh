# Sourced by the benchmarks: time_runs NAME CMD... runs CMD once to warm up,
# then $runs times, and records the p50 and p90 wall time in p50[NAME] and
# p90[NAME]. Each run may take up to $bench_timeout seconds (default 300).
declare -A p50 p90
time_runs() {
    local name=$1; shift
    local limit=${bench_timeout:-300}
    echo "timing $name" >&2
    timeout "$limit" "$@" >/dev/null 2>&1 || true
    local times=()
    for _ in $(seq "$runs"); do
        local start end
        start=$(date +%s.%N)
        timeout "$limit" "$@" >/dev/null 2>&1 || true
        end=$(date +%s.%N)
        times+=("$(echo "$end - $start" | bc)")
    done
    local sorted
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    p50[$name]=$(echo "$sorted" | awk -v n="$runs" 'NR == int((n + 1) / 2)')
    p90[$name]=$(echo "$sorted" | awk -v n="$runs" 'NR == int((n * 9 + 9) / 10)')
}
