//! Records what the guest sees of the workspace share: every name it looks
//! up (or gets from a directory listing with attributes), with the host's
//! `lstat` at that moment, or its absence. Apply compares the host's state
//! then with what it has now, so only the paths a run touched are ever
//! examined (see `protocol::seen` for the file and `changes::seen` for the
//! comparison).
//!
//! [`Recording`] wraps the share's passthrough filesystem below the Vfs, where
//! inodes are the passthrough's own and attributes carry the host's inode
//! numbers. It forwards what `ReadOnlyFs` forwards and nothing else.
//!
//! The guest chooses what it looks up, so the record is bounded: each path
//! is written once (a keyed hash remembers which), and after
//! [`MAX_PATHS`] paths recording stops. A path the record lacks that exists
//! on the host counts as changed there, so stopping early can only add
//! conflicts, never hide one.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Write};
use std::sync::Mutex;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{FsOptions, OpenOptions, stat64, statvfs64};
use fuse_backend_rs::api::BackendFileSystem;
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyWriter,
};

use crate::protocol::seen::{self, HostStat};

/// The passthrough's inode for the share's root.
const ROOT_INODE: u64 = 1;
/// Distinct paths recorded at most (about 40 MB of hashes and directory
/// names in the VMM at worst).
pub const MAX_PATHS: usize = 2_000_000;

/// A filesystem whose lookups are recorded in a sightings file.
pub struct Recording<F> {
    inner: F,
    record: Mutex<Record>,
}

struct Record {
    out: File,
    /// Directory inodes the guest holds, with their paths in the share.
    dirs: HashMap<u64, Vec<u8>>,
    /// Hashes of the paths already written.
    written: HashSet<u64>,
    keys: RandomState,
    /// Recording stopped: the limit was reached or the file could not be
    /// written.
    stopped: bool,
}

impl<F> Recording<F> {
    /// Records the lookups in `inner` to `out`, which already holds the
    /// magic (the supervisor writes it when it creates the file).
    pub fn new(inner: F, out: File) -> Self {
        let record = Record {
            out,
            dirs: HashMap::from([(ROOT_INODE, Vec::new())]),
            written: HashSet::new(),
            keys: RandomState::new(),
            stopped: false,
        };
        Recording { inner, record: Mutex::new(record) }
    }

    fn sighting(&self, parent: u64, name: &[u8], entry: Option<&Entry>) {
        if name == b"." || name == b".." {
            return;
        }
        let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
        record.note(parent, name, entry);
    }
}

impl Record {
    fn note(&mut self, parent: u64, name: &[u8], entry: Option<&Entry>) {
        if self.stopped {
            return;
        }
        // A parent we never handed out (or one over-long) cannot be named.
        let Some(prefix) = self.dirs.get(&parent) else { return };
        let mut path = Vec::with_capacity(prefix.len() + 1 + name.len());
        if !prefix.is_empty() {
            path.extend_from_slice(prefix);
            path.push(b'/');
        }
        path.extend_from_slice(name);
        if path.len() > seen::MAX_PATH {
            return;
        }
        let state = entry.map(|e| host_stat(&e.attr));
        if let Some(e) = entry
            && e.attr.st_mode & libc::S_IFMT == libc::S_IFDIR
        {
            self.dirs.entry(e.inode).or_insert_with(|| path.clone());
        }
        if !self.written.insert(self.keys.hash_one(&path)) {
            return;
        }
        if self.written.len() > MAX_PATHS {
            tracing::warn!(
                "virtio-fs: the guest looked up more than {MAX_PATHS} workspace paths; no more are recorded, \
                 so changes to the others will count as conflicts"
            );
            self.stopped = true;
            return;
        }
        let mut bytes = Vec::with_capacity(path.len() + 48);
        seen::encode(&path, state.as_ref(), &mut bytes);
        // Written at once, not buffered: the guest may power off right after
        // its last lookup, and the process ends with it.
        if let Err(e) = self.out.write_all(&bytes) {
            tracing::warn!("virtio-fs: cannot record what the guest saw: {e}; changes will count as conflicts");
            self.stopped = true;
        }
    }
}

fn host_stat(attr: &stat64) -> HostStat {
    HostStat {
        mode: attr.st_mode,
        size: u64::try_from(attr.st_size).unwrap_or(0),
        mtime_sec: attr.st_mtime,
        mtime_nsec: u32::try_from(attr.st_mtime_nsec).unwrap_or(0),
        ctime_sec: attr.st_ctime,
        ctime_nsec: u32::try_from(attr.st_ctime_nsec).unwrap_or(0),
        ino: attr.st_ino,
    }
}

fn is_enoent(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

impl<F: BackendFileSystem<Inode = u64, Handle = u64> + 'static> BackendFileSystem for Recording<F> {
    fn mount(&self) -> io::Result<(Entry, u64)> {
        self.inner.mount()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<F: FileSystem<Inode = u64, Handle = u64>> FileSystem for Recording<F> {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        self.inner.init(capable)
    }

    fn destroy(&self) {
        self.inner.destroy()
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let result = self.inner.lookup(ctx, parent, name);
        match &result {
            Ok(entry) if entry.inode != 0 => self.sighting(parent, name.to_bytes(), Some(entry)),
            Ok(_) => self.sighting(parent, name.to_bytes(), None),
            Err(e) if is_enoent(e) => self.sighting(parent, name.to_bytes(), None),
            Err(_) => {}
        }
        result
    }

    fn forget(&self, ctx: &Context, inode: u64, count: u64) {
        self.inner.forget(ctx, inode, count)
    }

    fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
        self.inner.batch_forget(ctx, requests)
    }

    fn getattr(&self, ctx: &Context, inode: u64, handle: Option<u64>) -> io::Result<(stat64, Duration)> {
        self.inner.getattr(ctx, inode, handle)
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        self.inner.readlink(ctx, inode)
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        self.inner.open(ctx, inode, flags, fuse_flags)
    }

    fn read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        flags: u32,
    ) -> io::Result<usize> {
        self.inner.read(ctx, inode, handle, w, size, offset, lock_owner, flags)
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        self.inner.flush(ctx, inode, handle, lock_owner)
    }

    fn release(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        handle: u64,
        flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.inner.release(ctx, inode, flags, handle, flush, flock_release, lock_owner)
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        self.inner.statfs(ctx, inode)
    }

    fn getxattr(&self, ctx: &Context, inode: u64, name: &CStr, size: u32) -> io::Result<GetxattrReply> {
        self.inner.getxattr(ctx, inode, name, size)
    }

    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        self.inner.listxattr(ctx, inode, size)
    }

    fn opendir(&self, ctx: &Context, inode: u64, flags: u32) -> io::Result<(Option<u64>, OpenOptions)> {
        self.inner.opendir(ctx, inode, flags)
    }

    fn readdir(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.inner.readdir(ctx, inode, handle, size, offset, add_entry)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        // Each entry the guest receives with its attributes is a lookup it
        // will not send.
        self.inner.readdirplus(ctx, inode, handle, size, offset, &mut |dir_entry, entry| {
            let name = dir_entry.name;
            let took = add_entry(dir_entry, entry)?;
            if took != 0 && entry.inode != 0 {
                self.sighting(inode, name, Some(&entry));
            }
            Ok(took)
        })
    }

    fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        self.inner.releasedir(ctx, inode, flags, handle)
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        self.inner.access(ctx, inode, mask)
    }

    fn lseek(&self, ctx: &Context, inode: u64, handle: u64, offset: u64, whence: u32) -> io::Result<u64> {
        self.inner.lseek(ctx, inode, handle, offset, whence)
    }
}
