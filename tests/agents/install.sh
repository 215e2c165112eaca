#!/usr/bin/env bash
# Installs the agent CLIs the end-to-end tests run, the way users install
# them: from the npm registry with `npm install -g --prefix` into a prefix in
# the home directory, and node itself in an nvm-style tree
# (nvm/versions/node/vX/{bin,lib/node_modules/npm}) copied from this host's
# node. Cached under $STOCKADE_CACHE/agent-clis/<key>, key = the pinned
# versions, node's version and this script, and used from a hard-linked copy
# at ~/.stockade-test-agents/<key>: stockade never shares its own cache with a
# guest, as a user's toolchains are shared, so tools must live elsewhere.
#
# Output: the directory (holding npm-global/ and nvm/) on stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${STOCKADE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stockade}/agent-clis
packages=(@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0)
say() { printf 'agents: %s\n' "$*" >&2; }

node=$(command -v node) || { say "node is missing: install nodejs (with npm)"; exit 1; }
npm_dir=$(npm root -g)/npm
[[ -f $npm_dir/bin/npm-cli.js ]] || { say "cannot find npm's own package under $(npm root -g)"; exit 1; }
version=$("$node" --version)
key=$( { echo "${packages[*]}" "$version"; cat "$here/install.sh"; } | sha256sum | cut -c1-16)
out=$cache_root/$key
use_root=$HOME/.stockade-test-agents
use=$use_root/$key
ready() { [[ -x $1/npm-global/bin/claude && -x $1/nvm/versions/node/$version/bin/node ]]; }
# The copy the tests run, hard-linked from the cache (the same filesystem).
publish() {
    if ! ready "$use"; then
        mkdir -p "$use_root"
        rm -rf "$use" "$use.tmp"
        cp -al "$out" "$use.tmp" 2>/dev/null || cp -a "$out" "$use.tmp"
        mv "$use.tmp" "$use"
    fi
    echo "$use"
}
if ready "$out"; then
    publish
    exit 0
fi

say "installing ${packages[*]} with node $version"
mkdir -p "$cache_root"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree=$work/nvm/versions/node/$version
mkdir -p "$tree/bin" "$tree/lib/node_modules"
cp "$node" "$tree/bin/node"
cp -a "$npm_dir" "$tree/lib/node_modules/npm"
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$tree/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$tree/bin/npx"
PATH=$tree/bin:$PATH npm install -g --prefix "$work/npm-global" --no-audit --no-fund --loglevel=error \
    "${packages[@]}" >&2
rm -rf "$out"
mv "$work" "$out"
trap - EXIT
say "agent CLIs ready in $out"
publish
