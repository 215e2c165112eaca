//! Transparent networking end to end (issue #8): programs that ignore the
//! proxy variables reach the network only through the same policy, via the
//! guest's eth0 and the VMM's userspace TCP/IP stack. The test servers run
//! on the rig's own address (not loopback, which the guest has too).

use crate::network_e2e::{credential_policy, https_test_server};
use crate::rig;
use crate::run_e2e::{T, script};

/// Starts a plain HTTP server on port 8080 of the rig's address and writes
/// a policy allowing it as local.test; `$addr` is that address.
const LOCAL_SERVER: &str = r#"addr=$(hostname -I | awk '{print $1}')
python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 & server=$!
cat > p.toml <<TOML
[network]
allow_private = ["local.test:8080"]
[network.hosts]
"local.test" = "$addr"
TOML
sleep 1"#;

#[test]
fn programs_ignoring_proxy_variables_are_governed_by_the_policy() {
    let Some(rig) = rig::require("programs_ignoring_proxy_variables_are_governed_by_the_policy") else { return };
    let out = rig.sh(
        &script(&format!(
            r#"{LOCAL_SERVER}
             $S run --policy ./p.toml -- sh -c '
                 curl -sS --max-time 30 --noproxy "*" -o /dev/null -w "curl=%{{http_code}}\n" http://local.test:8080/
                 env -u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy \
                     python3 -c "import urllib.request as u; print(\"python=%d\" % u.urlopen(\"http://local.test:8080/\", timeout=30).status)"
                 node -e "fetch(\"http://local.test:8080/\").then(r => console.log(\"node=\" + r.status), e => console.log(\"node-error=\" + e.cause))"
                 curl -sS --max-time 30 --noproxy "*" -o /dev/null -w "by-address=%{{http_code}}\n" http://'$addr':8080/
                 curl -sS --max-time 30 --noproxy "*" -o /dev/null http://example.com/; echo "denied-name=$?"
                 curl -sS --max-time 30 --noproxy "*" -o /dev/null -w "proxied=%{{http_code}}\n" -x "$HTTP_PROXY" http://local.test:8080/'
             echo "run=$?"
             kill $server
             cat "$(ls -dt "$HOME"/.local/share/stockade/sessions/*/ | head -n 1)/network.jsonl""#
        )),
        T,
    );
    assert!(out.stdout.contains("curl=200"), "curl --noproxy reaches an allowed host\n{out}");
    assert!(out.stdout.contains("python=200"), "a program without proxy variables reaches it\n{out}");
    assert!(out.stdout.contains("node=200"), "node's fetch ignores the proxy variables and still gets there\n{out}");
    assert!(out.stdout.contains("by-address=403"), "an address no DNS answer named is refused\n{out}");
    assert!(out.stdout.contains("denied-name=6"), "a denied name does not even resolve\n{out}");
    assert!(out.stdout.contains("proxied=200"), "the proxy path decides the same\n{out}");
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("\"decision\":\"deny\""), "refusals are audited\n{out}");
}

#[test]
fn denied_names_are_nxdomain_at_once_and_raw_udp_and_icmp_get_nowhere() {
    let Some(rig) = rig::require("denied_names_are_nxdomain_at_once_and_raw_udp_and_icmp_get_nowhere") else {
        return;
    };
    let out = rig.sh(
        &script(
            r#"addr=$(hostname -I | awk '{print $1}')
             python3 -c "
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 9999)); s.settimeout(25)
try:
    s.recvfrom(100); print('udp-arrived')
except socket.timeout:
    print('udp-nothing')
" & listener=$!
             $S run -- sh -c '
                 start=$(date +%s%N); getent hosts denied.example.com; rc=$?; end=$(date +%s%N)
                 echo "nxdomain-rc=$rc ms=$(( (end - start) / 1000000 ))"
                 python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b\"leak\", (\"'$addr'\", 9999))
print(\"sent\")
"'
             wait $listener
             cat > ping.py <<'PY'
import socket, struct, sys
def checksum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
def ping(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(3)
    echo = struct.pack("!BBHHH", 8, 0, 0, 7, 1) + b"stockade"
    s.sendto(echo[:2] + struct.pack("!H", checksum(echo)) + echo[4:], (addr, 0))
    try:
        while True:
            data, src = s.recvfrom(256)
            if src[0] == addr and data[20] == 0:
                return "reply"
    except socket.timeout:
        return "none"
print("ping-gateway=" + ping("10.77.0.1"), "ping-outside=" + ping(sys.argv[1]))
PY
             $S run -- python3 ping.py "$addr""#,
        ),
        T,
    );
    assert!(out.stdout.contains("nxdomain-rc=2"), "{out}");
    assert!(
        out.stdout.contains("ping-gateway=reply ping-outside=none"),
        "the gateway answers pings; an outside address must not seem up\n{out}"
    );
    let ms: u64 = out
        .stdout
        .split("ms=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(ms < 5000, "NXDOMAIN must come at once, took {ms} ms\n{out}");
    assert!(out.stdout.contains("sent") && out.stdout.contains("udp-nothing"), "{out}");
}

#[test]
fn credentials_are_injected_on_the_transparent_path() {
    let Some(rig) = rig::require("credentials_are_injected_on_the_transparent_path") else { return };
    let out = rig.sh(
        &script(
            &[
                r#"addr=$(hostname -I | awk '{print $1}')
             "#,
                https_test_server("0.0.0.0").as_str(),
                r#"             python3 server.py "$ws/headers.log" & server=$!
"#,
                credential_policy("api.test", "$addr", "TEST_SECRET").as_str(),
                r#"             sleep 1
             SSL_CERT_FILE="$ws/ca.pem" TEST_SECRET=s3cr3t-token $S run --policy ./p.toml -e TEST_SECRET -- sh -c '
                 curl -sS --noproxy "*" -H "Authorization: Bearer forged-by-guest" https://api.test:8443/x
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
    assert!(headers.contains("authorization: bearer s3cr3t-token"), "the proxy adds the credential\n{out}");
    assert!(!headers.contains("forged-by-guest"), "the guest's own header is stripped\n{out}");
    let guest_part = out.stdout.split("--- headers").next().unwrap_or_default();
    assert!(!guest_part.contains("s3cr3t-token"), "the secret reached the guest\n{out}");
}

#[test]
fn protocols_that_name_no_site_are_judged_by_the_dns_name() {
    let Some(rig) = rig::require("protocols_that_name_no_site_are_judged_by_the_dns_name") else { return };
    let out = rig.sh(
        &script(
            r#"addr=$(hostname -I | awk '{print $1}')
             cat > servers.py <<'PY'
import socket, threading
def serve(port, greet_first):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen()
    while True:
        c, _ = s.accept()
        if greet_first:
            c.sendall(b"220 greeting\r\n")
        line = c.recv(100)
        c.sendall(b"echo " + line); c.close()
for port, first in [(2525, True), (2222, False), (2626, True)]:
    threading.Thread(target=serve, args=(port, first), daemon=True).start()
threading.Event().wait()
PY
             python3 servers.py & servers=$!
             cat > p.toml <<TOML
[network]
allow_private = ["local.test:2525", "local.test:2222"]
[network.hosts]
"local.test" = "$addr"
TOML
             cat > client.py <<'PY'
import socket
def talk(port, greet_first):
    try:
        c = socket.create_connection(("local.test", port), timeout=20)
        got = c.recv(100) if greet_first else b""
        c.sendall(b"hello\r\n")
        while True:
            more = c.recv(100)
            if not more:
                break
            got += more
        return got.decode().replace("\r\n", "|") or "nothing"
    except OSError as e:
        return "error"
print("greets-first=" + talk(2525, True))
print("speaks-first=" + talk(2222, False))
print("other-port=" + talk(2626, True))
PY
             sleep 1
             $S run --policy ./p.toml -- python3 client.py
             kill $servers"#,
        ),
        T,
    );
    assert!(out.stdout.contains("greets-first=220 greeting|echo hello|"), "a server that greets first\n{out}");
    assert!(out.stdout.contains("speaks-first=echo hello|"), "a client-first protocol that is not HTTP\n{out}");
    let other = out.stdout.split("other-port=").nth(1).and_then(|s| s.lines().next()).unwrap_or("");
    assert!(other == "nothing" || other == "error", "a port no rule allows gets nothing\n{out}");
}
