//! What a guest did to a git repository, read from the staged files of its
//! git directory: refs that moved (loose refs, `packed-refs`, `HEAD`), the
//! commits between old and new (from staged loose objects, zlib-inflated,
//! or else from the new reflog lines), so review can say "2 new commits on
//! main: Fix the parser" instead of listing object files.
//!
//! Everything here is guest-written data shown to a person: sizes are
//! capped, and text is escaped when displayed (`display_bytes`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;

use flate2::read::ZlibDecoder;

use crate::changes::Store;
use crate::protocol::change_set::entry::{Entry, Kind};
use crate::protocol::change_set::path::RelPath;
use crate::util::text::display_bytes;

use crate::changes::Host;

/// Commits followed from a moved ref before giving up.
const MAX_WALK: usize = 200;
/// Moved refs whose commits are looked up; a guest that makes thousands of
/// tags gets them listed without commits rather than a slow review.
const MAX_WALKED_REFS: usize = 50;
/// Bytes of a commit object inflated (headers and the start of the message).
const MAX_COMMIT_BYTES: u64 = 64 << 10;
/// Ref, HEAD and reflog files larger than this are not parsed.
const MAX_REF_FILE: u64 = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub id: String,
    pub subject: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitEvent {
    /// A ref moved, or was created (`old` is `None`).
    Moved {
        reference: String,
        old: Option<String>,
        new: String,
        /// New commits reachable from `new`, newest first (at most `MAX_WALK`).
        commits: Vec<Commit>,
        /// Whether `old` is among the ancestors found (a fast-forward).
        fast_forward: bool,
        /// The latest new reflog message for this ref, if any.
        reflog: Option<String>,
    },
    Deleted {
        reference: String,
        old: Option<String>,
    },
    /// `HEAD` changed what it points at (a checkout).
    Head {
        from: String,
        to: String,
    },
}

/// What happened in one git directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitActivity {
    pub events: Vec<GitEvent>,
    /// Object files (loose objects, packs) added or changed.
    pub objects: usize,
    /// Other internal files (index, logs, refs, ...).
    pub other: usize,
}

impl GitActivity {
    /// Reads the activity in `git_dir` from its staged entries.
    pub fn read(git_dir: &RelPath, entries: &[&Entry], store: &Store, host: &Host) -> GitActivity {
        let prefix_len = git_dir.as_bytes().len() + 1;
        let below = |e: &&Entry| e.path.as_bytes().get(prefix_len..).map(<[u8]>::to_vec);
        let mut activity = GitActivity::default();
        let mut objects: HashMap<String, &Entry> = HashMap::new();
        let mut refs: Vec<(&Entry, String)> = Vec::new();
        let mut packed: Option<&Entry> = None;
        let mut head: Option<&Entry> = None;
        let mut logs: HashMap<String, &Entry> = HashMap::new();
        for entry in entries {
            let Some(rest) = below(entry) else { continue };
            let rest = String::from_utf8_lossy(&rest).into_owned();
            if rest.starts_with("objects/") {
                if !entry.kind.holds_children() {
                    activity.objects += 1;
                }
                if let Some(id) = loose_object_id(&rest) {
                    objects.insert(id, entry);
                }
                continue;
            }
            if entry.kind.holds_children() {
                continue;
            }
            activity.other += 1;
            if rest.starts_with("refs/") {
                refs.push((entry, rest));
            } else if rest == "packed-refs" {
                packed = Some(entry);
            } else if rest == "HEAD" {
                head = Some(entry);
            } else if let Some(name) = rest.strip_prefix("logs/") {
                logs.insert(name.to_string(), entry);
            }
        }
        let reader = Reader { git_dir, store, host, objects };

        let host_packed = reader.host_packed_refs();
        let mut moves: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
        for (entry, name) in refs {
            let old = reader.host_ref(&name).or_else(|| host_packed.get(&name).cloned());
            let new = match entry.kind {
                Kind::Delete => None,
                _ => reader.staged_text(entry).and_then(|t| object_id(&t)),
            };
            moves.insert(name, (old, new));
        }
        if let Some(entry) = packed {
            let new_packed = match entry.kind {
                Kind::Delete => BTreeMap::new(),
                _ => reader.staged_text(entry).map(|t| parse_packed_refs(&t)).unwrap_or_default(),
            };
            for name in host_packed.keys().chain(new_packed.keys()) {
                if moves.contains_key(name) {
                    // A loose ref wins over packed-refs; handled above.
                    continue;
                }
                let (old, new) = (host_packed.get(name).cloned(), new_packed.get(name).cloned());
                if old != new {
                    moves.insert(name.clone(), (old, new));
                }
            }
        }
        // Refs that were packed by the guest (`git gc`) moved from a loose
        // file to packed-refs without changing: no event.
        moves.retain(|name, (old, new)| {
            let now = new.clone().or_else(|| reader.packed_value_after(name, packed));
            now.as_ref() != old.as_ref()
        });

        if let Some(entry) = head
            && let Some(event) = reader.head_event(entry)
        {
            activity.events.push(event);
        }
        for (n, (reference, (old, new))) in moves.into_iter().enumerate() {
            let reflog = logs.get(&reference).and_then(|e| reader.new_reflog_message(e));
            let Some(new) = new.or_else(|| reader.packed_value_after(&reference, packed)) else {
                activity.events.push(GitEvent::Deleted { reference, old });
                continue;
            };
            let (commits, fast_forward) =
                if n < MAX_WALKED_REFS { reader.walk(&new, old.as_deref()) } else { (Vec::new(), false) };
            activity.events.push(GitEvent::Moved { reference, old, new, commits, fast_forward, reflog });
        }
        activity
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.objects == 0 && self.other == 0
    }
}

/// A ref name for people: `main`, `tag v1.0`, `origin/main`.
pub fn short_ref(name: &str) -> String {
    if let Some(branch) = name.strip_prefix("refs/heads/") {
        branch.to_string()
    } else if let Some(tag) = name.strip_prefix("refs/tags/") {
        format!("tag {tag}")
    } else if let Some(remote) = name.strip_prefix("refs/remotes/") {
        remote.to_string()
    } else {
        name.to_string()
    }
}

/// The first seven characters, as git abbreviates ids (char-safe: a
/// detached HEAD's text is whatever the guest wrote).
pub fn short_id(id: &str) -> &str {
    id.char_indices().nth(7).map_or(id, |(end, _)| &id[..end])
}

struct Reader<'a> {
    git_dir: &'a RelPath,
    store: &'a Store,
    host: &'a Host,
    /// Staged loose objects by id.
    objects: HashMap<String, &'a Entry>,
}

impl Reader<'_> {
    fn staged_bytes(&self, entry: &Entry, limit: u64) -> Option<Vec<u8>> {
        let Kind::File { sha256, .. } = &entry.kind else { return None };
        let mut bytes = Vec::new();
        self.store.open_blob(sha256).ok()?.take(limit).read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    fn staged_text(&self, entry: &Entry) -> Option<String> {
        self.staged_bytes(entry, MAX_REF_FILE).map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    fn host_text(&self, rest: &str) -> Option<String> {
        let path = RelPath::new([self.git_dir.as_bytes(), b"/", rest.as_bytes()].concat()).ok()?;
        let bytes = self.host.read(&path, MAX_REF_FILE).ok()??;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn host_ref(&self, name: &str) -> Option<String> {
        self.host_text(name).and_then(|t| object_id(&t))
    }

    fn host_packed_refs(&self) -> BTreeMap<String, String> {
        self.host_text("packed-refs").map(|t| parse_packed_refs(&t)).unwrap_or_default()
    }

    /// A ref's value in packed-refs after the change (staged if it changed).
    fn packed_value_after(&self, name: &str, packed: Option<&Entry>) -> Option<String> {
        let refs = match packed {
            Some(entry) => self.staged_text(entry).map(|t| parse_packed_refs(&t)).unwrap_or_default(),
            None => self.host_packed_refs(),
        };
        refs.get(name).cloned()
    }

    fn head_event(&self, entry: &Entry) -> Option<GitEvent> {
        let new = self.staged_text(entry)?;
        let old = self.host_text("HEAD").unwrap_or_default();
        let describe = |text: &str| match text.trim().strip_prefix("ref: ") {
            Some(target) => short_ref(target.trim()),
            None => format!("detached at {}", short_id(text.trim())),
        };
        // A detached HEAD that moves is described by its commits elsewhere;
        // a symbolic HEAD that changes target is a checkout.
        (old.trim() != new.trim() && (old.starts_with("ref: ") || new.starts_with("ref: ")))
            .then(|| GitEvent::Head { from: describe(&old), to: describe(&new) })
    }

    /// The last reflog line the guest appended, as its message.
    fn new_reflog_message(&self, entry: &Entry) -> Option<String> {
        let new = self.staged_text(entry)?;
        let rest = entry.path.as_bytes().get(self.git_dir.as_bytes().len() + 1..)?;
        let old = self.host_text(&String::from_utf8_lossy(rest)).unwrap_or_default();
        let appended = new.strip_prefix(old.as_str()).unwrap_or(&new);
        let line = appended.lines().rev().find(|l| !l.trim().is_empty())?;
        line.split_once('\t').map(|(_, message)| message.trim().to_string())
    }

    /// New commits from `new` back to `old` (exclusive), newest first, and
    /// whether `old` was reached.
    fn walk(&self, new: &str, old: Option<&str>) -> (Vec<Commit>, bool) {
        let mut commits = Vec::new();
        let mut reached = false;
        let mut seen = HashSet::new();
        let mut queue = std::collections::VecDeque::from([new.to_string()]);
        while let Some(id) = queue.pop_front() {
            if Some(id.as_str()) == old {
                reached = true;
                continue;
            }
            if !seen.insert(id.clone()) || commits.len() >= MAX_WALK {
                continue;
            }
            let Some(parsed) = self.commit(&id) else { continue };
            commits.push(Commit { id, subject: parsed.subject });
            queue.extend(parsed.parents);
        }
        (commits, reached)
    }

    fn commit(&self, id: &str) -> Option<ParsedCommit> {
        let entry = self.objects.get(id)?;
        let compressed = self.staged_bytes(entry, MAX_COMMIT_BYTES * 4)?;
        let mut raw = Vec::new();
        // Truncated objects are fine: we only need the headers and subject.
        let _ = ZlibDecoder::new(&compressed[..]).take(MAX_COMMIT_BYTES).read_to_end(&mut raw);
        parse_commit(&raw)
    }
}

struct ParsedCommit {
    parents: Vec<String>,
    subject: String,
}

/// Parses a loose object's inflated bytes if it is a commit.
fn parse_commit(raw: &[u8]) -> Option<ParsedCommit> {
    let nul = raw.iter().position(|&b| b == 0)?;
    if !raw[..nul].starts_with(b"commit ") {
        return None;
    }
    let body = &raw[nul + 1..];
    let (headers, message) = match body.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&body[..i], &body[i + 2..]),
        None => (body, &[][..]),
    };
    let parents = headers
        .split(|&b| b == b'\n')
        .filter_map(|line| line.strip_prefix(b"parent "))
        .filter_map(|id| object_id(&String::from_utf8_lossy(id)))
        .collect();
    let subject = message.split(|&b| b == b'\n').find(|l| !l.is_empty()).unwrap_or_default();
    Some(ParsedCommit { parents, subject: display_bytes(subject) })
}

/// The object id a loose object's path names (`objects/ab/cdef…`).
fn loose_object_id(rest: &str) -> Option<String> {
    let mut parts = rest.strip_prefix("objects/")?.split('/');
    let (dir, file) = (parts.next()?, parts.next()?);
    if parts.next().is_some() || dir.len() != 2 {
        return None;
    }
    object_id(&format!("{dir}{file}"))
}

/// A SHA-1 or SHA-256 object id in lowercase hex, if `text` is one.
fn object_id(text: &str) -> Option<String> {
    let t = text.trim();
    ((t.len() == 40 || t.len() == 64) && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| t.to_string())
}

fn parse_packed_refs(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(id, name)| object_id(id).map(|id| (name.trim().to_string(), id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_commit_object() {
        let raw = b"commit 120\0tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\
            parent 1111111111111111111111111111111111111111\n\
            author A <a@x> 1700000000 +0000\ncommitter A <a@x> 1700000000 +0000\n\n\
            Fix the \x1b[2Jparser\n\nLonger text.\n";
        let c = parse_commit(raw).unwrap();
        assert_eq!(c.parents, ["1111111111111111111111111111111111111111"]);
        assert_eq!(c.subject, "Fix the \\u{1b}[2Jparser", "escape sequences are defused");
        assert!(parse_commit(b"blob 3\0abc").is_none());
    }

    #[test]
    fn reads_ids_refs_and_names() {
        assert_eq!(
            loose_object_id("objects/ab/cdef0123456789abcdef0123456789abcdef01").as_deref(),
            Some("abcdef0123456789abcdef0123456789abcdef01")
        );
        assert_eq!(loose_object_id("objects/pack/pack-1.pack"), None);
        let packed = "# pack-refs with: peeled\n\
            1111111111111111111111111111111111111111 refs/heads/main\n\
            2222222222222222222222222222222222222222 refs/tags/v1\n^3333333333333333333333333333333333333333\n";
        let refs = parse_packed_refs(packed);
        assert_eq!(refs.len(), 2);
        assert_eq!(short_ref("refs/heads/main"), "main");
        assert_eq!(short_ref("refs/tags/v1"), "tag v1");
        assert_eq!(short_ref("refs/remotes/origin/main"), "origin/main");
        assert_eq!(object_id("ref: refs/heads/main"), None);
        assert_eq!(short_id("0123456789abcdef"), "0123456");
        assert_eq!(short_id("ééééééééé"), "ééééééé", "never splits a character");
        assert_eq!(short_id("ab"), "ab");
    }
}
