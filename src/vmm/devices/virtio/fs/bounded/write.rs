//! The writable mode of [`BoundedFs`], for an agent's state and a policy's
//! `rw` mounts (wrapped in `WritableFs`, which holds the guest to the host
//! user's powers and the share's growth budget).
//!
//! Every change is made relative to a directory descriptor found as for a
//! read (beneath the root through directories only, checked against the
//! host identity it had), by name, never through a path string the guest
//! gave. A change
//! to a node first checks that its name still leads to it, so a file the
//! host replaced is ESTALE and never changed in its place.
//!
//! What the guest does to names is kept in the node model as it happens:
//! a rename moves the node's name (a directory's descendants are found
//! through it, by its new name), an unlink or a rename over a name takes
//! that name from the node it led to, a link adds one. The host's own
//! changes stay what they are for a read: a name leading elsewhere is ESTALE.
//! A file the guest removed while it holds it open has no name left; its
//! handles still serve it, its attributes included.
//!
//! Files opened for writing are handles like the others, counted against
//! the same cap. Nothing here holds a descriptor per node.
//!
//! The host's secrets stay closed here too: none is opened for writing or
//! by a create, nothing is made at a secret's place or changed in a secret
//! directory, and a secret's name is neither moved nor linked (a secret
//! made during the run is one by its place alone). A file is opened only
//! once found with `O_PATH` a regular file: what the host has at a name
//! may be a FIFO or a device, which an open alone wakes.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{SetattrValid, stat64};
use fuse_backend_rs::api::filesystem::{Entry, ZeroCopyReader};

use super::{
    BoundedFs, Handle, NO_HANDLE, ROOT, State, component, err, fstat, fstatat, locked, open_at, open_at_mode, reopen,
    stale_if_gone,
};

/// What of the guest's open flags reaches the host's open: the access mode
/// and what changes writes (appending, truncating, synchronous writes);
/// O_DIRECT, O_NOATIME and the rest are the guest's business.
const PASSED_FLAGS: i32 = libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC | libc::O_SYNC | libc::O_DSYNC;
/// The renameat2 flags served: a whiteout is a device node.
const RENAME_FLAGS: u32 = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;

/// What a make request makes.
pub(super) enum Make<'a> {
    Dir { mode: u32 },
    Node { mode: u32, rdev: u32 },
    Symlink { target: &'a CStr },
}

/// The guest's open flags as open(2) takes them.
pub(super) fn open_flags(flags: u32) -> io::Result<libc::c_int> {
    libc::c_int::try_from(flags).map_err(|_| err(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Whether what `valid` names of `attr` can be had on a node whose
/// attributes are `st` and that cannot be opened to change them (a
/// symlink, a socket, a FIFO; see [`BoundedFs::attributes_fd`]): only an
/// owner and group it already has, which leaves nothing to change. A mode
/// is EOPNOTSUPP, as lchmod answers; times are ENOSYS, which coreutils
/// (`cp -a`) takes for a system without lutimes and passes over, where
/// EOPNOTSUPP would fail the copy (tar passes over both).
fn unopenable(st: &stat64, attr: &stat64, valid: SetattrValid) -> io::Result<()> {
    let other_owner = (valid.contains(SetattrValid::UID) && attr.st_uid != st.st_uid)
        || (valid.contains(SetattrValid::GID) && attr.st_gid != st.st_gid);
    if valid.contains(SetattrValid::MODE) || other_owner {
        return Err(err(libc::EOPNOTSUPP));
    }
    if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) {
        return Err(err(libc::ENOSYS));
    }
    Ok(())
}

/// `mode` with the guest's `umask` applied to its permission bits.
fn masked(mode: u32, umask: u32) -> u32 {
    mode & !(umask & 0o777)
}

impl BoundedFs {
    /// EROFS unless the share is writable.
    pub(super) fn writing(&self) -> io::Result<()> {
        if self.writable { Ok(()) } else { Err(err(libc::EROFS)) }
    }

    /// The descriptor of the directory `parent`, to change `name` in it:
    /// one component, not "." or "..". Nothing in a secret directory is
    /// changed, as nothing in it is found: a rename would take its files
    /// out by their names.
    fn parent_dir(&self, state: &State, parent: u64, name: &CStr) -> io::Result<Arc<OwnedFd>> {
        self.writing()?;
        component(name)?;
        match state.nodes.get(&parent) {
            Some(n) if n.is_dir && self.is_secret(state, parent)? => Err(err(libc::EACCES)),
            Some(n) if n.is_dir => self.dir_fd(state, parent),
            Some(_) => Err(err(libc::ENOTDIR)),
            None => Err(err(libc::ESTALE)),
        }
    }

    /// [`Self::parent_dir`], for a name to be made (or moved or linked) at:
    /// never a secret's place. A file of the guest's there would be where
    /// the host writes the secret, and the guest may hold it by another
    /// name, where it is no secret.
    fn made_at(&self, state: &State, parent: u64, name: &CStr) -> io::Result<Arc<OwnedFd>> {
        let dir = self.parent_dir(state, parent, name)?;
        if self.secret_place(state, parent, name) {
            return Err(err(libc::EACCES));
        }
        Ok(dir)
    }

    /// Whether `name` in `parent` is where one of the host's secrets is.
    fn secret_place(&self, state: &State, parent: u64, name: &CStr) -> bool {
        state.nodes.get(&parent).is_some_and(|p| self.secrets.placed(p.dev, p.ino, name))
    }

    /// `act` on `node` by the first of its names that still leads to it,
    /// given the directory, the name and its attributes; the root is "."
    /// in itself. A name leading elsewhere is never acted on: ESTALE if
    /// none leads to the node.
    fn checked_at<T>(
        &self,
        state: &State,
        node: u64,
        mut act: impl FnMut(&State, RawFd, &CStr, stat64) -> io::Result<T>,
    ) -> io::Result<T> {
        if node == ROOT {
            let root = Arc::clone(&self.root);
            let st = fstat(root.as_raw_fd())?;
            return act(state, root.as_raw_fd(), c".", st);
        }
        let n = state.nodes.get(&node).ok_or_else(|| err(libc::ESTALE))?;
        let (dev, ino) = (n.dev, n.ino);
        let mut last = err(libc::ESTALE);
        for (parent, name) in &n.names {
            let dir = match self.dir_fd(state, *parent) {
                Ok(dir) => dir,
                Err(e) => {
                    last = stale_if_gone(e);
                    continue;
                }
            };
            match fstatat(dir.as_raw_fd(), name) {
                Ok(st) if (st.st_dev, st.st_ino) == (dev, ino) => return act(state, dir.as_raw_fd(), name, st),
                Ok(_) => last = err(libc::ESTALE),
                Err(e) => last = stale_if_gone(e),
            }
        }
        Err(last)
    }

    /// The open handle `handle` of `node`, still where it was (see
    /// `still_held`).
    fn handle_of(&self, handle: u64, node: u64) -> io::Result<Arc<Handle>> {
        let handle = self.handle(handle)?;
        if handle.node != node {
            return Err(err(libc::EBADF));
        }
        self.still_held(&handle)?;
        Ok(handle)
    }

    /// Makes `what` at `name` in `parent`, entered as a lookup.
    pub(super) fn make(&self, parent: u64, name: &CStr, what: Make<'_>, umask: u32) -> io::Result<Entry> {
        let mut state = self.exclusive();
        let dir = self.made_at(&state, parent, name)?;
        let fd = dir.as_raw_fd();
        // SAFETY: `name` and `target` are NUL-terminated; these calls only
        // make a name in the directory `fd`, which we hold.
        check(unsafe {
            match what {
                Make::Dir { mode } => libc::mkdirat(fd, name.as_ptr(), masked(mode, umask)),
                Make::Node { mode, rdev } => libc::mknodat(fd, name.as_ptr(), masked(mode, umask), rdev.into()),
                Make::Symlink { target } => libc::symlinkat(target.as_ptr(), fd, name.as_ptr()),
            }
        })?;
        let st = fstatat(fd, name)?;
        self.enter(&mut state, parent, name, st)
    }

    /// Creates (or opens, without O_EXCL) the regular file `name` in
    /// `parent`, open with `flags`: its entry and its handle. Nothing is
    /// opened or made at a secret's place.
    pub(super) fn create_file(
        &self,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
        flags: u32,
    ) -> io::Result<(Entry, u64)> {
        self.counted(|| {
            let mut state = self.exclusive();
            let dir = self.made_at(&state, parent, name)?;
            let guest_flags = open_flags(flags)?;
            let flags = guest_flags & PASSED_FLAGS | libc::O_NONBLOCK;
            let mode = masked(mode & 0o7777, umask);
            // A file made is empty: O_TRUNC is for one that exists (see `reopen_file`).
            let making = flags & !libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL;
            let made = open_at_mode(&state, dir.as_raw_fd(), name, making, mode);
            let file = match made {
                Ok(file) => file,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && guest_flags & libc::O_EXCL == 0 => {
                    let path = open_at(&state, dir.as_raw_fd(), name, libc::O_PATH)?;
                    self.reopen_file(&state, &path, None, flags)?
                }
                Err(e) => return Err(e),
            };
            let st = fstat(file.as_raw_fd())?;
            let entry = self.enter(&mut state, parent, name, st)?;
            Ok((entry, self.new_handle(entry.inode, file)))
        })
    }

    /// The file `path` (an `O_PATH` descriptor) opened with `flags` once
    /// it is a regular file (that identity, if given) and no secret: what
    /// the host had at a name may be a FIFO or a device, which an open
    /// alone wakes, or one of its secrets.
    fn reopen_file(
        &self,
        state: &State,
        path: &OwnedFd,
        identity: Option<(u64, u64)>,
        flags: i32,
    ) -> io::Result<OwnedFd> {
        let st = fstat(path.as_raw_fd())?;
        if identity.is_some_and(|id| id != (st.st_dev, st.st_ino)) {
            return Err(err(libc::ESTALE));
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(err(libc::EISDIR)),
            // As open(2) answers O_NOFOLLOW.
            libc::S_IFLNK => return Err(err(libc::ELOOP)),
            _ => return Err(err(libc::ENXIO)),
        }
        if self.secrets.holds(st.st_dev, st.st_ino) {
            return Err(err(libc::EACCES));
        }
        if flags & libc::O_TRUNC == 0 {
            return reopen(state, path, flags);
        }
        // Never opened with O_TRUNC, which Landlock below ABI 3 does not
        // judge (see `jail::seccomp::Openat::Any`): emptied through a
        // descriptor opened for writing, which it does.
        let file = reopen(state, path, flags & !libc::O_TRUNC)?;
        let writer = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => Some(reopen(state, path, libc::O_WRONLY | libc::O_NONBLOCK)?),
            _ => None,
        };
        let fd = writer.as_ref().unwrap_or(&file).as_raw_fd();
        // SAFETY: ftruncate touches no memory of ours.
        check(unsafe { libc::ftruncate(fd, 0) })?;
        Ok(file)
    }

    /// A new descriptor of the regular file `node` for writing, unless it
    /// is a secret.
    pub(super) fn open_writing(&self, state: &State, node: u64, flags: i32) -> io::Result<OwnedFd> {
        self.writing()?;
        let identity = match state.nodes.get(&node) {
            Some(n) if n.is_dir => return Err(err(libc::EISDIR)),
            Some(n) if n.is_file => (n.dev, n.ino),
            Some(_) => return Err(err(libc::ENXIO)),
            None => return Err(err(libc::ESTALE)),
        };
        self.readable(state, node)?;
        let path = self.checked_at(state, node, |state, dir, name, _| open_at(state, dir, name, libc::O_PATH))?;
        self.reopen_file(state, &path, Some(identity), flags & PASSED_FLAGS | libc::O_NONBLOCK)
    }

    /// Removes the name (a directory, if `dir`) from `parent`.
    pub(super) fn remove(&self, parent: u64, name: &CStr, dir: bool) -> io::Result<()> {
        let mut state = self.exclusive();
        let at = self.parent_dir(&state, parent, name)?;
        let st = fstatat(at.as_raw_fd(), name)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: `name` is NUL-terminated; unlinkat touches no memory of ours.
        check(unsafe { libc::unlinkat(at.as_raw_fd(), name.as_ptr(), flags) })?;
        let id = state.ids.id(st.st_dev, st.st_ino)?;
        Self::drop_name(&mut state, id, parent, name);
        Ok(())
    }

    /// Renames `oldname` in `olddir` to `newname` in `newdir`, as
    /// renameat2 with `flags`, and moves the names of the nodes concerned.
    pub(super) fn rename_node(
        &self,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        if flags & !RENAME_FLAGS != 0 {
            return Err(err(libc::EINVAL));
        }
        let mut state = self.exclusive();
        // A secret made where one is named is a secret by its place alone:
        // moved from it, it would be read; moved to it, the guest's file
        // would take it (an exchange does both).
        let from = self.made_at(&state, olddir, oldname)?;
        let to = self.made_at(&state, newdir, newname)?;
        let moved = fstatat(from.as_raw_fd(), oldname)?;
        let replaced = match fstatat(to.as_raw_fd(), newname) {
            Ok(st) => Some(st),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        // SAFETY: the names are NUL-terminated; renameat2 touches no memory
        // of ours.
        let renamed = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                from.as_raw_fd(),
                oldname.as_ptr(),
                to.as_raw_fd(),
                newname.as_ptr(),
                flags,
            )
        };
        if renamed < 0 {
            return Err(io::Error::last_os_error());
        }
        let moved = state.ids.id(moved.st_dev, moved.st_ino)?;
        let replaced = match replaced {
            Some(st) => Some(state.ids.id(st.st_dev, st.st_ino)?),
            None => None,
        };
        match replaced {
            // Two names of one file: rename changes nothing, an exchange too.
            Some(other) if other == moved => {}
            Some(other) if flags & libc::RENAME_EXCHANGE != 0 => {
                Self::move_name(&mut state, moved, (olddir, oldname), (newdir, newname));
                Self::move_name(&mut state, other, (newdir, newname), (olddir, oldname));
            }
            other => {
                if let Some(other) = other {
                    Self::drop_name(&mut state, other, newdir, newname);
                }
                Self::move_name(&mut state, moved, (olddir, oldname), (newdir, newname));
            }
        }
        Ok(())
    }

    /// Links the file `node` as `newname` in `newparent`, entered as a lookup.
    pub(super) fn link_node(&self, node: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        let mut state = self.exclusive();
        let to = self.made_at(&state, newparent, newname)?;
        // A new name of a secret by its place alone, the old one removed,
        // would be no secret.
        if self.is_secret(&state, node)? {
            return Err(err(libc::EACCES));
        }
        self.checked_at(&state, node, |_, dir, name, _| {
            // SAFETY: the names are NUL-terminated; linkat (which does not
            // follow a symlink it links) touches no memory of ours.
            check(unsafe { libc::linkat(dir, name.as_ptr(), to.as_raw_fd(), newname.as_ptr(), 0) })
        })?;
        let st = fstatat(to.as_raw_fd(), newname)?;
        self.enter(&mut state, newparent, newname, st)
    }

    /// Changes what `valid` names of `node`'s attributes to `attr`'s,
    /// through `handle` if given, else through a descriptor of the node
    /// (see [`Self::attributes_fd`]): the attributes after.
    pub(super) fn set_attr(
        &self,
        node: u64,
        attr: stat64,
        handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<stat64> {
        self.writing()?;
        let handle = match handle {
            Some(h) if h != NO_HANDLE => Some(self.handle_of(h, node)?),
            _ => None,
        };
        let state = self.exclusive();
        let by_handle = handle.as_ref().map(|h| h.file.as_raw_fd());
        let metadata =
            SetattrValid::MODE | SetattrValid::UID | SetattrValid::GID | SetattrValid::ATIME | SetattrValid::MTIME;
        // Opened before any change, which may take its owner's read right.
        let opened = match by_handle {
            None if valid.intersects(metadata) => Some(self.attributes_fd(&state, node)?),
            _ => None,
        };
        let fd = match &opened {
            Some(Ok(file)) => Some(file.as_raw_fd()),
            Some(Err(st)) => {
                unopenable(st, &attr, valid)?;
                None
            }
            None => by_handle,
        };
        if valid.contains(SetattrValid::MODE)
            && let Some(fd) = fd
        {
            // SAFETY: fchmod touches no memory of ours.
            check(unsafe { libc::fchmod(fd, attr.st_mode & 0o7777) })?;
        }
        if valid.intersects(SetattrValid::UID | SetattrValid::GID)
            && let Some(fd) = fd
        {
            let uid = if valid.contains(SetattrValid::UID) { attr.st_uid } else { u32::MAX };
            let gid = if valid.contains(SetattrValid::GID) { attr.st_gid } else { u32::MAX };
            // SAFETY: fchown touches no memory of ours.
            check(unsafe { libc::fchown(fd, uid, gid) })?;
        }
        if valid.contains(SetattrValid::SIZE) {
            let truncate = |fd: RawFd| {
                // SAFETY: ftruncate touches no memory of ours.
                check(unsafe { libc::ftruncate(fd, attr.st_size) })
            };
            match by_handle {
                Some(fd) => truncate(fd)?,
                None => {
                    let file = self.open_writing(&state, node, libc::O_WRONLY)?;
                    truncate(file.as_raw_fd())?;
                }
            }
        }
        if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME)
            && let Some(fd) = fd
        {
            let time = |set: SetattrValid, now: SetattrValid, sec: i64, nsec: i64| {
                if !valid.contains(set) {
                    libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }
                } else if valid.contains(now) {
                    libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW }
                } else {
                    libc::timespec { tv_sec: sec, tv_nsec: nsec }
                }
            };
            let times = [
                time(SetattrValid::ATIME, SetattrValid::ATIME_NOW, attr.st_atime, attr.st_atime_nsec),
                time(SetattrValid::MTIME, SetattrValid::MTIME_NOW, attr.st_mtime, attr.st_mtime_nsec),
            ];
            // SAFETY: futimens only reads `times`.
            check(unsafe { libc::futimens(fd, times.as_ptr()) })?;
        }
        match by_handle {
            Some(fd) => fstat(fd),
            None => self.stat_node(&state, node),
        }
    }

    /// `node` opened to have its mode, owner or times changed through the
    /// descriptor, or the attributes of a node that cannot be opened (see
    /// [`unopenable`]): the writable shares' worker may not change them by
    /// name (its seccomp filter has no fchmodat, fchownat or utimensat
    /// with a path, which could name a read-only share's file, see
    /// `fs::FS_WRITE`), and an `O_PATH` descriptor refuses the calls. The
    /// node is pinned with `O_PATH` first, checked to be itself, and
    /// opened for reading through its link in /proc/thread-self/fd, a
    /// regular file or a directory only: nothing the host put at the name
    /// meanwhile is followed or opened.
    ///
    /// What this costs besides: a file or directory its owner may not read
    /// cannot have them changed (EACCES, unless the VMM runs as root: a
    /// mode without the owner's read right is set, but not taken back). A
    /// secret is not opened: EACCES, as for a truncation.
    fn attributes_fd(&self, state: &State, node: u64) -> io::Result<Result<OwnedFd, stat64>> {
        let identity = state.nodes.get(&node).map(|n| (n.dev, n.ino)).ok_or_else(|| err(libc::ESTALE))?;
        self.readable(state, node)?;
        let path = self.checked_at(state, node, |state, dir, name, _| open_at(state, dir, name, libc::O_PATH))?;
        let st = fstat(path.as_raw_fd())?;
        if (st.st_dev, st.st_ino) != identity {
            return Err(err(libc::ESTALE));
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => reopen(state, &path, libc::O_RDONLY | libc::O_NONBLOCK).map(Ok),
            libc::S_IFDIR => reopen(state, &path, libc::O_RDONLY | libc::O_DIRECTORY).map(Ok),
            _ => Ok(Err(st)),
        }
    }

    /// Writes `size` bytes from `r` at `offset` through `handle` of `node`.
    pub(super) fn write_at(
        &self,
        node: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        self.writing()?;
        let handle = self.handle_of(handle, node)?;
        // SAFETY: the handle's descriptor stays open for this call (the
        // handle is held), past this borrowed File, which never closes it
        // (ManuallyDrop).
        let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(handle.file.as_raw_fd()) });
        r.read_to(&mut *file, size as usize, offset)
    }

    /// Flushes `handle` of `node` to the host's disk.
    pub(super) fn sync(&self, node: u64, handle: u64, datasync: bool) -> io::Result<()> {
        self.writing()?;
        let fd = self.handle_of(handle, node)?.file.as_raw_fd();
        // SAFETY: fsync and fdatasync touch no memory of ours; the handle
        // is held by the caller's reference count until they return.
        check(unsafe { if datasync { libc::fdatasync(fd) } else { libc::fsync(fd) } })
    }

    /// fallocate(2) through `handle` of `node`.
    pub(super) fn allocate(&self, node: u64, handle: u64, mode: u32, offset: u64, length: u64) -> io::Result<()> {
        self.writing()?;
        let handle = self.handle_of(handle, node)?;
        let offset = libc::off64_t::try_from(offset).map_err(|_| err(libc::EINVAL))?;
        let length = libc::off64_t::try_from(length).map_err(|_| err(libc::EINVAL))?;
        let mode = libc::c_int::try_from(mode).map_err(|_| err(libc::EINVAL))?;
        // SAFETY: fallocate64 touches no memory of ours.
        check(unsafe { libc::fallocate64(handle.file.as_raw_fd(), mode, offset, length) })
    }

    /// Takes the name `name` in `parent` from `id`; a node left without a
    /// name is found no more (its handles still serve it), and its cached
    /// descriptors are let go.
    fn drop_name(state: &mut State, id: u64, parent: u64, name: &CStr) {
        let Some(node) = state.nodes.get_mut(&id) else { return };
        let Some(i) = node.names.iter().position(|(p, n)| *p == parent && n.as_c_str() == name) else { return };
        node.names.remove(i);
        let nameless = node.names.is_empty();
        if let Some(p) = state.nodes.get_mut(&parent) {
            p.children = p.children.saturating_sub(1);
        }
        if nameless {
            locked(&state.cache).remove(id);
            locked(&state.readers).remove(id);
        }
        Self::forget_one(state, id, 0);
        Self::forget_one(state, parent, 0);
    }

    /// Moves the name `from` of `id` to `to`, where the node is now.
    fn move_name(state: &mut State, id: u64, from: (u64, &CStr), to: (u64, &CStr)) {
        if !state.nodes.contains_key(&id) {
            return;
        }
        // The new name first: the parent of the old one may go with it.
        Self::put_name(state, id, to.0, to.1);
        Self::drop_name(state, id, from.0, from.1);
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::fs::File;
    use std::io::{Read, Seek, Write};
    use std::path::Path;
    use std::time::Duration;

    use fuse_backend_rs::abi::fuse_abi::CreateIn;
    use fuse_backend_rs::api::filesystem::{Context, FileSystem};

    use super::super::{BoundedFs, HandleCount, NO_HANDLE, ROOT, Secrets};
    use super::*;

    const CACHED: usize = 8;
    const HANDLES: usize = 8;

    fn writable(dir: &Path) -> BoundedFs {
        BoundedFs::new(dir, &Secrets::default(), CACHED, &HandleCount::default(), HANDLES, Duration::ZERO)
            .unwrap()
            .writable()
    }

    fn name(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    fn errno<T>(r: io::Result<T>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    /// Descriptors the filesystem holds besides its root.
    fn held(fs: &BoundedFs) -> usize {
        let state = fs.shared();
        locked(&state.cache).fds.len() + locked(&state.readers).fds.len() + locked(&fs.handles).open.len()
    }

    fn create(fs: &BoundedFs, parent: u64, file: &str) -> (u64, u64) {
        let args =
            CreateIn { flags: libc::O_RDWR.cast_unsigned(), mode: libc::S_IFREG | 0o644, umask: 0o022, fuse_flags: 0 };
        let (entry, handle, _, _) = fs.create(&Context::default(), parent, &name(file), args).unwrap();
        (entry.inode, handle.unwrap())
    }

    fn write(fs: &BoundedFs, node: u64, handle: u64, offset: u64, data: &[u8]) {
        let mut from = tempfile::tempfile().unwrap();
        from.write_all(data).unwrap();
        from.rewind().unwrap();
        let size = u32::try_from(data.len()).unwrap();
        let n = fs.write(&Context::default(), node, handle, &mut from, size, offset, None, false, 0, 0).unwrap();
        assert_eq!(n, data.len());
    }

    /// The file `node` as the guest reads it without a handle.
    fn read(fs: &BoundedFs, node: u64) -> io::Result<Vec<u8>> {
        let mut out: File = tempfile::tempfile().unwrap();
        fs.read(&Context::default(), node, NO_HANDLE, &mut out, 1 << 16, 0, None, 0)?;
        out.rewind().unwrap();
        let mut data = Vec::new();
        out.read_to_end(&mut data).unwrap();
        Ok(data)
    }

    fn release(fs: &BoundedFs, node: u64, handle: u64) {
        fs.release(&Context::default(), node, 0, handle, false, false, None).unwrap();
    }

    fn lookup(fs: &BoundedFs, parent: u64, file: &str) -> io::Result<u64> {
        fs.lookup(&Context::default(), parent, &name(file)).map(|e| e.inode)
    }

    fn size(fs: &BoundedFs, node: u64) -> io::Result<i64> {
        fs.getattr(&Context::default(), node, None).map(|(st, _)| st.st_size)
    }

    /// Thousands of files and directories made, written, moved, read back
    /// and removed, every lookup held as a guest keeping its inodes does,
    /// with a few cached directories and open files at any time.
    #[test]
    fn a_writable_share_serves_thousands_of_files_with_a_few_descriptors() {
        const DIRS: usize = 40;
        const FILES: usize = 60;
        let dir = tempfile::tempdir().unwrap();
        let fs = writable(dir.path());
        let ctx = Context::default();
        let (mut dirs, mut files, mut most) = (Vec::new(), Vec::new(), 0);
        for d in 0..DIRS {
            let sub = fs.mkdir(&ctx, ROOT, &name(&format!("d{d}")), libc::S_IFDIR | 0o755, 0).unwrap().inode;
            let deeper = fs.mkdir(&ctx, sub, &name("e"), libc::S_IFDIR | 0o755, 0).unwrap().inode;
            dirs.push((sub, deeper));
            for f in 0..FILES {
                let (node, handle) = create(&fs, deeper, &format!("f{f}"));
                write(&fs, node, handle, 0, format!("{d}/{f}").as_bytes());
                release(&fs, node, handle);
                files.push((node, d, f));
                most = most.max(held(&fs));
            }
        }
        // Every file moves to the next directory under a new name, and
        // every directory is renamed: the guest's nodes follow.
        for &(node, d, f) in &files {
            let (_, from) = dirs[d];
            let (_, to) = dirs[(d + 1) % DIRS];
            fs.rename(&ctx, from, &name(&format!("f{f}")), to, &name(&format!("moved{d}-{f}")), 0).unwrap();
            assert_eq!(read(&fs, node).unwrap(), format!("{d}/{f}").as_bytes(), "read after its move");
            most = most.max(held(&fs));
        }
        for (d, &(sub, _)) in dirs.iter().enumerate() {
            fs.rename(&ctx, ROOT, &name(&format!("d{d}")), ROOT, &name(&format!("r{d}")), 0).unwrap();
            assert_eq!(lookup(&fs, ROOT, &format!("r{d}")).unwrap(), sub);
        }
        for &(node, d, f) in &files {
            let (handle, _, _) = fs.open(&ctx, node, libc::O_WRONLY.cast_unsigned(), 0).unwrap();
            write(&fs, node, handle.unwrap(), 0, b"!");
            release(&fs, node, handle.unwrap());
            let want = format!("!{}", &format!("{d}/{f}")[1..]);
            assert_eq!(read(&fs, node).unwrap(), want.as_bytes());
            let host = dir.path().join(format!("r{}/e/moved{d}-{f}", (d + 1) % DIRS));
            assert_eq!(std::fs::read(host).unwrap(), want.as_bytes(), "the host has it where the guest put it");
            most = most.max(held(&fs));
        }
        for &(node, d, f) in &files {
            let (_, to) = dirs[(d + 1) % DIRS];
            fs.unlink(&ctx, to, &name(&format!("moved{d}-{f}"))).unwrap();
            assert_eq!(errno(fs.getattr(&ctx, node, None)), Some(libc::ESTALE), "a removed file is found no more");
            fs.forget(&ctx, node, 1);
        }
        for (d, &(sub, deeper)) in dirs.iter().enumerate() {
            fs.rmdir(&ctx, sub, &name("e")).unwrap();
            fs.rmdir(&ctx, ROOT, &name(&format!("r{d}"))).unwrap();
            fs.forget(&ctx, deeper, 1);
            // Made, then looked up by its new name.
            fs.forget(&ctx, sub, 2);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(most <= CACHED + super::super::READERS + HANDLES, "{most} descriptors held at most");
        assert_eq!(fs.shared().nodes.len(), 1, "only the root is left");
    }

    /// Renames, links, exchanges and unlinks by the guest, with every
    /// directory descriptor evicted between steps: what the guest sees
    /// afterwards is where it put things, never ESTALE.
    #[test]
    fn the_guests_own_renames_links_and_unlinks_are_seen_afterwards() {
        let dir = tempfile::tempdir().unwrap();
        let fs = BoundedFs::new(dir.path(), &Secrets::default(), 1, &HandleCount::default(), 4, Duration::ZERO)
            .unwrap()
            .writable();
        let ctx = Context::default();
        let a = fs.mkdir(&ctx, ROOT, &name("a"), 0o755, 0).unwrap().inode;
        let b = fs.mkdir(&ctx, a, &name("b"), 0o755, 0).unwrap().inode;
        let other = fs.mkdir(&ctx, ROOT, &name("other"), 0o755, 0).unwrap().inode;
        let (f, fh) = create(&fs, b, "f");
        write(&fs, f, fh, 0, b"one");

        // A directory moved: what is beneath it is found through its new name,
        // and a write through a handle opened before lands in the moved file.
        fs.rename(&ctx, ROOT, &name("a"), other, &name("c"), 0).unwrap();
        lookup(&fs, other, "x").unwrap_err();
        write(&fs, f, fh, 3, b" two");
        release(&fs, f, fh);
        assert_eq!(read(&fs, f).unwrap(), b"one two");
        assert_eq!(size(&fs, f).unwrap(), 7, "attributes after the write");
        assert_eq!(std::fs::read(dir.path().join("other/c/b/f")).unwrap(), b"one two");
        assert_eq!(lookup(&fs, b, "f").unwrap(), f);

        // A link, then the first name removed: the file stays by its link.
        let linked = fs.link(&ctx, f, ROOT, &name("g")).unwrap();
        assert_eq!((linked.inode, linked.attr.st_nlink), (f, 2));
        fs.unlink(&ctx, b, &name("f")).unwrap();
        assert_eq!(read(&fs, f).unwrap(), b"one two");
        assert_eq!(size(&fs, f).unwrap(), 7);

        // Renamed over another file: the file replaced is gone, the moved one serves.
        let (h, hh) = create(&fs, other, "h");
        write(&fs, h, hh, 0, b"replaced");
        fs.rename(&ctx, ROOT, &name("g"), other, &name("h"), 0).unwrap();
        assert_eq!(read(&fs, f).unwrap(), b"one two");
        assert_eq!(lookup(&fs, other, "h").unwrap(), f);
        // The replaced file, still open, is served through its handle.
        write(&fs, h, hh, 0, b"R");
        assert_eq!(fs.getattr(&ctx, h, None).unwrap().0.st_size, 8);
        release(&fs, h, hh);
        assert_eq!(errno(fs.getattr(&ctx, h, None)), Some(libc::ESTALE));

        // Exchanged with a directory, and a refused overwrite changes nothing.
        fs.rename(&ctx, other, &name("h"), other, &name("c"), libc::RENAME_EXCHANGE).unwrap();
        assert_eq!(lookup(&fs, other, "c").unwrap(), f);
        assert_eq!(lookup(&fs, other, "h").unwrap(), a);
        assert_eq!(lookup(&fs, a, "b").unwrap(), b, "beneath the exchanged directory");
        assert_eq!(read(&fs, f).unwrap(), b"one two");
        let refused = fs.rename(&ctx, other, &name("c"), other, &name("h"), libc::RENAME_NOREPLACE);
        assert_eq!(errno(refused), Some(libc::EEXIST));
        assert_eq!(lookup(&fs, other, "c").unwrap(), f);

        // Attributes changed by name, after all the moves.
        let mut attr = fs.getattr(&ctx, f, None).unwrap().0;
        attr.st_mode = libc::S_IFREG | 0o600;
        attr.st_size = 3;
        attr.st_mtime = 1_000_000;
        attr.st_mtime_nsec = 0;
        let valid = SetattrValid::MODE | SetattrValid::SIZE | SetattrValid::MTIME;
        let (after, _) = fs.setattr(&ctx, f, attr, None, valid).unwrap();
        assert_eq!((after.st_mode & 0o7777, after.st_size, after.st_mtime), (0o600, 3, 1_000_000));
        let host = std::fs::metadata(dir.path().join("other/c")).unwrap();
        assert_eq!((host.len(), std::os::unix::fs::MetadataExt::mtime(&host)), (3, 1_000_000));

        // A symlink is made as it is, never followed by a change.
        let link = fs.symlink(&ctx, &name("/etc/passwd"), other, &name("l")).unwrap().inode;
        let mut attr = fs.getattr(&ctx, link, None).unwrap().0;
        attr.st_mode = 0o777;
        assert_eq!(errno(fs.setattr(&ctx, link, attr, None, SetattrValid::MODE)), Some(libc::EOPNOTSUPP));
        assert_eq!(fs.readlink(&ctx, link).unwrap(), b"/etc/passwd");
        assert!(errno(fs.open(&ctx, link, libc::O_WRONLY.cast_unsigned(), 0)).is_some());
    }

    /// Modes, owners and times change through a descriptor of the node
    /// opened for the purpose (the writable worker may not name a file to
    /// change them), on files and directories, the root among them, and
    /// the descriptor is closed again. A symlink's are not changed (but
    /// for the owner it has), nor a secret's, which is not opened (EACCES).
    #[test]
    fn modes_owners_and_times_change_through_a_descriptor_of_the_node() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), b"key").unwrap();
        let secrets = Secrets::at(&[dir.path().join("secret")]);
        let fs = BoundedFs::new(dir.path(), &secrets, CACHED, &HandleCount::default(), HANDLES, Duration::ZERO)
            .unwrap()
            .writable();
        let ctx = Context::default();
        let d = fs.mkdir(&ctx, ROOT, &name("d"), 0o755, 0).unwrap().inode;
        let (f, fh) = create(&fs, d, "f");
        release(&fs, f, fh);
        let held_before = held(&fs);
        let host = |p: &str| std::fs::symlink_metadata(dir.path().join(p)).unwrap();
        let (uid, gid) = (host("d/f").uid(), host("d/f").gid());
        for (node, path) in [(f, "d/f"), (d, "d"), (ROOT, "")] {
            let mut attr = fs.getattr(&ctx, node, None).unwrap().0;
            attr.st_mode = 0o700;
            (attr.st_uid, attr.st_gid) = (uid, gid);
            (attr.st_atime, attr.st_atime_nsec, attr.st_mtime, attr.st_mtime_nsec) = (1, 2, 1_000_000, 3);
            let valid =
                SetattrValid::MODE | SetattrValid::UID | SetattrValid::GID | SetattrValid::ATIME | SetattrValid::MTIME;
            let (after, _) = fs.setattr(&ctx, node, attr, None, valid).unwrap();
            assert_eq!(
                (after.st_mode & 0o7777, after.st_mtime, after.st_mtime_nsec),
                (0o700, 1_000_000, 3),
                "{path:?}"
            );
            let meta = host(path);
            assert_eq!(meta.permissions().mode() & 0o7777, 0o700, "{path:?}");
            assert_eq!((meta.atime(), meta.atime_nsec(), meta.mtime(), meta.mtime_nsec()), (1, 2, 1_000_000, 3));
            assert_eq!((meta.uid(), meta.gid()), (uid, gid));
        }
        // The file's owner has no read right now: its times are still
        // set (the descriptor is opened before the mode changes).
        let mut attr = fs.getattr(&ctx, f, None).unwrap().0;
        (attr.st_mode, attr.st_mtime, attr.st_mtime_nsec) = (0o200, 7, 0);
        fs.setattr(&ctx, f, attr, None, SetattrValid::MODE | SetattrValid::MTIME).unwrap();
        assert_eq!((host("d/f").permissions().mode() & 0o7777, host("d/f").mtime()), (0o200, 7));
        assert_eq!(held(&fs), held_before, "no descriptor kept");

        // A symlink's mode and times are refused, its owner taken as it is.
        let link = fs.symlink(&ctx, &name("f"), d, &name("l")).unwrap().inode;
        let link_mtime = host("d/l").mtime();
        let mut attr = fs.getattr(&ctx, link, None).unwrap().0;
        attr.st_mtime = 5;
        let refused = [
            (SetattrValid::MODE, libc::EOPNOTSUPP),
            (SetattrValid::MTIME, libc::ENOSYS),
            (SetattrValid::ATIME | SetattrValid::ATIME_NOW, libc::ENOSYS),
            (SetattrValid::UID | SetattrValid::MTIME, libc::ENOSYS),
        ];
        for (valid, errno_wanted) in refused {
            assert_eq!(errno(fs.setattr(&ctx, link, attr, None, valid)), Some(errno_wanted), "{valid:?}");
        }
        fs.setattr(&ctx, link, attr, None, SetattrValid::UID | SetattrValid::GID).unwrap();
        attr.st_uid = attr.st_uid.wrapping_add(1);
        assert_eq!(errno(fs.setattr(&ctx, link, attr, None, SetattrValid::UID)), Some(libc::EOPNOTSUPP));
        assert_eq!(host("d/l").mtime(), link_mtime);

        let secret = lookup(&fs, ROOT, "secret").unwrap();
        let before = host("secret");
        let mut attr = fs.getattr(&ctx, secret, None).unwrap().0;
        (attr.st_mode, attr.st_mtime) = (0o666, 5);
        for valid in [SetattrValid::MODE, SetattrValid::MTIME] {
            assert_eq!(errno(fs.setattr(&ctx, secret, attr, None, valid)), Some(libc::EACCES), "{valid:?}");
        }
        let after = host("secret");
        assert_eq!((after.mode(), after.mtime()), (before.mode(), before.mtime()));
    }

    /// What the host replaced under the guest is ESTALE for every change,
    /// and the host's new file or directory is left as it is.
    #[test]
    fn a_name_the_host_replaced_is_stale_and_never_changed() {
        let dir = tempfile::tempdir().unwrap();
        let fs = writable(dir.path());
        let ctx = Context::default();
        let d = fs.mkdir(&ctx, ROOT, &name("d"), 0o755, 0).unwrap().inode;
        let (f, fh) = create(&fs, d, "f");
        release(&fs, f, fh);

        std::fs::write(dir.path().join("d/new"), b"host's").unwrap();
        std::fs::rename(dir.path().join("d/new"), dir.path().join("d/f")).unwrap();
        assert_eq!(errno(fs.open(&ctx, f, (libc::O_WRONLY | libc::O_TRUNC).cast_unsigned(), 0)), Some(libc::ESTALE));
        let mut attr = fs.getattr(&ctx, d, None).unwrap().0;
        attr.st_size = 0;
        attr.st_mode = libc::S_IFREG | 0o600;
        for valid in [SetattrValid::SIZE, SetattrValid::MODE, SetattrValid::MTIME] {
            assert_eq!(errno(fs.setattr(&ctx, f, attr, None, valid)), Some(libc::ESTALE), "{valid:?}");
        }
        assert_eq!(errno(fs.link(&ctx, f, ROOT, &name("l"))), Some(libc::ESTALE));
        assert_eq!(std::fs::read(dir.path().join("d/f")).unwrap(), b"host's");
        assert!(std::fs::symlink_metadata(dir.path().join("l")).is_err());

        // The directory moved away by the host and another put in its place:
        // nothing is made or removed in either.
        std::fs::rename(dir.path().join("d"), dir.path().join("moved")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/keep"), b"").unwrap();
        locked(&fs.shared().cache).clear();
        assert_eq!(errno(fs.mkdir(&ctx, d, &name("x"), 0o755, 0)), Some(libc::ESTALE));
        assert_eq!(errno(fs.unlink(&ctx, d, &name("keep"))), Some(libc::ESTALE));
        assert_eq!(errno(fs.rename(&ctx, d, &name("keep"), ROOT, &name("k"), 0)), Some(libc::ESTALE));
        let args = CreateIn { flags: libc::O_WRONLY.cast_unsigned(), mode: 0o644, umask: 0, fuse_flags: 0 };
        assert_eq!(errno(fs.create(&ctx, d, &name("y"), args)), Some(libc::ESTALE));
        let names = |p: &str| {
            let mut names: Vec<_> =
                std::fs::read_dir(dir.path().join(p)).unwrap().map(|e| e.unwrap().file_name()).collect();
            names.sort();
            names
        };
        assert_eq!(names("d"), ["keep"]);
        assert_eq!(names("moved"), ["f"]);
        assert_eq!(held(&fs), locked(&fs.shared().cache).fds.len(), "no handle left open by the refusals");
    }

    /// Files opened for writing count against the cap like the others,
    /// and names outside one component are refused.
    #[test]
    fn write_opens_are_capped_and_names_stay_in_their_directory() {
        let dir = tempfile::tempdir().unwrap();
        let fs = writable(dir.path());
        let ctx = Context::default();
        let mut open = Vec::new();
        for i in 0..HANDLES {
            open.push(create(&fs, ROOT, &format!("f{i}")));
        }
        let args = CreateIn { flags: libc::O_WRONLY.cast_unsigned(), mode: 0o644, umask: 0, fuse_flags: 0 };
        assert_eq!(errno(fs.create(&ctx, ROOT, &name("over"), args)), Some(libc::ENFILE));
        assert!(std::fs::symlink_metadata(dir.path().join("over")).is_err(), "refused before it is made");
        assert_eq!(errno(fs.open(&ctx, open[0].0, libc::O_WRONLY.cast_unsigned(), 0)), Some(libc::ENFILE));
        let (node, handle) = open.pop().unwrap();
        release(&fs, node, handle);
        let (handle, _, _) = fs.open(&ctx, open[0].0, libc::O_WRONLY.cast_unsigned(), 0).unwrap();
        release(&fs, open[0].0, handle.unwrap());

        for bad in ["..", ".", "a/b", "../escape", ""] {
            assert_eq!(errno(fs.mkdir(&ctx, ROOT, &name(bad), 0o755, 0)), Some(libc::EINVAL), "{bad:?}");
            assert_eq!(errno(fs.unlink(&ctx, ROOT, &name(bad))), Some(libc::EINVAL), "{bad:?}");
        }
        // A handle names its own node only.
        assert_eq!(errno(fs.fsync(&ctx, open[1].0, false, open[0].1)), Some(libc::EBADF));
    }

    /// The read-only mode refuses every change.
    #[test]
    fn a_read_only_share_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let fs =
            BoundedFs::new(dir.path(), &Secrets::default(), 2, &HandleCount::default(), 4, Duration::ZERO).unwrap();
        let ctx = Context::default();
        let f = lookup(&fs, ROOT, "f").unwrap();
        assert_eq!(errno(fs.mkdir(&ctx, ROOT, &name("d"), 0o755, 0)), Some(libc::EROFS));
        assert_eq!(errno(fs.unlink(&ctx, ROOT, &name("f"))), Some(libc::EROFS));
        assert_eq!(errno(fs.rename(&ctx, ROOT, &name("f"), ROOT, &name("g"), 0)), Some(libc::EROFS));
        let attr = fs.getattr(&ctx, f, None).unwrap().0;
        assert_eq!(errno(fs.setattr(&ctx, f, attr, None, SetattrValid::SIZE)), Some(libc::EROFS));
        let (handle, _, _) = fs.open(&ctx, f, libc::O_RDWR.cast_unsigned(), 0).unwrap();
        let mut from = tempfile::tempfile().unwrap();
        let wrote = fs.write(&ctx, f, handle.unwrap(), &mut from, 1, 0, None, false, 0, 0);
        assert_eq!(errno(wrote), Some(libc::EROFS));
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"x");
    }
}
