//! Request paths: the patterns credential scopes and path deny rules are
//! written in, and the readings of a guest's request path they are matched
//! against.
//!
//! A pattern is a prefix of the path, as text, that starts with `/`: `/gists`
//! matches `/gists`, `/gists/1` and `/gists.json`; end it with `/` to mean
//! whole segments (`/repos/` does not match `/repository`). A segment that is
//! `*` matches any one segment (`/repos/*/*/keys`). Letters match in either
//! case. Patterns are written decoded: no `%`, `?`, `#`, `;`, `\`, `.` or
//! `..` segments, and no empty segment but a final one.
//!
//! The guest chooses the path, and servers read the same bytes differently:
//! one decodes `%2F` to a separator, another keeps it inside the segment;
//! one resolves `..`, another routes on it; servlet containers drop
//! `;params`. So a path is judged in every such reading ([`RequestPath`]):
//! a deny rule refuses it when any reading matches, a credential scope covers
//! it only when every reading does. Percent-escapes are decoded until none is
//! left (`%252e` is `.`), `//` counts as `/`, dot segments never climb above
//! the root, and a path with control characters or escapes nested past any
//! reason is matched by every deny rule and no scope.

use std::fmt;

/// How many rounds of percent-decoding a path may need; more is an attack.
const MAX_DECODE_ROUNDS: usize = 4;

/// One `/`-separated piece of a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Piece {
    /// Lower-case text; the last piece of a pattern is a prefix of its segment.
    Text(Vec<u8>),
    /// `*`: any one non-empty segment.
    Any,
}

/// A path pattern as written in a policy, validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathPattern {
    pieces: Vec<Piece>,
    /// As written, lower-cased, for messages.
    text: String,
}

impl PathPattern {
    pub fn parse(text: &str) -> Result<PathPattern, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("path {text:?} must start with /"));
        };
        if let Some(c) = text.chars().find(|c| matches!(c, '%' | '?' | '#' | ';' | '\\') || c.is_control()) {
            return Err(format!(
                "path {text:?}: {c:?} is not allowed; write the path decoded, without a query, parameters or backslashes"
            ));
        }
        let lower = text.to_ascii_lowercase();
        let segments: Vec<&str> = lower[1..].split('/').collect();
        let mut pieces = Vec::with_capacity(segments.len());
        for (i, segment) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            match *segment {
                "" if !last || rest.is_empty() && i > 0 => {
                    return Err(format!("path {text:?} has an empty segment (//)"));
                }
                "." | ".." => return Err(format!("path {text:?}: . and .. segments are not allowed")),
                "*" => pieces.push(Piece::Any),
                s if s.contains('*') => {
                    return Err(format!("path {text:?}: * must be a whole segment, as in /repos/*/*/keys"));
                }
                s => pieces.push(Piece::Text(s.as_bytes().to_vec())),
            }
        }
        Ok(PathPattern { pieces, text: lower })
    }

    /// Whether one reading of a path begins with this pattern.
    fn matches(&self, segments: &[Vec<u8>]) -> bool {
        if segments.len() < self.pieces.len() {
            return false;
        }
        let last = self.pieces.len() - 1;
        self.pieces.iter().zip(segments).enumerate().all(|(i, (piece, segment))| match piece {
            Piece::Any => !segment.is_empty(),
            Piece::Text(text) if i == last => segment.starts_with(text),
            Piece::Text(text) => segment == text,
        })
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A request path in every reading a server might give it.
#[derive(Debug, Clone)]
pub struct RequestPath {
    /// Each reading as lower-case segments; a trailing `/` is a final empty one.
    readings: Vec<Vec<Vec<u8>>>,
    /// Control characters, or escapes nested too deep: judged as hostile.
    suspicious: bool,
}

impl RequestPath {
    /// The path of a request target (`uri.path()`: no query).
    pub fn parse(raw: &str) -> RequestPath {
        let mut readings: Vec<Vec<Vec<u8>>> = Vec::with_capacity(8);
        let mut suspicious = false;
        for slashes in [Slashes::Separate, Slashes::Literal] {
            let Some(decoded) = decode(raw.as_bytes(), slashes) else {
                suspicious = true;
                continue;
            };
            if decoded.iter().any(|b| b.is_ascii_control()) {
                suspicious = true;
            }
            for params in [false, true] {
                for dots in [false, true] {
                    let reading = segments(&decoded, slashes, params, dots);
                    if !readings.contains(&reading) {
                        readings.push(reading);
                    }
                }
            }
        }
        RequestPath { readings, suspicious }
    }

    /// Whether any reading begins with one of `patterns` (deny rules); a
    /// suspicious path with any of them.
    pub fn any_matches<'a>(&self, mut patterns: impl Iterator<Item = &'a PathPattern>) -> bool {
        patterns.any(|p| self.suspicious || self.readings.iter().any(|r| p.matches(r)))
    }

    /// Whether every reading begins with one of `patterns` (scopes).
    pub fn all_match(&self, patterns: &[PathPattern]) -> bool {
        !self.suspicious && self.readings.iter().all(|r| patterns.iter().any(|p| p.matches(r)))
    }
}

/// What `%2F`, `%5C` and `\` are in a reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slashes {
    /// Separators, as a server that decodes before routing reads them.
    Separate,
    /// Part of their segment, as a server that routes before decoding does.
    Literal,
}

/// Percent-decodes until nothing is left to decode; in a `Literal` reading
/// escapes of `/` and `\` stay as they are. `None` when the escapes nest
/// deeper than any client writes them.
fn decode(raw: &[u8], slashes: Slashes) -> Option<Vec<u8>> {
    let mut current = raw.to_vec();
    for _ in 0..MAX_DECODE_ROUNDS {
        let mut next = Vec::with_capacity(current.len());
        let mut changed = false;
        let mut i = 0;
        while i < current.len() {
            let escaped = match (current[i], current.get(i + 1), current.get(i + 2)) {
                (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| (h << 4) | l),
                _ => None,
            };
            match escaped {
                Some(b'/' | b'\\') if slashes == Slashes::Literal => {
                    next.extend_from_slice(&current[i..i + 3]);
                    i += 3;
                }
                Some(byte) => {
                    next.push(byte);
                    changed = true;
                    i += 3;
                }
                None => {
                    next.push(current[i]);
                    i += 1;
                }
            }
        }
        if !changed {
            return Some(next);
        }
        current = next;
    }
    None
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// One reading of a decoded path: split on `/` (and `\` when `Separate`),
/// empty segments dropped but a final one, `;params` cut when `params`,
/// dot segments resolved when `dots`.
fn segments(decoded: &[u8], slashes: Slashes, params: bool, dots: bool) -> Vec<Vec<u8>> {
    let is_separator = |b: &u8| *b == b'/' || (*b == b'\\' && slashes == Slashes::Separate);
    let trailing = decoded.last().is_some_and(is_separator);
    let mut out: Vec<Vec<u8>> = Vec::new();
    for raw in decoded.split(is_separator) {
        let segment = match raw.iter().position(|b| *b == b';') {
            Some(at) if params => &raw[..at],
            _ => raw,
        };
        match segment {
            b"" => {}
            b"." if dots => {}
            b".." if dots => {
                out.pop();
            }
            _ => out.push(segment.to_ascii_lowercase()),
        }
    }
    if trailing || out.is_empty() {
        out.push(Vec::new());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> PathPattern {
        PathPattern::parse(text).unwrap()
    }

    fn denied(path: &str, rule: &str) -> bool {
        RequestPath::parse(path).any_matches([pattern(rule)].iter())
    }

    fn covered(path: &str, scope: &[&str]) -> bool {
        let patterns: Vec<PathPattern> = scope.iter().map(|p| pattern(p)).collect();
        RequestPath::parse(path).all_match(&patterns)
    }

    #[test]
    fn patterns_are_text_prefixes_with_whole_segment_wildcards() {
        assert!(denied("/gists", "/gists"));
        assert!(denied("/gists/1", "/gists"));
        assert!(denied("/gists.json", "/gists"));
        assert!(!denied("/gist", "/gists"));
        assert!(!denied("/users/x/gists", "/gists"));
        assert!(denied("/repos/o/r/keys", "/repos/*/*/keys"));
        assert!(denied("/repos/o/r/keys/7", "/repos/*/*/keys"));
        assert!(!denied("/repos/o/keys", "/repos/*/*/keys"));
        assert!(!denied("/repos/o/r/hooks", "/repos/*/*/keys"));
        assert!(covered("/repos/o/r", &["/repos/"]));
        assert!(!covered("/repos", &["/repos/"]));
        assert!(!covered("/repository", &["/repos/"]));
        assert!(covered("/anything/at/all", &["/"]));
        assert!(covered("/user", &["/repos/", "/user"]));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["gists", "/a//b", "/a/%2e", "/a?x", "/a#x", "/a;x", "/a\\b", "/a/../b", "/./a", "/a*", "//", "/a\n"]
        {
            assert!(PathPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(pattern("/User/Keys").to_string(), "/user/keys");
        assert!(PathPattern::parse("/").is_ok());
        assert!(PathPattern::parse("/repos/").is_ok());
    }

    /// Each way a guest might spell /user/keys so that a naive prefix check
    /// misses it.
    #[test]
    fn evasions_of_a_deny_rule_are_still_denied() {
        for path in [
            "/user/keys",
            "/USER/Keys",
            "/user//keys",
            "//user/keys",
            "/user/./keys",
            "/x/../user/keys",
            "/../../user/keys",
            "/user/%6beys",
            "/user/%6Beys",
            "/user%2fkeys",
            "/user%2Fkeys",
            "/user\\keys",
            "/user%5ckeys",
            "/user/%252e/keys",
            "/user%252fkeys",
            "/x/%2e%2e/user/keys",
            "/x/%2E%2E/user/keys",
            "/x/..;/user/keys",
            "/user;x=1/keys",
            "/user/keys;.css",
            "/user/keys/",
        ] {
            assert!(denied(path, "/user/keys"), "{path} got past the deny rule");
        }
        assert!(denied("/user/keys%00", "/nothing-like-it"), "control characters are hostile");
        assert!(denied("/%25252525252e", "/nothing-like-it"), "escapes nested past reason are hostile");
        assert!(!denied("/user/emails", "/user/keys"));
    }

    #[test]
    fn a_scope_covers_only_paths_every_reading_keeps_inside_it() {
        assert!(covered("/repos/o/r/pulls", &["/repos/"]));
        assert!(covered("/repos/o/r/contents/a%20b.txt", &["/repos/"]));
        for path in [
            "/repos/../user/keys",
            "/repos/%2e%2e/user/keys",
            "/repos/%252e%252e/user/keys",
            "/repos/..%2fuser",
            "/repos/..;/user",
            "/repos\\..\\user",
            "/repos;x/o/r",
            "/REPOS/../user",
            "/repos/o/r%00",
        ] {
            assert!(!covered(path, &["/repos/"]), "{path} was taken to be inside /repos/");
        }
    }
}
