//! A passthrough filesystem whose cost in host descriptors stays bounded
//! whatever the guest looks up, for the read-only shares, and in its
//! writable mode (`write`) for the writable ones.
//!
//! `PassthroughFs` holds one `O_PATH` descriptor per inode the guest keeps,
//! so a guest that walks a big tree runs the VMM out of descriptors (and
//! file handles, which would avoid that, need CAP_DAC_READ_SEARCH to open).
//! Here an inode is its parent inode, its name and the host identity
//! (device, inode) it had when looked up. Directories get `O_PATH`
//! descriptors when something beneath them is needed, kept in a
//! least-recently-used cache of at most [`FdBudget::inodes`]. A node is
//! found again from the root by its first names: from three components in
//! one `openat2` that the kernel keeps beneath the root and off symlinks
//! (`beneath`), else one component at a time with `O_NOFOLLOW`, a cached
//! descriptor standing for a step once its name still leads to it. What is
//! found must be the same device and inode or the answer is ESTALE: a name
//! the host renamed or replaced is never taken for another file, and a
//! directory the host moved out of the share is not served from its new
//! place. Files are looked up and stat'ed through their parent
//! and hold no descriptor until the guest opens them; open handles are
//! capped at [`FdBudget::handles`] (over all shares of a device), beyond
//! which an open gets ENFILE and nothing else breaks.
//!
//! Attributes are the host's own (times, owner, size), and so is the node
//! id: a file's host inode number when it is below 2^47 and on the share
//! root's device, else a number at or above 2^47 ([`NodeIds`]), the same
//! for the life of the filesystem. The Vfs puts the node id in st_ino (with
//! the share's index above it), so the guest sees the host's inode numbers
//! as git recorded them, the same after a forget, and hard links of one
//! file are one node. The root is [`ROOT`]; a host file numbered 1 gets a
//! number from the high range. Node ids are guessable, so every request
//! naming a node this filesystem does not hold fails.
//!
//! The host's secrets (see `secrets`) are refused here, by the node's own
//! device and inode, at every operation that reads content: open, read,
//! opendir, readlink. A handle exists only for what was allowed to open.
//!
//! The guest reads files without opening them (the device's Vfs answers
//! FUSE_OPEN with ENOSYS, so the guest stops sending opens and releases):
//! such a read names no handle, and the file is opened here for it, kept
//! among the last few [`READERS`] read so that the chunks of one big file
//! cost one open. Each read through a kept file checks what an open does
//! (not a secret, still where it was found); a listing page, that its
//! directory is not a secret.
//!
//! What is opened for its content is found with `O_PATH` first and opened
//! for reading (through /proc/thread-self/fd) only once it is a regular
//! file or a directory: a FIFO or device the host put in a node's place is
//! never opened. A lookup takes the node's kind afresh, since a host inode
//! number freed and reused may come back as another kind of file.
//!
//! Requests may come from several threads at once (a read-only device's
//! workers): what only reads the nodes, system calls included, runs side
//! by side; a lookup stats its name that way and enters the node alone
//! (see [`State`]).

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, FsOptions, OpenOptions, SetattrValid, stat64, statvfs64};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem, ZeroCopyReader, ZeroCopyWriter};
use fuse_backend_rs::api::{BackendFileSystem, VFS_MAX_INO, validate_path_component};

use super::secrets::Secrets;

mod beneath;
mod write;

use crate::jail;
use write::Make;

/// The root's node id, as the FUSE protocol and the watches expect.
pub const ROOT: u64 = 1;

/// Descriptors a VMM keeps for everything but the shares' budgets: disks,
/// event and socket descriptors, files read or listed without a handle.
const RESERVED: u64 = 1024;
/// Cached directory descriptors wanted per device: beyond this, a bigger
/// cache buys little (a re-open is a few `openat`s). Only the step by step
/// walk uses them.
pub const WANTED_INODES: usize = 16 << 10;
/// Open guest files wanted per device.
pub const WANTED_HANDLES: usize = 16 << 10;
/// Never fewer than this of either, whatever the limit.
const MIN_EACH: usize = 16;

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// How many host descriptors the read-only shares of one device may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Cached directory descriptors, split between the shares.
    pub inodes: usize,
    /// Files and directories the guest may hold open at once, all shares
    /// together.
    pub handles: usize,
}

impl FdBudget {
    /// The budget under an open-file limit of `limit`: a quarter each of
    /// what the VMM does not reserve, up to what is wanted.
    pub fn for_limit(limit: u64) -> FdBudget {
        let quarter = usize::try_from(limit.saturating_sub(RESERVED) / 4).unwrap_or(usize::MAX);
        FdBudget { inodes: quarter.clamp(MIN_EACH, WANTED_INODES), handles: quarter.clamp(MIN_EACH, WANTED_HANDLES) }
    }

    /// The open-file limit under which the budget is all that is wanted.
    pub fn wanted_limit() -> u64 {
        RESERVED + 4 * WANTED_INODES.max(WANTED_HANDLES) as u64
    }

    /// What the writable shares' device may hold: half of this (the
    /// read-only shares' budget), as the workspace and the toolchains are
    /// where the big trees are.
    pub fn halved(self) -> FdBudget {
        FdBudget { inodes: (self.inodes / 2).max(MIN_EACH), handles: (self.handles / 2).max(MIN_EACH) }
    }

    /// The budget under this process's soft RLIMIT_NOFILE.
    pub fn of_process() -> FdBudget {
        FdBudget::for_limit(open_file_limit().map_or(RESERVED * 4, |(soft, _)| soft))
    }
}

/// This process's RLIMIT_NOFILE, soft and hard.
pub fn open_file_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes into `limit`, a valid rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Bits of a host inode number a node id carries as it is.
const HOST_INO_BITS: u32 = 47;
/// Devices other than the share root's whose inode numbers get a range of
/// their own (slots 1 to this); slot 0 is the root's device.
const OTHER_DEVICES: usize = 254;
/// The slot of numbers handed out in sequence: inode numbers that do not
/// fit, the root device's inodes 0 and 1, devices beyond the others'.
const OVERFLOW_SLOT: u64 = 255;
/// Names a node keeps to be found again by (hard links).
const MAX_NAMES: usize = 4;
/// The most of a directory listing read at once, whatever the guest asks.
const MAX_LISTING: usize = 1 << 20;
/// Files kept open for reads that name no handle.
const READERS: usize = 8;
/// The handle of a read the guest sent without opening the file.
const NO_HANDLE: u64 = 0;
/// Path components from which a node is found in one `openat2` (see
/// `beneath`) rather than step by step: the walk costs one `fstatat` per
/// component, `openat2` three calls (with the `fstat` and the `close`).
const BENEATH_FROM: usize = 3;

/// Node ids from host identities (device, inode), one id per identity for
/// the life of the filesystem: `slot << 47 | ino`, the slot 0 for the share
/// root's device. No two identities share an id, none is [`ROOT`] or 0.
struct NodeIds {
    root_dev: u64,
    others: Vec<u64>,
    overflow: HashMap<(u64, u64), u64>,
    next_overflow: u64,
}

impl NodeIds {
    fn new(root_dev: u64) -> Self {
        NodeIds {
            root_dev,
            others: Vec::new(),
            overflow: HashMap::new(),
            next_overflow: OVERFLOW_SLOT << HOST_INO_BITS,
        }
    }

    fn id(&mut self, dev: u64, ino: u64) -> io::Result<u64> {
        let slot = if dev == self.root_dev {
            Some(0)
        } else if let Some(i) = self.others.iter().position(|&d| d == dev) {
            Some(i as u64 + 1)
        } else if self.others.len() < OTHER_DEVICES {
            self.others.push(dev);
            Some(self.others.len() as u64)
        } else {
            None
        };
        if let Some(slot) = slot
            && ino < 1 << HOST_INO_BITS
            && !(slot == 0 && ino <= ROOT)
        {
            return Ok(slot << HOST_INO_BITS | ino);
        }
        if let Some(&id) = self.overflow.get(&(dev, ino)) {
            return Ok(id);
        }
        let id = self.next_overflow;
        if id > VFS_MAX_INO {
            return Err(err(libc::ENFILE));
        }
        self.next_overflow += 1;
        self.overflow.insert((dev, ino), id);
        Ok(id)
    }
}

/// What one inode is: where to find it again and what it must be.
struct Node {
    /// The (parent, name) it was found at, the first the one its
    /// descendants are found through, each checked against `dev` and `ino`.
    names: Vec<(u64, CString)>,
    dev: u64,
    ino: u64,
    is_dir: bool,
    /// A regular file: the only kind of node opened for its content.
    is_file: bool,
    /// Lookups the guest has not forgotten.
    lookups: u64,
    /// Names of nodes in this directory: they need it to be found again.
    children: u64,
}

/// Directory descriptors, least recently used evicted first.
struct FdCache {
    capacity: usize,
    fds: HashMap<u64, (Arc<OwnedFd>, u64)>,
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl FdCache {
    fn new(capacity: usize) -> Self {
        FdCache { capacity: capacity.max(1), fds: HashMap::new(), by_use: BTreeMap::new(), clock: 0 }
    }

    fn get(&mut self, node: u64) -> Option<Arc<OwnedFd>> {
        let (fd, used) = self.fds.get_mut(&node)?;
        self.by_use.remove(used);
        self.clock += 1;
        *used = self.clock;
        self.by_use.insert(self.clock, node);
        Some(Arc::clone(fd))
    }

    /// Keeps `fd` as `node`'s, and returns the descriptors that made room
    /// for it, for the caller to close once it lets go of the cache's lock
    /// (a close is a system call other threads would wait behind).
    #[must_use = "closing what was evicted under the cache's lock makes other threads wait"]
    fn insert(&mut self, node: u64, fd: Arc<OwnedFd>) -> Vec<Arc<OwnedFd>> {
        let mut evicted: Vec<Arc<OwnedFd>> = self.take(node).into_iter().collect();
        while self.fds.len() >= self.capacity {
            match self.by_use.pop_first() {
                Some((_, oldest)) => evicted.extend(self.fds.remove(&oldest).map(|(fd, _)| fd)),
                None => break,
            }
        }
        self.clock += 1;
        self.fds.insert(node, (fd, self.clock));
        self.by_use.insert(self.clock, node);
        evicted
    }

    /// Takes `node`'s descriptor out of the cache.
    fn take(&mut self, node: u64) -> Option<Arc<OwnedFd>> {
        let (fd, used) = self.fds.remove(&node)?;
        self.by_use.remove(&used);
        Some(fd)
    }

    fn remove(&mut self, node: u64) {
        drop(self.take(node));
    }

    fn evict_one(&mut self) -> bool {
        match self.by_use.pop_first() {
            Some((_, node)) => {
                self.fds.remove(&node);
                true
            }
            None => false,
        }
    }

    /// Gives back half the cache: the process ran out of descriptors.
    fn shrink(&mut self) {
        for _ in 0..self.fds.len().div_ceil(2) {
            self.evict_one();
        }
    }

    fn clear(&mut self) {
        self.fds.clear();
        self.by_use.clear();
    }
}

/// A file or directory the guest opened.
struct Handle {
    file: File,
    /// The node opened, whatever node a later request names with the handle.
    node: u64,
    /// Serializes the seek and read of a directory listing.
    listing: Mutex<()>,
}

/// What the filesystem knows of the guest's nodes. Requests that only
/// read it (getattr, a read, a listing's checks) hold it shared, system
/// calls included, and run side by side; what changes it (a lookup's
/// entry, a forget, the writable shares' changes) holds it alone. The
/// descriptor caches have locks of their own, taken inside this one and
/// briefly: a shared holder may fill them.
struct State {
    nodes: HashMap<u64, Node>,
    ids: NodeIds,
    cache: Mutex<FdCache>,
    /// Files opened for reads that name no handle, by node.
    readers: Mutex<FdCache>,
    /// Nodes found in one `openat2`, for the tests to see which way was taken.
    #[cfg(test)]
    beneath: AtomicU64,
}

/// The guest's open handles, and the number of the next.
struct Handles {
    open: HashMap<u64, Arc<Handle>>,
    next: u64,
}

/// `m` locked, whatever a panicking holder left: the caches and the
/// handles hold nothing a half-done change could make unsafe to use.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The passthrough of one host directory (see the module).
pub struct BoundedFs {
    root: Arc<OwnedFd>,
    secrets: Secrets,
    timeout: Duration,
    state: RwLock<State>,
    /// Taken after `state` when both are.
    handles: Mutex<Handles>,
    /// Open handles of every share of the device, and their cap.
    open_handles: Arc<AtomicUsize>,
    max_handles: usize,
    /// Serving a writable share (see `write`): the guest changes it.
    writable: bool,
    /// Path components from which a node is found in one `openat2`, where
    /// the kernel and the jail allow it; step by step below (see
    /// [`Self::dir_fd`]).
    beneath_from: usize,
}

/// Where [`BoundedFs::at_node`] found a node: by its name in a directory
/// found step by step, or as an `O_PATH` descriptor of the node itself,
/// found in one `openat2` (see `beneath`).
enum Place<'a> {
    Named(RawFd, &'a CStr),
    Opened(OwnedFd),
}

impl Place<'_> {
    /// The directory and name for a `*at` call; the empty name of the
    /// descriptor itself (which `AT_EMPTY_PATH` or readlinkat takes).
    fn at(&self) -> (RawFd, &CStr) {
        match self {
            Place::Named(dir, name) => (*dir, name),
            Place::Opened(fd) => (fd.as_raw_fd(), c""),
        }
    }

    fn stat(&self) -> io::Result<stat64> {
        match self {
            Place::Named(dir, name) => fstatat(*dir, name),
            Place::Opened(fd) => fstat(fd.as_raw_fd()),
        }
    }

    /// An `O_PATH` descriptor of what is there.
    fn into_path(self, state: &State) -> io::Result<OwnedFd> {
        match self {
            Place::Named(dir, name) => open_at(state, dir, name, libc::O_PATH),
            Place::Opened(fd) => Ok(fd),
        }
    }
}

/// The count of open handles shared by the shares of one device.
#[derive(Clone, Default)]
pub struct HandleCount(Arc<AtomicUsize>);

impl BoundedFs {
    /// Serves the directory `root`, caching `cached` directory descriptors
    /// and counting open handles in `handles`, at most `max_handles`; none
    /// of `secrets` is read.
    pub fn new(
        root: &Path,
        secrets: &Secrets,
        cached: usize,
        handles: &HandleCount,
        max_handles: usize,
        timeout: Duration,
    ) -> io::Result<BoundedFs> {
        let root: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(root)?
            .into();
        let st = fstat(root.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(err(libc::ENOTDIR));
        }
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                names: Vec::new(),
                dev: st.st_dev,
                ino: st.st_ino,
                is_dir: true,
                is_file: false,
                lookups: 1,
                children: 0,
            },
        );
        Ok(BoundedFs {
            root: Arc::new(root),
            secrets: secrets.clone(),
            timeout,
            state: RwLock::new(State {
                nodes,
                ids: NodeIds::new(st.st_dev),
                cache: Mutex::new(FdCache::new(cached)),
                readers: Mutex::new(FdCache::new(READERS)),
                #[cfg(test)]
                beneath: AtomicU64::new(0),
            }),
            handles: Mutex::new(Handles { open: HashMap::new(), next: 1 }),
            open_handles: Arc::clone(&handles.0),
            max_handles,
            writable: false,
            beneath_from: BENEATH_FROM,
        })
    }

    /// This filesystem finding nodes in one `openat2` from `components`
    /// on (`usize::MAX`: never).
    #[cfg(test)]
    fn beneath_from(self, components: usize) -> BoundedFs {
        BoundedFs { beneath_from: components, ..self }
    }

    /// The path of components `chain` (from `chain_of`) and `last` after
    /// them, to be found in one `openat2`: `None` when it is to be walked
    /// instead, being short, longer than PATH_MAX, or `openat2` not
    /// being there or not being this worker's to call.
    fn beneath_path(&self, state: &State, chain: &[u64], last: Option<&CStr>) -> Option<CString> {
        if chain.len() + usize::from(last.is_some()) < self.beneath_from || !beneath::present() {
            return None;
        }
        let openat = if self.writable { super::WRITABLE_THREAD.openat } else { super::READ_ONLY_THREAD.openat };
        if !jail::may_openat2(openat) {
            return None;
        }
        let mut path = Vec::new();
        let names = chain.iter().rev().map(|step| state.nodes.get(step).and_then(|n| n.names.first()));
        for name in names.map(|n| n.map(|(_, name)| name.as_c_str())).chain(last.map(Some)) {
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name?.to_bytes());
            // The kernel takes PATH_MAX bytes with the NUL.
            if path.len() >= libc::PATH_MAX as usize {
                return None;
            }
        }
        CString::new(path).ok()
    }

    /// `path` opened beneath the root with `flags` (see `beneath`), or
    /// `None` when the walk is to decide.
    fn open_beneath(&self, state: &State, path: &CStr, flags: i32) -> io::Result<Option<OwnedFd>> {
        let opened = beneath::open(self.root.as_raw_fd(), path, flags, || locked(&state.cache).shrink())
            .map_err(stale_if_gone)?;
        #[cfg(test)]
        if opened.is_some() {
            state.beneath.fetch_add(1, Ordering::Relaxed);
        }
        Ok(opened)
    }

    /// This filesystem serving its share writable (see `write`), for the
    /// host user: the guest may change anything there the host user may.
    pub fn writable(self) -> BoundedFs {
        BoundedFs { writable: true, ..self }
    }

    /// `keep`, unless the share is writable: then the host's changes must
    /// reach the guest, whose data and listings are dropped at each open.
    fn cache_options(&self, keep: OpenOptions) -> OpenOptions {
        if self.writable { OpenOptions::empty() } else { keep }
    }

    /// The nodes, shared (see [`State`]).
    fn shared(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The nodes, to change them.
    fn exclusive(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, node: u64, attr: stat64) -> Entry {
        Entry {
            inode: node,
            generation: 0,
            attr,
            attr_flags: 0,
            attr_timeout: self.timeout,
            entry_timeout: self.timeout,
        }
    }

    /// An `O_PATH` descriptor of the directory `node`, found from the root
    /// by first names: in one `openat2` where it can be (see `beneath`),
    /// its identity checked, else step by step. A step's cached descriptor
    /// serves once its name still leads to it (one `fstatat`), others are
    /// opened again; a step whose name leads elsewhere or nowhere is
    /// ESTALE. So a directory the host moved (out of the share, maybe) is
    /// never served from where it went, cached or not.
    fn dir_fd(&self, state: &State, node: u64) -> io::Result<Arc<OwnedFd>> {
        let chain = chain_of(state, node)?;
        if let Some(path) = self.beneath_path(state, &chain, None)
            && let Some(found) = self.open_beneath(state, &path, libc::O_PATH | libc::O_DIRECTORY)?
        {
            let st = fstat(found.as_raw_fd())?;
            let n = state.nodes.get(&node).ok_or_else(|| err(libc::ESTALE))?;
            if (st.st_dev, st.st_ino) != (n.dev, n.ino) {
                locked(&state.cache).remove(node);
                return Err(err(libc::ESTALE));
            }
            // Not cached: a cached descriptor saves nothing here, where
            // each use finds the directory again.
            return Ok(Arc::new(found));
        }
        let mut fd = Arc::clone(&self.root);
        for &step in chain.iter().rev() {
            let n = state.nodes.get(&step).ok_or_else(|| err(libc::ESTALE))?;
            let (dev, ino) = (n.dev, n.ino);
            let name = &n.names.first().ok_or_else(|| err(libc::ESTALE))?.1;
            // Taken from the cache before its name is checked: another
            // request may evict it meanwhile, and what was checked is used.
            let cached = locked(&state.cache).get(step);
            if let Some(cached) = cached {
                let there = fstatat(fd.as_raw_fd(), name).map_err(stale_if_gone)?;
                if (there.st_dev, there.st_ino) != (dev, ino) {
                    locked(&state.cache).remove(step);
                    return Err(err(libc::ESTALE));
                }
                fd = cached;
                continue;
            }
            let opened =
                open_at(state, fd.as_raw_fd(), name, libc::O_PATH | libc::O_DIRECTORY).map_err(stale_if_gone)?;
            let st = fstat(opened.as_raw_fd())?;
            if (st.st_dev, st.st_ino) != (dev, ino) {
                return Err(err(libc::ESTALE));
            }
            fd = Arc::new(opened);
            let evicted = locked(&state.cache).insert(step, Arc::clone(&fd));
            drop(evicted);
        }
        Ok(fd)
    }

    /// `op` on `node` (not the root) by each of its names in turn, given
    /// where the name leads (see [`Place`]); the first whose host identity
    /// (the stat `op` returns) is the node's answers, and none is ESTALE.
    fn at_node<T>(
        &self,
        state: &State,
        node: u64,
        mut op: impl FnMut(&State, Place<'_>) -> io::Result<(T, stat64)>,
    ) -> io::Result<T> {
        let n = state.nodes.get(&node).ok_or_else(|| err(libc::ESTALE))?;
        let (dev, ino) = (n.dev, n.ino);
        let mut last = err(libc::ESTALE);
        for (parent, name) in &n.names {
            let found = self.node_beneath(state, *parent, name).and_then(|opened| match opened {
                Some(fd) => op(state, Place::Opened(fd)),
                None => {
                    let dir = self.dir_fd(state, *parent)?;
                    op(state, Place::Named(dir.as_raw_fd(), name))
                }
            });
            match found {
                Ok((value, st)) if (st.st_dev, st.st_ino) == (dev, ino) => return Ok(value),
                Ok(_) => last = err(libc::ESTALE),
                Err(e) => last = stale_if_gone(e),
            }
        }
        Err(last)
    }

    /// What `name` in `parent` leads to, opened `O_PATH` in one `openat2`
    /// (see `beneath`), or `None` when it is to be walked to.
    fn node_beneath(&self, state: &State, parent: u64, name: &CStr) -> io::Result<Option<OwnedFd>> {
        let chain = chain_of(state, parent)?;
        match self.beneath_path(state, &chain, Some(name)) {
            Some(path) => self.open_beneath(state, &path, libc::O_PATH | libc::O_NOFOLLOW),
            None => Ok(None),
        }
    }

    /// The host's attributes of `node`, which must still be what it was.
    /// A file the guest removed while holding it open (no name left) is
    /// stat'ed through one of its handles.
    fn stat_node(&self, state: &State, node: u64) -> io::Result<stat64> {
        if node == ROOT {
            return fstat(self.root.as_raw_fd());
        }
        if state.nodes.get(&node).is_some_and(|n| n.names.is_empty())
            && let Some(open) = locked(&self.handles).open.values().find(|h| h.node == node).cloned()
        {
            return fstat(open.file.as_raw_fd());
        }
        self.at_node(state, node, |_, place| place.stat().map(|st| (st, st)))
    }

    /// Refuses the content of a node the filesystem does not hold or that
    /// is one of the host's secrets.
    fn readable(&self, state: &State, node: u64) -> io::Result<()> {
        if self.is_secret(state, node)? {
            return Err(err(libc::EACCES));
        }
        Ok(())
    }

    /// Whether `node` is one of the host's secrets or inside one: by its
    /// identity, or by any of its names (what the host put in a secret's
    /// place since the start), or any directory it is found through is. A
    /// node the guest held before the host renamed a directory on its way
    /// into a secret directory's place is inside that secret, though no
    /// lookup in it found the node.
    fn is_secret(&self, state: &State, node: u64) -> io::Result<bool> {
        state.nodes.get(&node).ok_or_else(|| err(libc::ESTALE))?;
        let mut seen = std::collections::HashSet::new();
        let mut work = vec![node];
        while let Some(at) = work.pop() {
            let Some(n) = state.nodes.get(&at) else { continue };
            if !seen.insert(at) {
                continue;
            }
            if self.secrets.holds(n.dev, n.ino) {
                return Ok(true);
            }
            for (parent, name) in &n.names {
                if state.nodes.get(parent).is_some_and(|p| self.secrets.placed(p.dev, p.ino, name)) {
                    return Ok(true);
                }
                work.push(*parent);
            }
        }
        Ok(false)
    }

    /// Opens `node` for reading (a directory with O_DIRECTORY), checking
    /// it is still what it was.
    fn open_node(&self, node: u64, directory: bool, flags: u32) -> io::Result<u64> {
        self.counted(|| self.open_counted(node, directory, flags))
    }

    /// `open`, counted among the open handles, or ENFILE at the cap.
    fn counted<T>(&self, open: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        if self.open_handles.fetch_add(1, Ordering::AcqRel) >= self.max_handles {
            self.open_handles.fetch_sub(1, Ordering::AcqRel);
            return Err(err(libc::ENFILE));
        }
        let opened = open();
        if opened.is_err() {
            self.open_handles.fetch_sub(1, Ordering::AcqRel);
        }
        opened
    }

    /// A new descriptor of `node` for reading, if it may be read and is
    /// still what it was.
    fn open_file(&self, state: &State, node: u64, directory: bool) -> io::Result<OwnedFd> {
        self.readable(state, node)?;
        // A device, FIFO or socket on the host is not the guest's to open:
        // its kind is known from the lookup, before any open reaches it.
        if !directory && !state.nodes.get(&node).is_some_and(|n| n.is_file) {
            return Err(err(libc::ENXIO));
        }
        let kind = if directory { libc::O_DIRECTORY } else { 0 };
        if node == ROOT {
            return open_at(state, self.root.as_raw_fd(), c".", libc::O_RDONLY | kind);
        }
        // Found as a bare reference first (O_PATH opens nothing: a FIFO's
        // writer is not released, a device not woken), and opened for
        // reading only once it is a regular file or a directory: what the
        // host put in the node's place since the lookup may be anything.
        let (path, st) = self.at_node(state, node, |state, place| {
            let path = place.into_path(state)?;
            let st = fstat(path.as_raw_fd())?;
            Ok(((path, st), st))
        })?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR if directory => reopen(state, &path, libc::O_RDONLY | kind),
            libc::S_IFREG if !directory => reopen(state, &path, libc::O_RDONLY),
            _ if directory => Err(err(libc::ENOTDIR)),
            // A device, FIFO or socket on the host is not the guest's to open.
            _ => Err(err(libc::ENXIO)),
        }
    }

    /// The file `node` open for a read that names no handle.
    fn reader(&self, node: u64) -> io::Result<Arc<OwnedFd>> {
        let state = self.shared();
        let kept = locked(&state.readers).get(node);
        if let Some(fd) = kept {
            if let Err(e) = self.still_readable(&state, node) {
                locked(&state.readers).remove(node);
                return Err(e);
            }
            return Ok(fd);
        }
        let fd = Arc::new(self.open_file(&state, node, false)?);
        let evicted = locked(&state.readers).insert(node, Arc::clone(&fd));
        drop(evicted);
        Ok(fd)
    }

    /// What an open of `node` checks, for a descriptor kept from an
    /// earlier one: not a secret (by identity or by any name), and still
    /// where it was found, beneath the root (see [`Self::at_node`]).
    fn still_readable(&self, state: &State, node: u64) -> io::Result<()> {
        self.readable(state, node)?;
        self.at_node(state, node, |_, place| place.stat().map(|st| ((), st)))
    }

    /// What a request through `handle` checks: its node is no secret and,
    /// while it has a name, is still where that name leads beneath the
    /// root. Since the open, the host may have moved it out of the share or
    /// renamed it into a secret's place, where reads, listings and writes
    /// through the descriptor would reach what the guest may not. A file
    /// the guest removed while holding it open has only the handle.
    fn still_held(&self, handle: &Handle) -> io::Result<()> {
        self.still_there(&self.shared(), handle.node)
    }

    /// What [`Self::still_held`] checks, of `node`: no secret and, while it
    /// has a name, still where that name leads beneath the root.
    fn still_there(&self, state: &State, node: u64) -> io::Result<()> {
        if node == ROOT || state.nodes.get(&node).is_some_and(|n| n.names.is_empty()) {
            return self.readable(state, node);
        }
        self.still_readable(state, node)
    }

    fn open_counted(&self, node: u64, directory: bool, flags: u32) -> io::Result<u64> {
        let state = self.shared();
        let file = if self.writable && !directory && super::readonly::opens_for_writing(flags) {
            self.open_writing(&state, node, write::open_flags(flags)?)?
        } else {
            self.open_file(&state, node, directory)?
        };
        Ok(self.new_handle(node, file))
    }

    /// A handle of `file`, opened as `node`, already counted.
    fn new_handle(&self, node: u64, file: OwnedFd) -> u64 {
        let mut handles = locked(&self.handles);
        let handle = handles.next;
        handles.next += 1;
        handles.open.insert(handle, Arc::new(Handle { file: File::from(file), node, listing: Mutex::new(()) }));
        handle
    }

    fn handle(&self, handle: u64) -> io::Result<Arc<Handle>> {
        locked(&self.handles).open.get(&handle).cloned().ok_or_else(|| err(libc::EBADF))
    }

    fn close(&self, handle: u64) -> io::Result<()> {
        let closed = locked(&self.handles).open.remove(&handle);
        match closed {
            Some(_) => {
                self.open_handles.fetch_sub(1, Ordering::AcqRel);
                Ok(())
            }
            None => Err(err(libc::EBADF)),
        }
    }

    /// Drops `count` lookups of `node`, and the node once none are left and
    /// nothing beneath it is held, then its parents likewise.
    fn forget_one(state: &mut State, node: u64, count: u64) {
        let mut work = vec![(node, count)];
        while let Some((node, count)) = work.pop() {
            if node == ROOT {
                continue;
            }
            let Some(n) = state.nodes.get_mut(&node) else { continue };
            n.lookups = n.lookups.saturating_sub(count);
            if n.lookups > 0 || n.children > 0 {
                continue;
            }
            let Some(gone) = state.nodes.remove(&node) else { continue };
            locked(&state.cache).remove(node);
            locked(&state.readers).remove(node);
            for (parent, _) in gone.names {
                if let Some(p) = state.nodes.get_mut(&parent) {
                    p.children = p.children.saturating_sub(1);
                    work.push((parent, 0));
                }
            }
        }
    }

    /// Takes the kind of `node` from `st`, a fresh stat of it: a host inode
    /// number freed and reused (`rm out; mkdir out`) is the same node id
    /// for a file of another kind, which the guest kernel replaces as it
    /// sees the new type. Descriptors kept for the old kind go.
    fn refresh_kind(state: &mut State, node: u64, st: &stat64) {
        let kind = st.st_mode & libc::S_IFMT;
        let Some(n) = state.nodes.get_mut(&node) else { return };
        let (is_dir, is_file) = (kind == libc::S_IFDIR, kind == libc::S_IFREG);
        if (n.is_dir, n.is_file) != (is_dir, is_file) {
            (n.is_dir, n.is_file) = (is_dir, is_file);
            locked(&state.cache).remove(node);
            locked(&state.readers).remove(node);
        }
    }

    /// Whether `ancestor` is `node` or found through it by first names.
    fn leads_through(state: &State, node: u64, ancestor: u64) -> bool {
        let mut at = node;
        for _ in 0..=state.nodes.len() {
            if at == ancestor {
                return true;
            }
            match first_parent(state, at) {
                Ok(parent) if at != ROOT => at = parent,
                _ => return false,
            }
        }
        true
    }

    /// The entry of what the host has at `name` in `parent`, whose
    /// attributes are `st`, counted as a lookup of its node. A parent
    /// forgotten since it was found is stale: a name is never kept under
    /// a node that cannot be found.
    fn enter(&self, state: &mut State, parent: u64, name: &CStr, st: stat64) -> io::Result<Entry> {
        if !state.nodes.contains_key(&parent) {
            return Err(err(libc::ESTALE));
        }
        let id = state.ids.id(st.st_dev, st.st_ino)?;
        if state.nodes.contains_key(&id) {
            Self::refresh_kind(state, id, &st);
            Self::add_name(state, id, parent, name);
            return Ok(self.entry(id, st));
        }
        state.nodes.insert(
            id,
            Node {
                names: vec![(parent, name.to_owned())],
                dev: st.st_dev,
                ino: st.st_ino,
                is_dir: st.st_mode & libc::S_IFMT == libc::S_IFDIR,
                is_file: st.st_mode & libc::S_IFMT == libc::S_IFREG,
                lookups: 1,
                children: 0,
            },
        );
        if let Some(p) = state.nodes.get_mut(&parent) {
            p.children += 1;
        }
        Ok(self.entry(id, st))
    }

    /// Counts a lookup of `id` found as `name` in `parent`, and keeps the
    /// name (see [`Self::put_name`]).
    fn add_name(state: &mut State, id: u64, parent: u64, name: &CStr) {
        let Some(node) = state.nodes.get_mut(&id) else { return };
        node.lookups += 1;
        Self::put_name(state, id, parent, name);
    }

    /// Keeps `name` in `parent` as the first name of `id` (the one
    /// confirmed last), unless the parent is found through the node itself
    /// (a directory bind-mounted beneath itself), where the name is not
    /// kept: names never form a loop.
    fn put_name(state: &mut State, id: u64, parent: u64, name: &CStr) {
        let through_self = Self::leads_through(state, parent, id);
        let Some(node) = state.nodes.get_mut(&id) else { return };
        if through_self {
            return;
        }
        match node.names.iter().position(|(p, n)| *p == parent && n.as_c_str() == name) {
            Some(i) => node.names[..=i].rotate_right(1),
            None => {
                node.names.insert(0, (parent, name.to_owned()));
                let dropped = if node.names.len() > MAX_NAMES { node.names.pop() } else { None };
                if let Some(p) = state.nodes.get_mut(&parent) {
                    p.children += 1;
                }
                if let Some((old_parent, _)) = dropped {
                    if let Some(p) = state.nodes.get_mut(&old_parent) {
                        p.children = p.children.saturating_sub(1);
                    }
                    Self::forget_one(state, old_parent, 0);
                }
            }
        }
    }

    /// The directory `parent` found from the root (see [`Self::dir_fd`]),
    /// for names to be looked up in it: refused when it is no directory,
    /// and EACCES when it is a secret, as nothing in a secret directory is
    /// found and so nothing beneath it is a node to read.
    fn lookup_dir(&self, state: &State, parent: u64) -> io::Result<Arc<OwnedFd>> {
        match state.nodes.get(&parent) {
            Some(n) if n.is_dir && self.is_secret(state, parent)? => Err(err(libc::EACCES)),
            Some(n) if n.is_dir => self.dir_fd(state, parent),
            Some(_) => Err(err(libc::ENOTDIR)),
            None => Err(err(libc::ESTALE)),
        }
    }

    /// The entry of `name` (one component) in `parent`, found through
    /// `dir`, the descriptor [`Self::lookup_dir`] gave for it: stat'ed
    /// without holding the nodes, entered holding them alone.
    fn lookup_in(&self, parent: u64, dir: &OwnedFd, name: &CStr) -> io::Result<Entry> {
        let st = fstatat(dir.as_raw_fd(), name)?;
        self.enter(&mut self.exclusive(), parent, name, st)
    }

    /// Reads up to `size` bytes of the listing of directory `node` from
    /// `offset`, through `handle` or, for a guest that lists without
    /// opening (the read-only shares), a descriptor opened for this read
    /// alone, and hands each entry but "." and ".." to `each` until it
    /// takes none.
    fn list(
        &self,
        node: u64,
        handle: u64,
        size: u32,
        offset: u64,
        each: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        if size == 0 {
            return Ok(());
        }
        // The guest names the size; a page or a few is what Linux asks.
        let mut buf = vec![0u8; (size as usize).min(MAX_LISTING)];
        if handle == NO_HANDLE {
            // Counted as an open handle while it lives, so the guest's
            // listings in flight stay within the share's descriptors.
            let dir = self.counted(|| self.open_file(&self.shared(), node, true))?;
            let listed = list_from(dir.as_raw_fd(), offset, &mut buf, each);
            drop(dir);
            self.open_handles.fetch_sub(1, Ordering::AcqRel);
            listed
        } else {
            let handle = self.handle(handle)?;
            self.still_held(&handle)?;
            let _listing = handle.listing.lock().unwrap_or_else(|p| p.into_inner());
            list_from(handle.file.as_raw_fd(), offset, &mut buf, each)
        }
    }
}

/// The entries of directory `fd` from `offset` on, handed to `each` until
/// it takes no more (returns 0) or the directory ends. A reply therefore
/// ends short only at the directory's end, whatever the host's batches
/// (a filesystem may return fewer than fit) and whatever `each` skips: the
/// guest kernel takes a reply with room left for the longest entry as the
/// end and does not ask for the empty one after it (guest kernel patch
/// 0004).
fn list_from(
    fd: RawFd,
    offset: u64,
    buf: &mut [u8],
    each: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
) -> io::Result<()> {
    let offset = libc::off64_t::try_from(offset).map_err(|_| err(libc::EINVAL))?;
    // SAFETY: lseek64 only moves the offset of `fd`, a directory we own.
    if unsafe { libc::lseek64(fd, offset, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        let read = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        if read == 0 {
            return Ok(());
        }
        // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
        const NAME_AT: usize = 19;
        let mut rest = &buf[..read];
        while rest.len() >= NAME_AT {
            let ino = u64::from_ne_bytes(rest[0..8].try_into().unwrap_or_default());
            let off = u64::from_ne_bytes(rest[8..16].try_into().unwrap_or_default());
            let reclen = usize::from(u16::from_ne_bytes(rest[16..18].try_into().unwrap_or_default()));
            let type_ = u32::from(rest[18]);
            if reclen < NAME_AT || reclen > rest.len() {
                return Err(err(libc::EIO));
            }
            let raw = &rest[NAME_AT..reclen];
            let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            rest = &rest[reclen..];
            if name == b"." || name == b".." {
                continue;
            }
            if each(DirEntry { ino, offset: off, type_, name })? == 0 {
                return Ok(());
            }
        }
    }
}

/// Up to `size` bytes of the file `fd` from `offset` into `w`.
fn read_from(fd: RawFd, w: &mut dyn ZeroCopyWriter, size: u32, offset: u64) -> io::Result<usize> {
    // SAFETY: `fd` stays open for this call (its owner is held by the
    // caller), past this borrowed File, which never closes it (ManuallyDrop).
    let mut file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    w.write_from(&mut *file, size as usize, offset)
}

/// EINVAL unless `name` is one plain component: not empty, "." or "..",
/// without '/'; anything else would reach beyond its directory.
fn component(name: &CStr) -> io::Result<()> {
    if name.is_empty() {
        return Err(err(libc::EINVAL));
    }
    validate_path_component(name)
}

/// The nodes from `node` up to the root by first names, the root left out.
fn chain_of(state: &State, node: u64) -> io::Result<Vec<u64>> {
    let mut chain = Vec::new();
    let mut at = node;
    while at != ROOT {
        // First names never form a loop (see `add_name`); this is a guard.
        if chain.len() > state.nodes.len() {
            return Err(err(libc::ELOOP));
        }
        chain.push(at);
        at = first_parent(state, at)?;
    }
    Ok(chain)
}

/// The directory `node` is found in first.
fn first_parent(state: &State, node: u64) -> io::Result<u64> {
    state.nodes.get(&node).and_then(|n| n.names.first()).map(|(parent, _)| *parent).ok_or_else(|| err(libc::ESTALE))
}

/// Treats a name gone or changed in kind on the host as a stale inode.
fn stale_if_gone(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => err(libc::ESTALE),
        _ => e,
    }
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)`; when the process is
/// out of descriptors, half the cache is given back and it is tried again.
/// What is opened for reading is opened with O_NOATIME where the host
/// allows it (files the host user owns): the guest's reads leave the
/// host's access times alone.
fn open_at(state: &State, dir: RawFd, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    open_at_mode(state, dir, name, flags, 0)
}

/// [`open_at`], with the `mode` of a file O_CREAT makes.
fn open_at_mode(state: &State, dir: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    open_following(state, dir, name, flags | libc::O_NOFOLLOW, mode)
}

/// The `O_PATH` descriptor `path` opened again with `flags`, through its
/// link in /proc/thread-self/fd: the very file `path` stands for, whatever
/// its name leads to now. (The jail's Landlock rules judge the file
/// reached, which is in a share, and seccomp the flags.) The calling
/// thread's own link: the read-only worker has a descriptor table of its
/// own (see `jail::thread`), and /proc/self/fd is the main thread's.
fn reopen(state: &State, path: &OwnedFd, flags: i32) -> io::Result<OwnedFd> {
    if let Some(fd_dir) = own_fd_dir() {
        let link = CString::new(path.as_raw_fd().to_string()).map_err(|_| err(libc::EINVAL))?;
        return open_following(state, fd_dir, &link, flags, 0);
    }
    let link = CString::new(format!("/proc/thread-self/fd/{}", path.as_raw_fd())).map_err(|_| err(libc::EINVAL))?;
    open_following(state, libc::AT_FDCWD, &link, flags, 0)
}

/// The calling thread's /proc/thread-self/fd, found once (`O_PATH`, which
/// opens nothing): a reopen then resolves the descriptor's link alone, not
/// /proc, the thread's directory and fd again, which was half of what the
/// first read of a small file cost the host. It lists the thread's own
/// table whenever it is read, so a table unshared later is the one seen.
/// None where procfs did not give it: the whole path is used.
fn own_fd_dir() -> Option<RawFd> {
    thread_local! {
        static FD_DIR: Option<OwnedFd> = File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open("/proc/thread-self/fd")
            .ok()
            .map(OwnedFd::from);
    }
    FD_DIR.with(|dir| dir.as_ref().map(AsRawFd::as_raw_fd))
}

/// [`open_at_mode`] with symlinks followed (`flags` may forbid them).
fn open_following(state: &State, dir: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let once = |flags: i32| {
        // SAFETY: `name` is a NUL-terminated string; openat returns a new
        // descriptor that we own or -1.
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            // SAFETY: `fd` was just opened and nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
    };
    let attempt = |flags: i32| {
        // Writes change the times anyway.
        if flags & libc::O_PATH != 0 || flags & (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC) != libc::O_RDONLY {
            return once(flags);
        }
        match once(flags | libc::O_NOATIME) {
            // Not the host user's file (nor CAP_FOWNER): read it as anyone would.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => once(flags),
            other => other,
        }
    };
    match attempt(flags) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            locked(&state.cache).shrink();
            attempt(flags)
        }
        other => other,
    }
}

fn fstat(fd: RawFd) -> io::Result<stat64> {
    fstatat_flags(fd, c"", libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

fn fstatat(dir: RawFd, name: &CStr) -> io::Result<stat64> {
    fstatat_flags(dir, name, libc::AT_SYMLINK_NOFOLLOW)
}

fn fstatat_flags(dir: RawFd, name: &CStr, flags: i32) -> io::Result<stat64> {
    let mut st = std::mem::MaybeUninit::<stat64>::zeroed();
    // SAFETY: `name` is NUL-terminated and the kernel writes only `st`.
    if unsafe { libc::fstatat64(dir, name.as_ptr(), st.as_mut_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat64 succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

impl BackendFileSystem for BoundedFs {
    fn mount(&self) -> io::Result<(Entry, u64)> {
        let st = fstat(self.root.as_raw_fd())?;
        Ok((self.entry(ROOT, st), VFS_MAX_INO))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl FileSystem for BoundedFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, _capable: FsOptions) -> io::Result<FsOptions> {
        Ok(FsOptions::empty())
    }

    /// A remount starts from the root alone.
    fn destroy(&self) {
        let mut state = self.exclusive();
        let mut handles = locked(&self.handles);
        let closed = handles.open.len();
        handles.open.clear();
        self.open_handles.fetch_sub(closed, Ordering::AcqRel);
        locked(&state.cache).clear();
        locked(&state.readers).clear();
        state.nodes.retain(|&id, _| id == ROOT);
        if let Some(root) = state.nodes.get_mut(&ROOT) {
            root.children = 0;
        }
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        // The Vfs lets "." and ".." through to lookups (for NFS exports):
        // ".." of the share's root is the host directory above it.
        component(name)?;
        let dir = self.lookup_dir(&self.shared(), parent)?;
        self.lookup_in(parent, &dir, name)
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        Self::forget_one(&mut self.exclusive(), inode, count);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        let mut state = self.exclusive();
        for (inode, count) in requests {
            Self::forget_one(&mut state, inode, count);
        }
    }

    fn getattr(&self, _ctx: &Context, inode: u64, handle: Option<u64>) -> io::Result<(stat64, Duration)> {
        let st = match handle {
            // Checked as a read through it is: a file the host moved out
            // of the share since the open is not stat'ed there.
            Some(h) if h != NO_HANDLE => {
                let handle = self.handle(h)?;
                self.still_held(&handle)?;
                fstat(handle.file.as_raw_fd())?
            }
            _ => self.stat_node(&self.shared(), inode)?,
        };
        Ok((st, self.timeout))
    }

    fn readlink(&self, _ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        let state = self.shared();
        self.readable(&state, inode)?;
        if inode == ROOT {
            return Err(err(libc::EINVAL));
        }
        self.at_node(&state, inode, |_, place| {
            let st = place.stat()?;
            if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                return Err(err(libc::EINVAL));
            }
            let mut buf = vec![0u8; libc::PATH_MAX as usize];
            let (dir, name) = place.at();
            // SAFETY: `name` is NUL-terminated; the kernel writes at most
            // `buf.len()` bytes into `buf`.
            let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
            buf.truncate(n);
            Ok((buf, st))
        })
    }

    fn open(
        &self,
        _ctx: &Context,
        inode: u64,
        flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        let handle = self.open_node(inode, false, flags)?;
        Ok((Some(handle), self.cache_options(OpenOptions::KEEP_CACHE), None))
    }

    fn read(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        if handle == NO_HANDLE {
            let fd = self.reader(inode)?;
            return read_from(fd.as_raw_fd(), w, size, offset);
        }
        let handle = self.handle(handle)?;
        self.still_held(&handle)?;
        read_from(handle.file.as_raw_fd(), w, size, offset)
    }

    fn flush(&self, _ctx: &Context, _inode: u64, _handle: u64, _lock_owner: u64) -> io::Result<()> {
        Ok(())
    }

    fn setattr(
        &self,
        _ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        Ok((self.set_attr(inode, attr, handle, valid)?, self.timeout))
    }

    fn symlink(&self, _ctx: &Context, linkname: &CStr, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.make(parent, name, Make::Symlink { target: linkname }, 0)
    }

    fn mknod(&self, _ctx: &Context, parent: u64, name: &CStr, mode: u32, rdev: u32, umask: u32) -> io::Result<Entry> {
        self.make(parent, name, Make::Node { mode, rdev }, umask)
    }

    fn mkdir(&self, _ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32) -> io::Result<Entry> {
        self.make(parent, name, Make::Dir { mode }, umask)
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.remove(parent, name, false)
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.remove(parent, name, true)
    }

    fn rename(
        &self,
        _ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.rename_node(olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, _ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        self.link_node(inode, newparent, newname)
    }

    fn create(
        &self,
        _ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        let (entry, handle) = self.create_file(parent, name, args.mode, args.umask, args.flags)?;
        Ok((entry, Some(handle), OpenOptions::empty(), None))
    }

    fn write(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<usize> {
        self.write_at(inode, handle, r, size, offset)
    }

    fn fsync(&self, _ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.sync(inode, handle, datasync)
    }

    fn fsyncdir(&self, _ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.sync(inode, handle, datasync)
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.allocate(inode, handle, mode, offset, length)
    }

    fn release(
        &self,
        _ctx: &Context,
        _inode: u64,
        _flags: u32,
        handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.close(handle)
    }

    fn statfs(&self, _ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        let state = self.shared();
        let dir = match state.nodes.get(&inode) {
            Some(n) if n.is_dir => inode,
            Some(_) => first_parent(&state, inode)?,
            None => return Err(err(libc::ESTALE)),
        };
        let fd = self.dir_fd(&state, dir)?;
        let mut out = std::mem::MaybeUninit::<statvfs64>::zeroed();
        // SAFETY: the kernel writes only `out`.
        if unsafe { libc::fstatvfs64(fd.as_raw_fd(), out.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstatvfs64 succeeded, so it filled `out`.
        Ok(unsafe { out.assume_init() })
    }

    fn opendir(&self, _ctx: &Context, inode: u64, _flags: u32) -> io::Result<(Option<u64>, OpenOptions)> {
        if !self.shared().nodes.get(&inode).is_some_and(|n| n.is_dir) {
            return Err(err(libc::ENOTDIR));
        }
        let handle = self.open_node(inode, true, 0)?;
        Ok((Some(handle), self.cache_options(OpenOptions::KEEP_CACHE | OpenOptions::CACHE_DIR)))
    }

    fn readdir(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.list(inode, handle, size, offset, add_entry)
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        // The directory is found from the root and checked once for the
        // page (at its first entry, after the listing's own checks) and
        // once after it, and each entry looked up through it: a walk or an
        // `openat2` per entry cost a deep directory's listing four system
        // calls a name where the host's takes one.
        let mut page_dir: Option<Arc<OwnedFd>> = None;
        let mut handed = Vec::new();
        let listed = self.list(inode, handle, size, offset, &mut |mut dir_entry| {
            let name = CString::new(dir_entry.name).map_err(|_| err(libc::EIO))?;
            component(&name)?;
            let dir = match &page_dir {
                Some(dir) => Arc::clone(dir),
                None => {
                    let dir = self.lookup_dir(&self.shared(), inode)?;
                    page_dir = Some(Arc::clone(&dir));
                    dir
                }
            };
            let found = self.lookup_in(inode, &dir, &name);
            let entry = match found {
                Ok(entry) => entry,
                // Gone since it was listed: the guest hears of it no more
                // than of a name removed before the listing.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(1),
                Err(e) => return Err(e),
            };
            dir_entry.ino = entry.attr.st_ino;
            // A node the guest was not told of is not kept: an entry the
            // reply could not take, or one that failed to encode.
            let took = add_entry(dir_entry, entry).inspect_err(|_| {
                Self::forget_one(&mut self.exclusive(), entry.inode, 1);
            })?;
            if took == 0 {
                Self::forget_one(&mut self.exclusive(), entry.inode, 1);
            } else {
                handed.push(entry.inode);
            }
            Ok(took)
        });
        // The directory must still be where it was found once the page is
        // made: a page during which the host moved it (into a secret's
        // place, out of the share) is refused, so no entry stat'ed after
        // the move through the page's descriptor is handed over.
        let listed = listed.and_then(|()| match page_dir {
            Some(_) => self.still_there(&self.shared(), inode),
            None => Ok(()),
        });
        // A page that fails midway is answered with the error alone: the
        // guest never hears of the entries before it, nor forgets them.
        if listed.is_err() {
            let mut state = self.exclusive();
            for node in handed {
                Self::forget_one(&mut state, node, 1);
            }
        }
        listed
    }

    fn releasedir(&self, _ctx: &Context, _inode: u64, _flags: u32, handle: u64) -> io::Result<()> {
        self.close(handle)
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        let st = self.stat_node(&self.shared(), inode)?;
        let mode = i32::try_from(mask & 0o7).unwrap_or(0) & (libc::R_OK | libc::W_OK | libc::X_OK);
        let allowed = |bits: u32| -> bool {
            (st.st_uid == ctx.uid && st.st_mode & (bits << 6) != 0)
                || (st.st_gid == ctx.gid && st.st_mode & (bits << 3) != 0)
                || st.st_mode & bits != 0
        };
        if mode & libc::R_OK != 0 && ctx.uid != 0 && !allowed(4) {
            return Err(err(libc::EACCES));
        }
        if mode & libc::W_OK != 0 && ctx.uid != 0 && !allowed(2) {
            return Err(err(libc::EACCES));
        }
        // Root may execute what anyone may.
        if mode & libc::X_OK != 0 && !(allowed(1) || (ctx.uid == 0 && st.st_mode & 0o111 != 0)) {
            return Err(err(libc::EACCES));
        }
        Ok(())
    }

    fn lseek(&self, _ctx: &Context, inode: u64, handle: u64, offset: u64, whence: u32) -> io::Result<u64> {
        let offset = libc::off64_t::try_from(offset).map_err(|_| err(libc::EINVAL))?;
        let whence = i32::try_from(whence).map_err(|_| err(libc::EINVAL))?;
        let seek = |fd: RawFd| {
            // SAFETY: lseek64 only moves the offset of a descriptor we own;
            // reads use pread and ignore it.
            let at = unsafe { libc::lseek64(fd, offset, whence) };
            u64::try_from(at).map_err(|_| io::Error::last_os_error())
        };
        if handle == NO_HANDLE {
            return seek(self.reader(inode)?.as_raw_fd());
        }
        let handle = self.handle(handle)?;
        self.still_held(&handle)?;
        seek(handle.file.as_fd().as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(dir: &Path, secrets: &Secrets) -> BoundedFs {
        BoundedFs::new(dir, secrets, 2, &HandleCount::default(), 16, Duration::ZERO).unwrap()
    }

    fn name(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    /// Node ids carry host inode numbers where they can, and are never the
    /// root's, 0, or one identity's for another.
    #[test]
    fn node_ids_are_host_inode_numbers_and_never_the_root_or_each_other() {
        let mut ids = NodeIds::new(10);
        assert_eq!(ids.id(10, 2).unwrap(), 2, "ext4's root directory number, as it is");
        assert_eq!(ids.id(10, 256).unwrap(), 256);
        let high = 1 << HOST_INO_BITS;
        let one = ids.id(10, ROOT).unwrap();
        let zero = ids.id(10, 0).unwrap();
        let big = ids.id(10, high + 5).unwrap();
        for id in [one, zero, big] {
            assert!(id >= high && id <= VFS_MAX_INO, "{id:#x} is in the high range");
        }
        let other = ids.id(11, 2).unwrap();
        assert_eq!(other & (high - 1), 2, "another device keeps the number in the low bits");
        assert!(other >= high);
        let all = [2, 256, one, zero, big, other, ids.id(11, ROOT).unwrap(), ids.id(11, 0).unwrap()];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "{all:x?}");
        assert_eq!((ids.id(10, ROOT).unwrap(), ids.id(11, 2).unwrap()), (one, other), "stable");
        // Past the devices with a range of their own, numbers come in sequence.
        for dev in 12..12 + OTHER_DEVICES as u64 {
            ids.id(dev, 7).unwrap();
        }
        let late = ids.id(9999, 2).unwrap();
        assert!(late >= OVERFLOW_SLOT << HOST_INO_BITS && !distinct.contains(&late));
        assert_eq!(ids.id(9999, 2).unwrap(), late);
    }

    /// A listing hands out entries until the reply takes no more or the
    /// directory ends, however few names each of the host's batches holds:
    /// the guest kernel takes a reply with room left as the directory's end
    /// (guest kernel patch 0004), so a short batch must not end a reply.
    #[test]
    fn a_listing_stops_only_when_full_or_at_the_end_of_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let want: Vec<String> = (0..300).map(|i| format!("entry-{i:03}")).collect();
        for name in &want {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let fs = fs(dir.path(), &Secrets::default());
        // 256 bytes take eight of these names from the host at once.
        let mut all = Vec::new();
        fs.list(ROOT, NO_HANDLE, 256, 0, &mut |e| {
            all.push(String::from_utf8(e.name.to_vec()).unwrap());
            Ok(1)
        })
        .unwrap();
        all.sort();
        assert_eq!(all, want);

        // A reply that fills ends there; the next resumes after its last.
        let mut pages = 0;
        let (mut names, mut offset) = (Vec::new(), 0);
        loop {
            let mut page = Vec::new();
            fs.list(ROOT, NO_HANDLE, 256, offset, &mut |e| {
                if page.len() == 20 {
                    return Ok(0);
                }
                page.push((e.offset, String::from_utf8(e.name.to_vec()).unwrap()));
                Ok(1)
            })
            .unwrap();
            let Some(&(last, _)) = page.last() else { break };
            offset = last;
            pages += 1;
            names.extend(page.into_iter().map(|(_, name)| name));
        }
        assert_eq!(pages, 15);
        names.sort();
        assert_eq!(names, want);
    }

    /// Hard links are one node, opened by whichever name still leads to the
    /// file; the id is the host's inode number.
    #[test]
    fn hard_links_are_one_node_found_by_any_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"linked").unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        let fs = fs(dir.path(), &Secrets::default());
        let ctx = Context::default();
        let a = fs.lookup(&ctx, ROOT, &name("a")).unwrap().inode;
        let b = fs.lookup(&ctx, ROOT, &name("b")).unwrap().inode;
        assert_eq!(a, b);
        assert_eq!(a, std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.path().join("a")).unwrap()));
        // The name confirmed last goes away on the host: the other serves.
        std::fs::remove_file(dir.path().join("b")).unwrap();
        let (handle, _, _) = fs.open(&ctx, a, libc::O_RDONLY as u32, 0).unwrap();
        fs.release(&ctx, a, 0, handle.unwrap(), false, false, None).unwrap();
        std::fs::remove_file(dir.path().join("a")).unwrap();
        let gone = fs.open(&ctx, a, libc::O_RDONLY as u32, 0).map(|_| ());
        assert_eq!(gone.map_err(|e| e.raw_os_error()), Err(Some(libc::ESTALE)));
        fs.forget(&ctx, a, 2);
        assert!(fs.getattr(&ctx, a, None).is_err(), "forgotten by both lookups, the node is gone");
    }

    /// Reads that name no handle open the file once for its chunks, keep at
    /// most a few files open, and let a forgotten file go.
    #[test]
    fn reads_without_a_handle_keep_a_few_files_open_at_most() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..3 * READERS {
            std::fs::write(dir.path().join(format!("f{i}")), format!("file {i}")).unwrap();
        }
        let fs = fs(dir.path(), &Secrets::default());
        let ctx = Context::default();
        let mut out = tempfile::tempfile().unwrap();
        let mut nodes = Vec::new();
        for i in 0..3 * READERS {
            let node = fs.lookup(&ctx, ROOT, &name(&format!("f{i}"))).unwrap().inode;
            let n = fs.read(&ctx, node, NO_HANDLE, &mut out, 4096, 0, None, 0).unwrap();
            assert_eq!(n, format!("file {i}").len());
            nodes.push(node);
            assert!(locked(&fs.shared().readers).fds.len() <= READERS);
        }
        let last = *nodes.last().unwrap();
        assert!(locked(&fs.shared().readers).fds.contains_key(&last));
        fs.forget(&ctx, last, 1);
        assert!(!locked(&fs.shared().readers).fds.contains_key(&last), "a forgotten file is closed");
        assert!(fs.read(&ctx, last, NO_HANDLE, &mut out, 4096, 0, None, 0).is_err());
    }

    /// A thread with a descriptor table of its own (the jailed read-only
    /// worker, see `jail::thread`) reads and lists through the links of
    /// its own descriptors: through /proc/self/fd, those of the main
    /// thread's table, it would find nothing, or another file.
    #[test]
    fn a_thread_with_descriptors_of_its_own_reads_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"mine").unwrap();
        let share = dir.path().to_owned();
        std::thread::spawn(move || {
            // SAFETY: unshare takes no pointers; this thread holds no
            // descriptor yet that another thread closes.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_FILES) }, 0, "{}", io::Error::last_os_error());
            let fs = fs(&share, &Secrets::default());
            let ctx = Context::default();
            let d = fs.lookup(&ctx, ROOT, &name("d")).unwrap().inode;
            let f = fs.lookup(&ctx, d, &name("f")).unwrap().inode;
            assert_eq!(read(&fs, f).unwrap(), b"mine");
            let (handle, _) = fs.opendir(&ctx, d, 0).unwrap();
            let mut names = Vec::new();
            fs.readdir(&ctx, d, handle.unwrap(), 4096, 0, &mut |e| {
                names.push(e.name.to_vec());
                Ok(1)
            })
            .unwrap();
            assert!(names.contains(&b"f".to_vec()), "{names:?}");
        })
        .join()
        .unwrap();
    }

    /// Requests served side by side (the read-only shares' workers) get
    /// what one thread gets: every listing whole, every file's own
    /// content and attributes, and once each thread has forgotten what it
    /// was told, nothing is left held but the root.
    #[test]
    fn requests_from_many_threads_get_what_one_thread_gets() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = ["top", "a/b/deep", "a/b/deep/er"];
        for d in dirs {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
            for i in 0..40 {
                std::fs::write(dir.path().join(d).join(format!("f{i}")), format!("{d}/f{i}")).unwrap();
            }
        }
        let fs = fs(dir.path(), &Secrets::default());
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let ctx = Context::default();
                    for _ in 0..5 {
                        let mut told: Vec<u64> = Vec::new();
                        for d in dirs {
                            let mut at = ROOT;
                            for part in d.split('/') {
                                at = fs.lookup(&ctx, at, &name(part)).unwrap().inode;
                                told.push(at);
                            }
                            let mut files = Vec::new();
                            fs.readdirplus(&ctx, at, NO_HANDLE, 1 << 16, 0, &mut |e, entry| {
                                told.push(entry.inode);
                                files.push((String::from_utf8(e.name.to_vec()).unwrap(), entry));
                                Ok(1)
                            })
                            .unwrap();
                            let regular: Vec<_> = files.iter().filter(|(n, _)| n.starts_with('f')).collect();
                            assert_eq!(regular.len(), 40, "{d}: the whole listing");
                            for (file, entry) in regular {
                                let want = format!("{d}/{file}");
                                assert_eq!(read(&fs, entry.inode).unwrap(), want.as_bytes());
                                let (st, _) = fs.getattr(&ctx, entry.inode, None).unwrap();
                                assert_eq!(usize::try_from(st.st_size).unwrap(), want.len());
                                assert_eq!(st.st_ino, entry.attr.st_ino);
                            }
                        }
                        for node in told {
                            fs.forget(&ctx, node, 1);
                        }
                    }
                });
            }
        });
        let state = fs.shared();
        assert_eq!(state.nodes.len(), 1, "only the root is held");
        assert!(locked(&state.readers).fds.is_empty(), "forgotten files are closed");
        assert_eq!(fs.open_handles.load(Ordering::Acquire), 0);
    }

    /// A secret directory (here named through a symlink, which the secret
    /// is not) is seen but not listed; the link itself reads.
    #[test]
    fn a_secret_directory_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("private")).unwrap();
        std::os::unix::fs::symlink("private", dir.path().join("link")).unwrap();
        let secrets = Secrets::at(&[dir.path().join("link")]);
        let fs = fs(dir.path(), &secrets);
        let ctx = Context::default();
        let private = fs.lookup(&ctx, ROOT, &name("private")).unwrap().inode;
        let opened = fs.opendir(&ctx, private, 0).map(|_| ());
        assert_eq!(opened.map_err(|e| e.raw_os_error()), Err(Some(libc::EACCES)));
        let link = fs.lookup(&ctx, ROOT, &name("link")).unwrap().inode;
        assert_eq!(fs.readlink(&ctx, link).unwrap(), b"private");
    }

    fn errno<T>(r: io::Result<T>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    /// The file `node` as a read without a handle gets it.
    fn read(fs: &BoundedFs, node: u64) -> io::Result<Vec<u8>> {
        use std::io::{Read, Seek};
        let mut out = tempfile::tempfile().unwrap();
        fs.read(&Context::default(), node, NO_HANDLE, &mut out, 4096, 0, None, 0)?;
        out.rewind().unwrap();
        let mut data = Vec::new();
        out.read_to_end(&mut data).unwrap();
        Ok(data)
    }

    /// Nodes found in one `openat2` so far.
    fn beneath(fs: &BoundedFs) -> u64 {
        fs.shared().beneath.load(Ordering::Relaxed)
    }

    /// Both ways of finding a node: in one `openat2` whatever the depth,
    /// and step by step only (as where `openat2` is missing or not the
    /// worker's to call).
    const WAYS: [usize; 2] = [1, usize::MAX];

    /// The nodes of `a/b/c` and of the file `a/b/c/f` holding "data", in a
    /// share at `share`, the file read once.
    fn deep_file(fs: &BoundedFs, share: &Path) -> ([u64; 3], u64) {
        std::fs::create_dir_all(share.join("a/b/c")).unwrap();
        std::fs::write(share.join("a/b/c/f"), b"data").unwrap();
        let ctx = Context::default();
        let a = fs.lookup(&ctx, ROOT, &name("a")).unwrap().inode;
        let b = fs.lookup(&ctx, a, &name("b")).unwrap().inode;
        let c = fs.lookup(&ctx, b, &name("c")).unwrap().inode;
        let f = fs.lookup(&ctx, c, &name("f")).unwrap().inode;
        assert_eq!(read(fs, f).unwrap(), b"data");
        ([a, b, c], f)
    }

    /// A listing finds its directory from the root once a page, not once
    /// an entry: a page of 40 names in a deep directory costs three
    /// `openat2`s (the directory opened for the listing, found for the
    /// entries, and found again after them), where it cost one more for
    /// each name; and the entries are the host's.
    #[test]
    fn a_listing_finds_its_directory_once_a_page() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path(), &Secrets::default()).beneath_from(1);
        let ([_, _, c], _) = deep_file(&fs, dir.path());
        for i in 0..40 {
            std::fs::write(dir.path().join(format!("a/b/c/n{i:02}")), b"x").unwrap();
        }
        let before = beneath(&fs);
        let mut names = Vec::new();
        fs.readdirplus(&Context::default(), c, NO_HANDLE, 64 << 10, 0, &mut |entry, attr| {
            names.push((String::from_utf8_lossy(entry.name).into_owned(), attr.attr.st_ino));
            Ok(1)
        })
        .unwrap();
        assert_eq!(names.len(), 41);
        for (name, ino) in &names {
            let host = std::fs::symlink_metadata(dir.path().join("a/b/c").join(name)).unwrap();
            assert_eq!(*ino, std::os::unix::fs::MetadataExt::ino(&host));
        }
        assert_eq!(beneath(&fs) - before, 3, "the directory opened and found twice for the page");
    }

    /// A symlink the host plants where a directory of the path was (the
    /// directory moved beside it, the link leading to it) makes everything
    /// beneath stale, found in one `openat2` or step by step: a kept
    /// reader, attributes, listings and lookups.
    #[test]
    fn a_symlink_planted_in_a_nodes_path_makes_it_stale() {
        for from in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let fs = fs(dir.path(), &Secrets::default()).beneath_from(from);
            let ctx = Context::default();
            let ([_, b, c], f) = deep_file(&fs, dir.path());
            assert_eq!(beneath(&fs) > 0, from == 1, "found in one openat2 only when it may be");
            std::fs::rename(dir.path().join("a/b"), dir.path().join("a/b.real")).unwrap();
            std::os::unix::fs::symlink("b.real", dir.path().join("a/b")).unwrap();
            assert_eq!(std::fs::read(dir.path().join("a/b/c/f")).unwrap(), b"data", "the link leads to the file");
            assert_eq!(errno(read(&fs, f)), Some(libc::ESTALE), "from {from}");
            assert_eq!(errno(fs.getattr(&ctx, f, None)), Some(libc::ESTALE));
            assert_eq!(errno(fs.getattr(&ctx, b, None)), Some(libc::ESTALE));
            assert_eq!(errno(fs.opendir(&ctx, c, 0)), Some(libc::ESTALE));
            assert_eq!(errno(fs.lookup(&ctx, c, &name("f"))), Some(libc::ESTALE));
            assert_eq!(errno(fs.open(&ctx, f, libc::O_RDONLY.cast_unsigned(), 0)), Some(libc::ESTALE));
        }
    }

    /// A directory the host moves out of the share is not served from its
    /// new place, found in one `openat2` or step by step, not even through
    /// a symlink left where it was; moved back, it serves again.
    #[test]
    fn a_directory_moved_out_of_the_share_is_served_only_back_in_it() {
        for from in WAYS {
            let top = tempfile::tempdir().unwrap();
            let share = top.path().join("share");
            std::fs::create_dir_all(top.path().join("outside")).unwrap();
            let fs = fs(&share_dir(&share), &Secrets::default()).beneath_from(from);
            let ctx = Context::default();
            let ([_, _, c], f) = deep_file(&fs, &share);
            std::fs::rename(share.join("a/b"), top.path().join("outside/b")).unwrap();
            assert_eq!(errno(read(&fs, f)), Some(libc::ESTALE), "from {from}");
            assert_eq!(errno(fs.opendir(&ctx, c, 0)), Some(libc::ESTALE));
            std::os::unix::fs::symlink("../../outside/b", share.join("a/b")).unwrap();
            assert_eq!(errno(read(&fs, f)), Some(libc::ESTALE), "through a symlink, from {from}");
            assert_eq!(errno(fs.getattr(&ctx, f, None)), Some(libc::ESTALE));
            assert_eq!(errno(fs.lookup(&ctx, c, &name("f"))), Some(libc::ESTALE));
            std::fs::remove_file(share.join("a/b")).unwrap();
            std::fs::rename(top.path().join("outside/b"), share.join("a/b")).unwrap();
            assert_eq!(read(&fs, f).unwrap(), b"data", "back where it was found");
            let (handle, _) = fs.opendir(&ctx, c, 0).unwrap();
            fs.releasedir(&ctx, c, 0, handle.unwrap()).unwrap();
        }
    }

    /// A directory of the path the host replaced by a new tree of the same
    /// names leaves the nodes beneath it stale, however they are found:
    /// the new ones are other files.
    #[test]
    fn a_tree_the_host_replaced_is_stale_beneath() {
        for from in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let fs = fs(dir.path(), &Secrets::default()).beneath_from(from);
            let ctx = Context::default();
            let ([a, _, c], f) = deep_file(&fs, dir.path());
            std::fs::rename(dir.path().join("a"), dir.path().join("old")).unwrap();
            std::fs::create_dir_all(dir.path().join("a/b/c")).unwrap();
            std::fs::write(dir.path().join("a/b/c/f"), b"new!").unwrap();
            assert_eq!(errno(read(&fs, f)), Some(libc::ESTALE), "from {from}");
            assert_eq!(errno(fs.getattr(&ctx, f, None)), Some(libc::ESTALE));
            assert_eq!(errno(fs.opendir(&ctx, c, 0)), Some(libc::ESTALE));
            assert_eq!(errno(fs.lookup(&ctx, c, &name("f"))), Some(libc::ESTALE));
            assert_eq!(errno(fs.getattr(&ctx, a, None)), Some(libc::ESTALE));
        }
    }

    /// A directory of the path replaced by the host with the node moved
    /// along into the new one: found in one `openat2`, the node is where
    /// its path leads and serves (only the node itself is checked, beneath
    /// the root); step by step, the replaced directory makes it stale.
    #[test]
    fn a_node_moved_along_into_a_replaced_directory_serves_only_when_found_beneath() {
        for from in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let fs = fs(dir.path(), &Secrets::default()).beneath_from(from);
            let (_, f) = deep_file(&fs, dir.path());
            std::fs::rename(dir.path().join("a/b"), dir.path().join("a/old")).unwrap();
            std::fs::create_dir(dir.path().join("a/b")).unwrap();
            std::fs::rename(dir.path().join("a/old/c"), dir.path().join("a/b/c")).unwrap();
            let read = read(&fs, f);
            if from == 1 {
                assert_eq!(read.unwrap(), b"data");
            } else {
                assert_eq!(errno(read), Some(libc::ESTALE));
            }
        }
    }

    /// `dir`, made.
    fn share_dir(dir: &Path) -> std::path::PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        dir.to_path_buf()
    }

    /// A file whose path from the root is longer than PATH_MAX (which
    /// `openat2` cannot take) is found step by step, and still read.
    #[test]
    fn a_path_longer_than_path_max_is_walked() {
        use rustix::fs::{Mode, OFlags};
        let dir = tempfile::tempdir().unwrap();
        let long = "d".repeat(250);
        let levels = libc::PATH_MAX as usize / long.len() + 2;
        let mut at: OwnedFd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..levels {
            rustix::fs::mkdirat(&at, long.as_str(), Mode::from_raw_mode(0o755)).unwrap();
            at = rustix::fs::openat(&at, long.as_str(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        }
        let file = rustix::fs::openat(&at, "f", OFlags::WRONLY | OFlags::CREATE, Mode::from_raw_mode(0o644)).unwrap();
        rustix::io::write(&file, b"deep").unwrap();

        let fs = fs(dir.path(), &Secrets::default()).beneath_from(1);
        let ctx = Context::default();
        let mut node = ROOT;
        for _ in 0..levels {
            node = fs.lookup(&ctx, node, &name(&long)).unwrap().inode;
        }
        let f = fs.lookup(&ctx, node, &name("f")).unwrap().inode;
        let before = beneath(&fs);
        assert_eq!(read(&fs, f).unwrap(), b"deep");
        assert_eq!(fs.getattr(&ctx, f, None).unwrap().0.st_size, 4);
        assert_eq!(beneath(&fs), before, "walked, not found in one openat2");
    }

    /// A directory bind-mounted beneath itself cannot happen without
    /// privileges; its shape can be given to the name bookkeeping, which
    /// never finds a directory through itself.
    #[test]
    fn a_directory_is_never_found_through_itself() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let fs = fs(dir.path(), &Secrets::default());
        let ctx = Context::default();
        let d = fs.lookup(&ctx, ROOT, &name("d")).unwrap().inode;
        let mut state = fs.exclusive();
        BoundedFs::add_name(&mut state, d, d, &name("again"));
        assert_eq!(state.nodes[&d].names.len(), 1);
        assert_eq!(state.nodes[&d].children, 0);
        locked(&state.cache).clear();
        assert!(fs.dir_fd(&state, d).is_ok());
    }
}
