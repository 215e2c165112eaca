//! The VMM's seccomp filters as the VMM builds them: the fixed thread kinds
//! and every registered device's worker (`jail::seccomp` holds the rules,
//! the devices declare their threads).

use std::collections::BTreeMap;

use seccompiler::SeccompRule;

use super::devices::virtio::{device_threads, fs};
use crate::jail::seccomp::{self, Filters, MODIFYING_OPEN_FLAGS, all_kinds};
use crate::jail::{Landlocked, ThreadKind};

/// A jail on the oldest Landlock: the least any worker gets.
const OLD: Landlocked = Landlocked { abi: 1 };

/// Jails `Openat::allows_openat2` tells apart, and whether the file
/// servers' workers get openat2 in each: only where Landlock governs
/// truncation (ABI 3), which their `openat` filters refuse.
const JAILS: [(Landlocked, bool); 4] = [
    (Landlocked { abi: 1 }, false),
    (Landlocked { abi: 2 }, false),
    (Landlocked { abi: 3 }, true),
    (Landlocked { abi: 6 }, true),
];

/// The VMM's own kinds: the fixed ones and every registered device's.
fn kinds() -> Vec<ThreadKind> {
    all_kinds(&device_threads()).collect()
}

fn rules(kind: ThreadKind) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    seccomp::rules(kind, &device_threads(), OLD)
}

#[test]
fn thread_names_are_unique() {
    let mut names: Vec<&str> = kinds().iter().map(|k| k.name()).collect();
    let all = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all);
}

#[test]
fn every_filter_compiles() {
    for (landlocked, _) in JAILS {
        Filters::build(&device_threads(), landlocked).unwrap();
    }
}

#[test]
fn no_kind_may_make_sockets_or_run_programs() {
    for kind in kinds() {
        let allowed = rules(kind).unwrap();
        for nr in [
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_kill,
            libc::SYS_tkill,
            libc::SYS_truncate,
        ] {
            assert!(!allowed.contains_key(&nr), "{} may call {nr}", kind.name());
        }
        // Signals only to this process's threads, and only to kick a
        // vCPU while recording.
        let tgkill = allowed.get(&libc::SYS_tgkill);
        assert_eq!(
            tgkill.is_some(),
            matches!(kind, ThreadKind::RecordingVcpu | ThreadKind::Launcher),
            "{} may call tgkill",
            kind.name()
        );
        assert!(tgkill.is_none_or(|rules| rules.len() == 1), "tgkill is conditional");
    }
}

#[test]
fn only_the_launcher_creates_threads_and_only_the_writable_fs_changes_files() {
    for kind in kinds() {
        let allowed = rules(kind).unwrap();
        assert_eq!(allowed.contains_key(&libc::SYS_clone), kind == ThreadKind::Launcher, "{}", kind.name());
        let writes = allowed.contains_key(&libc::SYS_unlinkat);
        assert_eq!(
            writes,
            matches!(kind, ThreadKind::Launcher) || kind == ThreadKind::Device(&fs::WRITABLE_THREAD),
            "{}",
            kind.name()
        );
    }
}

#[test]
fn the_read_only_worker_opens_only_without_modifying_flags() {
    let ro = rules(ThreadKind::Device(&fs::READ_ONLY_THREAD)).unwrap();
    assert_eq!(ro[&libc::SYS_openat].len(), 1, "openat is conditional for the read-only worker");
    let rw = rules(ThreadKind::Device(&fs::WRITABLE_THREAD)).unwrap();
    assert_eq!(rw[&libc::SYS_openat].len(), 1, "the writable worker opens without O_TRUNC");
    for kind in kinds() {
        assert!(!rules(kind).unwrap().contains_key(&libc::SYS_open), "{} may call open", kind.name());
        assert!(!rules(kind).unwrap().contains_key(&libc::SYS_creat), "{} may call creat", kind.name());
    }
    for flag in [libc::O_WRONLY, libc::O_RDWR, libc::O_TRUNC, libc::O_APPEND, libc::O_CREAT, libc::O_TMPFILE] {
        assert_ne!(u64::try_from(flag).unwrap() & MODIFYING_OPEN_FLAGS, 0, "flag {flag:#o}");
    }
    for flag in [libc::O_RDONLY, libc::O_PATH, libc::O_DIRECTORY, libc::O_NOFOLLOW, libc::O_CLOEXEC, libc::O_NONBLOCK] {
        assert_eq!(u64::try_from(flag).unwrap() & MODIFYING_OPEN_FLAGS, 0, "flag {flag:#o}");
    }
}

/// openat2's flags sit behind a pointer no filter reads: the file
/// servers' workers have it (and so the launcher, which starts them) only
/// where Landlock refuses what their `openat` filter refuses (truncation,
/// from ABI 3), no other kind ever; and it is never conditional.
#[test]
fn openat2_only_for_workers_whose_opens_need_no_flag_refused() {
    for (landlocked, workers_get_it) in JAILS {
        for kind in kinds() {
            let allowed = seccomp::rules(kind, &device_threads(), landlocked).unwrap();
            let wanted = match kind {
                ThreadKind::Launcher => workers_get_it,
                k if k == ThreadKind::Device(&fs::WRITABLE_THREAD) => workers_get_it,
                k if k == ThreadKind::Device(&fs::READ_ONLY_THREAD) => workers_get_it,
                _ => false,
            };
            assert_eq!(allowed.contains_key(&libc::SYS_openat2), wanted, "{} under {landlocked:?}", kind.name());
            assert!(allowed.get(&libc::SYS_openat2).is_none_or(Vec::is_empty), "{}", kind.name());
            let ro = ThreadKind::Device(&fs::READ_ONLY_THREAD);
            if kind == ro {
                assert_eq!(allowed[&libc::SYS_openat].len(), 1, "openat stays conditional for the read-only worker");
            }
        }
    }
}

/// Landlock below ABI 3 does not govern truncation, so code running in a
/// worker that may open with O_TRUNC (or call openat2, whose flags no
/// filter reads) could empty any file of a read-only share: open(2)
/// truncates whatever the opener may write, and Landlock judges an
/// `O_RDONLY | O_TRUNC` open as a read. The writable shares' worker needs
/// no O_TRUNC (it truncates through a descriptor opened for writing,
/// which Landlock judges): under such a jail no device worker may open
/// with it, nor call openat2.
#[test]
fn below_landlock_3_no_worker_opens_to_truncate() {
    for landlocked in [Landlocked { abi: 1 }, Landlocked { abi: 2 }] {
        for kind in kinds().into_iter().filter(|k| matches!(k, ThreadKind::Device(_))) {
            let allowed = seccomp::rules(kind, &device_threads(), landlocked).unwrap();
            assert!(!allowed.contains_key(&libc::SYS_openat2), "{} may call openat2 under {landlocked:?}", kind.name());
            if let Some(openat) = allowed.get(&libc::SYS_openat) {
                assert_eq!(openat.len(), 1, "{} opens with any flags under {landlocked:?}", kind.name());
            }
        }
    }
}

/// Landlock does not govern changes to modes, owners and times: no kind
/// may make them by path, which could name a read-only share's file (the
/// writable shares' worker makes them through descriptors it opened, and
/// its own Landlock layer opens nothing else); utimensat only with a null
/// path, as futimens. Only the launcher may unshare, and only its
/// descriptor table, for the read-only worker it starts.
#[test]
fn no_kind_changes_modes_owners_or_times_by_path() {
    for kind in kinds() {
        let allowed = rules(kind).unwrap();
        for nr in [
            libc::SYS_chmod,
            libc::SYS_fchmodat,
            libc::SYS_fchmodat2,
            libc::SYS_chown,
            libc::SYS_lchown,
            libc::SYS_fchownat,
            libc::SYS_utime,
            libc::SYS_utimes,
            libc::SYS_futimesat,
        ] {
            assert!(!allowed.contains_key(&nr), "{} may call {nr}", kind.name());
        }
        let utimensat = allowed.get(&libc::SYS_utimensat);
        assert!(utimensat.is_none_or(|rules| rules.len() == 1), "{}: utimensat is conditional", kind.name());
        let unshare = allowed.get(&libc::SYS_unshare);
        assert_eq!(unshare.is_some(), kind == ThreadKind::Launcher, "{} may call unshare", kind.name());
        assert!(unshare.is_none_or(|rules| rules.len() == 1), "unshare is conditional");
    }
    let rw = rules(ThreadKind::Device(&fs::WRITABLE_THREAD)).unwrap();
    for nr in [libc::SYS_fchmod, libc::SYS_fchown, libc::SYS_utimensat] {
        assert!(rw.contains_key(&nr), "the writable worker cannot call {nr}");
    }
}

/// Below Landlock 6, which scopes signals to the VMM, nothing but seccomp
/// keeps a VMM thread from signalling other processes (`landlock::gaps`:
/// "no VMM thread may ... send a signal"). Every kind's filter but
/// main's and irq-watch's allowed fcntl whatever its command: F_SETOWN
/// names any process (or, negative, any process group) of the user,
/// F_SETSIG any signal, and O_ASYNC has the kernel send it whenever the
/// descriptor becomes readable. Here a vCPU thread (the guest's MMIO
/// exits run there) has SIGTERM sent to another process by a socket of
/// the VMM (as the broker's); F_SETLEASE and F_NOTIFY send it the same
/// way. Kernels before 6.12 (Landlock below 6) are most hosts'. The
/// filters now take only the commands the VMM uses.
#[test]
fn below_landlock_6_no_thread_signals_another_process() {
    use std::os::fd::AsRawFd;
    /// `F_SETSIG` (Linux), which the libc crate does not name.
    const F_SETSIG: libc::c_int = 10;

    let mut victim = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = i32::try_from(victim.id()).unwrap();
    let (owned, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let ended = under_the_filter(ThreadKind::Vcpu, Landlocked { abi: 5 }, || {
        let fd = owned.as_raw_fd();
        // SAFETY: these fcntl commands take integers, no pointers.
        unsafe {
            libc::fcntl(fd, libc::F_SETOWN, pid);
            libc::fcntl(fd, F_SETSIG, libc::SIGTERM);
            libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC);
        }
        // SAFETY: write reads one byte of a static.
        unsafe { libc::write(peer.as_raw_fd(), b"x".as_ptr().cast(), 1) };
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut status = None;
    while status.is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        status = victim.try_wait().unwrap();
    }
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(status, None, "another process was signalled from a vCPU's filter (the child: {ended})");
}

/// Calls that would reach past the filters, the process or the jail: no
/// kind has them. io_uring runs operations no filter sees; bpf, ptrace,
/// process_vm_*, pidfd_getfd and the keyrings reach other processes or
/// the kernel's state; mounts, namespaces, chroot and file handles
/// (open_by_handle_at finds any file of a filesystem, Landlock's rules
/// aside) change what paths mean; personality's READ_IMPLIES_EXEC would
/// make readable memory executable behind mmap's PROT_EXEC check;
/// userfaultfd and perf_event_open widen what a bug in the kernel gives;
/// signals by other means than tgkill go outside the process. (The
/// launcher's clone, clone3, unshare, prctl, seccomp and Landlock calls
/// start threads, and are tested above.)
#[test]
fn no_kind_may_reach_past_the_filters() {
    let beyond = [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_open,
        libc::SYS_pidfd_getfd,
        libc::SYS_pidfd_send_signal,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_setns,
        libc::SYS_chroot,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_personality,
        libc::SYS_memfd_create,
        libc::SYS_socketpair,
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_setuid,
        libc::SYS_setresuid,
        libc::SYS_setgid,
        libc::SYS_setresgid,
        libc::SYS_capset,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_kexec_load,
        libc::SYS_modify_ldt,
        libc::SYS_pkey_mprotect,
        libc::SYS_remap_file_pages,
        libc::SYS_vmsplice,
    ];
    for (landlocked, _) in JAILS {
        for kind in kinds() {
            let allowed = seccomp::rules(kind, &device_threads(), landlocked).unwrap();
            for nr in beyond {
                assert!(!allowed.contains_key(&nr), "{} may call {nr} under {landlocked:?}", kind.name());
            }
        }
    }
}

/// Any thread's code can have the launcher start it under the launcher's
/// own kind (`jail::no_thread_escapes_its_confinement_through_the_launcher`),
/// so the launcher's filter is what code in the VMM gets at most. Below
/// Landlock 3, which judges an `O_RDONLY | O_TRUNC` open as a read, the
/// workers' filters refuse O_TRUNC so that no read-only share's file is
/// emptied; the launcher's openat took any flag (no worker needs
/// O_TRUNC), and under it a thread emptied a file it may only read.
#[test]
fn below_landlock_3_the_launcher_opens_nothing_to_truncate() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workspace-file");
    std::fs::write(&file, b"kept").unwrap();
    let ended = under_the_filter(ThreadKind::Launcher, Landlocked { abi: 2 }, || {
        let _ = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(&file);
    });
    assert_eq!(std::fs::read(&file).unwrap(), b"kept", "a file was emptied under the launcher's filter ({ended})");
}

/// Runs `f` in a child process under the filter of `kind` built for a
/// jail of `landlocked` (no Landlock ruleset: what the filter alone
/// allows), and says how the child ended: a call the filter refuses
/// kills it with SIGSYS (no report is installed), never the test.
fn under_the_filter(kind: ThreadKind, landlocked: Landlocked, f: impl FnOnce()) -> String {
    let filters = Filters::build(&device_threads(), landlocked).unwrap();
    // SAFETY: the child has only this thread, and glibc's fork leaves its
    // allocator usable there; it ends with _exit, never returning into
    // the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        filters.apply(kind).unwrap();
        f();
        // SAFETY: _exit ends the child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waitpid writes the child's status into `status`.
    assert_eq!(unsafe { libc::waitpid(pid, &raw mut status, 0) }, pid);
    if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS {
        "stopped by its filter".into()
    } else {
        format!("wait status {status:#x}")
    }
}

/// The launcher's filter (every thread's, inherited) makes threads and
/// nothing else: a thread starts as the C library starts one (`clone3`
/// fails with ENOSYS, then `clone` with a thread's flags), and a fork,
/// whose child would outlive the VMM with its descriptors and Landlock
/// rights, is stopped.
#[test]
fn the_launcher_makes_threads_and_no_process() {
    let started = under_the_filter(ThreadKind::Launcher, Landlocked { abi: 6 }, || {
        // SAFETY: clone3 with a null argument reads nothing; the filter
        // answers before the kernel looks.
        let clone3 = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if clone3 != -1 || errno != Some(libc::ENOSYS) {
            // SAFETY: _exit ends the child at once.
            unsafe { libc::_exit(3) };
        }
        if std::thread::spawn(|| 7).join().ok() != Some(7) {
            // SAFETY: as above.
            unsafe { libc::_exit(4) };
        }
    });
    assert_eq!(started, "wait status 0x0", "a thread under the launcher's filter");
    let forked = under_the_filter(ThreadKind::Launcher, Landlocked { abi: 6 }, || {
        // SAFETY: a fork's child only exits.
        let pid =
            unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) };
        if pid == 0 {
            // SAFETY: _exit ends the forked child at once.
            unsafe { libc::_exit(0) };
        }
    });
    assert_eq!(forked, "stopped by its filter", "a fork under the launcher's filter");
}

/// Landlock governs opens, not what a path tells without one: no kind
/// reads extended attributes (the file servers serve none), or asks
/// statfs or access of a path; the servers use fstatfs and their own
/// check on a stat.
#[test]
fn no_kind_reads_attributes_by_path() {
    for kind in kinds() {
        let allowed = rules(kind).unwrap();
        for nr in [
            libc::SYS_getxattr,
            libc::SYS_lgetxattr,
            libc::SYS_listxattr,
            libc::SYS_llistxattr,
            libc::SYS_fgetxattr,
            libc::SYS_flistxattr,
            libc::SYS_statfs,
            libc::SYS_access,
            libc::SYS_faccessat,
            libc::SYS_faccessat2,
        ] {
            assert!(!allowed.contains_key(&nr), "{} may call {nr}", kind.name());
        }
    }
}
