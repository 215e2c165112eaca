//! Limits on the command inside the guest: a cgroup v2 group whose
//! pids.max caps how many processes and threads it may have at once.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use anyhow::Context;
use nix::mount::{MsFlags, mount};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The command's cgroup; its `cgroup.procs` is written by the child itself
/// before it execs, so nothing it starts escapes the limit.
pub struct CommandGroup {
    procs: File,
}

impl CommandGroup {
    pub fn with_pids_max(max: u32) -> anyhow::Result<CommandGroup> {
        mount_cgroup2()?;
        let root = Path::new(CGROUP_ROOT);
        write(&root.join("cgroup.subtree_control"), "+pids")?;
        let group = root.join("command");
        fs::create_dir_all(&group).with_context(|| format!("cannot create {}", group.display()))?;
        write(&group.join("pids.max"), &max.to_string())?;
        let procs_path = group.join("cgroup.procs");
        let procs = OpenOptions::new()
            .write(true)
            .open(&procs_path)
            .with_context(|| format!("cannot open {}", procs_path.display()))?;
        Ok(CommandGroup { procs })
    }

    /// The open `cgroup.procs` the child writes to join the group.
    pub fn procs(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

/// Mounts the cgroup v2 hierarchy at /sys/fs/cgroup unless it is there
/// (the command's limits and dockerd both need it).
pub fn mount_cgroup2() -> anyhow::Result<()> {
    if Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
        return Ok(());
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("cgroup2"), CGROUP_ROOT, Some("cgroup2"), flags, None::<&str>)
        .with_context(|| format!("cannot mount cgroup2 on {CGROUP_ROOT}"))
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    let mut file =
        OpenOptions::new().write(true).open(path).with_context(|| format!("cannot open {}", path.display()))?;
    file.write_all(value.as_bytes()).with_context(|| format!("cannot write {value:?} to {}", path.display()))
}
