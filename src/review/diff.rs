//! Unified diffs of one change: old = the host's file now, new = what the
//! staged entry makes it. Two formats share one writer:
//!
//! - `Terminal`: coloured when asked, binary and oversized files as size and
//!   hash, and every control character or invisible bidi mark in content
//!   escaped, so a hostile file cannot drive the reviewer's terminal or make
//!   lines look other than they are;
//! - `Patch`: what `git diff --binary` would print (mode lines, full index
//!   lines, `GIT binary patch` literals, quoted odd paths), byte for byte,
//!   so `git apply` takes it.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use sha1::Digest;
use similar::{Algorithm, DiffOp, DiffTag, capture_diff_slices_deadline, group_diff_ops};

use crate::protocol::change_set::path::RelPath;
use crate::util::text::is_invisible;

use super::content::{FileData, Side, human_size, is_binary};
use super::style::{Painter, Role};

/// Lines of context around each change.
const CONTEXT: usize = 3;
/// How long one file's diff may search for a minimal edit before settling
/// for a correct but longer one.
const DIFF_DEADLINE: Duration = Duration::from_secs(2);
/// The all-zero object id git writes for "no file".
const NULL_ID: &str = "0000000000000000000000000000000000000000";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Terminal(Painter),
    Patch,
}

/// One path's change, with notes shown under its header on the terminal.
pub struct Change<'a> {
    pub path: &'a RelPath,
    pub old: &'a Side,
    pub new: &'a Side,
    pub notes: &'a [(Role, String)],
}

/// Added and removed lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineStat {
    pub added: u64,
    pub removed: u64,
}

impl std::ops::AddAssign for LineStat {
    fn add_assign(&mut self, other: LineStat) {
        self.added += other.added;
        self.removed += other.removed;
    }
}

/// Line counts of a change between text files; `None` for binary, symlink,
/// unloaded or non-file sides.
pub fn line_stat(old: &Side, new: &Side, deadline: Instant) -> Option<LineStat> {
    let (old, new) = (text_of(old)?, text_of(new)?);
    let count = |bytes: Option<&[u8]>| bytes.map_or(0, |b| split_lines(b).len() as u64);
    Some(match (old, new) {
        (None, new) => LineStat { added: count(new), removed: 0 },
        (old, None) => LineStat { added: 0, removed: count(old) },
        (Some(a), Some(b)) if a == b => LineStat::default(),
        (Some(a), Some(b)) => {
            let (a, b) = (split_lines(a), split_lines(b));
            let mut stat = LineStat::default();
            for op in capture_diff_slices_deadline(Algorithm::Myers, &a, &b, Some(deadline)) {
                let (_, old_range, new_range) = op.as_tag_tuple();
                if op.tag() != DiffTag::Equal {
                    stat.removed += old_range.len() as u64;
                    stat.added += new_range.len() as u64;
                }
            }
            stat
        }
    })
}

/// A side's text: `None` when it cannot be counted, `Some(None)` when it
/// has no content (absent, a directory).
fn text_of(side: &Side) -> Option<Option<&[u8]>> {
    match side {
        Side::File(FileData { bytes: Some(bytes), .. }) if !is_binary(bytes) => Some(Some(bytes)),
        Side::File(_) | Side::Symlink(_) => None,
        _ => Some(None),
    }
}

/// Writes one change. Patch format skips what git cannot express
/// (directories, special files).
pub fn write_change(out: &mut dyn Write, format: Format, change: &Change<'_>) -> io::Result<()> {
    let (old, new) = (change.old, change.new);
    match (old.has_content(), new.has_content()) {
        (false, false) => write_note_only(out, format, change),
        (true, true) if std::mem::discriminant(old) != std::mem::discriminant(new) => {
            // A file became a symlink or back: git shows a deletion and an addition.
            write_section(out, format, change, old, &Side::Absent)?;
            write_section(out, format, &Change { notes: &[], ..*change }, &Side::Absent, new)
        }
        (true, _) | (_, true) => write_section(out, format, change, old, new),
    }
}

/// Directories, special files and unreadable paths: a header and a line
/// saying what happens, on the terminal only.
fn write_note_only(out: &mut dyn Write, format: Format, change: &Change<'_>) -> io::Result<()> {
    let Format::Terminal(painter) = format else { return Ok(()) };
    let what = match (change.old, change.new) {
        (Side::Dir(a), Side::Dir(b)) if a != b => format!("directory mode {a} → {b}"),
        (Side::Dir(_), Side::Dir(_)) => "directory (its contents are replaced)".to_string(),
        (Side::Absent, Side::Dir(mode)) => format!("new directory, mode {mode}"),
        (Side::Dir(_), Side::Absent) => "directory deleted".to_string(),
        (Side::Unreadable(why), _) => format!("cannot read the host's version: {why}"),
        (_, Side::Unreadable(why)) => format!("cannot read the staged version: {why}"),
        (old, new) => format!("{} → {}", old.word(), new.word()),
    };
    writeln!(out, "{}", painter.paint(Role::Meta, format!("diff {}", change.path)))?;
    write_notes(out, painter, change.notes)?;
    writeln!(out, "{}", painter.paint(Role::Muted, what))
}

fn write_notes(out: &mut dyn Write, painter: Painter, notes: &[(Role, String)]) -> io::Result<()> {
    for (role, text) in notes {
        writeln!(out, "{}", painter.paint(*role, format!("! {text}")))?;
    }
    Ok(())
}

/// A git file mode: 100644, 100755 or 120000.
fn git_mode(side: &Side) -> &'static str {
    match side {
        Side::File(data) if data.is_executable() => "100755",
        Side::Symlink(_) => "120000",
        _ => "100644",
    }
}

/// The content a diff compares: file bytes or a symlink's target.
fn bytes_of(side: &Side) -> Option<&[u8]> {
    match side {
        Side::File(data) => data.bytes.as_deref(),
        Side::Symlink(target) => Some(target),
        _ => None,
    }
}

/// Git's object id of a blob.
fn git_blob_id(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Header, then hunks or a binary section, for one content change.
fn write_section(out: &mut dyn Write, format: Format, change: &Change<'_>, old: &Side, new: &Side) -> io::Result<()> {
    let patch = format == Format::Patch;
    let (a, b) = (quoted("a/", change.path, patch), quoted("b/", change.path, patch));
    let painter = match format {
        Format::Terminal(p) => p,
        Format::Patch => Painter::plain(),
    };
    let meta = |text: String| painter.paint(Role::Meta, text);
    writeln!(out, "{}", meta(format!("diff --git {a} {b}")))?;
    if !patch {
        write_notes(out, painter, change.notes)?;
    }
    let (old_bytes, new_bytes) = (bytes_of(old), bytes_of(new));
    let (had, has) = (old.has_content(), new.has_content());
    if !had {
        writeln!(out, "{}", meta(format!("new file mode {}", git_mode(new))))?;
    } else if !has {
        writeln!(out, "{}", meta(format!("deleted file mode {}", git_mode(old))))?;
    } else if git_mode(old) != git_mode(new) {
        writeln!(out, "{}", meta(format!("old mode {}", git_mode(old))))?;
        writeln!(out, "{}", meta(format!("new mode {}", git_mode(new))))?;
    }
    if had && has && old_bytes.is_some() && old_bytes == new_bytes {
        // Only the mode changed.
        return Ok(());
    }
    let binary = [old, new].iter().any(|s| matches!(s, Side::File(d) if d.bytes.is_none() || d.is_binary()));
    if patch {
        let id = |side: &Side, has: bool| match (has, bytes_of(side)) {
            (false, _) => Ok(NULL_ID.to_string()),
            (true, Some(bytes)) => Ok(git_blob_id(bytes)),
            (true, None) => Err(io::Error::other(format!("{} is too large to put in a patch", change.path))),
        };
        let (old_id, new_id) = (id(old, had)?, id(new, has)?);
        let mode =
            if had && has && git_mode(old) == git_mode(new) { format!(" {}", git_mode(new)) } else { String::new() };
        writeln!(out, "index {old_id}..{new_id}{mode}")?;
        if binary {
            return write_binary_patch(out, old_bytes.unwrap_or_default(), new_bytes.unwrap_or_default());
        }
    } else if binary {
        let describe = |side: &Side| match side {
            Side::File(d) => {
                let hash = d.sha256().map_or_else(String::new, |h| format!(", sha256 {}", &h.hex()[..12]));
                format!("{}{hash}", human_size(d.size))
            }
            other => other.word().to_string(),
        };
        let what = if [old, new].iter().any(|s| matches!(s, Side::File(d) if d.bytes.is_none())) {
            "large file, not shown"
        } else {
            "binary file"
        };
        return writeln!(
            out,
            "{}",
            painter.paint(Role::Muted, format!("{what}: {} → {}", describe(old), describe(new)))
        );
    }
    if old_bytes.unwrap_or_default().is_empty() && new_bytes.unwrap_or_default().is_empty() {
        // An empty file added or deleted: git writes no hunk, nor file names.
        return Ok(());
    }
    let old_name = if had { a.clone() } else { "/dev/null".to_string() };
    let new_name = if has { b.clone() } else { "/dev/null".to_string() };
    writeln!(out, "{}", meta(format!("--- {old_name}")))?;
    writeln!(out, "{}", meta(format!("+++ {new_name}")))?;
    write_hunks(out, format, old_bytes.unwrap_or_default(), new_bytes.unwrap_or_default())
}

/// Splits after each newline; a last line without one is kept.
fn split_lines(bytes: &[u8]) -> Vec<&[u8]> {
    bytes.split_inclusive(|&b| b == b'\n').collect()
}

fn write_hunks(out: &mut dyn Write, format: Format, old: &[u8], new: &[u8]) -> io::Result<()> {
    let (a, b) = (split_lines(old), split_lines(new));
    let ops = capture_diff_slices_deadline(Algorithm::Myers, &a, &b, Some(Instant::now() + DIFF_DEADLINE));
    for group in group_diff_ops(ops, CONTEXT) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else { continue };
        let old_range = first.old_range().start..last.old_range().end;
        let new_range = first.new_range().start..last.new_range().end;
        let header = format!("@@ -{} +{} @@", hunk_range(&old_range), hunk_range(&new_range));
        match format {
            Format::Terminal(p) => writeln!(out, "{}", p.paint(Role::Hunk, header))?,
            Format::Patch => writeln!(out, "{header}")?,
        }
        for op in &group {
            write_op(out, format, op, &a, &b)?;
        }
    }
    Ok(())
}

/// `start,count` with git's conventions: the count is left out when 1, and
/// an empty range starts at the line before it.
fn hunk_range(range: &std::ops::Range<usize>) -> String {
    match range.len() {
        0 => format!("{},0", range.start),
        1 => format!("{}", range.start + 1),
        n => format!("{},{n}", range.start + 1),
    }
}

fn write_op(out: &mut dyn Write, format: Format, op: &DiffOp, a: &[&[u8]], b: &[&[u8]]) -> io::Result<()> {
    let (tag, old_range, new_range) = op.as_tag_tuple();
    match tag {
        DiffTag::Equal => {
            for line in &a[old_range] {
                write_line(out, format, b' ', line)?;
            }
        }
        DiffTag::Delete => {
            for line in &a[old_range] {
                write_line(out, format, b'-', line)?;
            }
        }
        DiffTag::Insert => {
            for line in &b[new_range] {
                write_line(out, format, b'+', line)?;
            }
        }
        DiffTag::Replace => {
            for line in &a[old_range] {
                write_line(out, format, b'-', line)?;
            }
            for line in &b[new_range] {
                write_line(out, format, b'+', line)?;
            }
        }
    }
    Ok(())
}

fn write_line(out: &mut dyn Write, format: Format, sign: u8, line: &[u8]) -> io::Result<()> {
    let (body, newline) = match line.strip_suffix(b"\n") {
        Some(body) => (body, true),
        None => (line, false),
    };
    match format {
        Format::Patch => {
            out.write_all(&[sign])?;
            out.write_all(body)?;
            out.write_all(b"\n")?;
        }
        Format::Terminal(painter) => {
            let role = match sign {
                b'+' => Some(Role::Plus),
                b'-' => Some(Role::Minus),
                _ => None,
            };
            let mut text = match role {
                Some(role) => painter.paint(role, sign as char).to_string(),
                None => (sign as char).to_string(),
            };
            for (escaped, piece) in escape_content(body) {
                match (escaped, role) {
                    (true, _) => text.push_str(&painter.paint(Role::Escaped, piece).to_string()),
                    (false, Some(role)) => text.push_str(&painter.paint(role, piece).to_string()),
                    (false, None) => text.push_str(&piece),
                }
            }
            writeln!(out, "{text}")?;
        }
    }
    if !newline {
        writeln!(out, "\\ No newline at end of file")?;
    }
    Ok(())
}

/// Splits content into displayable pieces and escaped ones: control
/// characters (but tab), bytes that are not UTF-8, and invisible marks that
/// reorder or hide text (bidi overrides and isolates, zero-width
/// characters, the byte-order mark).
pub fn escape_content(bytes: &[u8]) -> Vec<(bool, String)> {
    let mut pieces: Vec<(bool, String)> = Vec::new();
    let mut push = |escaped: bool, text: &str| match pieces.last_mut() {
        Some((e, s)) if *e == escaped => s.push_str(text),
        _ => pieces.push((escaped, text.to_string())),
    };
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\t' {
                push(false, "\t");
            } else if c.is_control() {
                push(true, &c.escape_default().to_string());
            } else if is_invisible(c) {
                push(true, &format!("<U+{:04X}>", c as u32));
            } else {
                let mut buf = [0u8; 4];
                push(false, c.encode_utf8(&mut buf));
            }
        }
        for b in chunk.invalid() {
            push(true, &format!("\\x{b:02x}"));
        }
    }
    pieces
}

/// Git's quoting of a path in a patch: C-style in double quotes when it has
/// control characters, quotes, backslashes or bytes above ASCII.
fn quoted(prefix: &str, path: &RelPath, patch: bool) -> String {
    if !patch {
        return format!("{prefix}{path}");
    }
    let bytes = path.as_bytes();
    if !bytes.iter().any(|&b| b < 0x20 || b == 0x7f || b == b'"' || b == b'\\' || b >= 0x80) {
        return format!("{prefix}{}", String::from_utf8_lossy(bytes));
    }
    let mut out = format!("\"{prefix}");
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out.push('"');
    out
}

/// `GIT binary patch` with a forward and a reverse literal.
fn write_binary_patch(out: &mut dyn Write, old: &[u8], new: &[u8]) -> io::Result<()> {
    writeln!(out, "GIT binary patch")?;
    write_literal(out, new)?;
    write_literal(out, old)
}

fn write_literal(out: &mut dyn Write, content: &[u8]) -> io::Result<()> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(content)?;
    let compressed = encoder.finish()?;
    writeln!(out, "literal {}", content.len())?;
    for chunk in compressed.chunks(52) {
        // Chunks are 1..=52 bytes: the length letter is A-Z for 1-26, a-z for 27-52.
        let n = u8::try_from(chunk.len()).unwrap_or(52);
        let tag = if n <= 26 { b'A' + n - 1 } else { b'a' + n - 27 };
        out.write_all(&[tag])?;
        out.write_all(&base85(chunk))?;
        out.write_all(b"\n")?;
    }
    writeln!(out)
}

/// Git's base85 (its own alphabet), four bytes to five characters, the last
/// group zero-padded.
fn base85(bytes: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8; 85] =
        b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";
    let mut out = Vec::with_capacity(bytes.len().div_ceil(4) * 5);
    for group in bytes.chunks(4) {
        let mut word = [0u8; 4];
        word[..group.len()].copy_from_slice(group);
        let mut acc = u32::from_be_bytes(word);
        let mut chars = [0u8; 5];
        for c in chars.iter_mut().rev() {
            *c = ALPHABET[(acc % 85) as usize];
            acc /= 85;
        }
        out.extend_from_slice(&chars);
    }
    out
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
