//! The egress proxy: everything the guest sends to the network passes here,
//! on the host, in the supervisor (the VMM process never sees a credential).
//!
//! - `server`: guest connections (HTTP/1.1 proxy: CONNECT and absolute-URI
//!   http://), deny by default with a message saying how to allow.
//! - `tunnel`: CONNECT tunnels passed through, after checking the TLS SNI.
//! - `intercept` + `upstream`: TLS interception for hosts with a credential,
//!   sign-in or path deny rule; the upstream certificate is verified before
//!   the header is written, and only requests in the rule's scope get it.
//! - `resolve`: DNS via hickory, internal addresses (`policy::is_internal`)
//!   refused.
//! - `dns`: answers to the guest's DNS questions, from the policy; `names`
//!   remembers which names each answered address stands for.
//! - `transparent`: connections the guest made without the proxy, with
//!   their original destination, judged by TLS SNI or the Host header.
//! - `ca` + `tls`: the per-install CA and the rustls configurations.
//! - `credentials`: the secrets; `audit`: the JSONL log of every flow.
//! - `budget`: the memory all buffered bodies may hold together.
//! - `signin`: agents' sign-in tokens kept on the host; the guest gets a
//!   copy of each token file with placeholders (`Proxy::signin_files`);
//!   `scrub` takes the real values out of every answer on their hosts;
//!   `form` encodes and decodes the form fields tokens travel in.
//! - `standalone`: the proxy on its own for a host program (`policy serve`).
//!
//! The proxy runs on its own tokio runtime; [`Proxy`] is the handle that
//! serves listeners and stops it. A run wires it up like this:
//!
//! ```text
//! let policy = policy::resolve(&policy_names, &allow_flags)?;
//! let proxy = Proxy::start(ProxyConfig::new(policy, &dirs.data, Some(session.dir.join(AUDIT_FILE))))?;
//! proxy.serve_unix(listener_for_the_guest_proxy_port)?;     // HTTP proxy (CONNECT, http://)
//! proxy.serve_dns_unix(listener_for_the_guest_dns_port)?;   // or proxy.answer_dns(&udp_message)
//! guest env += proxy.placeholder_env();
//! for f in proxy.signin_files() { place f.content in the guest at f.file (~/ = the guest's home), 0600 }
//! if let Some(trust) = proxy.guest_trust() { write trust.ca_pem / trust.bundle_pem where the
//!     guest can read them; guest env += GuestTrust::env(guest_ca_path, guest_bundle_path); }
//! ... run the VM ...
//! proxy.stop();
//! ```
#![forbid(unsafe_code)]

pub mod audit;
mod body;
mod budget;
mod ca;
mod credentials;
mod dns;
mod form;
mod intercept;
mod names;
pub mod packages;
mod resolve;
mod scrub;
mod server;
mod signin;
mod sni;
mod ssh;
pub mod standalone;
mod tls;
mod transparent;
mod tunnel;
mod upstream;

#[cfg(test)]
mod credential_echo_tests;
#[cfg(test)]
mod signin_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;
use thiserror::Error;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

pub use ca::CertificateAuthority;
pub use signin::SigninFile;

use crate::policy::Policy;
use audit::AuditLog;
use credentials::Credentials;
use resolve::Resolver;
use signin::Signins;

/// Guest connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 1024;
/// Bytes of bodies the proxy holds whole in memory at once, across all
/// connections (registry metadata, sign-in bodies); past it such a request
/// is refused with a message naming the limit.
const MAX_BUFFERED: u64 = 256 << 20;
/// How long `stop` lets in-flight work finish.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long a DNS answer may take before the guest gets SERVFAIL.
const DNS_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest DNS message (the TCP framing's limit).
const MAX_DNS_MESSAGE: usize = 65535;

/// Guest variables that must name a bundle of the host's roots plus the
/// proxy CA (they replace the default trust store).
pub const BUNDLE_ENV_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "PIP_CERT",
    "NPM_CONFIG_CAFILE",
];
/// Guest variables that must name the proxy CA alone (added to a default
/// trust store).
pub const CA_ENV_VARS: &[&str] = &["NODE_EXTRA_CA_CERTS"];

#[derive(Debug, Error)]
pub enum ProxyError {
    #[error("cannot write the proxy CA file {}", path.display())]
    CaWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the proxy CA file {}", path.display())]
    CaRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the proxy CA in {} is damaged ({reason}); remove that directory and stockade makes a new CA", path.display())]
    CaDamaged { path: PathBuf, reason: String },
    #[error("cannot make a certificate for {host}")]
    Certificate {
        host: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("TLS setup failed")]
    Tls(#[source] rustls::Error),
    #[error(
        "no trusted root certificates on this host to check servers with ({details}); \
         install your distribution's ca-certificates or set SSL_CERT_FILE"
    )]
    NoRoots { details: String },
    #[error("credential rule {rule}: {reason}")]
    Credential { rule: String, reason: String },
    #[error("sign-in rule {rule}: {reason}")]
    Signin { rule: String, reason: String },
    #[error("cannot open the audit log {}", path.display())]
    Audit {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the proxy's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot serve a proxy listener")]
    Listener(#[source] std::io::Error),
}

/// What the proxy needs to start.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub policy: Policy,
    /// stockade's data directory: the CA lives in `<data_dir>/ca/`.
    pub data_dir: PathBuf,
    /// The session's audit log (`<session dir>/network.jsonl`); `None`
    /// discards records.
    pub audit_log: Option<PathBuf>,
    /// The home directory, for `~/` in credential `file` values and
    /// sign-in files.
    pub home: Option<PathBuf>,
    /// The roots that upstream servers of intercepted hosts are checked
    /// against; `None` is the host's trust store (rustls-native-certs,
    /// which honours SSL_CERT_FILE and SSL_CERT_DIR).
    pub upstream_roots: Option<Vec<CertificateDer<'static>>>,
    /// The host's ssh-agent socket (`SSH_AUTH_SOCK`), relayed to the guest
    /// when the policy allows some host on port 22.
    pub ssh_agent: Option<PathBuf>,
    /// The files SSH server keys are checked against; `None`: the user's
    /// (under `home`) and the system's known_hosts.
    pub known_hosts: Option<Vec<PathBuf>>,
    /// The package cache for the policy's `[[registry]]` rules; `None`
    /// serves every download from its registry.
    pub package_cache: Option<packages::CacheConfig>,
}

impl ProxyConfig {
    pub fn new(policy: Policy, data_dir: &Path, audit_log: Option<PathBuf>) -> ProxyConfig {
        ProxyConfig {
            policy,
            data_dir: data_dir.to_path_buf(),
            audit_log,
            known_hosts: None,
            package_cache: None,
            home: std::env::var_os("HOME").map(PathBuf::from),
            upstream_roots: None,
            ssh_agent: std::env::var_os("SSH_AUTH_SOCK").filter(|s| !s.is_empty()).map(PathBuf::from),
        }
    }
}

/// What every connection handler shares.
pub(crate) struct Shared {
    policy: Policy,
    resolver: Resolver,
    credentials: Credentials,
    signins: Signins,
    /// Present when some credential, sign-in or path deny rule is in force.
    ca: Option<Arc<CertificateAuthority>>,
    upstream_tls: Option<Arc<ClientConfig>>,
    audit: Arc<AuditLog>,
    connections: Arc<Semaphore>,
    /// What buffered bodies may hold of the host's memory, all together.
    buffers: budget::Budget,
    /// Addresses given in DNS answers, for transparent connections.
    names: names::Names,
    ssh: ssh::Ssh,
    /// Present when the cache is on and the policy names a registry.
    packages: Option<packages::Packages>,
}

/// A running proxy. Dropping it stops the proxy too (without waiting).
pub struct Proxy {
    /// Taken by `stop` and `drop`; `handle` outlives it harmlessly.
    runtime: Option<Runtime>,
    handle: tokio::runtime::Handle,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Starts the proxy's runtime and readies everything a connection
    /// needs: credential values (a failing one is an error naming its
    /// rule), the guest copies of sign-in files, and, when a credential or
    /// sign-in rule is in force, the CA and the host's trust store. Serves
    /// nothing until given a listener.
    pub fn start(config: ProxyConfig) -> Result<Proxy, ProxyError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("proxy")
            .enable_all()
            .build()
            .map_err(ProxyError::Runtime)?;
        let shared = runtime.block_on(Self::prepare(config))?;
        Ok(Proxy { handle: runtime.handle().clone(), runtime: Some(runtime), shared: Arc::new(shared) })
    }

    async fn prepare(config: ProxyConfig) -> Result<Shared, ProxyError> {
        let credentials = Credentials::load(&config.policy.credentials, config.home.as_deref()).await?;
        let signins = Signins::load(&config.policy.signins, config.home.as_deref())?;
        let packages = match config.package_cache.as_ref().filter(|_| !config.policy.registries.is_empty()) {
            Some(cache) => match packages::Packages::open(cache) {
                Ok(packages) => Some(packages),
                Err(e) => {
                    // Downloads still work, from the registry each time.
                    tracing::warn!("the package cache in {} cannot be used: {e}", cache.dir.display());
                    None
                }
            },
            None => None,
        };
        // Path deny rules and the package cache need the requests read too,
        // so the CA as well.
        let (ca, upstream_tls) = if credentials.is_empty()
            && signins.is_empty()
            && config.policy.deny_paths.is_empty()
            && packages.is_none()
        {
            (None, None)
        } else {
            let ca = CertificateAuthority::load_or_create(&config.data_dir)?;
            let roots = match config.upstream_roots {
                Some(certs) => {
                    let mut roots = rustls::RootCertStore::empty();
                    roots.add_parsable_certificates(certs);
                    roots
                }
                None => tls::native_roots()?,
            };
            (Some(Arc::new(ca)), Some(tls::client_config(Arc::new(roots))?))
        };
        let audit = match &config.audit_log {
            Some(path) => AuditLog::open(path)?,
            None => AuditLog::discard(),
        };
        let ssh_agent = config.ssh_agent.filter(|_| config.policy.allows_ssh());
        Ok(Shared {
            policy: config.policy,
            resolver: Resolver::from_system(),
            credentials,
            signins,
            ca,
            upstream_tls,
            audit: Arc::new(audit),
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            buffers: budget::Budget::new(MAX_BUFFERED),
            names: names::Names::default(),
            ssh: ssh::Ssh {
                agent: ssh_agent,
                known_hosts: config
                    .known_hosts
                    .unwrap_or_else(|| ssh::known_hosts::default_files(config.home.as_deref())),
                sessions: ssh::Sessions::default(),
            },
            packages,
        })
    }

    /// Serves guest proxy connections accepted on `listener` (the VMM's
    /// bridge from the guest's vsock port).
    pub fn serve_unix(&self, listener: std::os::unix::net::UnixListener) -> Result<(), ProxyError> {
        listener.set_nonblocking(true).map_err(ProxyError::Listener)?;
        let _guard = self.handle.enter();
        let listener = tokio::net::UnixListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.handle.spawn(server::accept_loop(self.shared.clone(), listener, server::serve_connection));
        Ok(())
    }

    /// Serves transparent connections accepted on `listener`: each begins
    /// with the guest's original destination (`protocol::transparent`),
    /// then the guest's own bytes, judged as a proxied request would be.
    pub fn serve_transparent_unix(&self, listener: std::os::unix::net::UnixListener) -> Result<(), ProxyError> {
        listener.set_nonblocking(true).map_err(ProxyError::Listener)?;
        let _guard = self.handle.enter();
        let listener = tokio::net::UnixListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.handle.spawn(server::accept_loop(self.shared.clone(), listener, transparent::serve));
        Ok(())
    }

    /// Serves the guest's ssh-agent connections accepted on `listener`;
    /// `false` (and nothing served) when the guest gets no agent.
    pub fn serve_agent_unix(&self, listener: std::os::unix::net::UnixListener) -> Result<bool, ProxyError> {
        if self.shared.ssh.agent.is_none() {
            return Ok(false);
        }
        listener.set_nonblocking(true).map_err(ProxyError::Listener)?;
        let _guard = self.handle.enter();
        let listener = tokio::net::UnixListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.handle.spawn(server::accept_loop(self.shared.clone(), listener, ssh::agent::serve));
        Ok(true)
    }

    /// The guest's known_hosts: the host's lines for the hosts the policy
    /// allows SSH to (empty when it allows none).
    pub fn guest_known_hosts(&self) -> Option<String> {
        let hosts = self.shared.policy.ssh_hosts();
        (!hosts.is_empty()).then(|| ssh::known_hosts::guest_file(&self.shared.ssh.known_hosts, &hosts))
    }

    /// Serves transparent connections on TCP (tests).
    #[cfg(test)]
    pub fn serve_transparent_tcp(&self, listener: std::net::TcpListener) -> Result<(), ProxyError> {
        listener.set_nonblocking(true).map_err(ProxyError::Listener)?;
        let _guard = self.handle.enter();
        let listener = tokio::net::TcpListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.handle.spawn(server::accept_loop(self.shared.clone(), listener, transparent::serve));
        Ok(())
    }

    /// Serves proxy connections on TCP (tests, benchmarks, debugging).
    pub fn serve_tcp(&self, listener: std::net::TcpListener) -> Result<(), ProxyError> {
        listener.set_nonblocking(true).map_err(ProxyError::Listener)?;
        let _guard = self.handle.enter();
        let listener = tokio::net::TcpListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.handle.spawn(server::accept_loop(self.shared.clone(), listener, server::serve_connection));
        Ok(())
    }

    /// Serves DNS on stream connections accepted on `listener`: each
    /// message is framed as over TCP (RFC 1035 4.2.2: a 2-byte big-endian
    /// length, then the message), and answered in order.
    pub fn serve_dns_unix(&self, listener: std::os::unix::net::UnixListener) -> Result<(), ProxyError> {
        listener.set_nonblocking(true).map_err(ProxyError::Listener)?;
        let _guard = self.handle.enter();
        let listener = tokio::net::UnixListener::from_std(listener).map_err(ProxyError::Listener)?;
        self.handle.spawn(server::accept_loop(self.shared.clone(), listener, serve_dns_stream));
        Ok(())
    }

    /// Answers one DNS message (as sent over UDP) per the policy. Blocks
    /// the calling thread, which must not be a tokio runtime's.
    pub fn answer_dns(&self, query: &[u8]) -> Vec<u8> {
        let shared = self.shared.clone();
        let query = query.to_vec();
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(dns::answer(&shared, &query).await);
        });
        rx.recv_timeout(DNS_TIMEOUT).unwrap_or_default()
    }

    /// The guest variables that hold placeholders instead of secrets, e.g.
    /// `("ANTHROPIC_API_KEY", "stockade-placeholder")`. Set them in the
    /// guest (over any value passed from the host).
    pub fn placeholder_env(&self) -> Vec<(String, String)> {
        self.shared.credentials.placeholders()
    }

    /// The guest's copies of the sign-in token files: for each `[[signin]]`
    /// rule whose host file exists and could be read, the same JSON with
    /// placeholders where the secrets are. Place each at `file` in the
    /// guest (`~/` is the guest's home), mode 0600. The same on every call.
    pub fn signin_files(&self) -> Vec<SigninFile> {
        self.shared.signins.guest_files()
    }

    /// What the guest must trust, when some host is intercepted.
    pub fn guest_trust(&self) -> Option<GuestTrust> {
        let ca = self.shared.ca.as_ref()?;
        let mut bundle = ca.cert_pem().to_string();
        bundle.push_str(&tls::pem(&tls::native_root_ders()));
        Some(GuestTrust { ca_pem: ca.cert_pem().to_string(), bundle_pem: bundle })
    }

    /// Stops serving; in-flight connections get a moment to finish, then
    /// the audit log gets the sums of what passed its caps. A run that added
    /// to the package cache then trims it to its size.
    pub fn stop(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(STOP_GRACE);
        }
        self.shared.audit.finish();
        if let Some(packages) = &self.shared.packages {
            if let Err(e) = packages.store.trim() {
                tracing::warn!("cannot trim the package cache: {e}");
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
            self.shared.audit.finish();
        }
    }
}

/// The proxy CA as the guest needs it.
#[derive(Debug, Clone)]
pub struct GuestTrust {
    /// The CA certificate alone (for NODE_EXTRA_CA_CERTS).
    pub ca_pem: String,
    /// The CA followed by the host's trusted roots (for SSL_CERT_FILE and
    /// the others that replace the default store).
    pub bundle_pem: String,
}

impl GuestTrust {
    /// File names [`GuestTrust::write_to`] uses.
    pub const CA_FILE: &str = "stockade-ca.pem";
    pub const BUNDLE_FILE: &str = "stockade-ca-bundle.pem";

    /// Writes the two files into `dir` (e.g. a directory shared with the
    /// guest read-only) and returns their paths: (CA, bundle).
    pub fn write_to(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        let (ca, bundle) = (dir.join(Self::CA_FILE), dir.join(Self::BUNDLE_FILE));
        std::fs::write(&ca, &self.ca_pem)?;
        std::fs::write(&bundle, &self.bundle_pem)?;
        Ok((ca, bundle))
    }

    /// The guest variables pointing at the two files, once placed in the
    /// guest at `ca_path` and `bundle_path`.
    pub fn env(ca_path: &str, bundle_path: &str) -> Vec<(String, String)> {
        let bundle = BUNDLE_ENV_VARS.iter().map(|v| (v.to_string(), bundle_path.to_string()));
        let ca = CA_ENV_VARS.iter().map(|v| (v.to_string(), ca_path.to_string()));
        bundle.chain(ca).collect()
    }
}

async fn serve_dns_stream<S>(shared: Arc<Shared>, mut stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut query = vec![0u8; MAX_DNS_MESSAGE];
    loop {
        let Ok(len) = stream.read_u16().await else { return };
        let len = usize::from(len);
        if stream.read_exact(&mut query[..len]).await.is_err() {
            return;
        }
        let answer = tokio::time::timeout(DNS_TIMEOUT, dns::answer(&shared, &query[..len])).await.unwrap_or_default();
        let Ok(answer_len) = u16::try_from(answer.len()) else { continue };
        if answer.is_empty() {
            continue;
        }
        let mut framed = Vec::with_capacity(answer.len() + 2);
        framed.extend_from_slice(&answer_len.to_be_bytes());
        framed.extend_from_slice(&answer);
        if stream.write_all(&framed).await.is_err() {
            return;
        }
    }
}
