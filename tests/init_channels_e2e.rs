//! Only the init speaks for the guest, end to end: a guest process that is
//! not the init tries the init's vsock ports itself.

use crate::rig;
use crate::run_e2e::{T, script};

/// Tries the init's host ports over vsock (CID 2) as an unprivileged
/// process: binding a privileged port and connecting from an ordinary one.
const UNPRIVILEGED_PROBE: &str = r#"
import socket
s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
try:
    s.bind((socket.VMADDR_CID_ANY, 1000))
    print("bind=allowed")
except PermissionError:
    print("bind=refused")
for port in (1024, 1025, 1026):
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        s.connect((2, port))
        s.sendall(b"\0" * 32 + b"STKDCHG\n")
        print(f"port{port}=connected")
    except OSError as e:
        print(f"port{port}=refused errno={e.errno}")
"#;

/// As guest root: a forged change set from a privileged port (without the
/// token, which only PID 1 holds) and a second control connection.
const ROOT_FORGERY: &str = r#"
import socket
def dial(port, local):
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, local))
    s.connect((2, port))
    return s
c = dial(1026, 900)
c.sendall(b"\0" * 32 + b"STKDCHG\n\x01\0\0\0")
c.close()
print("forged=sent")
k = dial(1024, 901)
print("control=connected")
k.close()
"#;

/// As guest root that reads PID 1's memory: finds this boot's token (the
/// run spec the init received, in its heap) and sends a change set with it
/// before the init exports. The init's own stream then arrives second.
const TOKEN_THIEF: &str = r#"
import re, socket
token = None
with open("/proc/1/maps") as maps, open("/proc/1/mem", "rb") as mem:
    for line in maps:
        fields = line.split()
        if "rw" not in fields[1]:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except OSError:
            continue
        m = re.search(rb'"token":"([0-9a-f]{64})"', data)
        if m:
            token = bytes.fromhex(m.group(1).decode())
            break
print("token=" + ("found" if token else "missing"))
s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
s.bind((socket.VMADDR_CID_ANY, 902))
s.connect((2, 1026))
s.sendall(token + b"STKDCHG\n\x02\0\0\0forged")
s.close()
print("forged=sent")
"#;

#[test]
fn an_unprivileged_guest_process_cannot_reach_the_inits_ports() {
    let Some(rig) = rig::require("an_unprivileged_guest_process_cannot_reach_the_inits_ports") else { return };
    let out = rig.sh(
        &script(&format!(
            "cat > probe.py <<'EOF'\n{UNPRIVILEGED_PROBE}\nEOF
             $S run --ci --summary s.json -- sh -c 'cp probe.py /tmp/p.py; chmod 644 /tmp/p.py
                 (cd /tmp && setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 /tmp/p.py)
                 echo made > real.txt'
             echo \"run=$?\"
             $S diff --stat; echo \"stat=$?\"
             cat s.json",
        )),
        T,
    );
    assert!(out.stdout.contains("bind=refused"), "only CAP_NET_BIND_SERVICE binds below 1024\n{out}");
    for port in [1024, 1025, 1026] {
        assert!(out.stdout.contains(&format!("port{port}=refused")), "port {port} must be refused\n{out}");
    }
    assert!(out.stdout.contains("run=125"), "the attempt fails --ci\n{out}");
    for port in ["control", "stdin", "change"] {
        let report = format!("tried to connect to the {port} port from an unprivileged port; the VMM refused it");
        assert!(out.stdout.contains(&report), "the summary names it\n{out}");
    }
    assert!(
        out.stderr.contains("real.txt") || out.stdout.contains("real.txt"),
        "the command's change is staged\n{out}"
    );
}

#[test]
fn a_forged_change_set_from_guest_root_is_reported_and_the_real_one_staged() {
    let Some(rig) = rig::require("a_forged_change_set_from_guest_root_is_reported") else { return };
    let out = rig.sh(
        &script(&format!(
            "cat > forge.py <<'EOF'\n{ROOT_FORGERY}\nEOF
             $S run --ci --summary s.json -- sh -c '/usr/bin/python3 forge.py; echo made > real.txt'
             echo \"run=$?\"
             $S diff --stat; echo \"stat=$?\"
             cat s.json",
        )),
        T,
    );
    assert!(out.stdout.contains("forged=sent") && out.stdout.contains("control=connected"), "{out}");
    assert!(out.stdout.contains("run=125"), "--ci fails a run whose guest forged the init's channels\n{out}");
    assert!(out.stderr.contains("the guest tampered with the init's channels"), "a clear warning line\n{out}");
    assert!(out.stdout.contains("change port without this run's token was refused"), "in the summary\n{out}");
    assert!(out.stdout.contains("a second connection to the control port was refused"), "{out}");
    assert!(out.stdout.contains("\"status\":\"error\""), "{out}");
    assert!(out.stdout.contains("stat=0"), "{out}");
    assert!(
        out.stderr.contains("real.txt") || out.stdout.contains("real.txt"),
        "the command's change is staged\n{out}"
    );
}

#[test]
fn a_guest_root_that_steals_the_token_and_sends_first_cannot_make_the_inits_changes_vanish() {
    let Some(rig) = rig::require("a_guest_root_that_steals_the_token_and_sends_first") else { return };
    let out = rig.sh(
        &script(&format!(
            "cat > thief.py <<'EOF'\n{TOKEN_THIEF}\nEOF
             $S run --ci --summary s.json -- sh -c '/usr/bin/python3 thief.py; echo made > real.txt'
             echo \"run=$?\"
             $S diff --stat; echo \"stat=$?\"
             cat s.json",
        )),
        T,
    );
    assert!(out.stdout.contains("token=found") && out.stdout.contains("forged=sent"), "the attack ran\n{out}");
    assert!(out.stdout.contains("run=125"), "--ci fails a run whose guest forged a change connection\n{out}");
    assert!(out.stdout.contains("a second change connection with this run's token arrived"), "reported\n{out}");
    assert!(out.stdout.contains("stat=0"), "{out}");
    assert!(
        out.stderr.contains("real.txt") || out.stdout.contains("real.txt"),
        "the init's change is staged, not the forger's\n{out}"
    );
}
