//! Which paths an operation covers: all, none, or the paths and directory
//! trees the user named.

use super::path::RelPath;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection(Option<Vec<RelPath>>);

impl Selection {
    pub fn all() -> Selection {
        Selection(None)
    }

    pub fn none() -> Selection {
        Selection(Some(Vec::new()))
    }

    /// Each path selects itself and everything below it.
    pub fn paths(paths: impl IntoIterator<Item = RelPath>) -> Selection {
        Selection(Some(paths.into_iter().collect()))
    }

    pub fn matches(&self, path: &RelPath) -> bool {
        match &self.0 {
            None => true,
            Some(prefixes) => prefixes.iter().any(|prefix| path.starts_with(prefix)),
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
}
