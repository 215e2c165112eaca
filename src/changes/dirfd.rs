//! Filesystem operations relative to directory descriptors that never follow
//! a symlink: the only way apply and the host-side checks touch a workspace.
//!
//! Directories are resolved from the workspace's descriptor with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), or, on
//! kernels without it, one `openat(O_NOFOLLOW | O_DIRECTORY)` per component.
//! Everything after that is `*at` on the resolved descriptor with the final
//! name, so a symlink swapped in later is replaced or refused, never
//! followed; a directory moved away keeps receiving what was meant for it.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2, renameat};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode as NixMode, fchmod, fchmodat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use crate::protocol::change_set::path::RelPath;

/// How many times a resolution is retried when the kernel reports a
/// concurrent rename (`EAGAIN` from `openat2`).
const RESOLVE_RETRIES: usize = 8;

/// What kind of thing a `FileStat` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Special,
}

impl FileType {
    pub fn of(stat: &FileStat) -> FileType {
        FileType::of_mode(stat.st_mode)
    }

    /// The type an `st_mode` names.
    pub fn of_mode(mode: u32) -> FileType {
        match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::File,
            libc::S_IFDIR => FileType::Dir,
            libc::S_IFLNK => FileType::Symlink,
            _ => FileType::Special,
        }
    }
}

/// Why a directory below the workspace could not be resolved.
#[derive(Debug)]
pub enum ResolveError {
    /// This component is a symlink on the host.
    Symlink(RelPath),
    /// This component exists but is not a directory.
    NotDir(RelPath),
    /// This component does not exist.
    Missing(RelPath),
    Io(io::Error),
}

/// A resolved directory: the workspace itself or one below it.
pub enum DirFd<'a> {
    Root(BorrowedFd<'a>),
    Owned(OwnedFd),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Root(fd) => fd.as_fd(),
            DirFd::Owned(fd) => fd.as_fd(),
        }
    }
}

/// The workspace, held open.
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
    openat2: bool,
}

impl Root {
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, NixMode::empty())?;
        let mut root = Root { fd, path: path.to_path_buf(), openat2: true };
        #[cfg(test)]
        if tests::NO_OPENAT2.with(|no| no.get()) {
            root.openat2 = false;
            return Ok(root);
        }
        root.openat2 = match root.open_beneath(Path::new(".")) {
            Err(Errno::ENOSYS) => {
                tracing::debug!("openat2 is unavailable; resolving workspace paths one component at a time");
                false
            }
            _ => true,
        };
        Ok(root)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The directory holding `path`.
    pub fn parent_of(&self, path: &RelPath) -> Result<DirFd<'_>, ResolveError> {
        match path.parent() {
            None => Ok(DirFd::Root(self.fd.as_fd())),
            Some(parent) => self.dir(&parent).map(DirFd::Owned),
        }
    }

    /// Opens the directory `path` below the workspace without following any symlink.
    pub fn dir(&self, path: &RelPath) -> Result<OwnedFd, ResolveError> {
        #[cfg(test)]
        work::add(|w| w.resolves += 1);
        let result = if self.openat2 { self.open_beneath(path.as_path()) } else { self.walk(path) };
        result.map_err(|errno| self.diagnose(path, errno))
    }

    fn open_beneath(&self, path: &Path) -> Result<OwnedFd, Errno> {
        let how =
            OpenHow::new().flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).resolve(
                ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
        let mut tries = 0;
        loop {
            match openat2(self.fd.as_fd(), path, how) {
                Err(Errno::EAGAIN) if tries < RESOLVE_RETRIES => tries += 1,
                other => return other,
            }
        }
    }

    fn walk(&self, path: &RelPath) -> Result<OwnedFd, Errno> {
        let mut current: Option<OwnedFd> = None;
        for name in path.components() {
            let at = current.as_ref().map_or(self.fd.as_fd(), |fd| fd.as_fd());
            let next = openat(
                at,
                OsStr::from_bytes(name),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                NixMode::empty(),
            )?;
            current = Some(next);
        }
        current.ok_or(Errno::ENOENT)
    }

    /// Names the component that made resolution fail, for the message.
    fn diagnose(&self, path: &RelPath, errno: Errno) -> ResolveError {
        if !matches!(errno, Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT | Errno::EXDEV) {
            return ResolveError::Io(errno.into());
        }
        let mut prefix: Option<RelPath> = None;
        for name in path.components() {
            let Ok(here) = RelPath::child(prefix.as_ref(), name) else { break };
            match fstatat(self.fd.as_fd(), here.as_path(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(Errno::ENOENT) => return ResolveError::Missing(here),
                Err(e) => return ResolveError::Io(e.into()),
                Ok(st) => match FileType::of(&st) {
                    FileType::Dir => {}
                    FileType::Symlink => return ResolveError::Symlink(here),
                    _ => return ResolveError::NotDir(here),
                },
            }
            prefix = Some(here);
        }
        // Every component is a directory now: it changed under us.
        ResolveError::Io(errno.into())
    }
}

fn name(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

/// `lstat` of `name` in `dir`; `None` when absent.
pub fn stat_at(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<Option<FileStat>> {
    #[cfg(test)]
    work::add(|w| w.stats += 1);
    match fstatat(dir.as_fd(), name(name_bytes), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens the regular file `name` for reading without following a symlink.
pub fn open_file(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<File> {
    let fd = openat(
        dir.as_fd(),
        name(name_bytes),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        NixMode::empty(),
    )?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Opens the directory `name` in `dir` for listing, never through a symlink.
pub fn open_dir(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<Dir> {
    let fd = openat(
        dir.as_fd(),
        name(name_bytes),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        NixMode::empty(),
    )?;
    Ok(Dir::from_fd(fd)?)
}

/// The names in a directory, without `.` and `..`, sorted by bytes.
pub fn list(dir: &mut Dir) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    names.sort_unstable();
    #[cfg(test)]
    work::add(|w| w.listed += names.len() as u64);
    Ok(names)
}

pub fn read_link(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<Vec<u8>> {
    Ok(nix::fcntl::readlinkat(dir.as_fd(), name(name_bytes))?.as_bytes().to_vec())
}

/// Creates `name` exclusively (0600), never through a symlink.
pub fn create_exclusive(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<File> {
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir.as_fd(), name(name_bytes), flags, NixMode::from_bits_truncate(0o600))?;
    Ok(File::from(fd))
}

pub fn set_file_mode(file: &File, mode: u32) -> io::Result<()> {
    Ok(fchmod(file.as_fd(), NixMode::from_bits_truncate(mode))?)
}

pub fn rename(dir: &impl AsFd, from: &[u8], to: &[u8]) -> io::Result<()> {
    Ok(renameat(dir.as_fd(), name(from), dir.as_fd(), name(to))?)
}

pub fn symlink(target: &[u8], dir: &impl AsFd, link: &[u8]) -> io::Result<()> {
    Ok(symlinkat(name(target), dir.as_fd(), name(link))?)
}

pub fn mkdir(dir: &impl AsFd, name_bytes: &[u8], mode: u32) -> io::Result<()> {
    Ok(mkdirat(dir.as_fd(), name(name_bytes), NixMode::from_bits_truncate(mode))?)
}

/// Removes a non-directory; absent is fine.
pub fn unlink(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<()> {
    match unlinkat(dir.as_fd(), name(name_bytes), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets permission bits on `name` without following a symlink there.
pub fn chmod(dir: &impl AsFd, name_bytes: &[u8], mode: u32) -> io::Result<()> {
    let bits = NixMode::from_bits_truncate(mode);
    match fchmodat(dir.as_fd(), name(name_bytes), bits, FchmodatFlags::NoFollowSymlink) {
        Ok(()) => Ok(()),
        // Older libc/kernels cannot chmod without following; open the thing
        // itself (O_NOFOLLOW refuses a symlink) and change it by descriptor.
        Err(Errno::EOPNOTSUPP | Errno::ENOSYS) => {
            let fd = openat(
                dir.as_fd(),
                name(name_bytes),
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
                NixMode::empty(),
            )?;
            Ok(fchmod(fd.as_fd(), bits)?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes `name` and, if it is a directory, everything below it. Symlinks
/// are removed, never followed; directories without write permission for us
/// are opened up first, since the whole tree is going.
pub fn remove_tree(dir: &impl AsFd, name_bytes: &[u8]) -> io::Result<()> {
    match unlinkat(dir.as_fd(), name(name_bytes), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR | Errno::EPERM) => {}
        Err(e) => return Err(e.into()),
    }
    let mut sub = match open_dir(dir, name_bytes) {
        Ok(d) => d,
        // Swapped for a non-directory since the unlink: try that once more.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => return unlink(dir, name_bytes),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            chmod(dir, name_bytes, 0o700)?;
            open_dir(dir, name_bytes)?
        }
        Err(e) => return Err(e),
    };
    let _ = fchmod(sub.as_fd(), NixMode::from_bits_truncate(0o700));
    for child in list(&mut sub)? {
        remove_tree(&sub, &child)?;
    }
    drop(sub);
    match unlinkat(dir.as_fd(), name(name_bytes), UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Flushes the filesystem holding `fd` to disk.
pub fn sync_fs(fd: &impl AsFd) -> io::Result<()> {
    Ok(nix::unistd::syncfs(fd.as_fd())?)
}

/// Opens a directory path (for fsync after renames in it).
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// The workspace operations this thread made, counted so that tests can
/// check a review or apply costs what the change set holds, whatever the
/// size of the workspace around it.
#[cfg(test)]
pub(crate) mod work {
    use std::cell::Cell;

    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Work {
        /// Directories resolved from the workspace root (`Root::dir`).
        pub resolves: u64,
        /// `stat_at` calls.
        pub stats: u64,
        /// Names returned by directory listings.
        pub listed: u64,
    }

    thread_local! {
        static COUNTED: Cell<Work> = const { Cell::new(Work { resolves: 0, stats: 0, listed: 0 }) };
    }

    pub(super) fn add(f: impl FnOnce(&mut Work)) {
        COUNTED.with(|c| {
            let mut w = c.get();
            f(&mut w);
            c.set(w);
        });
    }

    /// Runs `f` and returns what it did to workspaces on this thread.
    pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Work) {
        let before = COUNTED.with(Cell::get);
        let result = f();
        let after = COUNTED.with(Cell::get);
        let work = Work {
            resolves: after.resolves - before.resolves,
            stats: after.stats - before.stats,
            listed: after.listed - before.listed,
        };
        (result, work)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;
    use std::os::unix::fs::symlink as make_symlink;

    use super::*;

    thread_local! {
        /// Makes `Root::open` on this thread use the component walk, as on
        /// kernels without openat2.
        pub(crate) static NO_OPENAT2: Cell<bool> = const { Cell::new(false) };
    }

    /// Runs `f` with the openat2 fallback forced on this thread.
    pub(crate) fn without_openat2<T>(f: impl FnOnce() -> T) -> T {
        NO_OPENAT2.with(|no| no.set(true));
        let result = f();
        NO_OPENAT2.with(|no| no.set(false));
        result
    }

    fn p(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    fn roots(path: &Path) -> [Root; 2] {
        [Root::open(path).unwrap(), without_openat2(|| Root::open(path).unwrap())]
    }

    #[test]
    fn resolves_directories_and_names_the_offending_component() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("file"), b"x").unwrap();
        make_symlink(tmp.path(), ws.join("a/link")).unwrap();
        make_symlink("b", ws.join("a/inner")).unwrap();
        for root in roots(&ws) {
            assert!(root.dir(&p("a/b")).is_ok());
            assert!(matches!(root.dir(&p("a/link/x")), Err(ResolveError::Symlink(c)) if c == p("a/link")));
            assert!(matches!(root.dir(&p("a/inner")), Err(ResolveError::Symlink(c)) if c == p("a/inner")));
            assert!(matches!(root.dir(&p("file/x")), Err(ResolveError::NotDir(c)) if c == p("file")));
            assert!(matches!(root.dir(&p("a/nope/x")), Err(ResolveError::Missing(c)) if c == p("a/nope")));
        }
    }

    #[test]
    fn remove_tree_never_follows_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(ws.join("t/sub/deeper")).unwrap();
        std::fs::write(ws.join("t/sub/deeper/f"), b"x").unwrap();
        make_symlink(&outside, ws.join("t/sub/out")).unwrap();
        std::fs::set_permissions(ws.join("t/sub"), std::os::unix::fs::PermissionsExt::from_mode(0o500)).unwrap();
        let root = Root::open(&ws).unwrap();
        remove_tree(&root.fd(), b"t").unwrap();
        assert!(!ws.join("t").exists());
        assert!(outside.join("keep").exists());
    }
}
