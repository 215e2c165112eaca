#!/usr/bin/env bash
# Boot benchmark: p50/p90 wall time of `stockade run -- true`, of the bare VMM
# booting the same kernel and init to exit, and of QEMU microvm booting that
# kernel and init; peak RSS of each VMM process. Prints a table.
#
# Runs where a standard guest boots: directly on hardware KVM, or inside the
# rig's L1 on a PVM host (tests/rig). Usage:
#   benches/boot.sh [RUNS]            # here (needs hardware KVM)
#   benches/boot.sh --rig [RUNS]      # inside a fresh rig L1
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ "${1:-}" == --rig ]]; then
    shift
    exec "$here/tests/rig/run-in-l1.sh" "$here/benches/boot.sh" "$@"
fi
runs=${1:-10}
bin=${STOCKADE_BIN:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
kernel=${STOCKADE_KERNEL:-$("$here/guest-kernel/build.sh" 2>/dev/null | tail -n1)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STOCKADE_DATA_DIR="$work/data"
# Both VMMs read their initramfs from local files: in the rig the checkout is
# a 9p share, whose reads would be charged to stockade alone.
cp "$bin" "$work/stockade"
bin=$work/stockade

# Our VMM serves the binary as /init over virtio-fs; QEMU gets the same init
# in an initramfs. The init finds no host on vsock and powers off at once.
mkdir -p "$work/initramfs/dev" "$work/initramfs/proc" "$work/initramfs/sys" "$work/initramfs/tmp"
cp "$bin" "$work/initramfs/init"
mknod "$work/initramfs/dev/console" c 5 1
(cd "$work/initramfs" && find . | cpio -o -H newc --quiet) >"$work/initramfs.cpio"

cat >"$work/vmm.json" <<JSON
{"kernel":"$kernel","init":"$bin","vcpus":1,"memory_bytes":268435456,
 "kernel_log":"$work/vmm-kernel.log","vsock_broker":"$work/broker.sock","shares":[],
 "jail":true,"verbose_kernel":false}
JSON
# The VMM's broker: a supervisor that has no host ports, so every guest
# connection is refused and the init powers off at once.
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()
while True:
    s.accept()[0].close()
' "$work/broker.sock" &
broker=$!
trap 'kill $broker 2>/dev/null; rm -rf "$work"' EXIT

# time_runs NAME CMD...: runs CMD $runs times after one warm-up, records
# wall seconds and peak RSS (KiB) of the timed process.
declare -A p50 p90 rss
time_runs() {
    local name=$1; shift
    echo "timing $name" >&2
    timeout 120 "$@" >/dev/null 2>&1 || true
    local times=() peak=0
    for _ in $(seq "$runs"); do
        local start end kb
        start=$(date +%s.%N)
        # A run stuck past two minutes (a rig flake) counts as 120 s.
        timeout 120 /usr/bin/time -o "$work/rss" -f '%M' "$@" >/dev/null 2>&1 || true
        kb=$(tail -n1 "$work/rss")
        end=$(date +%s.%N)
        times+=("$(echo "$end - $start" | bc)")
        ((kb > peak)) && peak=$kb
    done
    local sorted
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    p50[$name]=$(echo "$sorted" | awk -v n="$runs" 'NR == int((n + 1) / 2)')
    p90[$name]=$(echo "$sorted" | awk -v n="$runs" 'NR == int((n * 9 + 9) / 10)')
    rss[$name]=$peak
}

mkdir -p "$work/ws" && cd "$work/ws"
time_runs "stockade run -- true" "$bin" run --cpus 1 --memory 256M --kernel "$kernel" -- true
time_runs "stockade vmm (kernel+init to exit)" "$bin" vmm --config "$work/vmm.json"
time_runs "qemu microvm (same kernel+init)" qemu-system-x86_64 -M microvm,x-option-roms=off,isa-serial=on,rtc=off \
    -enable-kvm -cpu host -m 256 -smp 1 -nodefaults -no-user-config -nographic -serial null -no-reboot \
    -kernel "$kernel" -initrd "$work/initramfs.cpio" -append "console=ttyS0 reboot=t panic=-1 quiet 8250.nr_uarts=1"

printf '%-38s %8s %8s %12s\n' "what ($runs runs)" "p50 s" "p90 s" "peak RSS"
for name in "stockade run -- true" "stockade vmm (kernel+init to exit)" "qemu microvm (same kernel+init)"; do
    printf '%-38s %8.3f %8.3f %9d KiB\n' "$name" "${p50[$name]}" "${p90[$name]}" "${rss[$name]}"
done
