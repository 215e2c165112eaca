//! The supervisor's side of templates (see `vmm::template`): which template
//! a run uses, adopting a new recording, removing one that failed, keeping
//! at most `KEEP`, and listing them for `stockade cache`.
//!
//! Templates live in `<cache>/templates/<key>`, where the key hashes all
//! that shapes the guest up to its template point: the kernel and stockade
//! binary (by identity: device, inode, size, modification time), vCPUs,
//! memory, the devices the VM has and the sizes of its disks, extra kernel
//! arguments (see `key`), and the template format's version. A recording
//! goes to `.rec-<key>-<pid>` and is renamed to `<key>` only once complete,
//! so a run never sees half a template and two first runs at once leave one.
//! A directory's modification time is its last use: the least recently used
//! go first.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::protocol::broker::StartKind;
use crate::protocol::vm_config::{ShareConfig, TemplatePlan, VmConfig};
use crate::vmm::template;

/// Templates kept at most; each costs about the guest memory the init had
/// touched (tens of MiB).
pub const KEEP: usize = 4;
/// A recording directory this old whose run is gone is a leftover.
const STALE_RECORDING: Duration = Duration::from_secs(3600);

/// The templates directory under the cache.
pub fn root(cache: &Path) -> PathBuf {
    cache.join("templates")
}

/// Identity of a file that changes when the file is replaced or rewritten.
pub fn identity(path: &Path) -> io::Result<String> {
    let m = fs::metadata(path)?;
    Ok(format!("{}:{}:{}:{}.{}", m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

/// The key of the template for `config`. Every field of `VmConfig` (and of
/// `ShareConfig`) is named here, in the key or out of it with the reason: a
/// new field does not compile until someone decides which.
pub fn key(config: &VmConfig) -> io::Result<String> {
    let VmConfig {
        kernel,
        init,
        vcpus,
        memory_bytes,
        // The host file the console is written to; the guest sees the same UART.
        kernel_log: _,
        // The host end of vsock, dialed per connection; the guest sees the same device.
        vsock_broker: _,
        shares,
        // Refused by the virtio-fs device, made from this run's config, at each lookup.
        secrets: _,
        network,
        disk,
        image,
        // The VMM's own confinement on the host, nothing the guest holds.
        jail: _,
        verbose_kernel,
        kernel_args,
        // What this run does with the template of this key, not what it holds.
        template: _,
    } = config;
    let (mut read_only, mut writable) = (false, false);
    for share in shares {
        // Only which virtio-fs devices exist shapes the guest: it mounts the
        // shares after the template point, and the devices serve this run's.
        let ShareConfig { guest_path: _, host_path: _, writable: w, record: _, limit: _ } = share;
        if *w {
            writable = true;
        } else {
            read_only = true;
        }
    }
    let mut parts = vec![
        format!("version {}", template::MAGIC),
        format!("kernel {}", identity(kernel)?),
        format!("init {}", identity(init)?),
        format!("vcpus {vcpus}"),
        format!("memory {memory_bytes}"),
        format!("network {network}"),
        format!("verbose {verbose_kernel}"),
        format!("args {kernel_args:?}"),
        format!("read-only shares {read_only}"),
        format!("writable shares {writable}"),
    ];
    // The guest reads each disk's size when it finds it.
    for (name, disk) in [("disk", disk), ("image", image)] {
        let size = disk.as_deref().map(|p| fs::metadata(p).map(|m| m.len())).transpose()?;
        parts.push(format!("{name} {size:?}"));
    }
    let digest = Sha256::digest(parts.join("\n").as_bytes());
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The template a run uses, and what becomes of it when the run ends.
#[derive(Debug)]
pub struct Use {
    pub plan: TemplatePlan,
    root: PathBuf,
    key: String,
}

/// Picks the template for a VM of `key`: the one there is, marked as just
/// used, or a fresh recording directory.
pub fn choose(root: &Path, key: &str) -> io::Result<Use> {
    fs::create_dir_all(root)?;
    let ready = root.join(key);
    if template::is_complete(&ready) {
        mark_used(&ready);
        return Ok(Use { plan: TemplatePlan::Restore(ready), root: root.to_path_buf(), key: key.to_string() });
    }
    if ready.exists() {
        tracing::info!(
            "the template {key} is incomplete or damaged and was removed; this run boots and records it again"
        );
        fs::remove_dir_all(&ready)?;
    }
    let recording = root.join(format!(".rec-{key}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&recording);
    fs::create_dir(&recording)?;
    Ok(Use { plan: TemplatePlan::Record(recording), root: root.to_path_buf(), key: key.to_string() })
}

/// Sets a template's modification time to now: its last use.
fn mark_used(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        let _ = f.set_modified(SystemTime::now());
    }
}

impl Use {
    /// Settles the template once the VMM has exited: a complete recording
    /// becomes the template (unless another run's got there first), a
    /// template that could not be used or whose guest never called in is
    /// removed. `start` is what the VMM said, `called_in` whether the guest
    /// reached the host.
    pub fn settle(&self, start: Option<StartKind>, called_in: bool) {
        match &self.plan {
            TemplatePlan::Record(dir) => {
                let ready = self.root.join(&self.key);
                let adopted = start == Some(StartKind::Recording)
                    && called_in
                    && template::is_complete(dir)
                    && fs::rename(dir, &ready).is_ok();
                if adopted {
                    tracing::debug!("template {} recorded", self.key);
                } else {
                    let _ = fs::remove_dir_all(dir);
                }
            }
            TemplatePlan::Restore(dir) => {
                let failed = match start {
                    Some(kind) if kind.template_failed() => true,
                    Some(StartKind::Restored) => !called_in,
                    _ => false,
                };
                if failed {
                    tracing::info!("template {} removed: runs will record it again", self.key);
                    let _ = fs::remove_dir_all(dir);
                }
            }
        }
        prune(&self.root, KEEP);
    }
}

/// One template as `stockade cache` shows it.
pub struct Listed {
    pub key: String,
    /// Bytes the files take on disk (the memory file is sparse).
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// The complete templates, most recently used first.
pub fn list(root: &Path) -> io::Result<Vec<Listed>> {
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut listed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') || !template::is_complete(&path) {
            continue;
        }
        let bytes = fs::read_dir(&path)?.flatten().filter_map(|f| f.metadata().ok()).map(|m| m.blocks() * 512).sum();
        let last_used = fs::metadata(&path)?.modified()?;
        listed.push(Listed { key: name, bytes, last_used });
    }
    listed.sort_by_key(|t| std::cmp::Reverse(t.last_used));
    Ok(listed)
}

/// Keeps the `keep` most recently used templates and removes the rest, and
/// recordings left behind by runs long gone.
fn prune(root: &Path, keep: usize) {
    if let Ok(listed) = list(root) {
        for old in listed.iter().skip(keep) {
            let _ = fs::remove_dir_all(root.join(&old.key));
        }
    }
    let Ok(entries) = fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if name.starts_with(".rec-") && old.is_some_and(|age| age > STALE_RECORDING) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes every template; returns how many and their bytes on disk.
pub fn clear(root: &Path) -> io::Result<(usize, u64)> {
    let listed = list(root)?;
    for t in &listed {
        fs::remove_dir_all(root.join(&t.key))?;
    }
    Ok((listed.len(), listed.iter().map(|t| t.bytes).sum()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::vm_config::ShareConfig;

    fn config(dir: &Path) -> VmConfig {
        let kernel = dir.join("vmlinux");
        let init = dir.join("stockade");
        fs::write(&kernel, b"kernel").unwrap();
        fs::write(&init, b"init").unwrap();
        VmConfig {
            kernel,
            init,
            vcpus: 1,
            memory_bytes: 256 << 20,
            kernel_log: dir.join("kernel.log"),
            vsock_broker: dir.join("broker.sock"),
            shares: Vec::new(),
            secrets: Vec::new(),
            network: true,
            disk: None,
            image: None,
            jail: true,
            verbose_kernel: false,
            kernel_args: Vec::new(),
            template: None,
        }
    }

    #[test]
    fn the_key_follows_what_shapes_the_guest() {
        let dir = tempfile::tempdir().unwrap();
        let base = config(dir.path());
        let k = key(&base).unwrap();
        assert_eq!(k, key(&base).unwrap(), "stable");
        assert_ne!(k, key(&VmConfig { vcpus: 2, ..base.clone() }).unwrap());
        assert_ne!(k, key(&VmConfig { memory_bytes: 512 << 20, ..base.clone() }).unwrap());
        let share = ShareConfig {
            guest_path: "/w".into(),
            host_path: dir.path().into(),
            writable: false,
            record: None,
            limit: None,
        };
        assert_ne!(k, key(&VmConfig { shares: vec![share], ..base.clone() }).unwrap());
        assert_eq!(k, key(&VmConfig { jail: false, ..base.clone() }).unwrap(), "the jail is not the guest's");
        // A rebuilt binary is another template, and so is a rebuilt kernel.
        fs::remove_file(&base.init).unwrap();
        fs::write(&base.init, b"init, rebuilt").unwrap();
        let rebuilt = key(&base).unwrap();
        assert_ne!(k, rebuilt);
        fs::remove_file(&base.kernel).unwrap();
        fs::write(&base.kernel, b"kernel, rebuilt").unwrap();
        assert_ne!(rebuilt, key(&base).unwrap());
    }

    #[test]
    fn incomplete_recordings_are_dropped_and_only_a_few_templates_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = root(dir.path());
        let first = choose(&root, "aaaa").unwrap();
        let TemplatePlan::Record(rec) = &first.plan else { panic!("nothing to restore yet") };
        assert!(rec.is_dir());
        // The VMM wrote nothing usable: the directory goes, nothing is adopted.
        first.settle(Some(StartKind::Recording), true);
        assert!(!rec.exists());
        assert!(list(&root).unwrap().is_empty());
        assert!(matches!(choose(&root, "aaaa").unwrap().plan, TemplatePlan::Record(_)));
        // A damaged template in place is removed, and the run records anew.
        fs::create_dir_all(root.join("bbbb")).unwrap();
        fs::write(root.join("bbbb").join(template::STATE_FILE), b"stockade-template-1 00\n{}").unwrap();
        assert!(matches!(choose(&root, "bbbb").unwrap().plan, TemplatePlan::Record(_)));
        assert!(!root.join("bbbb").exists());
    }
}
