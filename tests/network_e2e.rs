//! The guest's network end to end: only the policy's hosts are reachable,
//! through the host's proxy, and secrets stay on the host. Uses the real
//! registries through the rig's user-mode network.

use crate::rig;
use crate::run_e2e::{LEAKS, T, script};

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
fn a_learned_policy_lets_the_denied_run_pass() {
    let Some(rig) = rig::require("a_learned_policy_lets_the_denied_run_pass") else { return };
    let out = rig.sh(
        &script(
            "$S run -- curl -sS -o /dev/null https://index.crates.io/config.json; echo \"denied=$?\"
             $S policy learn --output learned.toml; echo \"learn=$?\"
             cat learned.toml
             $S policy check learned.toml; echo \"check=$?\"
             $S run --policy ./learned.toml -- \\
                 curl -sS -o /dev/null -w 'allowed=%{http_code}\\n' https://index.crates.io/config.json",
        ),
        T,
    );
    assert!(out.stdout.contains("denied=56"), "the first run is refused\n{out}");
    assert!(
        out.stderr.contains("stockade: the policy refused index.crates.io:443 (`stockade log --denied`"),
        "the run names what it refused and how to learn from it\n{out}"
    );
    assert!(out.stdout.contains("learn=0") && out.stdout.contains("check=0"), "{out}");
    assert!(out.stdout.contains("\"index.crates.io\", # "), "the learned rule names the host exactly\n{out}");
    assert!(out.stdout.contains("allowed=200"), "the learned policy lets the same command through\n{out}");
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
    // The secret goes into the guest's command line (not searched) as the
    // pattern to look for everywhere else.
    let out = rig.sh(
        &script(&format!(
            r#"cat > secret.toml <<'TOML'
[[credential]]
host = "api.example.org"
header = "authorization"
value = {{ env = "STOCKADE_TEST_SECRET" }}
format = "Bearer {{}}"
TOML
             export STOCKADE_TEST_SECRET="sekrit-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
             $S run --policy ./secret.toml -e STOCKADE_TEST_SECRET -- sh -c '{LEAKS}
                 echo guest-sees=$STOCKADE_TEST_SECRET
                 leaks '"$STOCKADE_TEST_SECRET"' | wc -l'"#
        )),
        T,
    );
    // A fresh random value: a fixed word turns up in shared toolchains' docs.
    assert!(!out.stdout.contains("sekrit-"), "the secret reached the guest\n{out}");
    assert!(out.stdout.contains("guest-sees=") && out.stdout.contains("\n0\n"), "{out}");
}

/// Shell lines that make a test CA, a certificate for api.test signed by
/// it, and start (not yet run) server.py: an HTTPS server on `bind`:8443
/// that answers "ok" and appends each request's headers to the file named
/// by its first argument. The script continues on the next line.
pub(crate) fn https_test_server(bind: &str) -> String {
    test_certificate("api.test")
        + &r#"             cat > server.py <<'PY'
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as log:
            log.write("".join("%s: %s\n" % kv for kv in self.headers.items()))
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok\n")
    def log_message(self, *a): pass
s = http.server.HTTPServer((BIND, 8443), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain("srv.pem", "srv.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
PY
"#
        .replace("BIND", &format!("\"{bind}\""))
}

/// Shell lines writing p.toml: a policy that lets `host`:8443 resolve to the
/// private address `addr` and has the proxy add `Bearer $env` as its
/// authorization header.
pub(crate) fn credential_policy(host: &str, addr: &str, env: &str) -> String {
    format!(
        r#"cat > p.toml <<TOML
[network]
allow_private = ["{host}:8443"]
[network.hosts]
"{host}" = "{addr}"
[[credential]]
host = "{host}:8443"
header = "authorization"
value = {{ env = "{env}" }}
format = "Bearer {{}}"
TOML
"#
    )
}

/// Shell lines that make a test CA (ca.pem) and a certificate for `name`
/// signed by it (srv.pem, srv.key).
pub(crate) fn test_certificate(name: &str) -> String {
    format!(
        r#"openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca 2>/dev/null
             openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN={name} 2>/dev/null
             printf 'subjectAltName=DNS:{name}\n' > ext
             openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 1 -extfile ext 2>/dev/null
"#
    )
}

#[test]
fn a_credential_is_injected_only_for_its_host() {
    let Some(rig) = rig::require("a_credential_is_injected_only_for_its_host") else { return };
    let out = rig.sh(
        &script(
            &[
                https_test_server("127.0.0.1").as_str(),
                r#"             python3 server.py "$ws/headers.log" & server=$!
"#,
                credential_policy("api.test", "127.0.0.1", "TEST_SECRET").as_str(),
                r#"             sleep 1
             SSL_CERT_FILE="$ws/ca.pem" TEST_SECRET=s3cr3t-token $S run --policy ./p.toml -e TEST_SECRET -- sh -c '
                 curl -sS -H "Authorization: Bearer forged-by-guest" https://api.test:8443/x
                 echo "guest-env=$TEST_SECRET"'
             echo "run=$?"
             kill $server
             echo "--- headers"; cat headers.log"#,
            ]
            .concat(),
        ),
        T,
    );
    assert!(out.stdout.contains("ok\nguest-env="), "{out}");
    assert!(out.stdout.contains("run=0"), "{out}");
    let headers = out.stdout.split("--- headers").nth(1).unwrap_or_default().to_ascii_lowercase();
    assert!(headers.contains("authorization: bearer s3cr3t-token"), "the proxy must add the credential\n{out}");
    assert!(!headers.contains("forged-by-guest"), "the guest's own header must be stripped\n{out}");
    let guest_part = out.stdout.split("--- headers").next().unwrap_or_default();
    assert!(!guest_part.contains("s3cr3t-token"), "the secret reached the guest\n{out}");
}

#[test]
fn policy_mounts_and_cargo_fetch_through_the_proxy() {
    let Some(rig) = rig::require("policy_mounts_and_cargo_fetch_through_the_proxy") else { return };
    let out = rig.sh(
        &script(
            r#"mkdir -p "$HOME/rw-$$" "$HOME/ov-$$"; echo keep > "$HOME/ov-$$/k"
             cat > mounts.toml <<TOML
[mounts]
"~/.cargo/bin" = "ro"
"~/.rustup" = "ro"
"~/rw-$$" = "rw"
"~/ov-$$" = "overlay"
TOML
             printf '[package]\nname = "t"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\nitoa = "=1.0.11"\n' > Cargo.toml
             mkdir src; echo 'fn main() {}' > src/main.rs
             $S run --apply=all --policy cargo --policy ./mounts.toml -- sh -c "
                 echo guest > ~/rw-$$/new; echo guest > ~/ov-$$/new; cat ~/ov-$$/k
                 echo x > ~/.cargo/bin/nope 2>/dev/null || echo ro-refused
                 cargo fetch -q; echo fetch=\$?"
             echo "run=$?"
             cat "$HOME/rw-$$/new"; test -e "$HOME/ov-$$/new" && echo ov-leaked || echo ov-kept
             grep -c 'name = "itoa"' Cargo.lock"#,
        ),
        T,
    );
    assert!(out.stdout.contains("keep\nro-refused\nfetch=0\nrun=0"), "{out}");
    assert!(out.stdout.contains("guest\nov-kept\n1"), "rw reaches the host, overlay does not\n{out}");
}

/// A real guest's curl against a credential rule limited to GET under
/// /repos/ and a path deny rule on the same host: the credential is written
/// only inside the scope (not for a `..` spelt as escapes), the denied path
/// is refused however it is spelt, and the server never sees the guest's
/// placeholder.
#[test]
fn a_credential_is_written_only_in_its_scope_and_denied_paths_are_refused() {
    let Some(rig) = rig::require("a_credential_is_written_only_in_its_scope_and_denied_paths_are_refused") else {
        return;
    };
    let out = rig.sh(
        &script(
            &[
                test_certificate("api.test").as_str(),
                r#"             cat > server.py <<'PY'
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as log:
            log.write("=== %s %s\n" % (self.command, self.path))
            log.write("".join("%s: %s\n" % kv for kv in self.headers.items()))
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok\n")
    do_POST = do_GET
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 8443), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain("srv.pem", "srv.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
PY
             python3 server.py "$ws/requests.log" & server=$!
             cat > p.toml <<'TOML'
[network]
allow_private = ["api.test:8443"]
deny = ["api.test:8443/user/keys"]
[network.hosts]
"api.test" = "127.0.0.1"
[[credential]]
host = "api.test:8443"
header = "authorization"
value = { env = "TEST_SECRET" }
format = "Bearer {}"
methods = ["GET"]
paths = ["/repos/"]
TOML
             sleep 1
             SSL_CERT_FILE="$ws/ca.pem" TEST_SECRET=s3cr3t-token $S run --policy ./p.toml -- sh -c '
                 curl -sS -H "Authorization: Bearer $TEST_SECRET" https://api.test:8443/repos/o/r
                 curl -sS --path-as-is -H "Authorization: Bearer $TEST_SECRET" https://api.test:8443/repos/%2e%2e/user
                 curl -sS -X POST -H "Authorization: Bearer $TEST_SECRET" https://api.test:8443/repos/o/r/issues
                 curl -sS --path-as-is -w "denied=%{http_code}\n" -X POST https://api.test:8443/x/../user/%6beys'
             echo "run=$?"
             kill $server
             echo "--- requests"; cat requests.log"#,
            ]
            .concat(),
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(
        out.stdout.contains("blocked POST api.test:8443/x/../user/%6beys") && out.stdout.contains("denied=403"),
        "{out}"
    );
    let log = out.stdout.split("--- requests").nth(1).unwrap_or_default().to_ascii_lowercase();
    let request = |line: &str| {
        log.split("=== ")
            .find(|r| r.starts_with(line))
            .unwrap_or_else(|| panic!("no request {line}\n{out}"))
            .to_string()
    };
    assert!(request("get /repos/o/r\n").contains("authorization: bearer s3cr3t-token"), "{out}");
    for outside in ["get /repos/%2e%2e/user\n", "post /repos/o/r/issues\n"] {
        assert!(!request(outside).contains("authorization"), "{outside} got a credential or the placeholder\n{out}");
    }
    assert!(!log.contains("keys"), "the denied path reached the server\n{out}");
    assert!(!log.contains("stockade-placeholder"), "the guest's placeholder reached the server\n{out}");
}
