//! The allow/deny decision for a destination, before any DNS: deny rules
//! first (so they win across merged policies), then allow rules; IP literals
//! only match rules that name the address. Also the words the guest reads
//! when it is refused.

use std::net::IpAddr;

use super::path::RequestPath;
use super::pattern::{Host, HostPattern, Port, PortSpec};
use super::{PathRule, Policy};
use crate::protocol::transparent::{GATEWAY_IP, HOST_ALIAS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `rule` names the rule and its policy (for the audit log);
    /// `private_ok` lets the destination be a loopback or private address.
    Allow {
        rule: String,
        private_ok: bool,
    },
    Deny(Denial),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// A deny rule matched (named with its policy).
    DeniedBy(String),
    /// No rule allows it.
    NotAllowed,
    /// An IP literal that no rule names.
    IpNeedsRule,
    /// Allowed by name, but every address it resolves to is loopback,
    /// private, link-local or otherwise internal.
    PrivateAddress(IpAddr),
    /// The host's own services: a port no `host_ports` entry lists.
    NotHostPort,
}

impl Denial {
    /// The reason in a few words, for the audit log.
    pub fn reason(&self) -> String {
        match self {
            Denial::DeniedBy(rule) => format!("denied by {rule}"),
            Denial::NotAllowed => "not in the policy".into(),
            Denial::IpNeedsRule => "an IP address needs an explicit rule".into(),
            Denial::PrivateAddress(addr) => format!("resolves to the internal address {addr}"),
            Denial::NotHostPort => "not one of the host ports".into(),
        }
    }

    /// What the guest is told: what was blocked, why, and how to allow it.
    pub fn message(&self, host: &Host, port: Port) -> String {
        let target = format!("{host}:{port}");
        // The rule to suggest: the bare host for the web ports, which is what
        // an allow rule without a port covers.
        let rule = if PortSpec::Web.matches(port) { host.to_string() } else { target.clone() };
        let how = match self {
            Denial::DeniedBy(_) => "Deny rules win over allow rules: remove that rule to reach it.".to_string(),
            Denial::NotAllowed => format!("Allow it with --allow {rule} or a [network] allow rule."),
            Denial::IpNeedsRule => {
                format!("Allow it with --allow {target} or a [network] allow rule naming the address.")
            }
            Denial::NotHostPort => format!(
                "To reach this machine's loopback port {port}, run with --host-port {port} or put {port} in \
                 [network] host_ports."
            ),
            Denial::PrivateAddress(_) => format!(
                "To reach a service on this machine or your network, put \"{rule}\" in [network] allow_private."
            ),
        };
        format!("stockade: blocked {target} ({}). {how}", self.reason())
    }
}

impl PathRule {
    /// What the guest is told when this rule refuses its request.
    pub fn message(&self, method: &str, host: &Host, port: Port, path: &str) -> String {
        format!(
            "stockade: blocked {method} {host}:{port}{path} (denied by {self}). \
             Deny rules win over allow rules: remove that rule to reach it."
        )
    }
}

impl Policy {
    /// The path deny rule that refuses a request to `host:port`, if any.
    pub fn denied_path(&self, host: &Host, port: Port, path: &RequestPath) -> Option<&PathRule> {
        self.deny_paths.iter().find(|r| r.rule.matches(host, port) && path.any_matches(std::iter::once(&r.path)))
    }

    /// Whether a path deny rule names `host:port`: then the proxy must see
    /// each request there, so its TLS is intercepted.
    pub fn has_path_rules(&self, host: &Host, port: Port) -> bool {
        self.deny_paths.iter().any(|r| r.rule.matches(host, port))
    }

    /// Whether some allow rule names port 22 (then the guest gets the
    /// host's ssh-agent, through the relay that signs only for SSH
    /// connections to allowed hosts).
    pub fn allows_ssh(&self) -> bool {
        let ssh = Port::SSH;
        self.allow.iter().chain(&self.allow_private).any(|r| r.rule.ports.matches(ssh))
    }

    /// The hosts named exactly by a rule allowing port 22, and allowed
    /// there (a deny rule may take one back), for the guest's known_hosts.
    pub fn ssh_hosts(&self) -> Vec<(Host, Port)> {
        let ssh = Port::SSH;
        let mut hosts: Vec<(Host, Port)> = Vec::new();
        for rule in self.allow.iter().chain(&self.allow_private) {
            let host = match &rule.rule.host {
                HostPattern::Exact(name) => Host::Name(name.clone()),
                HostPattern::Ip(ip) => Host::Ip(*ip),
                HostPattern::Subdomains(_) | HostPattern::AnyName => continue,
            };
            let allowed = matches!(self.verdict(&host, ssh), Verdict::Allow { .. });
            if rule.rule.ports.matches(ssh) && allowed && !hosts.iter().any(|(h, _)| *h == host) {
                hosts.push((host, ssh));
            }
        }
        hosts
    }

    /// Whether the guest may connect to `host:port`, before resolution.
    pub fn verdict(&self, host: &Host, port: Port) -> Verdict {
        if let Some(rule) = self.deny.iter().find(|r| r.rule.matches(host, port)) {
            return Verdict::Deny(Denial::DeniedBy(rule.to_string()));
        }
        if is_host_alias(host) {
            return match self.host_ports.iter().find(|p| p.port == port) {
                Some(entry) => {
                    Verdict::Allow { rule: format!("host port {port} ({})", entry.origin), private_ok: true }
                }
                None => Verdict::Deny(Denial::NotHostPort),
            };
        }
        if let Some(rule) = self.allow_private.iter().find(|r| r.rule.matches(host, port)) {
            return Verdict::Allow { rule: rule.to_string(), private_ok: true };
        }
        if let Some(rule) = self.allow.iter().find(|r| r.rule.matches(host, port)) {
            // A rule that spells out the address is as explicit as
            // allow_private: no DNS answer can surprise it.
            let private_ok = matches!(rule.rule.host, HostPattern::Ip(_));
            return Verdict::Allow { rule: rule.to_string(), private_ok };
        }
        // A credential rule is a request to reach its host.
        if let Some(cred) = self.credential_for(host, port) {
            let private_ok = matches!(cred.host.host, HostPattern::Ip(_));
            return Verdict::Allow { rule: format!("credential rule {}", cred.name()), private_ok };
        }
        Verdict::Deny(match host {
            Host::Ip(_) => Denial::IpNeedsRule,
            Host::Name(_) => Denial::NotAllowed,
        })
    }

    /// Whether the DNS answer for a name may be real: some rule allows the
    /// name on some port and no deny rule covers it on every port.
    pub fn allows_name(&self, host: &Host) -> bool {
        // Always answered: a connection then gets a refusal that says how to
        // allow its port, not a name that does not resolve.
        if is_host_alias(host) {
            return true;
        }
        let denied = self.deny.iter().any(|r| r.rule.ports == PortSpec::Any && r.rule.host.matches(host));
        let allowed = self.allow.iter().chain(&self.allow_private).any(|r| r.rule.host.matches(host))
            || self.credentials.iter().any(|c| c.host.host.matches(host));
        allowed && !denied
    }
}

/// Whether `host` means the host's own services: `HOST_ALIAS`, or the
/// gateway address it resolves to.
pub fn is_host_alias(host: &Host) -> bool {
    match host {
        Host::Name(name) => name == HOST_ALIAS,
        Host::Ip(ip) => *ip == IpAddr::V4(GATEWAY_IP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{RequestPath, parse};

    fn policy(text: &str) -> Policy {
        parse(text, "p.toml").unwrap()
    }

    fn host(text: &str) -> Host {
        Host::parse(text).unwrap()
    }

    #[test]
    fn denial_messages_name_the_host_and_the_fix() {
        let p = policy("");
        let Verdict::Deny(denial) = p.verdict(&host("example.com"), Port::HTTPS) else { panic!() };
        assert_eq!(
            denial.message(&host("example.com"), Port::HTTPS),
            "stockade: blocked example.com:443 (not in the policy). \
             Allow it with --allow example.com or a [network] allow rule."
        );
        let port = Port::new(8443).unwrap();
        assert!(denial.message(&host("example.com"), port).contains("--allow example.com:8443 "));
    }

    #[test]
    fn ip_literals_need_a_rule_naming_the_address() {
        let p = policy("[network]\nallow = [\"*\", \"10.0.0.5:8080\"]\n");
        assert_eq!(p.verdict(&host("1.2.3.4"), Port::HTTPS), Verdict::Deny(Denial::IpNeedsRule));
        assert!(matches!(
            p.verdict(&host("10.0.0.5"), Port::new(8080).unwrap()),
            Verdict::Allow { private_ok: true, .. }
        ));
    }

    #[test]
    fn deny_beats_allow_private_and_credentials() {
        let p = policy(
            "[network]\nallow_private = [\"a.test\"]\ndeny = [\"a.test\", \"b.test\"]\n\
             [[credential]]\nhost = \"b.test\"\nheader = \"x-k\"\nvalue = { env = \"K\" }\n",
        );
        assert!(matches!(p.verdict(&host("a.test"), Port::HTTPS), Verdict::Deny(Denial::DeniedBy(_))));
        assert!(matches!(p.verdict(&host("b.test"), Port::HTTPS), Verdict::Deny(Denial::DeniedBy(_))));
    }

    #[test]
    fn a_credential_rule_allows_its_host_on_its_port() {
        let p = policy("[[credential]]\nhost = \"api.x.com\"\nheader = \"x-k\"\nvalue = { env = \"K\" }\n");
        assert!(matches!(p.verdict(&host("api.x.com"), Port::HTTPS), Verdict::Allow { private_ok: false, .. }));
        assert!(matches!(p.verdict(&host("api.x.com"), Port::HTTP), Verdict::Deny(_)));
        assert!(p.allows_name(&host("api.x.com")));
    }

    #[test]
    fn the_github_preset_refuses_gists_keys_and_tokens_on_the_api() {
        let p = crate::policy::resolve_in(None, &["github".into()], &[]).unwrap();
        let api = host("api.github.com");
        let denied = |path: &str| p.denied_path(&api, Port::HTTPS, &RequestPath::parse(path)).map(|r| r.to_string());
        for path in [
            "/gists",
            "/gists/abc/comments",
            "/user/keys",
            "/user/gpg_keys",
            "/user/ssh_signing_keys",
            "/repos/me/app/keys",
            "/repos/me/app/hooks/1",
            "/repos/me/app/actions/runners/registration-token",
            "/repos/me/app/collaborators/attacker",
            "/authorizations",
            "/user/%6beys",
            "/repos/me/app/../app/keys",
        ] {
            let rule = denied(path).unwrap_or_else(|| panic!("{path} is not denied"));
            assert!(rule.starts_with("api.github.com/") && rule.ends_with("(preset github)"), "{rule}");
        }
        for path in ["/graphql", "/repos/me/app/pulls", "/user", "/users/me/keys", "/repos/me/app/issues"] {
            assert_eq!(denied(path), None, "{path}");
        }
        assert!(p.has_path_rules(&api, Port::HTTPS), "api.github.com must be intercepted");
        assert!(!p.has_path_rules(&host("github.com"), Port::HTTPS));
        assert!(matches!(p.verdict(&api, Port::HTTPS), Verdict::Allow { .. }), "the host itself stays allowed");
        assert!(p.allows_name(&api));
    }

    #[test]
    fn path_deny_rules_mean_the_web_ports_and_leave_the_host_allowed() {
        let p = policy("[network]\nallow = [\"a.test:*\"]\ndeny = [\"a.test/x\", \"b.test:8443/y\"]\n");
        let a = host("a.test");
        assert!(p.has_path_rules(&a, Port::HTTPS) && p.has_path_rules(&a, Port::HTTP));
        assert!(!p.has_path_rules(&a, Port::new(22).unwrap()));
        assert!(p.has_path_rules(&host("b.test"), Port::new(8443).unwrap()));
        assert!(matches!(p.verdict(&a, Port::HTTPS), Verdict::Allow { .. }));
        assert_eq!(p.deny_paths[0].to_string(), "a.test/x (p.toml)");
        assert_eq!(p.deny_paths[1].to_string(), "b.test:8443/y (p.toml)");
    }

    #[test]
    fn dns_answers_follow_the_rules_on_any_port() {
        let p = policy("[network]\nallow = [\"*.example.com\", \"git.example.com:22\"]\ndeny = [\"x.example.com\"]\n");
        assert!(p.allows_name(&host("www.example.com")));
        assert!(!p.allows_name(&host("x.example.com")));
        assert!(!p.allows_name(&host("example.org")));
        // Denied on one port only: the name still resolves for the others.
        let p = policy("[network]\nallow = [\"a.com:*\"]\ndeny = [\"a.com:25\"]\n");
        assert!(p.allows_name(&host("a.com")));
    }
}
