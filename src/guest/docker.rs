//! Docker in image mode (`--docker`): dockerd started as root before the
//! command and waited for, its data on the scratch disk (the image and its
//! tmpfs upper layer are no place for image layers), its socket owned by the
//! command's group, its output sent to the host for the session's
//! dockerd.log. Pulls honour the proxy variables, so they go through the
//! egress proxy like everything else, under the same policy.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::channel::Control;
use super::{command, limits, mounts};
use crate::protocol::{GuestMsg, RunSpec};

/// Where Debian's docker.io puts the daemon.
pub const DOCKERD: &str = "/usr/sbin/dockerd";
/// The daemon's socket; the docker CLI's default (/var/run is /run).
const SOCKET: &str = "/run/docker.sock";
/// How long dockerd may take to answer. It takes a second or two on
/// hardware KVM; the margin is for software-emulated CPUs.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);
/// The search path dockerd finds containerd, runc and iptables on.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The command's variables dockerd needs too: the proxy (so pulls take the
/// forwarder to the egress proxy) and the CA bundle (Go honours
/// SSL_CERT_FILE, so registries the proxy intercepts are trusted).
const PASSED_ENV: &[&str] =
    &["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_FILE"];

/// dockerd's environment, from the command's.
pub fn daemon_env(command_env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), PATH.to_string()),
        ("HOME".to_string(), "/root".to_string()),
        // The guest's root is a tmpfs the init moved over / and chrooted
        // into (as switch_root does); this keeps runc on the path tested
        // here, moving the container's root over and chrooting, rather than
        // pivot_root(2). Weaker against a container that escapes its
        // chroot, but the isolation boundary here is the VM, not runc.
        ("DOCKER_RAMDISK".to_string(), "true".to_string()),
    ];
    env.extend(command_env.iter().filter(|(k, _)| PASSED_ENV.contains(&k.as_str())).cloned());
    env
}

/// dockerd's arguments: data under `data_root`, the socket's group `gid`
/// (the command's, so it can use Docker without being root).
pub fn daemon_args(data_root: &Path, gid: u32) -> Vec<String> {
    vec![format!("--data-root={}", data_root.display()), format!("--host=unix://{SOCKET}"), format!("--group={gid}")]
}

/// Starts dockerd and returns once it answers on its socket.
pub fn start(spec: &RunSpec, control: &Control) -> anyhow::Result<()> {
    if !Path::new(DOCKERD).exists() {
        bail!(
            "--docker: this image has no {DOCKERD}. Use an image whose recipe installs docker.io: \
             `stockade image build docker`, then `stockade run --image docker --docker -- ...`"
        );
    }
    let data_root = mounts::scratch_dir("docker")?;
    limits::mount_cgroup2()?;
    let mut cmd = Command::new(DOCKERD);
    cmd.args(daemon_args(&data_root, spec.gid))
        .env_clear()
        .envs(daemon_env(&spec.env))
        .current_dir("/")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("cannot start {DOCKERD}"))?;
    command::pump(
        "dockerd-out",
        child.stdout.take().context("dockerd stdout")?,
        control.writer(),
        GuestMsg::DockerdLog,
    )?;
    command::pump(
        "dockerd-err",
        child.stderr.take().context("dockerd stderr")?,
        control.writer(),
        GuestMsg::DockerdLog,
    )?;
    wait_ready(&mut child)
}

/// Polls the socket until dockerd answers its ping, it exits, or time is up.
fn wait_ready(child: &mut Child) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("cannot check on dockerd")? {
            bail!("dockerd exited ({status}) before it answered on {SOCKET}");
        }
        if ping().unwrap_or(false) {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!("dockerd did not answer on {SOCKET} within {}s", READY_TIMEOUT.as_secs());
        }
        std::thread::sleep(POLL);
    }
}

/// One `GET /_ping` on the socket: true on a 200 answer.
fn ping() -> std::io::Result<bool> {
    let mut stream = UnixStream::connect(SOCKET)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.take(4096).read_to_end(&mut answer)?;
    Ok(answers_ok(&answer))
}

/// Whether an HTTP answer is a 200.
fn answers_ok(answer: &[u8]) -> bool {
    let line = answer.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    matches!((words.next(), words.next()), (Some(v), Some(b"200")) if v.starts_with(b"HTTP/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerd_gets_the_proxy_and_ca_but_nothing_else_of_the_commands_env() {
        let env: Vec<(String, String)> = [
            ("HTTPS_PROXY", "http://127.0.0.1:3128"),
            ("no_proxy", "localhost"),
            ("SSL_CERT_FILE", "/run/stockade/ca-bundle.pem"),
            ("ANTHROPIC_API_KEY", "stockade-placeholder"),
            ("PATH", "/home/u/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let got = daemon_env(&env);
        let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "DOCKER_RAMDISK", "HTTPS_PROXY", "no_proxy", "SSL_CERT_FILE"]);
        assert_eq!(got[0].1, PATH, "dockerd needs the sbin directories, not the user's PATH");
    }

    #[test]
    fn dockerd_keeps_its_data_on_the_scratch_disk_and_its_socket_for_the_users_group() {
        let args = daemon_args(Path::new("/.stockade/scratch/docker"), 1000);
        assert_eq!(args, ["--data-root=/.stockade/scratch/docker", "--host=unix:///run/docker.sock", "--group=1000"]);
    }

    #[test]
    fn only_a_200_is_an_answer() {
        assert!(answers_ok(b"HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\n\r\nOK"));
        assert!(answers_ok(b"HTTP/1.1 200 OK\r\n"));
        assert!(!answers_ok(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(!answers_ok(b""));
        assert!(!answers_ok(b"garbage 200"));
    }
}
