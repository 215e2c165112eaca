//! The audit log: one JSON line per flow the guest asked for, allowed or
//! denied, in the session directory; and its rendering for `stockade log`.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::ProxyError;
use crate::changes::display_bytes;
use crate::logcap::{CapNote, Capped, NETWORK_LOG_CAP, Style};

/// The audit log's name in a session directory.
pub const AUDIT_FILE: &str = "network.jsonl";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
    /// Allowed, but it did not work (DNS, connect, upstream TLS).
    Fail,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
        }
    }
}

/// Where records go: a file, or nowhere (benchmarks, tests).
#[derive(Debug)]
pub struct AuditLog {
    /// Capped: a guest asking for names forever must not fill the disk.
    file: Option<Mutex<Capped<File>>>,
    path: Option<PathBuf>,
    failed: AtomicBool,
}

impl AuditLog {
    /// Appends to `path` (created 0600: it names every host the guest used).
    pub fn open(path: &Path) -> Result<AuditLog, ProxyError> {
        AuditLog::open_capped(path, NETWORK_LOG_CAP)
    }

    /// [`AuditLog::open`] with records beyond `cap` bytes dropped.
    fn open_capped(path: &Path, cap: u64) -> Result<AuditLog, ProxyError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| ProxyError::Audit { path: path.to_path_buf(), source })?;
        let file = Capped::new(file, AUDIT_FILE, Style::JsonLines, cap);
        Ok(AuditLog { file: Some(Mutex::new(file)), path: Some(path.to_path_buf()), failed: AtomicBool::new(false) })
    }

    pub fn discard() -> AuditLog {
        AuditLog { file: None, path: None, failed: AtomicBool::new(false) }
    }

    pub fn record(&self, record: &Record) {
        tracing::debug!(
            "{:?} {:?} {}:{} {}",
            record.decision,
            record.kind,
            record.host,
            record.port,
            record.reason.as_deref().or(record.rule.as_deref()).unwrap_or("")
        );
        let Some(file) = &self.file else { return };
        let Ok(mut line) = serde_json::to_vec(record) else { return };
        line.push(b'\n');
        // One write per line, on an O_APPEND file: lines never interleave.
        let result = file.lock().unwrap_or_else(|e| e.into_inner()).write_all(&line);
        if let Err(err) = result {
            if !self.failed.swap(true, Ordering::Relaxed) {
                let path = self.path.as_deref().unwrap_or(Path::new("?"));
                tracing::warn!("cannot write the audit log {}: {err}", path.display());
            }
        }
    }
}

/// Reads an audit log; lines that do not parse are counted, not fatal.
/// The notes of a capped log are skipped (the log says it was capped).
pub fn read(path: &Path) -> std::io::Result<(Vec<Record>, usize)> {
    let reader = BufReader::new(File::open(path)?);
    let (mut records, mut bad) = (Vec::new(), 0);
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(record) => records.push(record),
            Err(_) if serde_json::from_str::<CapNote>(&line).is_ok() => {
                tracing::warn!("{} reached its cap; later records were dropped", path.display());
            }
            Err(_) => bad += 1,
        }
    }
    Ok((records, bad))
}

/// A table of records for people, with a summary line.
pub fn render(records: &[Record]) -> String {
    let rows: Vec<[String; 6]> = records.iter().map(row).collect();
    let mut widths = [0usize; 6];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else if widths[i] > 0 {
                // Columns empty in every row take no room.
                let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let count = |d: Decision| records.iter().filter(|r| r.decision == d).count();
    let (allowed, denied, failed) = (count(Decision::Allow), count(Decision::Deny), count(Decision::Fail));
    let up: u64 = records.iter().map(|r| r.bytes_up).sum();
    let down: u64 = records.iter().map(|r| r.bytes_down).sum();
    let _ = writeln!(
        out,
        "{} flows: {allowed} allowed, {denied} denied, {failed} failed; {} up, {} down",
        records.len(),
        bytes(up),
        bytes(down)
    );
    out
}

fn row(r: &Record) -> [String; 6] {
    // The time of day is enough within one session.
    let time = r.time.get(11..19).unwrap_or(&r.time).to_string();
    let decision = match r.decision {
        Decision::Allow => "allow",
        Decision::Deny => "DENY",
        Decision::Fail => "FAIL",
    };
    let kind = format!("{:?}", r.kind).to_ascii_lowercase();
    let target = if r.kind == Kind::Dns { r.host.clone() } else { format!("{}:{}", r.host, r.port) };
    let mut request = String::new();
    if let (Some(method), Some(path)) = (&r.method, &r.path) {
        let _ = write!(request, "{method} {path}");
    }
    if let Some(status) = r.status {
        let _ = write!(request, " {status}");
    }
    if r.bytes_up + r.bytes_down > 0 {
        let _ = write!(request, " ({} up, {} down)", bytes(r.bytes_up), bytes(r.bytes_down));
    }
    let mut why = r.reason.clone().or_else(|| r.rule.clone()).unwrap_or_default();
    if let Some(credential) = &r.credential {
        let _ = write!(why, "; wrote {credential}");
    }
    if let Some(signin) = &r.signin {
        let _ = write!(why, "; wrote sign-in tokens of {signin}");
    }
    if let Some(saved) = &r.signin_saved {
        let _ = write!(why, "; {saved}");
    }
    [time, decision.into(), kind, target, request.trim().to_string(), why].map(|cell| shown(&cell))
}

/// A cell as it may reach the terminal: hosts, paths and methods are the
/// guest's words, so controls (C1 and tab included) and invisible marks are
/// escaped rather than left to move the cursor or reorder the line.
fn shown(cell: &str) -> String {
    display_bytes(cell.as_bytes())
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_chosen_hosts_and_paths_cannot_drive_the_terminal() {
        let mut r = Record::new(Kind::Https, "evil\u{1b}]0;title\u{7}.example", 443, Decision::Deny);
        r.method = Some("GET\u{9b}2J".into());
        r.path = Some("/a\u{202e}txt.exe\u{200b}/\u{1b}[8m\tz".into());
        r.reason = Some("no rule allows \u{85}x".into());
        let text = render(&[r]);
        for c in text.chars() {
            assert!(
                c == '\n' || !(c.is_control() || crate::changes::is_invisible(c)),
                "{:?} reached the output: {text:?}",
                c
            );
        }
        assert!(text.contains("evil\\u{1b}]0;title\\u{7}.example:443"), "{text}");
        assert!(text.contains("GET\\u{9b}2J /a\\u{202e}txt.exe\\u{200b}/\\u{1b}[8m\\tz"), "{text}");
        assert!(text.contains("\\u{85}x"), "{text}");
    }

    #[test]
    fn records_round_trip_through_the_file() {
        let path = std::env::temp_dir().join(format!("stockade-audit-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let log = AuditLog::open(&path).unwrap();
        let mut allowed = Record::new(Kind::Connect, "registry.npmjs.org", 443, Decision::Allow);
        allowed.rule = Some("registry.npmjs.org (preset npm)".into());
        allowed.bytes_up = 2048;
        allowed.bytes_down = 5 << 20;
        let mut denied = Record::new(Kind::Connect, "example.com", 443, Decision::Deny);
        denied.reason = Some("not in the policy".into());
        log.record(&allowed);
        log.record(&denied);
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"not json\n").unwrap();
        let (records, bad) = read(&path).unwrap();
        assert_eq!(records, vec![allowed, denied]);
        assert_eq!(bad, 1);
        let table = render(&records);
        assert!(table.contains("allow  connect  registry.npmjs.org:443"), "{table}");
        assert!(table.contains("(2.0 KiB up, 5.0 MiB down)"), "{table}");
        assert!(table.contains("DENY   connect  example.com:443"), "{table}");
        assert!(table.ends_with("2 flows: 1 allowed, 1 denied, 0 failed; 2.0 KiB up, 5.0 MiB down\n"), "{table}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_capped_log_keeps_its_first_records_and_reads_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let record = Record::new(Kind::Dns, "spam.example", 0, Decision::Deny);
        let line = serde_json::to_vec(&record).unwrap().len() as u64 + 1;
        {
            let log = AuditLog::open_capped(&path, 10 * line).unwrap();
            for _ in 0..10_000 {
                log.record(&record);
            }
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 12 * line + 400, "{size} bytes for a cap of {}", 10 * line);
        let (records, bad) = read(&path).unwrap();
        assert_eq!((records.len(), bad), (10, 0), "the cap's notes are not unreadable lines");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&format!("\"dropped_bytes\":{}", 9_990 * line)), "{text}");
    }
}
