//! The VMM child process: started from our own binary as `stockade vmm`, with
//! a clean environment (it never sees the user's variables or credentials),
//! its log in the session directory, and killed if we go away.

use std::fs::File;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::protocol::broker;
use crate::protocol::vm_config::VmConfig;

/// Longest Unix socket path the kernel accepts (sun_path less the NUL).
const MAX_SOCKET_PATH: usize = 107;

pub struct VmProcess {
    child: Child,
}

impl VmProcess {
    /// Writes the VM description into the session, starts the VMM, and
    /// brokers its connections to the listeners under `vsock_base`.
    /// `on_refused(host_port, guest_port)` hears of the guest connections
    /// the VMM refused on the init's ports.
    pub fn start(
        config: &VmConfig,
        session_dir: &Path,
        log: &Path,
        vsock_base: &Path,
        on_refused: impl Fn(u32, u32) + Send + 'static,
    ) -> anyhow::Result<VmProcess> {
        let broker = UnixListener::bind(&config.vsock_broker)
            .with_context(|| format!("cannot listen on {}", config.vsock_broker.display()))?;
        let config_path = session_dir.join("vmm.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(config)?)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let exe = std::env::current_exe().context("cannot find the stockade binary")?;
        let log = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("vmm")
            .arg("--config")
            .arg(&config_path)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(filter) = std::env::var_os("RUST_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        let child = cmd.spawn().context("cannot start the VMM process")?;
        let (pid, base) = (child.id(), vsock_base.to_path_buf());
        std::thread::Builder::new()
            .name("vsock-broker".into())
            .spawn(move || serve_broker(&broker, pid, &base, on_refused))
            .context("cannot start the vsock broker thread")?;
        Ok(VmProcess { child })
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the VMM to exit on its own, then kills it.
    pub fn finish(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for VmProcess {
    fn drop(&mut self) {
        if self.is_running() {
            self.kill();
        }
    }
}

/// Serves the dial requests of the VMM `pid`: the first connection to the
/// broker socket from that process, no other.
fn serve_broker(listener: &UnixListener, pid: u32, vsock_base: &Path, on_refused: impl Fn(u32, u32)) {
    loop {
        let Ok((stream, _)) = listener.accept() else { return };
        let peer = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials);
        match peer {
            Ok(cred) if u32::try_from(cred.pid()).ok() == Some(pid) => {
                return broker::serve(stream, vsock_base, on_refused);
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
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("cannot accept a guest connection"),
        }
    }
}
