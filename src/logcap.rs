//! Session logs with a size cap. What the guest prints (its console, dockerd,
//! the hosts it asks for) lands in files on the host, so a guest printing
//! forever must not fill the host's disk: each log keeps its first bytes up
//! to a cap, then one note that the rest is dropped, and, when flushed or
//! dropped, how many bytes that was.
//!
//! Counting happens in-process, on writes that were already being made, so
//! the jailed VMM needs no system call it did not have.
#![forbid(unsafe_code)]

use std::io::{self, Write};

/// Enough for any boot and a long session of ordinary logging.
pub const KERNEL_LOG_CAP: u64 = 4 << 20;
/// The VMM logs warnings, not traffic; more than this is a guest provoking it.
pub const VMM_LOG_CAP: u64 = 4 << 20;
pub const DOCKERD_LOG_CAP: u64 = 4 << 20;
/// A record per connection or DNS question (about 300 bytes): some 50,000
/// of them in full; past it the audit log keeps security records and sums
/// the rest (`proxy::audit`). The CI summary counts from this file.
pub const NETWORK_LOG_CAP: u64 = 16 << 20;

/// How the note at the cap is written, so that readers of the file can
/// tell it from the log's own lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A bracketed line of text.
    Text,
}

/// A writer that passes whole writes through until `limit` bytes, then
/// drops every later write (reporting it written, so callers carry on).
#[derive(Debug)]
pub struct Capped<W: Write> {
    inner: W,
    name: &'static str,
    style: Style,
    limit: u64,
    written: u64,
    dropped: u64,
    /// `dropped` when the last tally was written.
    tallied: u64,
    /// Whether what was written last ended a line.
    at_line_start: bool,
}

impl<W: Write> Capped<W> {
    /// `name` is the log's file name, for the note.
    pub fn new(inner: W, name: &'static str, style: Style, limit: u64) -> Capped<W> {
        Capped { inner, name, style, limit, written: 0, dropped: 0, tallied: 0, at_line_start: true }
    }

    /// Bytes dropped so far.
    #[cfg(test)]
    fn dropped(&self) -> u64 {
        self.dropped
    }

    fn note(&mut self, first: bool) -> io::Result<()> {
        let text = match self.style {
            Style::Text => {
                let lead = if self.at_line_start { "" } else { "\n" };
                if first {
                    format!(
                        "{lead}[stockade: {} reached its cap of {} bytes; later output is dropped]\n",
                        self.name, self.limit
                    )
                } else {
                    format!("{lead}[stockade: {} bytes of {} dropped after the cap]\n", self.dropped, self.name)
                }
            }
        };
        self.at_line_start = true;
        self.inner.write_all(text.as_bytes())
    }
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = buf.len() as u64;
        if self.dropped == 0 && self.written.saturating_add(len) <= self.limit {
            self.inner.write_all(buf)?;
            self.written += len;
            if let Some(&last) = buf.last() {
                self.at_line_start = last == b'\n';
            }
            return Ok(buf.len());
        }
        let first = self.dropped == 0;
        self.dropped = self.dropped.saturating_add(len.max(1));
        if first {
            self.note(true)?;
        }
        Ok(buf.len())
    }

    /// Also writes how much was dropped since the last flush, so the file
    /// says it even if the process is killed later.
    fn flush(&mut self) -> io::Result<()> {
        if self.dropped > self.tallied {
            self.tallied = self.dropped;
            self.note(false)?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for Capped<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_whole_writes_up_to_the_cap_then_says_how_much_was_dropped() {
        let mut out = Vec::new();
        {
            let mut log = Capped::new(&mut out, "kernel.log", Style::Text, 10);
            log.write_all(b"line 1\n").unwrap();
            log.write_all(b"line 2\n").unwrap();
            for _ in 0..1000 {
                assert_eq!(log.write(b"endless\n").unwrap(), 8, "a dropped write still reports success");
            }
            assert_eq!(log.dropped(), 7 + 8000);
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "line 1\n\
             [stockade: kernel.log reached its cap of 10 bytes; later output is dropped]\n\
             [stockade: 8007 bytes of kernel.log dropped after the cap]\n"
        );
    }

    #[test]
    fn an_endless_guest_console_stays_under_the_cap() {
        let mut out = Vec::new();
        {
            let inner = io::LineWriter::new(Capped::new(&mut out, "kernel.log", Style::Text, KERNEL_LOG_CAP));
            let mut console = inner;
            let line = [b'x'; 99];
            // 64 MiB of console output, byte by byte as the UART sees it.
            for _ in 0..(64 << 20) / 100 {
                console.write_all(&line).unwrap();
                console.write_all(b"\n").unwrap();
            }
            console.flush().unwrap();
        }
        assert!(out.len() as u64 <= KERNEL_LOG_CAP + 200, "{} bytes kept", out.len());
        assert!(out.len() as u64 > KERNEL_LOG_CAP - 200, "the cap is used, not wasted: {}", out.len());
        let tail = String::from_utf8_lossy(&out[out.len() - 200..]).into_owned();
        assert!(tail.contains("bytes of kernel.log dropped after the cap"), "{tail}");
    }

    #[test]
    fn nothing_is_added_below_the_cap() {
        let mut out = Vec::new();
        {
            let mut log = Capped::new(&mut out, "dockerd.log", Style::Text, 100);
            log.write_all(b"started\n").unwrap();
            log.flush().unwrap();
        }
        assert_eq!(out, b"started\n");
    }
}
