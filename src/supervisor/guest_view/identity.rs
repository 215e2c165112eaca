//! The files that give the guest an identity of its own (named by the
//! `generate` entries of rootfs/host.toml): a machine id fresh for each
//! session, a fixed hostname, and account databases holding only root, the
//! user who runs the command, and nobody.

use std::io::Read;
use std::path::PathBuf;

/// Who runs the command in the guest.
#[derive(Debug, Clone)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub name: String,
    pub group: String,
    pub shell: String,
}

impl User {
    /// The user running stockade, as the host's account database has them.
    pub fn current() -> User {
        let uid = nix::unistd::getuid();
        let gid = nix::unistd::getgid();
        let account = nix::unistd::User::from_uid(uid).ok().flatten();
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .or_else(|| account.as_ref().map(|a| a.dir.clone()))
            .unwrap_or_else(|| PathBuf::from("/"));
        let name = account
            .as_ref()
            .map(|a| a.name.clone())
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| format!("user{uid}"));
        let shell = account
            .as_ref()
            .map(|a| a.shell.to_string_lossy().into_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/bin/sh".into());
        let group = nix::unistd::Group::from_gid(gid).ok().flatten().map(|g| g.name).unwrap_or_else(|| name.clone());
        User { uid: uid.as_raw(), gid: gid.as_raw(), home, name, group, shell }
    }
}

pub const HOSTNAME: &str = "stockade";

/// 128 random bits as systemd writes them: 32 lowercase hex digits.
pub fn machine_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{hex}\n"))
}

pub fn hostname() -> String {
    format!("{HOSTNAME}\n")
}

pub fn hosts() -> String {
    format!(
        "127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
    )
}

pub fn passwd(user: &User) -> String {
    let mut text = String::from("root:x:0:0:root:/root:/bin/sh\n");
    if user.uid != 0 {
        text.push_str(&format!("{}:x:{}:{}::{}:{}\n", user.name, user.uid, user.gid, user.home.display(), user.shell));
    }
    text.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    text
}

pub fn group(user: &User) -> String {
    let mut text = String::from("root:x:0:\n");
    if user.gid != 0 && user.gid != 65534 {
        text.push_str(&format!("{}:x:{}:\n", user.group, user.gid));
    }
    text.push_str("nogroup:x:65534:\n");
    text
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn alice() -> User {
        User {
            uid: 1000,
            gid: 1000,
            home: PathBuf::from("/home/alice"),
            name: "alice".into(),
            group: "staff".into(),
            shell: "/bin/bash".into(),
        }
    }

    #[test]
    fn machine_ids_are_fresh_hex() {
        let (a, b) = (machine_id().unwrap(), machine_id().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.trim().len(), 32);
        assert!(a.trim().chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn accounts_hold_root_the_user_and_nobody() {
        let text = passwd(&alice());
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("alice:x:1000:1000::/home/alice:/bin/bash\n"), "{text}");
        assert!(group(&alice()).contains("staff:x:1000:\n"));
        let root = User {
            uid: 0,
            gid: 0,
            home: "/root".into(),
            name: "root".into(),
            group: "root".into(),
            shell: "/bin/sh".into(),
        };
        assert_eq!(passwd(&root).lines().count(), 2);
        assert_eq!(group(&root).lines().count(), 2);
    }
}
