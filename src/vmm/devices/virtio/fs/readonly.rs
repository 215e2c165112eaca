//! Read-only enforcement, in two layers that do not trust the guest kernel.
//!
//! [`gate`] looks at the opcode of each request before the FUSE server sees
//! it: mutating opcodes get EROFS, opcodes we do not serve get ENOSYS, and
//! only the read side reaches the server.
//!
//! [`ReadOnlyFs`] is the filesystem the server dispatches to. It forwards
//! lookups, attributes, reads, directory listings and handle bookkeeping to
//! the inner filesystem; opens for writing and every mutating operation get
//! EROFS; anything it does not name keeps the `FileSystem` trait's default,
//! which is an error.

use std::ffi::CStr;
use std::io;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{Attr, CreateIn, FsOptions, Opcode, OpenOptions, SetattrValid, stat64, statvfs64};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyReader, ZeroCopyWriter,
};

/// FUSE_TMPFILE: newer than fuse-backend-rs' opcode table.
const FUSE_TMPFILE: u32 = 51;

fn erofs() -> io::Error {
    io::Error::from_raw_os_error(libc::EROFS)
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// What to do with a request, judged on its opcode alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Hand it to the FUSE server.
    Dispatch,
    /// Answer it with this errno without looking further.
    Refuse(i32),
}

/// The opcode gate, for every share kind (only EROFS is lifted for the
/// writable ones). Only opcodes named here reach the FUSE server, so an
/// opcode it does not know (or decodes unsoundly) never gets to it.
///
/// Not served, whatever the share: FUSE_IOCTL (the server would allocate
/// and fill the request's `in_size`, up to 4 GiB, before any filesystem
/// sees it; ENOTTY is what a filesystem without ioctls answers), and
/// FUSE_POLL, FUSE_BMAP and the lock opcodes, which no share needs: the
/// guest kernel polls and locks locally when the server negotiates neither
/// POSIX_LOCKS nor FLOCK_LOCKS (see `device::vfs_options`), and BMAP is
/// for block-device-backed FUSE only.
pub(super) fn gate(opcode: u32) -> Verdict {
    const SERVED: &[Opcode] = &[
        Opcode::Lookup,
        Opcode::Forget,
        Opcode::Getattr,
        Opcode::Readlink,
        Opcode::Open,
        Opcode::Read,
        Opcode::Statfs,
        Opcode::Release,
        Opcode::Fsync,
        Opcode::Getxattr,
        Opcode::Listxattr,
        Opcode::Flush,
        Opcode::Init,
        Opcode::Opendir,
        Opcode::Readdir,
        Opcode::Releasedir,
        Opcode::Fsyncdir,
        Opcode::Access,
        Opcode::Interrupt,
        Opcode::Destroy,
        Opcode::BatchForget,
        Opcode::Readdirplus,
        Opcode::Lseek,
    ];
    const MUTATING: &[Opcode] = &[
        Opcode::Setattr,
        Opcode::Symlink,
        Opcode::Mknod,
        Opcode::Mkdir,
        Opcode::Unlink,
        Opcode::Rmdir,
        Opcode::Rename,
        Opcode::Link,
        Opcode::Write,
        Opcode::Setxattr,
        Opcode::Removexattr,
        Opcode::Create,
        Opcode::Fallocate,
        Opcode::Rename2,
        Opcode::CopyFileRange,
    ];
    if opcode == Opcode::Ioctl as u32 {
        Verdict::Refuse(libc::ENOTTY)
    } else if SERVED.iter().any(|&op| op as u32 == opcode) {
        Verdict::Dispatch
    } else if opcode == FUSE_TMPFILE || MUTATING.iter().any(|&op| op as u32 == opcode) {
        Verdict::Refuse(libc::EROFS)
    } else {
        Verdict::Refuse(libc::ENOSYS)
    }
}

/// Whether open(2) `flags` could modify the file: write access, truncation,
/// appending or creation (O_TMPFILE implies write access).
pub(super) fn opens_for_writing(flags: u32) -> bool {
    const ACCMODE: u32 = libc::O_ACCMODE as u32;
    const RDONLY: u32 = libc::O_RDONLY as u32;
    const MODIFYING: u32 = (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) as u32;
    flags & ACCMODE != RDONLY || flags & MODIFYING != 0
}

/// Runs `f`, then restores the process umask: PassthroughFs::import() sets
/// it to 0 for the whole process, which only matters to a filesystem that
/// creates files (ours never does), and would leak into everything else the
/// process creates. The umask is process-wide, so a file another thread
/// creates while `f` runs gets mode bits unmasked. Only the tests serve a
/// PassthroughFs; umask is in no jailed thread's filter.
#[cfg(test)]
pub(super) fn keeping_umask<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: umask only swaps the process's file mode creation mask; it has
    // no memory effects and cannot fail.
    let saved = unsafe { libc::umask(0o022) };
    let result = f();
    // SAFETY: as above; this puts back the mask saved before `f` ran.
    unsafe { libc::umask(saved) };
    result
}

/// A filesystem that serves `F` read-only.
pub struct ReadOnlyFs<F> {
    inner: F,
    /// How long the guest may remember that a name does not exist.
    negative_timeout: Duration,
}

impl<F> ReadOnlyFs<F> {
    pub(super) fn new(inner: F, negative_timeout: Duration) -> Self {
        ReadOnlyFs { inner, negative_timeout }
    }

    /// An entry telling the guest that a name does not exist, which it may
    /// cache: the guest cannot create it, and the host rarely does.
    fn negative_entry(&self) -> Entry {
        Entry {
            inode: 0,
            generation: 0,
            attr: Attr::default().into(),
            attr_flags: 0,
            attr_timeout: Duration::ZERO,
            entry_timeout: self.negative_timeout,
        }
    }
}

/// A single path component: not empty, not "." or "..", no '/'.
fn is_plain_name(name: &CStr) -> bool {
    let bytes = name.to_bytes();
    !bytes.is_empty() && bytes != b"." && bytes != b".." && !bytes.contains(&b'/')
}

impl<F: FileSystem> FileSystem for ReadOnlyFs<F> {
    type Inode = F::Inode;
    type Handle = F::Handle;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        let wanted = self.inner.init(capable)?;
        Ok(wanted - FsOptions::WRITEBACK_CACHE - FsOptions::HANDLE_KILLPRIV - FsOptions::HANDLE_KILLPRIV_V2)
    }

    /// The guest sends FUSE_DESTROY when it unmounts: a request like any
    /// other, so it makes no call outside the worker's filter (a refused
    /// call would end the VMM).
    fn destroy(&self) {
        self.inner.destroy();
    }

    fn lookup(&self, ctx: &Context, parent: Self::Inode, name: &CStr) -> io::Result<Entry> {
        // The guest kernel walks paths one plain component at a time; "..",
        // "." or a '/' could only be an attempt to step out of a share.
        if !is_plain_name(name) {
            return Err(einval());
        }
        match self.inner.lookup(ctx, parent, name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(self.negative_entry()),
            other => other,
        }
    }

    fn forget(&self, ctx: &Context, inode: Self::Inode, count: u64) {
        self.inner.forget(ctx, inode, count)
    }

    fn batch_forget(&self, ctx: &Context, requests: Vec<(Self::Inode, u64)>) {
        self.inner.batch_forget(ctx, requests)
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        handle: Option<Self::Handle>,
    ) -> io::Result<(stat64, Duration)> {
        self.inner.getattr(ctx, inode, handle)
    }

    fn setattr(
        &self,
        _ctx: &Context,
        _inode: Self::Inode,
        _attr: stat64,
        _handle: Option<Self::Handle>,
        _valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        Err(erofs())
    }

    fn readlink(&self, ctx: &Context, inode: Self::Inode) -> io::Result<Vec<u8>> {
        self.inner.readlink(ctx, inode)
    }

    fn symlink(&self, _ctx: &Context, _linkname: &CStr, _parent: Self::Inode, _name: &CStr) -> io::Result<Entry> {
        Err(erofs())
    }

    fn mknod(
        &self,
        _ctx: &Context,
        _inode: Self::Inode,
        _name: &CStr,
        _mode: u32,
        _rdev: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        Err(erofs())
    }

    fn mkdir(&self, _ctx: &Context, _parent: Self::Inode, _name: &CStr, _mode: u32, _umask: u32) -> io::Result<Entry> {
        Err(erofs())
    }

    fn unlink(&self, _ctx: &Context, _parent: Self::Inode, _name: &CStr) -> io::Result<()> {
        Err(erofs())
    }

    fn rmdir(&self, _ctx: &Context, _parent: Self::Inode, _name: &CStr) -> io::Result<()> {
        Err(erofs())
    }

    fn rename(
        &self,
        _ctx: &Context,
        _olddir: Self::Inode,
        _oldname: &CStr,
        _newdir: Self::Inode,
        _newname: &CStr,
        _flags: u32,
    ) -> io::Result<()> {
        Err(erofs())
    }

    fn link(&self, _ctx: &Context, _inode: Self::Inode, _newparent: Self::Inode, _newname: &CStr) -> io::Result<Entry> {
        Err(erofs())
    }

    fn open(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<Self::Handle>, OpenOptions, Option<u32>)> {
        if opens_for_writing(flags) {
            return Err(erofs());
        }
        self.inner.open(ctx, inode, flags, fuse_flags)
    }

    fn create(
        &self,
        _ctx: &Context,
        _parent: Self::Inode,
        _name: &CStr,
        _args: CreateIn,
    ) -> io::Result<(Entry, Option<Self::Handle>, OpenOptions, Option<u32>)> {
        Err(erofs())
    }

    fn read(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        handle: Self::Handle,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        flags: u32,
    ) -> io::Result<usize> {
        self.inner.read(ctx, inode, handle, w, size, offset, lock_owner, flags)
    }

    fn write(
        &self,
        _ctx: &Context,
        _inode: Self::Inode,
        _handle: Self::Handle,
        _r: &mut dyn ZeroCopyReader,
        _size: u32,
        _offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<usize> {
        Err(erofs())
    }

    fn flush(&self, _ctx: &Context, _inode: Self::Inode, _handle: Self::Handle, _lock_owner: u64) -> io::Result<()> {
        // Nothing written, and no locks kept here (the guest kernel keeps
        // them): a flush has nothing to do. ENOSYS tells the guest kernel
        // so once, and it stops sending one on every close, a round trip
        // per file read.
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }

    fn fsync(&self, _ctx: &Context, _inode: Self::Inode, _datasync: bool, _handle: Self::Handle) -> io::Result<()> {
        // Nothing the guest can do leaves data to sync.
        Ok(())
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        _inode: Self::Inode,
        _handle: Self::Handle,
        _mode: u32,
        _offset: u64,
        _length: u64,
    ) -> io::Result<()> {
        Err(erofs())
    }

    fn release(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        flags: u32,
        handle: Self::Handle,
        flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.inner.release(ctx, inode, flags, handle, flush, flock_release, lock_owner)
    }

    fn statfs(&self, ctx: &Context, inode: Self::Inode) -> io::Result<statvfs64> {
        self.inner.statfs(ctx, inode)
    }

    fn setxattr(
        &self,
        _ctx: &Context,
        _inode: Self::Inode,
        _name: &CStr,
        _value: &[u8],
        _flags: u32,
    ) -> io::Result<()> {
        Err(erofs())
    }

    fn getxattr(&self, ctx: &Context, inode: Self::Inode, name: &CStr, size: u32) -> io::Result<GetxattrReply> {
        self.inner.getxattr(ctx, inode, name, size)
    }

    fn listxattr(&self, ctx: &Context, inode: Self::Inode, size: u32) -> io::Result<ListxattrReply> {
        self.inner.listxattr(ctx, inode, size)
    }

    fn removexattr(&self, _ctx: &Context, _inode: Self::Inode, _name: &CStr) -> io::Result<()> {
        Err(erofs())
    }

    fn opendir(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        flags: u32,
    ) -> io::Result<(Option<Self::Handle>, OpenOptions)> {
        if opens_for_writing(flags) {
            return Err(erofs());
        }
        self.inner.opendir(ctx, inode, flags)
    }

    fn readdir(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        handle: Self::Handle,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        // Nothing lies past the last offset; the Vfs's own directory above
        // the shares would compute one beyond it.
        if offset == u64::MAX {
            return Ok(());
        }
        self.inner.readdir(ctx, inode, handle, size, offset, add_entry)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        handle: Self::Handle,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        // Nothing lies past the last offset; the Vfs's own directory above
        // the shares would compute one beyond it.
        if offset == u64::MAX {
            return Ok(());
        }
        self.inner.readdirplus(ctx, inode, handle, size, offset, add_entry)
    }

    fn fsyncdir(&self, _ctx: &Context, _inode: Self::Inode, _datasync: bool, _handle: Self::Handle) -> io::Result<()> {
        Ok(())
    }

    fn releasedir(&self, ctx: &Context, inode: Self::Inode, flags: u32, handle: Self::Handle) -> io::Result<()> {
        self.inner.releasedir(ctx, inode, flags, handle)
    }

    fn access(&self, ctx: &Context, inode: Self::Inode, mask: u32) -> io::Result<()> {
        if mask & libc::W_OK as u32 != 0 {
            return Err(erofs());
        }
        self.inner.access(ctx, inode, mask)
    }

    fn lseek(
        &self,
        ctx: &Context,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.inner.lseek(ctx, inode, handle, offset, whence)
    }
}
