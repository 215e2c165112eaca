//! The guest's network end to end: only the policy's hosts are reachable,
//! through the host's proxy, and secrets stay on the host. Uses the real
//! registries through the rig's user-mode network.

use crate::rig;
use crate::run_e2e::{T, script};

#[test]
fn only_allowed_hosts_are_reachable() {
    let Some(rig) = rig::require("only_allowed_hosts_are_reachable") else { return };
    let out = rig.sh(
        &script(
            "$S run --allow index.crates.io -- curl -sS -o /dev/null -w 'allowed=%{http_code}\\n' https://index.crates.io/config.json
             $S run -- curl -sS -o /dev/null https://example.com; echo \"denied=$?\"
             $S run -- getent hosts example.com; echo \"dns=$?\"
             s=$(ls -dt \"$HOME\"/.local/share/stockade/sessions/*/ | head -n 3)
             cat $(for d in $s; do echo \"$d/network.jsonl\"; done) 2>/dev/null",
        ),
        T,
    );
    assert!(out.stdout.contains("allowed=200"), "{out}");
    assert!(out.stdout.contains("denied=56"), "curl reports the refused CONNECT\n{out}");
    assert!(out.stdout.contains("dns=2"), "a denied name does not resolve\n{out}");
    assert!(out.stdout.contains("\"decision\":\"allow\"") && out.stdout.contains("\"decision\":\"deny\""), "{out}");
}

#[test]
fn npm_install_works_through_the_proxy() {
    let Some(rig) = rig::require("npm_install_works_through_the_proxy") else { return };
    let out = rig.sh(
        &script(
            "$S run --policy npm -- npm install --no-audit --no-fund --loglevel=error is-number@7.0.0; echo \"npm=$?\"
             $S apply >/dev/null; echo \"apply=$?\"
             cat node_modules/is-number/package.json | grep '\"version\"'",
        ),
        T,
    );
    assert!(out.stdout.contains("npm=0"), "{out}");
    assert!(out.stdout.contains("apply=0"), "{out}");
    assert!(out.stdout.contains("\"version\": \"7.0.0\""), "{out}");
}

#[test]
fn a_credential_never_enters_the_guest() {
    let Some(rig) = rig::require("a_credential_never_enters_the_guest") else { return };
    let out = rig.sh(
        &script(
            "cat > secret.toml <<'TOML'
[[credential]]
host = \"api.example.org\"
header = \"authorization\"
value = { env = \"STOCKADE_TEST_SECRET\" }
format = \"Bearer {}\"
TOML
             export STOCKADE_TEST_SECRET=hunter2-very-secret
             $S run --policy ./secret.toml -e STOCKADE_TEST_SECRET -- sh -c '
                 echo \"guest-sees=$STOCKADE_TEST_SECRET\"
                 grep -rs hunter2 /proc/*/environ /run /tmp \"$HOME\" | wc -l'",
        ),
        T,
    );
    assert!(!out.stdout.contains("hunter2"), "the secret reached the guest\n{out}");
    assert!(out.stdout.contains("guest-sees=") && out.stdout.contains("\n0\n"), "{out}");
}
