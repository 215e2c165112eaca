//! Which paths an operation covers: all, none, the paths and directory
//! trees the user named, or exactly the paths a review chose.

use std::collections::HashSet;

use super::path::RelPath;

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
        Selection { prefixes: Some(paths.into_iter().collect()), exact: HashSet::new(), excluded: HashSet::new() }
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
            Some(prefixes) => self.exact.contains(path) || prefixes.iter().any(|prefix| path.starts_with(prefix)),
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
