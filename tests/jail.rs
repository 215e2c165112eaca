//! The VMM's jail, natively: `stockade vmm --jail-probe` closes the very jail
//! the VMM closes (from a VM description like the supervisor writes) and
//! then attempts one forbidden operation from a device worker thread.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};

use crate::util::{TempDir, stockade_bin};

/// Landlock and seccomp are present, or why the test cannot run.
fn jail_available() -> Result<(), String> {
    let actions = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
        .map_err(|_| "this kernel has no seccomp filters".to_string())?;
    if !actions.split_whitespace().any(|a| a == "trap") {
        return Err("this kernel's seccomp has no trap action".into());
    }
    // SAFETY: the version query reads no memory.
    let abi = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    if abi < 1 {
        return Err("this kernel has no Landlock".into());
    }
    Ok(())
}

fn require(test: &str) -> bool {
    match jail_available() {
        Ok(()) => true,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => panic!("{test}: required under CI but {why}"),
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

struct Setup {
    dir: TempDir,
    /// The supervisor's end of the vsock broker, so the probe's VMM makes
    /// its devices as a real one does (nothing is ever dialed).
    broker: UnixListener,
}

impl Setup {
    /// A read-only share holding a secret, a writable share, a "home"
    /// with an ssh key that is shared with nobody, and a copy of the init
    /// the boot device serves (never the test's own stockade binary).
    fn new(name: &str) -> Setup {
        Setup::with(name, true)
    }

    /// As `new`, the writable share left out of the VM if not `writable`.
    fn with(name: &str, writable: bool) -> Setup {
        let dir = TempDir::new(name);
        for sub in ["share", "rw", "home/.ssh", "bin"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("share/file"), "shared\n").unwrap();
        std::fs::write(dir.path().join("share/secret"), "hidden\n").unwrap();
        std::fs::write(dir.path().join("rw/file"), "writable\n").unwrap();
        std::fs::write(dir.path().join("home/.ssh/id_ed25519"), "secret\n").unwrap();
        std::fs::write(dir.path().join("bin/init"), "the guest's init\n").unwrap();
        set_mode(&dir.path().join("bin/init"), 0o755);
        let p = |s: &str| dir.path().join(s).display().to_string();
        let mut shares = vec![serde_json::json!({ "guest_path": "/w", "host_path": p("share"), "writable": false })];
        if writable {
            shares.push(serde_json::json!({ "guest_path": "/rw", "host_path": p("rw"), "writable": true }));
        }
        let config = serde_json::json!({
            "kernel": "/nonexistent/vmlinux",
            "init": p("bin/init"),
            "vcpus": 1,
            "memory_bytes": 256u64 << 20,
            "kernel_log": p("kernel.log"),
            "vsock_broker": p("broker.sock"),
            "shares": shares,
            "secrets": [p("share/secret")],
            "disk": null,
            "jail": true,
            "verbose_kernel": false,
        });
        std::fs::write(dir.path().join("vmm.json"), config.to_string()).unwrap();
        let broker = UnixListener::bind(dir.path().join("broker.sock")).unwrap();
        broker.set_nonblocking(true).unwrap();
        Setup { dir, broker }
    }

    fn path(&self, sub: &str) -> String {
        self.dir.path().join(sub).display().to_string()
    }

    fn probe(&self, probe: &str) -> Output {
        let config = self.dir.path().join("vmm.json");
        let out = Command::new(stockade_bin())
            .args(["vmm", "--config", &config.display().to_string(), "--jail-probe", probe])
            .current_dir(self.dir.path())
            .env_clear()
            .output()
            .expect("run stockade vmm");
        // The VMM connected once: its connection is taken, so that the
        // listener's backlog never fills and blocks the next probe.
        while self.broker.accept().is_ok() {}
        out
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_result(out: &Output, want: &str) {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{}", text(out));
}

#[test]
fn files_outside_the_shares_cannot_be_opened() {
    if !require("files_outside_the_shares_cannot_be_opened") {
        return;
    }
    let s = Setup::new("jail-open");
    assert_result(&s.probe(&format!("open:{}", s.path("share/file"))), "allowed");
    assert_result(
        &s.probe(&format!("open:{}", s.path("home/.ssh/id_ed25519"))),
        "denied: Permission denied (os error 13)",
    );
    assert_result(&s.probe("open:/etc/passwd"), "denied: Permission denied (os error 13)");
}

#[test]
fn read_only_shares_cannot_be_written_and_writable_ones_can() {
    if !require("read_only_shares_cannot_be_written_and_writable_ones_can") {
        return;
    }
    let s = Setup::new("jail-write");
    assert_result(&s.probe(&format!("write:{}", s.path("share/file"))), "denied: Permission denied (os error 13)");
    assert_result(&s.probe(&format!("write:{}", s.path("rw/file"))), "allowed");
    assert_eq!(std::fs::read_to_string(Path::new(&s.path("share/file"))).unwrap(), "shared\n");
}

/// Landlock below ABI 3 judges an `O_RDONLY | O_TRUNC` open as a read:
/// the writable share's worker, which opens anything in its share, must
/// not open with O_TRUNC at all, or code running in it could empty the
/// workspace's files. Its filter refuses the flag (it truncates through a
/// descriptor opened for writing): the call ends the VMM, on any share.
#[test]
fn the_writable_worker_cannot_open_to_truncate() {
    if !require("the_writable_worker_cannot_open_to_truncate") {
        return;
    }
    let s = Setup::new("jail-truncate-rw");
    for share in ["share/file", "rw/file"] {
        let out = s.probe(&format!("truncate-rw:{}", s.path(share)));
        assert_eq!(out.status.code(), Some(159), "{}", text(&out));
        let forbidden =
            format!("virtio-fs (rw) thread made system call {}, which its seccomp allowlist forbids", libc::SYS_openat);
        assert!(String::from_utf8_lossy(&out.stderr).contains(&forbidden), "{}", text(&out));
    }
    assert_eq!(std::fs::read_to_string(s.path("share/file")).unwrap(), "shared\n");
    assert_eq!(std::fs::read_to_string(s.path("rw/file")).unwrap(), "writable\n");
    assert_result(&s.probe(&format!("write:{}", s.path("rw/file"))), "allowed");
}

/// Code running in a writable share's worker changed the mode of a file
/// in a read-only share (the workspace): Landlock governs opens, making
/// and removing, not chmod, and that worker's filter allowed fchmodat for
/// its own share (chown and utimensat likewise). A read-only share is
/// never changed, whatever a device thread runs (README: "write only
/// those a policy mounts `rw`"). Now that worker changes modes only
/// through descriptors, and its own Landlock layer opens nothing outside
/// the writable shares; fchmodat ends the VMM.
#[test]
fn the_writable_worker_cannot_change_a_read_only_shares_modes() {
    if !require("the_writable_worker_cannot_change_a_read_only_shares_modes") {
        return;
    }
    let s = Setup::new("jail-chmod");
    let before = mode(&s, "share/file");
    assert_result(&s.probe(&format!("chmod:{}", s.path("rw/file"))), "allowed");
    let out = s.probe(&format!("chmod:{}", s.path("share/file")));
    assert_eq!(mode(&s, "share/file"), before, "the read-only share's file changed mode: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("denied"), "{}", text(&out));
    let out = s.probe(&format!("chmod-at:{}", s.path("share/file")));
    stopped_by_filter(&out, "virtio-fs (rw)", libc::SYS_fchmodat);
    assert_eq!(mode(&s, "share/file"), before, "the read-only share's file changed mode: {}", text(&out));
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(s: &Setup, file: &str) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(s.path(file)).unwrap().permissions().mode()
}

/// A file's change time and modification time, to the nanosecond.
fn times(s: &Setup, file: &str) -> (i64, i64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(s.path(file)).unwrap();
    (m.ctime(), m.ctime_nsec(), m.mtime(), m.mtime_nsec())
}

/// The VMM ended as its SIGSYS report does, naming `thread` and `nr`.
fn stopped_by_filter(out: &Output, thread: &str, nr: i64) {
    assert_eq!(out.status.code(), Some(159), "{}", text(out));
    let forbidden = format!("{thread} thread made system call {nr}, which its seccomp allowlist forbids");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&forbidden), "{}", text(out));
    assert!(out.stdout.is_empty(), "the call returned: {}", text(out));
}

/// chown and utimensat as chmod above: the writable worker can neither
/// open a read-only share's file to fchown or futimens it, nor name it
/// to fchownat or utimensat (the VMM ends), while its own share's files
/// are still given to their owner and touched through a descriptor.
#[test]
fn the_writable_worker_cannot_chown_or_touch_a_read_only_shares_files() {
    if !require("the_writable_worker_cannot_chown_or_touch_a_read_only_shares_files") {
        return;
    }
    let s = Setup::new("jail-chown-touch");
    let before = times(&s, "share/file");
    for probe in ["chown", "touch"] {
        let out = s.probe(&format!("{probe}:{}", s.path("share/file")));
        assert_result(&out, "denied: Permission denied (os error 13)");
    }
    for (probe, nr) in [("chown-at", libc::SYS_fchownat), ("touch-at", libc::SYS_utimensat)] {
        for share in ["share/file", "rw/file"] {
            stopped_by_filter(&s.probe(&format!("{probe}:{}", s.path(share))), "virtio-fs (rw)", nr);
        }
    }
    assert_eq!(times(&s, "share/file"), before, "the read-only share's file changed");

    let rw = times(&s, "rw/file");
    assert_result(&s.probe(&format!("chown:{}", s.path("rw/file"))), "allowed");
    assert_result(&s.probe(&format!("touch:{}", s.path("rw/file"))), "allowed");
    let after = times(&s, "rw/file");
    assert_ne!((after.0, after.1), (rw.0, rw.1), "the writable share's file was given to its owner");
    assert_eq!((after.2, after.3), (1_000_000_000, 0), "and touched");
}

/// What the read-only shares' worker opens for reading, in its own
/// descriptor table, has no number the writable shares' worker can
/// fchmod (in a shared table it would, whatever its Landlock layer).
#[test]
fn the_writable_worker_cannot_reach_what_the_read_only_worker_opened() {
    if !require("the_writable_worker_cannot_reach_what_the_read_only_worker_opened") {
        return;
    }
    let s = Setup::new("jail-reach");
    let before = mode(&s, "share/file");
    let out = s.probe(&format!("reach:{}", s.path("share/file")));
    assert_eq!(mode(&s, "share/file"), before, "the read-only share's file changed mode: {}", text(&out));
    assert_result(&out, "denied: Bad file descriptor (os error 9)");
}

#[test]
fn sockets_and_programs_stop_the_vmm() {
    if !require("sockets_and_programs_stop_the_vmm") {
        return;
    }
    let s = Setup::new("jail-sys");
    for (probe, nr) in [("socket", libc::SYS_socket), ("exec:/bin/true", libc::SYS_execve)] {
        let out = s.probe(probe);
        assert_eq!(out.status.code(), Some(159), "{probe}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("virtio-fs thread made system call {nr}, which its seccomp allowlist forbids")),
            "{probe}: {}",
            text(&out)
        );
        assert!(out.stdout.is_empty(), "{probe}: the operation returned: {}", text(&out));
    }
}

#[test]
fn no_descriptor_survives_an_exec() {
    if !require("no_descriptor_survives_an_exec") {
        return;
    }
    assert_result(&Setup::new("jail-fds").probe("fds"), "fds: all close-on-exec");
}

#[test]
fn the_read_only_worker_cannot_open_to_truncate_even_where_landlock_would_let_it() {
    if !require("the_read_only_worker_cannot_open_to_truncate_even_where_landlock_would_let_it") {
        return;
    }
    let s = Setup::new("jail-trunc");
    // The writable share is one Landlock lets this process truncate; the
    // read-only worker still may not, so a Landlock ABI below 3 (no
    // truncate right) leaves no hole: seccomp stops the open itself.
    for share in ["share/file", "rw/file"] {
        let out = s.probe(&format!("truncate:{}", s.path(share)));
        assert_eq!(out.status.code(), Some(159), "{share}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "virtio-fs thread made system call {}, which its seccomp allowlist forbids",
                libc::SYS_openat
            )),
            "{share}: {}",
            text(&out)
        );
    }
    assert_eq!(std::fs::read_to_string(s.path("share/file")).unwrap(), "shared\n");
    assert_eq!(std::fs::read_to_string(s.path("rw/file")).unwrap(), "writable\n");
    assert_result(&s.probe(&format!("open:{}", s.path("share/file"))), "allowed");
}

/// The Landlock ABI of this kernel.
fn landlock_abi() -> i64 {
    // SAFETY: the version query reads no memory.
    unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) }
}

/// openat2's flags are out of seccomp's reach: the read-only worker may
/// call it only where Landlock refuses it every change an open could make
/// (its own layer, from ABI 3 on), and there a truncating open is refused
/// on every share, the writable one too; below ABI 3 the call itself ends
/// the VMM.
#[test]
fn the_read_only_worker_calls_openat2_only_where_landlock_refuses_every_change() {
    if !require("the_read_only_worker_calls_openat2_only_where_landlock_refuses_every_change") {
        return;
    }
    let killed = |out: &Output| {
        assert_eq!(out.status.code(), Some(159), "{}", text(out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let forbidden =
            format!("virtio-fs thread made system call {}, which its seccomp allowlist forbids", libc::SYS_openat2);
        assert!(stderr.contains(&forbidden), "{}", text(out));
    };
    for writable in [true, false] {
        let s = Setup::with("jail-openat2", writable);
        for share in ["share/file", "rw/file"] {
            let out = s.probe(&format!("openat2:{}", s.path(share)));
            if landlock_abi() >= 3 {
                assert_result(&out, "denied: Permission denied (os error 13)");
            } else {
                killed(&out);
            }
        }
        assert_eq!(std::fs::read_to_string(s.path("share/file")).unwrap(), "shared\n");
        assert_eq!(std::fs::read_to_string(s.path("rw/file")).unwrap(), "writable\n");
        assert_result(&s.probe(&format!("open:{}", s.path("share/file"))), "allowed");
    }
}

/// A burst of guest writes allocates and frees many small buffers on the
/// disk worker, which may not open files: the C library's giving that
/// memory back must not open one (glibc reads
/// /proc/sys/vm/overcommit_memory the first time a thread's heap shrinks),
/// or the VMM stops with SIGSYS in the middle of the guest's work.
#[test]
fn the_disk_worker_frees_a_burst_of_buffers_without_opening_a_file() {
    if !require("the_disk_worker_frees_a_burst_of_buffers_without_opening_a_file") {
        return;
    }
    assert_result(&Setup::new("jail-heap").probe("heap-trim"), "freed");
}

/// The descriptors of a read-only share the read-only device opened
/// before the jail closed (its root, `O_PATH`) are in the table the
/// writable shares' worker shares with the process: through them it
/// changes nothing (EBADF for fchmod, fchown and futimens on `O_PATH`;
/// its own Landlock layer refuses opens, reopens through /proc, making,
/// removing, moving and linking beneath them). Nor does it link the
/// init the boot device holds into a writable share, where it could be
/// opened for writing (Landlock refuses the link: EXDEV).
#[test]
fn the_writable_worker_changes_nothing_through_descriptors_opened_before_the_jail() {
    if !require("the_writable_worker_changes_nothing_through_descriptors_opened_before_the_jail") {
        return;
    }
    let s = Setup::new("jail-roots");
    let before = (mode(&s, "share/file"), times(&s, "share/file"), times(&s, "share"));
    assert_result(&s.probe(&format!("roots:{}", s.path("share"))), "denied: every change");
    assert_eq!((mode(&s, "share/file"), times(&s, "share/file"), times(&s, "share")), before);
    let mut names: Vec<_> = std::fs::read_dir(s.path("share")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["file", "secret"]);
    let linked = s.path("rw/init");
    assert_result(&s.probe(&format!("init-link:{linked}")), "denied: Invalid cross-device link (os error 18)");
    assert!(!Path::new(&linked).exists());
}

/// No thread signals another process through a descriptor: the
/// writable shares' worker sets another process as the owner of a
/// writable share's directory (F_SETOWN), SIGTERM as the signal and a
/// watch for files made there (F_NOTIFY), then would make one. Landlock 6
/// scopes such signals to the VMM; below it only seccomp stands there,
/// and the filters take no F_SETOWN at any ABI: the VMM stops, and the
/// other process lives on (`seccomp_tests::below_landlock_6_no_thread_signals_another_process`).
#[test]
fn no_thread_signals_another_process_through_a_descriptor() {
    if !require("no_thread_signals_another_process_through_a_descriptor") {
        return;
    }
    let s = Setup::new("jail-signal");
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let out = s.probe(&format!("signal:{}:{}", victim.id(), s.path("rw")));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let status = victim.try_wait().unwrap();
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(status, None, "the other process was signalled: {}", text(&out));
    assert_eq!(out.status.code(), Some(159), "{}", text(&out));
    let refused = format!("made system call {}, which its seccomp allowlist forbids", libc::SYS_fcntl);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&refused), "{}", text(&out));
    assert!(!Path::new(&s.path("rw/notified")).exists(), "{}", text(&out));
}

/// A thread of the VMM cannot take up another kind's confinement: code
/// running in the read-only shares' worker (the file server every run
/// has) has the thread launcher start a thread under the launcher's own
/// kind, whose filter is every kind's together (fchmod, fchown, futimens
/// and openat with any flag among them) and which takes up no Landlock
/// layer, so it opens a read-only share's file for reading (the process's
/// ruleset lets it) and fchmods it; or under a device thread it makes up
/// at run time, named as the writable shares' worker (that filter) with
/// `Openat::Never` (no layer). `jail::thread::spawn` takes any kind from
/// any thread, and the launcher, its requests and its stack lie in the
/// memory every thread shares, so the per-kind filters and layers bound
/// no code running in one thread: what the process's Landlock ruleset
/// and the launcher's filter allow together, it can do (README: chmod,
/// chown or touch a read-only share's file from the writable shares'
/// server is held).
#[test]
#[ignore = "finding: any thread has the launcher run its code under the launcher's filter, without the per-kind Landlock layers, and changes a read-only share's modes, owners and times"]
fn no_thread_escapes_its_confinement_through_the_launcher() {
    if !require("no_thread_escapes_its_confinement_through_the_launcher") {
        return;
    }
    let s = Setup::new("jail-launch");
    let file = Path::new(&s.path("share/file")).to_owned();
    let before = mode(&s, "share/file");
    let mut changed = Vec::new();
    for probe in ["launch-chmod", "forged-chmod"] {
        let out = s.probe(&format!("{probe}:{}", file.display()));
        if mode(&s, "share/file") != before || !String::from_utf8_lossy(&out.stdout).starts_with("denied") {
            changed.push(format!("{probe}: {}", text(&out)));
            set_mode(&file, before & 0o7777);
        }
    }
    assert!(changed.is_empty(), "the read-only share's file changed mode:\n{}", changed.join("\n"));
}

/// Nothing the VMM starts outlives it: the supervisor ends a run by
/// killing the VMM's pid, and a process forked from it would go on with
/// its descriptors (the shares, the disk, the broker socket) and its
/// Landlock rights (writing the writable shares) after the run, while
/// the user reviews its changes and in later runs. The launcher's filter
/// allowed clone and clone3 whatever their flags (seccomp cannot read
/// clone3's), so code in any thread that reaches the launcher (see
/// `no_thread_escapes_its_confinement_through_the_launcher`) forked; the
/// child wrote a writable share two seconds after the VMM exited. Now
/// clone3 fails and clone makes only threads of the VMM: the fork stops it.
#[test]
fn no_process_outlives_the_vmm() {
    if !require("no_process_outlives_the_vmm") {
        return;
    }
    let s = Setup::new("jail-fork");
    let marker = s.path("rw/outlived");
    let out = s.probe(&format!("fork:{marker}"));
    assert!(!Path::new(&marker).exists(), "made before the VMM exited: {}", text(&out));
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert!(!Path::new(&marker).exists(), "a process forked in the VMM wrote {marker} after it exited: {}", text(&out));
}

/// What the VMM opened before its jail closed is in the descriptor table
/// the writable shares' worker shares with the process: the boot device
/// held the guest's init, the host's own stockade binary, open for
/// reading, and code in that worker fchmodded it by its number (Landlock
/// governs opens, not chmod): setuid and world-writable here, for the
/// next user of the host who runs it, or any other mode; fchown and
/// futimens alike. Only the host's files the writable shares hold may
/// change: the boot device now pins the init with an `O_PATH`
/// descriptor (EBADF) and reads it through one in its own table.
#[test]
fn the_writable_worker_cannot_change_the_init_the_boot_device_holds() {
    if !require("the_writable_worker_cannot_change_the_init_the_boot_device_holds") {
        return;
    }
    let s = Setup::new("jail-init");
    let before = mode(&s, "bin/init");
    let out = s.probe(&format!("init-chmod:{}", s.path("bin/init")));
    assert_eq!(mode(&s, "bin/init"), before, "the host's init changed mode: {}", text(&out));
    assert_result(&out, "denied: Bad file descriptor (os error 9)");
    // The read-only worker (the boot device's) may read it, to reopen it.
    assert_result(&s.probe(&format!("open:{}", s.path("bin/init"))), "allowed");
}

/// Whether this host lets the tests make a VM.
fn kvm_available() -> bool {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok()
}

/// A run that records a template kept the template's memory and state
/// files open for writing from before its jail closes until it exited,
/// long after the template point, while the command ran (now they close
/// when the recording ends, at the template point: the probe ends it as
/// the guest would before its code runs); the supervisor
/// adopts the recording once the VMM has exited, and later runs of the
/// same shape (whatever their workspace, policy or credentials: the key
/// holds no share's path) resume the guest memory it holds. Code in any
/// thread writes it by the descriptor's number (every filter has write,
/// the file servers' lseek too): here the read-only shares' worker
/// writes the start of guest memory. A guest that gets code into the VMM
/// of the run that records would come back in every later run.
#[test]
fn no_thread_can_rewrite_the_template_being_recorded() {
    if !require("no_thread_can_rewrite_the_template_being_recorded") {
        return;
    }
    if !kvm_available() {
        eprintln!("skipping no_thread_can_rewrite_the_template_being_recorded: no /dev/kvm");
        return;
    }
    let s = Setup::new("jail-template");
    let dir = s.path("template");
    std::fs::create_dir(&dir).unwrap();
    let out = s.probe(&format!("template-write:{dir}"));
    let memory = std::fs::read(Path::new(&dir).join("memory")).unwrap();
    assert!(!memory.is_empty(), "the recording was not made: {}", text(&out));
    assert!(memory.iter().take(64).all(|b| *b == 0), "the template's memory was written: {}", text(&out));
}

/// The host's secrets under a share (rootfs/host.toml's `hide`: host keys,
/// shadow files, the host's passwd, group, hostname, machine-id) are
/// refused by the file servers' own checks; the jail grants the servers
/// every file of each share, so code running in the read-only shares'
/// worker opens and reads them (and could hand them to the guest through
/// its memory). Landlock grants trees and cannot take a file out of one.
#[test]
#[ignore = "finding: the jail lets the file servers open the secrets their shares hold; only the servers' own checks refuse them"]
fn the_file_servers_cannot_open_a_secret_of_their_shares() {
    if !require("the_file_servers_cannot_open_a_secret_of_their_shares") {
        return;
    }
    let s = Setup::new("jail-secret");
    assert_result(&s.probe(&format!("open:{}", s.path("share/secret"))), "denied: Permission denied (os error 13)");
}

/// Landlock governs opens, not what a path tells without one: code in a
/// file server read the extended attributes of any host file by path
/// (getxattr and lgetxattr, listxattr and llistxattr were in its filter,
/// though the servers serve no extended attributes and call none), where
/// browsers, wget and curl keep the URL a file was downloaded from
/// (`user.xdg.origin.url`, tokens in its query included). No filter has
/// them now: the call stops the VMM.
#[test]
fn files_outside_the_shares_tell_the_file_servers_nothing() {
    if !require("files_outside_the_shares_tell_the_file_servers_nothing") {
        return;
    }
    let s = Setup::new("jail-metadata");
    let key = s.path("home/.ssh/id_ed25519");
    let c = |p: &str| std::ffi::CString::new(p).unwrap();
    let value = b"https://example.com/download?token=SECRET";
    // SAFETY: the strings are NUL-terminated; setxattr reads `value`.
    let set =
        unsafe { libc::setxattr(c(&key).as_ptr(), c"user.origin".as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if set != 0 {
        eprintln!("this filesystem takes no user extended attributes: the call is tried on none");
    }
    let out = s.probe(&format!("xattr:{key}"));
    assert!(!String::from_utf8_lossy(&out.stdout).starts_with("read"), "{}", text(&out));
    assert_eq!(out.status.code(), Some(159), "{}", text(&out));
}

/// Where any host symlink leads, readlinkat with a path tells code in a
/// file server, as stat tells any file's size and times: the servers
/// read links and stat names relative to descriptors they hold, and
/// seccomp cannot read the path to tell those calls from one that names
/// any file (a pointer the filter could compare lies in memory the code
/// can remap). Only a view of the host holding nothing but the shares
/// (a mount namespace) would stop it.
#[test]
#[ignore = "finding: the file servers read the link targets (and stat) any host file by path"]
fn links_outside_the_shares_tell_the_file_servers_nothing() {
    if !require("links_outside_the_shares_tell_the_file_servers_nothing") {
        return;
    }
    let s = Setup::new("jail-readlink");
    std::os::unix::fs::symlink("id_ed25519.backup-of-prod", s.path("home/.ssh/current")).unwrap();
    let out = s.probe(&format!("readlink:{}", s.path("home/.ssh/current")));
    assert!(!String::from_utf8_lossy(&out.stdout).starts_with("read"), "{}", text(&out));
}

/// The filters are for the 64-bit system call table and check the
/// architecture first: a call through the 32-bit entry (`int 0x80`),
/// whose numbers mean other calls (its execve is the 64-bit munmap, which
/// every filter allows), ends the process at once, reported or not.
#[test]
fn the_32_bit_system_calls_stop_the_vmm() {
    if !require("the_32_bit_system_calls_stop_the_vmm") {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let s = Setup::new("jail-exec32");
    let out = s.probe("exec32:/bin/true");
    assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{}", text(&out));
    assert!(out.stdout.is_empty(), "the call returned: {}", text(&out));
}

/// The VMM's logs are capped (README: `vmm.log` and `kernel.log` at
/// 4 MiB) by the writers the VMM's own code writes them through; the
/// descriptors themselves are plain files on the host (the supervisor
/// hands the VMM `vmm.log` as its stderr), and every filter allows write
/// on any descriptor. Code in any thread, here a vCPU's, writes the host
/// disk full through them, past the cap and past the free-space margin
/// the supervisor keeps (so do the writable shares' worker past its
/// share's limit, and any thread through the template files).
#[test]
#[ignore = "finding: any VMM thread writes vmm.log (and kernel.log) past its cap, filling the host disk"]
fn no_thread_writes_the_vmm_log_past_its_cap() {
    if !require("no_thread_writes_the_vmm_log_past_its_cap") {
        return;
    }
    const CAP: u64 = 4 << 20;
    let s = Setup::new("jail-flood");
    let log = std::fs::File::create(s.path("vmm.log")).unwrap();
    let config = s.path("vmm.json");
    let out = Command::new(stockade_bin())
        .args(["vmm", "--config", &config, "--jail-probe", &format!("flood:{}", 3 * CAP)])
        .current_dir(s.dir.path())
        .env_clear()
        .stderr(log)
        .output()
        .expect("run stockade vmm");
    let written = std::fs::metadata(s.path("vmm.log")).unwrap().len();
    assert!(written <= CAP + (64 << 10), "vmm.log holds {written} bytes: {}", text(&out));
}
