//! `[[registry]]` rules: package registries whose downloads the proxy may
//! serve from the host's package cache, and where each registry publishes
//! the integrity data a download is checked against.
//!
//! ```toml
//! [[registry]]
//! kind = "crates"                           # npm | crates | pypi
//! url = "https://static.crates.io/crates/"  # where the packages are downloaded
//! index = "https://index.crates.io/"        # crates: the sparse index (checksums)
//! ```

use std::fmt;
use std::sync::Arc;

use super::Describe;
use super::pattern::{Host, Port};

/// How a registry lays out its downloads and where their digests are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegistryKind {
    /// Tarballs under `URL<name>/-/<file>.tgz`; the packument at
    /// `URL<name>` gives each version's `dist.integrity`.
    Npm,
    /// Crates under `URL<name>/<version>/download` or
    /// `URL<name>/<name>-<version>.crate`; the sparse index gives `cksum`.
    Crates,
    /// Files under `URL<b2>/<b2>/<b2 rest>/<file>`: the path is the file's
    /// BLAKE2b-256 digest.
    Pypi,
}

impl RegistryKind {
    pub const NAMES: &str = "npm, crates or pypi";

    pub fn parse(text: &str) -> Option<RegistryKind> {
        match text {
            "npm" => Some(RegistryKind::Npm),
            "crates" => Some(RegistryKind::Crates),
            "pypi" => Some(RegistryKind::Pypi),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RegistryKind::Npm => "npm",
            RegistryKind::Crates => "crates",
            RegistryKind::Pypi => "pypi",
        }
    }
}

impl fmt::Display for RegistryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `https://HOST[:PORT]/PATH/` location; the path starts and ends
/// with `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegistryUrl {
    pub host: Host,
    pub port: Port,
    pub path: String,
}

impl RegistryUrl {
    pub fn parse(text: &str) -> Result<RegistryUrl, String> {
        let uri: http::Uri = text.parse().map_err(|_| format!("{text:?} is not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("{text:?}: give an https:// URL (downloads are checked over TLS)"));
        }
        if uri.query().is_some() || text.contains('@') {
            return Err(format!("{text:?}: give the URL without a query or a user name"));
        }
        let authority = uri.authority().ok_or_else(|| format!("{text:?} has no host"))?;
        let host = Host::parse(authority.host()).map_err(|e| format!("{text:?}: {e}"))?;
        let port = match authority.port_u16() {
            Some(port) => Port::new(port).ok_or_else(|| format!("{text:?}: port 0"))?,
            None => Port::HTTPS,
        };
        let mut path = uri.path().to_string();
        if !path.ends_with('/') {
            path.push('/');
        }
        if path.split('/').any(|c| c == ".." || c == ".") {
            return Err(format!("{text:?}: give a path without . or .."));
        }
        Ok(RegistryUrl { host, port, path })
    }

    /// Whether a destination is this URL's.
    pub fn is_at(&self, host: &Host, port: Port) -> bool {
        self.host == *host && self.port == port
    }
}

impl fmt::Display for RegistryUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Port::HTTPS => write!(f, "https://{}{}", self.host, self.path),
            port => write!(f, "https://{}:{port}{}", self.host, self.path),
        }
    }
}

/// One `[[registry]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRule {
    pub kind: RegistryKind,
    /// Where packages are downloaded.
    pub url: RegistryUrl,
    /// The crates sparse index (`Crates` only).
    pub index: Option<RegistryUrl>,
    pub origin: Arc<str>,
}

/// With the crates index its checksums come from.
impl Describe for RegistryRule {
    fn describe(&self) -> String {
        match &self.index {
            Some(index) => format!("{self}, checksums from {index}"),
            None => self.to_string(),
        }
    }
}

impl RegistryRule {
    /// Checks the parts of a rule against each other.
    pub fn new(
        kind: RegistryKind,
        url: RegistryUrl,
        index: Option<RegistryUrl>,
        origin: Arc<str>,
    ) -> Result<RegistryRule, String> {
        match (kind, &index) {
            (RegistryKind::Crates, None) => {
                return Err("a crates registry needs `index`, the URL of its sparse index".into());
            }
            (RegistryKind::Npm | RegistryKind::Pypi, Some(_)) => {
                return Err(format!("`index` is only for crates registries; a {kind} registry has none"));
            }
            _ => {}
        }
        Ok(RegistryRule { kind, url, index, origin })
    }

    /// Whether it describes the same registry as `other`.
    pub fn same(&self, other: &RegistryRule) -> bool {
        self.kind == other.kind && self.url == other.url && self.index == other.index
    }
}

impl fmt::Display for RegistryRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} registry {} ({})", self.kind, self.url, self.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_https_with_a_directory_path() {
        let url = RegistryUrl::parse("https://Registry.npmjs.org").unwrap();
        assert_eq!(
            (url.host.to_string(), url.port, url.path.as_str()),
            ("registry.npmjs.org".into(), Port::HTTPS, "/")
        );
        let url = RegistryUrl::parse("https://crates.test:8443/api/v1/crates").unwrap();
        assert_eq!((url.port.get(), url.path.as_str()), (8443, "/api/v1/crates/"));
        assert_eq!(url.to_string(), "https://crates.test:8443/api/v1/crates/");
        for bad in ["http://registry.npmjs.org/", "registry.npmjs.org", "https://a.test/x?y=1", "https://a.test/../x/"]
        {
            assert!(RegistryUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn crates_need_an_index_and_only_crates_have_one() {
        let url = || RegistryUrl::parse("https://static.crates.io/crates/").unwrap();
        let index = || Some(RegistryUrl::parse("https://index.crates.io/").unwrap());
        assert!(RegistryRule::new(RegistryKind::Crates, url(), None, "t".into()).is_err());
        assert!(RegistryRule::new(RegistryKind::Crates, url(), index(), "t".into()).is_ok());
        assert!(RegistryRule::new(RegistryKind::Npm, url(), index(), "t".into()).is_err());
    }
}
