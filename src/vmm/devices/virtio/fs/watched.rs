//! A share's passthrough filesystem with a [`Watch`] on it, below the Vfs,
//! where inodes are the passthrough's own and attributes carry the host's
//! inode numbers: the watch hears of every name the guest looks up or gets
//! in a listing with attributes (the only ways the guest learns an inode).
//! It forwards what `ReadOnlyFs` forwards and nothing else.

use std::any::Any;
use std::ffi::CStr;
use std::io;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{FsOptions, OpenOptions, stat64, statvfs64};
use fuse_backend_rs::api::BackendFileSystem;
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyWriter,
};

/// What a watch is told of and asked.
pub trait Watch: Send + Sync {
    /// The guest looked up `name` in directory `parent`, with `result`.
    fn looked_up(&self, _parent: u64, _name: &[u8], _result: &io::Result<Entry>) {}
    /// A listing of `parent` produced `entry` for `name`; `delivered` says
    /// whether it reached the guest (the reply may have been full). The
    /// filesystem holds the inode either way.
    fn listed(&self, _parent: u64, _name: &[u8], _entry: &Entry, _delivered: bool) {}
    /// A listing is complete.
    fn listing_done(&self) {}
    /// The guest forgot `count` lookups of `inode`: at none left, the
    /// filesystem lets the inode go (a new lookup gets the same number: the
    /// host's where it fits, see `bounded`).
    fn forgot(&self, _inode: u64, _count: u64) {}
}

/// `inner` with `watch` on it.
pub struct Watched<F, W> {
    inner: F,
    watch: W,
}

impl<F, W> Watched<F, W> {
    pub fn new(inner: F, watch: W) -> Self {
        Watched { inner, watch }
    }
}

impl<F: BackendFileSystem<Inode = u64, Handle = u64> + 'static, W: Watch + 'static> BackendFileSystem
    for Watched<F, W>
{
    fn mount(&self) -> io::Result<(Entry, u64)> {
        self.inner.mount()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<F: FileSystem<Inode = u64, Handle = u64>, W: Watch> FileSystem for Watched<F, W> {
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
        self.watch.looked_up(parent, name.to_bytes(), &result);
        result
    }

    fn forget(&self, ctx: &Context, inode: u64, count: u64) {
        self.watch.forgot(inode, count);
        self.inner.forget(ctx, inode, count)
    }

    fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
        for &(inode, count) in &requests {
            self.watch.forgot(inode, count);
        }
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
        let listed = self.inner.readdirplus(ctx, inode, handle, size, offset, &mut |dir_entry, entry| {
            let name = dir_entry.name;
            let took = add_entry(dir_entry, entry)?;
            self.watch.listed(inode, name, &entry, took != 0);
            Ok(took)
        });
        self.watch.listing_done();
        listed
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
