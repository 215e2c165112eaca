//! Workspace-relative paths as a change set carries them.
//!
//! A `RelPath` is raw bytes (Linux file names need not be UTF-8) that passed
//! every rule below, so code holding one never re-checks: relative, no empty,
//! `.` or `..` components, no NUL, names and the whole path within the kernel's
//! limits. The guest chooses these bytes, so the rules are the first defence of
//! the host workspace.

use std::cmp::Ordering;
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::util::text::display_bytes;

/// Longest path accepted, in bytes (Linux PATH_MAX, which counts the NUL).
pub const MAX_PATH: usize = 4095;
/// Longest single name accepted, in bytes (NAME_MAX).
pub const MAX_NAME: usize = 255;

/// Why bytes are not an acceptable workspace-relative path.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("the path {0} is absolute; change sets hold workspace-relative paths only")]
    Absolute(String),
    #[error("the path {0} contains a `..` component, which could leave the workspace")]
    DotDot(String),
    #[error("the path {0} contains an empty or `.` component; paths must be in normal form")]
    NotNormal(String),
    #[error("the path {0} contains a NUL byte")]
    Nul(String),
    #[error("a name in {path} is {len} bytes long; the limit is {MAX_NAME}")]
    NameTooLong { path: String, len: usize },
    #[error("the path {path}… is {len} bytes long; the limit is {MAX_PATH}")]
    TooLong { path: String, len: usize },
    #[error("the path {0} is not in the change set's escaped form (a `%` must start `%XX`)")]
    BadEscape(String),
}

/// A validated, normalized, workspace-relative path.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    /// Validates `bytes` against every path rule.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<RelPath, PathError> {
        let bytes = bytes.into();
        check(&bytes)?;
        Ok(RelPath(bytes))
    }

    /// The path below `self` named `name` (one component).
    pub fn join(&self, name: &[u8]) -> Result<RelPath, PathError> {
        let mut bytes = Vec::with_capacity(self.0.len() + 1 + name.len());
        bytes.extend_from_slice(&self.0);
        bytes.push(b'/');
        bytes.extend_from_slice(name);
        RelPath::new(bytes)
    }

    /// `name` as a top-level path.
    pub fn from_name(name: &[u8]) -> Result<RelPath, PathError> {
        if name.contains(&b'/') {
            return Err(PathError::NotNormal(lossy(name)));
        }
        RelPath::new(name)
    }

    /// `name` below `parent`, or at the top when there is none (as walkers build paths).
    pub fn child(parent: Option<&RelPath>, name: &[u8]) -> Result<RelPath, PathError> {
        match parent {
            Some(p) => p.join(name),
            None => RelPath::from_name(name),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    pub fn components(&self) -> impl DoubleEndedIterator<Item = &[u8]> + Clone {
        self.0.split(|&b| b == b'/')
    }

    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// The last component.
    pub fn file_name(&self) -> &[u8] {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
    }

    /// The containing path, `None` for a top-level name.
    pub fn parent(&self) -> Option<RelPath> {
        self.0.iter().rposition(|&b| b == b'/').map(|i| RelPath(self.0[..i].to_vec()))
    }

    /// Every proper ancestor, nearest first.
    pub fn ancestors(&self) -> impl Iterator<Item = RelPath> + '_ {
        self.0.iter().enumerate().rev().filter(|(_, b)| **b == b'/').map(|(i, _)| RelPath(self.0[..i].to_vec()))
    }

    /// Whether `self` lies strictly below `ancestor`.
    pub fn is_below(&self, ancestor: &RelPath) -> bool {
        self.0.len() > ancestor.0.len() && self.starts_with(ancestor)
    }

    /// Whether `self` is `prefix` or lies below it (whole components only:
    /// `ab` does not start with `a`).
    pub fn starts_with(&self, prefix: &RelPath) -> bool {
        self.0.starts_with(&prefix.0) && (self.0.len() == prefix.0.len() || self.0[prefix.0.len()] == b'/')
    }

    /// The form used in JSON: UTF-8 text as is, `%` and bytes that are not
    /// UTF-8 as `%XX`.
    pub fn escaped(&self) -> String {
        escape(&self.0)
    }

    /// Parses the JSON form and validates the result.
    pub fn from_escaped(text: &str) -> Result<RelPath, PathError> {
        RelPath::new(unescape(text)?)
    }
}

fn check(bytes: &[u8]) -> Result<(), PathError> {
    if bytes.is_empty() {
        return Err(PathError::Empty);
    }
    if bytes.len() > MAX_PATH {
        return Err(PathError::TooLong { path: lossy(&bytes[..64]), len: bytes.len() });
    }
    if bytes.contains(&0) {
        return Err(PathError::Nul(lossy(bytes)));
    }
    if bytes[0] == b'/' {
        return Err(PathError::Absolute(lossy(bytes)));
    }
    for name in bytes.split(|&b| b == b'/') {
        match name {
            b".." => return Err(PathError::DotDot(lossy(bytes))),
            b"" | b"." => return Err(PathError::NotNormal(lossy(bytes))),
            _ if name.len() > MAX_NAME => return Err(PathError::NameTooLong { path: lossy(bytes), len: name.len() }),
            _ => {}
        }
    }
    Ok(())
}

/// Tree order: a directory comes right before its contents, siblings by bytes.
/// That is the components compared in turn, which is the bytes compared with
/// `/` below every other byte (names hold no NUL), so one pass over the
/// common prefix decides, however deep the paths.
impl Ord for RelPath {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (&self.0[..], &other.0[..]);
        let i = common_prefix(a, b);
        let key = |bytes: &[u8]| bytes.get(i).map(|&c| if c == b'/' { 0 } else { u16::from(c) + 1 });
        key(a).cmp(&key(b))
    }
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 32;
    let len = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= len && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < len && a[i] == b[i] {
        i += 1;
    }
    i
}

impl PartialOrd for RelPath {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// For people: control characters and bytes that are not UTF-8 are escaped,
/// so a hostile name cannot drive the terminal showing it.
impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&display_bytes(&self.0))
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", display_bytes(&self.0))
    }
}

impl Serialize for RelPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.escaped())
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        RelPath::from_escaped(&text).map_err(serde::de::Error::custom)
    }
}

fn lossy(bytes: &[u8]) -> String {
    display_bytes(bytes)
}

pub(crate) fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '%' {
                out.push_str("%25");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn unescape(text: &str) -> Result<Vec<u8>, PathError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let value = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            match value {
                Some(v) => out.push(v),
                None => return Err(PathError::BadEscape(display_bytes(bytes))),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejects(bytes: &[u8]) -> PathError {
        RelPath::new(bytes).expect_err("path must be rejected")
    }

    #[test]
    fn rejects_escaping_and_malformed_paths() {
        assert!(matches!(rejects(b"../x"), PathError::DotDot(_)));
        assert!(matches!(rejects(b"a/../../x"), PathError::DotDot(_)));
        assert!(matches!(rejects(b"a/.."), PathError::DotDot(_)));
        assert!(matches!(rejects(b"/etc/passwd"), PathError::Absolute(_)));
        assert!(matches!(rejects(b"a//b"), PathError::NotNormal(_)));
        assert!(matches!(rejects(b"a/./b"), PathError::NotNormal(_)));
        assert!(matches!(rejects(b"a/"), PathError::NotNormal(_)));
        assert!(matches!(rejects(b"."), PathError::NotNormal(_)));
        assert!(matches!(rejects(b""), PathError::Empty));
        assert!(matches!(rejects(b"a\0b"), PathError::Nul(_)));
    }

    #[test]
    fn enforces_name_and_path_limits() {
        assert!(RelPath::new(vec![b'n'; MAX_NAME]).is_ok());
        assert!(matches!(rejects(&vec![b'n'; MAX_NAME + 1]), PathError::NameTooLong { len: 256, .. }));
        let mut long = Vec::new();
        while long.len() < MAX_PATH + 10 {
            long.extend_from_slice(b"abcdefgh/");
        }
        long.push(b'z');
        assert!(matches!(rejects(&long), PathError::TooLong { .. }));
    }

    #[test]
    fn accepts_git_paths_and_non_utf8_names() {
        assert!(RelPath::new(&b".git/objects/ab/cdef"[..]).is_ok());
        assert!(RelPath::new(&b"..hidden/...x"[..]).is_ok());
        let odd = RelPath::new(&b"dir/caf\xe9 100%"[..]).unwrap();
        assert_eq!(odd.escaped(), "dir/caf%E9 100%25");
        assert_eq!(RelPath::from_escaped(&odd.escaped()).unwrap(), odd);
        let json = serde_json::to_string(&odd).unwrap();
        assert_eq!(serde_json::from_str::<RelPath>(&json).unwrap(), odd);
        assert!(serde_json::from_str::<RelPath>("\"a/%2E%2E/b\"").is_err());
        assert!(serde_json::from_str::<RelPath>("\"%2F/etc\"").is_err());
        assert!(serde_json::from_str::<RelPath>("\"a%zz\"").is_err());
    }

    #[test]
    fn orders_directories_before_their_contents() {
        let mut paths: Vec<RelPath> =
            ["a-b", "a/b", "a", "a/b/c", "b", "a0"].iter().map(|p| RelPath::new(p.as_bytes()).unwrap()).collect();
        paths.sort();
        let shown: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        assert_eq!(shown, ["a", "a/b", "a/b/c", "a-b", "a0", "b"]);
        // Byte order with `/` lowest is the components' order.
        let names = ["a", "a/b", "ab", "a b", "a/b/c", "a.", "a/\u{e9}", "a\u{e9}", "z", "a/b-c", "a/b/c/d", "\u{7f}"];
        for x in names {
            for y in names {
                let (px, py) = (RelPath::new(x.as_bytes()).unwrap(), RelPath::new(y.as_bytes()).unwrap());
                assert_eq!(px.cmp(&py), px.components().cmp(py.components()), "{x} vs {y}");
            }
        }
        let long = RelPath::new("d/".repeat(1000) + "x").unwrap();
        assert!(RelPath::new("d/".repeat(1000) + "w").unwrap() < long);
        assert!(long.is_below(&RelPath::new("d/d").unwrap()) && !long.is_below(&long));
    }

    #[test]
    fn prefix_matches_whole_components() {
        let p = |s: &str| RelPath::new(s.as_bytes()).unwrap();
        assert!(p("a/b").starts_with(&p("a")));
        assert!(p("a").starts_with(&p("a")));
        assert!(!p("ab").starts_with(&p("a")));
        assert_eq!(p("a/b/c").ancestors().collect::<Vec<_>>(), vec![p("a/b"), p("a")]);
        assert_eq!(p("a/b/c").parent(), Some(p("a/b")));
        assert_eq!(p("a/b/c").file_name(), b"c");
    }

    #[test]
    fn display_escapes_terminal_controls() {
        let p = RelPath::new(&b"evil\x1b[2Jname\xff"[..]).unwrap();
        assert_eq!(p.to_string(), "evil\\u{1b}[2Jname\\xff");
    }
}
