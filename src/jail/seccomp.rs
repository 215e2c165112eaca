//! seccomp-bpf: what each kind of VMM thread may ask of the kernel.
//!
//! Every thread of the jailed VMM runs under the allowlist of its kind (see
//! `ThreadKind`); anything else raises SIGSYS, which `sigsys` reports and
//! turns into the end of the VMM. No list has socket, connect, bind, execve
//! or fork-like clone; only the launcher, which runs no guest-facing code,
//! may create threads. Memory may never be mapped executable.
//!
//! The fixed kinds' lists are here; each virtio device declares its worker's
//! list in its own folder (a `DeviceThread`, built from the shared groups
//! `WORKER` and `BROKERED` and its own), and the VMM hands those to `Filters::build`.

use std::collections::BTreeMap;
use std::fs;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use thiserror::Error;

/// The kinds of VMM thread, each with its own allowlist. Device workers
/// bring their own (`DeviceThread`), so the jail need not know each device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread once the VM runs: waits for the end and exits.
    Main,
    /// Runs KVM_RUN and the exits it returns (MMIO and port I/O).
    Vcpu,
    /// A vCPU of a VM that records a template (`vmm::template`): also reads
    /// the VM's state from KVM, kicks the other vCPUs and writes the
    /// template files it was given before the jail closed.
    RecordingVcpu,
    /// Re-raises lost interrupts.
    IrqWatch,
    /// Creates every other thread (see `jail::thread`).
    Launcher,
    /// A virtio device worker, as its device registered it.
    Device(&'static DeviceThread),
}

impl ThreadKind {
    /// The kinds every VMM has, whatever its devices.
    pub const FIXED: [ThreadKind; 5] =
        [ThreadKind::Main, ThreadKind::Vcpu, ThreadKind::RecordingVcpu, ThreadKind::IrqWatch, ThreadKind::Launcher];

    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::RecordingVcpu => "recording vcpu",
            ThreadKind::IrqWatch => "irq-watch",
            ThreadKind::Launcher => "launcher",
            ThreadKind::Device(thread) => thread.name,
        }
    }
}

/// A device worker's thread as its device declares it: the name it runs
/// under (also its name in SIGSYS reports) and what it may ask of the
/// kernel beyond `COMMON`, each syscall commented where it is listed.
#[derive(Debug, PartialEq, Eq)]
pub struct DeviceThread {
    pub name: &'static str,
    /// Unconditional syscalls, in groups such as `WORKER` and `BROKERED`.
    pub syscalls: &'static [&'static [i64]],
    /// Whether `openat` is allowed, and with which flags.
    pub openat: Openat,
    /// Calls on a directory descriptor and a path, allowed only with a
    /// null path (argument 1): they then act on the descriptor alone,
    /// never on a file found by name (`utimensat` as `futimens`).
    pub on_descriptor: &'static [i64],
}

/// `openat` for a device worker, and with it `openat2` (which the file
/// servers use to find a node beneath a share's root in one call). The
/// flags of `openat2` sit behind a pointer that seccomp cannot read, so
/// it comes only where Landlock itself refuses what the flags could do
/// that the filter refuses (see [`Openat::allows_openat2`]). A `ReadOnly`
/// worker runs under a Landlock layer of its own that refuses it every
/// change to files (see `thread`), the writable shares' included, with
/// a descriptor table of its own; an `Any` worker under one that reaches
/// nothing but the writable shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Openat {
    Never,
    /// Only without a modifying flag (`MODIFYING_OPEN_FLAGS`).
    ReadOnly,
    /// Any flag but O_TRUNC: Landlock below ABI 3 judges an
    /// `O_RDONLY | O_TRUNC` open as a read, and would let it empty a
    /// read-only share's file. Such a worker truncates through a
    /// descriptor opened for writing, which Landlock judges at every ABI.
    Any,
}

/// The Landlock ABI the jail enforces (3 and later govern truncation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landlocked {
    pub abi: u32,
}

impl Openat {
    /// Whether a worker with this `openat` may call `openat2` under a jail
    /// enforcing `landlocked`. Its `openat` filter is what keeps it from
    /// O_TRUNC where Landlock below ABI 3 does not govern truncation; from
    /// ABI 3 Landlock refuses a truncating open of a read-only share (and
    /// the read-only worker's own layer every change an open could make,
    /// on every share), and it may have `openat2`, whose flags no filter
    /// reads.
    pub fn allows_openat2(self, landlocked: Landlocked) -> bool {
        match self {
            Openat::Never => false,
            Openat::ReadOnly | Openat::Any => landlocked.abi >= 3,
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
    #[error("two kinds of thread are named {0}: their filters would be confused")]
    DuplicateName(&'static str),
    #[error("no seccomp filter was built for the {0} thread")]
    Unknown(&'static str),
}

/// `KVM_RUN`, `_IO(KVMIO, 0x80)`.
const KVM_RUN: u64 = 0xae80;

/// The KVM ioctls that read a vCPU's or the VM's state, for saving a
/// template; none of them changes anything.
fn kvm_state_reads() -> [u64; 14] {
    use kvm_bindings::*;
    use std::mem::size_of;
    [
        nix::request_code_read!(0xae, 0x81, size_of::<kvm_regs>()),
        nix::request_code_read!(0xae, 0x83, size_of::<kvm_sregs>()),
        nix::request_code_readwrite!(0xae, 0x88, size_of::<kvm_msrs>()),
        nix::request_code_read!(0xae, 0x8e, size_of::<kvm_lapic_state>()),
        nix::request_code_read!(0xae, 0x98, size_of::<kvm_mp_state>()),
        nix::request_code_read!(0xae, 0x9f, size_of::<kvm_vcpu_events>()),
        nix::request_code_read!(0xae, 0xa1, size_of::<kvm_debugregs>()),
        nix::request_code_read!(0xae, 0xa4, size_of::<kvm_xsave>()),
        nix::request_code_read!(0xae, 0xa6, size_of::<kvm_xcrs>()),
        nix::request_code_none!(0xae, 0xa3),
        nix::request_code_readwrite!(0xae, 0x62, size_of::<kvm_irqchip>()),
        nix::request_code_read!(0xae, 0x9f, size_of::<kvm_pit_state2>()),
        nix::request_code_read!(0xae, 0x7c, size_of::<kvm_clock_data>()),
        // KVM_RUN is here too: a recording vCPU runs like any other.
        KVM_RUN,
    ]
}

/// The recording vCPU's own calls: reading the pagemap and writing the
/// template files, and kicking the other vCPUs (`tgkill`, to this process
/// only, checked in `rules`).
const RECORDING: &[i64] =
    &[libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_fdatasync, libc::SYS_statx, libc::SYS_fstat];

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
pub const WORKER: &[i64] =
    &[libc::SYS_epoll_create1, libc::SYS_epoll_ctl, libc::SYS_epoll_wait, libc::SYS_epoll_pwait, libc::SYS_fcntl];

/// Streams the supervisor's broker connected: the dial request and its
/// reply with a descriptor (sendmsg, recvmsg), then plain reads, writes
/// and half-closes.
pub const BROKERED: &[i64] =
    &[libc::SYS_sendto, libc::SYS_recvfrom, libc::SYS_sendmsg, libc::SYS_recvmsg, libc::SYS_shutdown];

/// Creating a thread: its stack and guard page, its name, its own filter
/// (and a read-only worker's own Landlock layer, which only narrows).
/// `clone` only with a thread's flags (`THREAD_CLONE`, in `rules`);
/// `clone3`, whose flags no filter reads, always fails with ENOSYS (see
/// `no_clone3`), and the C library then makes the thread with `clone`.
const LAUNCH: &[i64] = &[
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_restrict_self,
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_seccomp,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
];

/// The unconditional syscalls of `kind`; the launcher's are those of every
/// kind it may start, `devices` among them.
fn plain(kind: ThreadKind, devices: &[&'static DeviceThread], landlocked: Landlocked) -> Vec<i64> {
    let own: &[&[i64]] = match kind {
        ThreadKind::Main | ThreadKind::IrqWatch => &[],
        ThreadKind::Vcpu => &[&[libc::SYS_fcntl, libc::SYS_eventfd2]],
        ThreadKind::RecordingVcpu => &[&[libc::SYS_fcntl, libc::SYS_eventfd2], RECORDING],
        ThreadKind::Launcher => {
            return all_kinds(devices)
                .filter(|k| *k != ThreadKind::Launcher)
                .flat_map(|k| plain(k, devices, landlocked))
                .chain(LAUNCH.iter().copied())
                .collect();
        }
        ThreadKind::Device(thread) => thread.syscalls,
    };
    let openat2 = match kind {
        ThreadKind::Device(thread) => Some(libc::SYS_openat2).filter(|_| thread.openat.allows_openat2(landlocked)),
        _ => None,
    };
    COMMON.iter().chain(own.iter().flat_map(|s| s.iter())).copied().chain(openat2).collect()
}

/// The fixed kinds, then one per device thread.
pub(crate) fn all_kinds<'a>(devices: &'a [&'static DeviceThread]) -> impl Iterator<Item = ThreadKind> + 'a {
    ThreadKind::FIXED.into_iter().chain(devices.iter().map(|d| ThreadKind::Device(d)))
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
}

/// open(2) flags that can change a file: write access (either access bit),
/// truncation, appending, creation and O_TMPFILE's own bit. Landlock only
/// governs truncation from ABI 3 on, so on older kernels this filter is what
/// keeps `O_RDONLY|O_TRUNC` from emptying a shared file.
pub(crate) const MODIFYING_OPEN_FLAGS: u64 =
    (libc::O_WRONLY | libc::O_RDWR | libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT | TMPFILE_BIT) as u64;
/// `__O_TMPFILE`: O_TMPFILE without the O_DIRECTORY bit it includes.
const TMPFILE_BIT: libc::c_int = libc::O_TMPFILE & !libc::O_DIRECTORY;

/// The `clone` flags every new thread has: it shares this process's
/// memory and signal handlers and is one of its threads, so it ends when
/// the VMM does (a process forked from the VMM would outlive it, with its
/// descriptors and its Landlock rights on the writable shares).
const THREAD_CLONE: u64 = (libc::CLONE_VM | libc::CLONE_SIGHAND | libc::CLONE_THREAD) as u64;
/// The `clone` flags a new thread may also have, as the C library's
/// `pthread_create` sets them; any other flag (a namespace, CLONE_PARENT,
/// CLONE_VFORK, CLONE_PTRACE, CLONE_PIDFD, an exit signal) is refused.
const THREAD_CLONE_OPTIONAL: u64 = (libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SYSVSEM
    | libc::CLONE_SETTLS
    | libc::CLONE_PARENT_SETTID
    | libc::CLONE_CHILD_CLEARTID
    | libc::CLONE_CHILD_SETTID) as u64;

/// `clone` making a thread of this process, nothing else: its flags
/// (argument 0; the kernel reads only their low 32 bits) hold every bit of
/// `THREAD_CLONE` and none outside it and `THREAD_CLONE_OPTIONAL`.
fn clone_a_thread() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let others = u64::from(u32::MAX) & !THREAD_CLONE_OPTIONAL;
    let flags = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(others), THREAD_CLONE)?;
    Ok(vec![SeccompRule::new(vec![flags])?])
}

/// `fcntl` for what the VMM and its libraries ask of it: duplicating a
/// descriptor and reading or setting its flags (F_SETFL without O_ASYNC).
/// Not F_SETOWN, F_SETSIG, F_SETLEASE or F_NOTIFY, whose signals below
/// Landlock 6 (which scopes signals to the VMM) reach any process of the
/// user: nothing but this filter would keep a thread from them.
fn fcntl_without_signals() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let command = |cmd: libc::c_int| SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, cmd as u64);
    let mut rules = [libc::F_DUPFD, libc::F_DUPFD_CLOEXEC, libc::F_GETFD, libc::F_SETFD, libc::F_GETFL]
        .into_iter()
        .map(|cmd| SeccompRule::new(vec![command(cmd)?]))
        .collect::<Result<Vec<_>, _>>()?;
    let no_async = SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(libc::O_ASYNC as u64), 0)?;
    rules.push(SeccompRule::new(vec![command(libc::F_SETFL)?, no_async])?);
    Ok(rules)
}

/// `openat` with flags (argument 2, an int) without any of `refused`.
fn open_without(refused: u64) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let flags = SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(refused), 0)?;
    Ok(vec![SeccompRule::new(vec![flags])?])
}

/// The rules of `kind` under a jail whose Landlock ruleset is
/// `landlocked`, arguments checked where it matters.
pub(crate) fn rules(
    kind: ThreadKind,
    devices: &[&'static DeviceThread],
    landlocked: Landlocked,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> =
        plain(kind, devices, landlocked).into_iter().map(|nr| (nr, Vec::new())).collect();
    // Never executable memory: prot (argument 2) without PROT_EXEC.
    let no_exec = || -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        Ok(vec![SeccompRule::new(vec![cond(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0)?])?])
    };
    map.insert(libc::SYS_mmap, no_exec()?);
    map.insert(libc::SYS_mprotect, no_exec()?);
    if let Some(fcntl) = map.get_mut(&libc::SYS_fcntl) {
        *fcntl = fcntl_without_signals()?;
    }
    match kind {
        ThreadKind::Device(DeviceThread { openat: Openat::ReadOnly, .. }) => {
            map.insert(libc::SYS_openat, open_without(MODIFYING_OPEN_FLAGS)?);
        }
        ThreadKind::Device(DeviceThread { openat: Openat::Any, .. }) => {
            map.insert(libc::SYS_openat, open_without(libc::O_TRUNC as u64)?);
        }
        // The launcher's filter is inherited by every thread it starts,
        // whose own filter then narrows the call; it refuses what every
        // worker's refuses, as code in any thread can have the launcher
        // start a thread under the launcher's kind (O_TRUNC below
        // Landlock 3 would empty a read-only share's file).
        ThreadKind::Launcher if devices.iter().any(|d| d.openat == Openat::Any) => {
            map.insert(libc::SYS_openat, open_without(libc::O_TRUNC as u64)?);
        }
        ThreadKind::Launcher if devices.iter().any(|d| d.openat == Openat::ReadOnly) => {
            map.insert(libc::SYS_openat, open_without(MODIFYING_OPEN_FLAGS)?);
        }
        _ => {}
    }
    // A path names any file the process may reach (Landlock does not
    // govern the changes these calls make): none, only a descriptor. The
    // launcher's filter is inherited by every thread it starts.
    let on_descriptor: Vec<i64> = match kind {
        ThreadKind::Device(thread) => thread.on_descriptor.to_vec(),
        ThreadKind::Launcher => devices.iter().flat_map(|d| d.on_descriptor.iter().copied()).collect(),
        _ => Vec::new(),
    };
    for nr in on_descriptor {
        map.entry(nr).or_insert(vec![SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, 0)?])?]);
    }
    // The read-only worker's own descriptor table (see `thread`), taken
    // before its filter, under the launcher's.
    if kind == ThreadKind::Launcher && devices.iter().any(|d| d.openat == Openat::ReadOnly) {
        let files_only = cond(0, SeccompCmpOp::Eq, libc::CLONE_FILES as u64)?;
        map.insert(libc::SYS_unshare, vec![SeccompRule::new(vec![files_only])?]);
    }
    if kind == ThreadKind::Launcher {
        map.insert(libc::SYS_clone, clone_a_thread()?);
    }
    match kind {
        ThreadKind::Vcpu => {
            map.insert(libc::SYS_ioctl, vec![SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, KVM_RUN)?])?]);
        }
        // The launcher's filter is inherited by every thread it starts.
        ThreadKind::RecordingVcpu | ThreadKind::Launcher => {
            let reads =
                kvm_state_reads().into_iter().map(|code| SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, code)?]));
            map.insert(libc::SYS_ioctl, reads.collect::<Result<_, _>>()?);
            let pid = u64::from(std::process::id());
            map.insert(libc::SYS_tgkill, vec![SeccompRule::new(vec![cond(0, SeccompCmpOp::Eq, pid)?])?]);
        }
        _ => {}
    }
    Ok(map)
}

/// What a thread outside its allowlist gets: SIGSYS, reported by `sigsys`.
const MISMATCH: SeccompAction = SeccompAction::Trap;

/// A filter of its own, stacked under the launcher's (and so inherited
/// by every thread): `clone3` fails with ENOSYS. Its flags sit behind a
/// pointer no filter reads, so it cannot be held to a thread's flags as
/// `clone` is; the C library falls back to `clone` on ENOSYS. (The
/// launcher's own filter allows `clone3`, as a refusal there would trap
/// before this filter's answer counted; every other kind's traps it.)
fn no_clone3() -> Result<BpfProgram, seccompiler::BackendError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
    SeccompFilter::new(rules, SeccompAction::Allow, enosys, TargetArch::x86_64)?.try_into()
}

/// The compiled filter of every kind, by kind name.
pub struct Filters {
    programs: BTreeMap<&'static str, BpfProgram>,
    no_clone3: BpfProgram,
}

impl Filters {
    /// Filters for the fixed kinds and for the worker of each of `devices`,
    /// under a jail whose Landlock ruleset is `landlocked`.
    pub fn build(devices: &[&'static DeviceThread], landlocked: Landlocked) -> Result<Filters, SeccompError> {
        let mut programs = BTreeMap::new();
        for kind in all_kinds(devices) {
            let build = |source| SeccompError::Build { kind: kind.name(), source };
            let filter = SeccompFilter::new(
                rules(kind, devices, landlocked).map_err(build)?,
                MISMATCH,
                SeccompAction::Allow,
                TargetArch::x86_64,
            )
            .map_err(build)?;
            let program: BpfProgram = filter.try_into().map_err(build)?;
            if programs.insert(kind.name(), program).is_some() {
                return Err(SeccompError::DuplicateName(kind.name()));
            }
        }
        let no_clone3 =
            no_clone3().map_err(|source| SeccompError::Build { kind: ThreadKind::Launcher.name(), source })?;
        Ok(Filters { programs, no_clone3 })
    }

    /// Confines the calling thread to the allowlist of `kind`, for good.
    pub fn apply(&self, kind: ThreadKind) -> Result<(), SeccompError> {
        let program = self.programs.get(kind.name()).ok_or(SeccompError::Unknown(kind.name()))?;
        let install = |source| SeccompError::Install { kind: kind.name(), source };
        if kind == ThreadKind::Launcher {
            seccompiler::apply_filter(&self.no_clone3).map_err(install)?;
        }
        seccompiler::apply_filter(program).map_err(install)
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
}
