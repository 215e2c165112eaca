//! Which paths an operation covers: all, none, the paths and directory
//! trees the user named, or exactly the paths a review chose.

use std::collections::HashSet;

use crate::protocol::change_set::path::RelPath;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// `None` selects everything.
    prefixes: Option<Vec<RelPath>>,
    /// Paths that select only themselves (a reviewed directory entry must
    /// not pull in children the reviewer declined).
    exact: HashSet<RelPath>,
    /// Paths never selected, whatever else matches them (files that run
    /// code, held back from an "apply all").
    excluded: HashSet<RelPath>,
}

impl Selection {
    pub fn all() -> Selection {
        Selection { prefixes: None, exact: HashSet::new(), excluded: HashSet::new() }
    }

    pub fn none() -> Selection {
        Selection { prefixes: Some(Vec::new()), exact: HashSet::new(), excluded: HashSet::new() }
    }

    /// Each path selects itself and everything below it.
    pub fn paths(paths: impl IntoIterator<Item = RelPath>) -> Selection {
        // Sorted, with paths below another left out: then the only prefix
        // that can hold a path is the last one not after it in tree order,
        // so a match is one binary search however many paths were chosen.
        let mut sorted: Vec<RelPath> = paths.into_iter().collect();
        sorted.sort_unstable();
        let mut prefixes: Vec<RelPath> = Vec::with_capacity(sorted.len());
        for path in sorted {
            if !prefixes.last().is_some_and(|last| path.starts_with(last)) {
                prefixes.push(path);
            }
        }
        Selection { prefixes: Some(prefixes), exact: HashSet::new(), excluded: HashSet::new() }
    }

    /// Each path selects itself only.
    pub fn exact(paths: impl IntoIterator<Item = RelPath>) -> Selection {
        Selection { prefixes: Some(Vec::new()), exact: paths.into_iter().collect(), excluded: HashSet::new() }
    }

    /// The same selection without these paths (exactly these: what lies
    /// below one of them is judged on its own).
    pub fn except(mut self, paths: impl IntoIterator<Item = RelPath>) -> Selection {
        self.excluded.extend(paths);
        self
    }

    pub fn matches(&self, path: &RelPath) -> bool {
        if self.excluded.contains(path) {
            return false;
        }
        match &self.prefixes {
            None => true,
            Some(prefixes) => {
                self.exact.contains(path) || {
                    let after = prefixes.partition_point(|prefix| prefix <= path);
                    after > 0 && path.starts_with(&prefixes[after - 1])
                }
            }
        }
    }
}

impl Default for Selection {
    fn default() -> Selection {
        Selection::all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_paths_and_their_trees() {
        let p = |s: &str| RelPath::new(s.as_bytes()).unwrap();
        let sel = Selection::paths([p("src"), p("README")]);
        assert!(sel.matches(&p("src")));
        assert!(sel.matches(&p("src/a/b.rs")));
        assert!(sel.matches(&p("README")));
        assert!(!sel.matches(&p("README.md")));
        assert!(!sel.matches(&p("srcx")));
        assert!(Selection::all().matches(&p("x")));
        assert!(!Selection::none().matches(&p("x")));
        // Nested and interleaved choices; each match is one binary search.
        let sel = Selection::paths([p("a/b/x"), p("a"), p("a-b"), p("c/d"), p("a/b")]);
        assert!(sel.matches(&p("a/c")) && sel.matches(&p("a/b/y")) && sel.matches(&p("a-b/z")));
        assert!(sel.matches(&p("c/d/e")) && !sel.matches(&p("c")) && !sel.matches(&p("c/de")));
        let many = Selection::paths((0..10_000).map(|i| p(&format!("dir{i}"))));
        assert!(many.matches(&p("dir9999/f")) && !many.matches(&p("dir10000")));
    }

    #[test]
    fn exact_paths_select_only_themselves() {
        let p = |s: &str| RelPath::new(s.as_bytes()).unwrap();
        let sel = Selection::exact([p("src"), p("a/b")]);
        assert!(sel.matches(&p("src")));
        assert!(!sel.matches(&p("src/main.rs")));
        assert!(sel.matches(&p("a/b")));
        assert!(!sel.matches(&p("a")));
    }

    #[test]
    fn excepted_paths_are_never_selected() {
        let p = |s: &str| RelPath::new(s.as_bytes()).unwrap();
        let sel = Selection::all().except([p(".git/hooks/pre-commit")]);
        assert!(!sel.matches(&p(".git/hooks/pre-commit")));
        assert!(sel.matches(&p(".git/hooks")) && sel.matches(&p("src/main.rs")));
        let sel = Selection::paths([p(".git")]).except([p(".git/config")]);
        assert!(!sel.matches(&p(".git/config")) && sel.matches(&p(".git/HEAD")));
    }
}
