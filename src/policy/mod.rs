//! Policy files: what the guest may reach, which credentials the proxy
//! writes for which hosts, which host directories and variables the guest
//! gets. Schema (`schema`), loading and validation (`load`), presets
//! (`presets`), host patterns (`pattern`), internal addresses (`address`),
//! request paths (`path`), the variables passed to the guest (`env`) and
//! the allow/deny decision (`verdict`) are pure: nothing here opens a socket or reads a secret.
//!
//! Several policies merge into one: lists are joined, and a deny rule beats
//! any allow rule; a mount named twice gets the more restrictive mode.
#![forbid(unsafe_code)]

mod address;
mod credential;
mod describe;
mod env;
pub mod learn;
mod load;
mod path;
mod pattern;
pub mod presets;
mod registry;
mod schema;
mod signin;
mod verdict;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

pub use address::is_internal;
pub use credential::{CredentialRule, PLACEHOLDER, ValueSource};
pub use describe::Describe;
pub use load::{is_path, line_column, load_file, parse, user_policy_dir};
pub use path::{PathPattern, RequestPath};
pub use pattern::{Host, HostRule, PatternError, Port, canonical_ip};
pub use registry::{RegistryKind, RegistryRule, RegistryUrl};
pub use schema::MountMode;
pub use signin::{SigninRule, TokenPath};
pub use verdict::{Denial, Verdict, is_host_alias};

#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("{origin}:{line}:{column}: {message}")]
    Invalid { origin: String, line: usize, column: usize, message: String },
    #[error("cannot read the policy file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no policy named {name:?}: there is no {dir}/{name}.toml and no such preset (presets: {presets}); \
         give a path to use a file elsewhere"
    )]
    UnknownName { name: String, dir: String, presets: String },
    #[error("--allow {text}: {reason}")]
    BadAllow { text: String, reason: PatternError },
    #[error(
        "{name} is pinned to {first} ({first_origin}) and to {second} ({second_origin}): keep one [network.hosts] entry"
    )]
    HostsConflict { name: String, first: IpAddr, first_origin: String, second: IpAddr, second_origin: String },
    #[error("two credential rules for {host}: {first} and {second}; keep one")]
    CredentialConflict { host: String, first: String, second: String },
    #[error("two [[signin]] rules for {file}: {first} and {second}; keep one")]
    SigninConflict { file: String, first: String, second: String },
    #[error(
        "[[signin]] {rule}: {host}:{port} is not allowed by the network rules, so its tokens could not be used; \
         allow it in [network] allow (or --allow {host})"
    )]
    SigninHostNotAllowed { rule: String, host: String, port: Port },
}

/// An allow or deny rule and the policy it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRule {
    pub rule: HostRule,
    pub origin: Arc<str>,
}

impl std::fmt::Display for NetworkRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.rule, self.origin)
    }
}

impl Describe for NetworkRule {
    fn describe(&self) -> String {
        self.to_string()
    }
}

/// A `[network] deny` rule naming a path (`api.github.com/gists`):
/// requests under it on a host the rule matches are refused. Without a port
/// it means the web ports, 80 and 443, since only HTTP has paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRule {
    pub rule: HostRule,
    pub path: PathPattern,
    pub origin: Arc<str>,
}

impl std::fmt::Display for PathRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{} ({})", self.rule, self.path, self.origin)
    }
}

impl Describe for PathRule {
    fn describe(&self) -> String {
        self.to_string()
    }
}

/// A `[network.hosts]` entry: this name has this address, DNS is not asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedHost {
    pub name: String,
    pub addr: IpAddr,
    pub origin: Arc<str>,
}

impl Describe for PinnedHost {
    fn describe(&self) -> String {
        format!("{} = {} ({})", self.name, self.addr, self.origin)
    }
}

/// A `[network] host_ports` entry (or `--host-port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub port: Port,
    pub origin: Arc<str>,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} ({})", crate::protocol::transparent::HOST_ALIAS, self.port, self.origin)
    }
}

impl Describe for HostPort {
    fn describe(&self) -> String {
        self.to_string()
    }
}

/// A `[mounts]` entry, path as written (`~/` not yet expanded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub path: String,
    pub mode: MountMode,
    pub origin: Arc<str>,
}

impl Mount {
    /// The host path, with a leading `~` replaced by `home`.
    pub fn host_path(&self, home: &Path) -> PathBuf {
        match self.path.strip_prefix('~') {
            Some(rest) => home.join(rest.trim_start_matches('/')),
            None => PathBuf::from(&self.path),
        }
    }
}

/// With a `~` path, also where it is on this host (from `HOME`).
impl Describe for Mount {
    fn describe(&self) -> String {
        match std::env::var_os("HOME") {
            Some(home) if self.path.starts_with('~') => {
                let path = self.host_path(Path::new(&home));
                format!("{} {} ({}; {})", self.path, self.mode.as_str(), self.origin, path.display())
            }
            _ => format!("{} {} ({})", self.path, self.mode.as_str(), self.origin),
        }
    }
}

/// An `[agent]` section: where a coding agent keeps its state, which
/// stockade holds apart from the host's copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentState {
    /// Names the state directory: letters, digits and `-`.
    pub name: String,
    /// Paths under `~/`; a trailing `/` is a directory, else a file.
    pub state: Vec<String>,
    /// Paths under `~/` seeded from the host, each inside a `state` path.
    pub seed: Vec<String>,
    /// Paths under `~/` whose changes are offered for review for the host.
    pub review: Vec<String>,
    pub drop_keys: Vec<String>,
    pub origin: Arc<str>,
}

impl Describe for AgentState {
    fn describe(&self) -> String {
        let seeds = if self.seed.is_empty() { "nothing".to_string() } else { self.seed.join(", ") };
        let review = if self.review.is_empty() { "nothing".to_string() } else { self.review.join(", ") };
        format!(
            "{}: {} ({}); seeded from {seeds}; offered for review: {review}",
            self.name,
            self.state.join(", "),
            self.origin
        )
    }
}

/// One policy, or several merged.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// What it was made of, in order ("preset npm", a path, "--allow").
    pub sources: Vec<String>,
    pub description: Option<String>,
    pub allow: Vec<NetworkRule>,
    /// Allowed even when the name resolves to a loopback or private address.
    pub allow_private: Vec<NetworkRule>,
    pub deny: Vec<NetworkRule>,
    /// Deny rules naming a path; they refuse requests, not hosts.
    pub deny_paths: Vec<PathRule>,
    pub hosts: Vec<PinnedHost>,
    /// Ports of the host's loopback the guest may reach, as `HOST_ALIAS`.
    pub host_ports: Vec<HostPort>,
    pub credentials: Vec<CredentialRule>,
    /// Sign-in token files kept on the host.
    pub signins: Vec<SigninRule>,
    /// Registries whose downloads the package cache may serve.
    pub registries: Vec<RegistryRule>,
    pub mounts: Vec<Mount>,
    /// Host variables to pass to the command.
    pub env_pass: Vec<String>,
    pub agents: Vec<AgentState>,
}

impl Policy {
    /// Adds `other` to this policy. Deny rules keep winning because the
    /// verdict looks at them first, whichever policy they came from.
    pub fn merge(&mut self, other: Policy) -> Result<(), PolicyError> {
        self.sources.extend(other.sources);
        if self.description.is_none() {
            self.description = other.description;
        }
        self.allow.extend(other.allow);
        self.allow_private.extend(other.allow_private);
        self.deny.extend(other.deny);
        self.deny_paths.extend(other.deny_paths);
        for port in other.host_ports {
            if !self.host_ports.iter().any(|p| p.port == port.port) {
                self.host_ports.push(port);
            }
        }
        for pin in other.hosts {
            match self.hosts.iter().find(|p| p.name == pin.name) {
                Some(old) if old.addr != pin.addr => {
                    return Err(PolicyError::HostsConflict {
                        name: pin.name,
                        first: old.addr,
                        first_origin: old.origin.to_string(),
                        second: pin.addr,
                        second_origin: pin.origin.to_string(),
                    });
                }
                Some(_) => {}
                None => self.hosts.push(pin),
            }
        }
        for rule in other.credentials {
            if let Some(old) = self.credentials.iter().find(|c| c.host == rule.host) {
                if *old == rule {
                    continue;
                }
                return Err(PolicyError::CredentialConflict {
                    host: rule.host.to_string(),
                    first: old.name(),
                    second: rule.name(),
                });
            }
            self.credentials.push(rule);
        }
        for rule in other.signins {
            if let Some(old) = self.signins.iter().find(|s| s.file == rule.file) {
                if old.tokens == rule.tokens && old.hosts == rule.hosts {
                    continue;
                }
                return Err(PolicyError::SigninConflict {
                    file: rule.file.clone(),
                    first: old.name(),
                    second: rule.name(),
                });
            }
            self.signins.push(rule);
        }
        for rule in other.registries {
            if !self.registries.iter().any(|r| r.same(&rule)) {
                self.registries.push(rule);
            }
        }
        for mount in other.mounts {
            match self.mounts.iter_mut().find(|m| m.path == mount.path) {
                // Like deny beating allow: the more restrictive mode wins.
                Some(old) if mount.mode < old.mode => *old = mount,
                Some(_) => {}
                None => self.mounts.push(mount),
            }
        }
        for name in other.env_pass {
            if !self.env_pass.contains(&name) {
                self.env_pass.push(name);
            }
        }
        for agent in other.agents {
            // The same preset named twice; two different ones both count.
            if !self.agents.iter().any(|a| a.name == agent.name) {
                self.agents.push(agent);
            }
        }
        Ok(())
    }

    /// Lets the guest reach the host's loopback `port` (`--host-port`).
    pub fn add_host_port(&mut self, port: Port, origin: &str) {
        if !self.host_ports.iter().any(|p| p.port == port) {
            self.host_ports.push(HostPort { port, origin: origin.into() });
        }
        if !self.sources.iter().any(|s| s == origin) {
            self.sources.push(origin.to_string());
        }
    }

    /// The address a `[network.hosts]` entry gives this name.
    pub fn pinned(&self, name: &str) -> Option<IpAddr> {
        self.hosts.iter().find(|p| p.name == name).map(|p| p.addr)
    }

    /// Checks that every host a sign-in rule names exactly is allowed: a
    /// rule for a host the guest cannot reach is a mistake in the policy.
    /// Only meaningful once all policies are merged, since one policy may
    /// allow what another's rule names. Wildcard hosts are not checked.
    pub fn check_signins(&self) -> Result<(), PolicyError> {
        for rule in &self.signins {
            for (host, port) in rule.exact_hosts() {
                if let Verdict::Deny(_) = self.verdict(&host, port) {
                    return Err(PolicyError::SigninHostNotAllowed { rule: rule.name(), host: host.to_string(), port });
                }
            }
        }
        Ok(())
    }

    /// The registry rule whose downloads or index are at a destination.
    pub fn registry_at(&self, host: &Host, port: Port) -> Option<&RegistryRule> {
        let at = |r: &&RegistryRule| r.url.is_at(host, port) || r.index.as_ref().is_some_and(|i| i.is_at(host, port));
        self.registries.iter().find(at)
    }

    /// The credential rule for a destination, if any.
    pub fn credential_for(&self, host: &Host, port: Port) -> Option<&CredentialRule> {
        self.credentials.iter().find(|c| c.host.matches(host, port))
    }
}

/// The policy `stockade run` enforces: each `--policy` (a name or a path),
/// merged in order, plus the `--allow` flags; with no `--policy`, the
/// `default` preset (nothing allowed).
pub fn resolve(names: &[String], allows: &[String]) -> Result<Policy, PolicyError> {
    resolve_in(user_policy_dir().as_deref(), names, allows)
}

/// [`resolve`] with the user's policy directory given.
pub fn resolve_in(user_dir: Option<&Path>, names: &[String], allows: &[String]) -> Result<Policy, PolicyError> {
    let mut policy = Policy::default();
    if names.is_empty() {
        policy.merge(load::load("default", user_dir)?)?;
    }
    for name in names {
        policy.merge(load::load(name, user_dir)?)?;
    }
    if !allows.is_empty() {
        policy.merge(load::allow_flags(allows)?)?;
    }
    policy.check_signins()?;
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(text: &str) -> Host {
        Host::parse(text).unwrap()
    }

    #[test]
    fn no_policy_means_the_default_preset_which_allows_nothing() {
        let policy = resolve_in(None, &[], &[]).unwrap();
        assert_eq!(policy.sources, ["preset default"]);
        assert!(matches!(policy.verdict(&host("example.com"), Port::HTTPS), Verdict::Deny(_)));
    }

    #[test]
    fn merged_policies_keep_deny_winning_over_allow() {
        let dir = std::env::temp_dir().join(format!("stockade-policy-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nogist.toml"), "[network]\ndeny = [\"gist.github.com\"]\n").unwrap();
        std::fs::write(dir.join("all-gh.toml"), "[network]\nallow = [\"*.github.com\"]\n").unwrap();
        let names = ["nogist".to_string(), "all-gh".to_string()];
        let policy = resolve_in(Some(&dir), &names, &["gist.github.com".into()]).unwrap();
        assert!(matches!(policy.verdict(&host("api.github.com"), Port::HTTPS), Verdict::Allow { .. }));
        match policy.verdict(&host("gist.github.com"), Port::HTTPS) {
            Verdict::Deny(Denial::DeniedBy(rule)) => assert!(rule.contains("nogist.toml"), "{rule}"),
            other => panic!("gist.github.com was not denied: {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_user_policy_shadows_the_preset_of_the_same_name() {
        let dir = std::env::temp_dir().join(format!("stockade-policy-shadow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("npm.toml"), "[network]\nallow = [\"npm.internal\"]\n").unwrap();
        let policy = resolve_in(Some(&dir), &["npm".into()], &[]).unwrap();
        assert_eq!(policy.allow[0].rule.to_string(), "npm.internal");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_names_list_the_presets() {
        let err = resolve_in(None, &["nope".into()], &[]).unwrap_err().to_string();
        assert!(err.contains("no policy named \"nope\"") && err.contains("cargo"), "{err}");
    }

    #[test]
    fn missing_files_name_the_path() {
        let err = resolve_in(None, &["/nonexistent/p.toml".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/p.toml"), "{err}");
    }

    #[test]
    fn conflicting_pins_and_credentials_are_errors() {
        let mut a = parse("[network.hosts]\n\"x.test\" = \"127.0.0.1\"\n", "a").unwrap();
        let b = parse("[network.hosts]\n\"x.test\" = \"127.0.0.2\"\n", "b").unwrap();
        assert!(matches!(a.merge(b), Err(PolicyError::HostsConflict { .. })));
        let cred =
            |v: &str| format!("[[credential]]\nhost = \"x.test\"\nheader = \"x-key\"\nvalue = {{ env = \"{v}\" }}\n");
        let mut a = parse(&cred("A"), "a").unwrap();
        assert!(a.merge(parse(&cred("A"), "a").unwrap()).is_ok(), "the same rule twice is fine");
        assert!(matches!(a.merge(parse(&cred("B"), "b").unwrap()), Err(PolicyError::CredentialConflict { .. })));
    }

    #[test]
    fn signin_hosts_must_be_allowed_once_merged() {
        let dir = std::env::temp_dir().join(format!("stockade-policy-signin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rule = "[[signin]]\nfile = \"~/.a.json\"\ntokens = [\"t\"]\nhosts = [\"api.test\", \"*.auth.test\"]\n";
        std::fs::write(dir.join("signin.toml"), rule).unwrap();
        std::fs::write(dir.join("net.toml"), "[network]\nallow = [\"api.test\"]\n").unwrap();
        let err = resolve_in(Some(&dir), &["signin".into()], &[]).unwrap_err().to_string();
        assert!(err.contains("~/.a.json (") && err.contains("api.test:443 is not allowed"), "{err}");
        // Another policy (or --allow) may allow it; wildcards are not checked.
        assert!(resolve_in(Some(&dir), &["signin".into(), "net".into()], &[]).is_ok());
        assert!(resolve_in(Some(&dir), &["signin".into()], &["api.test".into()]).is_ok());
        let mut same = resolve_in(Some(&dir), &["signin".into(), "net".into(), "signin".into()], &[]).unwrap();
        assert_eq!(same.signins.len(), 1, "the same rule twice is one rule");
        let other = parse(&rule.replace("\"t\"", "\"u\""), "other.toml").unwrap();
        assert!(matches!(same.merge(other), Err(PolicyError::SigninConflict { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_more_restrictive_mount_mode_wins() {
        let mut a = parse("[mounts]\n\"~/.claude\" = \"rw\"\n", "a").unwrap();
        a.merge(parse("[mounts]\n\"~/.claude\" = \"ro\"\n", "b").unwrap()).unwrap();
        a.merge(parse("[mounts]\n\"~/.claude\" = \"overlay\"\n", "c").unwrap()).unwrap();
        assert_eq!(a.mounts.len(), 1);
        assert_eq!(a.mounts[0].mode, MountMode::Ro);
        assert_eq!(a.mounts[0].host_path(Path::new("/home/u")), Path::new("/home/u/.claude"));
    }
}
