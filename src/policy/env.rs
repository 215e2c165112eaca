//! The host variables a policy passes to the guest (`[env] pass`). Index
//! and registry URLs often carry a token as their user information
//! (`https://user:TOKEN@pypi.corp/simple`); the guest gets such a URL
//! without it, so a token is never handed over by a variable a preset
//! passes. A credential rule for that host is how the token gets used.

use super::Policy;

/// A variable's value with the user information of every URL in it removed
/// (`scheme://user:pass@host` becomes `scheme://host`), and the hosts it was
/// removed for. URLs anywhere in the value count: lists separated by spaces
/// or commas, `name=URL` pairs. Tokens in a URL's path or query are not
/// recognised.
pub fn without_url_credentials(value: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(value.len());
    let mut hosts = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // RFC 3986: the authority ends at the first /, ? or #; here also at
        // whatever separates the URLs of a list.
        let end = after.find(|c: char| matches!(c, '/' | '?' | '#' | ',' | ';') || c.is_whitespace());
        let authority = &after[..end.unwrap_or(after.len())];
        match authority.rfind('@') {
            Some(userinfo_end) => {
                let host = &authority[userinfo_end + 1..];
                hosts.push(host.to_string());
                out.push_str(host);
            }
            None => out.push_str(authority),
        }
        rest = &after[authority.len()..];
    }
    out.push_str(rest);
    (out, hosts)
}

impl Policy {
    /// The `[env] pass` variables set on the host (per `getenv`), as
    /// (name, value) for the guest, URL credentials removed with a warning.
    pub fn passed_env(&self, getenv: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        for name in &self.env_pass {
            let Some(value) = getenv(name) else {
                tracing::info!("{name}: not set on the host, not passed");
                continue;
            };
            let (value, hosts) = without_url_credentials(&value);
            for host in hosts {
                tracing::warn!(
                    "{name}: its URL for {host} holds a user name or token, which is not passed to the guest; \
                     write a [[credential]] rule for {host} to use it there"
                );
            }
            vars.push((name.clone(), value));
        }
        vars
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::resolve_in;

    #[test]
    fn user_information_is_removed_from_every_url() {
        let strip = |v: &str| without_url_credentials(v).0;
        assert_eq!(strip("https://user:tok3n@pypi.corp/simple"), "https://pypi.corp/simple");
        assert_eq!(strip("https://tok3n@pypi.fury.io/me/"), "https://pypi.fury.io/me/");
        assert_eq!(strip("https://u:p%40ss@h.test:8443"), "https://h.test:8443");
        assert_eq!(strip("https://u:p@ss@h.test/x"), "https://h.test/x");
        assert_eq!(
            strip("https://a:1@one.test/simple https://b:2@two.test/simple,http://c:3@three.test"),
            "https://one.test/simple https://two.test/simple,http://three.test"
        );
        assert_eq!(strip("corp=https://u:t@corp.test/simple"), "corp=https://corp.test/simple");
        let (same, hosts) = without_url_credentials("https://pypi.org/simple");
        assert_eq!((same.as_str(), hosts.len()), ("https://pypi.org/simple", 0));
        assert_eq!(strip("--max-old-space-size=4096"), "--max-old-space-size=4096");
        assert_eq!(strip("https://h.test/pkg@1.0"), "https://h.test/pkg@1.0", "an @ in the path is no userinfo");
        assert_eq!(without_url_credentials("https://u:t@corp.test/").1, ["corp.test"]);
    }

    /// The pypi preset passes the index variables, which commonly hold a
    /// private index's token: the guest must get the URLs without it.
    #[test]
    fn the_pypi_preset_passes_index_urls_without_their_tokens() {
        let policy = resolve_in(None, &["pypi".into()], &[]).unwrap();
        let host = |name: &str| match name {
            "PIP_INDEX_URL" => Some("https://__token__:pypi-S3CRET@pypi.corp/simple".to_string()),
            "PIP_EXTRA_INDEX_URL" => Some("https://me:S3CRET2@extra.corp/simple https://pypi.org/simple".to_string()),
            "UV_INDEX_URL" => Some("https://oauth2accesstoken:S3CRET3@uv.corp/simple".to_string()),
            "UV_EXTRA_INDEX_URL" => Some("https://u:S3CRET4@uv-extra.corp/simple".to_string()),
            "UV_INDEX" => Some("corp=https://u:S3CRET5@uv-index.corp/simple".to_string()),
            _ => None,
        };
        let passed = policy.passed_env(host);
        assert!(!passed.is_empty());
        for (name, value) in &passed {
            assert!(!value.contains("S3CRET") && !value.contains('@'), "{name}={value} reaches the guest");
        }
        let get = |n: &str| passed.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("PIP_INDEX_URL"), Some("https://pypi.corp/simple"));
        assert_eq!(get("PIP_EXTRA_INDEX_URL"), Some("https://extra.corp/simple https://pypi.org/simple"));
    }
}
