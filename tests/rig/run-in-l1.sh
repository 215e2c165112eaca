#!/usr/bin/env bash
# Boots one rig L1 and runs a command in it (as root, cwd = the current
# directory, which L1 sees read-only at the same path), then prints its
# output and exits with its status. For benchmarks and debugging; the test
# suite uses the Rust harness in tests/rig/mod.rs.
#   tests/rig/run-in-l1.sh benches/boot.sh 10
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($#)) || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
artifacts=$("$here/prepare.sh")
dir=$(mktemp -d /tmp/stockade-l1.XXXXXX)
trap 'kill "$qemu" 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/xfer/jobs/1"
{
    printf 'cd %q\n' "$PWD"
    printf '%q ' "$@"
    printf '\n'
} >"$dir/xfer/jobs/1/cmd.sh"

setpriv --pdeathsig KILL -- qemu-system-x86_64 -M q35 -accel tcg -cpu EPYC-v3,+svm -smp 2 -m 4096 \
    -nodefaults -display none -no-reboot \
    -kernel "$artifacts/vmlinuz" -initrd "$artifacts/initramfs.cpio.gz" -append "console=ttyS0 panic=-1 quiet" \
    -serial "file:$dir/console.log" \
    -chardev "socket,id=agent,path=$dir/agent.sock,server=on,wait=off" -serial chardev:agent \
    -netdev user,id=net0 -device virtio-net-pci,netdev=net0 \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$dir/xfer,mount_tag=xfer,security_model=none,multidevs=remap" 2>"$dir/qemu.log" &
qemu=$!

lost=0
python3 - "$dir/agent.sock" "$dir/rc" <<'PY' || lost=1
import socket, sys, time
path = sys.argv[1]
deadline = time.time() + 20
while True:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("rig: QEMU did not open its agent socket")
        time.sleep(0.05)
s.settimeout(180)
f = s.makefile("rwb")
line = f.readline().decode().strip()
if not line.startswith("rig-ready"):
    sys.exit(f"rig: L1 boot failed: {line!r}")
s.settimeout(None)
f.write(b"run 1\n"); f.flush()
while True:
    words = f.readline().decode().split()
    if not words:
        sys.exit("rig: L1 closed the channel")
    if words[:2] == ["done", "1"]:
        open(sys.argv[2], "w").write(words[2] if len(words) > 2 else "1")
        break
PY
cat "$dir/xfer/jobs/1/stdout" 2>/dev/null
cat "$dir/xfer/jobs/1/stderr" >&2 2>/dev/null
# When L1 is lost, its console says why (a soft lockup, a crash).
((lost)) && { echo "--- L1 console (tail)" >&2; tail -n 30 "$dir/console.log" >&2; }
exit "$(cat "$dir/rc" 2>/dev/null || echo 1)"
