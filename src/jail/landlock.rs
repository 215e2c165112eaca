//! Landlock: filesystem access control for unprivileged processes.

use std::io;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, PathFdError, RestrictionStatus, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope,
};
use thiserror::Error;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of
/// creating a ruleset.
const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// The Landlock ABI version the running kernel supports.
pub fn abi_version() -> io::Result<u32> {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the
    // syscall reads no memory and returns the ABI version or -1 with errno.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        u32::try_from(ret).map_err(|_| io::Error::other("landlock returned an out-of-range ABI"))
    }
}

/// What to tell the user when Landlock is missing, from the errno we got.
pub fn unavailable_fix(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            "Landlock is built in but disabled: add 'landlock' to the lsm= kernel parameter and reboot"
        }
        _ => "this kernel has no Landlock (needs Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)",
    }
}

/// What the jailed process may still reach in the filesystem.
#[derive(Debug, Default, Clone)]
pub struct FsRules {
    /// Read (files and directory listings), nothing else.
    pub read_only: Vec<PathBuf>,
    /// Everything: create, write, remove, rename within.
    pub read_write: Vec<PathBuf>,
}

#[derive(Debug, Error)]
pub enum LandlockError {
    #[error("Landlock is not available: {0}")]
    Unavailable(String),
    #[error("cannot build the Landlock ruleset")]
    Ruleset(#[from] RulesetError),
    #[error("cannot open {path} for a Landlock rule")]
    Path {
        path: String,
        #[source]
        source: PathFdError,
    },
    #[error("cannot take up the Landlock layer built for this thread")]
    Layer(#[source] io::Error),
}

/// A right this kernel's Landlock cannot enforce, and what holds instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The first ABI with the right.
    pub since: u32,
    pub right: &'static str,
    pub held_by: &'static str,
}

/// Every right the jail asks Landlock for that came after ABI 1.
const LATER_RIGHTS: &[Gap] = &[
    Gap {
        since: 2,
        right: "moving files between directories",
        held_by: "Landlock 1 refuses such moves outright, so a writable share cannot take a rename across folders",
    },
    Gap {
        since: 3,
        right: "truncation",
        held_by: "seccomp: no share's worker can open with the truncate flag or call truncate or openat2 (the read-only one \
                  opens without write flags either)",
    },
    Gap { since: 4, right: "TCP bind and connect", held_by: "seccomp: no VMM thread may make a socket" },
    Gap { since: 5, right: "device ioctls", held_by: "seccomp: the only ioctl any VMM thread may make is KVM_RUN" },
    Gap {
        since: 6,
        right: "abstract Unix sockets and signals outside the VMM",
        held_by: "seccomp: no VMM thread may make a socket or send a signal",
    },
];

/// The rights Landlock at `abi` lacks, oldest first, with what holds them.
pub fn gaps(abi: u32) -> Vec<Gap> {
    LATER_RIGHTS.iter().filter(|g| g.since > abi).copied().collect()
}

/// The newest ABI whose rights we ask for; older kernels enforce the subset
/// they know (best effort), which `restrict` reports.
const TARGET_ABI: ABI = ABI::V6;

/// Restricts the calling thread, and every thread it creates from now on,
/// to `rules`: no other file may be opened, created or changed, no TCP port
/// bound or connected (ABI 4+), no abstract Unix socket reached and no
/// signal sent outside (ABI 6+). Returns the ABI actually enforced.
pub fn restrict(rules: &FsRules) -> Result<u32, LandlockError> {
    let abi = abi_version().map_err(|e| LandlockError::Unavailable(format!("{e}; {}", unavailable_fix(&e))))?;
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(TARGET_ABI))?;
    if abi >= 4 {
        ruleset = ruleset.handle_access(AccessNet::from_all(TARGET_ABI))?;
    }
    if abi >= 6 {
        ruleset = ruleset.scope(Scope::from_all(TARGET_ABI))?;
    }
    let grants = rules
        .read_only
        .iter()
        .map(|p| (p, AccessFs::from_read(TARGET_ABI)))
        .chain(rules.read_write.iter().map(|p| (p, AccessFs::from_all(TARGET_ABI))));
    let created = granting(ruleset.create()?, grants)?;
    enforced(created.restrict_self()?)?;
    Ok(abi)
}

/// `created` with a rule granting each path its access.
fn granting<'a>(
    mut created: RulesetCreated,
    grants: impl Iterator<Item = (&'a PathBuf, BitFlags<AccessFs>)>,
) -> Result<RulesetCreated, LandlockError> {
    for (path, access) in grants {
        let fd =
            PathFd::new(path).map_err(|source| LandlockError::Path { path: path.display().to_string(), source })?;
        // Directory rights on a single file are an error: keep those a file has.
        let access = if path.is_dir() { access } else { access & AccessFs::from_file(TARGET_ABI) };
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(created)
}

fn enforced(status: RestrictionStatus) -> Result<(), LandlockError> {
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(LandlockError::Unavailable("the kernel enforced none of the rules".into()));
    }
    Ok(())
}

/// A Landlock layer built once, before the jail closes, and laid on each
/// thread that needs it when the thread starts (see `jail::thread`).
#[derive(Debug)]
pub struct Layer(RulesetCreated);

impl Layer {
    /// A layer through which nothing but `paths` (and what they hold) can
    /// be reached at all, each with every right: for a worker that changes
    /// files beneath them and must reach no other, since Landlock governs
    /// opens but not changes to modes, owners and times.
    pub fn only(paths: &[PathBuf]) -> Result<Layer, LandlockError> {
        let ruleset = Ruleset::default().handle_access(AccessFs::from_all(TARGET_ABI))?.create()?;
        Ok(Layer(granting(ruleset, paths.iter().map(|p| (p, AccessFs::from_all(TARGET_ABI))))?))
    }

    /// Lays the layer on the calling thread and the threads it creates
    /// from now on.
    pub fn restrict_current(&self) -> Result<(), LandlockError> {
        let ruleset = self.0.try_clone().map_err(LandlockError::Layer)?;
        enforced(ruleset.restrict_self()?)
    }
}

/// Refuses the calling thread, and the threads it creates from now on,
/// every change to files that Landlock governs at this kernel (writing,
/// truncating from ABI 3, making, removing, moving, device ioctls),
/// whatever the process's own ruleset grants: a layer for a worker whose
/// opens must change nothing.
pub fn forbid_changes() -> Result<(), LandlockError> {
    let ruleset = Ruleset::default().handle_access(AccessFs::from_write(TARGET_ABI))?.create()?;
    enforced(ruleset.restrict_self()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layer binds the thread it is laid on: a file there cannot be
    /// opened to write or truncate, nor one made, while another thread of
    /// the process still may.
    #[test]
    fn a_thread_forbidden_changes_cannot_write_truncate_or_make_files() {
        if abi_version().is_err() {
            eprintln!("skipping: this kernel has no Landlock");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"kept").unwrap();
        let (file2, dir2) = (file.clone(), dir.path().to_path_buf());
        std::thread::spawn(move || {
            forbid_changes().unwrap();
            let denied = |r: io::Result<std::fs::File>| r.map(drop).map_err(|e| e.raw_os_error());
            assert_eq!(denied(std::fs::OpenOptions::new().write(true).open(&file2)), Err(Some(libc::EACCES)));
            if abi_version().unwrap() >= 3 {
                use std::os::unix::fs::OpenOptionsExt;
                let truncating = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(&file2);
                assert_eq!(denied(truncating), Err(Some(libc::EACCES)));
            }
            assert_eq!(denied(std::fs::File::create(dir2.join("new"))), Err(Some(libc::EACCES)));
            assert_eq!(std::fs::read(&file2).unwrap(), b"kept", "reads stay");
        })
        .join()
        .unwrap();
        std::fs::write(&file, b"changed").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"changed", "other threads are not bound");
    }

    /// A layer built once binds each thread it is laid on, and only
    /// those: there nothing outside its paths opens, even to read, while
    /// everything within them may be read, written and made.
    #[test]
    fn a_layer_keeps_the_threads_it_is_laid_on_to_its_paths() {
        if abi_version().is_err() {
            eprintln!("skipping: this kernel has no Landlock");
            return;
        }
        let (inside, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(outside.path().join("f"), b"kept").unwrap();
        let layer = std::sync::Arc::new(Layer::only(&[inside.path().to_path_buf()]).unwrap());
        for _ in 0..2 {
            let (layer, inside, outside) = (layer.clone(), inside.path().to_owned(), outside.path().to_owned());
            std::thread::spawn(move || {
                layer.restrict_current().unwrap();
                let denied = std::fs::File::open(outside.join("f")).map(drop).map_err(|e| e.raw_os_error());
                assert_eq!(denied, Err(Some(libc::EACCES)));
                std::fs::write(inside.join("new"), b"made").unwrap();
                assert_eq!(std::fs::read(inside.join("new")).unwrap(), b"made");
            })
            .join()
            .unwrap();
        }
        assert_eq!(std::fs::read(outside.path().join("f")).unwrap(), b"kept", "other threads are not bound");
    }

    #[test]
    fn older_abis_name_each_right_they_lack_and_what_holds_it() {
        assert!(gaps(6).is_empty());
        assert!(gaps(7).is_empty());
        let rights: Vec<&str> = gaps(2).iter().map(|g| g.right).collect();
        assert_eq!(
            rights,
            [
                "truncation",
                "TCP bind and connect",
                "device ioctls",
                "abstract Unix sockets and signals outside the VMM"
            ]
        );
        assert_eq!(gaps(1).len(), 5);
    }
}
