//! The guest's first root: a fixed, read-only tree of four nodes that the
//! kernel mounts itself (`root=<BOOT_TAG> rootfstype=virtiofs`).
//!
//! ```text
//! /          directory
//! /init      the stockade binary, pinned by a descriptor opened before the jail
//! /dev       empty: the kernel mounts devtmpfs here
//! /newroot   empty: the init mounts its writable root here
//! ```
//!
//! The kernel pages the init in from here as it runs, so no boot unpacks
//! the whole binary into guest memory (a boot that records a template pages
//! in the init's mapped code, once, for every run resumed from it). Every
//! node, handle and reply is fixed (node ids are constants, nothing is
//! counted), so the server keeps no state a guest could grow or that a saved
//! VM would have to carry.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{FsOptions, OpenOptions, stat64, statvfs64};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, FileSystem, ZeroCopyWriter};

use crate::protocol::shares::{BOOT_DEV, BOOT_INIT, BOOT_NEW_ROOT};

/// How long the guest may cache names and attributes: the tree never
/// changes while the VM runs.
const TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The FUSE root node id.
const ROOT: u64 = 1;

/// One node of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Root,
    Init,
    Dev,
    NewRoot,
}

impl Node {
    const CHILDREN: [Node; 3] = [Node::Init, Node::Dev, Node::NewRoot];

    fn id(self) -> u64 {
        match self {
            Node::Root => ROOT,
            Node::Init => 2,
            Node::Dev => 3,
            Node::NewRoot => 4,
        }
    }

    fn from_id(id: u64) -> io::Result<Node> {
        [Node::Root, Node::Init, Node::Dev, Node::NewRoot]
            .into_iter()
            .find(|n| n.id() == id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// Its name in the root directory.
    fn name(self) -> &'static [u8] {
        let path = match self {
            Node::Root => "/",
            Node::Init => BOOT_INIT,
            Node::Dev => BOOT_DEV,
            Node::NewRoot => BOOT_NEW_ROOT,
        };
        path.trim_start_matches('/').as_bytes()
    }

    fn is_dir(self) -> bool {
        self != Node::Init
    }
}

/// The boot tree, serving `init` from an open descriptor.
pub struct BootFs {
    /// The init, pinned by an `O_PATH` descriptor opened before the jail
    /// closed. Every thread that shares the process's descriptor table
    /// holds it, the writable shares' worker among them, whose filter
    /// allows fchmod, fchown and futimens: on an `O_PATH` descriptor they
    /// fail (EBADF), where a descriptor open for reading would let code
    /// in that worker make the host's stockade binary setuid or writable.
    pinned: File,
    /// The init open for reading, reopened from `pinned` by the thread
    /// serving the device at its first read, into that thread's own
    /// descriptor table (a read-only worker's, see `jail::thread`), out
    /// of the other threads' reach. The jail lets it read the init
    /// (`vmm::jail_rules`).
    init: Mutex<Option<File>>,
    init_size: u64,
    mtime: i64,
}

impl BootFs {
    /// Pins `init` now, while the VMM may still open files.
    pub fn new(init: &Path) -> io::Result<BootFs> {
        use std::os::unix::fs::OpenOptionsExt;
        let pinned = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(init)?;
        let meta = pinned.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other(format!("{} is not a file", init.display())));
        }
        Ok(BootFs { pinned, init: Mutex::new(None), init_size: meta.len(), mtime: meta.mtime() })
    }

    /// The init open for reading in the calling thread's descriptor table:
    /// the file `pinned` holds, whatever has since taken its path.
    fn reopen(&self) -> io::Result<File> {
        use std::os::fd::AsRawFd;
        File::open(format!("/proc/thread-self/fd/{}", self.pinned.as_raw_fd()))
    }

    fn attr(&self, node: Node) -> stat64 {
        // SAFETY: stat64 is plain old data; all zeroes is a valid value.
        let mut st: stat64 = unsafe { std::mem::zeroed() };
        st.st_ino = node.id();
        if node.is_dir() {
            st.st_mode = libc::S_IFDIR | 0o755;
            st.st_nlink = 2;
        } else {
            st.st_mode = libc::S_IFREG | 0o555;
            st.st_nlink = 1;
            st.st_size = i64::try_from(self.init_size).unwrap_or(i64::MAX);
            st.st_blocks = i64::try_from(self.init_size.div_ceil(512)).unwrap_or(i64::MAX);
        }
        st.st_blksize = 4096;
        st.st_mtime = self.mtime;
        st.st_ctime = self.mtime;
        st.st_atime = self.mtime;
        st
    }

    fn entry(&self, node: Node) -> Entry {
        Entry {
            inode: node.id(),
            generation: 0,
            attr: self.attr(node),
            attr_flags: 0,
            attr_timeout: TIMEOUT,
            entry_timeout: TIMEOUT,
        }
    }

    fn dir_entry(node: Node, offset: u64) -> DirEntry<'static> {
        let type_ = if node.is_dir() { libc::DT_DIR } else { libc::DT_REG };
        DirEntry { ino: node.id(), offset, type_: u32::from(type_), name: node.name() }
    }
}

fn error(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl FileSystem for BootFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        Ok(capable & (FsOptions::ASYNC_READ | FsOptions::MAX_PAGES | FsOptions::PARALLEL_DIROPS))
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        if Node::from_id(parent)? != Node::Root {
            return Err(error(libc::ENOTDIR));
        }
        Node::CHILDREN
            .into_iter()
            .find(|n| n.name() == name.to_bytes())
            .map(|n| self.entry(n))
            .ok_or_else(|| error(libc::ENOENT))
    }

    fn getattr(&self, _ctx: &Context, inode: u64, _handle: Option<u64>) -> io::Result<(stat64, Duration)> {
        Ok((self.attr(Node::from_id(inode)?), TIMEOUT))
    }

    fn open(
        &self,
        _ctx: &Context,
        inode: u64,
        flags: u32,
        _fuse: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        let node = Node::from_id(inode)?;
        if node.is_dir() {
            return Err(error(libc::EISDIR));
        }
        let access = i32::try_from(flags).unwrap_or(libc::O_RDWR) & libc::O_ACCMODE;
        if access != libc::O_RDONLY {
            return Err(error(libc::EROFS));
        }
        Ok((Some(inode), OpenOptions::KEEP_CACHE, None))
    }

    fn read(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        if Node::from_id(inode)? != Node::Init {
            return Err(error(libc::EISDIR));
        }
        if offset >= self.init_size {
            return Ok(0);
        }
        let count = usize::try_from(u64::from(size).min(self.init_size - offset)).unwrap_or(0);
        let mut init = self.init.lock().unwrap_or_else(|p| p.into_inner());
        let file = match &mut *init {
            Some(file) => file,
            empty => empty.insert(self.reopen()?),
        };
        w.write_from(file, count, offset)
    }

    fn release(
        &self,
        _ctx: &Context,
        _inode: u64,
        _flags: u32,
        _handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        Ok(())
    }

    fn opendir(&self, _ctx: &Context, inode: u64, _flags: u32) -> io::Result<(Option<u64>, OpenOptions)> {
        if !Node::from_id(inode)?.is_dir() {
            return Err(error(libc::ENOTDIR));
        }
        Ok((Some(inode), OpenOptions::KEEP_CACHE))
    }

    fn readdir(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: u64,
        _size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let node = Node::from_id(inode)?;
        if !node.is_dir() {
            return Err(error(libc::ENOTDIR));
        }
        // Only the root has entries; "." and ".." the kernel adds itself.
        let children: &[Node] = if node == Node::Root { &Node::CHILDREN } else { &[] };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (index, child) in children.iter().enumerate().skip(start) {
            let next = u64::try_from(index + 1).unwrap_or(u64::MAX);
            if add_entry(Self::dir_entry(*child, next))? == 0 {
                break;
            }
        }
        Ok(())
    }

    fn releasedir(&self, _ctx: &Context, _inode: u64, _flags: u32, _handle: u64) -> io::Result<()> {
        Ok(())
    }

    fn statfs(&self, _ctx: &Context, _inode: u64) -> io::Result<statvfs64> {
        // SAFETY: statvfs64 is plain old data; all zeroes is a valid value.
        let mut st: statvfs64 = unsafe { std::mem::zeroed() };
        st.f_bsize = 4096;
        st.f_frsize = 4096;
        st.f_namemax = 255;
        st.f_files = 4;
        Ok(st)
    }

    fn access(&self, _ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        Node::from_id(inode)?;
        if mask & u32::try_from(libc::W_OK).unwrap_or(0) != 0 {
            return Err(error(libc::EROFS));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot() -> (tempfile::TempDir, BootFs) {
        let dir = tempfile::tempdir().unwrap();
        let init = dir.path().join("init");
        std::fs::write(&init, b"\x7fELF and the rest").unwrap();
        let fs = BootFs::new(&init).unwrap();
        (dir, fs)
    }

    #[test]
    fn the_root_holds_init_dev_and_newroot() {
        let (_dir, fs) = boot();
        let ctx = Context::default();
        let init = fs.lookup(&ctx, ROOT, c"init").unwrap();
        assert_eq!(init.attr.st_mode, libc::S_IFREG | 0o555);
        assert_eq!(init.attr.st_size, 17);
        assert_eq!(fs.lookup(&ctx, ROOT, c"dev").unwrap().attr.st_mode & libc::S_IFMT, libc::S_IFDIR);
        assert_eq!(fs.lookup(&ctx, ROOT, c"newroot").unwrap().attr.st_mode & libc::S_IFMT, libc::S_IFDIR);
        assert_eq!(fs.lookup(&ctx, ROOT, c"etc").unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert_eq!(fs.lookup(&ctx, init.inode, c"x").unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
        assert_eq!(fs.getattr(&ctx, 99, None).unwrap_err().raw_os_error(), Some(libc::ENOENT));

        let mut names = Vec::new();
        fs.readdir(&ctx, ROOT, ROOT, 4096, 0, &mut |e| {
            names.push(String::from_utf8(e.name.to_vec()).unwrap());
            Ok(1)
        })
        .unwrap();
        assert_eq!(names, ["init", "dev", "newroot"]);
        names.clear();
        fs.readdir(&ctx, ROOT, ROOT, 4096, 2, &mut |e| {
            names.push(String::from_utf8(e.name.to_vec()).unwrap());
            Ok(1)
        })
        .unwrap();
        assert_eq!(names, ["newroot"], "a listing goes on from its offset");
    }

    /// The descriptor every thread of the VMM shares pins the init without
    /// opening it: through it, no thread changes the host's file.
    #[test]
    fn the_shared_descriptor_changes_nothing() {
        use std::os::fd::AsRawFd;
        let (_dir, fs) = boot();
        let fd = fs.pinned.as_raw_fd();
        // SAFETY: fchmod and fchown take no pointers; futimens reads no
        // times when given none.
        let changes =
            unsafe { [libc::fchmod(fd, 0o4777), libc::fchown(fd, 0, 0), libc::futimens(fd, std::ptr::null())] };
        for (call, ret) in ["fchmod", "fchown", "futimens"].into_iter().zip(changes) {
            assert_eq!(ret, -1, "{call}");
        }
        assert!(fs.init.lock().unwrap().is_none(), "opened for reading only at the first read");
    }

    #[test]
    fn nothing_opens_for_writing() {
        let (_dir, fs) = boot();
        let ctx = Context::default();
        let init = Node::Init.id();
        let flags = |f: i32| u32::try_from(f).unwrap();
        assert!(fs.open(&ctx, init, flags(libc::O_RDONLY), 0).is_ok());
        for f in [libc::O_WRONLY, libc::O_RDWR, libc::O_WRONLY | libc::O_TRUNC] {
            assert_eq!(fs.open(&ctx, init, flags(f), 0).unwrap_err().raw_os_error(), Some(libc::EROFS));
        }
        assert_eq!(fs.open(&ctx, ROOT, 0, 0).unwrap_err().raw_os_error(), Some(libc::EISDIR));
        assert_eq!(
            fs.access(&ctx, init, u32::try_from(libc::W_OK).unwrap()).unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
    }
}
