//! Sign-in rules: a coding agent's OAuth token file on the host, the JSON
//! paths of the secrets in it, and the hosts where the proxy writes the real
//! values. Only the description lives here; reading the file, placeholders
//! and writing tokens back are the proxy's job (`proxy::signin`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::pattern::{Host, HostPattern, HostRule, Port, PortSpec};

/// A dotted JSON path (`claudeAiOauth.accessToken`), split into its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPath(Vec<String>);

impl TokenPath {
    pub fn parse(text: &str) -> Result<TokenPath, String> {
        let keys: Vec<String> = text.split('.').map(str::to_string).collect();
        if keys.iter().any(String::is_empty) {
            return Err(format!("token path {text:?}: give object keys joined by '.', as in \"tokens.access_token\""));
        }
        Ok(TokenPath(keys))
    }

    pub fn keys(&self) -> &[String] {
        &self.0
    }

    /// The key that holds the value.
    pub fn last(&self) -> &str {
        self.0.last().map_or("", String::as_str)
    }

    /// The last key without `_`, lower-cased: `accessToken` and
    /// `access_token` are both `accesstoken`, which is how a path is matched
    /// to a field of a token endpoint's answer.
    pub fn kind(&self) -> String {
        self.last().chars().filter(|c| *c != '_').collect::<String>().to_ascii_lowercase()
    }
}

impl fmt::Display for TokenPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

/// One `[[signin]]` rule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigninRule {
    /// The host's token file as the policy writes it (`~/` is the home
    /// directory); also where the guest gets its copy.
    pub file: String,
    pub tokens: Vec<TokenPath>,
    /// Where the real values are written (port 443 unless given).
    pub hosts: Vec<HostRule>,
    /// The policy file or preset the rule came from.
    pub origin: Arc<str>,
}

impl SigninRule {
    /// How messages and the audit log name the rule (never with a value).
    pub fn name(&self) -> String {
        format!("{} ({})", self.file, self.origin)
    }

    /// The host's file; `None` for a `~/` path without a home directory.
    pub fn host_path(&self, home: Option<&Path>) -> Option<PathBuf> {
        match self.file.strip_prefix("~/") {
            Some(rest) => home.map(|h| h.join(rest)),
            None => Some(PathBuf::from(&self.file)),
        }
    }

    pub fn matches(&self, host: &Host, port: Port) -> bool {
        self.hosts.iter().any(|h| h.matches(host, port))
    }

    /// The path whose last key names a refresh token, if any.
    pub fn refresh_path(&self) -> Option<usize> {
        self.tokens.iter().position(|t| t.kind() == "refreshtoken")
    }

    /// Destinations the rule names exactly, to check against the network
    /// rules; wildcards are left out (a wildcard cannot be checked by
    /// asking about one name).
    pub fn exact_hosts(&self) -> impl Iterator<Item = (Host, Port)> + '_ {
        self.hosts.iter().filter_map(|rule| {
            let host = match &rule.host {
                HostPattern::Exact(name) => Host::Name(name.clone()),
                HostPattern::Ip(ip) => Host::Ip(*ip),
                HostPattern::Subdomains(_) | HostPattern::AnyName => return None,
            };
            let port = match rule.ports {
                PortSpec::One(port) => port,
                PortSpec::Web | PortSpec::Any => Port::HTTPS,
            };
            Some((host, port))
        })
    }
}
