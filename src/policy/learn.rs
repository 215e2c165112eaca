//! `stockade policy learn`: a session's denials turned into the smallest
//! policy file that would have allowed them, for the user to review.
//!
//! Only denials that an allow rule lifts are learned: a host or address no
//! rule names, and a host allowed by name whose addresses are internal. A
//! deny rule's refusal is the policy working as its author meant, and the
//! rest (a TLS name that does not match its tunnel, an address that names
//! no site) are not a missing rule: those are listed in comments, never
//! allowed. Rules name exact hosts, never wildcards, and a port only when it
//! is not one of the web ports a bare host covers. What the guest asked of
//! the host's own services (`host.stockade.internal`) becomes `host_ports`.
//!
//! An internal destination (a loopback, private or link-local address, or
//! a name the guest had resolve to one) reaches this machine or its
//! network, and the guest picks the name: it is offered in
//! `allow_private`, the form that says so, commented out, for the user to
//! take on purpose. Link-local and cloud metadata addresses, where a cloud
//! machine's credentials are served, are never offered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::address::is_internal;
use super::pattern::{Host, canonical_ip};
use super::verdict::{Denial, is_host_alias};
use crate::protocol::audit::{Decision, Kind, Record};

/// Where a learned rule goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Allow,
    AllowPrivate,
    HostPorts,
}

/// What one host was denied, by port (0: a DNS question only).
#[derive(Debug, Default)]
struct Denied {
    ports: BTreeSet<u16>,
    count: usize,
    /// For an internal destination: what it reaches, in a few words.
    internal: Option<String>,
}

/// What a session's denials teach.
#[derive(Debug, Default)]
pub struct Lessons {
    hosts: BTreeMap<(Section, String), Denied>,
    /// Denials no allow rule would lift: (reason, host:port), counted.
    kept: BTreeMap<(String, String), usize>,
}

impl Lessons {
    pub fn from_records(records: &[Record]) -> Lessons {
        let mut lessons = Lessons::default();
        for record in records.iter().filter(|r| r.decision == Decision::Deny) {
            // A line past the audit log's cap may sum many denials.
            let times = usize::try_from(record.count()).unwrap_or(usize::MAX);
            let mut reason = record.reason.as_deref().unwrap_or("").to_string();
            // An exact host, never a pattern: the guest chose these names.
            let host = Host::parse(&record.host).ok();
            let alias = host.as_ref().is_some_and(is_host_alias);
            let internal = match &host {
                Some(Host::Ip(ip)) if reason == Denial::IpNeedsRule.reason() && is_internal(*ip) => Some(*ip),
                _ => reason.strip_prefix(private_prefix()).and_then(|a| a.trim().parse::<IpAddr>().ok()),
            };
            let section = if alias && reason == Denial::NotHostPort.reason() {
                Some(Section::HostPorts)
            } else if alias {
                None
            } else if let Some(ip) = internal {
                if is_metadata(ip) {
                    reason.push_str("; a link-local or cloud metadata address, never offered");
                    None
                } else {
                    Some(Section::AllowPrivate)
                }
            } else if reason == Denial::NotAllowed.reason() || reason == Denial::IpNeedsRule.reason() {
                Some(Section::Allow)
            } else {
                None
            };
            match section.zip(host) {
                Some((section, host)) => {
                    let denied = lessons.hosts.entry((section, host.to_string())).or_default();
                    denied.count += times;
                    denied.ports.insert(if record.kind == Kind::Dns { 0 } else { record.port });
                    denied.internal = internal.map(|ip| match host {
                        Host::Ip(_) => kind_of(ip).to_string(),
                        Host::Name(_) => format!("resolves to {ip}, {}", kind_of(ip)),
                    });
                }
                None => {
                    let target = if record.kind == Kind::Dns {
                        record.host.clone()
                    } else {
                        format!("{}:{}", record.host, record.port)
                    };
                    *lessons.kept.entry((reason, target)).or_default() += times;
                }
            }
        }
        lessons
    }

    /// Whether there is any rule to write.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The rules, as `policy check` reads them, per section.
    fn rules(&self, section: Section) -> Vec<(String, &Denied)> {
        let mut rules = Vec::new();
        if section == Section::HostPorts {
            for (_, denied) in self.hosts.range((section, String::new())..) {
                rules.extend(denied.ports.iter().filter(|&&p| p != 0).map(|port| (port.to_string(), denied)));
            }
            return rules;
        }
        for ((_, host), denied) in self.hosts.range((section, String::new())..).take_while(|((s, _), _)| *s == section)
        {
            let web = denied.ports.iter().any(|&p| p == 0 || p == 80 || p == 443);
            if web {
                rules.push((host.clone(), denied));
            }
            for port in denied.ports.iter().filter(|&&p| p != 0 && p != 80 && p != 443) {
                rules.push((format!("{host}:{port}"), denied));
            }
        }
        rules
    }

    /// The policy file: a header saying where it came from and how to use
    /// it, the rules with what each was denied, and the denials kept.
    pub fn render(&self, session: &str, command: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# Learned by `stockade policy learn` from session {session}");
        if !command.is_empty() {
            let _ = writeln!(out, "# ({}).", one_line(command));
        }
        out.push_str(
            "# Each rule lets the guest reach that host: keep only the ones you trust.\n\
             # Use it beside the policies the run had: stockade run --policy THIS_FILE ...\n",
        );
        let _ = writeln!(out, "description = {}", toml_string(&format!("Learned from session {session}")));
        out.push_str("\n[network]\n");
        for (section, key, note) in [
            (Section::Allow, "allow", None),
            (
                Section::AllowPrivate,
                "allow_private",
                Some(
                    "# Internal addresses, of this machine or your network: a rule here lets the guest reach\n\
                     # that address from this machine, so none is allowed as learned. Uncomment only those you mean.",
                ),
            ),
            (
                Section::HostPorts,
                "host_ports",
                Some("# Ports of this machine's loopback, which the guest reaches as host.stockade.internal."),
            ),
        ] {
            let rules = self.rules(section);
            if rules.is_empty() {
                continue;
            }
            if let Some(note) = note {
                let _ = writeln!(out, "{note}");
            }
            let _ = writeln!(out, "{key} = [");
            for (rule, denied) in rules {
                let denials = what_was_denied(denied);
                match (section, &denied.internal) {
                    (Section::HostPorts, _) => _ = writeln!(out, "    {rule}, # {denials}"),
                    (_, Some(what)) => _ = writeln!(out, "    # {}, # {what}; {denials}", toml_string(&rule)),
                    (_, None) => _ = writeln!(out, "    {}, # {denials}", toml_string(&rule)),
                }
            }
            out.push_str("]\n");
        }
        if !self.kept.is_empty() {
            out.push_str("\n# Denied and not learned (no allow rule is offered for these):\n");
            for ((reason, target), count) in &self.kept {
                let times = if *count > 1 { format!(" ({count} times)") } else { String::new() };
                let _ = writeln!(out, "#   {}: {}{times}", one_line(target), one_line(reason));
            }
        }
        out
    }
}

/// Addresses never offered, even commented out: link-local ones, where
/// cloud metadata services serve the machine's credentials
/// (169.254.169.254, 169.254.170.2), and the metadata services outside
/// that range (AWS's IPv6 one, Alibaba's).
fn is_metadata(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => v4.is_link_local() || v4 == Ipv4Addr::new(100, 100, 100, 200),
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80 || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
        }
    }
}

/// What an internal address reaches, in a few words.
fn kind_of(ip: IpAddr) -> &'static str {
    match canonical_ip(ip) {
        ip if ip.is_loopback() => "this machine's loopback",
        IpAddr::V4(v4) if v4.is_private() => "a private network address",
        IpAddr::V6(v6) if (v6.segments()[0] & 0xfe00) == 0xfc00 => "a private network address",
        _ => "an internal address",
    }
}

/// How the audit log words an internal-address denial, up to the address.
fn private_prefix() -> &'static str {
    "resolves to the internal address"
}

fn what_was_denied(denied: &Denied) -> String {
    let ports: Vec<String> =
        denied.ports.iter().map(|&p| if p == 0 { "DNS".to_string() } else { format!("port {p}") }).collect();
    let times = if denied.count == 1 { "1 denial".to_string() } else { format!("{} denials", denied.count) };
    format!("{times}: {}", ports.join(", "))
}

/// A TOML basic string: quotes, backslashes and controls escaped.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text from the guest or the run record, safe in a comment line: controls
/// (newlines included) and bidi or zero-width characters escaped.
fn one_line(text: &str) -> String {
    crate::util::text::display_bytes(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pattern::Port;
    use crate::policy::verdict::Verdict;

    fn denied(kind: Kind, host: &str, port: u16, reason: &str) -> Record {
        let mut r = Record::new(kind, host, port, Decision::Deny);
        r.reason = Some(reason.into());
        r
    }

    #[test]
    fn learns_hosts_and_ports_and_keeps_deny_rules() {
        let records = vec![
            denied(Kind::Dns, "pypi.org", 0, "not in the policy"),
            denied(Kind::Connect, "pypi.org", 443, "not in the policy"),
            denied(Kind::Connect, "files.pythonhosted.org", 443, "not in the policy"),
            denied(Kind::Connect, "db.example.com", 5432, "not in the policy"),
            denied(Kind::Dns, "only-dns.example", 0, "not in the policy"),
            denied(Kind::Connect, "10.1.2.3", 8080, "an IP address needs an explicit rule"),
            denied(Kind::Connect, "registry.local", 443, "resolves to the internal address 192.168.1.5"),
            denied(Kind::Https, "api.github.com", 443, "denied by api.github.com/gists (github)"),
            denied(Kind::Connect, "evil.example", 22, "denied by evil.example (mine)"),
            Record::new(Kind::Connect, "allowed.example", 443, Decision::Allow),
        ];
        let text = Lessons::from_records(&records).render("20261202-abc", "pip install x");
        let file: toml::Value = toml::from_str(&text).expect(&text);
        let allow: Vec<&str> =
            file["network"]["allow"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(allow, ["db.example.com:5432", "files.pythonhosted.org", "only-dns.example", "pypi.org"], "{text}");
        // Internal destinations are offered, not allowed.
        assert_eq!(file["network"]["allow_private"].as_array().unwrap().len(), 0, "{text}");
        assert!(text.contains("    # \"10.1.2.3:8080\", # a private network address; 1 denial: port 8080"), "{text}");
        assert!(text.contains("    # \"registry.local\", # resolves to 192.168.1.5"), "{text}");
        assert!(text.contains("#   api.github.com:443: denied by api.github.com/gists (github)"), "{text}");
        assert!(text.contains("#   evil.example:22: denied by evil.example (mine)"), "{text}");
        assert!(!text.contains("allowed.example"), "{text}");
        assert!(text.contains("\"pypi.org\", # 2 denials: DNS, port 443"), "{text}");
    }

    #[test]
    fn the_hosts_own_services_are_learned_as_host_ports() {
        let records = vec![
            denied(Kind::Connect, "host.stockade.internal", 5432, "not one of the host ports"),
            denied(Kind::Connect, "10.77.0.1", 8000, "not one of the host ports"),
            denied(Kind::Connect, "host.stockade.internal", 5432, "not one of the host ports"),
        ];
        let text = Lessons::from_records(&records).render("s", "psql");
        let file: toml::Value = toml::from_str(&text).expect(&text);
        let ports: Vec<i64> =
            file["network"]["host_ports"].as_array().unwrap().iter().map(|v| v.as_integer().unwrap()).collect();
        assert_eq!(ports, [8000, 5432], "{text}");
        assert!(file["network"].get("allow").is_none(), "the alias is never an allow rule\n{text}");
        crate::policy::parse(&text, "learned.toml").expect("policy check accepts it");
    }

    #[test]
    fn guest_chosen_names_cannot_break_out_of_the_file() {
        let records = vec![
            denied(Kind::Dns, "x\"]\n[credential]\nhost = \"y", 0, "not in the policy"),
            denied(Kind::Connect, "a.example\n[network]", 443, "denied by z\nallow = [\"*\"]"),
        ];
        let lessons = Lessons::from_records(&records);
        assert!(lessons.is_empty(), "a name that is no valid host rule is not learned");
        let text = lessons.render("s", "cmd\n[network]");
        let file: toml::Value = toml::from_str(&text).expect(&text);
        assert!(file.get("credential").is_none(), "{text}");
        assert!(file["network"].get("allow").is_none(), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("allow") || l.starts_with("[credential")), "{text}");
    }

    /// The internal destinations the guest asked for: none is allowed by
    /// the learned file as written; each but the metadata service is
    /// offered, commented out, in `allow_private`, and uncommenting it
    /// gives a policy that reaches it.
    #[test]
    fn internal_addresses_are_offered_commented_out_never_allowed() {
        let ip = "an IP address needs an explicit rule";
        let records = vec![
            denied(Kind::Connect, "10.1.2.3", 8080, ip),
            denied(Kind::Connect, "127.0.0.1", 5432, ip),
            denied(Kind::Connect, "fd12::1", 443, ip),
            denied(Kind::Connect, "169.254.169.254", 80, ip),
            denied(Kind::Connect, "fd00:ec2::254", 80, ip),
            denied(Kind::Connect, "100.100.100.200", 80, ip),
            denied(Kind::Connect, "registry.local", 443, "resolves to the internal address 192.168.1.5"),
            denied(Kind::Connect, "meta.attacker.example", 80, "resolves to the internal address 169.254.169.254"),
            denied(Kind::Connect, "8.8.8.8", 853, ip),
        ];
        let text = Lessons::from_records(&records).render("s", "curl");
        let policy = crate::policy::parse(&text, "learned.toml").expect(&text);
        let allowed: Vec<String> =
            policy.allow.iter().chain(&policy.allow_private).map(|r| r.rule.to_string()).collect();
        assert_eq!(allowed, ["8.8.8.8:853"], "{text}");
        for offered in ["\"10.1.2.3:8080\"", "\"127.0.0.1:5432\"", "\"[fd12::1]\"", "\"registry.local\""] {
            assert!(text.lines().any(|l| l.trim_start().starts_with(&format!("# {offered},"))), "{offered}\n{text}");
        }
        for metadata in ["169.254.169.254", "fd00:ec2::254", "100.100.100.200", "meta.attacker.example"] {
            assert!(!text.lines().any(|l| l.contains(metadata) && l.contains('"')), "{metadata} offered\n{text}");
            assert!(
                text.lines().any(|l| l.starts_with("#   ") && l.contains(metadata)),
                "{metadata} not listed\n{text}"
            );
        }
        let uncommented = text.replace("    # \"", "    \"");
        let policy = crate::policy::parse(&uncommented, "learned.toml").expect(&uncommented);
        let host = |h: &str| Host::parse(h).unwrap();
        for (h, port) in [("10.1.2.3", 8080), ("127.0.0.1", 5432), ("fd12::1", 443), ("registry.local", 443)] {
            let verdict = policy.verdict(&host(h), Port::new(port).unwrap());
            assert!(matches!(verdict, Verdict::Allow { private_ok: true, .. }), "{h}: {verdict:?}\n{uncommented}");
        }
    }

    #[test]
    fn an_ipv6_literal_is_bracketed() {
        let records = vec![denied(Kind::Connect, "2001:db8::1", 8443, "an IP address needs an explicit rule")];
        let text = Lessons::from_records(&records).render("s", "");
        assert!(text.contains("\"[2001:db8::1]:8443\""), "{text}");
    }
}
