//! The guest's root in host mode (rootfs/host.toml): generated identity
//! and network files cover the host's, and the host's secrets under shared
//! directories are hidden.

use crate::rig;
use crate::run_e2e::{T, script};

#[test]
fn the_guest_has_its_own_identity_and_not_the_hosts_secrets() {
    let Some(rig) = rig::require("the_guest_has_its_own_identity_and_not_the_hosts_secrets") else { return };
    let out = rig.sh(
        &script(
            r#"mkdir -p /etc/ssh && echo HOST-PRIVATE-KEY > /etc/ssh/ssh_host_test_key && touch /etc/ssh/ssh_config
             $S run -- sh -c 'cat /etc/hostname; hostname
                 echo "guest-id=$(cat /etc/machine-id)"
                 echo "key=$(cat /etc/ssh/ssh_host_test_key 2>&1)"
                 echo "via-share=$(cat /.stockade/host/etc/ssh/ssh_host_test_key 2>&1)"
                 echo "host-passwd=$(cat /.stockade/host/etc/passwd 2>&1 | head -c 60)"
                 echo "host-machine-id=$(cat /.stockade/host/etc/machine-id 2>&1)"
                 echo "shadow=$(cat /etc/shadow 2>&1 | head -c 40)"
                 echo "me=$(id -un)"
                 echo "accounts=$(cut -d: -f1 /etc/passwd | tr "\n" " ")"
                 test -e /etc/ssh/ssh_config && echo "ssh-config=kept"'
             echo "run=$?"
             echo "host-id=$(cat /etc/machine-id)"
             rm -f /etc/ssh/ssh_host_test_key
             host_roots=$(grep -c "BEGIN CERTIFICATE" /etc/ssl/certs/ca-certificates.crt)
             printf '[[credential]]\nhost = "api.example.org"\nheader = "x-token"\nvalue = { env = "STOCKADE_T" }\n' > cred.toml
             STOCKADE_T=t $S run --policy ./cred.toml -- sh -c '
                 grep nameserver /etc/resolv.conf
                 echo "guest-roots=$(grep -c "BEGIN CERTIFICATE" /etc/ssl/certs/ca-certificates.crt) host-roots='$host_roots'"
                 head -n "$(wc -l < /run/stockade/ca.pem)" /etc/ssl/certs/ca-certificates.crt | cmp -s - /run/stockade/ca.pem && echo "ca=first"
                 echo "cert-file=$SSL_CERT_FILE"'"#,
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.starts_with("stockade\nstockade\n"), "hostname file and kernel hostname\n{out}");
    let field = |key: &str| out.stdout.split(key).nth(1).and_then(|s| s.lines().next()).unwrap_or("").to_string();
    let (guest_id, host_id) = (field("guest-id="), field("host-id="));
    assert_eq!(guest_id.len(), 32, "{out}");
    assert_ne!(guest_id, host_id, "the guest must not carry the host's machine id\n{out}");
    assert!(!out.stdout.contains("HOST-PRIVATE-KEY"), "an ssh host key reached the guest\n{out}");
    assert!(field("via-share=").contains("Permission denied"), "the VMM refuses the secret itself\n{out}");
    assert!(!field("shadow=").contains("root:"), "/etc/shadow reached the guest\n{out}");
    assert!(field("host-passwd=").contains("Permission denied"), "the host's own passwd is refused\n{out}");
    let host_machine_id = field("host-machine-id=");
    assert!(
        host_machine_id.contains("Permission denied") || host_machine_id.contains("No such file"),
        "the host's machine id is refused\n{out}"
    );
    assert!(out.stdout.contains("ssh-config=kept"), "only the secrets are hidden\n{out}");
    assert!(out.stdout.contains("nameserver 10.77.0.1\n"), "names go to the proxy's DNS\n{out}");
    let roots = |key: &str| field(key).split_whitespace().next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0);
    assert!(roots("guest-roots=") > roots("host-roots="), "the system bundle gains the proxy CA\n{out}");
    assert!(out.stdout.contains("ca=first"), "{out}");
    assert_eq!(field("cert-file="), "/run/stockade/ca-bundle.pem", "{out}");
    let me = field("me=");
    let accounts = field("accounts=");
    assert!(accounts.starts_with("root ") && accounts.contains("nobody") && accounts.contains(&me), "{out}");
}
