//! Sign-in tokens kept on the host (`[[signin]]` rules). The guest gets a
//! copy of an agent's token file with placeholders where the secrets were;
//! on the rule's hosts (intercepted, upstream verified) the proxy writes
//! real values in exactly two places: an access or ID token's placeholder
//! in the Authorization header, and the refresh token's placeholder in the
//! `refresh_token` field of a refresh request POSTed to one of the rule's
//! token URLs. Any other body or header keeps its placeholders: a server
//! may echo it back. Answers of the token URLs, whatever their format, get
//! fresh placeholders for their tokens (or are refused when unreadable),
//! and every answer on the rule's hosts is scrubbed of every real value
//! (`scrub`), so an echo hands the guest nothing. The real values never
//! reach the guest, logs or Debug output.
//!
//! The host file is only written from a successful answer of a token URL
//! to a refresh into which the proxy wrote the file's own refresh token,
//! or, when there was no file, to an authorization-code request there;
//! and never when a token in the answer is one the guest sent (an echo):
//! anything else could let a guest swap in tokens of its choosing.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, Method};
use serde_json::{Map, Value};

use super::ProxyError;
use super::credentials::Secret;
use super::form::{form_decode, form_encode};
use crate::policy::{Host, Port, SigninRule, TokenPath};

/// How every placeholder begins; 32 random hex digits follow.
pub const PLACEHOLDER_PREFIX: &str = "stockade-signin-";
const MARKER_HEX: usize = 32;
/// The most of a token endpoint's answer the proxy reads to rewrite; a
/// larger one is refused.
pub const MAX_ANSWER: usize = 1 << 20;
/// The most of a token request the proxy reads; a larger one is refused
/// (real ones are a few hundred bytes).
pub const MAX_REQUEST: usize = 64 << 10;
/// How long a token request's or answer's body may take to arrive.
pub const BODY_DEADLINE: Duration = Duration::from_secs(30);
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
    /// A refresh token: replaced only in a refresh request's
    /// `refresh_token`, never in a header.
    refresh: bool,
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

/// A request to one of a rule's token URLs, as the proxy sent it on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TokenRequest {
    pub rule: usize,
    /// The body's `grant_type`, when it could be read.
    pub grant: Option<String>,
    /// The proxy wrote a real refresh token into it.
    pub wrote: bool,
    /// ... the host file's own one: its answer may refresh that file.
    pub own: bool,
    /// Every text the guest put in the body, decoded as the server may
    /// read it (the body as it is, each JSON string and each form key and
    /// value): an answer repeating one is an echo, not new tokens.
    pub sent: Vec<String>,
}

/// A token request or answer body in one of the two formats OAuth uses.
enum Form {
    Json(Value),
    /// Each pair as sent, and decoded.
    Urlencoded(Vec<(String, String, String)>),
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
                            let refresh = rule.refresh_path() == Some(token);
                            entries.insert(marker, Entry { guest, real: Secret(real), rule: index, refresh });
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
    /// Replaces the access and ID token placeholders of `rules` in a header
    /// value; `None` when there were none. Placeholders of other rules, and
    /// refresh tokens' (which only a token URL is sent), stay as they are.
    pub fn substitute(&self, rules: &[usize], data: &[u8]) -> Option<Vec<u8>> {
        let prefix = PLACEHOLDER_PREFIX.as_bytes();
        let mut hits = data.windows(prefix.len()).enumerate().filter(|(_, w)| *w == prefix).map(|(i, _)| i).peekable();
        hits.peek()?;
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (mut out, mut copied, mut replaced) = (Vec::with_capacity(data.len()), 0, false);
        for at in hits {
            let end = at + prefix.len() + MARKER_HEX;
            let Some(marker) = data.get(at..end).and_then(|m| std::str::from_utf8(m).ok()) else { continue };
            let Some(entry) = entries.get(marker).filter(|e| rules.contains(&e.rule) && !e.refresh) else { continue };
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

    /// The rule among `rules` one of whose token URLs a request is sent to.
    pub fn token_url(&self, rules: &[usize], host: &Host, port: Port, method: &Method, target: &str) -> Option<usize> {
        rules.iter().copied().find(|&i| self.active[i].rule.token_urls.iter().any(|u| u.is(host, port, method, target)))
    }

    /// Reads a request to rule `rule`'s token URL and, when it is a refresh
    /// whose `refresh_token` is one of the rule's refresh placeholders
    /// (the whole value), writes the real token there and nowhere else.
    /// The new body, when it changed. `content_type` is `None` for a body
    /// with a Content-Encoding, which is never read.
    pub fn token_request(
        &self,
        rule: usize,
        content_type: Option<&str>,
        body: &[u8],
    ) -> (Option<Vec<u8>>, TokenRequest) {
        let mut request = TokenRequest { rule, sent: sent_texts(body), ..TokenRequest::default() };
        let Some(mut form) = Form::read(content_type, body, false) else { return (None, request) };
        request.grant = form.field("grant_type");
        if request.grant.as_deref() != Some("refresh_token") {
            return (None, request);
        }
        let Some(sent) = form.field("refresh_token") else { return (None, request) };
        let Some((real, own)) = self.real_refresh(rule, &sent) else { return (None, request) };
        form.set("refresh_token", &real);
        request.wrote = true;
        request.own = own;
        (Some(form.write()), request)
    }

    /// The real refresh token a placeholder of rule `rule` stands for, and
    /// whether it is the host file's own. The file's is re-read first: the
    /// host's agent may have rotated it since.
    fn real_refresh(&self, rule: usize, sent: &str) -> Option<(String, bool)> {
        let marker = marker_of(sent)?;
        let known = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.get(marker).filter(|e| e.rule == rule && e.refresh && e.guest == sent).map(|e| e.real.0.clone())
        }?;
        let active = &self.active[rule];
        let own = {
            let state = active.state.lock().unwrap_or_else(|e| e.into_inner());
            state.exists && state.own_refresh.as_deref() == Some(sent)
        };
        if !own {
            return Some((known, false));
        }
        let current = active.path.as_deref().and_then(|p| read_json(p).ok().flatten()).and_then(|doc| {
            let path = &active.rule.tokens[active.rule.refresh_path()?];
            value_at(&doc, path).and_then(Value::as_str).map(str::to_string)
        });
        match current {
            Some(current) if current != known => {
                tracing::debug!("sign-in file {}: the host's refresh token changed; using it", active.rule.file);
                let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(entry) = entries.get_mut(marker) {
                    entry.real = Secret(current.clone());
                }
                Some((current, true))
            }
            _ => Some((known, true)),
        }
    }

    /// Rewrites the answer of a token URL: every token in it gets a fresh
    /// placeholder, and the host file is brought up to date when the
    /// request was a refresh of its own sign-in, or created when there was
    /// none and the request exchanged an authorization code; both only
    /// from a successful answer. The new body when it changed. An error
    /// (the answer must not reach the guest) for a successful answer that
    /// is neither JSON nor a form, which could hold tokens unseen.
    pub fn token_answer(
        &self,
        request: &TokenRequest,
        success: bool,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<(Option<Vec<u8>>, Option<Saved>), String> {
        let Some(mut form) = Form::read(content_type, body, true) else {
            if success && !body.is_empty() {
                return Err("the token endpoint's answer is neither JSON nor a form; not passed on".into());
            }
            return Ok((None, None));
        };
        let found = form.tokens();
        if found.is_empty() {
            return Ok((None, None));
        }
        let mut fresh: Vec<(String, Entry)> = Vec::new();
        // The answer's top-level tokens by kind: (real, placeholder).
        let mut top: HashMap<String, (String, String)> = HashMap::new();
        for (key, real, at_top) in found {
            let (guest, marker) = placeholder_for(&real)?;
            let kind = field_kind(&key);
            if at_top {
                top.insert(kind.clone(), (real.clone(), guest.clone()));
            }
            let entry = Entry { guest, real: Secret(real), rule: request.rule, refresh: kind == "refreshtoken" };
            fresh.push((marker, entry));
        }
        let guest_of: HashMap<String, String> =
            fresh.iter().map(|(_, e)| (e.real.0.clone(), e.guest.clone())).collect();
        form.replace(&guest_of);
        let expires_in = form.field("expires_in").and_then(|s| s.parse().ok());

        let echoed = top.values().any(|(real, _)| request.sent.iter().any(|text| contains(text, real)));
        let saved = match request.grant.as_deref() {
            _ if !success => None,
            Some("refresh_token" | "authorization_code")
                if echoed && (request.own || self.can_create(request.rule)) =>
            {
                Some(Saved::Failed("the answer repeats a token the guest sent; not saved".into()))
            }
            Some("refresh_token") if request.own => Some(self.save_refresh(request.rule, &top, expires_in)),
            Some("authorization_code") => self.save_new(&[request.rule], &top, expires_in),
            _ => None,
        };
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).extend(fresh);
        Ok((Some(form.write()), saved))
    }

    /// Every real value handed out, in the spellings an echo may give it
    /// (as it is, form-encoded, JSON with `\/`), each with its placeholder:
    /// pairs for a [`Scrub`](super::scrub::Scrub), which may cover credential
    /// values too.
    pub fn scrub_pairs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .values()
            .flat_map(|e| {
                let real = &e.real.0;
                let guest = e.guest.as_bytes().to_vec();
                [real.clone(), form_encode(real), real.replace('/', "\\/")]
                    .into_iter()
                    .map(move |spelling| (spelling.into_bytes(), guest.clone()))
            })
            .collect()
    }

    /// Whether rule `index` has no host file yet, which a sign-in may create.
    fn can_create(&self, index: usize) -> bool {
        !self.active[index].state.lock().unwrap_or_else(|e| e.into_inner()).exists
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

impl Form {
    /// A JSON object (`application/json`, or for an answer any body that
    /// parses as one) or a form (`application/x-www-form-urlencoded`); a
    /// form with a key twice is not read, as servers differ on which wins.
    fn read(content_type: Option<&str>, body: &[u8], answer: bool) -> Option<Form> {
        let media = content_type?.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        let json = media == "application/json" || media.ends_with("+json");
        if json || answer {
            if let Ok(doc @ Value::Object(_)) = serde_json::from_slice::<Value>(body) {
                return Some(Form::Json(doc));
            }
        }
        if media != "application/x-www-form-urlencoded" {
            return None;
        }
        let text = std::str::from_utf8(body).ok()?;
        let mut pairs: Vec<(String, String, String)> = Vec::new();
        for pair in text.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = form_decode(key)?;
            if pairs.iter().any(|(k, _, _)| *k == key) {
                return None;
            }
            pairs.push((key, value.to_string(), form_decode(value)?));
        }
        Some(Form::Urlencoded(pairs))
    }

    /// A top-level field's text (a JSON number as its digits).
    fn field(&self, name: &str) -> Option<String> {
        match self {
            Form::Json(doc) => match doc.get(name)? {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            },
            Form::Urlencoded(pairs) => pairs.iter().find(|(k, _, _)| k == name).map(|(_, _, v)| v.clone()),
        }
    }

    /// Sets an existing top-level string field.
    fn set(&mut self, name: &str, value: &str) {
        match self {
            Form::Json(doc) => {
                if let Some(field) = doc.get_mut(name) {
                    *field = Value::String(value.to_string());
                }
            }
            Form::Urlencoded(pairs) => {
                for (_, raw, decoded) in pairs.iter_mut().filter(|(k, _, _)| k == name) {
                    *raw = form_encode(value);
                    *decoded = value.to_string();
                }
            }
        }
    }

    /// Every token field, at any depth in JSON: (key, value, at the top).
    fn tokens(&self) -> Vec<(String, String, bool)> {
        match self {
            Form::Json(doc) => {
                let mut found = Vec::new();
                collect_tokens(doc, &mut found);
                found
                    .into_iter()
                    .map(|(key, value)| {
                        let top = doc.get(&key).and_then(Value::as_str) == Some(value.as_str());
                        (key, value, top)
                    })
                    .collect()
            }
            Form::Urlencoded(pairs) => pairs
                .iter()
                .filter(|(k, _, v)| TOKEN_FIELDS.contains(&k.as_str()) && !v.is_empty())
                .map(|(k, _, v)| (k.clone(), v.clone(), true))
                .collect(),
        }
    }

    /// Replaces every string value that is a key of `with`.
    fn replace(&mut self, with: &HashMap<String, String>) {
        match self {
            Form::Json(doc) => replace_strings(doc, with),
            Form::Urlencoded(pairs) => {
                for (_, raw, decoded) in pairs.iter_mut() {
                    if let Some(new) = with.get(decoded.as_str()) {
                        *raw = form_encode(new);
                        decoded.clone_from(new);
                    }
                }
            }
        }
    }

    fn write(&self) -> Vec<u8> {
        match self {
            Form::Json(doc) => serde_json::to_vec(doc).unwrap_or_default(),
            Form::Urlencoded(pairs) => {
                let encoded: Vec<String> =
                    pairs.iter().map(|(k, raw, _)| format!("{}={raw}", form_encode(k))).collect();
                encoded.join("&").into_bytes()
            }
        }
    }
}

fn contains(haystack: &str, needle: &str) -> bool {
    !needle.is_empty() && haystack.contains(needle)
}

/// The texts a token request's body may carry to a server, whatever it
/// takes the body for: the bytes as they are, every JSON string literal
/// (keys, nested values and repeated keys too) unescaped, and every form
/// key and value decoded. Read without structure, so that no parse of the
/// proxy's can differ from the server's in what it misses.
fn sent_texts(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut texts = vec![text.to_string()];
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(open) = bytes[at..].iter().position(|&b| b == b'"').map(|i| at + i) {
        let mut end = open + 1;
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        let Some(literal) = text.get(open..=end.min(bytes.len() - 1)) else { break };
        if let Ok(decoded) = serde_json::from_str::<String>(literal) {
            texts.push(decoded);
        }
        at = end + 1;
        if at >= bytes.len() {
            break;
        }
    }
    for pair in text.split('&') {
        for part in pair.splitn(2, '=') {
            texts.extend(form_decode(part));
        }
    }
    texts
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
        assert_eq!(signins.substitute(&all, format!("Bearer {refresh}").as_bytes()), None, "never in a header");
        let json = Some("application/json");
        let body = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{refresh}","echo":"{refresh}"}}"#);
        let (real, request) = signins.token_request(0, json, body.as_bytes());
        let real: Value = serde_json::from_slice(&real.unwrap()).unwrap();
        assert_eq!((real["refresh_token"].as_str(), real["echo"].as_str()), (Some("real-r"), Some(refresh)));
        assert!(request.wrote && request.own, "{request:?}");
        let code = format!(r#"{{"grant_type":"authorization_code","refresh_token":"{refresh}"}}"#);
        assert_eq!(signins.token_request(0, json, code.as_bytes()).0, None, "only a refresh grant is a refresh");
        let access_there = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{access}"}}"#);
        assert_eq!(signins.token_request(0, json, access_there.as_bytes()).0, None, "only a refresh placeholder");
        let inside = format!(r#"{{"grant_type":"refresh_token","refresh_token":"x{refresh}"}}"#);
        assert_eq!(signins.token_request(0, json, inside.as_bytes()).0, None, "only the whole value");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_a_guest_sent_is_read_in_every_spelling_a_server_may_decode() {
        let json = br#"{"a":"\u0067uest-1","a":"plain","n":{"k\u0041":["x\"y"]},"cut":"\"#;
        let texts = sent_texts(json);
        for want in ["guest-1", "plain", "kA", "x\"y"] {
            assert!(texts.iter().any(|t| t == want), "{want} in {texts:?}");
        }
        let texts = sent_texts(b"access_token=gu%65st-2&x=a+b");
        assert!(texts.iter().any(|t| t == "guest-2") && texts.iter().any(|t| t == "a b"), "{texts:?}");
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
    fn token_requests_are_read_from_json_and_forms_by_their_type() {
        let dir = home("forms", &[("a.json", r#"{"access_token":"real-a","refresh_token":"real/r+1"}"#)]);
        let signins = Signins::load(&rules("~/a.json", "\"access_token\", \"refresh_token\""), Some(&dir)).unwrap();
        let doc: Value = serde_json::from_slice(&signins.guest_files()[0].content).unwrap();
        let refresh = doc["refresh_token"].as_str().unwrap();
        let form = Some("application/x-www-form-urlencoded; charset=utf-8");
        let body = format!("client_id=x&grant_type=refresh_token&refresh_token={refresh}&client_secret=a%2Bb");
        let (real, request) = signins.token_request(0, form, body.as_bytes());
        assert_eq!(
            String::from_utf8(real.unwrap()).unwrap(),
            "client_id=x&grant_type=refresh_token&refresh_token=real%2Fr%2B1&client_secret=a%2Bb"
        );
        assert_eq!(request.grant.as_deref(), Some("refresh_token"));
        // A form read as JSON, JSON read as a form, a key twice, a body of
        // unknown type: none is read, so no real value is written.
        let json_body = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{refresh}"}}"#);
        for (kind, body) in [
            (Some("application/json"), body.clone()),
            (form, json_body.clone()),
            (form, format!("{body}&grant_type=x")),
            (Some("text/plain"), body.clone()),
            (None, json_body),
        ] {
            assert_eq!(signins.token_request(0, kind, body.as_bytes()).0, None, "{kind:?} {body}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn answers_get_placeholders_for_every_token_field() {
        let dir = home("answer", &[]);
        let signins = Signins::load(&rules("~/a.json", "\"access_token\", \"refresh_token\""), Some(&dir)).unwrap();
        let body = format!(r#"{{"access_token":"ra","data":{{"idToken":"{JWT}"}},"expires_in":60,"scope":"s"}}"#);
        let request = TokenRequest::default();
        let json = Some("application/json");
        let (out, saved) = signins.token_answer(&request, true, json, body.as_bytes()).unwrap();
        let out = out.unwrap();
        assert_eq!(saved, None, "not a refresh or a sign-in, nothing saved");
        let doc: Value = serde_json::from_slice(&out).unwrap();
        let access = doc["access_token"].as_str().unwrap();
        assert!(access.starts_with(PLACEHOLDER_PREFIX));
        assert!(doc["data"]["idToken"].as_str().unwrap().starts_with(jwt_head(JWT).unwrap()));
        assert_eq!((doc["expires_in"].as_u64(), doc["scope"].as_str()), (Some(60), Some("s")));
        assert_eq!(signins.substitute(&[0], access.as_bytes()).unwrap(), b"ra");
        assert_eq!(signins.token_answer(&request, true, json, br#"{"ok":true}"#).unwrap(), (None, None));
        let form = Some("application/x-www-form-urlencoded");
        let (out, _) = signins.token_answer(&request, true, form, b"access_token=r%2Fa&expires_in=5").unwrap();
        let out = String::from_utf8(out.unwrap()).unwrap();
        assert!(out.starts_with("access_token=stockade-signin-") && out.ends_with("&expires_in=5"), "{out}");
        assert_eq!(signins.substitute(&[0], &out.as_bytes()[13..61]).unwrap(), b"r/a");
        let err = signins.token_answer(&request, true, Some("text/plain"), b"access_token: x").unwrap_err();
        assert!(err.contains("neither JSON nor a form"), "{err}");
        assert_eq!(signins.token_answer(&request, false, Some("text/plain"), b"bad").unwrap(), (None, None));
        let code = TokenRequest { grant: Some("authorization_code".into()), ..TokenRequest::default() };
        let tokens = br#"{"access_token":"a2","refresh_token":"r2"}"#;
        signins.token_answer(&code, false, json, tokens).unwrap();
        assert!(!dir.join("a.json").exists(), "a failed answer creates nothing");
        let (_, saved) = signins.token_answer(&code, true, json, tokens).unwrap();
        assert!(matches!(saved, Some(Saved::Created(_))), "{saved:?}");

        // Every value handed out is scrubbed, in each spelling.
        let scrub = crate::proxy::scrub::Scrub::new(signins.scrub_pairs());
        let echo = scrub.replace(b"ra r/a r%2Fa r\\/a a2").unwrap();
        assert!(!String::from_utf8_lossy(&echo).contains("r/a") && !echo.starts_with(b"ra "), "{echo:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
