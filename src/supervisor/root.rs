//! The guest's view of the host in host mode: which host directories are
//! shared read-only, where tmpfs goes, and where the workspace appears.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::protocol::RootEntry;
use crate::vmm::config::ShareConfig;

/// Host directories the guest sees at the same paths, read-only: the user's
/// toolchain runs as-is.
const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc", "/opt"];
/// Inside the virtio-fs filesystem, the workspace lives under this name.
const WORKSPACE_SHARE: &str = "/workspace";
/// The scratch disk as the guest sees it: the only virtio-blk device.
const SCRATCH_DISK: &str = "/dev/vda";

/// Who runs the command in the guest.
#[derive(Debug, Clone)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// The workspace: the git root above `cwd`, or `cwd` itself.
pub fn find_workspace(cwd: &Path, home: &Path) -> anyhow::Result<PathBuf> {
    let root = cwd.ancestors().find(|dir| dir.join(".git").exists()).unwrap_or(cwd).to_path_buf();
    if root == Path::new("/") {
        bail!("refusing to share / as the workspace: run stockade from a project directory");
    }
    if root == home {
        bail!(
            "refusing to share your whole home directory {} as the workspace: run stockade from a project directory",
            home.display()
        );
    }
    Ok(root)
}

/// The virtio-fs shares and the ordered root layout for the guest.
pub fn host_layout(workspace: &Path, user: &User) -> anyhow::Result<(Vec<ShareConfig>, Vec<RootEntry>)> {
    let mut shares = Vec::new();
    let mut root = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        let Ok(meta) = fs::symlink_metadata(path) else { continue };
        if meta.file_type().is_symlink() {
            // Merged /usr: /bin -> usr/bin stays a link in the guest.
            let target = fs::read_link(path).with_context(|| format!("cannot read the link {dir}"))?;
            root.push(RootEntry::Symlink { link: dir.to_string(), target: target.to_string_lossy().into_owned() });
        } else if meta.is_dir() {
            shares.push(ShareConfig { guest_path: dir.to_string(), host_path: path.to_path_buf() });
            root.push(RootEntry::Share { source: dir.to_string(), target: dir.to_string() });
        }
    }
    let tmpfs =
        |target: &str, mode: u32, uid: u32, gid: u32| RootEntry::Tmpfs { target: target.to_string(), mode, uid, gid };
    root.push(tmpfs("/tmp", 0o1777, 0, 0));
    root.push(tmpfs("/var/tmp", 0o1777, 0, 0));
    root.push(tmpfs("/run", 0o755, 0, 0));
    root.push(tmpfs("/home", 0o755, 0, 0));
    // The user's home exists and is writable, but holds none of the host's files.
    let home = user.home.to_string_lossy().into_owned();
    if !SYSTEM_DIRS.iter().any(|d| user.home.starts_with(d)) {
        root.push(tmpfs(&home, 0o700, user.uid, user.gid));
    }
    let ws = workspace.to_str().context("the workspace path is not valid UTF-8")?;
    shares.push(ShareConfig { guest_path: WORKSPACE_SHARE.to_string(), host_path: workspace.to_path_buf() });
    root.push(RootEntry::Overlay {
        source: WORKSPACE_SHARE.to_string(),
        target: ws.to_string(),
        disk: SCRATCH_DISK.to_string(),
    });
    Ok((shares, root))
}

/// Adds the policy's read-only mounts of host directories (`~/.cargo/bin`
/// = "ro") at their own paths. Returns the mounts it could not place, with
/// why, for the caller to report: writable and overlay mounts, and mounts
/// of single files, are not supported yet.
pub fn policy_mounts(
    mounts: &[crate::policy::Mount],
    home: &Path,
    shares: &mut Vec<ShareConfig>,
    root: &mut Vec<RootEntry>,
) -> Vec<String> {
    let mut skipped = Vec::new();
    for (index, mount) in mounts.iter().enumerate() {
        let path = mount.host_path(home);
        let Some(target) = path.to_str() else {
            skipped.push(format!("{} (the path is not valid UTF-8)", mount.path));
            continue;
        };
        if mount.mode != crate::policy::MountMode::Ro {
            skipped.push(format!("{} = {:?} (only read-only mounts are supported so far)", mount.path, mount.mode));
            continue;
        }
        if !path.is_dir() {
            skipped.push(format!("{} (not a directory on this host)", mount.path));
            continue;
        }
        let source = format!("/mounts/{index}");
        shares.push(ShareConfig { guest_path: source.clone(), host_path: path.clone() });
        // Before the workspace overlay, which must stay the last entry.
        let at = root.iter().position(|e| matches!(e, RootEntry::Overlay { .. })).unwrap_or(root.len());
        root.insert(at, RootEntry::Share { source, target: target.to_string() });
    }
    skipped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User { uid: 1000, gid: 1000, home: PathBuf::from("/home/alice") }
    }

    #[test]
    fn workspace_is_the_git_root() {
        let dir = std::env::temp_dir().join(format!("stockade-ws-{}", std::process::id()));
        fs::create_dir_all(dir.join("proj/.git")).unwrap();
        fs::create_dir_all(dir.join("proj/src/deep")).unwrap();
        let ws = find_workspace(&dir.join("proj/src/deep"), Path::new("/home/alice")).unwrap();
        assert_eq!(ws, dir.join("proj"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_root_and_home() {
        assert!(find_workspace(Path::new("/"), Path::new("/home/a")).is_err());
        let home = std::env::temp_dir().join(format!("stockade-home-{}", std::process::id()));
        fs::create_dir_all(&home).unwrap();
        let err = find_workspace(&home, &home).unwrap_err().to_string();
        assert!(err.contains("home directory"), "{err}");
        fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn layout_mounts_workspace_last_and_hides_home() {
        let (shares, root) = host_layout(Path::new("/home/alice/proj"), &user()).unwrap();
        assert!(shares.iter().any(|s| s.guest_path == "/usr"));
        assert!(!shares.iter().any(|s| s.host_path == Path::new("/home/alice")));
        let last = root.last().unwrap();
        assert_eq!(
            last,
            &RootEntry::Overlay {
                source: "/workspace".into(),
                target: "/home/alice/proj".into(),
                disk: "/dev/vda".into()
            }
        );
        let home_pos =
            root.iter().position(|e| matches!(e, RootEntry::Tmpfs { target, .. } if target == "/home/alice"));
        assert!(home_pos.is_some(), "home must be a fresh tmpfs");
    }
}
