//! Mounts: the kernel's own filesystems, then the guest root as the host
//! described it (read-only host directories, tmpfs where the guest writes).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::Context;
use nix::mount::{MsFlags, mount};

use crate::protocol::RootEntry;
use crate::protocol::shares::{BOOT_NEW_ROOT, FS_TAG, FS_TAG_RW};

/// Where the virtio-fs share is mounted before its parts are bound into place.
const SHARE_MOUNT: &str = "/.stockade/host";
/// Where the writable virtio-fs share (policy "rw" mounts) is mounted.
const SHARE_MOUNT_RW: &str = "/.stockade/host-rw";
/// Upper layers of policy "overlay" mounts, thrown away with the VM.
const SCRATCH_UPPERS: &str = "/.stockade/uppers";

/// Where the scratch disk is mounted; it holds the overlay's upper and work
/// directories.
const SCRATCH_MOUNT: &str = "/.stockade/scratch";

/// The two layers of the workspace overlay, for the export at the end.
#[derive(Debug, Clone)]
pub struct Layers {
    pub lower: PathBuf,
    pub upper: PathBuf,
}

/// Creates `target` (and its parents) unless it exists; an existing target
/// may sit on a read-only mount, where mkdir would fail.
/// What a bind of `from` needs at `target`: a directory, or for a single
/// file an empty file (owned like its directory) unless one is there.
fn create_bind_target(from: &Path, target: &str) -> anyhow::Result<()> {
    if !from.is_file() {
        return create_mount_point(target);
    }
    let path = Path::new(target);
    if path.exists() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        create_mount_point(&parent.to_string_lossy())?;
    }
    fs::File::create(path).with_context(|| format!("cannot create mount point {target}"))?;
    inherit_owner(path);
    Ok(())
}

/// The largest agent state file carried in or out: state files are
/// settings and small databases, not payloads.
const MAX_STATE_FILE: u64 = 16 << 20;

/// Copies an agent's state file from the writable share to `target`, a
/// plain file of the user's: programs replace such files by renaming a new
/// one over them, which a bind-mounted file would refuse (EBUSY).
fn state_file_in(source: &str, target: &str, uid: u32, gid: u32) -> anyhow::Result<()> {
    let from = Path::new(SHARE_MOUNT_RW).join(source.trim_start_matches('/'));
    let path = Path::new(target);
    if let Some(parent) = path.parent() {
        create_mount_point(&parent.to_string_lossy())?;
    }
    match fs::metadata(&from) {
        Ok(meta) if meta.is_file() && meta.len() <= MAX_STATE_FILE => {
            fs::copy(&from, path).with_context(|| format!("cannot copy {} to {target}", from.display()))?;
        }
        // Nothing kept yet: the program starts without the file.
        _ => return Ok(()),
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).with_context(|| format!("cannot give {target} to its user"))
}

/// Copies each agent state file back to the writable share after the
/// command, replacing the kept copy in one rename. A file the command
/// removed or made something other than a plain file is left as it was.
pub fn save_state_files(entries: &[RootEntry]) {
    for entry in entries {
        let RootEntry::StateFile { source, target, .. } = entry else { continue };
        let to = Path::new(SHARE_MOUNT_RW).join(source.trim_start_matches('/'));
        let Ok(meta) = fs::symlink_metadata(target) else { continue };
        if !meta.is_file() || meta.len() > MAX_STATE_FILE {
            eprintln!("stockade-init: {target} is not a plain file of at most 16 MiB; its kept copy is unchanged");
            continue;
        }
        let temp = to.with_extension("stockade-new");
        let copied = fs::copy(target, &temp).and_then(|_| fs::rename(&temp, &to));
        if let Err(e) = copied {
            let _ = fs::remove_file(&temp);
            eprintln!("stockade-init: cannot keep {target}: {e}");
        }
    }
    sync_host_writes();
}

/// New directories take the owner of the directory they are made in, so
/// the parents of a mount in the user's home (`~/.cargo` of `~/.cargo/bin`)
/// stay the user's to write in.
fn create_mount_point(target: &str) -> anyhow::Result<()> {
    let target = Path::new(target);
    if target.exists() {
        return Ok(());
    }
    let missing: Vec<&Path> = target.ancestors().take_while(|a| !a.exists()).collect();
    for dir in missing.into_iter().rev() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("cannot create mount point {}", target.display()))?;
        inherit_owner(dir);
    }
    Ok(())
}

/// Gives `path` the owner of its parent directory. Best effort: a root-owned
/// mount point only costs the user a place to write.
fn inherit_owner(path: &Path) {
    let Some(parent) = path.parent().and_then(|p| fs::metadata(p).ok()) else { return };
    if parent.uid() != 0 || parent.gid() != 0 {
        let _ = std::os::unix::fs::lchown(path, Some(parent.uid()), Some(parent.gid()));
    }
}

fn mount_fs(source: &str, target: &str, fstype: &str, flags: MsFlags, data: Option<&str>) -> anyhow::Result<()> {
    create_mount_point(target)?;
    mount(Some(source), target, Some(fstype), flags, data).with_context(|| format!("cannot mount {fstype} on {target}"))
}

/// Filesystem magic of FUSE (virtio-fs): the root's, when the kernel
/// mounted the VMM's boot tree as its root.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Gives the init a writable root. The kernel mounted the VMM's read-only
/// boot tree as `/` and runs the init from it; a tmpfs moved over `/` (as
/// switch_root does) becomes the root everything else is built in. The boot
/// tree stays mounted beneath it, so the init's pages still load from it on
/// demand.
pub fn writable_root() -> anyhow::Result<()> {
    let root = nix::sys::statfs::statfs("/").context("cannot stat the root filesystem")?;
    if root.filesystem_type().0 != FUSE_SUPER_MAGIC {
        // Booted from an initramfs: its root is writable already.
        return Ok(());
    }
    mount(Some("tmpfs"), BOOT_NEW_ROOT, Some("tmpfs"), MsFlags::empty(), Some("mode=0755"))
        .with_context(|| format!("cannot mount the guest's root tmpfs on {BOOT_NEW_ROOT}"))?;
    nix::unistd::chdir(BOOT_NEW_ROOT).with_context(|| format!("cannot enter {BOOT_NEW_ROOT}"))?;
    for (dir, mode) in [("dev", 0o755), ("proc", 0o555), ("sys", 0o555), ("tmp", 0o1777)] {
        fs::DirBuilder::new().mode(mode).create(dir).with_context(|| format!("cannot create /{dir}"))?;
        // The umask must not take the sticky or write bits off /tmp.
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    }
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .context("cannot move the guest's root tmpfs over /")?;
    nix::unistd::chroot(".").context("cannot enter the guest's root tmpfs")?;
    nix::unistd::chdir("/").context("cannot enter /")?;
    Ok(())
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

/// Flushes what the guest wrote to the host's writable share (a policy's rw
/// mount). Nothing else needs flushing at the end: the scratch disk is
/// discarded once its changes are exported, and everything else is memory or
/// read-only, so a full sync would only write the upper layer to a disk about
/// to be deleted (seconds for a large change set).
pub fn sync_host_writes() {
    if let Ok(dir) = fs::File::open(SHARE_MOUNT_RW) {
        let _ = nix::unistd::syncfs(&dir);
    }
}

/// Read-ahead of a virtio-fs mount, KiB: one request can carry 1 MiB (the
/// server's max_pages), and every request is a round trip to the host, so
/// programs and libraries loading from the share come in fewer of them.
const SHARE_READAHEAD_KB: u32 = 1024;

/// Raises the read-ahead of the filesystem mounted at `mount` (its bdi is
/// named after the device number). Best effort: the default only costs time.
fn widen_readahead(mount: &str) {
    let Ok(meta) = fs::metadata(mount) else { return };
    let dev = meta.dev();
    let knob = format!("/sys/class/bdi/{}:{}/read_ahead_kb", nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let _ = fs::write(knob, SHARE_READAHEAD_KB.to_string());
}

/// Builds the root from the host's description, entry by entry. Returns the
/// workspace overlay's layers when there is one.
pub fn assemble_root(entries: &[RootEntry]) -> anyhow::Result<Option<Layers>> {
    if entries
        .iter()
        .any(|e| matches!(e, RootEntry::Share { .. } | RootEntry::Overlay { .. } | RootEntry::ShareScratch { .. }))
    {
        mount_fs(FS_TAG, SHARE_MOUNT, "virtiofs", MsFlags::MS_RDONLY | MsFlags::MS_NODEV, None)?;
        widen_readahead(SHARE_MOUNT);
    }
    if entries.iter().any(|e| matches!(e, RootEntry::ShareWritable { .. } | RootEntry::StateFile { .. })) {
        mount_fs(FS_TAG_RW, SHARE_MOUNT_RW, "virtiofs", MsFlags::MS_NODEV | MsFlags::MS_NOSUID, None)?;
    }
    // The scratch disk's mount waits on the disk: it runs while the shares
    // are placed, and the overlay entry waits for it.
    let mut scratch = entries.iter().find_map(|e| match e {
        RootEntry::Overlay { disk, .. } => Some(PendingScratch::start(disk)),
        _ => None,
    });
    let etc = EtcFiles::collect(entries);
    let mut layers = None;
    for entry in entries {
        match entry {
            RootEntry::Share { source, target } if etc.covers(target) => etc.mount(source)?,
            RootEntry::File { target, .. } if etc.holds(target) => {}
            RootEntry::Share { source, target } => bind_read_only(source, target)?,
            RootEntry::ShareWritable { source, target } => {
                let from = Path::new(SHARE_MOUNT_RW).join(source.trim_start_matches('/'));
                create_bind_target(&from, target)?;
                mount(Some(&from), target.as_str(), None::<&str>, MsFlags::MS_BIND, None::<&str>)
                    .with_context(|| format!("cannot bind {} on {target}", from.display()))?;
            }
            RootEntry::ShareScratch { source, target } => scratch_overlay(source, target)?,
            RootEntry::StateFile { source, target, uid, gid } => state_file_in(source, target, *uid, *gid)?,
            RootEntry::Overlay { source, target, disk } => {
                let pending = scratch.take().unwrap_or_else(|| PendingScratch::start(disk));
                layers = Some(overlay(source, target, pending)?);
            }
            RootEntry::Image { disk } => image_root(disk)?,
            RootEntry::File { target, content, mode } => place_file(target, content, *mode)?,
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
    Ok(layers)
}

/// Where image mode mounts the image, its tmpfs upper layer, and the merge.
const IMAGE_LOWER: &str = "/.stockade/image";
const IMAGE_UPPER: &str = "/.stockade/image-upper";
const IMAGE_ROOT: &str = "/.stockade/image-root";
/// Top-level names of an image that the init's own root provides instead.
const IMAGE_SKIP: &[&str] = &["dev", "proc", "sys", "tmp", "run", "home", "lost+found"];

/// The image on `disk` as the system: mounted read-only, merged with a tmpfs
/// upper layer (so /etc can take generated files), and each top-level
/// directory bound at the root, links recreated.
fn image_root(disk: &str) -> anyhow::Result<()> {
    create_mount_point(IMAGE_LOWER)?;
    super::template::forget_cached_blocks(disk);
    mount(Some(disk), IMAGE_LOWER, Some("ext4"), MsFlags::MS_RDONLY | MsFlags::MS_NODEV, None::<&str>)
        .with_context(|| format!("cannot mount the root image {disk}"))?;
    mount_fs("tmpfs", IMAGE_UPPER, "tmpfs", MsFlags::MS_NODEV, Some("mode=0755"))?;
    let (upper, work) = (Path::new(IMAGE_UPPER).join("upper"), Path::new(IMAGE_UPPER).join("work"));
    fs::create_dir(&upper)?;
    fs::create_dir(&work)?;
    let options = format!("lowerdir={IMAGE_LOWER},upperdir={},workdir={}", upper.display(), work.display());
    mount_fs("overlay", IMAGE_ROOT, "overlay", MsFlags::MS_NODEV, Some(&options))?;
    let entries = fs::read_dir(IMAGE_ROOT).with_context(|| format!("cannot list the root image {disk}"))?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if IMAGE_SKIP.contains(&name) {
            continue;
        }
        let target = format!("/{name}");
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            let link = fs::read_link(entry.path())?;
            symlink(&link, &target).with_context(|| format!("cannot link {target} to {}", link.display()))?;
        } else if kind.is_dir() {
            create_mount_point(&target)?;
            mount(Some(&entry.path()), target.as_str(), None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
                .with_context(|| format!("cannot place the image's {target}"))?;
        }
    }
    Ok(())
}

/// The read-only share `source` at `target`, writable in the guest through
/// a tmpfs upper layer that nobody exports.
fn scratch_overlay(source: &str, target: &str) -> anyhow::Result<()> {
    let lower = Path::new(SHARE_MOUNT).join(source.trim_start_matches('/'));
    let base = Path::new(SCRATCH_UPPERS).join(source.trim_start_matches('/').replace('/', "_"));
    mount_fs("tmpfs", &base.to_string_lossy(), "tmpfs", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=0755"))?;
    let (upper, work) = (base.join("upper"), base.join("work"));
    let root = fs::metadata(&lower).with_context(|| format!("cannot read {}", lower.display()))?;
    fs::DirBuilder::new().mode(root.mode() & 0o7777).create(&upper)?;
    nix::unistd::chown(&upper, Some(root.uid().into()), Some(root.gid().into()))?;
    fs::DirBuilder::new().mode(0o700).create(&work)?;
    let options = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
    mount_fs("overlay", target, "overlay", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(&options))
}

/// Where the files generated for /etc itself are laid out: the top layer of
/// a read-only overlay over the shared /etc.
const ETC_FILES: &str = "/.stockade/etc-files";

/// The generated files that replace entries of a shared /etc: they go into
/// one overlay layer over it, one mount for them all, where a bind each
/// took two mounts and a lookup on the share. (Deeper paths stay binds: a
/// directory in the layer would hide the share's rest of that directory.)
struct EtcFiles<'a> {
    files: Vec<(&'a str, &'a str, u32)>,
}

impl<'a> EtcFiles<'a> {
    fn collect(entries: &'a [RootEntry]) -> EtcFiles<'a> {
        let shared = entries.iter().any(|e| matches!(e, RootEntry::Share { target, .. } if target == "/etc"));
        let files = entries
            .iter()
            .filter_map(|e| match e {
                RootEntry::File { target, content, mode }
                    if shared && Path::new(target).parent() == Some(Path::new("/etc")) =>
                {
                    Some((target.as_str(), content.as_str(), *mode))
                }
                _ => None,
            })
            .collect();
        EtcFiles { files }
    }

    /// Whether `target` is the shared /etc these files go over.
    fn covers(&self, target: &str) -> bool {
        target == "/etc" && !self.files.is_empty()
    }

    /// Whether the file for `target` is one of these.
    fn holds(&self, target: &str) -> bool {
        self.files.iter().any(|(t, _, _)| *t == target)
    }

    /// The share's `source` at /etc, read-only, with these files over it.
    fn mount(&self, source: &str) -> anyhow::Result<()> {
        create_mount_point(ETC_FILES)?;
        for (target, content, mode) in &self.files {
            let name = Path::new(target).file_name().context("a generated /etc file has no name")?;
            let path = Path::new(ETC_FILES).join(name);
            write_generated(&path, content, *mode)?;
        }
        let lower = Path::new(SHARE_MOUNT).join(source.trim_start_matches('/'));
        let options = format!("lowerdir={ETC_FILES}:{}", lower.display());
        mount_fs("overlay", "/etc", "overlay", MsFlags::MS_RDONLY | MsFlags::MS_NODEV, Some(&options))
    }
}

/// Where generated files are written before they are bound into place (the
/// init's tmpfs root, which is writable).
const FILES_DIR: &str = "/.stockade/files";

/// Puts a generated file at `target`. A target reached through symlinks
/// (resolv.conf often points into /run) is placed where they lead; an
/// existing file is covered by a read-only bind mount, a missing one is
/// created (its directory must be writable, e.g. a tmpfs).
fn place_file(target: &str, content: &str, mode: u32) -> anyhow::Result<()> {
    let resolved = follow_links(Path::new(target));
    if resolved.is_file() {
        create_mount_point(FILES_DIR)?;
        let source = Path::new(FILES_DIR).join(target.trim_start_matches('/').replace('/', "_"));
        write_generated(&source, content, mode)?;
        mount(Some(&source), &resolved, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .with_context(|| format!("cannot place {target}"))?;
        mount(
            None::<&str>,
            &resolved,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .with_context(|| format!("cannot make {target} read-only"))?;
    } else {
        if let Some(parent) = resolved.parent() {
            create_mount_point(&parent.to_string_lossy())?;
        }
        write_generated(&resolved, content, mode)?;
    }
    Ok(())
}

/// Writes a generated file at `path` with exactly `mode` (the umask would
/// take bits off).
fn write_generated(path: &Path, content: &str, mode: u32) -> anyhow::Result<()> {
    fs::write(path, content).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// Where `path` leads through symlinks (a few hops at most); the path itself
/// when it is not a link or a link goes nowhere readable.
fn follow_links(path: &Path) -> PathBuf {
    let mut current = path.to_path_buf();
    for _ in 0..8 {
        let Ok(target) = fs::read_link(&current) else { break };
        current = match current.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    current
}

/// A root-only directory `name` on the scratch disk (mounted with the
/// workspace overlay), for guest data too big for memory.
pub fn scratch_dir(name: &str) -> anyhow::Result<PathBuf> {
    let mount = Path::new(SCRATCH_MOUNT);
    if !mount.join("upper").is_dir() {
        anyhow::bail!("the scratch disk is not mounted at {SCRATCH_MOUNT}");
    }
    let dir = mount.join(name);
    fs::DirBuilder::new().mode(0o700).create(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// The scratch disk's mount, with the overlay's upper and work directories
/// made on it (the upper one's owner and mode are set once the workspace is
/// visible): on a thread of its own, or done already when none could start.
enum PendingScratch {
    Mounting(JoinHandle<anyhow::Result<()>>),
    Done(anyhow::Result<()>),
}

impl PendingScratch {
    fn start(disk: &str) -> PendingScratch {
        let owned = disk.to_string();
        match std::thread::Builder::new().name("scratch".into()).spawn(move || mount_scratch(&owned)) {
            Ok(thread) => PendingScratch::Mounting(thread),
            Err(_) => PendingScratch::Done(mount_scratch(disk)),
        }
    }

    fn wait(self) -> anyhow::Result<()> {
        match self {
            PendingScratch::Mounting(thread) => {
                thread.join().unwrap_or_else(|_| Err(anyhow::anyhow!("mounting the scratch disk panicked")))
            }
            PendingScratch::Done(result) => result,
        }
    }
}

fn mount_scratch(disk: &str) -> anyhow::Result<()> {
    // The disk is formatted without zeroed inode tables; the kernel must not
    // spend the session zeroing them in the background.
    super::template::forget_cached_blocks(disk);
    mount_fs(disk, SCRATCH_MOUNT, "ext4", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("noinit_itable"))?;
    let scratch = Path::new(SCRATCH_MOUNT);
    // A kept disk (`stockade recover`) has both already.
    let mut dirs = fs::DirBuilder::new();
    dirs.mode(0o700);
    for (name, what) in [("upper", "the overlay's upper layer"), ("work", "the overlay's work directory")] {
        let dir = scratch.join(name);
        if !fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            dirs.create(&dir).with_context(|| format!("cannot create {what}"))?;
        }
    }
    Ok(())
}

/// `stockade recover`: the kept scratch disk mounted read-only and the
/// workspace share beneath, as the export reads them, with no overlay over
/// them. The disk's bytes are the hostile guest's; this kernel, not the
/// host, parses them, and a filesystem it cannot mount fails here.
pub fn recovery_layers(entries: &[RootEntry]) -> anyhow::Result<Option<Layers>> {
    let Some((source, disk)) = entries.iter().find_map(|e| match e {
        RootEntry::Overlay { source, disk, .. } => Some((source, disk)),
        _ => None,
    }) else {
        return Ok(None);
    };
    mount_fs(FS_TAG, SHARE_MOUNT, "virtiofs", MsFlags::MS_RDONLY | MsFlags::MS_NODEV, None)?;
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount_fs(disk, SCRATCH_MOUNT, "ext4", flags, None).context("the kept scratch disk does not mount")?;
    let upper = Path::new(SCRATCH_MOUNT).join("upper");
    if !fs::symlink_metadata(&upper).is_ok_and(|m| m.is_dir()) {
        anyhow::bail!("the kept scratch disk has no overlay upper layer");
    }
    Ok(Some(Layers { lower: Path::new(SHARE_MOUNT).join(source.trim_start_matches('/')), upper }))
}

/// The workspace overlay, on the scratch disk once it is mounted.
fn overlay(source: &str, target: &str, scratch: PendingScratch) -> anyhow::Result<Layers> {
    let lower = Path::new(SHARE_MOUNT).join(source.trim_start_matches('/'));
    let upper = Path::new(SCRATCH_MOUNT).join("upper");
    let work = Path::new(SCRATCH_MOUNT).join("work");
    // The merged root takes its owner and mode from the upper directory:
    // make it look like the workspace itself.
    let root = fs::metadata(&lower).with_context(|| format!("cannot read the workspace at {}", lower.display()))?;
    scratch.wait()?;
    fs::set_permissions(&upper, fs::Permissions::from_mode(root.mode() & 0o7777))
        .context("cannot set the upper layer's mode")?;
    nix::unistd::chown(&upper, Some(root.uid().into()), Some(root.gid().into()))
        .context("cannot set the upper layer's owner")?;
    // No redirects, index or metacopy: every change is then plain files and
    // whiteouts in the upper layer, which is what the export reads (a
    // directory rename becomes copy and delete, as on filesystems without
    // rename support).
    let options = format!(
        "lowerdir={},upperdir={},workdir={},{}",
        lower.display(),
        upper.display(),
        work.display(),
        super::export::OVERLAY_OPTIONS
    );
    mount_fs("overlay", target, "overlay", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(&options))?;
    Ok(Layers { lower, upper })
}

fn bind_read_only(source: &str, target: &str) -> anyhow::Result<()> {
    let from = Path::new(SHARE_MOUNT).join(source.trim_start_matches('/'));
    create_bind_target(&from, target)?;
    mount(Some(&from), target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .with_context(|| format!("cannot bind {} on {target}", from.display()))?;
    mount(None::<&str>, target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>)
        .with_context(|| format!("cannot make {target} read-only"))
}
