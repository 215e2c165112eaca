//! Published ports end to end: a dev server in the guest answers the host
//! through `-p`, a published port with nothing behind it is closed and
//! named at the end, and a host port another program holds fails the run
//! before the VM boots.

use crate::rig;
use crate::run_e2e::{T, script};

#[test]
fn a_dev_server_in_the_guest_answers_on_the_published_port() {
    let Some(rig) = rig::require("a_dev_server_in_the_guest_answers_on_the_published_port") else { return };
    let out = rig.sh(
        &script(
            r#"echo 'hello from the guest' > hello.txt
             $S run -p 18080:8000 -p 18081:9 -- sh -c '
                 python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/http.log 2>&1 &
                 until grep -q "GET /hello.txt" /tmp/http.log; do sleep 0.2; done
                 sleep 1' >run.out 2>run.err &
             run=$!
             # Clients that come while the VM boots wait for it, once the
             # run has bound the port (curl's 7: refused, not bound yet).
             for _ in $(seq 300); do
                 curl -sS --max-time 150 http://127.0.0.1:18081/ >/dev/null 2>&1; closed=$?
                 [ "$closed" != 7 ] && break
                 sleep 0.1
             done
             echo "closed=$closed"
             body=
             for _ in $(seq 120); do
                 body=$(curl -sS --max-time 10 http://localhost:18080/hello.txt 2>/dev/null) && [ -n "$body" ] && break
                 sleep 0.5
             done
             echo "body=$body"
             wait $run; echo "run=$?"
             cat run.err
             # SO_REUSEADDR: a connection of an earlier test to the port may
             # still be in TIME_WAIT; the listener is what counts.
             python3 -c 'import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 18082)); s.listen(); time.sleep(120)' &
             busy=$!
             sleep 1
             $S run -p 18082:80 -- true; echo "busy=$?"
             kill $busy"#,
        ),
        T,
    );
    assert!(out.stdout.contains("body=hello from the guest"), "the host reaches the guest's server\n{out}");
    assert!(
        out.stdout.contains("closed=52") || out.stdout.contains("closed=56"),
        "nothing behind 18081: the connection is closed (empty reply or reset), not left hanging\n{out}"
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(
        out.stdout.contains("found nothing listening on guest port 9"),
        "the run names the port nothing answered on\n{out}"
    );
    assert!(out.stdout.contains("busy=125"), "{out}");
    assert!(
        out.stderr.contains(
            "cannot publish localhost:18082 -> guest port 80: another program on this host is listening on \
             127.0.0.1:18082"
        ),
        "{out}"
    );
}

#[test]
fn host_port_reaches_one_host_service_and_not_another() {
    let Some(rig) = rig::require("host_port_reaches_one_host_service_and_not_another") else { return };
    let out = rig.sh(
        &script(
            r#"mkdir served && echo 'from the host' > served/note.txt
             python3 -m http.server 18300 --bind 127.0.0.1 --directory served >/dev/null 2>&1 &
             python3 -m http.server 18301 --bind 127.0.0.1 >/dev/null 2>&1 &
             sleep 1
             $S run --host-port 18300 -- sh -c '
                 curl -sS http://host.stockade.internal:18300/note.txt; echo "proxied=$?"
                 curl -sS --noproxy "*" http://host.stockade.internal:18300/note.txt; echo "transparent=$?"
                 curl -sS -o /dev/null -w "other=%{http_code}\n" http://host.stockade.internal:18301/'
             kill %1 %2
             grep -h host.stockade.internal "$HOME"/.local/share/stockade/sessions/*/network.jsonl"#,
        ),
        T,
    );
    assert!(out.stdout.contains("from the host\nproxied=0"), "through the proxy\n{out}");
    assert!(out.stdout.contains("from the host\ntransparent=0"), "without the proxy, at the gateway\n{out}");
    assert!(out.stdout.contains("other=403"), "a port not given stays closed\n{out}");
    assert!(out.stdout.contains("\"rule\":\"host port 18300 (--host-port)\""), "logged like any flow\n{out}");
}
