//! The end-to-end rig: runs shell scripts where a standard guest kernel can
//! boot under KVM.
//!
//! On a host with hardware KVM that is the host itself. On a PVM host (see
//! shared/ENVIRONMENT.md) it is "L1": a Debian kernel with kvm-amd under QEMU's
//! software CPU with nested SVM, whose userland is this machine's root shared
//! read-only over 9p under a tmpfs overlay. One L1 boots per test binary and
//! serves every rig test in turn; its agent runs each script and reports the
//! exit status, stdout and stderr through a shared directory.
//!
//! `STOCKADE_TEST_RIG=l1|host|auto` forces where scripts run (default auto).
//! Under `CI=true` a missing prerequisite fails the test; elsewhere the test
//! is skipped with the reason printed.

use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long L1 may take from QEMU start to its agent's "ready" line. It is
/// about 6 s on these machines; the margin covers a loaded CI host.
const L1_BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// The agent says "alive" every 5 s; this long without a word means L1 is
/// stuck, whatever the script's own timeout.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(40);
/// How often a script is tried when L1 hangs under it. Nested SVM on the
/// software CPU loses L1 now and then whatever the script does; a script
/// that fails on its own merits fails on the first try, since only hangs,
/// lost channels and guest triple faults are retried. Five, because the
/// 100 MB output flood lost L1 or its guest in about one run of five on a
/// quiet host (2026-12-07: 3 of 14), and CI once lost all three tries.
const ATTEMPTS: u32 = 5;
/// What stockade says when the guest resets without a word. Under nested
/// SVM on the software CPU a guest under heavy I/O does this now and then
/// (a few in a hundred floods); no guest of ours has on hardware KVM.
const TRIPLE_FAULT: &str = "the guest kernel crashed (a triple fault";
/// What stockade says when the guest's init goes silent. Under the same
/// nested SVM a guest's vCPU has stalled for a minute on a busy L1 (its
/// kernel log empty, the same script passing alone), so it is retried like
/// a triple fault, unless the script means it (see `STOPS_ITS_GUEST`).
const STOPPED: &str = "the guest stopped answering (nothing from its init for";
/// A line a script holds when it silences its guest's init on purpose.
pub const STOPS_ITS_GUEST: &str = "# rig: this script silences its guest on purpose\n";

/// What a script did.
#[derive(Debug, Clone)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "status {}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.status, self.stdout, self.stderr)
    }
}

/// The rig stage that failed, with what it left behind to read.
#[derive(Debug)]
pub enum RigError {
    Prepare(String),
    L1Boot(String),
    ModuleLoad(String),
    Command(String),
}

impl fmt::Display for RigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RigError::Prepare(m) => write!(f, "rig stage 'prepare L1 artifacts' failed: {m}"),
            RigError::L1Boot(m) => write!(f, "rig stage 'L1 boot' failed: {m}"),
            RigError::ModuleLoad(m) => write!(f, "rig stage 'module load' failed: {m}"),
            RigError::Command(m) => write!(f, "rig stage 'command' failed: {m}"),
        }
    }
}

/// Where rig scripts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Directly on this host: it has hardware KVM.
    Host,
    /// In L1 under QEMU.
    L1,
}

/// A handle proving the rig is usable; get one with [`require`].
#[derive(Debug, Clone, Copy)]
pub struct Rig {
    pub place: Place,
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The rig for `test`, or `None` after printing why it is skipped. Under CI a
/// missing prerequisite is a failure, never a skip.
pub fn require(test: &str) -> Option<Rig> {
    match decide_place() {
        Ok(place) => Some(Rig { place }),
        Err(reason) if in_ci() => panic!("{test}: the rig is required under CI but {reason}"),
        Err(reason) => {
            eprintln!("skipping {test}: {reason}");
            None
        }
    }
}

fn decide_place() -> Result<Place, String> {
    let forced = std::env::var("STOCKADE_TEST_RIG").unwrap_or_else(|_| "auto".into());
    let hardware = ["/sys/module/kvm_amd", "/sys/module/kvm_intel"].iter().any(|m| Path::new(m).exists())
        && !Path::new("/sys/module/kvm_pvm").exists()
        && Path::new("/dev/kvm").exists();
    match forced.as_str() {
        "host" if hardware => Ok(Place::Host),
        "host" => Err("STOCKADE_TEST_RIG=host but this host has no hardware KVM".into()),
        "auto" if hardware => Ok(Place::Host),
        "auto" | "l1" => {
            if which("qemu-system-x86_64").is_none() {
                return Err("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".into());
            }
            Ok(Place::L1)
        }
        other => Err(format!("STOCKADE_TEST_RIG={other} is not one of l1, host, auto")),
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|p| p.is_file()))
}

impl Rig {
    /// Runs `script` with /bin/sh as root and returns what it did. A script
    /// that outlives `timeout` is an error; in L1 the harness then restarts L1
    /// and tries once more, saying so, because nested SVM on a software CPU
    /// occasionally hangs.
    pub fn run(&self, script: &str, timeout: Duration) -> Result<Output, RigError> {
        match self.place {
            Place::Host => run_on_host(script, timeout),
            Place::L1 => run_in_l1(script, timeout),
        }
    }

    /// [`Rig::run`], panicking with the stage on a rig failure.
    pub fn sh(&self, script: &str, timeout: Duration) -> Output {
        self.run(script, timeout).unwrap_or_else(|e| panic!("{e}"))
    }
}

fn run_on_host(script: &str, timeout: Duration) -> Result<Output, RigError> {
    let dir = scratch_dir("host");
    fs::write(dir.join("cmd.sh"), script).map_err(|e| RigError::Command(e.to_string()))?;
    let out = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(format!("{}", timeout.as_secs().max(1)))
        .args(["/bin/sh", "./cmd.sh"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RigError::Command(format!("cannot run /bin/sh: {e}")))?;
    let _ = fs::remove_dir_all(&dir);
    let status = out.status.code().unwrap_or(-1);
    if status == 124 {
        return Err(RigError::Command(format!("script did not finish in {timeout:?}:\n{script}")));
    }
    Ok(Output {
        status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn scratch_dir(kind: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("stockade-rig-{}-{kind}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create rig scratch dir");
    dir
}

/// One booted L1 and the channel to its agent.
struct L1 {
    pid: i32,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    dir: PathBuf,
    next_job: u64,
}

static L1_SLOT: Mutex<Option<L1>> = Mutex::new(None);

/// `script` run with the test's guest kernel. L1 has its own environment,
/// and without this its stockade would pick the newest kernel in the cache,
/// which may be another checkout's build rather than this one's.
fn with_kernel(script: &str) -> String {
    match std::env::var("STOCKADE_KERNEL") {
        Ok(kernel) if !kernel.contains('\'') => format!("export STOCKADE_KERNEL='{kernel}'\n{script}"),
        _ => script.to_string(),
    }
}

fn run_in_l1(script: &str, timeout: Duration) -> Result<Output, RigError> {
    // One script at a time: L1 has only two software CPUs.
    let mut slot = L1_SLOT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for attempt in 1..=ATTEMPTS {
        if slot.is_none() {
            *slot = Some(boot_l1_with_retry()?);
        }
        let l1 = slot.as_mut().expect("L1 just booted");
        let result = l1.run(script, timeout).and_then(|out| {
            // A script may keep stockade's messages in a file and print it.
            let says = |what: &str| out.stderr.contains(what) || out.stdout.contains(what);
            if says(TRIPLE_FAULT) && attempt < ATTEMPTS {
                Err(RigError::Command(format!("the guest triple-faulted:\n{out}")))
            } else if says(STOPPED) && !script.contains(STOPS_ITS_GUEST) && attempt < ATTEMPTS {
                Err(RigError::Command(format!("the guest stopped answering:\n{out}")))
            } else {
                Ok(out)
            }
        });
        match result {
            Ok(out) => return Ok(out),
            Err(err) => {
                let l1 = slot.take().expect("L1 present");
                l1.kill();
                if attempt == ATTEMPTS {
                    return Err(err);
                }
                // Straight to stderr, past the test harness's capture: a
                // retried hang must stay visible in CI logs even when the
                // retry passes.
                let _ = writeln!(
                    std::io::stderr(),
                    "rig: {err}\nrig: restarting L1 and retrying the script (attempt {} of {ATTEMPTS})",
                    attempt + 1
                );
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}

fn boot_l1_with_retry() -> Result<L1, RigError> {
    match L1::boot() {
        Ok(l1) => Ok(l1),
        Err(RigError::L1Boot(m)) => {
            let _ = writeln!(std::io::stderr(), "rig: L1 did not come up ({m}); trying once more");
            L1::boot()
        }
        Err(other) => Err(other),
    }
}

/// Builds (or finds cached) the L1 kernel and initramfs, once per test binary.
fn artifacts() -> Result<PathBuf, RigError> {
    static ARTIFACTS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ARTIFACTS
        .get_or_init(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rig/prepare.sh");
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} exited with {}", script.display(), out.status));
            }
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok(PathBuf::from(dir))
        })
        .clone()
        .map_err(RigError::Prepare)
}

impl L1 {
    fn boot() -> Result<L1, RigError> {
        let art = artifacts()?;
        let dir = scratch_dir("l1");
        let xfer = dir.join("xfer");
        fs::create_dir_all(xfer.join("jobs")).map_err(|e| RigError::L1Boot(e.to_string()))?;
        let sock = dir.join("agent.sock");
        let console = dir.join("console.log");
        let qemu_log = dir.join("qemu.log");
        let args: Vec<String> = vec![
            "--pdeathsig".into(),
            "KILL".into(),
            "--".into(),
            "qemu-system-x86_64".into(),
            "-M".into(),
            "q35".into(),
            "-accel".into(),
            "tcg".into(),
            "-cpu".into(),
            "EPYC-v3,+svm".into(),
            "-smp".into(),
            "2".into(),
            "-m".into(),
            "4096".into(),
            "-nodefaults".into(),
            "-display".into(),
            "none".into(),
            "-no-reboot".into(),
            "-kernel".into(),
            art.join("vmlinuz").display().to_string(),
            "-initrd".into(),
            art.join("initramfs.cpio.gz").display().to_string(),
            "-append".into(),
            "console=ttyS0 panic=-1 quiet".into(),
            "-serial".into(),
            format!("file:{}", console.display()),
            "-chardev".into(),
            format!("socket,id=agent,path={},server=on,wait=off", sock.display()),
            "-serial".into(),
            "chardev:agent".into(),
            "-netdev".into(),
            "user,id=net0".into(),
            "-device".into(),
            "virtio-net-pci,netdev=net0".into(),
            "-virtfs".into(),
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap".into(),
            "-virtfs".into(),
            format!("local,path={},mount_tag=xfer,security_model=none,multidevs=remap", xfer.display()),
        ];
        let log = fs::File::create(&qemu_log).map_err(|e| RigError::L1Boot(e.to_string()))?;
        // QEMU is started by a thread that lives as long as the test process:
        // with --pdeathsig it is killed when that thread (so the process) ends,
        // and no L1 outlives the tests.
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("rig-l1".into())
            .spawn(move || {
                let child =
                    Command::new("setpriv").args(&args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn();
                match child {
                    Ok(mut child) => {
                        let _ = tx.send(Ok(child.id()));
                        let _ = child.wait();
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| RigError::L1Boot(e.to_string()))?;
        let pid = rx
            .recv()
            .map_err(|e| RigError::L1Boot(e.to_string()))?
            .map_err(|e| RigError::L1Boot(format!("cannot start qemu-system-x86_64 via setpriv: {e}")))?;
        let pid = i32::try_from(pid).expect("pid fits i32");

        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(&sock) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < Duration::from_secs(20) && alive(pid) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(RigError::L1Boot(format!(
                        "QEMU did not open its agent socket ({e}); QEMU said:\n{}",
                        tail(&qemu_log, 20)
                    )));
                }
            }
        };
        let writer = stream.try_clone().map_err(|e| RigError::L1Boot(e.to_string()))?;
        let mut l1 = L1 { pid, reader: BufReader::new(stream), writer, dir, next_job: 0 };
        let line = match l1.read_line(L1_BOOT_TIMEOUT) {
            Ok(line) => line,
            Err(e) => {
                let msg = format!(
                    "no ready line from L1 after {:.0?} ({e}); console:\n{}",
                    start.elapsed(),
                    tail(&l1.dir.join("console.log"), 30)
                );
                l1.kill();
                return Err(RigError::L1Boot(msg));
            }
        };
        if let Some(rest) = line.strip_prefix("rig-error ") {
            let msg = format!("{rest}; console:\n{}", tail(&l1.dir.join("console.log"), 30));
            l1.kill();
            return Err(if rest.starts_with("module-load") {
                RigError::ModuleLoad(msg)
            } else {
                RigError::L1Boot(msg)
            });
        }
        if !line.starts_with("rig-ready") {
            l1.kill();
            return Err(RigError::L1Boot(format!("unexpected first line from L1: {line:?}")));
        }
        eprintln!(
            "rig: L1 ({}) ready in {:.1} s",
            line.trim_start_matches("rig-ready "),
            start.elapsed().as_secs_f64()
        );
        Ok(l1)
    }

    fn read_line(&mut self, timeout: Duration) -> std::io::Result<String> {
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        let n = self.reader.read_line(&mut line)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "L1 closed the channel"));
        }
        Ok(line.trim_end().to_string())
    }

    fn run(&mut self, script: &str, timeout: Duration) -> Result<Output, RigError> {
        self.next_job += 1;
        let id = self.next_job;
        let job = self.dir.join("xfer/jobs").join(id.to_string());
        fs::create_dir_all(&job).map_err(|e| RigError::Command(e.to_string()))?;
        fs::write(job.join("cmd.sh"), with_kernel(script)).map_err(|e| RigError::Command(e.to_string()))?;
        writeln!(self.writer, "run {id}").map_err(|e| RigError::Command(format!("L1 agent channel: {e}")))?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let line = match self.read_line(left.min(HEARTBEAT_TIMEOUT)) {
                Ok(line) => line,
                Err(e) => {
                    let stuck = Instant::now() < deadline;
                    let (why, diagnosis) = if stuck {
                        (
                            format!("no heartbeat for {}s: L1 is stuck ({e})", HEARTBEAT_TIMEOUT.as_secs()),
                            "skipped: L1 cannot run a diagnostic job".to_string(),
                        )
                    } else {
                        (format!("the script did not finish within {timeout:?} ({e})"), self.diagnose())
                    };
                    let partial = |name: &str| tail(&job.join(name), 20);
                    return Err(RigError::Command(format!(
                        "{why}; script:\n{script}\n\
                         --- its stdout so far ---\n{}\n--- its stderr so far ---\n{}\n\
                         --- L1 processes and logs ---\n{}\n--- L1 console ---\n{}",
                        partial("stdout"),
                        partial("stderr"),
                        diagnosis,
                        tail(&self.dir.join("console.log"), 20)
                    )));
                }
            };
            let mut words = line.split_whitespace();
            if words.next() == Some("done") && words.next() == Some(&id.to_string()) {
                break words.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
            }
        };
        let read = |name: &str| String::from_utf8_lossy(&fs::read(job.join(name)).unwrap_or_default()).into_owned();
        let out = Output { status, stdout: read("stdout"), stderr: read("stderr") };
        let _ = fs::remove_dir_all(&job);
        Ok(out)
    }

    /// Asks L1 what is going on while a script hangs: processes, and the
    /// logs of the newest stockade session.
    fn diagnose(&mut self) -> String {
        const SCRIPT: &str = "ps -eo pid,ppid,stat,pcpu,etime,args --sort=-pcpu | head -n 25; \
            s=$(ls -dt \"$HOME\"/.local/share/stockade/sessions/*/ 2>/dev/null | head -n1); \
            [ -n \"$s\" ] && { echo \"== $s\"; cat \"$s/vmm.log\"; tail -n 20 \"$s/kernel.log\"; }; dmesg | tail -n 10";
        self.next_job += 1;
        let id = self.next_job;
        let job = self.dir.join("xfer/jobs").join(id.to_string());
        if fs::create_dir_all(&job).is_err() || fs::write(job.join("cmd.sh"), SCRIPT).is_err() {
            return "cannot write the diagnostic job".into();
        }
        if writeln!(self.writer, "run {id}").is_err() {
            return "cannot reach the L1 agent".into();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match self.read_line(Duration::from_secs(30)) {
                Ok(line) if line.starts_with(&format!("done {id} ")) => {
                    return String::from_utf8_lossy(&fs::read(job.join("stdout")).unwrap_or_default()).into_owned();
                }
                Ok(line) if line == "alive" => {}
                Ok(_) => {}
                Err(e) => return format!("L1 did not answer the diagnostic job either ({e}): L1 itself is stuck"),
            }
        }
        "L1 did not answer the diagnostic job within 30 s: L1 itself is stuck".into()
    }

    fn kill(self) {
        let _ = Command::new("kill").args(["-KILL", &self.pid.to_string()]).status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
