//! Rules over the whole set, beyond what each entry's types guarantee: every
//! path once, and nothing below a path the set makes a file, symlink or
//! deletion. The host checks them when staging and again before applying.
//! And one rule over paths: compiled Python is never taken from the guest.

use thiserror::Error;

use crate::protocol::change_set::entry::{Base, Entry, Kind};
use crate::protocol::change_set::path::RelPath;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SetError {
    #[error("{0} appears twice in the change set")]
    Duplicate(RelPath),
    #[error("{path} lies below {ancestor}, which the change set makes a {kind}, not a directory")]
    BelowNonDirectory { path: RelPath, ancestor: RelPath, kind: &'static str },
    #[error("{0} changes the mode of a file, but the guest saw no regular file there")]
    ModeWithoutFile(RelPath),
}

/// Puts entries in tree order (a directory before its contents).
pub fn sort(entries: &mut [Entry]) {
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
}

/// Checks the set rules; `entries` may be in any order.
/// Whether a path is compiled Python bytecode or a bytecode cache: a
/// `*.pyc` or `*.pyo` (any case; importable even with no source beside
/// it), or `__pycache__` and anything below it. Python prefers such a file
/// to the source it was built from when its header matches the source's
/// size and time, which the guest can forge.
pub fn compiled_python(path: &RelPath) -> bool {
    let bytes = path.as_bytes();
    let name = path.file_name();
    let bytecode = name.len() > 4 && {
        let ext = name[name.len() - 4..].to_ascii_lowercase();
        ext == b".pyc" || ext == b".pyo"
    };
    bytecode || bytes.split(|&b| b == b'/').any(|part| part == b"__pycache__")
}

#[cfg(test)]
pub fn check_set<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Result<(), SetError> {
    let mut sorted: Vec<&Entry> = entries.into_iter().collect();
    sorted.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    check_sorted_by(&sorted, |e| e)
}

/// Checks the set rules on entries in tree order.
pub fn check_sorted(entries: &[Entry]) -> Result<(), SetError> {
    check_sorted_by(entries, |e| e)
}

/// Checks the set rules on items in tree order of their entries, in one
/// pass: linear in the paths' bytes, whatever their depth. In tree order a
/// path's ancestors in the set come before it and everything below a path
/// comes right after it, so the set entries that are ancestors of the
/// current one form a stack, and only its top can be the nearest one.
pub fn check_sorted_by<T>(items: &[T], entry: impl Fn(&T) -> &Entry) -> Result<(), SetError> {
    let mut ancestors: Vec<&Entry> = Vec::new();
    let mut previous: Option<&Entry> = None;
    for item in items {
        let e = entry(item);
        if let Some(prev) = previous {
            match prev.path.cmp(&e.path) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Err(SetError::Duplicate(e.path.clone())),
                std::cmp::Ordering::Greater => unreachable_order(),
            }
        }
        previous = Some(e);
        if matches!(e.kind, Kind::Mode { .. }) && !matches!(e.base, Base::File { .. }) {
            return Err(SetError::ModeWithoutFile(e.path.clone()));
        }
        while ancestors.last().is_some_and(|a| !e.path.is_below(&a.path)) {
            ancestors.pop();
        }
        if let Some(a) = ancestors.last()
            && !a.kind.holds_children()
        {
            return Err(SetError::BelowNonDirectory {
                path: e.path.clone(),
                ancestor: a.path.clone(),
                kind: a.kind.word(),
            });
        }
        ancestors.push(e);
    }
    Ok(())
}

/// Callers sort first; an unsorted slice is a bug here, not bad input.
fn unreachable_order() {
    debug_assert!(false, "entries must be in tree order");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::change_set::entry::Mode;
    use crate::util::digest::Sha256;

    fn entry(path: &str, kind: Kind) -> Entry {
        Entry { path: RelPath::new(path.as_bytes()).unwrap(), kind, base: Base::Absent }
    }

    fn file() -> Kind {
        Kind::File { mode: Mode::from_raw(0o644), size: 0, sha256: Sha256::of(b"") }
    }

    #[test]
    fn accepts_a_consistent_tree() {
        let dir = Kind::Dir { mode: Mode::from_raw(0o755) };
        let set = [entry(".git", dir.clone()), entry(".git/HEAD", file()), entry("a", dir), entry("a/b", file())];
        assert_eq!(check_set(&set), Ok(()));
    }

    #[test]
    fn rejects_duplicates_and_children_of_non_directories() {
        assert!(matches!(check_set(&[entry("a", file()), entry("a", Kind::Delete)]), Err(SetError::Duplicate(_))));
        assert!(matches!(
            check_set(&[entry("a/b/c", file()), entry("a", Kind::Delete)]),
            Err(SetError::BelowNonDirectory { kind: "delete", .. })
        ));
        assert!(matches!(
            check_set(&[entry("a", file()), entry("a/b", file())]),
            Err(SetError::BelowNonDirectory { kind: "file", .. })
        ));
        let mode_only = entry("m", Kind::Mode { mode: Mode::from_raw(0o755) });
        assert!(matches!(check_set(&[mode_only]), Err(SetError::ModeWithoutFile(_))));
        // A sibling between a file and what is forged below it does not hide it.
        assert!(matches!(
            check_set(&[entry("a", file()), entry("a-b", file()), entry("a/b/c", file())]),
            Err(SetError::BelowNonDirectory { kind: "file", .. })
        ));
    }

    #[test]
    fn a_deep_set_is_checked_in_linear_time() {
        // 1,500 levels, a file at each: an ancestor walk per entry would do
        // over a million hashed lookups of kilobyte paths.
        let dir = Kind::Dir { mode: Mode::from_raw(0o755) };
        let mut set = Vec::new();
        let mut path = String::from("d");
        for _ in 0..1500 {
            set.push(entry(&path, dir.clone()));
            set.push(entry(&format!("{path}/f"), file()));
            path.push_str("/d");
            if path.len() > 4000 {
                break;
            }
        }
        sort(&mut set);
        assert_eq!(check_sorted(&set), Ok(()));
        let last = set.len() - 1;
        set[last - 1].kind = file();
        let bad = set[last - 1].path.clone();
        set.push(entry(&format!("{bad}/below"), file()));
        sort(&mut set);
        assert!(matches!(check_sorted(&set), Err(SetError::BelowNonDirectory { .. })));
    }
}
