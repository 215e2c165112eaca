//! Rules over the whole set, beyond what each entry's types guarantee: every
//! path once, and nothing below a path the set makes a file, symlink or
//! deletion. The host checks them when staging and again before applying.

use std::collections::HashMap;

use thiserror::Error;

use super::model::{Base, Entry, Kind};
use super::path::RelPath;

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
    entries.sort_by(|a, b| a.path.cmp(&b.path));
}

/// Checks the set rules; `entries` may be in any order.
pub fn check_set<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Result<(), SetError> {
    let mut kinds: HashMap<&RelPath, &Kind> = HashMap::new();
    let mut all = Vec::new();
    for entry in entries {
        if kinds.insert(&entry.path, &entry.kind).is_some() {
            return Err(SetError::Duplicate(entry.path.clone()));
        }
        if matches!(entry.kind, Kind::Mode { .. }) && !matches!(entry.base, Base::File { .. }) {
            return Err(SetError::ModeWithoutFile(entry.path.clone()));
        }
        all.push(entry);
    }
    for entry in all {
        for ancestor in entry.path.ancestors() {
            if let Some(kind) = kinds.get(&ancestor)
                && !kind.holds_children()
            {
                return Err(SetError::BelowNonDirectory { path: entry.path.clone(), ancestor, kind: kind.word() });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::model::{Mode, Sha256};

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
    }
}
