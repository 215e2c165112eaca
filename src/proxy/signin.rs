//! Sign-in tokens kept on the host (`[[signin]]` rules). The guest gets a
//! copy of an agent's token file with placeholders where the secrets were;
//! on the rule's hosts (intercepted, upstream verified) the proxy writes the
//! real values for placeholders in requests (the Authorization header, and
//! the body of token requests only: a prompt or any other body the server
//! may echo back would hand the guest the secret), gives the guest fresh
//! placeholders for tokens in JSON answers, and writes refreshed tokens back
//! to the host's file, so the host's agent keeps working after the guest
//! rotated its refresh token. The real values never reach the guest, logs or
//! Debug output.
//!
//! The host file is only written from an answer to a refresh of the host's
//! own sign-in (the request's `refresh_token` is the placeholder of the
//! file's refresh token), or, when there was no file, from a token endpoint
//! answer: anything else could let a guest swap in another account's tokens.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};

use super::ProxyError;
use super::credentials::Secret;
use crate::policy::{Host, Port, SigninRule, TokenPath};

/// How every placeholder begins; 32 random hex digits follow.
pub const PLACEHOLDER_PREFIX: &str = "stockade-signin-";
const MARKER_HEX: usize = 32;
/// The most of a token request or answer the proxy holds to rewrite;
/// larger bodies pass unchanged (a placeholder in one reaches the server
/// as it is, which gives nothing away).
pub const MAX_BODY: usize = 1 << 20;
/// The most a host token file may hold.
const MAX_FILE: u64 = 1 << 20;
/// Fields of a JSON answer that carry tokens the guest must not see.
const TOKEN_FIELDS: [&str; 6] = ["access_token", "refresh_token", "id_token", "accessToken", "refreshToken", "idToken"];

/// A guest copy of a rule's token file.
#[derive(Clone)]
pub struct SigninFile {
    /// The file as the policy names it, e.g. `~/.claude/.credentials.json`.
    pub file: String,
    /// The host file's JSON with placeholders at the token paths.
    pub content: Vec<u8>,
}

/// An answer body with placeholders in, and what was saved on the host.
pub type Rewritten = (Vec<u8>, Option<Saved>);

impl std::fmt::Debug for SigninFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigninFile({}, {} bytes)", self.file, self.content.len())
    }
}

/// A placeholder and what it stands for.
struct Entry {
    /// The whole string the guest holds: the marker, or for a JWT its
    /// header and payload with the marker as signature.
    guest: String,
    real: Secret,
    /// The rule on whose hosts it is replaced.
    rule: usize,
}

/// What the proxy knows of a rule's host file.
struct FileState {
    /// The file exists (at start, or the proxy made it since): only a
    /// refresh of its own sign-in may then change it.
    exists: bool,
    /// The guest's placeholder for the file's refresh token.
    own_refresh: Option<String>,
}

struct Active {
    rule: SigninRule,
    path: Option<PathBuf>,
    guest_file: Option<Vec<u8>>,
    /// Held while the file is read or written.
    state: Mutex<FileState>,
}

/// The sign-in rules in force, and the placeholders handed out.
pub struct Signins {
    active: Vec<Active>,
    /// By marker.
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Signins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.entries.lock().map_or(0, |e| e.len());
        let rules: Vec<String> = self.active.iter().map(|a| a.rule.name()).collect();
        write!(f, "Signins({rules:?}, {count} placeholders)")
    }
}

/// What a token request asked for, read before placeholders are replaced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub grant_type: Option<String>,
    pub refresh_token: Option<String>,
}

/// What an answer did to a host file, for the audit log.
#[derive(Debug, PartialEq, Eq)]
pub enum Saved {
    Refreshed(String),
    Created(String),
    Failed(String),
}

impl Saved {
    pub fn describe(&self) -> String {
        match self {
            Saved::Refreshed(rule) => format!("saved refreshed sign-in tokens to {rule}"),
            Saved::Created(rule) => format!("saved a new sign-in to {rule}"),
            Saved::Failed(reason) => format!("sign-in tokens not saved: {reason}"),
        }
    }
}

impl Signins {
    /// Reads each rule's host file and makes its guest copy. A missing file
    /// is fine (a sign-in in the guest can create it); one that cannot be
    /// used gets a warning and no guest copy. Fails only without randomness.
    pub fn load(rules: &[SigninRule], home: Option<&Path>) -> Result<Signins, ProxyError> {
        let mut entries = HashMap::new();
        let mut active = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            let path = rule.host_path(home);
            let mut state = FileState { exists: true, own_refresh: None };
            let mut guest_file = None;
            let doc = match &path {
                None => Err("~/ names no directory (HOME is not set)".to_string()),
                Some(path) => read_json(path),
            };
            match doc {
                Ok(None) => state.exists = false,
                Ok(Some(mut doc)) => match tokens_of(rule, &doc) {
                    Ok(tokens) => {
                        let mut guest_of = HashMap::new();
                        for (token, real) in tokens {
                            let (guest, marker) = placeholder_for(&real)
                                .map_err(|reason| ProxyError::Signin { rule: rule.name(), reason })?;
                            if rule.refresh_path() == Some(token) {
                                state.own_refresh = Some(guest.clone());
                            }
                            guest_of.insert(real.clone(), guest.clone());
                            entries.insert(marker, Entry { guest, real: Secret(real), rule: index });
                        }
                        // Every string equal to a secret, not only those at
                        // the token paths: a copy elsewhere is one too.
                        replace_strings(&mut doc, &guest_of);
                        guest_file = serde_json::to_vec_pretty(&doc).ok();
                    }
                    Err(reason) => tracing::warn!("sign-in file {}: {reason}; the guest gets no copy", rule.file),
                },
                Err(reason) => tracing::warn!("sign-in file {}: {reason}; the guest gets no copy", rule.file),
            }
            active.push(Active { rule: rule.clone(), path, guest_file, state: Mutex::new(state) });
        }
        Ok(Signins { active, entries: Mutex::new(entries) })
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// The rules whose hosts include a destination.
    pub fn rules_for(&self, host: &Host, port: Port) -> Vec<usize> {
        (0..self.active.len()).filter(|&i| self.active[i].rule.matches(host, port)).collect()
    }

    pub fn rule_name(&self, index: usize) -> String {
        self.active.get(index).map(|a| a.rule.name()).unwrap_or_default()
    }

    /// The guest copies, one per rule whose host file could be used.
    pub fn guest_files(&self) -> Vec<SigninFile> {
        self.active
            .iter()
            .filter_map(|a| Some(SigninFile { file: a.rule.file.clone(), content: a.guest_file.clone()? }))
            .collect()
    }
}

impl Signins {
    /// Replaces the placeholders of `rules` in a header or body; `None`
    /// when there were none. Placeholders of other rules stay as they are.
    pub fn substitute(&self, rules: &[usize], data: &[u8]) -> Option<Vec<u8>> {
        let prefix = PLACEHOLDER_PREFIX.as_bytes();
        let mut hits = data.windows(prefix.len()).enumerate().filter(|(_, w)| *w == prefix).map(|(i, _)| i).peekable();
        hits.peek()?;
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (mut out, mut copied, mut replaced) = (Vec::with_capacity(data.len()), 0, false);
        for at in hits {
            let end = at + prefix.len() + MARKER_HEX;
            let Some(marker) = data.get(at..end).and_then(|m| std::str::from_utf8(m).ok()) else { continue };
            let Some(entry) = entries.get(marker).filter(|e| rules.contains(&e.rule)) else { continue };
            // A JWT's placeholder begins before its marker.
            let Some(start) = end.checked_sub(entry.guest.len()) else { continue };
            if start < copied || &data[start..end] != entry.guest.as_bytes() {
                continue;
            }
            out.extend_from_slice(&data[copied..start]);
            out.extend_from_slice(entry.real.0.as_bytes());
            copied = end;
            replaced = true;
        }
        if !replaced {
            return None;
        }
        out.extend_from_slice(&data[copied..]);
        Some(out)
    }

    /// Replaces placeholders in the Authorization header, where the agents
    /// send their tokens; whether any was. Other headers are left alone:
    /// a server that echoes a header back would hand the guest the secret.
    pub fn substitute_headers(&self, rules: &[usize], headers: &mut HeaderMap) -> bool {
        let mut replaced = false;
        let http::header::Entry::Occupied(mut entry) = headers.entry(http::header::AUTHORIZATION) else {
            return false;
        };
        for value in entry.iter_mut() {
            let Some(real) = self.substitute(rules, value.as_bytes()) else { continue };
            if let Ok(mut new) = HeaderValue::from_bytes(&real) {
                new.set_sensitive(true);
                *value = new;
                replaced = true;
            }
        }
        replaced
    }

    /// The rule whose host file's own refresh token a request is
    /// refreshing, if it is one. Its real value is re-read from the file
    /// first: the host's agent may have rotated it since.
    pub fn own_refresh(&self, rules: &[usize], grant: &Grant) -> Option<usize> {
        if grant.grant_type.as_deref() != Some("refresh_token") {
            return None;
        }
        let sent = grant.refresh_token.as_deref()?;
        let index = *rules.iter().find(|&&i| {
            let state = self.active[i].state.lock().unwrap_or_else(|e| e.into_inner());
            state.exists && state.own_refresh.as_deref() == Some(sent)
        })?;
        let active = &self.active[index];
        let current = active.path.as_deref().and_then(|p| read_json(p).ok().flatten()).and_then(|doc| {
            let path = &active.rule.tokens[active.rule.refresh_path()?];
            value_at(&doc, path).and_then(Value::as_str).map(str::to_string)
        });
        if let (Some(current), Some(marker)) = (current, marker_of(sent)) {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = entries.get_mut(marker) {
                if entry.real.0 != current {
                    tracing::debug!("sign-in file {}: the host's refresh token changed; using it", active.rule.file);
                    entry.real = Secret(current);
                }
            }
        }
        Some(index)
    }

    /// Rewrites a JSON answer from a rule's host: every token field gets a
    /// fresh placeholder, and the host file is brought up to date when the
    /// request was a refresh of its own sign-in (`own`), or created when
    /// there was none and the request was a token request (`grant`).
    /// `None` when the body is not JSON or holds no token; an error (the
    /// answer must not reach the guest) only without randomness.
    pub fn rewrite_answer(
        &self,
        rules: &[usize],
        own: Option<usize>,
        grant: Option<&Grant>,
        body: &[u8],
    ) -> Result<Option<Rewritten>, String> {
        let Some(&first) = rules.first() else { return Ok(None) };
        let Ok(mut doc) = serde_json::from_slice::<Value>(body) else { return Ok(None) };
        let owner = own.unwrap_or(first);
        let mut found = Vec::new();
        collect_tokens(&doc, &mut found);
        if found.is_empty() {
            return Ok(None);
        }
        let mut fresh: Vec<(String, Entry)> = Vec::new();
        // The answer's top-level tokens by kind: (real, placeholder).
        let mut top: HashMap<String, (String, String)> = HashMap::new();
        for (key, real) in found {
            let (guest, marker) = placeholder_for(&real)?;
            if doc.get(&key).and_then(Value::as_str) == Some(real.as_str()) {
                top.insert(field_kind(&key), (real.clone(), guest.clone()));
            }
            fresh.push((marker, Entry { guest, real: Secret(real), rule: owner }));
        }
        let guest_of: HashMap<String, String> =
            fresh.iter().map(|(_, e)| (e.real.0.clone(), e.guest.clone())).collect();
        replace_strings(&mut doc, &guest_of);
        let expires_in = doc.get("expires_in").and_then(Value::as_u64);

        let saved = match own {
            Some(index) => Some(self.save_refresh(index, &top, expires_in)),
            None if grant.is_some_and(|g| g.grant_type.is_some()) => self.save_new(rules, &top, expires_in),
            None => None,
        };
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).extend(fresh);
        let out = serde_json::to_vec(&doc).map_err(|e| e.to_string())?;
        Ok(Some((out, saved)))
    }

    /// Writes refreshed tokens into the existing host file of rule `index`.
    fn save_refresh(&self, index: usize, top: &HashMap<String, (String, String)>, expires_in: Option<u64>) -> Saved {
        let active = &self.active[index];
        let mut state = active.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(path) = &active.path else { return Saved::Failed("no host path".into()) };
        let result = (|| {
            let mut doc = read_json(path)?.ok_or("the file is gone")?;
            let mut changed = false;
            for token in &active.rule.tokens {
                if let Some((real, _)) = top.get(&token.kind()) {
                    changed |= set_at(&mut doc, token, Value::String(real.clone()), false)?;
                }
            }
            if !changed {
                return Err("the answer held none of the rule's tokens".to_string());
            }
            update_expiry(&mut doc, &active.rule, expires_in);
            write_atomic(path, &doc, false)
        })();
        match result {
            Ok(()) => {
                if let Some((_, guest)) = top.get("refreshtoken") {
                    state.own_refresh = Some(guest.clone());
                }
                tracing::info!("sign-in file {}: saved refreshed tokens", active.rule.file);
                Saved::Refreshed(active.rule.name())
            }
            Err(reason) => {
                tracing::warn!("sign-in file {}: refreshed tokens not saved: {reason}", active.rule.file);
                Saved::Failed(format!("{}: {reason}", active.rule.name()))
            }
        }
    }

    /// Creates the host file of the first rule in `rules` that had none,
    /// from a token answer holding an access and a refresh token.
    fn save_new(
        &self,
        rules: &[usize],
        top: &HashMap<String, (String, String)>,
        expires_in: Option<u64>,
    ) -> Option<Saved> {
        if !(top.contains_key("accesstoken") && top.contains_key("refreshtoken")) {
            return None;
        }
        for &index in rules {
            let active = &self.active[index];
            let mut state = active.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.exists || active.rule.refresh_path().is_none() {
                continue;
            }
            let Some(path) = &active.path else { continue };
            let mut doc = Value::Object(Map::new());
            for token in &active.rule.tokens {
                if let Some((real, _)) = top.get(&token.kind()) {
                    if let Err(reason) = set_at(&mut doc, token, Value::String(real.clone()), true) {
                        return Some(Saved::Failed(format!("{}: {reason}", active.rule.name())));
                    }
                }
            }
            new_expiry(&mut doc, &active.rule, expires_in);
            return Some(match write_atomic(path, &doc, true) {
                Ok(()) => {
                    state.exists = true;
                    state.own_refresh = top.get("refreshtoken").map(|(_, guest)| guest.clone());
                    tracing::info!("sign-in file {}: saved the sign-in made in the guest", active.rule.file);
                    Saved::Created(active.rule.name())
                }
                Err(reason) => {
                    // Most likely the host signed in meanwhile: its file stays.
                    state.exists = true;
                    tracing::warn!("sign-in file {}: the guest's sign-in not saved: {reason}", active.rule.file);
                    Saved::Failed(format!("{}: {reason}", active.rule.name()))
                }
            });
        }
        None
    }
}

/// Reads a token request's `grant_type` and `refresh_token`, from JSON or
/// a form; `None` for anything else.
pub fn grant_of(body: &[u8]) -> Option<Grant> {
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) {
        let field = |names: &[&str]| names.iter().find_map(|n| map.get(*n)?.as_str().map(str::to_string));
        return Some(Grant {
            grant_type: field(&["grant_type", "grantType"]),
            refresh_token: field(&["refresh_token", "refreshToken"]),
        });
    }
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains('=') || text.contains(['{', '\n']) {
        return None;
    }
    let mut grant = Grant::default();
    for pair in text.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match form_decode(key).as_deref() {
            Some("grant_type") => grant.grant_type = form_decode(value),
            Some("refresh_token") => grant.refresh_token = form_decode(value),
            _ => {}
        }
    }
    Some(grant)
}

/// Decodes one x-www-form-urlencoded component.
fn form_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// A new placeholder for a secret: (what the guest holds, its marker).
/// A JWT keeps its header and payload, which clients read (plan, account,
/// expiry) without checking the signature; only the signature is replaced.
fn placeholder_for(real: &str) -> Result<(String, String), String> {
    let mut bytes = [0u8; MARKER_HEX / 2];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| "no randomness for a placeholder".to_string())?;
    let mut marker = String::from(PLACEHOLDER_PREFIX);
    for b in bytes {
        marker.push_str(&format!("{b:02x}"));
    }
    let guest = match jwt_head(real) {
        Some(head) => format!("{head}.{marker}"),
        None => marker.clone(),
    };
    Ok((guest, marker))
}

/// The header and payload of a JWT-shaped value.
fn jwt_head(value: &str) -> Option<&str> {
    let parts: Vec<&str> = value.split('.').collect();
    let base64url = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (parts.len() == 3 && parts.iter().all(base64url) && parts[0].starts_with("eyJ"))
        .then(|| &value[..value.len() - parts[2].len() - 1])
}

/// The marker inside a placeholder the guest sent.
fn marker_of(guest: &str) -> Option<&str> {
    let at = guest.find(PLACEHOLDER_PREFIX)?;
    guest.get(at..at + PLACEHOLDER_PREFIX.len() + MARKER_HEX)
}

/// A response field's name as a token path's kind (`accessToken` and
/// `access_token` are both `accesstoken`).
fn field_kind(key: &str) -> String {
    key.chars().filter(|c| *c != '_').collect::<String>().to_ascii_lowercase()
}

/// Every token field in a JSON answer, at any depth: (key, value).
fn collect_tokens(value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match v {
                    Value::String(s) if TOKEN_FIELDS.contains(&key.as_str()) && !s.is_empty() => {
                        out.push((key.clone(), s.clone()));
                    }
                    _ => collect_tokens(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_tokens(v, out)),
        _ => {}
    }
}

/// Replaces every string that is a key of `with` by its value.
fn replace_strings(value: &mut Value, with: &HashMap<String, String>) {
    match value {
        Value::String(s) => {
            if let Some(new) = with.get(s.as_str()) {
                *s = new.clone();
            }
        }
        Value::Object(map) => map.values_mut().for_each(|v| replace_strings(v, with)),
        Value::Array(items) => items.iter_mut().for_each(|v| replace_strings(v, with)),
        _ => {}
    }
}

/// A host token file: `None` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, String> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_FILE + 1), &mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("it is larger than {MAX_FILE} bytes"));
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("it is not JSON ({e})"))
}

/// The secrets at a rule's token paths: (path index, value). A path that
/// holds null has nothing to hide and is left out.
fn tokens_of(rule: &SigninRule, doc: &Value) -> Result<Vec<(usize, String)>, String> {
    let mut tokens = Vec::new();
    for (index, path) in rule.tokens.iter().enumerate() {
        match value_at(doc, path) {
            None => return Err(format!("token path {path} is missing")),
            Some(Value::Null) => {}
            Some(Value::String(s)) => tokens.push((index, s.clone())),
            Some(_) => return Err(format!("token path {path} is not a string")),
        }
    }
    Ok(tokens)
}

fn value_at<'a>(doc: &'a Value, path: &TokenPath) -> Option<&'a Value> {
    path.keys().iter().try_fold(doc, |v, key| v.get(key))
}

/// Sets the value at a token path; `create` makes missing objects on the
/// way. Whether it changed anything.
fn set_at(doc: &mut Value, path: &TokenPath, new: Value, create: bool) -> Result<bool, String> {
    let (last, parents) = path.keys().split_last().ok_or("empty token path")?;
    let mut here = doc;
    for key in parents {
        let map = here.as_object_mut().ok_or_else(|| format!("token path {path}: {key} is not in an object"))?;
        if create && !map.contains_key(key) {
            map.insert(key.clone(), Value::Object(Map::new()));
        }
        here = map.get_mut(key).ok_or_else(|| format!("token path {path} is missing"))?;
    }
    let map = here.as_object_mut().ok_or_else(|| format!("token path {path} is not in an object"))?;
    if !create && !map.contains_key(last) {
        return Err(format!("token path {path} is missing"));
    }
    let changed = map.get(last) != Some(&new);
    map.insert(last.clone(), new);
    Ok(changed)
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO);
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// Brings the expiry fields the agents keep up to date, where the file has
/// them: Claude Code's `expiresAt` and Gemini CLI's `expiry_date` (ms since
/// the epoch) beside the access token, Codex's `last_refresh` (RFC 3339)
/// beside it or at the top.
fn update_expiry(doc: &mut Value, rule: &SigninRule, expires_in: Option<u64>) {
    let Some(access) = rule.tokens.iter().find(|t| t.kind() == "accesstoken") else { return };
    let parents = &access.keys()[..access.keys().len() - 1];
    let expiry = expires_in.map(|s| Value::from(now_ms().saturating_add(s.saturating_mul(1000))));
    let stamp = Value::String(humantime::format_rfc3339_micros(SystemTime::now()).to_string());
    let mut here = Some(&mut *doc);
    for key in parents {
        here = here.and_then(|v| v.get_mut(key));
    }
    if let Some(Value::Object(map)) = here {
        for key in ["expiresAt", "expiry_date"] {
            if let (true, Some(expiry)) = (map.contains_key(key), &expiry) {
                map.insert(key.to_string(), expiry.clone());
            }
        }
        if map.contains_key("last_refresh") {
            map.insert("last_refresh".into(), stamp.clone());
        }
    }
    if let Value::Object(root) = doc {
        if root.contains_key("last_refresh") {
            root.insert("last_refresh".into(), stamp);
        }
    }
}

/// The expiry field a new file gets, shaped after each agent's: camelCase
/// paths (Claude Code) get `expiresAt` beside the access token, a top-level
/// snake_case one (Gemini CLI) `expiry_date`, nested snake_case ones
/// (Codex) a top-level `last_refresh`.
fn new_expiry(doc: &mut Value, rule: &SigninRule, expires_in: Option<u64>) {
    let Some(access) = rule.tokens.iter().find(|t| t.kind() == "accesstoken") else { return };
    let expiry = expires_in.map(|s| Value::from(now_ms().saturating_add(s.saturating_mul(1000))));
    let (key, value, beside) = if access.last().contains(|c: char| c.is_ascii_uppercase()) {
        ("expiresAt", expiry, true)
    } else if access.keys().len() == 1 {
        ("expiry_date", expiry, false)
    } else {
        ("last_refresh", Some(Value::String(humantime::format_rfc3339_micros(SystemTime::now()).to_string())), false)
    };
    let Some(value) = value else { return };
    let mut here = Some(&mut *doc);
    if beside {
        for key in &access.keys()[..access.keys().len() - 1] {
            here = here.and_then(|v| v.get_mut(key));
        }
    }
    if let Some(Value::Object(map)) = here {
        map.insert(key.to_string(), value);
    }
}

/// Writes a host token file atomically, 0600: a temporary file in the same
/// directory, synced, then renamed over the old one (a symlink's target is
/// written, not the link). `create` never replaces a file that appeared
/// meanwhile, and makes missing directories 0700.
fn write_atomic(path: &Path, doc: &Value, create: bool) -> Result<(), String> {
    let path = if create { path.to_path_buf() } else { std::fs::canonicalize(path).map_err(|e| e.to_string())? };
    let dir = path.parent().ok_or("the file has no directory")?;
    if create {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut bytes = serde_json::to_vec_pretty(doc).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    let name = path.file_name().ok_or("the file has no name")?.to_string_lossy();
    let (_, marker) = placeholder_for("")?;
    let tmp = dir.join(format!(".{name}.{}.tmp", &marker[PLACEHOLDER_PREFIX.len()..]));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        if create { std::fs::hard_link(&tmp, &path) } else { std::fs::rename(&tmp, &path) }
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => "the file appeared meanwhile; it was left as it is".to_string(),
        _ => format!("cannot write {}: {e}", path.display()),
    })?;
    // The rename is only durable once the directory is.
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse;

    const JWT: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ1c2VyIiwicGxhbiI6InBybyJ9.c2lnbmF0dXJlLXJlYWw";

    fn rules(file: &str, tokens: &str) -> Vec<SigninRule> {
        let text =
            format!("[[signin]]\nfile = \"{file}\"\ntokens = [{tokens}]\nhosts = [\"api.test\", \"auth.test\"]\n");
        parse(&text, "t.toml").unwrap().signins
    }

    fn home(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stockade-signin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, content) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        dir
    }

    #[test]
    fn the_guest_copy_has_placeholders_in_the_same_shape_and_no_secret() {
        let file = r#"{"claudeAiOauth":{"accessToken":"real-a","refreshToken":"real-r","expiresAt":5,"scopes":["x"]},"copy":"real-a"}"#;
        let dir = home("copy", &[(".claude/.credentials.json", file)]);
        let rules =
            rules("~/.claude/.credentials.json", "\"claudeAiOauth.accessToken\", \"claudeAiOauth.refreshToken\"");
        let signins = Signins::load(&rules, Some(&dir)).unwrap();
        let files = signins.guest_files();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].file, "~/.claude/.credentials.json");
        let text = String::from_utf8(files[0].content.clone()).unwrap();
        assert!(!text.contains("real-"), "{text}");
        let doc: Value = serde_json::from_str(&text).unwrap();
        let access = doc["claudeAiOauth"]["accessToken"].as_str().unwrap();
        assert!(access.starts_with(PLACEHOLDER_PREFIX) && access.len() == PLACEHOLDER_PREFIX.len() + MARKER_HEX);
        assert_eq!(doc["copy"], doc["claudeAiOauth"]["accessToken"], "a copy of a secret is replaced too");
        assert_eq!(
            (doc["claudeAiOauth"]["expiresAt"].as_u64(), &doc["claudeAiOauth"]["scopes"][0]),
            (Some(5), &Value::from("x"))
        );
        let refresh = doc["claudeAiOauth"]["refreshToken"].as_str().unwrap();
        assert_ne!(access, refresh);

        let all = [0];
        let header = format!("Bearer {access}");
        assert_eq!(signins.substitute(&all, header.as_bytes()).unwrap(), b"Bearer real-a");
        assert_eq!(signins.substitute(&[], header.as_bytes()), None, "not for other rules' hosts");
        assert_eq!(signins.substitute(&all, b"no placeholder here"), None);
        let debug = format!("{signins:?} {:?}", files[0]);
        assert!(!debug.contains("real-") && !debug.contains(access), "{debug}");
        let grant = Grant { grant_type: Some("refresh_token".into()), refresh_token: Some(refresh.into()) };
        assert_eq!(signins.own_refresh(&all, &grant), Some(0));
        let code = Grant { grant_type: Some("authorization_code".into()), refresh_token: Some(refresh.into()) };
        assert_eq!(signins.own_refresh(&all, &code), None, "only a refresh grant is a refresh");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_jwt_keeps_its_header_and_payload() {
        let file = format!(
            r#"{{"tokens":{{"id_token":"{JWT}","access_token":"opaque","refresh_token":"r"}},"OPENAI_API_KEY":null}}"#
        );
        let dir = home("jwt", &[(".codex/auth.json", &file)]);
        let tokens = "\"tokens.id_token\", \"tokens.access_token\", \"tokens.refresh_token\", \"OPENAI_API_KEY\"";
        let signins = Signins::load(&rules("~/.codex/auth.json", tokens), Some(&dir)).unwrap();
        let doc: Value = serde_json::from_slice(&signins.guest_files()[0].content).unwrap();
        let id = doc["tokens"]["id_token"].as_str().unwrap();
        let (head, signature) = id.rsplit_once('.').unwrap();
        assert_eq!(head, jwt_head(JWT).unwrap());
        assert!(signature.starts_with(PLACEHOLDER_PREFIX), "{id}");
        assert_eq!(doc["OPENAI_API_KEY"], Value::Null, "null holds nothing to hide");
        let body = format!("{{\"id_token\":\"{id}\"}}");
        assert_eq!(
            signins.substitute(&[0], body.as_bytes()).unwrap(),
            format!("{{\"id_token\":\"{JWT}\"}}").as_bytes()
        );
        // The marker alone, without the JWT's head, is not the placeholder.
        assert_eq!(signins.substitute(&[0], signature.as_bytes()), None);
        assert_eq!(jwt_head("a.b.c"), None);
        assert_eq!(jwt_head("eyJa.b"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unusable_files_give_no_copy_and_missing_ones_may_be_created() {
        let dir =
            home("bad", &[("missing-path.json", r#"{"a":"x"}"#), ("number.json", r#"{"t":5}"#), ("junk.json", "{")]);
        for file in ["missing-path.json", "number.json", "junk.json"] {
            let signins = Signins::load(&rules(&format!("~/{file}"), "\"t\""), Some(&dir)).unwrap();
            assert!(signins.guest_files().is_empty(), "{file}");
            assert!(signins.active[0].state.lock().unwrap().exists, "{file} must never be replaced");
        }
        let signins = Signins::load(&rules("~/none.json", "\"t\""), Some(&dir)).unwrap();
        assert!(signins.guest_files().is_empty());
        assert!(!signins.active[0].state.lock().unwrap().exists);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_requests_are_read_from_json_and_forms() {
        let grant = |grant_type: &str, token: &str| {
            Some(Grant { grant_type: Some(grant_type.into()), refresh_token: Some(token.into()) })
        };
        assert_eq!(grant_of(br#"{"grant_type":"refresh_token","refresh_token":"p"}"#), grant("refresh_token", "p"));
        assert_eq!(
            grant_of(b"client_id=x&grant_type=refresh_token&refresh_token=p%2Bq+r"),
            grant("refresh_token", "p+q r")
        );
        assert_eq!(grant_of(b"\x00\xff"), None);
        assert_eq!(grant_of(br#"{"model":"x"}"#), Some(Grant::default()));
    }

    #[test]
    fn answers_get_placeholders_for_every_token_field() {
        let dir = home("answer", &[]);
        let signins = Signins::load(&rules("~/a.json", "\"access_token\", \"refresh_token\""), Some(&dir)).unwrap();
        let body = format!(r#"{{"access_token":"ra","data":{{"idToken":"{JWT}"}},"expires_in":60,"scope":"s"}}"#);
        let (out, saved) = signins.rewrite_answer(&[0], None, None, body.as_bytes()).unwrap().unwrap();
        assert_eq!(saved, None, "no token request, nothing saved");
        let doc: Value = serde_json::from_slice(&out).unwrap();
        let access = doc["access_token"].as_str().unwrap();
        assert!(access.starts_with(PLACEHOLDER_PREFIX));
        assert!(doc["data"]["idToken"].as_str().unwrap().starts_with(jwt_head(JWT).unwrap()));
        assert_eq!((doc["expires_in"].as_u64(), doc["scope"].as_str()), (Some(60), Some("s")));
        assert_eq!(signins.substitute(&[0], access.as_bytes()).unwrap(), b"ra");
        assert_eq!(signins.rewrite_answer(&[0], None, None, br#"{"ok":true}"#).unwrap(), None);
        assert!(!dir.join("a.json").exists());
    }
}
