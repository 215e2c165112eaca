#!/usr/bin/env bash
# Runs stockade's test suite: unit tests, CLI tests and the end-to-end tests
# (through the nested-SVM rig when this host's KVM cannot boot a standard
# guest). Installs what the tests need with apt and builds the guest kernel
# and the rig's L1 artifacts, all cached under ~/.cache/stockade.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'tests: %s\n' "$*" >&2; }

packages=(qemu-system-x86 busybox-static kmod cpio file tmux build-essential bc flex bison libelf-dev libssl-dev xz-utils linux-source-6.12 e2fsprogs git curl python3 ca-certificates mmdebstrap genext2fs uidmap openssh-client openssh-server)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# The npm end-to-end test needs npm; any install of it will do (NodeSource's
# nodejs bundles it and conflicts with Debian's npm package).
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
    sudo=(); ((EUID == 0)) || sudo=(sudo)
    say "installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

vmlinux=$("$here/guest-kernel/build.sh" | tail -n1)
export STOCKADE_KERNEL="$vmlinux"
"$here/tests/rig/prepare.sh" >/dev/null
# The agent CLIs from the npm registry, in a prefix under the home directory.
STOCKADE_TEST_AGENTS=$("$here/tests/agents/install.sh")
export STOCKADE_TEST_AGENTS

cd "$here"
# Lints first: a formatting or clippy finding fails the run before the slow tests.
say "cargo fmt --check"
cargo fmt --check
say "cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
cargo test --release --locked "$@"
