//! Credential rules: which header the proxy writes for which host, and where
//! the secret comes from. Only the description lives here; fetching values
//! is the proxy's job (`proxy::credentials`), so a policy never holds one.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::Describe;
use super::path::{PathPattern, RequestPath};
use super::pattern::HostRule;

/// The value the guest sees in place of a secret: non-empty, so clients
/// still send their auth header, which the proxy then replaces.
pub const PLACEHOLDER: &str = "stockade-placeholder";

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// A variable of stockade's own environment.
    Env(String),
    /// A file's contents, trailing newline removed (`~/` is the home directory).
    File(PathBuf),
    /// A shell command's standard output, trimmed; re-run after `ttl` (never,
    /// when absent).
    Command { command: String, ttl: Option<Duration> },
}

impl fmt::Display for ValueSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueSource::Env(name) => write!(f, "env {name}"),
            ValueSource::File(path) => write!(f, "file {}", path.display()),
            ValueSource::Command { command, ttl: Some(ttl) } => {
                write!(f, "command `{command}` (ttl {})", humantime::format_duration(*ttl))
            }
            ValueSource::Command { command, ttl: None } => write!(f, "command `{command}`"),
        }
    }
}

/// One `[[credential]]` rule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialRule {
    /// The host (and port, 443 when not given) the header is written for.
    pub host: HostRule,
    pub header: HeaderName,
    pub value: ValueSource,
    /// The header value with `{}` where the secret goes.
    pub format: String,
    /// The guest variable set to [`PLACEHOLDER`].
    pub guest_env: Option<String>,
    pub optional: bool,
    /// The requests the header is written for; others on the host are sent
    /// without it (and without the guest's own).
    pub scope: Scope,
    /// The policy file or preset the rule came from.
    pub origin: Arc<str>,
}

impl Describe for CredentialRule {
    fn describe(&self) -> String {
        let optional = if self.optional { ", optional" } else { "" };
        let guest = self.guest_env.as_ref().map(|v| format!(", guest {v}")).unwrap_or_default();
        let scope = if self.scope.is_all() { String::new() } else { format!(", only for {}", self.scope) };
        format!("{} from {}{guest}{optional}{scope}", self.name(), self.value)
    }
}

/// Which requests on its host a credential rule covers: all, unless
/// limited by method (upper case) or path prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub methods: Option<Vec<String>>,
    pub paths: Option<Vec<PathPattern>>,
}

impl Scope {
    pub fn is_all(&self) -> bool {
        self.methods.is_none() && self.paths.is_none()
    }

    /// Whether a request is covered: each method it names (its own, and
    /// any a method-override header asks for; in any case) is listed, and
    /// every reading of its path begins with a listed prefix.
    pub fn covers<'a>(&self, mut methods: impl Iterator<Item = &'a str>, path: &RequestPath) -> bool {
        let method_ok = match &self.methods {
            Some(listed) => methods.all(|method| listed.iter().any(|m| m.eq_ignore_ascii_case(method))),
            None => true,
        };
        let path_ok = match &self.paths {
            Some(paths) => path.all_match(paths),
            None => true,
        };
        method_ok && path_ok
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let methods = self.methods.as_ref().map(|m| m.join(", "));
        let paths = self.paths.as_ref().map(|p| p.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "));
        match (methods, paths) {
            (None, None) => f.write_str("every request"),
            (Some(methods), None) => write!(f, "{methods} requests"),
            (None, Some(paths)) => write!(f, "requests under {paths}"),
            (Some(methods), Some(paths)) => write!(f, "{methods} requests under {paths}"),
        }
    }
}

impl CredentialRule {
    /// How messages and the audit log name the rule (never with its value).
    pub fn name(&self) -> String {
        format!("{} for {} ({})", self.header, self.host, self.origin)
    }

    /// The header value for a secret.
    pub fn render(&self, secret: &str) -> String {
        self.format.replacen("{}", secret, 1)
    }
}
