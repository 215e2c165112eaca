//! Credential rules: which header the proxy writes for which host, and where
//! the secret comes from. Only the description lives here; fetching values
//! is the proxy's job (`proxy::credentials`), so a policy never holds one.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

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
    /// The policy file or preset the rule came from.
    pub origin: Arc<str>,
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
