//! The merged policy for people (`stockade policy show`): a section per
//! kind of rule, each rule in the one line its kind writes for itself
//! ([`Describe`], implemented where each kind is defined); and the count
//! of its rules `stockade policy check` prints.

use std::fmt::Write as _;

use super::Policy;

/// A kind of policy rule as `stockade policy show` lists it: one line, with
/// the policy the rule came from.
pub trait Describe {
    fn describe(&self) -> String;
}

impl Policy {
    /// Every rule with the policy it came from, in sections by kind.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Policy: {}", self.sources.join(" + "));
        if self.allow.is_empty()
            && self.allow_private.is_empty()
            && self.credentials.is_empty()
            && self.host_ports.is_empty()
        {
            out.push_str("Network: nothing allowed\n");
        }
        section(&mut out, "Allow (no port: 80 and 443)", &self.allow);
        section(&mut out, "Allow, also to private addresses", &self.allow_private);
        section(&mut out, "Host ports (this machine's loopback, as the guest names it)", &self.host_ports);
        section(&mut out, "Deny (wins over allow; no port: all ports)", &self.deny);
        section(
            &mut out,
            "Deny requests under a path (HTTPS read by the proxy; no port: 80 and 443)",
            &self.deny_paths,
        );
        section(&mut out, "Pinned names", &self.hosts);
        section(&mut out, "Credentials (written by the proxy; the guest sees a placeholder)", &self.credentials);
        section(&mut out, "Sign-in tokens (kept on the host; the guest's copy holds placeholders)", &self.signins);
        section(
            &mut out,
            "Package registries (downloads checked against the registry's digests, kept in the host's cache)",
            &self.registries,
        );
        section(&mut out, "Mounts", &self.mounts);
        section(&mut out, "Agent state (kept by stockade, never written to the host's copy)", &self.agents);
        section(&mut out, "Variables passed", &self.env_pass);
        out
    }

    /// How many rules of the main kinds it holds, in one line (`stockade
    /// policy check`).
    pub fn counts(&self) -> String {
        format!(
            "{} allow, {} allow_private, {} deny, {} credential, {} signin, {} mount rules",
            self.allow.len(),
            self.allow_private.len(),
            self.deny.len() + self.deny_paths.len(),
            self.credentials.len(),
            self.signins.len(),
            self.mounts.len()
        )
    }
}

/// A variable passed to the command, by name.
impl Describe for String {
    fn describe(&self) -> String {
        self.clone()
    }
}

/// A titled section with a line per rule; nothing when there is no rule.
fn section<R: Describe>(out: &mut String, title: &str, rules: &[R]) {
    if rules.is_empty() {
        return;
    }
    let _ = writeln!(out, "{title}:");
    for rule in rules {
        let _ = writeln!(out, "  {}", rule.describe());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn describes_merged_rules_with_their_origin() {
        let policy =
            crate::policy::resolve_in(None, &["npm".into(), "claude".into()], &["example.com:8443".into()]).unwrap();
        let text = policy.describe();
        assert!(text.starts_with("Policy: preset npm + preset claude + --allow\n"), "{text}");
        assert!(text.contains("  registry.npmjs.org (preset npm)"), "{text}");
        assert!(text.contains("  example.com:8443 (--allow)"), "{text}");
        assert!(
            text.contains("x-api-key for api.anthropic.com:443 (preset claude) from env ANTHROPIC_API_KEY"),
            "{text}"
        );
        assert!(
            text.contains("  claude: ~/.claude/, ~/.claude.json (preset claude); seeded from ~/.claude/settings.json"),
            "{text}"
        );
        assert!(crate::policy::resolve_in(None, &[], &[]).unwrap().describe().contains("nothing allowed"));
        let signin = "[network]\nallow = [\"auth.test\"]\n[[signin]]\nfile = \"~/.a/auth.json\"\n\
                      tokens = [\"tokens.access_token\", \"tokens.refresh_token\"]\nhosts = [\"auth.test\"]\n\
                      token_urls = [\"https://auth.test/token\"]\n";
        let text = crate::policy::parse(signin, "a.toml").unwrap().describe();
        assert!(
            text.contains(
                "  ~/.a/auth.json (a.toml): tokens.access_token, tokens.refresh_token for auth.test:443, \
                 refreshed at https://auth.test/token\n"
            ),
            "{text}"
        );
    }
}
