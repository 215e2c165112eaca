//! Finding a node again in one `openat2` from the share's root instead of
//! one `fstatat` per directory of its path.
//!
//! `openat2(root, "a/b/c", …, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` has the kernel walk the whole path and fail it
//! if any step leaves the root (or crosses a symlink, magic or not): what
//! it opens is beneath the root, reached through directories alone. With
//! the node's identity checked on what it opened, that is what the step by
//! step walk proves of the node: a directory the host moved out of the
//! share, or a symlink planted in the path, never serves. (Mounts inside a
//! share are crossed, as the walk crosses them.) What it does not prove,
//! and the walk did, is that each directory on the way is still the one
//! the guest found: a directory the host replaced by another of the same
//! name, with the node moved along into it, no longer makes the node
//! stale. The node itself is checked, and the secrets by its identity and
//! its recorded names, as before.
//!
//! The walk stays for what `openat2` cannot do: kernels before 5.6, a
//! seccomp filter of the host's that refuses it (both noticed once and
//! remembered for the process), a jail whose filter does not allow it to
//! the calling worker (see `jail::seccomp::Openat`; calling it there would
//! end the VMM), paths longer than PATH_MAX, and the rare resolution the
//! kernel asks to retry.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once `openat2` proved missing or refused on this host.
static MISSING: AtomicBool = AtomicBool::new(false);

/// The resolution that confines a path to its root, through directories only.
const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// Tries of a resolution the kernel answers EAGAIN (a rename raced it).
const TRIES: usize = 3;

/// What one `openat2` attempt tells the caller to do.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It failed for the path as it is on the host: the answer stands.
    Failed(i32),
    /// `openat2` is not there (or not allowed) on this host: walk, always.
    Missing,
    /// Not for this path (too long, or the kernel would not decide): walk.
    Walk,
    /// A concurrent rename got in the way: try again.
    Retry,
    /// Out of descriptors: give some back and try again.
    Full,
}

/// What an `openat2` error means for the caller.
pub(super) fn outcome(errno: i32) -> Outcome {
    match errno {
        // No such syscall, a seccomp filter's refusal, a struct or flag
        // this kernel does not know: the same for every later call.
        libc::ENOSYS | libc::EPERM | libc::E2BIG | libc::EINVAL => Outcome::Missing,
        // Longer than PATH_MAX; or a path that would leave the root, which
        // our names (single components, never "..") cannot make: the walk
        // judges it step by step.
        libc::ENAMETOOLONG | libc::EXDEV => Outcome::Walk,
        libc::EAGAIN => Outcome::Retry,
        libc::EMFILE | libc::ENFILE => Outcome::Full,
        other => Outcome::Failed(other),
    }
}

/// Whether `openat2` may still be worth trying on this host.
pub(super) fn present() -> bool {
    !MISSING.load(Ordering::Relaxed)
}

/// `path` (relative, without "..") opened beneath the directory `root` with
/// `flags | O_CLOEXEC`, through directories only: `Ok(None)` when the walk
/// must decide instead (see the module). `shrink` gives back cached
/// descriptors when the process has none left.
pub(super) fn open(root: RawFd, path: &CStr, flags: i32, mut shrink: impl FnMut()) -> io::Result<Option<OwnedFd>> {
    let mut full = false;
    for _ in 0..TRIES {
        let errno = match openat2(root, path, flags | libc::O_CLOEXEC) {
            Ok(fd) => return Ok(Some(fd)),
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
        };
        match outcome(errno) {
            Outcome::Failed(errno) => return Err(io::Error::from_raw_os_error(errno)),
            Outcome::Missing => {
                MISSING.store(true, Ordering::Relaxed);
                let why = io::Error::from_raw_os_error(errno);
                tracing::debug!("virtio-fs: openat2 is unavailable ({why}): paths are walked step by step");
                return Ok(None);
            }
            Outcome::Walk => return Ok(None),
            Outcome::Retry => {}
            Outcome::Full if full => return Err(io::Error::from_raw_os_error(errno)),
            Outcome::Full => {
                full = true;
                shrink();
            }
        }
    }
    Ok(None)
}

/// `struct open_how` as Linux 5.6 defined it (libc's cannot be built as a
/// value: it may grow).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The `openat2` system call with `RESOLVE` (no mode: nothing is created).
fn openat2(dir: RawFd, path: &CStr, flags: i32) -> io::Result<OwnedFd> {
    let flags = u64::try_from(flags).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let how = OpenHow { flags, mode: 0, resolve: RESOLVE };
    // SAFETY: `path` is NUL-terminated and `how` an open_how of the size
    // passed with it; the kernel only reads both and returns a new
    // descriptor that we own, or -1.
    let fd =
        unsafe { libc::syscall(libc::SYS_openat2, dir, path.as_ptr(), &raw const how, std::mem::size_of::<OpenHow>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // A descriptor is an int: the kernel returns nothing wider.
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each error `openat2` may give is read as what it means for the walk:
    /// a missing or refused call for good, a path it cannot take for now,
    /// the host's answer as it stands.
    #[test]
    fn each_openat2_error_decides_between_the_answer_and_the_walk() {
        for errno in [libc::ENOSYS, libc::EPERM, libc::E2BIG, libc::EINVAL] {
            assert_eq!(outcome(errno), Outcome::Missing, "{errno}");
        }
        assert_eq!(outcome(libc::ENAMETOOLONG), Outcome::Walk);
        assert_eq!(outcome(libc::EXDEV), Outcome::Walk);
        assert_eq!(outcome(libc::EAGAIN), Outcome::Retry);
        assert_eq!(outcome(libc::EMFILE), Outcome::Full);
        for errno in [libc::ENOENT, libc::ELOOP, libc::ENOTDIR, libc::EACCES] {
            assert_eq!(outcome(errno), Outcome::Failed(errno), "{errno}");
        }
    }

    /// Beneath the root through directories: a symlink anywhere on the
    /// path, or one the path ends in, is refused (ELOOP), but a trailing
    /// one is opened itself with O_PATH | O_NOFOLLOW.
    #[test]
    fn only_directories_lead_beneath_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("a", dir.path().join("l")).unwrap();
        let root = rustix::fs::open(dir.path(), rustix::fs::OFlags::PATH, rustix::fs::Mode::empty()).unwrap();
        let root = std::os::fd::AsRawFd::as_raw_fd(&root);
        let dirs = libc::O_PATH | libc::O_DIRECTORY;
        assert!(open(root, c"a/b", dirs, || {}).unwrap().is_some());
        for through_link in [c"l/b", c"l"] {
            let refused = open(root, through_link, dirs, || {}).map(|_| ());
            assert_eq!(refused.map_err(|e| e.raw_os_error()), Err(Some(libc::ELOOP)), "{through_link:?}");
        }
        assert!(open(root, c"l", libc::O_PATH | libc::O_NOFOLLOW, || {}).unwrap().is_some());
    }
}
