//! What kind of path a change touches, for review: inside a git directory,
//! ignored by git (collapsed in the summary), or execution-sensitive
//! (highlighted, always listed and asked about on its own).
//!
//! # Execution-sensitive paths
//!
//! Flagged are files that make code run *without the user choosing to run
//! this project's code*: on a git command, on opening the folder in an
//! editor or shell, on a push (CI), or by pointing a tool at another program:
//!
//! - git: hooks (`.git/hooks/*` except `*.sample`, also in submodules and
//!   under the host's `core.hooksPath`, and `.husky/`), `.git/config`
//!   (fsmonitor, hooksPath, aliases, filters, pager and ssh commands), a
//!   `.git` *file* (redirects git to another repository), and
//!   `.pre-commit-config.yaml` (what pre-commit runs on every commit);
//! - direnv and mise: `.envrc`, `mise.toml`, `.mise.toml`;
//! - editors: `.vscode/` (folder-open tasks, interpreter paths),
//!   `.idea/`, `.devcontainer/`, `.zed/`, `.helix/` (language-server
//!   commands), vim/neovim `exrc` files, Emacs `.dir-locals.el`;
//! - CI: `.github/workflows/` and `.github/actions/`, `.gitlab-ci.yml`,
//!   `.circleci/`, `.travis.yml`, `Jenkinsfile`, `.buildkite/`,
//!   `azure-pipelines.yml`, `.drone.yml`, `bitbucket-pipelines.yml`,
//!   Woodpecker, Forgejo and Gitea workflows;
//! - shell startup files (`.bashrc`, `.profile`, `.zshrc`, ...);
//! - coding agents: `.claude/settings{,.local}.json` and `.claude/hooks/`
//!   (hooks, status line and key helper commands), `.mcp.json`,
//!   `.codex/config.toml` (notify, MCP servers), `.gemini/settings.json`;
//! - tool redirection: `.cargo/config{,.toml}` (runner, rustc wrapper,
//!   linker), `rust-toolchain{,.toml}` (a toolchain `path`), `.npmrc`
//!   (script shell, node options), `.yarnrc{,.yml}` (`yarnPath` runs a file
//!   on every `yarn`), `.pnpmfile.cjs`.
//!
//! Not flagged: Makefiles, `build.rs`, `package.json` scripts, `setup.py`,
//! test fixtures and the like. They run when the user builds or tests, they
//! are ordinary project source shown in the diff, and they change in almost
//! every session: flagging them would drown the signal.
//!
//! Separately, a file that *became executable* and a symlink pointing
//! outside the workspace are noted on their line, but stay in their group.
//!
//! # Ignored paths
//!
//! A path is ignored when the host's `.gitignore` files (any directory from
//! the root down), `.git/info/exclude` or the user's global excludes file
//! match it or one of its directories, as for an untracked file in
//! `git status --ignored`. Only the host's rules count: a `.gitignore` the
//! guest wrote cannot hide its own changes. Tracked files that match a
//! rule are still treated as ignored (the git index is not read).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::changes::model::{Base, Entry, Kind, Mode};
use crate::changes::path::RelPath;

use super::host::Host;

/// Why a path runs code by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Danger {
    GitHook,
    GitConfig,
    GitLink,
    PreCommit,
    Direnv,
    Editor,
    Ci,
    ShellStartup,
    ToolConfig,
    AgentConfig,
}

impl Danger {
    /// What the file does, for the line that flags it.
    pub fn explain(self) -> &'static str {
        match self {
            Danger::GitHook => "git hook: runs on git commands",
            Danger::GitConfig => "git config: can make git run programs",
            Danger::GitLink => "a .git file: points git at another repository",
            Danger::PreCommit => "pre-commit config: runs on every commit",
            Danger::Direnv => "runs when you enter the directory (direnv/mise)",
            Danger::Editor => "editor settings: can run tasks when the folder is opened",
            Danger::Ci => "CI configuration: runs when pushed",
            Danger::ShellStartup => "shell startup file",
            Danger::ToolConfig => "tool configuration: can make build tools run other programs",
            Danger::AgentConfig => "coding agent settings: hooks and MCP servers run commands",
        }
    }
}

/// Where a path belongs in review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Inside a git directory (`git_dir` is `.git` or `sub/.git`).
    Git {
        git_dir: RelPath,
    },
    /// Under `root`, the shallowest path git ignores.
    Ignored {
        root: RelPath,
    },
    Normal,
}

/// File names flagged wherever they are.
const DANGER_NAMES: &[(&str, Danger)] = &[
    (".envrc", Danger::Direnv),
    ("mise.toml", Danger::Direnv),
    (".mise.toml", Danger::Direnv),
    (".pre-commit-config.yaml", Danger::PreCommit),
    (".exrc", Danger::Editor),
    (".nvimrc", Danger::Editor),
    (".nvim.lua", Danger::Editor),
    (".lvimrc", Danger::Editor),
    (".dir-locals.el", Danger::Editor),
    (".devcontainer.json", Danger::Editor),
    (".gitlab-ci.yml", Danger::Ci),
    (".travis.yml", Danger::Ci),
    ("Jenkinsfile", Danger::Ci),
    ("azure-pipelines.yml", Danger::Ci),
    (".drone.yml", Danger::Ci),
    ("bitbucket-pipelines.yml", Danger::Ci),
    (".woodpecker.yml", Danger::Ci),
    (".bashrc", Danger::ShellStartup),
    (".bash_profile", Danger::ShellStartup),
    (".bash_login", Danger::ShellStartup),
    (".bash_logout", Danger::ShellStartup),
    (".profile", Danger::ShellStartup),
    (".zshrc", Danger::ShellStartup),
    (".zshenv", Danger::ShellStartup),
    (".zprofile", Danger::ShellStartup),
    (".zlogin", Danger::ShellStartup),
    (".zlogout", Danger::ShellStartup),
    (".npmrc", Danger::ToolConfig),
    (".yarnrc", Danger::ToolConfig),
    (".yarnrc.yml", Danger::ToolConfig),
    (".pnpmfile.cjs", Danger::ToolConfig),
    ("rust-toolchain", Danger::ToolConfig),
    ("rust-toolchain.toml", Danger::ToolConfig),
    (".mcp.json", Danger::AgentConfig),
];

/// Directories whose whole content is flagged, wherever they are.
const DANGER_DIRS: &[(&str, Danger)] = &[
    (".vscode", Danger::Editor),
    (".idea", Danger::Editor),
    (".devcontainer", Danger::Editor),
    (".zed", Danger::Editor),
    (".helix", Danger::Editor),
    (".circleci", Danger::Ci),
    (".buildkite", Danger::Ci),
    (".woodpecker", Danger::Ci),
    (".husky", Danger::GitHook),
];

/// Two-level locations: `parent/child` and everything below.
const DANGER_PAIRS: &[(&str, &str, Danger)] = &[
    (".github", "workflows", Danger::Ci),
    (".github", "actions", Danger::Ci),
    (".forgejo", "workflows", Danger::Ci),
    (".gitea", "workflows", Danger::Ci),
    (".cargo", "config", Danger::ToolConfig),
    (".cargo", "config.toml", Danger::ToolConfig),
    (".claude", "settings.json", Danger::AgentConfig),
    (".claude", "settings.local.json", Danger::AgentConfig),
    (".claude", "hooks", Danger::AgentConfig),
    (".codex", "config.toml", Danger::AgentConfig),
    (".gemini", "settings.json", Danger::AgentConfig),
];

/// Classifies paths of one workspace.
pub struct Classifier<'h> {
    /// The host's `core.hooksPath` inside the workspace, if set.
    hooks_path: Option<RelPath>,
    ignores: Ignores<'h>,
}

impl<'h> Classifier<'h> {
    /// `global_excludes`: also use the user's global git excludes file
    /// (tests turn it off, so the machine's settings do not leak in).
    pub fn new(host: &'h Host, workspace: &Path, global_excludes: bool) -> Classifier<'h> {
        let hooks_path = hooks_path(host, workspace);
        Classifier { hooks_path, ignores: Ignores::new(host, global_excludes) }
    }

    /// Directories whose `.gitignore` was looked for so far.
    #[cfg(test)]
    fn ignore_files_probed(&self) -> Vec<String> {
        let mut dirs: Vec<String> =
            self.ignores.per_dir.keys().map(|d| String::from_utf8_lossy(d).into_owned()).collect();
        dirs.sort();
        dirs
    }

    pub fn place(&mut self, entry: &Entry) -> Place {
        if let Some(git_dir) = git_dir_of(&entry.path) {
            // A `.git` that is a file is not a git directory's content.
            let is_link = entry.path == git_dir && !entry.kind.holds_children() && entry.kind != Kind::Delete;
            if !is_link {
                return Place::Git { git_dir };
            }
        }
        let is_dir = entry.kind.holds_children() || matches!(entry.base, Base::Dir { .. });
        match self.ignores.ignored_root(&entry.path, is_dir) {
            Some(root) => Place::Ignored { root },
            None => Place::Normal,
        }
    }

    pub fn danger(&self, entry: &Entry) -> Option<Danger> {
        // What runs is a file or a link to one; a directory or a deletion
        // runs nothing (its files, if any, are judged themselves).
        if entry.kind.holds_children() || entry.kind == Kind::Delete {
            return None;
        }
        let path = &entry.path;
        if let Some(hooks) = &self.hooks_path
            && path.starts_with(hooks)
            && path != hooks
        {
            return Some(Danger::GitHook);
        }
        if let Some(git_dir) = git_dir_of(path) {
            if *path == git_dir {
                let is_file = !entry.kind.holds_children() && entry.kind != Kind::Delete;
                return is_file.then_some(Danger::GitLink);
            }
            return git_internal_danger(&path.as_bytes()[git_dir.as_bytes().len() + 1..]);
        }
        let parts: Vec<&[u8]> = path.components().collect();
        let name = path.file_name();
        if let Some((_, d)) = DANGER_NAMES.iter().find(|(n, _)| n.as_bytes() == name) {
            return Some(*d);
        }
        if let Some((_, d)) = DANGER_DIRS.iter().find(|(n, _)| parts.contains(&n.as_bytes())) {
            return Some(*d);
        }
        for window in parts.windows(2) {
            if let Some((_, _, d)) =
                DANGER_PAIRS.iter().find(|(a, b, _)| window[0] == a.as_bytes() && window[1] == b.as_bytes())
            {
                return Some(*d);
            }
        }
        None
    }
}

/// The git directory a path is in or is: the prefix up to the first `.git`
/// component.
pub fn git_dir_of(path: &RelPath) -> Option<RelPath> {
    let bytes = path.as_bytes();
    let mut start = 0;
    for part in path.components() {
        let end = start + part.len();
        if part == b".git" {
            return RelPath::new(&bytes[..end]).ok();
        }
        start = end + 1;
    }
    None
}

/// Hooks and config inside a git directory (also a submodule's or a
/// worktree's: `modules/<name>/…`, `worktrees/<name>/…`); `rest` is the
/// path below the git directory.
fn git_internal_danger(rest: &[u8]) -> Option<Danger> {
    let parts: Vec<&[u8]> = rest.split(|&b| b == b'/').collect();
    let n = parts.len();
    let nested_ok = |prefix: &[&[u8]]| {
        prefix.is_empty()
            || ((prefix[0] == b"modules" || prefix[0] == b"worktrees")
                && !prefix.iter().any(|p| matches!(*p, b"refs" | b"logs" | b"objects" | b"info")))
    };
    if n >= 2 && parts[n - 2] == b"hooks" && !parts[n - 1].ends_with(b".sample") && nested_ok(&parts[..n - 2]) {
        return Some(Danger::GitHook);
    }
    if matches!(parts[n - 1], b"config" | b"config.worktree") && nested_ok(&parts[..n - 1]) {
        return Some(Danger::GitConfig);
    }
    None
}

/// Whether a change leaves a file executable that was not before.
pub fn became_executable(entry: &Entry) -> bool {
    let was = |base: &Base| matches!(base, Base::File { mode, .. } if executable(*mode));
    match &entry.kind {
        Kind::File { mode, .. } | Kind::Mode { mode } => executable(*mode) && !was(&entry.base),
        _ => false,
    }
}

fn executable(mode: Mode) -> bool {
    mode.bits() & 0o111 != 0
}

/// Whether a symlink at `path` with `target` points outside the workspace
/// (absolute, or climbing above the root).
pub fn points_outside(path: &RelPath, target: &[u8]) -> bool {
    if target.starts_with(b"/") {
        return true;
    }
    let mut depth = path.depth() as i64 - 1;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// The host's `core.hooksPath`, when it lies inside the workspace.
fn hooks_path(host: &Host, workspace: &Path) -> Option<RelPath> {
    let config = host.read(&RelPath::new(&b".git/config"[..]).ok()?, 1 << 20).ok()??;
    let value = git_config_value(&String::from_utf8_lossy(&config), "core", "hookspath")?;
    let path = PathBuf::from(value);
    let relative = if path.is_absolute() { path.strip_prefix(workspace).ok()?.to_path_buf() } else { path };
    let text = relative.to_str()?.trim_start_matches("./").trim_end_matches('/');
    RelPath::new(text.as_bytes()).ok()
}

/// The last value of `section.key` in git config text (case-insensitive
/// names, no includes, no subsections).
fn git_config_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut current = String::new();
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix('[') {
            current = rest.split([']', ' ', '"']).next().unwrap_or("").to_ascii_lowercase();
            continue;
        }
        if current != section {
            continue;
        }
        if let Some((k, v)) = line.split_once('=')
            && k.trim().eq_ignore_ascii_case(key)
        {
            let v = v.split([';', '#']).next().unwrap_or("").trim().trim_matches('"');
            found = Some(v.to_string());
        }
    }
    found
}

/// Gitignore rules read from the host, per directory, on demand.
struct Ignores<'h> {
    host: &'h Host,
    /// `.gitignore` of each directory looked at (key: the directory's path
    /// bytes, empty for the root).
    per_dir: HashMap<Vec<u8>, Option<Gitignore>>,
    /// `.git/info/exclude` and the global excludes, below any `.gitignore`.
    fallback: Vec<Gitignore>,
    /// Directories already judged.
    dirs: HashMap<Vec<u8>, bool>,
}

/// A `.gitignore` larger than this is not read (it is surely not one).
const MAX_IGNORE_FILE: u64 = 4 << 20;

impl<'h> Ignores<'h> {
    fn new(host: &'h Host, global: bool) -> Ignores<'h> {
        let mut fallback = Vec::new();
        if let Some(exclude) = RelPath::new(&b".git/info/exclude"[..]).ok().and_then(|p| load(host, &p)) {
            fallback.push(exclude);
        }
        if global {
            let (matcher, err) = Gitignore::global();
            if let Some(err) = err {
                tracing::debug!("global git excludes: {err}");
            }
            if !matcher.is_empty() {
                fallback.push(matcher);
            }
        }
        Ignores { host, per_dir: HashMap::new(), fallback, dirs: HashMap::new() }
    }

    /// The shallowest ignored path among `path` and its directories.
    fn ignored_root(&mut self, path: &RelPath, is_dir: bool) -> Option<RelPath> {
        let bytes = path.as_bytes();
        let mut ends: Vec<usize> = bytes.iter().enumerate().filter(|(_, b)| **b == b'/').map(|(i, _)| i).collect();
        ends.push(bytes.len());
        let last = ends.len() - 1;
        for (i, &end) in ends.iter().enumerate() {
            let prefix = &bytes[..end];
            let prefix_is_dir = i < last || is_dir;
            let ignored = match (prefix_is_dir, self.dirs.get(prefix)) {
                (true, Some(&known)) => known,
                _ => {
                    let verdict = self.judge(prefix, prefix_is_dir);
                    if prefix_is_dir {
                        self.dirs.insert(prefix.to_vec(), verdict);
                    }
                    verdict
                }
            };
            if ignored {
                return RelPath::new(prefix).ok();
            }
        }
        None
    }

    /// One path's verdict, ignoring its parents: the deepest `.gitignore`
    /// with a matching rule decides, then the fallbacks.
    fn judge(&mut self, path: &[u8], is_dir: bool) -> bool {
        let slashes: Vec<usize> = path.iter().enumerate().filter(|(_, b)| **b == b'/').map(|(i, _)| i).collect();
        // Deepest directory first, the root last.
        let dirs = slashes.iter().rev().map(|&i| (&path[..i], &path[i + 1..])).chain([(&path[..0], path)]);
        for (dir, rel) in dirs {
            if let Some(rules) = self.rules(dir) {
                match rules.matched(Path::new(OsStr::from_bytes(rel)), is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
        }
        let rel = Path::new(OsStr::from_bytes(path));
        for rules in &self.fallback {
            match rules.matched(rel, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }

    fn rules(&mut self, dir: &[u8]) -> Option<&Gitignore> {
        if !self.per_dir.contains_key(dir) {
            let file = if dir.is_empty() {
                RelPath::new(&b".gitignore"[..]).ok()
            } else {
                RelPath::new(dir).ok().and_then(|d| d.join(b".gitignore").ok())
            };
            let rules = file.and_then(|f| load(self.host, &f));
            self.per_dir.insert(dir.to_vec(), rules);
        }
        self.per_dir.get(dir).and_then(Option::as_ref)
    }
}

/// Parses one ignore file from the host; patterns apply relative to its directory.
fn load(host: &Host, file: &RelPath) -> Option<Gitignore> {
    let content = host.read(file, MAX_IGNORE_FILE).ok()??;
    let mut builder = GitignoreBuilder::new("");
    for line in String::from_utf8_lossy(&content).lines() {
        if let Err(e) = builder.add_line(None, line) {
            tracing::debug!("{file}: ignoring a bad pattern: {e}");
        }
    }
    builder.build().ok().filter(|g| !g.is_empty())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::changes::model::Sha256;

    fn p(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    fn file(path: &str, mode: u32) -> Entry {
        Entry {
            path: p(path),
            kind: Kind::File { mode: Mode::from_raw(mode), size: 0, sha256: Sha256::of(b"") },
            base: Base::Absent,
        }
    }

    fn danger_of(path: &str) -> Option<Danger> {
        let tmp = tempfile::tempdir().unwrap();
        let host = Host::open(tmp.path());
        Classifier::new(&host, tmp.path(), false).danger(&file(path, 0o644))
    }

    #[test]
    fn flags_paths_that_run_code_by_themselves() {
        assert_eq!(danger_of(".git/hooks/pre-commit"), Some(Danger::GitHook));
        assert_eq!(danger_of(".git/hooks/pre-commit.sample"), None);
        assert_eq!(danger_of(".git/config"), Some(Danger::GitConfig));
        assert_eq!(danger_of(".git/modules/vendor/lib/hooks/post-checkout"), Some(Danger::GitHook));
        assert_eq!(danger_of(".git/modules/vendor/lib/config"), Some(Danger::GitConfig));
        assert_eq!(danger_of(".git/refs/heads/hooks/x"), None, "a branch named hooks/x is not a hook");
        assert_eq!(danger_of(".git/refs/heads/config"), None, "nor is a branch named config");
        assert_eq!(danger_of("sub/.git/hooks/pre-push"), Some(Danger::GitHook));
        assert_eq!(danger_of(".envrc"), Some(Danger::Direnv));
        assert_eq!(danger_of(".vscode/tasks.json"), Some(Danger::Editor));
        assert_eq!(danger_of("web/.idea/workspace.xml"), Some(Danger::Editor));
        assert_eq!(danger_of(".github/workflows/ci.yml"), Some(Danger::Ci));
        assert_eq!(danger_of(".github/ISSUE_TEMPLATE.md"), None);
        assert_eq!(danger_of(".gitlab-ci.yml"), Some(Danger::Ci));
        assert_eq!(danger_of(".bashrc"), Some(Danger::ShellStartup));
        assert_eq!(danger_of(".cargo/config.toml"), Some(Danger::ToolConfig));
        assert_eq!(danger_of(".claude/settings.json"), Some(Danger::AgentConfig));
        assert_eq!(danger_of(".codex/config.toml"), Some(Danger::AgentConfig));
        assert_eq!(danger_of(".mcp.json"), Some(Danger::AgentConfig));
        assert_eq!(danger_of(".claude/commands/review.md"), None);
        assert_eq!(danger_of("Makefile"), None);
        assert_eq!(danger_of("build.rs"), None);
        assert_eq!(danger_of("package.json"), None);
        assert_eq!(danger_of("src/main.rs"), None);
        let tmp = tempfile::tempdir().unwrap();
        let host = Host::open(tmp.path());
        let c = Classifier::new(&host, tmp.path(), false);
        let dir =
            Entry { path: p(".github/workflows"), kind: Kind::Dir { mode: Mode::from_raw(0o755) }, base: Base::Absent };
        assert_eq!(c.danger(&dir), None, "a new directory runs nothing by itself");
        let gone = Entry { path: p(".envrc"), kind: Kind::Delete, base: Base::Absent };
        assert_eq!(c.danger(&gone), None);
    }

    #[test]
    fn a_dot_git_file_is_a_link_not_a_git_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let host = Host::open(tmp.path());
        let mut c = Classifier::new(&host, tmp.path(), false);
        let link = file(".git", 0o644);
        assert_eq!(c.danger(&link), Some(Danger::GitLink));
        assert_eq!(c.place(&link), Place::Normal);
        assert_eq!(c.place(&file(".git/index", 0o644)), Place::Git { git_dir: p(".git") });
        assert_eq!(c.place(&file("vendor/x/.git/HEAD", 0o644)), Place::Git { git_dir: p("vendor/x/.git") });
    }

    #[test]
    fn hooks_path_from_the_host_config_is_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join(".git")).unwrap();
        fs::write(tmp.path().join(".git/config"), "[core]\n\tbare = false\n\thooksPath = tools/hooks\n").unwrap();
        let host = Host::open(tmp.path());
        let c = Classifier::new(&host, tmp.path(), false);
        assert_eq!(c.danger(&file("tools/hooks/pre-commit", 0o755)), Some(Danger::GitHook));
        assert_eq!(c.danger(&file("tools/other", 0o755)), None);
    }

    #[test]
    fn notes_new_executables_and_escaping_symlinks() {
        assert!(became_executable(&file("run.sh", 0o755)));
        assert!(!became_executable(&file("data", 0o644)));
        let mut chmod = file("x", 0o644);
        chmod.kind = Kind::Mode { mode: Mode::from_raw(0o755) };
        chmod.base = Base::File { mode: Mode::from_raw(0o644), size: 0, sha256: Sha256::of(b"") };
        assert!(became_executable(&chmod));
        chmod.base = Base::File { mode: Mode::from_raw(0o700), size: 0, sha256: Sha256::of(b"") };
        assert!(!became_executable(&chmod), "it was executable already");

        assert!(points_outside(&p("link"), b"/etc/passwd"));
        assert!(points_outside(&p("a/link"), b"../../x"));
        assert!(!points_outside(&p("a/link"), b"../x"));
        assert!(!points_outside(&p("a/b/link"), b"./../c/../../d"));
    }

    #[test]
    fn ignored_paths_group_under_their_shallowest_ignored_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::write(ws.join(".gitignore"), "node_modules/\n/target\n*.log\n!keep.log\n").unwrap();
        fs::create_dir_all(ws.join("web")).unwrap();
        fs::write(ws.join("web/.gitignore"), "dist/\n").unwrap();
        fs::create_dir_all(ws.join(".git/info")).unwrap();
        fs::write(ws.join(".git/info/exclude"), "scratch/\n").unwrap();
        let host = Host::open(ws);
        let mut c = Classifier::new(&host, ws, false);
        let mut root = |path: &str| match c.place(&file(path, 0o644)) {
            Place::Ignored { root } => Some(root.to_string()),
            _ => None,
        };
        assert_eq!(root("node_modules/a/index.js").as_deref(), Some("node_modules"));
        assert_eq!(root("web/node_modules/b.js").as_deref(), Some("web/node_modules"));
        assert_eq!(root("target/debug/app").as_deref(), Some("target"));
        assert_eq!(root("src/target/x"), None, "/target is anchored at the root");
        assert_eq!(root("web/dist/app.js").as_deref(), Some("web/dist"));
        assert_eq!(root("dist/app.js"), None, "web/.gitignore applies below web/ only");
        assert_eq!(root("logs/run.log").as_deref(), Some("logs/run.log"));
        assert_eq!(root("logs/keep.log"), None, "re-included");
        assert_eq!(root("scratch/notes").as_deref(), Some("scratch"));
        assert_eq!(root("src/main.rs"), None);
    }

    #[test]
    fn only_the_changed_paths_ancestors_are_asked_for_rules() {
        // Deciding whether a changed path is ignored reads the .gitignore of
        // its own directories, whatever else the workspace holds: no index,
        // no walk, no git process.
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::write(ws.join(".gitignore"), "node_modules/\n").unwrap();
        for d in 0..50 {
            fs::create_dir_all(ws.join(format!("lib{d}"))).unwrap();
            fs::write(ws.join(format!("lib{d}/.gitignore")), "*.tmp\n").unwrap();
        }
        let host = Host::open(ws);
        let mut c = Classifier::new(&host, ws, false);
        let changed = ["lib7/a.rs", "lib7/b.tmp", "lib9/deep/er/c.rs", "node_modules/x/y/z.js", "README.md"];
        let places: Vec<bool> =
            changed.iter().map(|path| matches!(c.place(&file(path, 0o644)), Place::Ignored { .. })).collect();
        assert_eq!(places, [false, true, false, true, false]);
        // node_modules is ignored by the root's rules: nothing below it is read.
        assert_eq!(c.ignore_files_probed(), ["", "lib7", "lib9", "lib9/deep", "lib9/deep/er"]);
    }

    #[test]
    fn reads_core_hooks_path() {
        let text = "[user]\n name = x\n[core]\n  HooksPath = \".githooks\" ; comment\n";
        assert_eq!(git_config_value(text, "core", "hookspath").as_deref(), Some(".githooks"));
        assert_eq!(git_config_value("[core]\n", "core", "hookspath"), None);
    }
}
