//! The scratch disk: a sparse file in the session directory, formatted ext4,
//! where the guest keeps the upper layer of the workspace overlay. Formatting
//! runs while the VM boots; the guest mounts the disk only after we send the
//! command, by which time the format has finished.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use anyhow::{Context, bail};

/// Where mke2fs lives on Debian-like systems when it is not on $PATH
/// (ordinary users' PATH often lacks the sbin directories).
const SBIN_DIRS: [&str; 2] = ["/usr/sbin", "/sbin"];

pub struct Formatting {
    path: PathBuf,
    job: JoinHandle<anyhow::Result<()>>,
}

/// Creates the sparse image of `bytes` at `path` and starts formatting it.
pub fn create(path: &Path, bytes: u64) -> anyhow::Result<Formatting> {
    let mkfs = find_mkfs().context(
        "cannot find mkfs.ext4, which formats the scratch disk for the guest's changes: install e2fsprogs \
         (apt install e2fsprogs)",
    )?;
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create the scratch disk {}", path.display()))?;
    file.set_len(bytes).with_context(|| format!("cannot size the scratch disk {}", path.display()))?;
    drop(file);
    let image = path.to_path_buf();
    let job = std::thread::Builder::new()
        .name("mkfs".into())
        .spawn(move || format(&mkfs, &image))
        .context("cannot start formatting the scratch disk")?;
    Ok(Formatting { path: path.to_path_buf(), job })
}

impl Formatting {
    /// Waits for the format to finish.
    pub fn wait(self) -> anyhow::Result<()> {
        match self.job.join() {
            Ok(result) => result.with_context(|| format!("cannot format the scratch disk {}", self.path.display())),
            Err(_) => bail!("formatting the scratch disk {} failed", self.path.display()),
        }
    }
}

fn find_mkfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join("mkfs.ext4"))
        .find(|candidate| candidate.is_file())
}

fn format(mkfs: &Path, image: &Path) -> anyhow::Result<()> {
    // No journal: the disk never outlives the VM, so crash consistency buys
    // nothing. Lazy table init and no discard keep the file sparse and the
    // format to a few milliseconds.
    let output = Command::new(mkfs)
        .args(["-F", "-q", "-m", "0", "-O", "^has_journal", "-L", "stockade"])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        .arg(image)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", mkfs.display()))?;
    if !output.status.success() {
        bail!("{} failed: {}", mkfs.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_a_sparse_ext4_image() {
        if find_mkfs().is_none() {
            eprintln!("skipping: mkfs.ext4 is not installed (apt install e2fsprogs)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("stockade-scratch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("scratch.img");
        create(&image, 1 << 30).unwrap().wait().unwrap();
        let meta = std::fs::metadata(&image).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 64 << 20, "the image must stay sparse: {} blocks", meta.blocks());
        let mut magic = [0u8; 2];
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&image).unwrap().read_exact_at(&mut magic, 1024 + 0x38).unwrap();
        assert_eq!(u16::from_le_bytes(magic), 0xEF53, "ext2/3/4 superblock magic");
        assert!(create(&image, 1 << 30).is_err(), "an existing image is never overwritten");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
