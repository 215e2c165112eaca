//! seccomp-bpf: what each kind of VMM thread may ask of the kernel.
//!
//! Every thread of the jailed VMM runs under the allowlist of its kind (see
//! `ThreadKind`); anything else raises SIGSYS, which `sigsys` reports and
//! turns into the end of the VMM. No list has socket, connect, bind, execve
//! or fork-like clone; only the launcher, which runs no guest-facing code,
//! may create threads. Memory may never be mapped executable.

use std::collections::BTreeMap;
use std::fs;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use thiserror::Error;

/// The kinds of VMM thread, each with its own allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadKind {
    /// The main thread once the VM runs: waits for the end and exits.
    Main,
    /// Runs KVM_RUN and the exits it returns (MMIO and port I/O).
    Vcpu,
    /// Re-raises lost interrupts.
    IrqWatch,
    /// Creates every other thread (see `jail::thread`).
    Launcher,
    /// The virtio-vsock worker: Unix streams to the supervisor.
    Vsock,
    /// The virtio-net worker: its stack's streams to the supervisor.
    Net,
    /// The virtio-rng worker.
    Rng,
    /// The virtio-blk worker: reads and writes one disk image.
    Block,
    /// The read-only virtio-fs worker.
    FsReadOnly,
    /// The virtio-fs worker of the writable shares.
    FsWritable,
}

impl ThreadKind {
    pub const ALL: [ThreadKind; 10] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::IrqWatch,
        ThreadKind::Launcher,
        ThreadKind::Vsock,
        ThreadKind::Net,
        ThreadKind::Rng,
        ThreadKind::Block,
        ThreadKind::FsReadOnly,
        ThreadKind::FsWritable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::IrqWatch => "irq-watch",
            ThreadKind::Launcher => "launcher",
            ThreadKind::Vsock => "virtio-vsock",
            ThreadKind::Net => "virtio-net",
            ThreadKind::Rng => "virtio-rng",
            ThreadKind::Block => "virtio-blk",
            ThreadKind::FsReadOnly => "virtio-fs",
            ThreadKind::FsWritable => "virtio-fs (rw)",
        }
    }
}

#[derive(Debug, Error)]
pub enum SeccompError {
    #[error("cannot build the seccomp filter of the {kind} thread")]
    Build {
        kind: &'static str,
        #[source]
        source: seccompiler::BackendError,
    },
    #[error("cannot install the seccomp filter of the {kind} thread")]
    Install {
        kind: &'static str,
        #[source]
        source: seccompiler::Error,
    },
}

/// `KVM_RUN`, `_IO(KVMIO, 0x80)`.
const KVM_RUN: u64 = 0xae80;

/// Every thread: memory, locks, signals, its own end, and writing to the
/// descriptors it already holds (the log, eventfds).
const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_futex,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Waiting on eventfds and descriptors, for every device worker.
const WORKER: &[i64] =
    &[libc::SYS_epoll_create1, libc::SYS_epoll_ctl, libc::SYS_epoll_wait, libc::SYS_epoll_pwait, libc::SYS_fcntl];

/// Streams the supervisor's broker connected: the dial request and its
/// reply with a descriptor (sendmsg, recvmsg), then plain reads, writes
/// and half-closes.
const BROKERED: &[i64] =
    &[libc::SYS_sendto, libc::SYS_recvfrom, libc::SYS_sendmsg, libc::SYS_recvmsg, libc::SYS_shutdown];

const BLOCK: &[i64] = &[
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
];

/// Looking up, reading and listing files beneath the shares (Landlock
/// decides which files; this decides which operations). `openat` is not
/// here: the read-only worker gets it only without modifying flags
/// (`read_only_open`), the writable one gets it plain.
const FS_READ: &[i64] = &[
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_lseek,
    libc::SYS_fstatfs,
    libc::SYS_statfs,
    libc::SYS_fgetxattr,
    libc::SYS_flistxattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fadvise64,
];

const FS_WRITE: &[i64] = &[
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fsetxattr,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fremovexattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
];

/// Creating a thread: its stack and guard page, its name, its own filter.
const LAUNCH: &[i64] = &[
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_seccomp,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
];

/// The unconditional syscalls of `kind`.
fn plain(kind: ThreadKind) -> Vec<i64> {
    let own: &[&[i64]] = match kind {
        ThreadKind::Main | ThreadKind::IrqWatch => &[],
        ThreadKind::Vcpu => &[&[libc::SYS_fcntl, libc::SYS_eventfd2]],
        ThreadKind::Launcher => {
            return ThreadKind::ALL
                .iter()
                .filter(|k| **k != ThreadKind::Launcher)
                .flat_map(|k| plain(*k))
                .chain(LAUNCH.iter().copied())
                .collect();
        }
        ThreadKind::Vsock => &[WORKER, BROKERED],
        // smoltcp itself asks nothing of the kernel but the clock.
        ThreadKind::Net => &[WORKER, BROKERED],
        ThreadKind::Rng => &[WORKER],
        ThreadKind::Block => &[WORKER, BLOCK],
        ThreadKind::FsReadOnly => &[WORKER, FS_READ],
        ThreadKind::FsWritable => &[WORKER, FS_READ, FS_WRITE, &[libc::SYS_openat]],
    };
    COMMON.iter().chain(own.iter().flat_map(|s| s.iter())).copied().collect()
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
}

/// open(2) flags that can change a file: write access (either access bit),
/// truncation, appending, creation and O_TMPFILE's own bit. Landlock only
/// governs truncation from ABI 3 on, so on older kernels this filter is what
/// keeps `O_RDONLY|O_TRUNC` from emptying a shared file.
const MODIFYING_OPEN_FLAGS: u64 =
    (libc::O_WRONLY | libc::O_RDWR | libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT | TMPFILE_BIT) as u64;
/// `__O_TMPFILE`: O_TMPFILE without the O_DIRECTORY bit it includes.
const TMPFILE_BIT: libc::c_int = libc::O_TMPFILE & !libc::O_DIRECTORY;

/// `openat` for the read-only worker: flags (argument 2, an int) with no
/// modifying bit. `openat2` stays out of every list, since its flags sit
/// behind a pointer that seccomp cannot read.
fn read_only_open() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let flags = SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(MODIFYING_OPEN_FLAGS), 0)?;
    Ok(vec![SeccompRule::new(vec![flags])?])
}

/// The rules of `kind`, arguments checked where it matters.
fn rules(kind: ThreadKind) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = plain(kind).into_iter().map(|nr| (nr, Vec::new())).collect();
    // Never executable memory: prot (argument 2) without PROT_EXEC.
    let no_exec = || -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        Ok(vec![SeccompRule::new(vec![cond(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0)?])?])
    };
    map.insert(libc::SYS_mmap, no_exec()?);
    map.insert(libc::SYS_mprotect, no_exec()?);
    if kind == ThreadKind::FsReadOnly {
        map.insert(libc::SYS_openat, read_only_open()?);
    }
    if matches!(kind, ThreadKind::Vcpu | ThreadKind::Launcher) {
        map.insert(libc::SYS_ioctl, vec![SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, KVM_RUN)?])?]);
    }
    Ok(map)
}

/// What a thread outside its allowlist gets: SIGSYS, reported by `sigsys`.
const MISMATCH: SeccompAction = SeccompAction::Trap;

/// The compiled filter of every kind.
pub struct Filters {
    programs: BTreeMap<ThreadKind, BpfProgram>,
}

impl Filters {
    pub fn build() -> Result<Filters, SeccompError> {
        let mut programs = BTreeMap::new();
        for kind in ThreadKind::ALL {
            let build = |source| SeccompError::Build { kind: kind.name(), source };
            let filter =
                SeccompFilter::new(rules(kind).map_err(build)?, MISMATCH, SeccompAction::Allow, TargetArch::x86_64)
                    .map_err(build)?;
            let program: BpfProgram = filter.try_into().map_err(build)?;
            programs.insert(kind, program);
        }
        Ok(Filters { programs })
    }

    /// Confines the calling thread to the allowlist of `kind`, for good.
    pub fn apply(&self, kind: ThreadKind) -> Result<(), SeccompError> {
        let program = &self.programs[&kind];
        seccompiler::apply_filter(program).map_err(|source| SeccompError::Install { kind: kind.name(), source })
    }
}

/// The actions the kernel's seccomp supports, from procfs; `None` means the
/// kernel has no seccomp filter support.
pub fn available_actions() -> Option<Vec<String>> {
    let text = fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").ok()?;
    Some(text.split_whitespace().map(str::to_owned).collect())
}

/// Whether the actions our filters rely on are present.
pub fn filters_usable(actions: &[String]) -> bool {
    ["trap", "allow"].iter().all(|needed| actions.iter().any(|a| a == needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_trap_and_allow() {
        let full: Vec<String> =
            "kill_process kill_thread trap errno user_notif trace log allow".split(' ').map(String::from).collect();
        assert!(filters_usable(&full));
        assert!(!filters_usable(&["allow".to_string()]));
    }

    #[test]
    fn every_filter_compiles() {
        Filters::build().unwrap();
    }

    #[test]
    fn no_kind_may_make_sockets_or_run_programs() {
        for kind in ThreadKind::ALL {
            let allowed = rules(kind).unwrap();
            for nr in [
                libc::SYS_socket,
                libc::SYS_connect,
                libc::SYS_bind,
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_kill,
                libc::SYS_tgkill,
                libc::SYS_tkill,
                libc::SYS_truncate,
            ] {
                assert!(!allowed.contains_key(&nr), "{} may call {nr}", kind.name());
            }
        }
    }

    #[test]
    fn only_the_launcher_creates_threads_and_only_the_writable_fs_changes_files() {
        for kind in ThreadKind::ALL {
            let allowed = rules(kind).unwrap();
            assert_eq!(allowed.contains_key(&libc::SYS_clone), kind == ThreadKind::Launcher, "{}", kind.name());
            let writes = allowed.contains_key(&libc::SYS_unlinkat);
            assert_eq!(writes, matches!(kind, ThreadKind::FsWritable | ThreadKind::Launcher), "{}", kind.name());
        }
    }

    #[test]
    fn the_read_only_worker_opens_only_without_modifying_flags() {
        let ro = rules(ThreadKind::FsReadOnly).unwrap();
        assert_eq!(ro[&libc::SYS_openat].len(), 1, "openat is conditional for the read-only worker");
        assert!(rules(ThreadKind::FsWritable).unwrap()[&libc::SYS_openat].is_empty());
        for kind in ThreadKind::ALL {
            assert!(!rules(kind).unwrap().contains_key(&libc::SYS_openat2), "{} may call openat2", kind.name());
            assert!(!rules(kind).unwrap().contains_key(&libc::SYS_open), "{} may call open", kind.name());
            assert!(!rules(kind).unwrap().contains_key(&libc::SYS_creat), "{} may call creat", kind.name());
        }
        for flag in [libc::O_WRONLY, libc::O_RDWR, libc::O_TRUNC, libc::O_APPEND, libc::O_CREAT, libc::O_TMPFILE] {
            assert_ne!(flag as u64 & MODIFYING_OPEN_FLAGS, 0, "flag {flag:#o}");
        }
        for flag in
            [libc::O_RDONLY, libc::O_PATH, libc::O_DIRECTORY, libc::O_NOFOLLOW, libc::O_CLOEXEC, libc::O_NONBLOCK]
        {
            assert_eq!(flag as u64 & MODIFYING_OPEN_FLAGS, 0, "flag {flag:#o}");
        }
    }
}
