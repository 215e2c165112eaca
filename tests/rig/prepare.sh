#!/usr/bin/env bash
# Prepares the end-to-end rig's L1: a Debian kernel with kvm-amd and 9p as
# modules, and an initramfs whose init mounts this machine's root read-only
# over 9p under a tmpfs overlay, loads kvm-amd, and starts the agent.
#
# Output: the artifact directory (vmlinuz, initramfs.cpio.gz) on stdout.
# Cached under $STOCKADE_CACHE/rig/<key>, key = hash of the kernel package
# version, busybox and the rig's own files.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${STOCKADE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stockade}/rig
meta=${RIG_KERNEL_PACKAGE:-linux-image-amd64}
# Modules L1 needs, in any order; their dependencies are resolved from modules.dep.
wanted=(virtio_pci 9pnet_virtio 9p overlay kvm_amd virtio_net)

say() { printf 'rig: %s\n' "$*" >&2; }
die() { printf 'rig: error: %s\n' "$*" >&2; exit 1; }

for tool in qemu-system-x86_64 apt-get apt-cache dpkg-deb cpio gzip depmod; do
    command -v "$tool" >/dev/null || die "'$tool' is missing: apt-get install qemu-system-x86 cpio kmod"
done
busybox=$(command -v busybox || true)
if [[ -z "$busybox" ]] || ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
    busybox=/bin/busybox
    [[ -x $busybox ]] || die "a static busybox is needed for the L1 initramfs: apt-get install busybox-static"
fi

image=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
[[ -n "$image" ]] || die "cannot resolve $meta to a kernel package; run 'apt-get update' first"
version=$(apt-cache policy "$image" | awk '/Candidate:/ { print $2 }')
key=$( {
    echo "$image $version"
    "$busybox" 2>&1 | head -n1
    cat "$here/prepare.sh" "$here/init.sh" "$here/agent.sh"
} | sha256sum | cut -c1-16)
out="$cache_root/$key"
if [[ -f "$out/initramfs.cpio.gz" && -f "$out/vmlinuz" ]]; then
    echo "$out"
    exit 0
fi

say "building L1 artifacts for $image $version"
mkdir -p "$cache_root"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$image" >/dev/null 2>"$work/apt.err") ||
    die "cannot download $image: $(tail -n1 "$work/apt.err"); run 'apt-get update' and try again"
dpkg-deb -x "$work"/*.deb "$work/pkg"
kver=$(ls "$work/pkg/lib/modules")
moddir="$work/pkg/lib/modules/$kver"
# The package ships no modules.dep (its postinst makes it); make our own.
depmod -b "$work/pkg" "$kver" || die "depmod failed for $image"

# Depth-first over modules.dep so that each module follows its dependencies.
declare -A seen=()
order=()
resolve() {
    local rel=$1
    [[ -n "${seen[$rel]:-}" ]] && return
    seen[$rel]=1
    local deps
    deps=$(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$moddir/modules.dep")
    for d in $deps; do resolve "$d"; done
    order+=("$rel")
}
for m in "${wanted[@]}"; do
    # Module names use '_' where file names may use '-' (kvm_amd is kvm-amd.ko).
    rel=$(awk -F: -v m="$m.ko" '{ n = $1; sub(/.*\//, "", n); gsub(/-/, "_", n) } n == m { print $1; exit }' "$moddir/modules.dep")
    [[ -n "$rel" ]] || die "module $m not found in $image"
    resolve "$rel"
done

root="$work/initramfs"
mkdir -p "$root"/{bin,dev,proc,sys,modules,lower,upper,newroot}
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
for rel in "${order[@]}"; do
    cp "$moddir/$rel" "$root/modules/"
    basename "$rel" >>"$root/modules/order"
done
cp "$here/init.sh" "$root/init"
cp "$here/agent.sh" "$root/agent.sh"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initramfs.cpio.gz"

mkdir -p "$out.tmp"
cp "$work/pkg/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
mv "$work/initramfs.cpio.gz" "$out.tmp/"
echo "$image $version: ${order[*]}" >"$out.tmp/info"
rm -rf "$out"
mv "$out.tmp" "$out"
say "L1 artifacts ready in $out"
echo "$out"
