//! The guest's network, host side: the egress proxy serving the guest's
//! proxy forwarder, and the transparent connections and DNS questions of
//! its virtio-net device; and what the guest needs to use it: proxy
//! variables, the credential placeholders, and the contents of the files
//! rootfs/host.toml places (resolv.conf, the CA when some host is
//! intercepted, a profile script).

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{Context, bail};

use crate::policy::Policy;
use crate::protocol::audit::AUDIT_FILE;
use crate::protocol::transparent::GATEWAY_IP;
use crate::protocol::{AGENT_PORT, DNS_PORT, GUEST_AGENT_SOCKET, PROXY_PORT, TRANSPARENT_PORT};
use crate::proxy::packages::CacheConfig;
use crate::proxy::{GuestTrust, Proxy, ProxyConfig};
use crate::supervisor::vm;

/// The guest forwarder's address (see guest::net).
const PROXY_URL: &str = "http://127.0.0.1:3128";

pub struct Network {
    proxy: Proxy,
    sockets: Vec<PathBuf>,
}

/// The egress proxy from the moment it starts starting. It comes up on a
/// thread of its own while the VMM boots (credential commands, the CA and
/// the host's trust store take a while, and the guest dials it only after
/// it has the command). Stopped when dropped, once it is up.
pub struct Egress(State);

enum State {
    Starting(JoinHandle<anyhow::Result<(Network, GuestSide)>>),
    Up(Network),
    Gone,
}

impl Egress {
    pub fn start(
        policy: &Policy,
        data_dir: &Path,
        package_cache: Option<CacheConfig>,
        session_dir: &Path,
        vsock_base: &Path,
    ) -> anyhow::Result<Egress> {
        let mut config = ProxyConfig::new(policy.clone(), data_dir, Some(session_dir.join(AUDIT_FILE)));
        config.package_cache = package_cache;
        let vsock_base = vsock_base.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("proxy-start".into())
            .spawn(move || start(config, &vsock_base))
            .context("cannot start the egress proxy's thread")?;
        Ok(Egress(State::Starting(thread)))
    }

    /// Waits until the proxy is up; what the guest needs to use it.
    pub fn ready(&mut self) -> anyhow::Result<GuestSide> {
        let State::Starting(thread) = std::mem::replace(&mut self.0, State::Gone) else {
            bail!("the egress proxy was already waited for (a bug in stockade)");
        };
        let (network, guest) = thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        self.0 = State::Up(network);
        Ok(guest)
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        let network = match std::mem::replace(&mut self.0, State::Gone) {
            State::Up(network) => Some(network),
            State::Starting(thread) => thread.join().ok().and_then(Result::ok).map(|(network, _)| network),
            State::Gone => None,
        };
        if let Some(network) = network {
            network.stop();
        }
    }
}

/// What the guest gets: variables for the command, and what its network
/// files are made from.
pub struct GuestSide {
    pub env: Vec<(String, String)>,
    /// Set last, over anything the user passed: a secret must never reach
    /// the guest under the name a credential rule covers.
    pub placeholders: Vec<(String, String)>,
    /// The proxy's CA, when the policy intercepts some host.
    pub trust: Option<GuestTrust>,
    /// Sign-in token files as the guest gets them: placeholders only.
    pub signin_files: Vec<crate::proxy::SigninFile>,
    /// The host's known_hosts lines for the SSH hosts the policy allows.
    pub known_hosts: Option<String>,
    /// The guest gets the ssh-agent relay (`SSH_AUTH_SOCK` is in `env`).
    pub ssh_agent: bool,
}

impl GuestSide {
    /// The guest's resolv.conf: the proxy's DNS at the gateway.
    pub fn resolv_conf() -> String {
        format!("# stockade: names are answered by the host's egress proxy, per the policy\nnameserver {GATEWAY_IP}\n")
    }

    /// A shell script exporting `env` (the proxy and CA variables).
    pub fn profile(env: &[(String, String)]) -> String {
        let mut text = String::from("# stockade: the egress proxy and the CA it signs with\n");
        for (name, value) in env {
            text.push_str(&format!("export {name}='{}'\n", value.replace('\'', "'\\''")));
        }
        text
    }
}

fn start(config: ProxyConfig, vsock_base: &Path) -> anyhow::Result<(Network, GuestSide)> {
    let proxy = Proxy::start(config).context("cannot start the egress proxy")?;
    let (proxy_listener, proxy_socket) = vm::listen(vsock_base, PROXY_PORT)?;
    let (dns_listener, dns_socket) = vm::listen(vsock_base, DNS_PORT)?;
    proxy.serve_unix(proxy_listener).context("cannot serve the guest's proxy connections")?;
    let (transparent_listener, transparent_socket) = vm::listen(vsock_base, TRANSPARENT_PORT)?;
    proxy.serve_dns_unix(dns_listener).context("cannot serve the guest's DNS")?;
    proxy.serve_transparent_unix(transparent_listener).context("cannot serve the guest's transparent connections")?;
    let mut sockets = vec![proxy_socket, dns_socket, transparent_socket];
    let (agent_listener, agent_socket) = vm::listen(vsock_base, AGENT_PORT)?;
    let ssh_agent = proxy.serve_agent_unix(agent_listener).context("cannot serve the guest's ssh-agent")?;
    if ssh_agent {
        sockets.push(agent_socket);
    } else {
        let _ = std::fs::remove_file(agent_socket);
    }

    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), PROXY_URL.to_string()));
        env.push((name.to_ascii_lowercase(), PROXY_URL.to_string()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    if ssh_agent {
        env.push(("SSH_AUTH_SOCK".to_string(), GUEST_AGENT_SOCKET.to_string()));
    }
    let known_hosts = proxy.guest_known_hosts();
    let trust = proxy.guest_trust();
    let placeholders = proxy.placeholder_env();
    let signin_files = proxy.signin_files();
    Ok((Network { proxy, sockets }, GuestSide { env, placeholders, trust, signin_files, known_hosts, ssh_agent }))
}

impl Network {
    fn stop(self) {
        self.proxy.stop();
        for socket in self.sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_quotes_what_it_exports() {
        let env = vec![("HTTP_PROXY".to_string(), "http://127.0.0.1:3128".to_string()), ("Q".into(), "it's".into())];
        let text = GuestSide::profile(&env);
        assert!(text.contains("export HTTP_PROXY='http://127.0.0.1:3128'\n"), "{text}");
        assert!(text.contains("export Q='it'\\''s'\n"), "{text}");
    }
}
