//! A writable share's passthrough filesystem, held to what the host user
//! running stockade could do there without privilege, whoever that user
//! is (stockade run as root included):
//!
//! - Everything the guest makes belongs to the host user. The passthrough
//!   server would take on the uid and gid the guest's request carries
//!   (root-owned files when stockade runs as root, anyone's when the guest
//!   says so); it is handed uid 0, which it takes to mean "as yourself".
//!   Giving a file to another owner or group is refused.
//! - No device nodes (a whiteout is one) and no fifos: a fifo left where a
//!   host program expects a file stops that program when it reads.
//!   Sockets are allowed: nothing on the host answers them.
//! - No setuid or setgid bit, on creation or by chmod, and changing a file
//!   that has one clears it, as the kernel does for a writer without
//!   CAP_FSETID. Extended attributes outside `user.` (file capabilities
//!   in `security.capability`, ACLs, `trusted.`) are refused.
//! - Growth is bounded by the share's [`Budget`], with ENOSPC.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, FsOptions, OpenOptions, SetattrValid, stat64, statvfs64};
use fuse_backend_rs::api::BackendFileSystem;
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyReader, ZeroCopyWriter,
};

use super::budget::{Budget, ENTRY_COST};

fn eperm() -> io::Error {
    io::Error::from_raw_os_error(libc::EPERM)
}

const SETID: u32 = libc::S_ISUID | libc::S_ISGID;
/// The most of a directory listing read at once: the passthrough reserves
/// the size the guest names (up to 4 GiB, its reply descriptors may alias),
/// and Linux asks a page at a time.
const MAX_LISTING: u32 = 1 << 20;

/// `inner`, with the host user's powers and no more, within `budget`.
pub struct WritableFs<F> {
    inner: F,
    budget: Mutex<Budget>,
    /// The files the guest holds open, by handle.
    open: Mutex<HashMap<u64, OpenFile>>,
    /// The host user's uid and gid: the only owner a file may be given.
    owner: (u32, u32),
}

impl<F> WritableFs<F> {
    /// `inner`, serving the host directory `root` within `limit` bytes (if
    /// any) and the free-space margin (`margin`, or the staging margin).
    pub fn new(inner: F, root: &Path, limit: Option<u64>, margin: Option<u64>) -> io::Result<Self> {
        // SAFETY: geteuid and getegid only read the caller's credentials.
        let owner = unsafe { (libc::geteuid(), libc::getegid()) };
        Ok(WritableFs {
            inner,
            budget: Mutex::new(Budget::new(root, limit, margin)?),
            open: Mutex::new(HashMap::new()),
            owner,
        })
    }

    fn budget(&self) -> MutexGuard<'_, Budget> {
        self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_files(&self) -> MutexGuard<'_, HashMap<u64, OpenFile>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A file the guest holds open.
#[derive(Clone, Copy)]
struct OpenFile {
    inode: u64,
    /// Opened with O_APPEND: each write grows the file by its size,
    /// whatever offset it names.
    append: bool,
}

/// The request's context with the guest's ids replaced: the passthrough
/// server switches to a nonzero uid or gid, and stays itself for 0.
fn as_host_user(ctx: &Context) -> Context {
    Context { uid: 0, gid: 0, ..*ctx }
}

/// A mode the guest may give a file it makes: no setid bit.
fn check_mode(mode: u32) -> io::Result<()> {
    if mode & SETID != 0 { Err(eperm()) } else { Ok(()) }
}

/// The setid bits a change to a file with `mode` clears: setuid always,
/// setgid when group-executable (without, it marks mandatory locking).
fn privileges(mode: u32) -> u32 {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return 0;
    }
    let gid = if mode & libc::S_IXGRP != 0 { libc::S_ISGID } else { 0 };
    mode & (libc::S_ISUID | gid)
}

impl<F: FileSystem<Inode = u64, Handle = u64>> WritableFs<F> {
    /// Clears the setid bits of `inode`, whose attributes are `attr`,
    /// before the guest changes its content.
    fn kill_privileges(&self, ctx: &Context, inode: u64, handle: Option<u64>, attr: &stat64) -> io::Result<()> {
        let kill = privileges(attr.st_mode);
        if kill == 0 {
            return Ok(());
        }
        let mut cleared = *attr;
        cleared.st_mode = attr.st_mode & !kill;
        self.inner.setattr(ctx, inode, cleared, handle, SetattrValid::MODE).map(drop)
    }

    /// Readies `inode` for a change to its content of `len` bytes that
    /// ends at `end` (appended, if `append`): charges its growth and clears
    /// its setid bits. Growth is what lies past the end of the file, and
    /// the holes the change fills within it: a sparse file takes no space
    /// until its holes are written.
    fn before_change(
        &self,
        ctx: &Context,
        inode: u64,
        handle: Option<u64>,
        end: u64,
        len: u64,
        append: bool,
    ) -> io::Result<()> {
        let (attr, _) = self.inner.getattr(ctx, inode, handle)?;
        let size = u64::try_from(attr.st_size).unwrap_or(0);
        let growth = if append {
            len
        } else {
            let (start, within) = (end.saturating_sub(len), end.min(size));
            let filled = match handle {
                Some(handle) if start < within => self.unallocated(ctx, inode, handle, start, within),
                _ => 0,
            };
            end.saturating_sub(size).saturating_add(filled)
        };
        self.grow(ctx, growth)?;
        self.kill_privileges(ctx, inode, handle, &attr)
    }

    /// What of `start..end` (within the file's size) a change may newly
    /// allocate: from the first hole in it on (one seek, an upper bound),
    /// all of it where holes cannot be told.
    fn unallocated(&self, ctx: &Context, inode: u64, handle: u64, start: u64, end: u64) -> u64 {
        const SEEK_HOLE: u32 = libc::SEEK_HOLE as u32;
        match self.inner.lseek(ctx, inode, handle, start, SEEK_HOLE) {
            Ok(hole) => end.saturating_sub(hole),
            Err(_) => end - start,
        }
    }

    fn note_handle(&self, inode: u64, handle: Option<u64>, flags: u32) {
        if let Some(handle) = handle {
            let append = flags & libc::O_APPEND as u32 != 0;
            self.open_files().insert(handle, OpenFile { inode, append });
        }
    }

    /// Charges `bytes` of growth to the budget.
    fn grow(&self, ctx: &Context, bytes: u64) -> io::Result<()> {
        self.budget().grow(bytes, || self.detached(ctx))
    }

    /// The bytes of the files the guest removed while holding them open:
    /// still on the disk, and no name leads a measure of the share to them.
    fn detached(&self, ctx: &Context) -> u64 {
        let open: Vec<(u64, OpenFile)> = self.open_files().iter().map(|(&h, &f)| (h, f)).collect();
        let mut counted = HashSet::new();
        let mut bytes = 0u64;
        for (handle, file) in open {
            let Ok((st, _)) = self.inner.getattr(ctx, file.inode, Some(handle)) else { continue };
            if st.st_nlink == 0 && counted.insert((st.st_dev, st.st_ino)) {
                let size = u64::try_from(st.st_size).unwrap_or(0);
                let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
                bytes = bytes.saturating_add(size.max(allocated));
            }
        }
        bytes
    }
}

impl<F: BackendFileSystem<Inode = u64, Handle = u64> + 'static> BackendFileSystem for WritableFs<F> {
    fn mount(&self) -> io::Result<(Entry, u64)> {
        self.inner.mount()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl<F: FileSystem<Inode = u64, Handle = u64>> FileSystem for WritableFs<F> {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        self.inner.init(capable)
    }

    /// Every handle goes with the session.
    fn destroy(&self) {
        self.open_files().clear();
        self.inner.destroy()
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.inner.lookup(ctx, parent, name)
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

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        if valid.contains(SetattrValid::MODE) {
            check_mode(attr.st_mode)?;
        }
        if (valid.contains(SetattrValid::UID) && attr.st_uid != self.owner.0)
            || (valid.contains(SetattrValid::GID) && attr.st_gid != self.owner.1)
        {
            return Err(eperm());
        }
        if valid.contains(SetattrValid::SIZE) {
            let size = u64::try_from(attr.st_size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            self.before_change(ctx, inode, handle, size, 0, false)?;
        }
        self.inner.setattr(ctx, inode, attr, handle, valid)
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        self.inner.readlink(ctx, inode)
    }

    fn symlink(&self, ctx: &Context, linkname: &CStr, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.grow(ctx, ENTRY_COST)?;
        self.inner.symlink(&as_host_user(ctx), linkname, parent, name)
    }

    fn mknod(&self, ctx: &Context, inode: u64, name: &CStr, mode: u32, rdev: u32, umask: u32) -> io::Result<Entry> {
        match mode & libc::S_IFMT {
            libc::S_IFREG | libc::S_IFSOCK => {}
            _ => return Err(eperm()),
        }
        check_mode(mode)?;
        self.grow(ctx, ENTRY_COST)?;
        self.inner.mknod(&as_host_user(ctx), inode, name, mode, rdev, umask)
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32) -> io::Result<Entry> {
        check_mode(mode)?;
        self.grow(ctx, ENTRY_COST)?;
        self.inner.mkdir(&as_host_user(ctx), parent, name, mode, umask)
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.inner.unlink(ctx, parent, name)
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.inner.rmdir(ctx, parent, name)
    }

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        // A whiteout is a character device left in the old name's place.
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.inner.rename(ctx, olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        self.grow(ctx, ENTRY_COST)?;
        self.inner.link(ctx, inode, newparent, newname)
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        if super::readonly::opens_for_writing(flags) {
            let (attr, _) = self.inner.getattr(ctx, inode, None)?;
            self.kill_privileges(ctx, inode, None, &attr)?;
        }
        let opened = self.inner.open(ctx, inode, flags, fuse_flags)?;
        self.note_handle(inode, opened.0, flags);
        Ok(opened)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        check_mode(args.mode)?;
        self.grow(ctx, ENTRY_COST)?;
        let created = self.inner.create(&as_host_user(ctx), parent, name, args)?;
        // It may have been there, setid bits and all. Refused, the guest
        // hears of neither the handle nor the node: neither is kept.
        if let Err(e) = self.kill_privileges(ctx, created.0.inode, created.1, &created.0.attr) {
            if let Some(handle) = created.1 {
                self.inner.release(ctx, created.0.inode, args.flags, handle, false, false, None)?;
            }
            self.inner.forget(ctx, created.0.inode, 1);
            return Err(e);
        }
        self.note_handle(created.0.inode, created.1, args.flags);
        Ok(created)
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

    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        delayed_write: bool,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        let append = self.open_files().get(&handle).is_some_and(|f| f.append);
        let len = u64::from(size);
        self.before_change(ctx, inode, Some(handle), offset.saturating_add(len), len, append)?;
        self.inner.write(ctx, inode, handle, r, size, offset, lock_owner, delayed_write, flags, fuse_flags)
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        self.inner.flush(ctx, inode, handle, lock_owner)
    }

    fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.inner.fsync(ctx, inode, datasync, handle)
    }

    fn fallocate(&self, ctx: &Context, inode: u64, handle: u64, mode: u32, offset: u64, length: u64) -> io::Result<()> {
        const PUNCH_HOLE: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32;
        const PAST_END: u32 =
            (libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_INSERT_RANGE | libc::FALLOC_FL_UNSHARE_RANGE) as u32;
        if mode & PUNCH_HOLE == 0 {
            // Beyond the end, or inserted, or kept past it, or extents
            // shared with another file made its own: all of it may be new.
            let past_end = mode & PAST_END != 0;
            self.before_change(ctx, inode, Some(handle), offset.saturating_add(length), length, past_end)?;
        }
        self.inner.fallocate(ctx, inode, handle, mode, offset, length)
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
        self.open_files().remove(&handle);
        self.inner.release(ctx, inode, flags, handle, flush, flock_release, lock_owner)
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        self.inner.statfs(ctx, inode)
    }

    fn setxattr(&self, ctx: &Context, inode: u64, name: &CStr, value: &[u8], flags: u32) -> io::Result<()> {
        user_attribute(name)?;
        self.inner.setxattr(ctx, inode, name, value, flags)
    }

    fn getxattr(&self, ctx: &Context, inode: u64, name: &CStr, size: u32) -> io::Result<GetxattrReply> {
        self.inner.getxattr(ctx, inode, name, size)
    }

    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        self.inner.listxattr(ctx, inode, size)
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        user_attribute(name)?;
        self.inner.removexattr(ctx, inode, name)
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
        self.inner.readdir(ctx, inode, handle, size.min(MAX_LISTING), offset, add_entry)
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
        self.inner.readdirplus(ctx, inode, handle, size.min(MAX_LISTING), offset, add_entry)
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.inner.fsyncdir(ctx, inode, datasync, handle)
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

/// Only `user.` attributes: `security.capability` is a setuid bit by
/// another name, ACLs and `trusted.` attributes are the host's business.
fn user_attribute(name: &CStr) -> io::Result<()> {
    if name.to_bytes().starts_with(b"user.") { Ok(()) } else { Err(eperm()) }
}

#[cfg(test)]
mod tests {
    use fuse_backend_rs::api::filesystem::{Context, FileSystem};

    use super::super::bounded::{BoundedFs, HandleCount, ROOT};
    use super::super::secrets::Secrets;
    use super::*;

    /// A guest that opens files for appending and remounts (FUSE_DESTROY,
    /// then INIT), again and again, leaves nothing behind of the handles
    /// the remount closed.
    #[test]
    fn a_remount_forgets_the_appending_handles() {
        let dir = tempfile::tempdir().unwrap();
        let bounded = BoundedFs::new(dir.path(), &Secrets::default(), 4, &HandleCount::default(), 16, Duration::ZERO)
            .unwrap()
            .writable();
        let fs = WritableFs::new(bounded, dir.path(), None, None).unwrap();
        let ctx = Context::default();
        for round in 0..3 {
            for i in 0..8 {
                let flags = (libc::O_WRONLY | libc::O_APPEND).cast_unsigned();
                let args = CreateIn { flags, mode: 0o644, umask: 0, fuse_flags: 0 };
                fs.create(&ctx, ROOT, &std::ffi::CString::new(format!("f{round}-{i}")).unwrap(), args).unwrap();
            }
            assert_eq!(fs.open_files().len(), 8);
            fs.destroy();
            assert!(fs.open_files().is_empty(), "round {round}");
        }
    }
}
