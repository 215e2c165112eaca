//! The scratch disk: a sparse file in the session directory, formatted ext4,
//! where the guest keeps the upper layer of the workspace overlay.
//!
//! mkfs runs once per disk size: its output, a blank image, is kept in the
//! cache (`<cache>/scratch`), and each run copies the blank's few MiB of
//! metadata into a fresh sparse file, on a thread of its own while the VM
//! starts. The guest mounts the disk only after we send the command, by
//! which time the copy has finished. (Every run's disk so has the same
//! filesystem UUID; the guest mounts it by device, and the disk never
//! outlives its VM.)

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::SystemTime;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::host::templates;
use crate::util::extent;

/// Where mke2fs lives on Debian-like systems when it is not on $PATH
/// (ordinary users' PATH often lacks the sbin directories).
const SBIN_DIRS: [&str; 2] = ["/usr/sbin", "/sbin"];
/// No journal: the disk never outlives the VM, so crash consistency buys
/// nothing. Lazy table init and no discard keep the image sparse.
const FORMAT_ARGS: [&str; 11] = [
    "-F",
    "-q",
    "-m",
    "0",
    "-O",
    "^has_journal",
    "-L",
    "stockade",
    "-E",
    "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
    "--",
];
/// Blank images kept at most (one per disk size in use); the least
/// recently used go first.
const KEEP_BLANKS: usize = 4;
/// Offset of the ext2/3/4 superblock's magic number, and the number.
const EXT4_MAGIC_AT: u64 = 1024 + 0x38;
const EXT4_MAGIC: u16 = 0xEF53;
/// Offset of the superblock's mount count: 0 in a blank, raised (and
/// written at once) by every read-write mount.
const EXT4_MOUNT_COUNT_AT: u64 = 1024 + 0x34;

/// The blank images' directory under the cache.
pub fn blanks_dir(cache: &Path) -> PathBuf {
    cache.join("scratch")
}

pub struct Formatting {
    path: PathBuf,
    /// `None` for a kept disk, which needs no filling.
    job: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Creates the sparse image of `bytes` at `path` and starts filling it with
/// a blank filesystem from `blanks` (formatting one there first if needed).
pub fn create(path: &Path, bytes: u64, blanks: &Path) -> anyhow::Result<Formatting> {
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
    let blanks = blanks.to_path_buf();
    let job = std::thread::Builder::new()
        .name("scratch".into())
        .spawn(move || {
            let blank = blank(&blanks, &mkfs, bytes)?;
            copy_data(&blank, &file).with_context(|| format!("cannot copy the blank disk {}", blank.display()))
        })
        .context("cannot start filling the scratch disk")?;
    Ok(Formatting { path: path.to_path_buf(), job: Some(job) })
}

impl Formatting {
    /// A kept disk, ready as it is.
    pub fn kept(path: &Path) -> Formatting {
        Formatting { path: path.to_path_buf(), job: None }
    }

    /// Waits for the disk to be ready.
    pub fn wait(self) -> anyhow::Result<()> {
        let Some(job) = self.job else { return Ok(()) };
        match job.join() {
            Ok(result) => result.with_context(|| format!("cannot format the scratch disk {}", self.path.display())),
            Err(_) => bail!("formatting the scratch disk {} failed", self.path.display()),
        }
    }
}

fn find_mkfs() -> Option<PathBuf> {
    find_tool("mkfs.ext4")
}

fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Whether the guest mounted the disk at `path` (so it may hold changes):
/// an ext4 filesystem whose mount count is no longer the blank's 0.
pub fn was_mounted(path: &Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let (mut magic, mut count) = ([0u8; 2], [0u8; 2]);
    file.read_exact_at(&mut magic, EXT4_MAGIC_AT).is_ok()
        && u16::from_le_bytes(magic) == EXT4_MAGIC
        && file.read_exact_at(&mut count, EXT4_MOUNT_COUNT_AT).is_ok()
        && u16::from_le_bytes(count) > 0
}

/// The blank image of `bytes` made by `mkfs`, formatted now unless the
/// cache has a sound one. Formats to a private name and renames, so a
/// concurrent run sees a whole blank or none.
fn blank(dir: &Path, mkfs: &Path, bytes: u64) -> anyhow::Result<PathBuf> {
    let mkfs_identity = templates::identity(mkfs).with_context(|| format!("cannot read {}", mkfs.display()))?;
    let maker = format!("{mkfs_identity} {FORMAT_ARGS:?}");
    let key: String = Sha256::digest(maker.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("ext4-{bytes}-{key}.img"));
    if is_blank(&path, bytes) {
        // Its modification time is its last use.
        if let Ok(file) = File::options().write(true).open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        return Ok(path);
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let partial = dir.join(format!(".partial-{}-{bytes}", std::process::id()));
    let result = (|| {
        let file = File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
        file.set_len(bytes).with_context(|| format!("cannot size {}", partial.display()))?;
        format(mkfs, &partial)?;
        fs::rename(&partial, &path).with_context(|| format!("cannot rename {} into place", partial.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result?;
    prune(dir, KEEP_BLANKS);
    Ok(path)
}

/// Whether `path` is a blank image of `bytes` (as far as its size and
/// superblock tell: a damaged one is formatted again).
fn is_blank(path: &Path, bytes: u64) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let mut magic = [0u8; 2];
    file.metadata().is_ok_and(|m| m.is_file() && m.len() == bytes)
        && file.read_exact_at(&mut magic, EXT4_MAGIC_AT).is_ok()
        && u16::from_le_bytes(magic) == EXT4_MAGIC
}

fn format(mkfs: &Path, image: &Path) -> anyhow::Result<()> {
    let output = Command::new(mkfs)
        .args(FORMAT_ARGS)
        .arg(image)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", mkfs.display()))?;
    if !output.status.success() {
        bail!("{} failed: {}", mkfs.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Copies the data of `from` (skipping its holes) to the same offsets of
/// `to`, which is already as long: in the kernel, and shared rather than
/// copied where the filesystem can reflink.
fn copy_data(from: &Path, to: &File) -> io::Result<()> {
    let source = File::open(from)?;
    let size = source.metadata()?.len();
    let mut at = 0;
    while let Some((start, end)) = extent::next_data(&source, at, size)? {
        copy_range(&source, to, start, end - start)?;
        at = end;
    }
    Ok(())
}

fn copy_range(from: &File, to: &File, start: u64, len: u64) -> io::Result<()> {
    let offset = |v: u64| i64::try_from(v).map_err(io::Error::other);
    let (mut off_in, mut off_out, mut left) = (offset(start)?, offset(start)?, len);
    while left > 0 {
        let chunk = usize::try_from(left).unwrap_or(usize::MAX);
        match nix::fcntl::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), chunk) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the blank disk shrank")),
            Ok(n) => left -= n as u64,
            // Across filesystems on older kernels, or where unsupported.
            Err(nix::errno::Errno::EXDEV | nix::errno::Errno::ENOSYS | nix::errno::Errno::EOPNOTSUPP) => {
                return copy_by_hand(from, to, start + (len - left), left);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn copy_by_hand(from: &File, to: &File, mut at: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let end = at + len;
    while at < end {
        let n = usize::try_from(end - at).unwrap_or(usize::MAX).min(buf.len());
        from.read_exact_at(&mut buf[..n], at)?;
        to.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Keeps the `keep` most recently used blanks.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut blanks: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ext4-"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    blanks.sort_by_key(|b| std::cmp::Reverse(b.0));
    for (_, path) in blanks.into_iter().skip(keep) {
        let _ = fs::remove_file(path);
    }
}

/// How many blank images there are, and the bytes they hold on disk.
pub fn usage(dir: &Path) -> (usize, u64) {
    let Ok(entries) = fs::read_dir(dir) else { return (0, 0) };
    entries.flatten().filter_map(|e| e.metadata().ok()).fold((0, 0), |(n, b), m| (n + 1, b + m.blocks() * 512))
}

/// Removes every blank image: how many, and the bytes they held on disk.
pub fn clear(dir: &Path) -> io::Result<(usize, u64)> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(e),
    };
    let (mut count, mut bytes) = (0, 0);
    for entry in entries.flatten() {
        let held = entry.metadata().map(|m| m.blocks() * 512).unwrap_or(0);
        fs::remove_file(entry.path())?;
        count += 1;
        bytes += held;
    }
    Ok((count, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn magic(image: &Path) -> u16 {
        let mut magic = [0u8; 2];
        File::open(image).unwrap().read_exact_at(&mut magic, EXT4_MAGIC_AT).unwrap();
        u16::from_le_bytes(magic)
    }

    fn assert_sparse_ext4(image: &Path, bytes: u64) {
        let meta = fs::metadata(image).unwrap();
        assert_eq!(meta.len(), bytes);
        assert!(meta.blocks() * 512 < 64 << 20, "the image must stay sparse: {} blocks", meta.blocks());
        assert_eq!(magic(image), EXT4_MAGIC, "ext2/3/4 superblock magic in {}", image.display());
    }

    fn blank_files(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        found.sort();
        found
    }

    #[test]
    fn formats_once_and_copies_the_blank_after() {
        if find_mkfs().is_none() {
            eprintln!("skipping: mkfs.ext4 is not installed (apt install e2fsprogs)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("stockade-scratch-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let blanks = dir.join("blanks");
        let (first, second) = (dir.join("first.img"), dir.join("second.img"));
        create(&first, 1 << 30, &blanks).unwrap().wait().unwrap();
        assert_sparse_ext4(&first, 1 << 30);
        let kept = blank_files(&blanks);
        assert_eq!(kept.len(), 1, "one blank for one size: {kept:?}");
        let formatted_at = fs::metadata(&kept[0]).unwrap().ino();

        create(&second, 1 << 30, &blanks).unwrap().wait().unwrap();
        assert_sparse_ext4(&second, 1 << 30);
        assert_eq!(blank_files(&blanks), kept, "the second disk reuses the blank");
        assert_eq!(fs::metadata(&kept[0]).unwrap().ino(), formatted_at, "and does not format it again");
        assert!(create(&second, 1 << 30, &blanks).is_err(), "an existing image is never overwritten");

        // A damaged blank is formatted again rather than copied.
        fs::write(&kept[0], b"not a filesystem").unwrap();
        let third = dir.join("third.img");
        create(&third, 1 << 30, &blanks).unwrap().wait().unwrap();
        assert_sparse_ext4(&third, 1 << 30);
        assert_sparse_ext4(&kept[0], 1 << 30);

        let (count, bytes) = usage(&blanks);
        assert!(count == 1 && bytes > 0 && bytes < 64 << 20, "{count} blanks, {bytes} bytes");
        assert_eq!(clear(&blanks).unwrap().0, 1);
        assert!(blank_files(&blanks).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn copies_data_at_its_offsets_and_keeps_holes() {
        let dir = std::env::temp_dir().join(format!("stockade-scratch-copy-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (from, to) = (dir.join("from"), dir.join("to"));
        let source = File::create(&from).unwrap();
        source.set_len(64 << 20).unwrap();
        source.write_all_at(b"head", 0).unwrap();
        source.write_all_at(&[7u8; 8192], 40 << 20).unwrap();
        let target = File::options().read(true).write(true).create_new(true).open(&to).unwrap();
        target.set_len(64 << 20).unwrap();
        copy_data(&from, &target).unwrap();
        let mut got = [0u8; 4];
        target.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"head");
        let mut block = vec![0u8; 8192];
        target.read_exact_at(&mut block, 40 << 20).unwrap();
        assert!(block.iter().all(|&b| b == 7));
        assert!(target.metadata().unwrap().blocks() * 512 < 4 << 20, "holes stay holes");
        fs::remove_dir_all(&dir).unwrap();
    }
}
