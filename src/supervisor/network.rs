//! The guest's network, host side: the egress proxy serving the guest's
//! proxy forwarder, and the transparent connections and DNS questions of
//! its virtio-net device; and what the guest needs to use it (proxy
//! variables, resolv.conf, the CA when some host is intercepted, and the
//! credential placeholders).

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::vm;
use crate::policy::Policy;
use crate::protocol::transparent::GATEWAY_IP;
use crate::protocol::{DNS_PORT, PROXY_PORT, RootEntry, TRANSPARENT_PORT};
use crate::proxy::{AUDIT_FILE, GuestTrust, Proxy, ProxyConfig};

/// The guest forwarder's address (see guest::net).
const PROXY_URL: &str = "http://127.0.0.1:3128";
const GUEST_CA: &str = "/run/stockade/ca.pem";
const GUEST_BUNDLE: &str = "/run/stockade/ca-bundle.pem";

pub struct Network {
    proxy: Proxy,
    sockets: Vec<PathBuf>,
}

/// What the guest gets: variables for the command and files for its root.
pub struct GuestSide {
    pub env: Vec<(String, String)>,
    /// Set last, over anything the user passed: a secret must never reach
    /// the guest under the name a credential rule covers.
    pub placeholders: Vec<(String, String)>,
    pub files: Vec<RootEntry>,
}

pub fn start(
    policy: &Policy,
    data_dir: &Path,
    session_dir: &Path,
    vsock_base: &Path,
) -> anyhow::Result<(Network, GuestSide)> {
    let config = ProxyConfig::new(policy.clone(), data_dir, Some(session_dir.join(AUDIT_FILE)));
    let proxy = Proxy::start(config).context("cannot start the egress proxy")?;
    let (proxy_listener, proxy_socket) = vm::listen(vsock_base, PROXY_PORT)?;
    let (dns_listener, dns_socket) = vm::listen(vsock_base, DNS_PORT)?;
    proxy.serve_unix(proxy_listener).context("cannot serve the guest's proxy connections")?;
    let (transparent_listener, transparent_socket) = vm::listen(vsock_base, TRANSPARENT_PORT)?;
    proxy.serve_dns_unix(dns_listener).context("cannot serve the guest's DNS")?;
    proxy.serve_transparent_unix(transparent_listener).context("cannot serve the guest's transparent connections")?;

    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), PROXY_URL.to_string()));
        env.push((name.to_ascii_lowercase(), PROXY_URL.to_string()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    let mut files = vec![RootEntry::File {
        target: "/etc/resolv.conf".into(),
        content: format!(
            "# stockade: names are answered by the host's egress proxy, per the policy\nnameserver {GATEWAY_IP}\n"
        ),
        mode: 0o644,
    }];
    if let Some(trust) = proxy.guest_trust() {
        files.push(RootEntry::File { target: GUEST_CA.into(), content: trust.ca_pem.clone(), mode: 0o644 });
        files.push(RootEntry::File { target: GUEST_BUNDLE.into(), content: trust.bundle_pem.clone(), mode: 0o644 });
        env.extend(GuestTrust::env(GUEST_CA, GUEST_BUNDLE));
    }
    let placeholders = proxy.placeholder_env();
    Ok((
        Network { proxy, sockets: vec![proxy_socket, dns_socket, transparent_socket] },
        GuestSide { env, placeholders, files },
    ))
}

impl Network {
    pub fn stop(self) {
        self.proxy.stop();
        for socket in self.sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}
