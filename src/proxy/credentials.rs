//! The secrets behind credential rules: fetched at start (so a missing one
//! is reported before the guest boots), kept only in this process, re-fetched
//! when a command's ttl runs out. Values never reach logs or Debug output.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::HeaderValue;
use tokio::sync::Mutex;

use super::ProxyError;
use super::form::form_encode;
use crate::policy::{CredentialRule, Host, PLACEHOLDER, Port, ValueSource};

/// How long a credential command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// After a refresh failed, requests fail without re-running the command for
/// this long, so a guest cannot make the host run it (and warn) at will.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The most a credential file or command output may hold.
const MAX_VALUE: usize = 64 * 1024;
/// How many of a rule's values answers are scrubbed of: the current one
/// and those a ttl replaced, which a request still in flight may carry.
const KEEP_WRITTEN: usize = 8;

/// A secret: Debug and Display never show it.
pub(super) struct Secret(pub(super) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

struct Active {
    rule: CredentialRule,
    value: Mutex<Cached>,
    /// The values fetched for the rule, newest last: what answers are
    /// scrubbed of. Apart from `value`, whose lock a refresh holds while
    /// its command runs.
    written: std::sync::Mutex<Vec<Secret>>,
}

impl Active {
    fn remember(&self, secret: &Secret) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if written.last().is_some_and(|last| last.0 == secret.0) {
            return;
        }
        if written.len() == KEEP_WRITTEN {
            written.remove(0);
        }
        written.push(Secret(secret.0.clone()));
    }
}

struct Cached {
    secret: Secret,
    fetched: Instant,
    /// The last refresh that failed, and why.
    failed: Option<(Instant, String)>,
}

/// Why a rule's header could not be written. The detail may quote the
/// command and what it printed, which can hold a secret: it is for the
/// host's user alone, never for the guest or the audit log.
#[derive(Debug)]
pub struct Unavailable {
    /// The rule, named as in messages.
    pub rule: String,
    detail: String,
    /// The same failure as a moment ago, not a new attempt.
    pub repeated: bool,
}

impl Unavailable {
    /// What failed, for the host's warning.
    pub fn host_detail(&self) -> &str {
        &self.detail
    }
}

/// The credential rules in force, with their values.
pub struct Credentials {
    active: Vec<Active>,
    home: Option<PathBuf>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.active.iter().map(|a| a.rule.name())).finish()
    }
}

impl Credentials {
    /// Fetches every rule's value. A rule whose value cannot be had is an
    /// error naming it, unless it is `optional`: then it is left out (its
    /// host is not intercepted and gets no placeholder), with a warning.
    pub async fn load(rules: &[CredentialRule], home: Option<&Path>) -> Result<Credentials, ProxyError> {
        let mut active = Vec::new();
        for rule in rules {
            match fetch(rule, home).await {
                Ok(secret) => {
                    let written = std::sync::Mutex::new(vec![Secret(secret.0.clone())]);
                    let cached = Cached { secret, fetched: Instant::now(), failed: None };
                    active.push(Active { rule: rule.clone(), value: Mutex::new(cached), written })
                }
                Err(reason) if rule.optional => {
                    tracing::warn!("credential rule {} is skipped: {reason}", rule.name());
                }
                Err(reason) => return Err(ProxyError::Credential { rule: rule.name(), reason }),
            }
        }
        Ok(Credentials { active, home: home.map(Path::to_path_buf) })
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// The index of the rule in force for a destination.
    pub fn rule_for(&self, host: &Host, port: Port) -> Option<usize> {
        self.active.iter().position(|a| a.rule.host.matches(host, port))
    }

    pub fn rule(&self, index: usize) -> Option<&CredentialRule> {
        self.active.get(index).map(|a| &a.rule)
    }

    /// The header value to write for rule `index`, re-fetching the secret
    /// if its ttl ran out.
    pub async fn header_value(&self, index: usize) -> Result<HeaderValue, Unavailable> {
        let Some(active) = self.active.get(index) else {
            let detail = "no such credential rule".to_string();
            return Err(Unavailable { rule: format!("#{index}"), detail, repeated: false });
        };
        let unavailable = |detail: String, repeated| Unavailable { rule: active.rule.name(), detail, repeated };
        let mut cached = active.value.lock().await;
        if let ValueSource::Command { ttl: Some(ttl), .. } = &active.rule.value {
            if cached.fetched.elapsed() >= *ttl {
                if let Some((when, detail)) = &cached.failed {
                    if when.elapsed() < RETRY_AFTER {
                        return Err(unavailable(detail.clone(), true));
                    }
                }
                match fetch(&active.rule, self.home.as_deref()).await {
                    Ok(secret) => {
                        active.remember(&secret);
                        *cached = Cached { secret, fetched: Instant::now(), failed: None }
                    }
                    Err(detail) => {
                        cached.failed = Some((Instant::now(), detail.clone()));
                        return Err(unavailable(detail, false));
                    }
                }
            }
        }
        let mut header = HeaderValue::from_str(&active.rule.render(&cached.secret.0))
            .map_err(|_| unavailable("the value is not a valid header value".into(), false))?;
        header.set_sensitive(true);
        Ok(header)
    }

    /// Every value a rule has written, in each spelling an echo may give
    /// it, with what the guest sees instead: the secret and the header
    /// value as written (`Bearer {}`), for a basic-auth header also the
    /// decoded `user:password` and the password; each as it is,
    /// form-encoded and JSON with `\/`.
    pub fn scrub_pairs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut pairs = Vec::new();
        for active in &self.active {
            let written = active.written.lock().unwrap_or_else(|e| e.into_inner());
            for secret in written.iter() {
                for (real, guest) in spellings(&active.rule, &secret.0) {
                    pairs.push((form_encode(&real).into_bytes(), form_encode(&guest).into_bytes()));
                    pairs.push((real.replace('/', "\\/").into_bytes(), guest.clone().into_bytes()));
                    pairs.push((real.into_bytes(), guest.into_bytes()));
                }
            }
        }
        pairs
    }

    /// The guest variables that stand in for the secrets, and their values.
    pub fn placeholders(&self) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = Vec::new();
        for active in &self.active {
            if let Some(name) = &active.rule.guest_env {
                if !vars.iter().any(|(n, _)| n == name) {
                    vars.push((name.clone(), PLACEHOLDER.to_string()));
                }
            }
        }
        vars
    }
}

/// A secret and the forms the rule writes it in, each with the same form
/// of the placeholder.
fn spellings(rule: &CredentialRule, secret: &str) -> Vec<(String, String)> {
    let header = rule.render(secret);
    let mut out = vec![(secret.to_string(), PLACEHOLDER.to_string()), (header.clone(), rule.render(PLACEHOLDER))];
    let basic = header.get(..6).filter(|scheme| scheme.eq_ignore_ascii_case("basic ")).map(|_| header[6..].trim());
    let decoded = basic.and_then(|b| String::from_utf8(BASE64.decode(b).ok()?).ok());
    if let Some((user, password)) = decoded.as_deref().and_then(|d| d.split_once(':')) {
        out.push((format!("{user}:{password}"), format!("{user}:{PLACEHOLDER}")));
        out.push((password.to_string(), PLACEHOLDER.to_string()));
    }
    out
}

async fn fetch(rule: &CredentialRule, home: Option<&Path>) -> Result<Secret, String> {
    let text = match &rule.value {
        ValueSource::Env(name) => match std::env::var(name) {
            Ok(value) => value,
            Err(std::env::VarError::NotPresent) => return Err(format!("{name} is not set")),
            Err(std::env::VarError::NotUnicode(_)) => return Err(format!("{name} is not valid UTF-8")),
        },
        ValueSource::File(path) => {
            let path = expand_home(path, home);
            let bytes = tokio::fs::read(&path).await.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if bytes.len() > MAX_VALUE {
                return Err(format!("{} is larger than {MAX_VALUE} bytes", path.display()));
            }
            String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?
        }
        ValueSource::Command { command, .. } => run(command).await?,
    };
    let value = text.trim().to_string();
    if value.is_empty() {
        return Err(format!("{} gave an empty value", rule.value));
    }
    if HeaderValue::from_str(&rule.render(&value)).is_err() {
        return Err(format!("{} gave a value with characters an HTTP header cannot hold", rule.value));
    }
    Ok(Secret(value))
}

async fn run(command: &str) -> Result<String, String> {
    let child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run `{command}`: {e}"))?;
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("`{command}` did not finish within {}s", COMMAND_TIMEOUT.as_secs()))?
        .map_err(|e| format!("`{command}` failed: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        let detail = if stderr.is_empty() { String::new() } else { format!(": {stderr}") };
        return Err(format!("`{command}` exited with {}{detail}", output.status));
    }
    if output.stdout.len() > MAX_VALUE {
        return Err(format!("`{command}` printed more than {MAX_VALUE} bytes"));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("`{command}` printed something that is not UTF-8"))
}

fn expand_home(path: &Path, home: Option<&Path>) -> PathBuf {
    match (path.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse;

    fn rules(value: &str, optional: bool) -> Vec<CredentialRule> {
        let text = format!(
            "[[credential]]\nhost = \"api.test\"\nheader = \"authorization\"\nformat = \"Bearer {{}}\"\n\
             guest_env = \"TOKEN\"\noptional = {optional}\nvalue = {value}\n"
        );
        parse(&text, "t.toml").unwrap().credentials
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn command_values_are_formatted_and_sensitive() {
        let creds = block_on(Credentials::load(&rules("{ command = \"echo s3cret\" }", false), None)).unwrap();
        let index = creds.rule_for(&Host::parse("api.test").unwrap(), Port::HTTPS).unwrap();
        let value = block_on(creds.header_value(index)).unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer s3cret");
        assert!(value.is_sensitive());
        assert_eq!(creds.placeholders(), [("TOKEN".to_string(), PLACEHOLDER.to_string())]);
        assert!(!format!("{creds:?}").contains("s3cret"));
    }

    #[test]
    fn a_failing_source_is_an_error_naming_the_rule() {
        let err = block_on(Credentials::load(&rules("{ env = \"STOCKADE_TEST_SURELY_UNSET\" }", false), None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("authorization for api.test:443 (t.toml)"), "{err}");
        assert!(err.contains("STOCKADE_TEST_SURELY_UNSET is not set"), "{err}");
        let err = block_on(Credentials::load(&rules("{ file = \"/nonexistent/token\" }", false), None)).unwrap_err();
        assert!(err.to_string().contains("cannot read /nonexistent/token"), "{err}");
        let err = block_on(Credentials::load(&rules("{ command = \"echo oops >&2; exit 3\" }", false), None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("exited with") && err.contains("oops"), "{err}");
    }

    #[test]
    fn optional_rules_that_fail_are_left_out() {
        let creds =
            block_on(Credentials::load(&rules("{ env = \"STOCKADE_TEST_SURELY_UNSET\" }", true), None)).unwrap();
        assert!(creds.is_empty());
        assert!(creds.placeholders().is_empty());
    }

    #[test]
    fn command_values_are_refreshed_after_their_ttl() {
        let dir = std::env::temp_dir().join(format!("stockade-cred-ttl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let counter = dir.join("n");
        let command = format!("echo x >> {0}; wc -l < {0}", counter.display());
        let creds =
            block_on(Credentials::load(&rules(&format!("{{ command = \"{command}\", ttl = \"1s\" }}"), false), None))
                .unwrap();
        let first = block_on(creds.header_value(0)).unwrap();
        assert_eq!(block_on(creds.header_value(0)).unwrap(), first, "cached within the ttl");
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(block_on(creds.header_value(0)).unwrap().to_str().unwrap(), "Bearer 2");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_values_expand_home_and_lose_the_newline() {
        let dir = std::env::temp_dir().join(format!("stockade-cred-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tok"), "abc\n").unwrap();
        let creds = block_on(Credentials::load(&rules("{ file = \"~/tok\" }", false), Some(&dir))).unwrap();
        assert_eq!(block_on(creds.header_value(0)).unwrap().to_str().unwrap(), "Bearer abc");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
