//! Git over SSH with the key kept on the host: a real sshd in the rig's L1
//! (the "remote"), a real ssh-agent holding the only copy of the key, and
//! real git and ssh in the guest, which get an SSH_AUTH_SOCK relayed to
//! that agent through stockade.

use crate::rig;
use crate::run_e2e::{T, script};

/// Shell lines that start sshd on L1's own address (`$addr`, port 22) with
/// a fresh host key, serving `$d/repo.git` (one commit on main) to the key
/// in `$d/userkey`, which an ssh-agent holds; the host's known_hosts lists
/// the host key for git.test, and p.toml allows git.test:22 at `$addr`.
const REMOTE: &str = r#"d=$(mktemp -d /tmp/sshd.XXXXXX)
             addr=$(hostname -I | awk '{print $1}')
             ssh-keygen -q -t ed25519 -N '' -f $d/hostkey
             ssh-keygen -q -t ed25519 -N '' -f $d/userkey -C stockade-test-key
             cp $d/userkey.pub $d/authorized_keys
             mkdir -p /run/sshd
             printf '%s\n' "Port 22" "ListenAddress $addr" "HostKey $d/hostkey" "AuthorizedKeysFile $d/authorized_keys" \
                 "PermitRootLogin prohibit-password" "PasswordAuthentication no" "KbdInteractiveAuthentication no" \
                 "StrictModes no" "UsePAM no" "PidFile $d/sshd.pid" > $d/sshd_config
             /usr/sbin/sshd -f $d/sshd_config -E $d/sshd.log || echo "sshd failed to start"
             git init -q --bare -b main $d/repo.git
             git clone -q $d/repo.git $d/seed 2>/dev/null
             git -C $d/seed -c user.email=t@t -c user.name=t commit -q --allow-empty -m first-commit
             git -C $d/seed push -q origin HEAD:main
             mkdir -p ~/.ssh
             echo "git.test $(cut -d' ' -f1,2 $d/hostkey.pub)" >> ~/.ssh/known_hosts
             eval "$(ssh-agent -s)" >/dev/null
             ssh-add -q $d/userkey
             printf '[network]\nallow_private = ["git.test:22"]\n[network.hosts]\n"git.test" = "%s"\n' "$addr" > p.toml
"#;

#[test]
fn git_over_ssh_uses_the_hosts_agent_and_never_its_key() {
    let Some(rig) = rig::require("git_over_ssh_uses_the_hosts_agent_and_never_its_key") else { return };
    let out = rig.sh(
        &script(&format!(
            r#"{REMOTE}
             $S run --policy ./p.toml -- sh -c '
                 echo "sock=$SSH_AUTH_SOCK"
                 echo "ssh-dir: $(ls -A ~/.ssh | tr "\n" " ")"
                 ssh-add -l | grep -c stockade-test-key | sed "s/^/listed=/"
                 git clone -q root@git.test:'$d'/repo.git clone; echo "clone=$?"
                 git -C clone log --format=%s
                 git -C clone -c user.email=g@g -c user.name=g commit -q --allow-empty -m from-the-guest
                 git -C clone push -q origin HEAD:main; echo "push=$?"
                 ssh-add -D >/dev/null 2>&1; echo "delete=$?"
                 grep -rl "OPENSSH PRIVATE KEY" ~/.ssh /tmp /run 2>/dev/null | wc -l | sed "s/^/keys-in-guest=/"'
             echo "run=$?"
             echo "remote: $(git -C $d/repo.git log --format=%s main | tr '\n' ' ')"
             $S log | grep -c 'sign.*as root with ssh-ed25519 SHA256:' | sed 's/^/signatures=/'
             ssh-add -l | grep -c stockade-test-key | sed 's/^/still-on-host=/'
             # A server key the host does not know is refused, signature or not.
             ssh-keygen -q -t ed25519 -N '' -f $d/otherkey
             sed -i "s|^git.test .*|git.test $(cut -d' ' -f1,2 $d/otherkey.pub)|" ~/.ssh/known_hosts
             $S run --policy ./p.toml -- git ls-remote root@git.test:$d/repo.git >/dev/null 2>&1; echo "changed-key=$?"
             $S log | grep -c "is not the one the host's known_hosts lists" | sed 's/^/refused=/'
             kill $(cat $d/sshd.pid) $SSH_AGENT_PID"#
        )),
        T,
    );
    assert!(out.stdout.contains("sock=/run/stockade/ssh-agent.sock"), "{out}");
    assert!(out.stdout.contains("listed=1"), "the guest lists the host's key\n{out}");
    assert!(out.stdout.contains("clone=0") && out.stdout.contains("first-commit"), "{out}");
    assert!(out.stdout.contains("push=0"), "{out}");
    assert!(out.stdout.contains("delete=1") || out.stdout.contains("delete=2"), "the guest cannot remove keys\n{out}");
    assert!(out.stdout.contains("keys-in-guest=0"), "{out}");
    assert!(out.stdout.contains("ssh-dir: known_hosts \n"), "the guest's ~/.ssh holds known_hosts alone\n{out}");
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("remote: from-the-guest first-commit"), "{out}");
    assert!(out.stdout.contains("still-on-host=1"), "{out}");
    assert!(!out.stdout.contains("signatures=0"), "every signature is logged\n{out}");
    assert!(!out.stdout.contains("changed-key=0"), "{out}");
    assert!(out.stdout.contains("refused=1"), "{out}");
}
