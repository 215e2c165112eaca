//! Reading one policy (a file, a preset or `--allow` flags) into a validated
//! [`Policy`], and finding a policy by name.

use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::credential::{CredentialRule, Scope, ValueSource};
use super::path::PathPattern;
use super::pattern::{Host, HostRule, Port, PortSpec};
use super::registry::{RegistryKind, RegistryRule, RegistryUrl};
use super::schema::{self, PolicyFile};
use super::signin::{SigninRule, TokenPath, TokenUrl};
use super::{AgentState, HostPort, Mount, NetworkRule, PathRule, PinnedHost, Policy, PolicyError, presets};

/// Where `--policy NAME` looks before the presets.
pub fn user_policy_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("STOCKADE_CONFIG_DIR") {
        return Some(PathBuf::from(dir).join("policies"));
    }
    crate::paths::project_dirs().map(|p| p.config_dir().join("policies"))
}

/// Whether a `--policy` argument is a path rather than a name.
pub fn is_path(arg: &str) -> bool {
    arg.contains('/') || arg.ends_with(".toml")
}

/// Loads `--policy ARG`: a path, else `DIR/ARG.toml` in the user's policy
/// directory, else the preset of that name.
pub fn load(arg: &str, user_dir: Option<&Path>) -> Result<Policy, PolicyError> {
    if is_path(arg) {
        return load_file(Path::new(arg));
    }
    if let Some(dir) = user_dir {
        let path = dir.join(format!("{arg}.toml"));
        if path.exists() {
            return load_file(&path);
        }
    }
    match presets::get(arg) {
        Some(text) => parse(text, &format!("preset {arg}")),
        None => Err(PolicyError::UnknownName {
            name: arg.to_string(),
            dir: user_dir.map(|d| d.display().to_string()).unwrap_or_else(|| "(no home directory)".into()),
            presets: presets::NAMES.join(", "),
        }),
    }
}

pub fn load_file(path: &Path) -> Result<Policy, PolicyError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: path.to_path_buf(), source })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates one policy's text; `origin` names it in errors and
/// in the rules it yields.
pub fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
    let at = |span: Option<Range<usize>>, message: String| {
        let (line, column) = span.map(|s| line_column(text, s.start)).unwrap_or((1, 1));
        PolicyError::Invalid { origin: origin.to_string(), line, column, message }
    };
    let file: PolicyFile = toml::from_str(text).map_err(|err| at(err.span(), err.message().to_string()))?;
    let origin: Arc<str> = Arc::from(origin);

    let rules = |list: &[&Spanned<String>], default_ports: PortSpec| -> Result<Vec<NetworkRule>, PolicyError> {
        list.iter()
            .map(|item| {
                if item.get_ref().contains('/') {
                    return Err(at(
                        Some(item.span()),
                        format!(
                            "{:?}: only deny rules can name a path; limit a credential to paths with `paths`",
                            item.get_ref()
                        ),
                    ));
                }
                HostRule::parse(item.get_ref(), default_ports)
                    .map(|rule| NetworkRule { rule, origin: origin.clone() })
                    .map_err(|err| at(Some(item.span()), err.to_string()))
            })
            .collect()
    };
    let (deny_paths, deny_hosts): (Vec<&Spanned<String>>, Vec<&Spanned<String>>) =
        file.network.deny.iter().partition(|item| item.get_ref().contains('/'));
    let mut policy = Policy {
        sources: vec![origin.to_string()],
        description: file.description.clone(),
        allow: rules(&file.network.allow.iter().collect::<Vec<_>>(), PortSpec::Web)?,
        allow_private: rules(&file.network.allow_private.iter().collect::<Vec<_>>(), PortSpec::Web)?,
        deny: rules(&deny_hosts, PortSpec::Any)?,
        ..Policy::default()
    };
    for item in deny_paths {
        let text = item.get_ref().trim();
        let slash = text.find('/').unwrap_or(text.len());
        // Paths only exist in HTTP: without a port, the web ports.
        let rule = HostRule::parse(&text[..slash], PortSpec::Web).map_err(|e| at(Some(item.span()), e.to_string()))?;
        let path = PathPattern::parse(&text[slash..]).map_err(|m| at(Some(item.span()), m))?;
        policy.deny_paths.push(PathRule { rule, path, origin: origin.clone() });
    }

    for (name, addr) in &file.network.hosts {
        let host = match Host::parse(name.get_ref()) {
            Ok(Host::Name(host)) => host,
            Ok(Host::Ip(_)) => return Err(at(Some(name.span()), format!("{name} is an address, not a name"))),
            Err(err) => return Err(at(Some(name.span()), err.to_string())),
        };
        let ip: IpAddr = addr
            .get_ref()
            .parse()
            .map_err(|_| at(Some(addr.span()), format!("{:?} is not an IP address", addr.get_ref())))?;
        policy.hosts.push(PinnedHost { name: host, addr: ip, origin: origin.clone() });
    }

    for item in &file.network.host_ports {
        let port = u16::try_from(*item.get_ref()).ok().and_then(Port::new).ok_or_else(|| {
            at(Some(item.span()), format!("host_ports: {} is not a port from 1 to 65535", item.get_ref()))
        })?;
        if !policy.host_ports.iter().any(|p| p.port == port) {
            policy.host_ports.push(HostPort { port, origin: origin.clone() });
        }
    }

    for cred in &file.credentials {
        policy.credentials.push(credential(cred, &origin, &at)?);
    }

    for rule in &file.signins {
        let rule = signin(rule, &origin, &at)?;
        if let Some(old) = policy.signins.iter().find(|s| s.file == rule.file) {
            return Err(PolicyError::SigninConflict {
                file: rule.file.clone(),
                first: old.name(),
                second: rule.name(),
            });
        }
        policy.signins.push(rule);
    }

    for item in &file.registries {
        let kind = RegistryKind::parse(item.kind.get_ref()).ok_or_else(|| {
            at(Some(item.kind.span()), format!("registry kind {:?}: give {}", item.kind.get_ref(), RegistryKind::NAMES))
        })?;
        let url = RegistryUrl::parse(item.url.get_ref()).map_err(|m| at(Some(item.url.span()), m))?;
        let index = match &item.index {
            Some(index) => Some(RegistryUrl::parse(index.get_ref()).map_err(|m| at(Some(index.span()), m))?),
            None => None,
        };
        let rule = RegistryRule::new(kind, url, index, origin.clone()).map_err(|m| at(Some(item.url.span()), m))?;
        if !policy.registries.iter().any(|r| r.same(&rule)) {
            policy.registries.push(rule);
        }
    }

    for (path, mode) in &file.mounts {
        let p = path.get_ref();
        if !is_home_or_absolute(p) {
            return Err(at(
                Some(path.span()),
                format!("mount {p:?}: give an absolute path or one under ~/, without .."),
            ));
        }
        policy.mounts.push(Mount { path: p.clone(), mode: *mode.get_ref(), origin: origin.clone() });
    }

    if let Some(agent) = &file.agent {
        policy.agents.push(agent_state(agent, &origin, &at)?);
    }

    for name in &file.env.pass {
        if !is_var_name(name.get_ref()) {
            return Err(at(Some(name.span()), format!("{:?} is not a variable name", name.get_ref())));
        }
        policy.env_pass.push(name.get_ref().clone());
    }
    Ok(policy)
}

fn agent_state(
    agent: &schema::Agent,
    origin: &Arc<str>,
    at: &impl Fn(Option<Range<usize>>, String) -> PolicyError,
) -> Result<AgentState, PolicyError> {
    let name = agent.name.get_ref();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(at(Some(agent.name.span()), format!("agent name {name:?}: use letters, digits and -")));
    }
    let home_path = |item: &Spanned<String>, what: &str| -> Result<String, PolicyError> {
        let p = item.get_ref();
        let rest = p.strip_prefix("~/").unwrap_or("");
        if rest.trim_end_matches('/').is_empty() || rest.split('/').any(|c| c == ".." || c == ".") {
            return Err(at(Some(item.span()), format!("agent {what} {p:?}: give a path under ~/, without . or ..")));
        }
        Ok(p.clone())
    };
    let state = agent.state.iter().map(|p| home_path(p, "state")).collect::<Result<Vec<_>, _>>()?;
    if state.is_empty() {
        return Err(at(Some(agent.name.span()), format!("agent {name}: name at least one state path")));
    }
    let inside_state = |item: &Spanned<String>, what: &str| -> Result<String, PolicyError> {
        let p = home_path(item, what)?;
        let inside = state.iter().any(|s| match s.strip_suffix('/') {
            Some(dir) => p.trim_end_matches('/') == dir || p.starts_with(s.as_str()),
            None => p == *s,
        });
        if !inside {
            return Err(at(Some(item.span()), format!("agent {what} {p:?} is not inside any of its state paths")));
        }
        Ok(p)
    };
    let seed = agent.seed.iter().map(|p| inside_state(p, "seed")).collect::<Result<Vec<_>, _>>()?;
    let review = agent.review.iter().map(|p| inside_state(p, "review")).collect::<Result<Vec<_>, _>>()?;
    Ok(AgentState {
        name: name.clone(),
        state,
        seed,
        review,
        drop_keys: agent.drop_keys.iter().map(|k| k.get_ref().clone()).collect(),
        origin: origin.clone(),
    })
}

fn credential(
    cred: &schema::Credential,
    origin: &Arc<str>,
    at: &impl Fn(Option<Range<usize>>, String) -> PolicyError,
) -> Result<CredentialRule, PolicyError> {
    // Without a port a credential rule means HTTPS: secrets only travel over
    // TLS that the proxy has verified.
    let host = HostRule::parse(cred.host.get_ref(), PortSpec::One(Port::HTTPS))
        .map_err(|err| at(Some(cred.host.span()), err.to_string()))?;
    let header = HeaderName::from_bytes(cred.header.get_ref().as_bytes())
        .map_err(|_| at(Some(cred.header.span()), format!("{:?} is not an HTTP header name", cred.header.get_ref())))?;
    let format = match &cred.format {
        Some(f) if f.get_ref().matches("{}").count() != 1 => {
            return Err(at(Some(f.span()), "format must contain {} exactly once, as in \"Bearer {}\"".into()));
        }
        Some(f) => f.get_ref().clone(),
        None => "{}".to_string(),
    };
    let v = cred.value.get_ref();
    let value_at = |message: &str| at(Some(cred.value.span()), message.to_string());
    let value = match (&v.env, &v.file, &v.command) {
        (Some(env), None, None) if v.ttl.is_none() => {
            if !is_var_name(env) {
                return Err(value_at(&format!("{env:?} is not a variable name")));
            }
            ValueSource::Env(env.clone())
        }
        (None, Some(file), None) if v.ttl.is_none() => ValueSource::File(PathBuf::from(file)),
        (None, None, Some(command)) => {
            let ttl = match &v.ttl {
                Some(text) => Some(parse_ttl(text).map_err(|m| value_at(&m))?),
                None => None,
            };
            ValueSource::Command { command: command.clone(), ttl }
        }
        (None, None, None) => return Err(value_at("value needs one of env, file or command")),
        _ if v.ttl.is_some() && v.command.is_none() => return Err(value_at("ttl only applies to a command")),
        _ => return Err(value_at("value takes only one of env, file or command")),
    };
    let guest_env = match &cred.guest_env {
        Some(name) if !is_var_name(name.get_ref()) => {
            return Err(at(Some(name.span()), format!("{:?} is not a variable name", name.get_ref())));
        }
        Some(name) => Some(name.get_ref().clone()),
        None => match &value {
            ValueSource::Env(name) => Some(name.clone()),
            _ => None,
        },
    };
    let mut scope = Scope::default();
    if let Some(methods) = &cred.methods {
        if methods.get_ref().is_empty() {
            return Err(at(
                Some(methods.span()),
                "methods: name at least one, as in [\"GET\"], or leave it out".into(),
            ));
        }
        let mut list = Vec::new();
        for m in methods.get_ref() {
            let method = http::Method::from_bytes(m.get_ref().as_bytes())
                .map_err(|_| at(Some(m.span()), format!("{:?} is not an HTTP method", m.get_ref())))?;
            list.push(method.as_str().to_ascii_uppercase());
        }
        scope.methods = Some(list);
    }
    if let Some(paths) = &cred.paths {
        if paths.get_ref().is_empty() {
            return Err(at(
                Some(paths.span()),
                "paths: name at least one, as in [\"/repos/\"], or leave it out".into(),
            ));
        }
        let list = paths
            .get_ref()
            .iter()
            .map(|p| PathPattern::parse(p.get_ref()).map_err(|m| at(Some(p.span()), m)))
            .collect::<Result<Vec<_>, _>>()?;
        scope.paths = Some(list);
    }
    Ok(CredentialRule {
        host,
        header,
        value,
        format,
        guest_env,
        optional: cred.optional,
        scope,
        origin: origin.clone(),
    })
}

fn signin(
    rule: &schema::Signin,
    origin: &Arc<str>,
    at: &impl Fn(Option<Range<usize>>, String) -> PolicyError,
) -> Result<SigninRule, PolicyError> {
    let file = rule.file.get_ref();
    if !is_home_or_absolute(file) || file == "~" || file.ends_with('/') {
        return Err(at(
            Some(rule.file.span()),
            format!("signin file {file:?}: give the token file as an absolute path or one under ~/, without .."),
        ));
    }
    if rule.tokens.get_ref().is_empty() {
        return Err(at(
            Some(rule.tokens.span()),
            "tokens: name at least one JSON path, as in \"tokens.access_token\"".into(),
        ));
    }
    let mut tokens = Vec::new();
    for text in rule.tokens.get_ref() {
        let path = TokenPath::parse(text.get_ref()).map_err(|m| at(Some(text.span()), m))?;
        if tokens.contains(&path) {
            return Err(at(Some(text.span()), format!("token path {path} is named twice")));
        }
        tokens.push(path);
    }
    if rule.hosts.get_ref().is_empty() {
        return Err(at(Some(rule.hosts.span()), "hosts: name at least one host where the tokens are used".into()));
    }
    // As for credentials: without a port, 443 only, so real tokens only
    // travel over TLS the proxy verified.
    let hosts = rule
        .hosts
        .get_ref()
        .iter()
        .map(|h| {
            HostRule::parse(h.get_ref(), PortSpec::One(Port::HTTPS)).map_err(|e| at(Some(h.span()), e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut token_urls = Vec::new();
    for text in &rule.token_urls {
        let url = TokenUrl::parse(text.get_ref()).map_err(|m| at(Some(text.span()), m))?;
        if !hosts.iter().any(|h| h.matches(&url.host, url.port)) {
            return Err(at(
                Some(text.span()),
                format!("token URL {url} is not on one of the rule's hosts; add its host"),
            ));
        }
        token_urls.push(url);
    }
    Ok(SigninRule { file: file.clone(), tokens, hosts, token_urls, origin: origin.clone() })
}

/// `/...` or `~/...` (or `~`), without a `..` component.
fn is_home_or_absolute(path: &str) -> bool {
    (path.starts_with('/') || path == "~" || path.starts_with("~/")) && !path.split('/').any(|c| c == "..")
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(ttl) if ttl >= Duration::from_secs(1) => Ok(ttl),
        Ok(_) => Err(format!("ttl {text:?} is too short: give at least 1s")),
        Err(_) => Err(format!("ttl {text:?} is not a duration: write e.g. \"55m\" or \"1h\"")),
    }
}

/// `--allow HOST[:PORT]` flags as one policy.
pub fn allow_flags(allows: &[String]) -> Result<Policy, PolicyError> {
    let origin: Arc<str> = Arc::from("--allow");
    let mut policy = Policy { sources: vec!["--allow".into()], ..Policy::default() };
    for text in allows {
        let rule = HostRule::parse(text, PortSpec::Web)
            .map_err(|reason| PolicyError::BadAllow { text: text.clone(), reason })?;
        policy.allow.push(NetworkRule { rule, origin: origin.clone() });
    }
    Ok(policy)
}

pub fn is_var_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::MountMode;

    fn error_of(text: &str) -> String {
        parse(text, "test.toml").unwrap_err().to_string()
    }

    #[test]
    fn parses_the_issue_example() {
        let text = r#"
[network]
allow = ["registry.npmjs.org", "*.crates.io", "github.com:443"]
deny  = ["gist.github.com"]

[[credential]]
host   = "api.anthropic.com"
header = "x-api-key"
value  = { env = "ANTHROPIC_API_KEY" }
format = "{}"

[mounts]
"~/.claude" = "rw"

[env]
pass = ["NODE_OPTIONS"]
"#;
        let policy = parse(text, "example.toml").unwrap();
        assert_eq!(policy.allow.len(), 3);
        assert_eq!(policy.deny[0].rule.to_string(), "gist.github.com:*");
        let cred = &policy.credentials[0];
        assert_eq!(cred.header.as_str(), "x-api-key");
        assert_eq!(cred.host.to_string(), "api.anthropic.com:443");
        assert_eq!(cred.guest_env.as_deref(), Some("ANTHROPIC_API_KEY"));
        assert_eq!(policy.mounts[0].mode, MountMode::Rw);
        assert_eq!(policy.env_pass, ["NODE_OPTIONS"]);
    }

    #[test]
    fn unknown_keys_are_errors_naming_file_and_line() {
        let err = error_of("[network]\nallow = []\nalow = [\"x.com\"]\n");
        assert!(err.starts_with("test.toml:3:"), "{err}");
        assert!(err.contains("alow"), "{err}");
        let err = error_of("[netwrok]\n");
        assert!(err.starts_with("test.toml:1:"), "{err}");
    }

    #[test]
    fn bad_patterns_are_errors_naming_the_line_and_column() {
        let err = error_of("[network]\nallow = [\n  \"ok.com\",\n  \"bad host\",\n]\n");
        assert!(err.starts_with("test.toml:4:3:"), "{err}");
        assert!(err.contains("bad host"), "{err}");
    }

    #[test]
    fn credential_values_take_exactly_one_source() {
        let base = "[[credential]]\nhost = \"a.com\"\nheader = \"authorization\"\n";
        let both = format!("{base}value = {{ env = \"A\", file = \"/x\" }}\n");
        assert!(error_of(&both).contains("only one of"), "{}", error_of(&both));
        let none = format!("{base}value = {{}}\n");
        assert!(error_of(&none).contains("one of env, file or command"));
        let ttl = format!("{base}value = {{ env = \"A\", ttl = \"5m\" }}\n");
        assert!(error_of(&ttl).contains("ttl only applies"));
        let bad_ttl = format!("{base}value = {{ command = \"true\", ttl = \"soon\" }}\n");
        assert!(error_of(&bad_ttl).contains("not a duration"));
        let fmt = format!("{base}value = {{ env = \"A\" }}\nformat = \"Bearer\"\n");
        assert!(error_of(&fmt).starts_with("test.toml:5:"), "{}", error_of(&fmt));
        let cmd = format!("{base}value = {{ command = \"gh auth token\", ttl = \"55m\" }}\nguest_env = \"GH_TOKEN\"\n");
        let policy = parse(&cmd, "t").unwrap();
        assert_eq!(
            policy.credentials[0].value,
            ValueSource::Command { command: "gh auth token".into(), ttl: Some(Duration::from_secs(55 * 60)) }
        );
        assert_eq!(policy.credentials[0].render("s"), "s");
    }

    #[test]
    fn agent_sections_are_checked() {
        let ok = parse(
            "[agent]\nname = \"claude\"\nstate = [\"~/.claude/\", \"~/.claude.json\"]\n\
             seed = [\"~/.claude/settings.json\", \"~/.claude/commands/\", \"~/.claude.json\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(ok.agents[0].state, ["~/.claude/", "~/.claude.json"]);
        assert!(error_of("[agent]\nname = \"a b\"\nstate = [\"~/.a/\"]\n").contains("letters, digits"));
        assert!(error_of("[agent]\nname = \"a\"\nstate = [\"/etc/\"]\n").contains("under ~/"));
        assert!(error_of("[agent]\nname = \"a\"\nstate = [\"~/../x\"]\n").contains("without . or .."));
        assert!(error_of("[agent]\nname = \"a\"\nstate = []\n").contains("at least one state path"));
        let outside = error_of("[agent]\nname = \"a\"\nstate = [\"~/.a/\"]\nseed = [\"~/.ab/x\"]\n");
        assert!(outside.starts_with("test.toml:4:") && outside.contains("not inside"), "{outside}");
    }

    #[test]
    fn bad_mount_modes_and_paths_are_refused() {
        assert!(error_of("[mounts]\n\"~/.x\" = \"rx\"\n").starts_with("test.toml:2:"));
        assert!(error_of("[mounts]\n\"rel/dir\" = \"ro\"\n").contains("absolute path"));
        assert!(error_of("[mounts]\n\"~/../etc\" = \"ro\"\n").contains("without .."));
    }

    #[test]
    fn hosts_entries_need_a_name_and_an_address() {
        let policy = parse("[network.hosts]\n\"api.test\" = \"127.0.0.1\"\n", "t").unwrap();
        assert_eq!(policy.hosts[0].name, "api.test");
        assert!(error_of("[network.hosts]\n\"api.test\" = \"localhost\"\n").contains("not an IP address"));
        assert!(error_of("[network.hosts]\n\"10.0.0.1\" = \"10.0.0.2\"\n").contains("not a name"));
    }

    #[test]
    fn host_ports_are_ports_and_allow_only_the_alias_on_them() {
        use crate::policy::{Denial, Verdict};
        let policy =
            parse("[network]\nhost_ports = [5432, 5432, 8000]\ndeny = [\"host.stockade.internal:8000\"]\n", "t")
                .unwrap();
        assert_eq!(policy.host_ports.len(), 2, "a port named twice counts once");
        let alias = Host::parse("host.stockade.internal").unwrap();
        let gateway = Host::parse("10.77.0.1").unwrap();
        for host in [&alias, &gateway] {
            assert!(matches!(policy.verdict(host, Port::new(5432).unwrap()), Verdict::Allow { private_ok: true, .. }));
            assert!(matches!(policy.verdict(host, Port::new(5433).unwrap()), Verdict::Deny(Denial::NotHostPort)));
        }
        assert!(matches!(policy.verdict(&alias, Port::new(8000).unwrap()), Verdict::Deny(Denial::DeniedBy(_))));
        assert!(parse("", "t").unwrap().allows_name(&alias), "the name resolves; its ports are refused");
        for bad in ["0", "70000", "-1"] {
            let err = error_of(&format!("[network]\nhost_ports = [{bad}]\n"));
            assert!(err.contains(&format!("host_ports: {bad} is not a port from 1 to 65535")), "{err}");
        }
    }

    #[test]
    fn signin_rules_parse_with_https_hosts_and_split_paths() {
        let text = "[[signin]]\nfile = \"~/.claude/.credentials.json\"\n\
                    tokens = [\"claudeAiOauth.accessToken\", \"claudeAiOauth.refreshToken\"]\n\
                    hosts = [\"api.anthropic.com\", \"console.anthropic.com:8443\"]\n";
        let policy = parse(text, "t.toml").unwrap();
        let rule = &policy.signins[0];
        assert_eq!(rule.name(), "~/.claude/.credentials.json (t.toml)");
        assert_eq!(rule.tokens[1].keys(), ["claudeAiOauth", "refreshToken"]);
        assert_eq!(rule.tokens[0].kind(), "accesstoken");
        assert_eq!(rule.refresh_path(), Some(1));
        let hosts: Vec<String> = rule.hosts.iter().map(|h| h.to_string()).collect();
        assert_eq!(hosts, ["api.anthropic.com:443", "console.anthropic.com:8443"]);
        assert_eq!(rule.host_path(Some(Path::new("/home/u"))).unwrap(), Path::new("/home/u/.claude/.credentials.json"));
        assert_eq!(rule.host_path(None), None);
    }

    #[test]
    fn bad_signin_rules_name_the_line() {
        let rule = |file: &str, tokens: &str, hosts: &str| {
            error_of(&format!("[[signin]]\nfile = \"{file}\"\ntokens = [{tokens}]\nhosts = [{hosts}]\n"))
        };
        let err = rule("rel/auth.json", "\"a\"", "\"x.test\"");
        assert!(err.starts_with("test.toml:2:") && err.contains("absolute path"), "{err}");
        assert!(rule("~/../auth.json", "\"a\"", "\"x.test\"").contains("without .."));
        let err = rule("~/a.json", "", "\"x.test\"");
        assert!(err.starts_with("test.toml:3:") && err.contains("at least one JSON path"), "{err}");
        assert!(rule("~/a.json", "\"a..b\"", "\"x.test\"").contains("joined by '.'"));
        assert!(rule("~/a.json", "\"a\", \"a\"", "\"x.test\"").contains("named twice"));
        let err = rule("~/a.json", "\"a\"", "");
        assert!(err.starts_with("test.toml:4:") && err.contains("at least one host"), "{err}");
        assert!(rule("~/a.json", "\"a\"", "\"bad host\"").starts_with("test.toml:4:"));
        assert!(error_of("[[signin]]\nfile = \"/a.json\"\nhosts = [\"x.test\"]\n").contains("tokens"));
        let twice = "[[signin]]\nfile = \"/a.json\"\ntokens = [\"a\"]\nhosts = [\"x.test\"]\n";
        assert!(error_of(&format!("{twice}{twice}")).contains("two [[signin]] rules for /a.json"));
    }

    #[test]
    fn bad_allow_flags_name_the_flag() {
        let err = allow_flags(&["ok.com".into(), "bad host".into()]).unwrap_err().to_string();
        assert!(err.starts_with("--allow bad host"), "{err}");
    }
}
