#!/usr/bin/env bash
# Proxy benchmark on loopback: added latency per request through the proxy
# (absolute-URI http:// and a CONNECT tunnel) against the same server
# directly, p50/p99; and CONNECT tunnel throughput. Targets: <= 1 ms added
# p50, >= 500 MB/s. No VM, no network. Usage:
#   benches/proxy.sh [REQUESTS] [MIB]       # defaults 2000 requests, 2048 MiB
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export BENCH_REQUESTS=${1:-2000} BENCH_MB=${2:-2048}
cd "$here"
# The benchmark is an ignored test of the proxy module: it starts the real
# proxy and test servers in-process.
nice cargo test --release --bin stockade proxy::tests::bench -- --ignored --nocapture --test-threads 1 2>/dev/null |
    sed -n 's/^test proxy::tests::bench \.\.\. //; /requests per case/,/throughput/p'
