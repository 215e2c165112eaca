#!/usr/bin/env bash
# What the workspace file server's checks cost per request, on this host,
# without a VM: a 4 KiB read through a kept reader and a getattr, at path
# depths 1 to 64, through the same queue processing the guest's requests
# take, beside the host's own pread, open+read and fstatat of the same file
# and a request refused at the gate (the queue and the harness alone, taken
# off the others); and the first read of each of 5,000 small files (as grep
# -r reads a tree: every read opens its file) and a lookup of one, beside
# the host's open+read+close and fstatat; then those first reads sent 32 a
# notification, as the guest reads a directory's files ahead, served by the
# worker alone and with one helper; and the round trip of a lone request
# sent a moment after the last reply, with the worker asleep until a kick
# and with it watching the ring (p50/p90). Each number is the median of
# five batches.
#   benches/file_server.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
nice cargo test --release --bin stockade --no-run >/dev/null 2>&1
nice cargo test --release --bin stockade -- hot_path_bench batch_bench linger_bench --ignored --nocapture --test-threads=1 2>/dev/null |
    grep -vE '^(running|test |$)|test result'
