//! The proxy's audit log, `network.jsonl` in a session directory: one JSON
//! line per flow the guest asked for. The proxy writes it (`proxy::audit`);
//! `stockade log` and `stockade policy learn` read it in later processes.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// The audit log's name in a session directory.
pub const AUDIT_FILE: &str = "network.jsonl";
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A CONNECT tunnel passed through untouched.
    Connect,
    /// A plain http:// request.
    Http,
    /// A request inside an intercepted TLS connection (credential host).
    Https,
    /// A DNS question.
    Dns,
    /// A request to the host's ssh-agent (a signature).
    Agent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
    /// Allowed, but it did not work (DNS, connect, upstream TLS).
    Fail,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339, milliseconds, UTC.
    pub time: String,
    pub kind: Kind,
    pub host: String,
    /// 0 for DNS.
    pub port: u16,
    pub decision: Decision,
    /// The rule that decided, with its policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why a flow was denied or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The address connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request path, without its query (which may hold tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The credential rule whose header was written (never the value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// The sign-in rule whose real tokens were written into the request
    /// (never the values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signin: Option<String>,
    /// What the answer did to a host sign-in file (refreshed, created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signin_saved: Option<String>,
    /// What the package cache did: "hit" (served from it), "stored"
    /// (downloaded, checked, kept), "passed" (checked, not kept: the
    /// reason says why), "refused" (did not match the registry's digest),
    /// "checksums" (the proxy's own metadata request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Bytes from the guest to the server, and back.
    #[serde(default)]
    pub bytes_up: u64,
    #[serde(default)]
    pub bytes_down: u64,
    /// How many records of this shape past the log's caps this line sums
    /// (their bytes summed, the time the last one's); absent: one record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated: Option<u64>,
}

impl Record {
    pub fn new(kind: Kind, host: impl Into<String>, port: u16, decision: Decision) -> Record {
        Record {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            kind,
            host: host.into(),
            port,
            decision,
            rule: None,
            reason: None,
            addr: None,
            method: None,
            path: None,
            status: None,
            credential: None,
            signin: None,
            signin_saved: None,
            cache: None,
            bytes_up: 0,
            bytes_down: 0,
            repeated: None,
        }
    }

    /// How many records this line stands for.
    pub fn count(&self) -> u64 {
        self.repeated.unwrap_or(1)
    }
}
