//! Sign-in rules: a coding agent's OAuth token file on the host, the JSON
//! paths of the secrets in it, and the hosts where the proxy writes the real
//! values. Only the description lives here; reading the file, placeholders
//! and writing tokens back are the proxy's job (`proxy::signin`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Describe;
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

/// A token endpoint, `https://HOST[:PORT]/PATH`: requests match it only
/// with exactly this path, no query, and the method POST (RFC 6749 3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUrl {
    pub host: Host,
    pub port: Port,
    pub path: String,
}

impl TokenUrl {
    pub fn parse(text: &str) -> Result<TokenUrl, String> {
        let uri: http::Uri = text.parse().map_err(|_| format!("token URL {text:?} is not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("token URL {text:?}: give an https:// URL (tokens only travel over checked TLS)"));
        }
        if uri.query().is_some() || text.contains(['@', '#']) {
            return Err(format!("token URL {text:?}: give it without a query, fragment or user name"));
        }
        let authority = uri.authority().ok_or_else(|| format!("token URL {text:?} has no host"))?;
        let host = Host::parse(authority.host()).map_err(|e| format!("token URL {text:?}: {e}"))?;
        let port = match authority.port_u16() {
            Some(port) => Port::new(port).ok_or_else(|| format!("token URL {text:?}: port 0"))?,
            None => Port::HTTPS,
        };
        let path = uri.path().to_string();
        if path == "/" {
            return Err(format!("token URL {text:?}: give the endpoint's path, as in \"/oauth/token\""));
        }
        Ok(TokenUrl { host, port, path })
    }

    /// Whether a request is sent to this endpoint: same destination,
    /// POST, and the path exactly, with no query.
    pub fn is(&self, host: &Host, port: Port, method: &http::Method, path_and_query: &str) -> bool {
        self.host == *host && self.port == port && method == http::Method::POST && path_and_query == self.path
    }
}

impl fmt::Display for TokenUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Port::HTTPS => write!(f, "https://{}{}", self.host, self.path),
            port => write!(f, "https://{}:{port}{}", self.host, self.path),
        }
    }
}

/// One `[[signin]]` rule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigninRule {
    /// The host's token file as the policy writes it (`~/` is the home
    /// directory); also where the guest gets its copy.
    pub file: String,
    pub tokens: Vec<TokenPath>,
    /// Where the real values are written (port 443 unless given): the
    /// access token in the Authorization header.
    pub hosts: Vec<HostRule>,
    /// The token endpoints: only a refresh request POSTed to one of these
    /// gets the real refresh token, and only their answers may change the
    /// host file.
    pub token_urls: Vec<TokenUrl>,
    /// The policy file or preset the rule came from.
    pub origin: Arc<str>,
}

impl Describe for SigninRule {
    fn describe(&self) -> String {
        let tokens: Vec<String> = self.tokens.iter().map(|t| t.to_string()).collect();
        let hosts: Vec<String> = self.hosts.iter().map(|h| h.to_string()).collect();
        let urls: Vec<String> = self.token_urls.iter().map(|u| u.to_string()).collect();
        let refresh = if urls.is_empty() { String::new() } else { format!(", refreshed at {}", urls.join(", ")) };
        format!("{}: {} for {}{refresh}", self.name(), tokens.join(", "), hosts.join(", "))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{parse, presets};

    #[test]
    fn token_urls_are_exact_https_endpoints_on_the_rules_hosts() {
        let url = TokenUrl::parse("https://Auth.test:8443/oauth/token").unwrap();
        assert_eq!(url.to_string(), "https://auth.test:8443/oauth/token");
        let host = Host::parse("auth.test").unwrap();
        let port = Port::new(8443).unwrap();
        assert!(url.is(&host, port, &http::Method::POST, "/oauth/token"));
        for (method, target) in [("GET", "/oauth/token"), ("POST", "/oauth/token?a=1"), ("POST", "/oauth/token/")] {
            assert!(!url.is(&host, port, &method.parse().unwrap(), target), "{method} {target}");
        }
        assert!(!url.is(&host, Port::HTTPS, &http::Method::POST, "/oauth/token"));
        for bad in ["http://auth.test/t", "https://auth.test/t?x=1", "https://u@auth.test/t", "https://auth.test", "t"]
        {
            assert!(TokenUrl::parse(bad).is_err(), "{bad} was accepted");
        }
        let rule = |url: &str| {
            let text = format!(
                "[[signin]]\nfile = \"/a.json\"\ntokens = [\"t\"]\nhosts = [\"auth.test\"]\ntoken_urls = [\"{url}\"]\n"
            );
            parse(&text, "t.toml").map(|p| p.signins[0].token_urls.len()).map_err(|e| e.to_string())
        };
        assert_eq!(rule("https://auth.test/token"), Ok(1));
        let err = rule("https://other.test/token").unwrap_err();
        assert!(err.starts_with("t.toml:5:") && err.contains("not on one of the rule's hosts"), "{err}");
        assert!(rule("https://auth.test:8443/token").is_err(), "another port is another host rule");
    }

    #[test]
    fn every_sign_in_preset_names_its_token_endpoint() {
        for (preset, url) in [
            ("claude", "https://platform.claude.com/v1/oauth/token"),
            ("codex", "https://auth.openai.com/oauth/token"),
            ("gemini", "https://oauth2.googleapis.com/token"),
        ] {
            let policy = parse(presets::get(preset).unwrap(), preset).unwrap();
            let urls: Vec<String> = policy.signins[0].token_urls.iter().map(ToString::to_string).collect();
            assert!(urls.contains(&url.to_string()), "{preset}: {urls:?}");
        }
    }
}
