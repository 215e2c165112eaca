//! The audit log: one JSON line per flow the guest asked for, allowed or
//! denied, in the session directory; and its rendering for `stockade log`.
//!
//! The log is bounded, and a guest that floods it first must not act
//! unrecorded afterwards: past `NETWORK_LOG_CAP`, only security records
//! (denials, credential and sign-in writes, signatures, refused downloads)
//! are written in full, up to `SECURITY_LOG_CAP` more; every other record,
//! and security records past that too, is summed in memory by its shape
//! (kind, destination, verdict, what was written) for a bounded number of
//! shapes, and the sums are written when the proxy stops, as records with a
//! `repeated` count. Counts read from the log are thus exact.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::ProxyError;
use crate::logcap::NETWORK_LOG_CAP;
use crate::protocol::audit::{Decision, Kind, Record};
use crate::util::text::display_bytes;

/// Room for security records in full past `NETWORK_LOG_CAP`: some 25,000.
pub const SECURITY_LOG_CAP: u64 = 8 << 20;
/// Shapes summed past the caps, for security records and for the rest
/// each; beyond them a record is summed by kind and verdict alone.
const MAX_SHAPES: usize = 4096;
/// The most of a host or reason kept in a shape.
const MAX_SHAPE_TEXT: usize = 512;
/// The host of a sum over destinations past `MAX_SHAPES`.
const OTHER_DESTINATIONS: &str = "(other destinations)";

impl Record {
    /// Whether it must stay readable whatever the guest logged before it:
    /// a refusal, a secret written for the guest, a signature, a download
    /// that did not match its registry's digest.
    fn security(&self) -> bool {
        self.decision == Decision::Deny
            || self.kind == Kind::Agent
            || self.credential.is_some()
            || self.signin.is_some()
            || self.signin_saved.is_some()
            || self.cache.as_deref() == Some("refused")
    }

    /// What it is summed by past the caps: all but the time, the address,
    /// the request and the bytes; the guest's words in it cut short, so
    /// that the sums' memory stays bounded.
    fn shape(&self) -> Record {
        Record {
            host: clip(&self.host),
            reason: self.reason.as_deref().map(clip),
            time: String::new(),
            addr: None,
            method: None,
            path: None,
            status: None,
            bytes_up: 0,
            bytes_down: 0,
            repeated: None,
            ..self.clone()
        }
    }

    /// The shape of records past `MAX_SHAPES`: kind and verdict.
    fn other_shape(&self) -> Record {
        let mut shape = Record::new(self.kind, OTHER_DESTINATIONS, 0, self.decision);
        shape.time = String::new();
        shape.reason = Some("past the network log's caps and its bound on distinct destinations".into());
        shape
    }
}

/// The note earlier versions wrote at their cap, after which they dropped
/// every record.
#[derive(Debug, Deserialize)]
struct OldCapNote {
    #[serde(rename = "stockade_log_cap")]
    _note: serde::de::IgnoredAny,
}

/// At most `MAX_SHAPE_TEXT` bytes of `text`, marked when cut.
fn clip(text: &str) -> String {
    if text.len() <= MAX_SHAPE_TEXT {
        return text.to_string();
    }
    let mut end = MAX_SHAPE_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// A line of the log that is not a record: where the caps were reached,
/// and what was summed.
#[derive(Debug, Serialize, Deserialize)]
struct Note {
    stockade_audit: NoteDetail,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum NoteDetail {
    /// From here on only security records are written in full.
    CapReached { cap_bytes: u64, security_cap_bytes: u64 },
    /// From here on every record is summed.
    SecurityCapReached { security_cap_bytes: u64 },
    /// Records past the cap since the last summary: how many, how many
    /// written in full, how many summed in the `repeated` lines before it.
    Summary { past_cap: u64, kept: u64, summed: u64 },
}

/// Where records go: a file, or nowhere (benchmarks, tests).
#[derive(Debug)]
pub struct AuditLog {
    file: Option<Mutex<Sink>>,
    path: Option<PathBuf>,
    failed: AtomicBool,
}

/// The file and what was written to it, against its caps.
#[derive(Debug)]
struct Sink {
    file: File,
    cap: u64,
    security_cap: u64,
    written: u64,
    /// Whether a record did not fit in `cap`: all later ones are past it.
    capped: bool,
    security_written: u64,
    /// Since the last summary.
    past_cap: u64,
    kept: u64,
    sums: HashMap<Record, Sum>,
    /// Shapes in `sums`: security ones, and the rest.
    shapes: [usize; 2],
}

#[derive(Debug, Default)]
struct Sum {
    count: u64,
    bytes_up: u64,
    bytes_down: u64,
    last: String,
}

impl AuditLog {
    /// Appends to `path` (created 0600: it names every host the guest used).
    pub fn open(path: &Path) -> Result<AuditLog, ProxyError> {
        AuditLog::open_capped(path, NETWORK_LOG_CAP, SECURITY_LOG_CAP)
    }

    /// [`AuditLog::open`] with records in full up to `cap` bytes, and
    /// security records up to `security_cap` bytes more.
    pub(crate) fn open_capped(path: &Path, cap: u64, security_cap: u64) -> Result<AuditLog, ProxyError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| ProxyError::Audit { path: path.to_path_buf(), source })?;
        let sink = Sink {
            file,
            cap,
            security_cap,
            written: 0,
            capped: false,
            security_written: 0,
            past_cap: 0,
            kept: 0,
            sums: HashMap::new(),
            shapes: [0; 2],
        };
        Ok(AuditLog { file: Some(Mutex::new(sink)), path: Some(path.to_path_buf()), failed: AtomicBool::new(false) })
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
        let result = file.lock().unwrap_or_else(|e| e.into_inner()).record(record);
        self.report(result);
    }

    /// Writes the sums of the records past the caps, and a summary; the
    /// proxy calls it when it stops. Records after it are summed anew.
    pub fn finish(&self) {
        let Some(file) = &self.file else { return };
        let result = file.lock().unwrap_or_else(|e| e.into_inner()).finish();
        self.report(result);
    }

    fn report(&self, result: std::io::Result<()>) {
        if let Err(err) = result {
            if !self.failed.swap(true, Ordering::Relaxed) {
                let path = self.path.as_deref().unwrap_or(Path::new("?"));
                tracing::warn!("cannot write the audit log {}: {err}", path.display());
            }
        }
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Sink {
    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        let line = line(record)?;
        let len = line.len() as u64;
        if !self.capped && self.written.saturating_add(len) <= self.cap {
            self.written += len;
            return self.file.write_all(&line);
        }
        if !self.capped {
            self.capped = true;
            let note = NoteDetail::CapReached { cap_bytes: self.cap, security_cap_bytes: self.security_cap };
            self.note(note)?;
        }
        self.past_cap += 1;
        let security = record.security();
        if security && self.security_written < self.security_cap {
            self.security_written = self.security_written.saturating_add(len);
            if self.security_written >= self.security_cap {
                self.note(NoteDetail::SecurityCapReached { security_cap_bytes: self.security_cap })?;
            } else {
                self.kept += 1;
                return self.file.write_all(&line);
            }
        }
        self.sum(record, security);
        Ok(())
    }

    fn sum(&mut self, record: &Record, security: bool) {
        let mut shape = record.shape();
        let class = usize::from(security);
        if !self.sums.contains_key(&shape) {
            if self.shapes[class] < MAX_SHAPES {
                self.shapes[class] += 1;
            } else {
                shape = record.other_shape();
            }
        }
        let sum = self.sums.entry(shape).or_default();
        sum.count += 1;
        sum.bytes_up = sum.bytes_up.saturating_add(record.bytes_up);
        sum.bytes_down = sum.bytes_down.saturating_add(record.bytes_down);
        sum.last.clone_from(&record.time);
    }

    fn finish(&mut self) -> std::io::Result<()> {
        if self.past_cap == 0 {
            return Ok(());
        }
        let mut summed = 0;
        let mut sums: Vec<(Record, Sum)> = std::mem::take(&mut self.sums).into_iter().collect();
        sums.sort_by(|a, b| a.1.last.cmp(&b.1.last));
        let mut text = Vec::new();
        for (mut record, sum) in sums {
            summed += sum.count;
            record.time = sum.last;
            record.bytes_up = sum.bytes_up;
            record.bytes_down = sum.bytes_down;
            record.repeated = Some(sum.count);
            text.extend(line(&record)?);
        }
        self.shapes = [0; 2];
        let summary = NoteDetail::Summary { past_cap: self.past_cap, kept: self.kept, summed };
        (self.past_cap, self.kept) = (0, 0);
        self.file.write_all(&text)?;
        self.note(summary)
    }

    fn note(&mut self, detail: NoteDetail) -> std::io::Result<()> {
        let mut text = serde_json::to_vec(&Note { stockade_audit: detail }).map_err(std::io::Error::other)?;
        text.push(b'\n');
        self.file.write_all(&text)
    }
}

/// A record as its line: one write on an O_APPEND file, so lines never
/// interleave.
fn line(record: &Record) -> std::io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// Reads an audit log; lines that do not parse are counted, not fatal.
/// The notes of a capped log are skipped (the log says it was capped);
/// records summed past its caps come as records with a `repeated` count.
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
            Err(_) if serde_json::from_str::<Note>(&line).is_ok() => {}
            // Logs of earlier versions, which dropped records past the cap.
            Err(_) if serde_json::from_str::<OldCapNote>(&line).is_ok() => {
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
    let count = |d: Decision| records.iter().filter(|r| r.decision == d).map(Record::count).sum::<u64>();
    let (allowed, denied, failed) = (count(Decision::Allow), count(Decision::Deny), count(Decision::Fail));
    let up: u64 = records.iter().map(|r| r.bytes_up).sum();
    let down: u64 = records.iter().map(|r| r.bytes_down).sum();
    let _ = writeln!(
        out,
        "{} flows: {allowed} allowed, {denied} denied, {failed} failed; {} up, {} down",
        records.iter().map(Record::count).sum::<u64>(),
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
    if let Some(n) = r.repeated {
        let _ = write!(request, " {n} times past the log's cap");
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
    use crate::protocol::audit::AUDIT_FILE;

    #[test]
    fn guest_chosen_hosts_and_paths_cannot_drive_the_terminal() {
        let mut r = Record::new(Kind::Https, "evil\u{1b}]0;title\u{7}.example", 443, Decision::Deny);
        r.method = Some("GET\u{9b}2J".into());
        r.path = Some("/a\u{202e}txt.exe\u{200b}/\u{1b}[8m\tz".into());
        r.reason = Some("no rule allows \u{85}x".into());
        let text = render(&[r]);
        for c in text.chars() {
            assert!(
                c == '\n' || !(c.is_control() || crate::util::text::is_invisible(c)),
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
    fn a_flood_of_allowed_requests_past_the_cap_does_not_hide_a_denial_or_a_credential_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let mut allowed = Record::new(Kind::Https, "registry.example", 443, Decision::Allow);
        allowed.rule = Some("registry.example".into());
        allowed.bytes_down = 10;
        let line = serde_json::to_vec(&allowed).unwrap().len() as u64 + 1;
        let mut denied = Record::new(Kind::Connect, "exfil.example", 443, Decision::Deny);
        denied.reason = Some("not in the policy".into());
        let mut credential = Record::new(Kind::Https, "api.github.com", 443, Decision::Allow);
        credential.credential = Some("github".into());
        {
            let log = AuditLog::open_capped(&path, 10 * line, SECURITY_LOG_CAP).unwrap();
            for _ in 0..10_000 {
                log.record(&allowed);
            }
            log.record(&denied);
            log.record(&credential);
        }
        let (records, bad) = read(&path).unwrap();
        assert_eq!(bad, 0);
        assert!(records.contains(&denied), "the denial past the cap is kept");
        assert!(records.contains(&credential), "the credential write past the cap is kept");
        let table = render(&records);
        assert!(table.ends_with("10002 flows: 10001 allowed, 1 denied, 0 failed; 0 B up, 97.7 KiB down\n"), "{table}");
        assert!(
            table.contains("registry.example:443  9990 times past the log's cap (0 B up, 97.6 KiB down)"),
            "{table}"
        );
    }

    #[test]
    fn denials_summed_past_the_caps_are_learned_with_their_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let mut denied = Record::new(Kind::Connect, "pypi.org", 443, Decision::Deny);
        denied.reason = Some("not in the policy".into());
        {
            let log = AuditLog::open_capped(&path, 0, 0).unwrap();
            for _ in 0..500 {
                log.record(&denied);
            }
        }
        let (records, _) = read(&path).unwrap();
        assert_eq!(records.len(), 1, "{records:?}");
        let text = crate::policy::learn::Lessons::from_records(&records).render("s", "pip install x");
        assert!(text.contains("500 denials"), "{text}");
    }

    #[test]
    fn a_flood_of_denials_stays_bounded_and_every_one_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let record = Record::new(Kind::Dns, "spam.example", 0, Decision::Deny);
        let line = serde_json::to_vec(&record).unwrap().len() as u64 + 1;
        {
            let log = AuditLog::open_capped(&path, 10 * line, 20 * line).unwrap();
            for _ in 0..10_000 {
                log.record(&record);
            }
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 31 * line + 600, "{size} bytes for caps of {} and {}", 10 * line, 20 * line);
        let (records, bad) = read(&path).unwrap();
        assert_eq!(bad, 0, "the notes are not unreadable lines");
        assert_eq!(records.iter().filter(|r| r.repeated.is_none()).count(), 29, "10, then 19 in the second cap");
        assert_eq!(records.iter().map(Record::count).sum::<u64>(), 10_000);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"summary\":{\"past_cap\":9990,\"kept\":19,\"summed\":9971}"), "{text}");
    }

    #[test]
    fn distinct_destinations_past_the_caps_are_summed_within_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let spam = |n: usize| Record::new(Kind::Connect, format!("host{n}.spam.example"), 443, Decision::Deny);
        let fetched = |n: usize| Record::new(Kind::Connect, format!("cdn{n}.example"), 443, Decision::Allow);
        let flood = 3 * MAX_SHAPES;
        {
            let log = AuditLog::open_capped(&path, 1000, 1000).unwrap();
            for n in 0..flood {
                log.record(&fetched(n));
                log.record(&spam(n));
            }
            log.finish();
            // After a finish (a run's proxy stopping), later records are summed anew.
            log.record(&spam(0));
        }
        let (records, bad) = read(&path).unwrap();
        assert_eq!(bad, 0);
        assert!(records.len() < 2 * MAX_SHAPES + 20, "{} lines", records.len());
        let count = |d: Decision| records.iter().filter(|r| r.decision == d).map(Record::count).sum::<u64>();
        assert_eq!((count(Decision::Allow), count(Decision::Deny)), (flood as u64, flood as u64 + 1));
        let first = records.iter().find(|r| r.host == "host0.spam.example").unwrap();
        assert_eq!(first.repeated, None, "in full, before the caps");
        let others: Vec<&Record> = records.iter().filter(|r| r.host == OTHER_DESTINATIONS).collect();
        assert_eq!(others.len(), 2, "one sum per kind and verdict: {others:?}");
    }
}
