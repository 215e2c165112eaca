//! Mounts: the kernel's own filesystems, then the guest root as the host
//! described it (read-only host directories, tmpfs where the guest writes).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, symlink};
use std::path::Path;

use anyhow::Context;
use nix::mount::{MsFlags, mount};

use crate::protocol::RootEntry;
use crate::vmm::config::FS_TAG;

/// Where the virtio-fs share is mounted before its parts are bound into place.
const SHARE_MOUNT: &str = "/.stockade/host";

/// Creates `target` (and its parents) unless it exists; an existing target
/// may sit on a read-only mount, where mkdir would fail.
fn create_mount_point(target: &str) -> anyhow::Result<()> {
    if Path::new(target).exists() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(target)
        .with_context(|| format!("cannot create mount point {target}"))
}

fn mount_fs(source: &str, target: &str, fstype: &str, flags: MsFlags, data: Option<&str>) -> anyhow::Result<()> {
    create_mount_point(target)?;
    mount(Some(source), target, Some(fstype), flags, data).with_context(|| format!("cannot mount {fstype} on {target}"))
}

/// proc, sys, dev and friends.
pub fn kernel_filesystems() -> anyhow::Result<()> {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount_fs("proc", "/proc", "proc", nosuid, None)?;
    mount_fs("sysfs", "/sys", "sysfs", nosuid, None)?;
    mount_fs("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID, Some("mode=0755"))?;
    mount_fs(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    mount_fs("tmpfs", "/dev/shm", "tmpfs", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=1777"))?;
    for (link, target) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        let _ = fs::remove_file(link);
        symlink(target, link).with_context(|| format!("cannot create {link}"))?;
    }
    Ok(())
}

/// Builds the root from the host's description, entry by entry.
pub fn assemble_root(entries: &[RootEntry]) -> anyhow::Result<()> {
    if entries.iter().any(|e| matches!(e, RootEntry::Share { .. })) {
        mount_fs(FS_TAG, SHARE_MOUNT, "virtiofs", MsFlags::MS_RDONLY | MsFlags::MS_NODEV, None)?;
    }
    for entry in entries {
        match entry {
            RootEntry::Share { source, target } => bind_read_only(source, target)?,
            RootEntry::Symlink { link, target } => {
                symlink(target, link).with_context(|| format!("cannot link {link} to {target}"))?
            }
            RootEntry::Tmpfs { target, mode, uid, gid } => mount_fs(
                "tmpfs",
                target,
                "tmpfs",
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(&format!("mode={mode:o},uid={uid},gid={gid}")),
            )?,
        }
    }
    Ok(())
}

fn bind_read_only(source: &str, target: &str) -> anyhow::Result<()> {
    let from = Path::new(SHARE_MOUNT).join(source.trim_start_matches('/'));
    create_mount_point(target)?;
    mount(Some(&from), target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .with_context(|| format!("cannot bind {} on {target}", from.display()))?;
    mount(None::<&str>, target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>)
        .with_context(|| format!("cannot make {target} read-only"))
}
