#!/usr/bin/env bash
# Sets up stockade on Debian/Ubuntu: build dependencies (apt), the guest kernel
# (cached), the stockade binary, then `stockade doctor`.
#
#   ./install.sh                 installs to ~/.local (bin/stockade, share/stockade/kernel)
#   PREFIX=/opt/stockade ./install.sh
#
# A second run only rebuilds what changed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=${PREFIX:-$HOME/.local}
bindir="$PREFIX/bin"
kerneldir="$PREFIX/share/stockade/kernel"

say() { printf 'install: %s\n' "$*" >&2; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }

[[ "$(uname -m)" == x86_64 ]] || die "stockade supports x86_64 Linux hosts only (this is $(uname -m))"
command -v apt-get >/dev/null || die "this installer needs apt (Debian or Ubuntu); on other systems install the packages listed in install.sh by hand"

# Build dependencies: the kernel build's, and the Debian kernel source;
# at run time mkfs.ext4 (e2fsprogs) formats the scratch disk and the proxy
# checks servers against the system CA store.
packages=(build-essential bc flex bison libelf-dev libssl-dev cpio xz-utils linux-source-6.12 e2fsprogs ca-certificates)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null || die "installing ${missing[*]} needs root: run as root or install sudo"
        sudo=(sudo)
    fi
    say "installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v cargo >/dev/null || die "Rust is not installed: get Rust 1.85 or newer from https://rustup.rs and run ./install.sh again"

say "guest kernel"
vmlinux=$("$here/guest-kernel/build.sh" | tail -n1)
[[ -f "$vmlinux" ]] || die "guest-kernel/build.sh did not produce a vmlinux"

say "stockade binary"
(cd "$here" && cargo build --release --locked --quiet)
target_dir=$(cd "$here" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null ||
    echo "$here/target")
binary="$target_dir/x86_64-unknown-linux-gnu/release/stockade"
[[ -x "$binary" ]] || die "cargo did not produce $binary"

mkdir -p "$bindir" "$kerneldir"
install -m 0755 "$binary" "$bindir/stockade.new" && mv -f "$bindir/stockade.new" "$bindir/stockade"
src_dir=$(dirname "$vmlinux")
for f in vmlinux config info; do
    install -m 0644 "$src_dir/$f" "$kerneldir/$f.new" && mv -f "$kerneldir/$f.new" "$kerneldir/$f"
done
say "installed $bindir/stockade and $kerneldir/vmlinux"
case ":$PATH:" in
    *":$bindir:"*) ;;
    *) say "add $bindir to your PATH, e.g.: echo 'export PATH=\"$bindir:\$PATH\"' >> ~/.bashrc" ;;
esac

say "stockade doctor"
"$bindir/stockade" doctor || say "stockade is installed, but doctor found problems on this host (see above)"
