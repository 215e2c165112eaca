//! Coding agents and home toolchains end to end, with the real programs:
//! Claude Code and the Codex CLI installed from the npm registry into a
//! prefix in the home directory, node and npm in an nvm-style tree there,
//! cargo through the host's rustup (tests/agents/install.sh prepares the
//! first two; tests/run.sh exports where). Only the providers' APIs are
//! fakes (tests/agents/fake_api.py), reached through the proxy.

use crate::network_e2e::test_certificate;
use crate::rig;
use crate::run_e2e::{LEAKS, script};
use std::time::Duration;

/// Two or three guests per script, one of them compiling a crate or
/// loading a 245 MB agent binary on a software CPU.
const T: Duration = Duration::from_secs(600);

/// The node version install.sh put in its nvm tree: this host's.
fn node_version() -> String {
    let out = std::process::Command::new("node").arg("--version").output().expect("node is installed by tests/run.sh");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Where tests/agents/install.sh installed the CLIs, or why there is none.
fn agent_clis(test: &str) -> Option<String> {
    match std::env::var("STOCKADE_TEST_AGENTS") {
        Ok(dir) if std::path::Path::new(&dir).join("npm-global/bin/claude").exists() => Some(dir),
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: STOCKADE_TEST_AGENTS is not set; tests/run.sh sets it from tests/agents/install.sh")
        }
        _ => {
            eprintln!("skipping {test}: set STOCKADE_TEST_AGENTS=$(tests/agents/install.sh) to run it");
            None
        }
    }
}

/// Shell lines putting the home-installed node and agent CLIs first on PATH.
fn agent_path(agents: &str) -> String {
    format!(
        "A={agents}\n             export PATH=\"$A/nvm/versions/node/{node}/bin:$A/npm-global/bin:$PATH\"\n",
        node = node_version()
    )
}

/// Shell lines starting the fake API of `flavor` on api.test:8443 (its log,
/// holding the real keys, in $ws.api.log: outside the workspace the guest sees), writing `path` when the agent follows its instructions, and a
/// policy p.toml that lets the guest reach it, with a credential rule when
/// given: (header, format, the host variable holding the key).
fn fake_api(flavor: &str, path: &str, credential: Option<(&str, &str, &str)>) -> String {
    // Written into the workspace: L1 does not see a checkout under /tmp.
    let fake = include_str!("agents/fake_api.py");
    let rule = credential
        .map(|(header, format, env)| {
            format!("[[credential]]\nhost = \"api.test:8443\"\nheader = \"{header}\"\nvalue = {{ env = \"{env}\" }}\nformat = \"{format}\"\n")
        })
        .unwrap_or_default();
    test_certificate("api.test")
        + &format!(
            r#"             cat > "$ws.fake_api.py" <<'FAKE_API_PY'
{fake}
FAKE_API_PY
             python3 "$ws.fake_api.py" --cert srv.pem --key srv.key --port 8443 --log "$ws.api.log" \
                 --flavor {flavor} --write-path "{path}" --write-content 'written by the agent' 2>fake.err & fake=$!
             trap 'kill $fake 2>/dev/null; diagnose' EXIT
             cat > p.toml <<TOML
[network]
allow_private = ["api.test:8443"]
[network.hosts]
"api.test" = "127.0.0.1"
{rule}TOML
             for i in $(seq 60); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8443), 1)' 2>/dev/null && break; sleep 0.5; done
"#,
        )
}

#[test]
fn agents_and_home_toolchains_are_found_without_mounts() {
    let Some(rig) = rig::require("agents_and_home_toolchains_are_found_without_mounts") else { return };
    let Some(agents) = agent_clis("agents_and_home_toolchains_are_found_without_mounts") else { return };
    let out = rig.sh(
        &script(
            &[
                agent_path(&agents).as_str(),
                r#"             $S run -v --policy claude -- claude --version 2>run.err; echo "claude=$?"
             grep -c 'home toolchain shared read-only: .*npm-global' run.err
             $S run --policy codex -- codex --version; echo "codex=$?"
             $S run --apply all --policy npm -e NPM_CONFIG_CAFILE=/etc/ssl/certs/ca-certificates.crt -- sh -c 'command -v npm; npm install --no-audit --no-fund --loglevel=error is-number@7.0.0'; echo "npm=$?"
             grep '"version"' node_modules/is-number/package.json
             rm -rf node_modules package.json package-lock.json
             printf '[package]\nname = "t"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\nitoa = "=1.0.11"\n' > Cargo.toml
             mkdir src; echo 'fn main() { println!("{}", itoa::Buffer::new().format(42)); }' > src/main.rs
             $S run --apply none --policy cargo -- sh -c 'command -v cargo; cargo run -q'; echo "cargo=$?"
             $S run --no-home-tools -- cargo --version 2>nohome.err; echo "nohome=$?"
             cat nohome.err"#,
            ]
            .concat().replace("{LEAKS}", LEAKS),
        ),
        T,
    );
    let nvm_npm = format!("/nvm/versions/node/{}/bin/npm\n", node_version());
    assert!(out.stdout.contains("(Claude Code)\nclaude=0\n1\n"), "claude from an npm home prefix\n{out}");
    assert!(out.stdout.contains("codex-cli ") && out.stdout.contains("codex=0"), "{out}");
    assert!(out.stdout.contains(&nvm_npm) && out.stdout.contains("npm=0"), "npm from nvm\n{out}");
    assert!(out.stdout.contains("\"version\": \"7.0.0\""), "{out}");
    assert!(out.stdout.contains("/root/.cargo/bin/cargo\n42\ncargo=0"), "cargo on the home rustup\n{out}");
    assert!(out.stdout.contains("nohome=127"), "{out}");
    assert!(
        out.stdout.contains("cargo is ~/.cargo/bin/cargo on this host") && out.stdout.contains("--no-home-tools"),
        "{out}"
    );
}

#[test]
fn claude_code_edits_with_the_key_on_the_host_and_its_hooks_stay_in_the_sandbox() {
    let name = "claude_code_edits_with_the_key_on_the_host_and_its_hooks_stay_in_the_sandbox";
    let Some(rig) = rig::require(name) else { return };
    let Some(agents) = agent_clis(name) else { return };
    let out = rig.sh(
        &script(
            &[
                agent_path(&agents).as_str(),
                "             git init -q .; echo base > README; git add README; git -c user.name=t -c user.email=t@t commit -qm base\n",
                fake_api("anthropic", "$ws/hello.txt", Some(("x-api-key", "{}", "ANTHROPIC_API_KEY"))).as_str(),
                r#"             export STOCKADE_DATA_DIR="$ws.data" SSL_CERT_FILE="$ws/ca.pem"
             export ANTHROPIC_API_KEY=sk-ant-api03-real-host-key CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1
             before=$(cat "$HOME/.claude/settings.json" 2>/dev/null | sha256sum)
             $S run --memory 1G --apply none --policy claude --policy ./p.toml -e ANTHROPIC_BASE_URL=https://api.test:8443 -- sh -c '
                 claude -p "Create hello.txt" --permission-mode acceptEdits < /dev/null; echo "agent=$?"
                 echo "guest-key=$ANTHROPIC_API_KEY"
                 {LEAKS}
                 echo "found=[$(leaks sk-ant-api03-rea[l] /proc/[0-9]*/cmdline)]"'
             echo "run=$?"
             test -e hello.txt && echo leaked || echo not-applied
             $S diff --stat 2>&1 | grep -c hello.txt
             grep -q '"x-api-key": "sk-ant-api03-real-host-key"' "$ws.api.log" && echo key-upstream
             kill $fake; wait $fake 2>/dev/null
"#,
                // The same agent, told to add a hook to its own settings.
                fake_api("anthropic", "$HOME/.claude/settings.json", Some(("x-api-key", "{}", "ANTHROPIC_API_KEY")))
                    .replace("cat > p.toml", "cat > p2.toml")
                    .as_str(),
                r#"             $S run --memory 1G --apply none --policy claude --policy ./p2.toml -e ANTHROPIC_BASE_URL=https://api.test:8443 -e IS_SANDBOX=1 -- sh -c '
                 claude -p "Add a Stop hook" --dangerously-skip-permissions < /dev/null >/dev/null; echo "hook-agent=$?"
                 cat "$HOME/.claude/settings.json"; echo' 2>hook.err
             cat hook.err
             home=$($S sessions 2>/dev/null | awk '/settings of agent/ {print $1; exit}')
             $S diff --stat "$home" 2>&1 | grep -o 'coding agent settings' | head -n1
             after=$(cat "$HOME/.claude/settings.json" 2>/dev/null | sha256sum)
             test "$before" = "$after" && echo host-settings-unchanged
             cat "$STOCKADE_DATA_DIR/agents/claude/home/.claude/settings.json"; echo"#,
            ]
            .concat().replace("{LEAKS}", LEAKS),
        ),
        T,
    );
    assert!(out.stdout.contains("agent=0\nguest-key=stockade-placeholder\nfound=[]\nrun=0"), "{out}");
    assert!(
        out.stdout.contains("not-applied\n1\nkey-upstream\n"),
        "staged for review, the real key reached the API\n{out}"
    );
    assert!(out.stdout.contains("hook-agent=0\nwritten by the agent"), "{out}");
    assert!(out.stdout.contains("agent claude changed ~/.claude/settings.json in the sandbox"), "{out}");
    assert!(out.stdout.contains("review it:"), "{out}");
    assert!(
        out.stdout.contains("coding agent settings\nhost-settings-unchanged\nwritten by the agent"),
        "offered for review, flagged, not applied\n{out}"
    );
}

#[test]
fn codex_edits_with_the_key_on_the_host() {
    let Some(rig) = rig::require("codex_edits_with_the_key_on_the_host") else { return };
    let Some(agents) = agent_clis("codex_edits_with_the_key_on_the_host") else { return };
    let out = rig.sh(
        &script(
            &[
                agent_path(&agents).as_str(),
                fake_api("openai", "hello.txt", Some(("authorization", "Bearer {}", "OPENAI_API_KEY"))).as_str(),
                r#"             export STOCKADE_DATA_DIR="$ws.data" SSL_CERT_FILE="$ws/ca.pem" OPENAI_API_KEY=sk-proj-real-host-key
             $S run --memory 1G --apply none --policy codex --policy ./p.toml -- sh -c '
                 codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -m gpt-5.5 \
                     -c model_provider=fake -c model_providers.fake.name="\"fake\"" \
                     -c model_providers.fake.base_url="\"https://api.test:8443/v1\"" \
                     -c model_providers.fake.env_key="\"OPENAI_API_KEY\"" -c model_providers.fake.wire_api="\"responses\"" \
                     -c analytics.enabled=false -c check_for_update_on_startup=false --disable plugins \
                     "Create hello.txt" < /dev/null > codex.out 2>&1; echo "agent=$?"
                 {LEAKS}
                 echo "found=[$(leaks sk-proj-rea[l] /proc/[0-9]*/cmdline)]"'
             echo "run=$?"
             test -e hello.txt && echo leaked || echo not-applied
             $S diff --stat 2>&1 | grep -c hello.txt
             grep -q '"authorization": "Bearer sk-proj-real-host-key"' "$ws.api.log" && echo key-upstream"#,
            ]
            .concat().replace("{LEAKS}", LEAKS),
        ),
        T,
    );
    assert!(out.stdout.contains("agent=0\nfound=[]\nrun=0\nnot-applied\n1\nkey-upstream"), "{out}");
}

#[test]
fn a_subscription_token_stays_on_the_host() {
    let Some(rig) = rig::require("a_subscription_token_stays_on_the_host") else { return };
    let Some(agents) = agent_clis("a_subscription_token_stays_on_the_host") else { return };
    let out = rig.sh(
        &script(
            &[
                agent_path(&agents).as_str(),
                fake_api("anthropic", "$ws/hello.txt", None).as_str(),
                // Claude Code reads its sign-in from $CLAUDE_CONFIG_DIR; a
                // directory of the test's own keeps the host's real one out.
                r#"             cfg="$HOME/.stockade-e2e-$$"; mkdir -p "$cfg"
             exp=$(( ($(date +%s) + 3600) * 1000 ))
             printf '{"claudeAiOauth":{"accessToken":"sk-ant-oat01-real-access","refreshToken":"sk-ant-ort01-real-refresh","expiresAt":%s,"scopes":["user:inference"],"subscriptionType":"max"}}\n' "$exp" > "$cfg/.credentials.json"
             echo '{"hasCompletedOnboarding":true}' > "$cfg/.claude.json"
             cat >> p.toml <<TOML
[[signin]]
file = "~/.stockade-e2e-$$/.credentials.json"
tokens = ["claudeAiOauth.accessToken", "claudeAiOauth.refreshToken"]
hosts = ["api.test:8443"]
TOML
             export STOCKADE_DATA_DIR="$ws.data" SSL_CERT_FILE="$ws/ca.pem" CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
             $S run --memory 1G --apply none --policy ./p.toml -e CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC -e ANTHROPIC_BASE_URL=https://api.test:8443 -e CLAUDE_CONFIG_DIR="$cfg" -- sh -c '
                 claude -p "Create hello.txt" --permission-mode acceptEdits < /dev/null; echo "agent=$?"
                 grep -o stockade-signin- "$CLAUDE_CONFIG_DIR/.credentials.json" | wc -l
                 {LEAKS}
                 echo "found=[$(leaks "real-acces[s]\|real-refres[h]" /proc/[0-9]*/cmdline)]"'
             echo "run=$?"
             grep -q '"authorization": "Bearer sk-ant-oat01-real-access"' "$ws.api.log" && echo token-upstream
             rm -rf "$cfg""#,
            ]
            .concat().replace("{LEAKS}", LEAKS),
        ),
        T,
    );
    assert!(
        out.stdout.contains("agent=0\n2\nfound=[]\nrun=0\ntoken-upstream"),
        "placeholders in the guest, the token upstream\n{out}"
    );
}
