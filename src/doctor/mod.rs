//! `stockade doctor`: what this host offers and whether `stockade run` can work
//! here. Each check yields a status, a finding and, when something is wrong, the
//! fix. Gathering facts and judging them are kept apart so the judgement is
//! testable without the host it describes.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::host::kernel::{self, GuestKernel, KernelError, KernelIdentity};
use crate::host::kvm::{self, DeviceAccess, KvmKind};
use crate::jail;
use crate::paths::Dirs;
use crate::session::{self, retention};
use crate::util::space;
use crate::util::text::human_bytes;
use crate::vmm::devices::virtio::fs::{self, bounded::FdBudget};
use crate::vmm::probe;

/// Below this much free space, sessions (scratch disks, change sets) cannot be trusted to fit.
const MIN_FREE_BYTES: u64 = 1 << 30;
/// A session store larger than this is worth pruning.
const LARGE_STORE_BYTES: u64 = 4 << 30;
/// The probe guest runs four instructions; seconds mean KVM is not executing guest code.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub finding: String,
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, finding: impl Into<String>) -> Check {
        Check { name, status: Status::Ok, finding: finding.into(), fix: None }
    }
    fn fail(name: &'static str, finding: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Fail, finding: finding.into(), fix: Some(fix.into()) }
    }
    fn warn(name: &'static str, finding: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Warn, finding: finding.into(), fix: Some(fix.into()) }
    }
}

/// Everything doctor looked at, gathered from the host.
pub struct Facts {
    pub device: DeviceAccess,
    pub kind: KvmKind,
    pub kernel: Result<(GuestKernel, KernelIdentity), KernelError>,
    pub probe: Option<Result<probe::ProbeOutcome, probe::ProbeError>>,
    pub landlock: std::io::Result<u32>,
    pub seccomp: Option<Vec<String>>,
    pub space: std::io::Result<(std::path::PathBuf, u64)>,
    /// The session store: its directory and what it holds.
    pub store: (std::path::PathBuf, Result<retention::Survey, String>),
    /// RLIMIT_NOFILE, soft and hard.
    pub open_files: std::io::Result<(u64, u64)>,
    /// The sessions waiting to be recovered (see `session::is_interrupted`).
    pub interrupted: Vec<String>,
}

/// Looks at the host. The probe guest runs only when /dev/kvm is usable.
pub fn gather(dirs: &Dirs, kernel_path: Option<&Path>) -> Facts {
    let device = kvm::check_device();
    let probe = matches!(device, DeviceAccess::Usable).then(|| probe::run_with_timeout(PROBE_TIMEOUT));
    Facts {
        device,
        kind: kvm::detect_kind(),
        kernel: kernel::locate(dirs, kernel_path).and_then(|k| k.identity().map(|id| (k, id))),
        probe,
        landlock: jail::landlock::abi_version(),
        seccomp: jail::seccomp::available_actions(),
        space: space::available_bytes(&dirs.data),
        store: (
            session::sessions_dir(&dirs.data),
            retention::survey(&dirs.data, SystemTime::now()).map_err(|e| error_chain(&e)),
        ),
        open_files: fs::bounded::open_file_limit(),
        interrupted: session::list(&dirs.data)
            .unwrap_or_default()
            .into_iter()
            .filter(|s| session::is_interrupted(&s.dir))
            .map(|s| s.id)
            .collect(),
    }
}

/// Judges the facts.
pub fn judge(facts: &Facts) -> Vec<Check> {
    let mut checks = Vec::new();

    checks.push(match &facts.device {
        DeviceAccess::Usable => Check::ok("/dev/kvm", "present and usable by this user"),
        DeviceAccess::Missing => Check::fail(
            "/dev/kvm",
            "missing",
            "enable virtualization (VT-x/AMD-V) in the firmware and load kvm_intel or kvm_amd; \
             in a cloud VM, choose an instance type with nested virtualization",
        ),
        DeviceAccess::PermissionDenied => {
            Check::fail("/dev/kvm", "present, but this user cannot open it", kvm::permission_fix())
        }
        DeviceAccess::Failed(e) => {
            Check::fail("/dev/kvm", format!("cannot open it: {e}"), "check dmesg for KVM errors")
        }
    });

    let pvm_kernel = facts.kernel.as_ref().ok().and_then(|(k, _)| k.pvm_guest) == Some(true);
    checks.push(match facts.kind {
        kind if kind.boots_standard_guest() => Check::ok("KVM", format!("{kind}; standard guest kernels boot")),
        KvmKind::Pvm if pvm_kernel => Check::ok("KVM", format!("{}; the guest kernel is a PVM guest", facts.kind)),
        KvmKind::Pvm => Check::fail(
            "KVM",
            format!("{}: a standard guest kernel cannot boot here", facts.kind),
            "run stockade on a host with hardware virtualization (VT-x/AMD-V, or nested virtualization \
             in a cloud VM), or build a guest kernel with PVM guest support (CONFIG_PVM_GUEST=y)",
        ),
        KvmKind::Hardware(_) | KvmKind::Unknown => {
            Check::warn("KVM", format!("{}", facts.kind), "load kvm_intel or kvm_amd if this host has VT-x/AMD-V")
        }
    });

    if let Some(probe) = &facts.probe {
        checks.push(match probe {
            Ok(outcome) => Check::ok(
                "KVM guest code",
                format!(
                    "a test guest ran and halted in {:.1} ms ({} exits)",
                    outcome.elapsed.as_secs_f64() * 1000.0,
                    outcome.exits
                ),
            ),
            Err(e) => Check::fail(
                "KVM guest code",
                format!("a four-instruction test guest failed: {}", error_chain(e)),
                if facts.kind == KvmKind::Pvm {
                    "PVM cannot run real-mode guest code; see the KVM line above"
                } else {
                    "check dmesg for KVM errors"
                },
            ),
        });
    }

    checks.push(match &facts.kernel {
        Ok((k, id)) => Check::ok(
            "guest kernel",
            format!(
                "{} (Linux {}, sha256 {})",
                k.path.display(),
                id.version.as_deref().unwrap_or("version unknown"),
                id.short_hash()
            ),
        ),
        Err(e) => Check::fail(
            "guest kernel",
            error_chain(e),
            "run ./install.sh, or guest-kernel/build.sh and pass --kernel PATH",
        ),
    });

    checks.push(match &facts.landlock {
        Ok(abi) => landlock_check(*abi),
        Err(e) => Check::fail(
            "landlock",
            format!("unavailable ({e}); `run` refuses without --no-jail"),
            jail::landlock::unavailable_fix(e),
        ),
    });

    checks.push(match &facts.seccomp {
        Some(actions) if jail::seccomp::filters_usable(actions) => {
            Check::ok("seccomp", "the VMM's threads are held to per-kind system call allowlists; no sockets, no exec")
        }
        Some(actions) => Check::fail(
            "seccomp",
            format!("filters lack the trap action (have: {}); `run` refuses without --no-jail", actions.join(" ")),
            "use a kernel with CONFIG_SECCOMP_FILTER=y",
        ),
        None => Check::fail("seccomp", "no seccomp filter support", "use a kernel with CONFIG_SECCOMP_FILTER=y"),
    });

    checks.push(match &facts.space {
        Ok((dir, bytes)) if *bytes >= MIN_FREE_BYTES => {
            Check::ok("disk space", format!("{} free in {}", human_bytes(*bytes), dir.display()))
        }
        Ok((dir, bytes)) => Check::fail(
            "disk space",
            format!("only {} free in {}", human_bytes(*bytes), dir.display()),
            format!("free at least {} there", human_bytes(MIN_FREE_BYTES)),
        ),
        Err(e) => {
            Check::warn("disk space", format!("cannot measure: {e}"), "check that the data directory is readable")
        }
    });

    checks.push(store_check(facts));
    checks.push(open_files_check(&facts.open_files));
    checks.extend(interrupted_check(&facts.interrupted));

    checks
}

/// The open-file limit's line: the VMM raises its soft limit to the hard
/// one, and the workspace's file server sizes its descriptor cache by it.
/// Too low a limit never breaks the guest's files, it only costs re-opens.
fn open_files_check(limit: &std::io::Result<(u64, u64)>) -> Check {
    const NAME: &str = "open files";
    let (soft, hard) = match limit {
        Ok(limit) => *limit,
        Err(e) => return Check::warn(NAME, format!("cannot read the limit: {e}"), "check `ulimit -n`"),
    };
    let budget = FdBudget::for_limit(hard);
    let writable = budget.halved();
    let finding = format!(
        "limit {soft} (hard {hard}): the read-only file server caches {} directory descriptors and allows {} open \
         files; the writable one (agent state, `rw` mounts) {} and {}",
        budget.inodes, budget.handles, writable.inodes, writable.handles
    );
    if hard >= FdBudget::wanted_limit() {
        return Check::ok(NAME, finding);
    }
    Check::warn(
        NAME,
        format!(
            "{finding}, fewer than the {} and {} it wants: large trees cost re-opens, and many open files get ENFILE",
            fs::bounded::WANTED_INODES,
            fs::bounded::WANTED_HANDLES
        ),
        format!(
            "raise the hard open-file limit to {} or more (LimitNOFILE= for a systemd unit, `nofile` in /etc/security/limits.conf)",
            FdBudget::wanted_limit()
        ),
    )
}

/// The sessions whose changes are only on a kept scratch disk.
fn interrupted_check(ids: &[String]) -> Option<Check> {
    let newest = ids.first()?;
    let fix = if ids.len() == 1 {
        format!("`stockade recover {newest}` stages its changes for review")
    } else {
        format!(
            "`stockade recover SESSION` stages a session's changes for review (`stockade recover {newest}` for the newest)"
        )
    };
    Some(Check::warn(
        "interrupted",
        format!("{} interrupted, changes on the scratch disk: {}", plural_sessions(ids.len()), ids.join(", ")),
        fix,
    ))
}

fn plural_sessions(n: usize) -> String {
    if n == 1 { "1 session".into() } else { format!("{n} sessions") }
}

fn store_check(facts: &Facts) -> Check {
    let (dir, survey) = &facts.store;
    let survey = match survey {
        Ok(survey) => survey,
        Err(e) => return Check::warn("session store", format!("cannot survey it: {e}"), "check that it is readable"),
    };
    let finding = format!(
        "{} sessions ({} with staged changes) take {} in {}",
        survey.sessions,
        survey.staged,
        human_bytes(survey.bytes),
        dir.display()
    );
    let low_space = facts.space.as_ref().is_ok_and(|(_, free)| *free < MIN_FREE_BYTES);
    if survey.bytes >= LARGE_STORE_BYTES || (low_space && survey.sessions > 0) {
        let staged = if survey.staged > 0 {
            format!(
                "; the {} with staged changes stay until applied or discarded (`stockade discard SESSION`, \
                 or `stockade sessions --prune --include-staged`)",
                survey.staged
            )
        } else {
            String::new()
        };
        return Check::warn(
            "session store",
            finding,
            format!(
                "`stockade sessions --prune` removes the finished sessions beyond keep_sessions and keep_days \
                 (--keep-sessions N --keep-days DAYS to keep fewer){staged}"
            ),
        );
    }
    Check::ok("session store", finding)
}

/// Whether `stockade run` can work, given the checks.
pub fn can_run(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.status != Status::Fail)
}

/// The report as the user sees it.
pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for check in checks {
        let tag = match check.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        let _ = writeln!(out, "{tag}  {:width$}  {}", check.name, check.finding);
        if let Some(fix) = &check.fix {
            let _ = writeln!(out, "      {:width$}  fix: {fix}", "");
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed == 0 {
        out.push_str("\nstockade run can work on this host.\n");
    } else {
        let _ = writeln!(
            out,
            "\nstockade run cannot work on this host yet: {failed} problem{} above.",
            if failed == 1 { "" } else { "s" }
        );
    }
    out
}

/// An error and its causes on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// Landlock's line: what it enforces here and, on an older kernel, each
/// right it lacks with what holds that right instead.
fn landlock_check(abi: u32) -> Check {
    let base = format!("ABI {abi}: the VMM sees only the shared directories (read-only unless a policy says rw)");
    let gaps = jail::landlock::gaps(abi);
    if gaps.is_empty() {
        return Check::ok("landlock", base);
    }
    let lacking: Vec<String> = gaps.iter().map(|g| format!("{} (held by {})", g.right, g.held_by)).collect();
    Check::ok("landlock", format!("{base}; this kernel's Landlock lacks {}", lacking.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_facts() -> Facts {
        Facts {
            device: DeviceAccess::Usable,
            kind: KvmKind::Hardware(kvm::Vendor::Amd),
            kernel: Ok((
                GuestKernel { path: "/k/vmlinux".into(), pvm_guest: Some(false) },
                KernelIdentity { version: Some("6.12.117".into()), sha256: "0123456789abcdef0123".into() },
            )),
            probe: Some(Ok(probe::ProbeOutcome { elapsed: Duration::from_millis(2), exits: 2 })),
            landlock: Ok(7),
            seccomp: Some(vec!["kill_process".into(), "trap".into(), "errno".into(), "allow".into()]),
            space: Ok(("/data".into(), 10 << 30)),
            store: (
                "/data/sessions".into(),
                Ok(retention::Survey { sessions: 12, staged: 2, running: 0, bytes: 3 << 20 }),
            ),
            open_files: Ok((1024, 524_288)),
            interrupted: Vec::new(),
        }
    }

    #[test]
    fn a_low_open_file_limit_warns_of_speed_not_failure() {
        let line = |limit| {
            let checks = judge(&Facts { open_files: Ok(limit), ..good_facts() });
            assert!(can_run(&checks), "{}", render(&checks));
            checks.into_iter().find(|c| c.name == "open files").unwrap()
        };
        assert_eq!(line((1024, 524_288)).status, Status::Ok);
        let low = line((4096, 4096));
        assert_eq!(low.status, Status::Warn);
        assert!(low.finding.contains("caches 768 directory descriptors"), "{}", low.finding);
        assert!(low.finding.contains("the writable one (agent state, `rw` mounts) 384 and 384"), "{}", low.finding);
        assert!(low.fix.unwrap().contains("LimitNOFILE"));
    }

    #[test]
    fn interrupted_sessions_are_listed_with_the_command_that_recovers_them() {
        let mut facts = good_facts();
        assert!(!render(&judge(&facts)).contains("interrupted"));
        facts.interrupted = vec!["20250302-090000-cccc".into()];
        let checks = judge(&facts);
        let text = render(&checks);
        assert!(text.contains("warn  interrupted"), "{text}");
        assert!(text.contains("1 session interrupted, changes on the scratch disk: 20250302-090000-cccc"), "{text}");
        assert!(text.contains("fix: `stockade recover 20250302-090000-cccc` stages its changes"), "{text}");
        assert!(can_run(&checks), "a session to recover does not stop a run");
    }

    #[test]
    fn healthy_hardware_host_can_run() {
        let checks = judge(&good_facts());
        assert!(can_run(&checks), "{}", render(&checks));
        assert!(render(&checks).contains("can work"));
    }

    #[test]
    fn pvm_without_pvm_kernel_cannot_run_and_says_why() {
        let mut facts = good_facts();
        facts.kind = KvmKind::Pvm;
        let checks = judge(&facts);
        assert!(!can_run(&checks));
        let text = render(&checks);
        assert!(text.contains("PVM"), "{text}");
        assert!(text.contains("standard guest kernel cannot boot"), "{text}");
        assert!(text.contains("CONFIG_PVM_GUEST"), "{text}");
    }

    #[test]
    fn pvm_with_pvm_kernel_is_fine() {
        let mut facts = good_facts();
        facts.kind = KvmKind::Pvm;
        if let Ok((k, _)) = facts.kernel.as_mut() {
            k.pvm_guest = Some(true);
        }
        assert!(can_run(&judge(&facts)));
    }

    #[test]
    fn permission_problem_names_the_group_fix() {
        let mut facts = good_facts();
        facts.device = DeviceAccess::PermissionDenied;
        facts.probe = None;
        let checks = judge(&facts);
        assert!(!can_run(&checks));
        assert!(render(&checks).contains("usermod -aG kvm"));
    }

    #[test]
    fn low_disk_space_fails() {
        let mut facts = good_facts();
        facts.space = Ok(("/data".into(), 10 << 20));
        assert!(!can_run(&judge(&facts)));
    }

    #[test]
    fn a_large_session_store_says_how_to_prune() {
        let facts = good_facts();
        let text = render(&judge(&facts));
        assert!(
            text.contains("ok    session store   12 sessions (2 with staged changes) take 3.0 MiB in /data/sessions"),
            "{text}"
        );
        let mut facts = good_facts();
        facts.store.1 = Ok(retention::Survey { sessions: 900, staged: 3, running: 1, bytes: 12 << 30 });
        let checks = judge(&facts);
        assert!(can_run(&checks), "a large store is a warning");
        let text = render(&checks);
        assert!(text.contains("warn  session store   900 sessions (3 with staged changes) take 12.0 GiB"), "{text}");
        assert!(text.contains("fix: `stockade sessions --prune` removes"), "{text}");
        assert!(text.contains("--include-staged"), "{text}");
    }

    #[test]
    fn an_older_landlock_says_which_rights_it_lacks_and_what_holds_them() {
        let text = render(&judge(&good_facts()));
        assert!(!text.contains("lacks"), "{text}");
        let mut facts = good_facts();
        facts.landlock = Ok(2);
        let checks = judge(&facts);
        assert!(can_run(&checks), "the jail holds through seccomp");
        let text = render(&checks);
        assert!(text.contains("ABI 2"), "{text}");
        assert!(
            text.contains("lacks truncation (held by seccomp: no share's worker can open with the truncate flag"),
            "{text}"
        );
        assert!(text.contains("TCP bind and connect (held by seccomp: no VMM thread may make a socket)"), "{text}");
    }

    #[test]
    fn missing_kernel_points_at_install() {
        let mut facts = good_facts();
        facts.kernel = Err(KernelError::NotFound { searched: "/x".into() });
        let text = render(&judge(&facts));
        assert!(text.contains("install.sh"), "{text}");
    }
}
