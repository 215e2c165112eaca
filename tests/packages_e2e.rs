//! The package cache end to end with the real clients and the real
//! registries (reached from the rig's L1 through the host's connection):
//! npm and cargo in one fresh VM after another, counting what each run's
//! proxy fetched from the registry and what it served from the cache.

use crate::rig;
use crate::run_e2e::script;
use std::time::Duration;

/// Several guests, each installing on a software CPU.
const T: Duration = Duration::from_secs(900);

/// Shell lines defining `count KEY`: how many of the last session's
/// network records for package files have `"cache":KEY` (and `files`: how
/// many package-file requests it made at all).
const COUNT: &str = r#"last() { ls -dt "$HOME"/.local/share/stockade/sessions/*/ | head -n1; }
             count() { grep -E '"path":"[^"]*(\.tgz|/download)"' "$(last)network.jsonl" | grep -c "\"cache\":\"$1\""; }
             files() { grep -cE '"path":"[^"]*(\.tgz|/download)"' "$(last)network.jsonl"; }
             report() { echo "$1: stored=$(count stored) hit=$(count hit) files=$(files)"; }
"#;

#[test]
fn a_second_install_in_a_fresh_vm_downloads_no_package_again() {
    let Some(rig) = rig::require("a_second_install_in_a_fresh_vm_downloads_no_package_again") else { return };
    let out = rig.sh(
        &script(&format!(
            r#"{COUNT}
             # A cache of this test's own, empty at the start.
             export STOCKADE_CACHE=$ws.cache
             echo '{{"name":"t","version":"1.0.0","dependencies":{{"is-odd":"3.0.1","is-number":"7.0.0"}}}}' > package.json
             npm_install() {{ $S run --apply all --policy npm -- npm install --no-audit --no-fund --loglevel=error; }}
             npm_install; echo "npm1=$?"; report npm1
             ls node_modules | tr '\n' ' '; echo
             rm -rf node_modules
             npm_install; echo "npm2=$?"; report npm2
             grep '"version"' node_modules/is-number/package.json
             # Cached files changed on the host's disk are refused and fetched again.
             for f in $STOCKADE_CACHE/packages/blobs/*; do echo poisoned > "$f"; done
             rm -rf node_modules
             npm_install; echo "npm3=$?"; report npm3
             grep -c 'changed on disk' "$(last)network.jsonl" | sed 's/^/noticed=/'
             rm -rf node_modules package.json package-lock.json

             printf '[package]\nname = "t"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\nitoa = "=1.0.11"\nryu = "=1.0.18"\n' > Cargo.toml
             mkdir src; echo 'fn main() {{}}' > src/main.rs
             # Its own CARGO_HOME, so no run finds the crates in a cargo cache.
             cargo_fetch() {{ $S run --apply none --policy cargo -- sh -c 'CARGO_HOME=/tmp/cargo-home cargo fetch -q'; }}
             cargo_fetch; echo "cargo1=$?"; report cargo1
             cargo_fetch; echo "cargo2=$?"; report cargo2
             $S cache
             $S cache clear
             $S cache | grep files"#
        )),
        T,
    );
    for line in [
        "npm1=0",
        "npm1: stored=3 hit=0 files=3",
        "is-number is-odd",
        "npm2=0",
        "npm2: stored=0 hit=3 files=3",
        "\"version\": \"7.0.0\"",
        "npm3=0",
        "npm3: stored=3 hit=0 files=3",
        "noticed=3",
        "cargo1=0",
        "cargo1: stored=2 hit=0 files=2",
        "cargo2=0",
        "cargo2: stored=0 hit=2 files=2",
        "Removed 5 files",
        "  0 files, 0 B",
    ] {
        assert!(out.stdout.contains(line), "missing {line:?}\n{out}");
    }
}
