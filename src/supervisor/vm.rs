//! The VMM child process: started from our own binary as `stockade vmm`, with
//! a clean environment (it never sees the user's variables or credentials),
//! its log in the session directory, and killed if we go away.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::host::templates;
use crate::protocol::broker::{self, Notice, StartKind};
use crate::protocol::vm_config::{TemplatePlan, VmConfig};

/// Longest Unix socket path the kernel accepts (sun_path less the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// How often a wait for the guest's call-in checks that the VMM still runs.
const EXIT_CHECK_MS: u16 = 50;

/// How long a guest resumed from a template may take to call in. It has
/// no kernel to boot, so one that takes longer is stuck: its template is
/// removed and the VM boots instead, rather than waiting out a boot's
/// timeout.
pub const RESUMED_CALL_IN: Duration = Duration::from_secs(20);

pub struct VmProcess {
    child: Child,
    /// The template this VM records or resumes, settled when it exits.
    template: Option<templates::Use>,
    /// How the VMM said the VM started.
    started: Arc<Mutex<Option<StartKind>>>,
    called_in: bool,
    /// Killed by [`VmProcess::stop`], and reaped by a thread of its own.
    stopped: bool,
    /// How it was started, to start it again booting.
    launch: Launch,
}

/// Where a VMM's files go.
pub struct Paths<'a> {
    /// The session directory, which gets the VM description.
    pub session: &'a Path,
    /// The VMM's log.
    pub log: &'a Path,
    /// The listeners for guest connections to host ports.
    pub vsock_base: &'a Path,
}

/// Hears of the guest connections the VMM refused on the init's ports.
type OnRefused = Arc<dyn Fn(u32, u32) + Send + Sync>;

/// All a VMM process is started from.
struct Launch {
    config: VmConfig,
    session: PathBuf,
    log: PathBuf,
    vsock_base: PathBuf,
    on_refused: OnRefused,
}

impl VmProcess {
    /// Writes the VM description into the session, starts the VMM, and
    /// brokers its connections to the listeners under `vsock_base`.
    /// `on_refused(host_port, guest_port)` hears of the guest connections
    /// the VMM refused on the init's ports.
    pub fn start(
        config: &VmConfig,
        paths: Paths,
        template: Option<templates::Use>,
        on_refused: impl Fn(u32, u32) + Send + Sync + 'static,
    ) -> anyhow::Result<VmProcess> {
        let launch = Launch {
            config: config.clone(),
            session: paths.session.to_path_buf(),
            log: paths.log.to_path_buf(),
            vsock_base: paths.vsock_base.to_path_buf(),
            on_refused: Arc::new(on_refused),
        };
        let (child, started) = launch.spawn()?;
        Ok(VmProcess { child, template, started, called_in: false, stopped: false, launch })
    }

    /// Stops a VMM whose resumed guest failed to call in, and boots a
    /// fresh one in its place (its template is removed).
    pub fn boot_instead(&mut self) -> anyhow::Result<()> {
        self.kill();
        let _ = std::fs::remove_file(&self.launch.config.vsock_broker);
        self.launch.config.template = None;
        let (child, started) = self.launch.spawn()?;
        (self.child, self.started, self.called_in) = (child, started, false);
        Ok(())
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether this VM was asked to resume a template.
    pub fn resumes_template(&self) -> bool {
        self.template.as_ref().is_some_and(|t| matches!(t.plan, TemplatePlan::Restore(_)))
    }

    /// The guest reached the host: its start worked.
    pub fn called_in(&mut self) {
        self.called_in = true;
    }

    /// Settles the template once the VMM is gone (see `templates::Use`).
    fn settle(&mut self) {
        if let Some(template) = self.template.take() {
            let start = *self.started.lock().unwrap_or_else(|p| p.into_inner());
            template.settle(start, self.called_in);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the VMM to exit on its own, then kills it.
    pub fn finish(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.is_running() {
                self.settle();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.settle();
    }

    /// Ends a VM whose guest has reported the command's end: the init does
    /// so only after its writes to the host are flushed, so what is left of
    /// the guest's power-off matters to nobody. The VMM is killed instead of
    /// waited for, and the kernel tears the VM down (tens of milliseconds
    /// under nested virtualization) while the run finishes; a thread of its
    /// own reaps it.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        self.settle();
        self.stopped = true;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let reaping = std::thread::Builder::new().name("vmm-reaper".into()).spawn(move || {
            let _ = nix::sys::wait::waitpid(pid, None);
        });
        if reaping.is_err() {
            let _ = self.child.wait();
        }
    }
}

impl Drop for VmProcess {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if self.is_running() {
            self.kill();
        }
        self.settle();
    }
}

impl Launch {
    /// Starts the VMM process and the thread that brokers its connections;
    /// returns it and where its start notice lands.
    fn spawn(&self) -> anyhow::Result<(Child, Arc<Mutex<Option<StartKind>>>)> {
        let config = &self.config;
        let broker = UnixListener::bind(&config.vsock_broker)
            .with_context(|| format!("cannot listen on {}", config.vsock_broker.display()))?;
        let config_path = self.session.join("vmm.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(config)?)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let exe = std::env::current_exe().context("cannot find the stockade binary")?;
        let log = File::create(&self.log).with_context(|| format!("cannot create {}", self.log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("vmm")
            .arg("--config")
            .arg(&config_path)
            .env_clear()
            .env(crate::vmm::SUPERVISOR_PID, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(filter) = std::env::var_os("RUST_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        let child = cmd.spawn().context("cannot start the VMM process")?;
        let (pid, base) = (child.id(), self.vsock_base.clone());
        let started = Arc::new(Mutex::new(None));
        let heard = started.clone();
        let on_refused = self.on_refused.clone();
        let on_notice = move |notice| match notice {
            Notice::Refused { host_port, guest_port } => on_refused(host_port, guest_port),
            Notice::Start(kind) => {
                tracing::info!("{}", kind.describe());
                *heard.lock().unwrap_or_else(|p| p.into_inner()) = Some(kind);
            }
        };
        std::thread::Builder::new()
            .name("vsock-broker".into())
            .spawn(move || serve_broker(&broker, pid, &base, on_notice))
            .context("cannot start the vsock broker thread")?;
        Ok((child, started))
    }
}

/// Serves the dial requests of the VMM `pid`: the first connection to the
/// broker socket from that process, no other.
fn serve_broker(listener: &UnixListener, pid: u32, vsock_base: &Path, on_notice: impl Fn(Notice)) {
    loop {
        let Ok((stream, _)) = listener.accept() else { return };
        let peer = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials);
        match peer {
            Ok(cred) if u32::try_from(cred.pid()).ok() == Some(pid) => {
                return broker::serve(stream, vsock_base, on_notice);
            }
            _ => tracing::warn!("refused a broker connection that is not from the VMM"),
        }
    }
}

/// A listener for guest connections to host vsock `port`.
pub fn listen(base: &Path, port: u32) -> anyhow::Result<(UnixListener, PathBuf)> {
    let path = broker::socket_path(base, port);
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        anyhow::bail!(
            "the session directory path is too long for a Unix socket ({}); set STOCKADE_DATA_DIR to a shorter directory",
            path.display()
        );
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
    listener.set_nonblocking(true)?;
    Ok((listener, path))
}

/// Accepts one connection, giving up if the VMM exits or `timeout` passes.
pub fn accept(listener: &UnixListener, vm: &mut VmProcess, timeout: Duration) -> anyhow::Result<Option<UnixStream>> {
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(Some(stream));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !vm.is_running() || Instant::now() > deadline {
                    return Ok(None);
                }
                // Woken by the connection itself; the timeout only bounds
                // how late a VMM that died is noticed.
                let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(EXIT_CHECK_MS)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e).context("cannot wait for a guest connection"),
                }
            }
            Err(e) => return Err(e).context("cannot accept a guest connection"),
        }
    }
}
