#!/usr/bin/env bash
# Boot benchmark: p50/p90 wall time of `stockade run -- true` resumed from a
# template and booted, of the bare VMM resuming a template and booting the
# same kernel and init to exit, and of QEMU microvm booting that kernel and
# init; peak RSS of each, and each row's ratio to QEMU. The rows take turns
# within each round, so a machine that slows down mid-way slows them all.
# A `run` row's RSS is the largest process the run reaped: a VMM whose guest
# reported its end is killed and not waited for, so it often is the
# supervisor's; the bare VMM rows give the VMM's.
# Also: the restore's phases (VMM start to vCPUs running, and on to the
# guest's init running), how long a resumed guest takes to call in, the
# template's size and recording time, and the VMM's own resident memory
# apart from guest pages, resumed and booted.
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
until [[ -S $work/broker.sock ]]; do sleep 0.05; done

cat >"$work/record.json" <<JSON
{"kernel":"$kernel","init":"$bin","vcpus":1,"memory_bytes":268435456,
 "kernel_log":"$work/rec-kernel.log","vsock_broker":"$work/broker.sock","shares":[],
 "jail":true,"verbose_kernel":false,"template":{"record":"$work/template"}}
JSON
sed "s#\"record\"#\"restore\"#" "$work/record.json" >"$work/resume.json"
mkdir -p "$work/template"
start=$(date +%s.%N)
RUST_LOG=info timeout 120 "$bin" vmm --config "$work/record.json" >/dev/null 2>"$work/record.log" || true
recorded_in=$(echo "$(date +%s.%N) - $start" | bc)
saved=$(grep -o 'template recorded in [^:]*' "$work/record.log" || { cat "$work/record.log" >&2; echo "no template recorded"; })
template_kib=$(du -sk "$work/template" | cut -f1)

# The rows, in the order each round runs them.
names=("run -- true (resumed)" "run -- true (--no-snapshot)" "vmm, resumed" "vmm, booted" "qemu microvm")
commands=(
    "$bin run -v --cpus 1 --memory 256M --kernel $kernel -- true"
    "$bin run --no-snapshot --cpus 1 --memory 256M --kernel $kernel -- true"
    "env RUST_LOG=stockade=debug $bin vmm --config $work/resume.json"
    "env RUST_LOG=stockade=debug $bin vmm --config $work/vmm.json"
    qemu
)
qemu=(qemu-system-x86_64 -M microvm,x-option-roms=off,isa-serial=on,rtc=off -enable-kvm -cpu host -m 256 -smp 1
    -nodefaults -no-user-config -nographic -serial null -no-reboot -kernel "$kernel" -initrd "$work/initramfs.cpio"
    -append "console=ttyS0 reboot=t panic=-1 quiet 8250.nr_uarts=1")

# run_row I: runs row I once; appends its wall seconds and peak RSS (KiB).
declare -A times peak
run_row() {
    local i=$1 start kb
    # shellcheck disable=SC2206
    local cmd=(${commands[$i]})
    [[ ${cmd[0]} == qemu ]] && cmd=("${qemu[@]}")
    start=$(date +%s.%N)
    # A run stuck past two minutes (a rig flake) counts as 120 s.
    timeout 120 /usr/bin/time -o "$work/rss" -f '%M' "${cmd[@]}" >/dev/null 2>"$work/err" || true
    times[$i]+="$(echo "$(date +%s.%N) - $start" | bc) "
    kb=$(tail -n1 "$work/rss")
    ((kb > ${peak[$i]:-0})) && peak[$i]=$kb
    grep -o 'ready after [0-9.]*m\?s' "$work/err" >>"$work/ready" || true
    # The bare VMM's debug log: when its vCPUs ran, and when the init first
    # dialed the host (it runs: the restore is over).
    grep -o 'vCPUs started after [0-9.]*m\?s' "$work/err" | ms >>"$work/vcpus-$i" || true
    grep -o 'first dialed the host after [0-9.]*m\?s' "$work/err" | ms >>"$work/dialed-$i" || true
}
# ms: "... after 1.5s" or "... after 87.3ms" on stdin, milliseconds out.
ms() { awk '{v=$NF; if (v ~ /ms$/) {sub(/ms$/, "", v)} else if (v ~ /µs$/) {sub(/µs$/, "", v); v/=1000} else {sub(/s$/, "", v); v*=1000}; printf "%.1f\n", v}'; }
# median FILE: the middle value of a file of numbers.
median() { sort -n "$1" | awk '{a[NR]=$1} END{if (NR) print a[int((NR+1)/2)]; else print "n/a"}'; }

mkdir -p "$work/ws" && cd "$work/ws"
echo "warm-up (the first run records the template)" >&2
for i in "${!names[@]}"; do run_row "$i"; times[$i]=""; peak[$i]=0; done
: >"$work/ready"
rm -f "$work"/vcpus-* "$work"/dialed-*
for round in $(seq "$runs"); do
    echo "round $round of $runs" >&2
    for i in "${!names[@]}"; do run_row "$i"; done
done

# The VMM's own memory: a bare VMM's smaps sampled while it runs, the
# sample where it was largest; guest RAM is the one mapping as large as the
# guest's memory.
own_memory() {
    local vmm best="0 0 0 0" sample
    "$bin" vmm --config "$1" >/dev/null 2>&1 &
    vmm=$!
    while kill -0 "$vmm" 2>/dev/null; do
        # own, guest, own anonymous, own file-backed (the binary's pages,
        # shared with any other process running it)
        sample=$(awk '/^[0-9a-f]+-[0-9a-f]+ /{big=0; file=($6 ~ /^\//)} /^Size:/{big=($2 >= 262144)}
            /^Rss:/{if (big) g+=$2; else if (file) f+=$2; else a+=$2} END{print a+f, g+0, a+0, f+0}' \
            "/proc/$vmm/smaps" 2>/dev/null || true)
        [[ -n $sample && ${sample%% *} -gt ${best%% *} ]] && best=$sample
        sleep 0.02
    done
    echo "$best"
}
read -r own_resumed guest_resumed anon_resumed file_resumed < <(own_memory "$work/resume.json")
read -r own_booted guest_booted anon_booted file_booted < <(own_memory "$work/vmm.json")

quantile() { printf '%s\n' $1 | sort -n | awk -v n="$runs" -v q="$2" 'NR == int((n * q + q) / 10)'; }
qemu_p50=$(quantile "${times[4]}" 5)
printf '%-30s %8s %8s %8s %12s\n' "what ($runs runs)" "p50 s" "p90 s" "vs QEMU" "peak RSS"
for i in "${!names[@]}"; do
    p50=$(quantile "${times[$i]}" 5)
    p90=$(quantile "${times[$i]}" 9)
    printf '%-30s %8.3f %8.3f %7.2fx %9d KiB\n' "${names[$i]}" "$p50" "$p90" "$(echo "$p50 / $qemu_p50" | bc -l)" "${peak[$i]}"
done
echo "resumed guest called in: p50 $(sort -t' ' -k3 -n "$work/ready" | awk '{a[NR]=$3} END{print a[int((NR+1)/2)]}') after the VMM started"
echo "template: ${template_kib} KiB on disk for 256 MiB of guest memory; the recording boot took ${recorded_in} s, ${saved}"
echo "bare VMM, p50 ms after it started: resumed: vCPUs running $(median "$work/vcpus-2"), init running $(median "$work/dialed-2"); booted: vCPUs running $(median "$work/vcpus-3"), init running $(median "$work/dialed-3")"
echo "VMM's own resident memory (largest sample), apart from guest pages:"
echo "  resumed ${own_resumed} KiB: ${anon_resumed} KiB anonymous, ${file_resumed} KiB of the binary; guest pages ${guest_resumed} KiB"
echo "  booted ${own_booted} KiB: ${anon_booted} KiB anonymous, ${file_booted} KiB of the binary; guest pages ${guest_booted} KiB"
