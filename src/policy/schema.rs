//! The policy file as TOML: the raw shape serde reads, with spans so that
//! validation errors can name the line. Unknown keys are errors, so a typo
//! never silently weakens a policy.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// One line shown by `stockade policy list`.
    pub description: Option<String>,
    #[serde(default)]
    pub network: Network,
    #[serde(default, rename = "credential")]
    pub credentials: Vec<Credential>,
    #[serde(default, rename = "signin")]
    pub signins: Vec<Signin>,
    #[serde(default, rename = "registry")]
    pub registries: Vec<Registry>,
    #[serde(default)]
    pub mounts: BTreeMap<Spanned<String>, Spanned<MountMode>>,
    #[serde(default)]
    pub env: Env,
    /// A coding agent's own files, kept apart from the host's.
    pub agent: Option<Agent>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub name: Spanned<String>,
    /// Paths under `~/` the agent keeps its state in; a trailing `/` marks
    /// a directory, anything else is a single file.
    pub state: Vec<Spanned<String>>,
    /// Paths under `~/` copied from the host into the state (never back).
    #[serde(default)]
    pub seed: Vec<Spanned<String>>,
    /// Paths under `~/` whose changes in the state are offered for review
    /// for the host (settings that run code), inside the state paths.
    #[serde(default)]
    pub review: Vec<Spanned<String>>,
    /// Top-level keys removed from seeded JSON files (secrets some agents
    /// keep beside their settings).
    #[serde(default)]
    pub drop_keys: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    /// Allow rules whose destinations may resolve to loopback or private
    /// addresses (a registry on this machine or the LAN).
    #[serde(default)]
    pub allow_private: Vec<Spanned<String>>,
    /// `HOST[:PORT]`, or `HOST[:PORT]/PATH` to refuse requests under a path.
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
    /// Names answered with a fixed address instead of asking DNS.
    #[serde(default)]
    pub hosts: BTreeMap<Spanned<String>, Spanned<String>>,
    /// Ports of the host's loopback the guest reaches as
    /// `host.stockade.internal`.
    #[serde(default)]
    pub host_ports: Vec<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub host: Spanned<String>,
    pub header: Spanned<String>,
    pub value: Spanned<Value>,
    pub format: Option<Spanned<String>>,
    /// The guest variable that holds the placeholder; defaults to the
    /// variable named by `value.env`.
    pub guest_env: Option<Spanned<String>>,
    /// Skip the rule, with a warning, when its value cannot be had.
    #[serde(default)]
    pub optional: bool,
    /// Only requests with these methods get the header.
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    /// Only requests under these path prefixes get the header.
    pub paths: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A coding agent's sign-in token file, kept on the host.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signin {
    pub file: Spanned<String>,
    /// Dotted JSON paths of the secrets in the file.
    pub tokens: Spanned<Vec<Spanned<String>>>,
    /// Host rules where the real values are written.
    pub hosts: Spanned<Vec<Spanned<String>>>,
    /// The token endpoints (`https://HOST[:PORT]/PATH`) whose refresh
    /// requests get the real refresh token.
    #[serde(default)]
    pub token_urls: Vec<Spanned<String>>,
}

/// A package registry whose downloads the host's cache may serve.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    pub kind: Spanned<String>,
    pub url: Spanned<String>,
    pub index: Option<Spanned<String>>,
}

/// Where a credential's value comes from: exactly one of the three.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Value {
    pub env: Option<String>,
    pub file: Option<String>,
    pub command: Option<String>,
    pub ttl: Option<String>,
}

/// Declared from most to least restrictive: merging keeps the smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// Read-only.
    Ro,
    /// Copy-on-write: the guest may write, the host copy stays as it was.
    Overlay,
    /// Read-write: the guest writes the host directory.
    Rw,
}

impl MountMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MountMode::Ro => "ro",
            MountMode::Overlay => "overlay",
            MountMode::Rw => "rw",
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Env {
    /// Host variables passed to the command.
    #[serde(default)]
    pub pass: Vec<Spanned<String>>,
}
