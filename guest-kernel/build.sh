#!/usr/bin/env bash
# Builds stockade's guest kernel: a PVH-bootable vmlinux with everything built in.
#
# Inputs:  KERNEL_SRC   kernel tarball (default: Debian's linux-source-6.12)
#          STOCKADE_CACHE  cache root (default: ~/.cache/stockade)
#          JOBS         parallel make jobs (default: number of CPUs)
# Output:  the path of the cached vmlinux on the last line of stdout.
#
# The result is cached under $STOCKADE_CACHE/kernel/<key>, where key hashes the
# source tarball, the config fragment, the patches and this script, so any input
# change gives a new build and an unchanged input is a cache hit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KERNEL_SRC=${KERNEL_SRC:-/usr/src/linux-source-6.12.tar.xz}
cache_root=${STOCKADE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stockade}
jobs=${JOBS:-$(nproc)}
fragment="$here/stockade.config"

say() { printf 'guest-kernel: %s\n' "$*" >&2; }
die() { printf 'guest-kernel: error: %s\n' "$*" >&2; exit 1; }

if [[ ! -f "$KERNEL_SRC" ]]; then
    die "kernel source $KERNEL_SRC not found. Install it with 'apt-get install linux-source-6.12', or point KERNEL_SRC= at a kernel tarball."
fi
for tool in make gcc bc flex bison sha256sum tar; do
    command -v "$tool" >/dev/null || die "'$tool' is missing. Install the build dependencies: apt-get install build-essential bc flex bison libelf-dev libssl-dev cpio xz-utils"
done

# The key: the tarball's content hash stands for the source version exactly.
src_sum_file="$cache_root/kernel/src-sums"
mkdir -p "$cache_root/kernel"
src_id="$(stat -c '%n %s %Y' "$KERNEL_SRC")"
src_sum=""
if [[ -f "$src_sum_file" ]]; then
    src_sum=$(awk -v id="$src_id" -F '\t' '$1 == id { print $2 }' "$src_sum_file" | tail -n1)
fi
if [[ -z "$src_sum" ]]; then
    src_sum=$(sha256sum "$KERNEL_SRC" | cut -d' ' -f1)
    printf '%s\t%s\n' "$src_id" "$src_sum" >>"$src_sum_file"
fi
key=$( {
    echo "source $src_sum"
    echo "fragment"; cat "$fragment"
    for p in "$here"/patches/*.patch; do [[ -e "$p" ]] && { echo "patch $(basename "$p")"; cat "$p"; }; done
    echo "script"; cat "$here/build.sh"
} | sha256sum | cut -c1-16)
out="$cache_root/kernel/$key"

if [[ -f "$out/vmlinux" && -f "$out/info" ]]; then
    say "cached: $out/vmlinux"
    echo "$out/vmlinux"
    exit 0
fi

work=$(mktemp -d "$cache_root/kernel/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

say "[1/4] extracting $(basename "$KERNEL_SRC")"
tar -C "$work" -xf "$KERNEL_SRC"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n1)
[[ -f "$src/Makefile" ]] || die "$KERNEL_SRC does not contain a kernel tree"
version=$(make -s -C "$src" kernelversion)

shopt -s nullglob
for p in "$here"/patches/*.patch; do
    say "applying $(basename "$p")"
    patch -d "$src" -p1 --quiet <"$p" || die "patch $(basename "$p") does not apply to $version"
done

say "[2/4] configuring $version (tinyconfig + $(basename "$fragment"))"
make -s -C "$src" tinyconfig >/dev/null
(cd "$src" && ./scripts/kconfig/merge_config.sh -m .config "$fragment" >/dev/null)
make -s -C "$src" olddefconfig >/dev/null
# A fragment line that did not survive olddefconfig is a typo or an unmet
# dependency: fail now rather than ship a kernel that lacks it.
missing=()
while IFS= read -r line; do
    [[ "$line" =~ ^(CONFIG_[A-Z0-9_]+)=(.*)$ ]] || continue
    opt=${BASH_REMATCH[1]} want=${BASH_REMATCH[2]}
    if [[ "$want" == n ]]; then
        grep -q "^$opt=" "$src/.config" && missing+=("$opt=n")
    else
        grep -qx "$opt=$want" "$src/.config" || missing+=("$opt=$want")
    fi
done <"$fragment"
if ((${#missing[@]})); then
    die "these options did not take effect (check their dependencies): ${missing[*]}"
fi

# Compile with a running count of compiled units; the previous build's count
# (if any) gives an estimate of the total.
estimate=$(cat "$cache_root/kernel/units" 2>/dev/null || echo 0)
# A 30-column bar for a percentage on a terminal; nothing when the total is
# unknown (the first build), where the count alone shows it moving.
bar() {
    (($1 < 0)) && return
    local filled=$(($1 * 30 / 100)) out='['
    for ((i = 0; i < 30; i++)); do
        if ((i < filled)); then out+='='; elif ((i == filled)); then out+='>'; else out+=' '; fi
    done
    printf '%s] ' "$out"
}
say "[3/4] compiling with $jobs jobs"
log="$work/build.log"
count=0
is_tty=0; [[ -t 2 ]] && is_tty=1
set +e
make -C "$src" -j"$jobs" vmlinux 2>&1 | while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ "$line" == *" CC "* || "$line" == *" AS "* ]]; then
        count=$((count + 1))
        if ((estimate > 0)); then
            pct=$((count * 100 / estimate)); ((pct > 99)) && pct=99
            msg="compiled $count/$estimate units ($pct%)"
        else
            pct=-1
            msg="compiled $count units"
        fi
        if ((is_tty)); then
            printf '\r\033[Kguest-kernel: %s%s' "$(bar "$pct")" "$msg" >&2
        elif ((count % 200 == 0)); then
            say "$msg"
        fi
    fi
    echo "$count" >"$work/count"
done
rc=${PIPESTATUS[0]}
set -e
((is_tty)) && printf '\n' >&2
if ((rc != 0)); then
    tail -n 30 "$log" >&2
    die "kernel build failed (exit $rc); the last lines of the build log are above"
fi
cat "$work/count" >"$cache_root/kernel/units"

say "[4/4] storing in $out"
mkdir -p "$out.tmp"
cp "$src/vmlinux" "$out.tmp/vmlinux"
cp "$src/.config" "$out.tmp/config"
{
    echo "version=$version"
    echo "key=$key"
    echo "source=$KERNEL_SRC"
    echo "source_sha256=$src_sum"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build_seconds=$(($(date +%s) - start))"
} >"$out.tmp/info"
rm -rf "$out"
mv "$out.tmp" "$out"
say "built $version in $(($(date +%s) - start)) s: $out/vmlinux ($(du -h "$out/vmlinux" | cut -f1))"
echo "$out/vmlinux"
