//! The host's known_hosts files, as OpenSSH reads them: which keys a server
//! may present, matched by plain, wildcard, negated, `[host]:port` or hashed
//! (`|1|salt|hash`, HMAC-SHA1) host patterns. The relay refuses a server
//! whose key they do not list, and the guest gets the lines for the hosts
//! the policy allows, so its own ssh checks the same keys.

use std::path::{Path, PathBuf};

use hmac::{KeyInit, Mac};
use ssh_key::known_hosts::{Entry, HostPatterns, Marker};
use ssh_key::{HashAlg, PublicKey};

use crate::policy::{Host, Port};

/// Where OpenSSH looks by default, user files first.
pub fn default_files(home: Option<&Path>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Some(home) = home {
        files.push(home.join(".ssh/known_hosts"));
        files.push(home.join(".ssh/known_hosts2"));
    }
    files.push(PathBuf::from("/etc/ssh/ssh_known_hosts"));
    files.push(PathBuf::from("/etc/ssh/ssh_known_hosts2"));
    files
}

/// The lines of the files that parse, with their text (missing files and
/// lines of unknown key types are skipped, as ssh skips them).
fn lines(files: &[PathBuf]) -> Vec<(String, Entry)> {
    let mut out = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if let Ok(entry) = trimmed.parse::<Entry>() {
                out.push((trimmed.to_string(), entry));
            }
        }
    }
    out
}

/// How ssh names a server in known_hosts: the bare name on port 22,
/// `[name]:port` elsewhere.
fn lookup_name(host: &Host, port: Port) -> String {
    let name = match host {
        Host::Name(name) => name.clone(),
        Host::Ip(ip) => ip.to_string(),
    };
    if port.get() == 22 { name } else { format!("[{name}]:{}", port.get()) }
}

fn applies(patterns: &HostPatterns, name: &str) -> bool {
    match patterns {
        HostPatterns::Patterns(patterns) => {
            let mut matched = false;
            for pattern in patterns {
                let pattern = pattern.to_ascii_lowercase();
                match pattern.strip_prefix('!') {
                    Some(negated) if glob(negated.as_bytes(), name.as_bytes()) => return false,
                    Some(_) => {}
                    None => matched |= glob(pattern.as_bytes(), name.as_bytes()),
                }
            }
            matched
        }
        HostPatterns::HashedName { salt, hash } => {
            let Ok(mut mac) = hmac::Hmac::<sha1::Sha1>::new_from_slice(salt) else { return false };
            mac.update(name.as_bytes());
            mac.verify_slice(hash).is_ok()
        }
    }
}

/// ssh's `*` and `?` wildcards over a whole name.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && glob(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && glob(rest, &name[1..]),
    }
}

/// Whether `key` is the key of `host`:`port` per the files; the error says
/// what is wrong and what to do about it. As in ssh, every line of every
/// file that names the host counts before a verdict: a key revoked anywhere
/// is refused even when a plain line before the revocation lists it.
pub fn check(files: &[PathBuf], host: &Host, port: Port, key: &PublicKey) -> Result<(), String> {
    let name = lookup_name(host, port);
    let fingerprint = format!("{} {}", key.algorithm(), key.fingerprint(HashAlg::Sha256));
    let entries: Vec<Entry> =
        lines(files).into_iter().map(|(_, entry)| entry).filter(|e| applies(e.host_patterns(), &name)).collect();
    let same = |e: &&Entry| e.public_key().key_data() == key.key_data();
    if entries.iter().filter(|e| e.marker() == Some(&Marker::Revoked)).any(|e| same(&e)) {
        return Err(format!("the SSH host key of {name} ({fingerprint}) is marked @revoked in known_hosts"));
    }
    // Host certificates are not checked: the plain key must be listed.
    let plain: Vec<&Entry> = entries.iter().filter(|e| e.marker().is_none()).collect();
    if plain.iter().any(same) {
        return Ok(());
    }
    let listed = !plain.is_empty();
    if listed {
        Err(format!(
            "the SSH host key of {name} ({fingerprint}) is not the one the host's known_hosts lists: \
             the server changed its key or someone is in the middle; check it with `ssh {name}` on the host"
        ))
    } else {
        Err(format!(
            "the SSH host key of {name} ({fingerprint}) is not in the host's known_hosts; connect once \
             with `ssh {name}` on the host to check and record it, then run again"
        ))
    }
}

/// The known_hosts lines for any of `names` (as the guest's ssh needs them).
pub fn guest_file(files: &[PathBuf], names: &[(Host, Port)]) -> String {
    let wanted: Vec<String> = names.iter().map(|(host, port)| lookup_name(host, port.to_owned())).collect();
    let mut text = String::from("# stockade: the host's known_hosts lines for the SSH hosts the policy allows\n");
    for (line, entry) in lines(files) {
        if wanted.iter().any(|name| applies(entry.host_patterns(), name)) && !text.contains(&line) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::ssh::transport::tests::keypair;
    use ssh_key::public::KeyData;

    fn key(seed: u8) -> PublicKey {
        PublicKey::new(KeyData::Ed25519(keypair(seed).public), "")
    }

    fn line(patterns: &str, seed: u8) -> String {
        format!("{patterns} {}\n", key(seed).to_openssh().unwrap())
    }

    fn hashed(name: &str, salt: &[u8]) -> String {
        let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(salt).unwrap();
        mac.update(name.as_bytes());
        let hash = mac.finalize().into_bytes().into();
        HostPatterns::HashedName { salt: salt.to_vec(), hash }.to_string()
    }

    fn file(dir: &tempfile::TempDir, text: &str) -> Vec<PathBuf> {
        let path = dir.path().join("known_hosts");
        std::fs::write(&path, text).unwrap();
        vec![path, dir.path().join("missing")]
    }

    fn host(name: &str) -> Host {
        Host::parse(name).unwrap()
    }

    #[test]
    fn a_listed_key_passes_and_others_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let text = [line("github.com,140.82.121.4", 1), line("*.example.com,!bad.example.com", 2)].concat();
        let files = file(&dir, &("# comment\nnot a line\n".to_string() + &text));
        let ssh = Port::new(22).unwrap();
        assert_eq!(check(&files, &host("github.com"), ssh, &key(1)), Ok(()));
        assert!(check(&files, &host("github.com"), ssh, &key(2)).unwrap_err().contains("someone is in the middle"));
        assert!(
            check(&files, &host("gitlab.com"), ssh, &key(1)).unwrap_err().contains("not in the host's known_hosts")
        );
        assert_eq!(check(&files, &host("git.example.com"), ssh, &key(2)), Ok(()));
        assert!(check(&files, &host("bad.example.com"), ssh, &key(2)).is_err(), "a negated pattern");
        let other = Port::new(2222).unwrap();
        assert!(check(&files, &host("github.com"), other, &key(1)).is_err(), "another port is another name");
    }

    #[test]
    fn hashed_ports_and_revoked_entries_count() {
        let dir = tempfile::tempdir().unwrap();
        let text = [
            line(&hashed("git.test", b"salt-one-20-bytes!!!"), 1),
            line("[git.test]:2222", 2),
            format!("@revoked * {}\n", key(3).to_openssh().unwrap()),
        ]
        .concat();
        let files = file(&dir, &text);
        assert_eq!(check(&files, &host("git.test"), Port::new(22).unwrap(), &key(1)), Ok(()));
        assert_eq!(check(&files, &host("git.test"), Port::new(2222).unwrap(), &key(2)), Ok(()));
        assert!(check(&files, &host("git.test"), Port::new(22).unwrap(), &key(3)).unwrap_err().contains("@revoked"));
    }

    #[test]
    fn a_revoked_key_is_refused_wherever_its_line_is() {
        let dir = tempfile::tempdir().unwrap();
        let revoked = |patterns: &str| format!("@revoked {patterns} {}\n", key(1).to_openssh().unwrap());
        let ssh = Port::new(22).unwrap();
        let other = Port::new(2222).unwrap();
        // The plain line first, in the same file: still revoked.
        for text in [
            [line("git.test", 1), revoked("*")].concat(),
            [line("git.test", 1), revoked("git.test")].concat(),
            [line(&hashed("git.test", b"salt-one-20-bytes!!!"), 1), revoked("*.test")].concat(),
            [line("*.test,!other.test", 1), revoked(&hashed("git.test", b"another-salt-20-byte"))].concat(),
        ] {
            let files = file(&dir, &text);
            let refused = check(&files, &host("git.test"), ssh, &key(1));
            assert!(refused.as_ref().unwrap_err().contains("@revoked"), "{text}: {refused:?}");
        }
        let files = file(&dir, &[line("[git.test]:2222", 1), revoked("[git.test]:*")].concat());
        assert!(check(&files, &host("git.test"), other, &key(1)).unwrap_err().contains("@revoked"));
        // The plain line in the user's file, the revocation in a later file.
        let user = dir.path().join("user_known_hosts");
        let system = dir.path().join("system_known_hosts");
        std::fs::write(&user, line("git.test", 1)).unwrap();
        std::fs::write(&system, revoked("*")).unwrap();
        let refused = check(&[user.clone(), system.clone()], &host("git.test"), ssh, &key(1));
        assert!(refused.unwrap_err().contains("@revoked"));
        // A revocation for other hosts only leaves this one's key alone, as in ssh.
        std::fs::write(&system, revoked("*,!git.test")).unwrap();
        assert_eq!(check(&[user.clone(), system.clone()], &host("git.test"), ssh, &key(1)), Ok(()));
        // A certificate authority line never stands in for the plain key,
        // whatever its place.
        let ca = format!("@cert-authority * {}\n", key(1).to_openssh().unwrap());
        for text in [ca.clone(), [ca.clone(), line("git.test", 2)].concat(), [line("git.test", 2), ca].concat()] {
            let files = file(&dir, &text);
            assert!(check(&files, &host("git.test"), ssh, &key(1)).is_err(), "{text}");
        }
        // A negation wins over a match before or after it on the line.
        for patterns in ["!git.test,*.test", "*.test,!git.test", "git.test,!git.test"] {
            let files = file(&dir, &line(patterns, 1));
            assert!(check(&files, &host("git.test"), ssh, &key(1)).is_err(), "{patterns}");
        }
    }

    #[test]
    fn the_guest_gets_only_the_lines_of_the_allowed_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let hashed_line = line(&hashed("git.test", b"0123456789abcdefghij"), 1);
        let files = file(&dir, &[hashed_line.clone(), line("elsewhere.test", 2)].concat());
        let text = guest_file(&files, &[(host("git.test"), Port::new(22).unwrap())]);
        assert!(text.contains(hashed_line.trim()), "{text}");
        assert!(!text.contains("elsewhere.test"), "{text}");
    }

    #[test]
    fn wildcards_match_whole_names() {
        assert!(glob(b"*.example.com", b"a.example.com"));
        assert!(!glob(b"*.example.com", b"example.com"));
        assert!(glob(b"git?.test", b"git1.test"));
        assert!(!glob(b"git?.test", b"git.test"));
    }
}
