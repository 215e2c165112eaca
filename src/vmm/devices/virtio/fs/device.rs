//! The virtio-fs device as the transport sees it (the tag in config space,
//! activation), and how its shares become one FUSE filesystem.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::FsOptions;
use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::api::{BackFileSystem, Vfs, VfsOptions};
#[cfg(test)]
use fuse_backend_rs::passthrough::{CachePolicy, Config, PassthroughFs};
use thiserror::Error;

use super::boot::BootFs;
use super::bounded::{BoundedFs, FdBudget, HandleCount};
use super::event_handler::FsHandler;
use super::linger::Linger;
use super::pool::Pool;
use super::readonly::ReadOnlyFs;
use super::request::Access;
use super::secrets::Secrets;
use super::sightings::Sightings;
use super::tally::Tally;
use super::watched::Watched;
use super::writable::WritableFs;
use super::{CACHE_TIMEOUT, CONFIG_LEN, QUEUE_SIZES, READ_ONLY_THREAD, TAG_LEN, TYPE_FS, WRITABLE_THREAD};
use crate::vmm::devices::virtio::{
    ActivateError, Activation, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes, worker,
};

/// A host directory exposed read-only to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Where the directory appears inside the virtio-fs filesystem: an
    /// absolute path such as "/usr" or "/a/b"; "/" makes the share the whole
    /// filesystem (and then it must be the only one).
    pub guest_path: String,
    /// The host directory.
    pub host_path: PathBuf,
    /// Append what the guest looks up in this share to this sightings file
    /// (see [`sightings`]); read-only shares only.
    pub record: Option<PathBuf>,
    /// Bytes a writable share may come to hold (see [`Budget`]): an agent's
    /// state has a limit, a policy's `rw` mount only the free-space margin.
    pub limit: Option<u64>,
}

#[derive(Debug, Error)]
pub enum FsError {
    #[error("virtio-fs tag {0:?} must be 1 to {TAG_LEN} bytes without NUL")]
    Tag(String),
    #[error("guest path {guest_path:?} of share {} must be absolute, without \".\" or \"..\" components", host_path.display())]
    GuestPath { guest_path: String, host_path: PathBuf },
    #[error("share {} at {guest_path} overlaps share {} at {other_guest_path}", host_path.display(), other_host_path.display())]
    Overlap { guest_path: String, host_path: PathBuf, other_guest_path: String, other_host_path: PathBuf },
    #[error("cannot resolve share {}", path.display())]
    Resolve { path: PathBuf, source: io::Error },
    #[error("share {} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("cannot open share {} for the guest", path.display())]
    Import { path: PathBuf, source: io::Error },
    #[error("cannot open {} to record what the guest sees of share {}", record.display(), path.display())]
    Record { path: PathBuf, record: PathBuf, source: io::Error },
    #[error("cannot mount share {} at {guest_path} in the guest filesystem", path.display())]
    Mount { path: PathBuf, guest_path: String, source: fuse_backend_rs::api::vfs::VfsError },
    #[error("cannot measure writable share {} and its filesystem's free space", path.display())]
    Budget { path: PathBuf, source: io::Error },
    #[error("cannot open {} to serve it as the guest's init", path.display())]
    Init { path: PathBuf, source: io::Error },
}

/// The virtio-fs device, serving the filesystem `F`.
pub struct Fs<F: FileSystem + Send + Sync + 'static> {
    config: [u8; CONFIG_LEN],
    pub(super) server: Arc<Server<F>>,
    access: Access,
    /// Threads serving requests beside the worker (see `pool`): read-only
    /// devices only.
    helpers: usize,
    /// The longest watch of the request ring after serving it.
    linger: Duration,
}

/// The most helpers a read-only device's worker gets: the guest sends a
/// few dozen requests at once at most (a directory's files read ahead, 16
/// directories listed), each a few host calls.
const MAX_HELPERS: usize = 3;

/// Helpers for a read-only device whose guest has `vcpus`: the host's
/// CPUs the process may use, less the worker's and the vCPUs', at most
/// `MAX_HELPERS`. A helper with no CPU of its own takes turns with the
/// worker or a vCPU and serves nothing sooner (in the rig, two CPUs for a
/// one-vCPU guest: no row went faster with one). Read before the jail
/// closes: finding the CPUs reads cgroup files.
pub(super) fn helpers_beside(vcpus: u8) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    cpus.saturating_sub(1 + usize::from(vcpus)).min(MAX_HELPERS)
}

impl<F: FileSystem + Send + Sync + 'static> Fs<F> {
    /// The device with `helpers` threads beside its worker, if it is
    /// read-only.
    pub fn with_helpers(self, helpers: usize) -> Self {
        Fs { helpers, ..self }
    }

    /// The device with a worker that watches its ring for at most
    /// `longest` after serving it (see `Linger`).
    pub fn with_linger(self, longest: Duration) -> Self {
        Fs { linger: longest, ..self }
    }
}

impl Fs<ReadOnlyFs<Vfs>> {
    /// A device whose guest-visible mount tag is `tag`, serving `shares`
    /// read-only, each under its guest path inside one filesystem, none of
    /// `secrets` readable.
    pub fn new(tag: &str, shares: &[Share], secrets: &Secrets) -> Result<Self, FsError> {
        raise_fd_limit();
        Self::within(tag, shares, secrets, FdBudget::of_process())
    }

    /// [`Fs::new`], holding at most what `budget` allows of host
    /// descriptors for the shares.
    pub(super) fn within(tag: &str, shares: &[Share], secrets: &Secrets, budget: FdBudget) -> Result<Self, FsError> {
        let config = config_space(tag)?;
        let guest_paths = check_guest_paths(shares)?;
        let vfs = mount_shares(shares, &guest_paths, budget, secrets)?;
        let server = Arc::new(Server::new(ReadOnlyFs::new(vfs, CACHE_TIMEOUT)));
        Ok(Fs { config, server, access: Access::ReadOnly, helpers: 0, linger: Duration::ZERO })
    }
}

impl Fs<BootFs> {
    /// The device of the guest's first root, serving `init` as /init.
    /// Without helpers: its server reads the one file behind one lock.
    pub fn boot(tag: &str, init: &Path) -> Result<Self, FsError> {
        let config = config_space(tag)?;
        let fs = BootFs::new(init).map_err(|source| FsError::Init { path: init.to_owned(), source })?;
        Ok(Fs {
            config,
            server: Arc::new(Server::new(fs)),
            access: Access::ReadOnly,
            helpers: 0,
            linger: Duration::ZERO,
        })
    }
}

impl Fs<Vfs> {
    /// A device serving `shares` writable: what a policy mounts "rw". The
    /// guest's writes reach the host directories directly, so the guest may
    /// not cache what the host could change under it.
    /// Each share is held to the host user's own powers and to its budget
    /// (see [`WritableFs`]), and its host descriptors to half the read-only
    /// shares' budget (see [`FdBudget::halved`]); none of `secrets` is
    /// opened, as on the read-only shares (a policy may mount a directory
    /// holding one writable).
    pub fn writable(tag: &str, shares: &[Share], secrets: &Secrets) -> Result<Fs<Vfs>, FsError> {
        raise_fd_limit();
        Self::writable_within(tag, shares, secrets, None, FdBudget::of_process().halved())
    }

    /// [`Fs::writable`], keeping `margin` free bytes (tests) instead of the
    /// staging margin, and within `budget`'s host descriptors.
    pub(super) fn writable_within(
        tag: &str,
        shares: &[Share],
        secrets: &Secrets,
        margin: Option<u64>,
        budget: FdBudget,
    ) -> Result<Fs<Vfs>, FsError> {
        let config = config_space(tag)?;
        let guest_paths = check_guest_paths(shares)?;
        let vfs = Vfs::new(vfs_options());
        let handles = HandleCount::default();
        let cached = budget.inodes / shares.len().max(1);
        for (share, guest_path) in shares.iter().zip(&guest_paths) {
            let fs = open_bounded_share(&share.host_path, secrets, cached, &handles, budget.handles)?;
            let fs = WritableFs::new(fs.writable(), &share.host_path, share.limit, margin)
                .map_err(|source| FsError::Budget { path: share.host_path.clone(), source })?;
            vfs.mount(Box::new(fs), guest_path).map_err(|source| FsError::Mount {
                path: share.host_path.clone(),
                guest_path: guest_path.clone(),
                source,
            })?;
        }
        Ok(Fs {
            config,
            server: Arc::new(Server::new(vfs)),
            access: Access::Writable,
            helpers: 0,
            linger: Duration::ZERO,
        })
    }
}

/// A Vfs holding every share read-only, none of `secrets` readable; a
/// share that names a sightings file has its lookups recorded there. The
/// shares split `budget`'s cached descriptors and share its open handles.
pub(super) fn mount_shares(
    shares: &[Share],
    guest_paths: &[String],
    budget: FdBudget,
    secrets: &Secrets,
) -> Result<Vfs, FsError> {
    let vfs = Vfs::new(read_only_vfs_options());
    let handles = HandleCount::default();
    let cached = budget.inodes / shares.len().max(1);
    for (share, guest_path) in shares.iter().zip(guest_paths) {
        let fs = open_bounded_share(&share.host_path, secrets, cached, &handles, budget.handles)?;
        let fs: BackFileSystem =
            match share.record.as_deref() {
                Some(record) => {
                    let out = std::fs::OpenOptions::new().append(true).open(record).map_err(|source| {
                        FsError::Record { path: share.host_path.clone(), record: record.to_owned(), source }
                    })?;
                    Box::new(Watched::new(fs, Sightings::new(out)))
                }
                None => Box::new(fs),
            };
        vfs.mount(fs, guest_path).map_err(|source| FsError::Mount {
            path: share.host_path.clone(),
            guest_path: guest_path.clone(),
            source,
        })?;
    }
    Ok(vfs)
}

impl<F: FileSystem + Send + Sync + 'static> VirtioDevice for Fs<F> {
    fn device_type(&self) -> u32 {
        TYPE_FS
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError> {
        let Activation { mem, queues, interrupt, .. } = activation;
        if queues.len() != QUEUE_SIZES.len() {
            return Err(ActivateError::QueueCount { got: queues.len(), want: QUEUE_SIZES.len() });
        }
        let server = Arc::clone(&self.server);
        let access = self.access;
        // The writable shares' worker serves alone: what it keeps between
        // requests relies on one thread.
        let (thread, helpers) = match access {
            Access::ReadOnly => (&READ_ONLY_THREAD, self.helpers),
            Access::Writable => (&WRITABLE_THREAD, 0),
        };
        let tag = String::from_utf8_lossy(&self.config[..TAG_LEN]).trim_end_matches('\0').to_owned();
        let tally = Tally::default();
        let (pool, helpers) = Pool::new(helpers);
        let linger = Linger::new(self.linger);
        let handler = FsHandler { mem: Arc::new(mem), queues, interrupt, server, access, pool, tag, tally, linger };
        worker::spawn_with_helpers(thread, handler, helpers)
    }
}

/// `struct virtio_fs_config` for `tag` with one request queue.
pub(super) fn config_space(tag: &str) -> Result<[u8; CONFIG_LEN], FsError> {
    let bytes = tag.as_bytes();
    if bytes.is_empty() || bytes.len() > TAG_LEN || bytes.contains(&0) {
        return Err(FsError::Tag(tag.to_owned()));
    }
    let mut config = [0u8; CONFIG_LEN];
    config[..bytes.len()].copy_from_slice(bytes);
    config[TAG_LEN..].copy_from_slice(&1u32.to_le_bytes());
    Ok(config)
}

/// The normalized guest path of every share ("/a/b", or "/" for the root),
/// after checking that no share hides another: the Vfs does not nest mounts.
pub(super) fn check_guest_paths(shares: &[Share]) -> Result<Vec<String>, FsError> {
    let mut components: Vec<Vec<&str>> = Vec::with_capacity(shares.len());
    for share in shares {
        let bad = || FsError::GuestPath { guest_path: share.guest_path.clone(), host_path: share.host_path.clone() };
        let Some(rest) = share.guest_path.strip_prefix('/') else {
            return Err(bad());
        };
        let parts: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
        if parts.iter().any(|c| *c == "." || *c == ".." || c.contains('\0')) {
            return Err(bad());
        }
        components.push(parts);
    }
    for (i, a) in components.iter().enumerate() {
        for (j, b) in components.iter().enumerate().skip(i + 1) {
            if a.starts_with(b) || b.starts_with(a) {
                return Err(FsError::Overlap {
                    guest_path: shares[j].guest_path.clone(),
                    host_path: shares[j].host_path.clone(),
                    other_guest_path: shares[i].guest_path.clone(),
                    other_host_path: shares[i].host_path.clone(),
                });
            }
        }
    }
    Ok(components.iter().map(|c| format!("/{}", c.join("/"))).collect())
}

/// What the Vfs negotiates with the guest at FUSE_INIT: no writeback cache,
/// every open and opendir sent to us (so write opens meet EROFS), no DAX, no
/// killpriv, and guest-side caching of data, directories and symlinks.
pub(super) fn vfs_options() -> VfsOptions {
    VfsOptions {
        no_open: false,
        no_opendir: false,
        no_writeback: true,
        killpriv_v2: false,
        no_readdir: false,
        seal_size: false,
        out_opts: FsOptions::ASYNC_READ
            | FsOptions::PARALLEL_DIROPS
            | FsOptions::BIG_WRITES
            | FsOptions::ASYNC_DIO
            | FsOptions::AUTO_INVAL_DATA
            | FsOptions::MAX_PAGES
            | FsOptions::CACHE_SYMLINKS
            | FsOptions::DO_READDIRPLUS
            | FsOptions::READDIRPLUS_AUTO,
        ..VfsOptions::default()
    }
}

/// [`vfs_options`] for the read-only shares, where the guest opens files
/// and directories without asking: an open and its release are two round
/// trips per file read (half the requests of a `grep -r`) and per
/// directory listed (half those of a `find`), and every read and listing
/// still comes here, where [`BoundedFs`] refuses the secrets. Writes
/// cannot follow from a skipped open: the guest mounts these shares
/// read-only, and `ReadOnlyFs` refuses every request that would change a
/// file whatever the guest's kernel sends. A listing page opens the
/// directory for itself and seeks to the guest's offset, as it would on a
/// kept descriptor; the guest's kernel keeps the listing it read, as it
/// did with an open that said so.
///
/// Every page of a listing comes with the entries' attributes
/// (READDIRPLUS, not only the first page as READDIRPLUS_AUTO would have
/// it): a walk that stats or reads what it lists then sends no lookup per
/// name, whose answer would be the same entry with the same timeout.
pub(super) fn read_only_vfs_options() -> VfsOptions {
    let options = vfs_options();
    VfsOptions { no_open: true, no_opendir: true, out_opts: options.out_opts - FsOptions::READDIRPLUS_AUTO, ..options }
}

/// The passthrough configuration of one share: what the per-file cost
/// benchmark compares the bounded server with.
#[cfg(test)]
pub(super) fn passthrough_config(root_dir: String, cache_policy: CachePolicy) -> Config {
    Config {
        root_dir,
        // Inodes are O_PATH descriptors: name_to_handle_at is not available
        // on every filesystem a share may live on (overlayfs on 9p).
        inode_file_handles: false,
        // Always for read-only shares: the guest cannot change them, so it
        // may keep what it read.
        cache_policy,
        entry_timeout: CACHE_TIMEOUT,
        attr_timeout: CACHE_TIMEOUT,
        dir_entry_timeout: None,
        dir_attr_timeout: None,
        writeback: false,
        xattr: false,
        // Under a Vfs the root inode is imported before mounting, not at
        // FUSE_INIT.
        do_import: false,
        no_open: false,
        no_opendir: false,
        killpriv_v2: false,
        no_readdir: false,
        seal_size: false,
        enable_mntid: false,
        dax_file_size: None,
        // The guest sees each file's host inode number in the low 47 bits of
        // st_ino (the share's and the host device's index above them keep
        // files of different shares apart), and the same number after the
        // guest forgets a file and looks it up again. Git records the low 32
        // bits in its index: any other number makes the guest's first
        // `git status` re-read every tracked file.
        use_host_ino: true,
        // Reads go through the host page cache whatever the guest asks.
        allow_direct_io: false,
    }
}

/// A passthrough filesystem for the host directory `path`, its root imported.
#[cfg(test)]
pub(super) fn open_share(path: &Path, cache: CachePolicy) -> Result<PassthroughFs, FsError> {
    let root = std::fs::canonicalize(path).map_err(|source| FsError::Resolve { path: path.to_owned(), source })?;
    let meta = std::fs::metadata(&root).map_err(|source| FsError::Resolve { path: path.to_owned(), source })?;
    if !meta.is_dir() {
        return Err(FsError::NotADirectory { path: path.to_owned() });
    }
    let import = |source| FsError::Import { path: path.to_owned(), source };
    let root = root.into_os_string().into_string().map_err(|_| import(io::Error::other("not UTF-8")))?;
    let fs: PassthroughFs = PassthroughFs::new(passthrough_config(root, cache)).map_err(import)?;
    super::readonly::keeping_umask(|| fs.import()).map_err(import)?;
    Ok(fs)
}

/// A bounded filesystem for the host directory `path`, read-only until
/// made writable.
fn open_bounded_share(
    path: &Path,
    secrets: &Secrets,
    cached: usize,
    handles: &HandleCount,
    max_handles: usize,
) -> Result<BoundedFs, FsError> {
    let root = std::fs::canonicalize(path).map_err(|source| FsError::Resolve { path: path.to_owned(), source })?;
    let meta = std::fs::metadata(&root).map_err(|source| FsError::Resolve { path: path.to_owned(), source })?;
    if !meta.is_dir() {
        return Err(FsError::NotADirectory { path: path.to_owned() });
    }
    BoundedFs::new(&root, secrets, cached, handles, max_handles, CACHE_TIMEOUT)
        .map_err(|source| FsError::Import { path: path.to_owned(), source })
}

/// The file servers size their descriptor budgets by the soft limit: let
/// the process use as many descriptors as its hard limit allows.
pub(super) fn raise_fd_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes into `limit`, a valid rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        tracing::warn!("virtio-fs: cannot read the open file limit: {}", io::Error::last_os_error());
        return;
    }
    if limit.rlim_cur >= limit.rlim_max {
        return;
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit only reads `limit`, a valid rlimit we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        tracing::warn!("virtio-fs: cannot raise the open file limit: {}", io::Error::last_os_error());
    }
}
