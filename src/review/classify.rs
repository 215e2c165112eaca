//! What kind of path a change touches, for review: inside a git directory,
//! ignored by git (collapsed in the summary), or execution-sensitive
//! ("runs code by itself": listed one by one, never cut from the summary,
//! and held back from `--apply all` unless the user adds `--include-code`).
//!
//! # Execution-sensitive paths
//!
//! Flagged are files that make code run *without the user choosing to run
//! this project's code*: on a git command, on opening the folder in an
//! editor or entering it in a shell, on a push (CI), or by pointing a tool
//! at another program, on starting Python or activating an environment. Five
//! rules decide, in this order:
//!
//! 1. **Git directories** (`.git/`, also a submodule's `.git/modules/<name>/`
//!    and a worktree's `.git/worktrees/<name>/`, and an *embedded bare
//!    repository*: any directory holding `HEAD`, `objects/` and `refs/`,
//!    which git uses as a repository under `git -C` or
//!    `safe.bareRepository`). Everything the guest adds or changes in one is
//!    flagged except the history git keeps by itself: `objects/` (but
//!    `objects/info/alternates`), `refs/`, `logs/`, `index`, `HEAD`,
//!    `packed-refs`, `ORIG_HEAD`, `FETCH_HEAD`, `MERGE_HEAD`,
//!    `CHERRY_PICK_HEAD`, `REVERT_HEAD`, `AUTO_MERGE`, `COMMIT_EDITMSG`,
//!    `MERGE_MSG`, `MERGE_MODE`, `SQUASH_MSG`, `description`, `shallow`,
//!    `lfs/objects/` and `hooks/*.sample`. So hooks, every `config` (with its
//!    `core.fsmonitor`, `core.hooksPath`, `include.path`, `includeIf`,
//!    aliases, filters), `info/exclude` and `info/attributes`, `commondir`,
//!    `gitdir`, rebase and sequencer state (`exec` lines) are each shown on
//!    their own. A `.git` that is a file or a symlink (it points git at
//!    another repository) is flagged, and so is **any symlink inside a git
//!    directory**, whatever its name.
//! 2. **The host's git config** (`.git/config`, the user's and the
//!    system's, and every file they include, whatever the `includeIf`
//!    condition; see [`GitRuns`]): files under any `core.hooksPath` it
//!    sets, the files it includes, and the files its settings run as
//!    commands (filter, diff and merge drivers, `!` aliases, editors,
//!    pagers, `core.sshCommand`, `core.fsmonitor`, credential helpers,
//!    `gpg.program`, ...), when they lie in the workspace. And what a hook
//!    that is a symlink on the host points to, in the workspace: git runs
//!    it at the hook's event.
//! 3. **Names**: the patterns in [`FLAGGED`] (gitignore syntax: a pattern
//!    without a slash matches a name at any depth, a trailing `/` a
//!    directory and everything below it, `**/` any directories), and the
//!    user's own, from `runs_code` in the config file (same syntax).
//! 4. **Symlinks**: a symlink whose name is a directory those rules look
//!    into (`.cargo`, `.github`, `.vscode`, `.git`, `hooks`, ...) is flagged,
//!    and a file the change set or the host's workspace root makes reachable
//!    through one (`.cargo -> ci/cargo` with `ci/cargo/config.toml`) is
//!    judged by the path it is reached as, and flagged when that path is.
//! 5. **Loaded without being named** (rule 3's names hold the fixed ones:
//!    `.pth` in a site directory, `sitecustomize.py`, `.env` files): a
//!    virtualenv's `bin/` or `Scripts/` (a directory holding `pyvenv.cfg`,
//!    staged or on the host: activation sources its scripts and puts it
//!    first on `PATH`), direnv's cache files and layout `bin/` directories
//!    in `.direnv/`, and what the workspace's `.envrc` (see [`Envrc`]; the
//!    host's, a staged one, and the files they load) puts on `PATH`,
//!    sources, or builds with nix. When it may change `PATH` in a way not
//!    understood, every new or changed executable (and symlink) is flagged,
//!    anywhere: any directory may be on `PATH`.
//!
//! Rules 3 and 5 apply inside trees git ignores too: those are collapsed in
//! the summary, so a flagged file there would otherwise go unseen.
//!
//! A change set staged for the home directory from an agent's `review`
//! paths ([`Classifier::agent_settings`]) flags every file: instructions,
//! commands and skills steer the agent or run code when it next starts.
//!
//! Not flagged: Makefiles, `build.rs`, `package.json` scripts, `setup.py`,
//! test fixtures, a virtualenv's packages, a project's own `.claude/commands`
//! and the like. They run when the user builds, tests or runs the project,
//! they are ordinary project source shown in the diff, and they change in
//! almost every session: flagging them would drown the signal.
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

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::OnceLock;

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::changes::{Host, HostState, OtherTree, TreeFile};
use crate::protocol::change_set::entry::{Base, Entry, Kind, Mode};
use crate::protocol::change_set::path::RelPath;

use super::direnv::Envrc;
use super::gitconfig::GitRuns;

/// Why a path runs code by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Danger {
    GitHook,
    GitConfig,
    /// A program the host's git config runs (filter, alias, editor, ...).
    GitProgram,
    GitLink,
    /// Other git internals that change what git does or shows.
    GitInternal,
    /// A symlink inside a git directory.
    GitSymlink,
    PreCommit,
    Direnv,
    Editor,
    Ci,
    ShellStartup,
    ToolConfig,
    AgentConfig,
    /// A symlink standing where tools look for settings or hooks.
    SymlinkedLocation,
    /// A file reached through such a symlink as a flagged path.
    Reached,
    /// Listed in the user's `runs_code` setting.
    UserListed,
    /// Python runs it at every start in that environment.
    PythonStartup,
    /// A virtualenv's scripts and settings.
    Virtualenv,
    /// In a directory the workspace's `.envrc` puts on `PATH`.
    OnPath,
    /// A program, and the `.envrc` changes `PATH` in a way not understood.
    MaybeOnPath,
    /// A dotenv file: variables tools load by themselves.
    EnvFile,
    /// A file of an agent's own settings, offered for the home directory.
    AgentSettings,
}

impl Danger {
    /// What the file does, for the line that flags it.
    pub fn explain(self) -> &'static str {
        match self {
            Danger::GitHook => "git hook: runs on git commands",
            Danger::GitConfig => "git config: can make git run programs",
            Danger::GitProgram => {
                "run by git as your git config says (filter, diff driver, alias, editor, credential helper, ...)"
            }
            Danger::GitLink => "a .git file or symlink: points git at another repository",
            Danger::GitInternal => "git internals: change what git does or shows",
            Danger::GitSymlink => "symlink inside a git directory: git reads and writes through it",
            Danger::PreCommit => "git hook configuration: runs on git commands",
            Danger::Direnv => "runs when you enter the directory (direnv/mise/asdf)",
            Danger::Editor => "editor settings: can run tasks when the folder is opened",
            Danger::Ci => "CI configuration: runs when pushed",
            Danger::ShellStartup => "shell startup file",
            Danger::ToolConfig => "tool configuration: can make build tools run other programs",
            Danger::AgentConfig => "coding agent settings: hooks and MCP servers run commands",
            Danger::SymlinkedLocation => "symlink where tools read settings or hooks: what it points to runs",
            Danger::Reached => "reached through a symlink as a file that runs code",
            Danger::UserListed => "listed in runs_code in your config file",
            Danger::PythonStartup => "runs at every Python start in its environment (.pth, sitecustomize)",
            Danger::Virtualenv => "virtualenv script or setting: activating it runs it or puts it first on PATH",
            Danger::OnPath => "on PATH in this directory (direnv): runs in place of the command of its name",
            Danger::MaybeOnPath => {
                "a program, and .envrc changes PATH in a way stockade cannot read: it may run in place of a command"
            }
            Danger::EnvFile => "environment file: direnv, docker compose, editors load it (PATH, LD_PRELOAD, ...)",
            Danger::AgentSettings => {
                "coding agent settings for your home directory: instructions, commands, skills and hooks steer or \
                 run code when the agent starts"
            }
        }
    }
}

/// The built-in flagged names, in gitignore syntax (see the module docs).
/// Users add their own with `runs_code = [...]` in the config file.
pub const FLAGGED: &[(&str, Danger)] = &[
    // Git hook managers.
    (".husky/", Danger::GitHook),
    (".pre-commit-config.yaml", Danger::PreCommit),
    ("lefthook.y*ml", Danger::PreCommit),
    (".lefthook.y*ml", Danger::PreCommit),
    ("lefthook-local.y*ml", Danger::PreCommit),
    (".lefthook-local.y*ml", Danger::PreCommit),
    (".lefthook/", Danger::PreCommit),
    // Entering the directory: direnv, mise (formerly rtx), asdf.
    (".envrc", Danger::Direnv),
    (".envrc.*", Danger::Direnv),
    ("mise.toml", Danger::Direnv),
    (".mise.toml", Danger::Direnv),
    ("mise.*.toml", Danger::Direnv),
    (".mise.*.toml", Danger::Direnv),
    (".mise/", Danger::Direnv),
    ("**/mise/config.toml", Danger::Direnv),
    ("**/.config/mise.toml", Danger::Direnv),
    ("**/.config/mise/", Danger::Direnv),
    (".rtx.toml", Danger::Direnv),
    (".tool-versions", Danger::Direnv),
    // Editors: folder-open tasks, interpreter and language-server paths.
    (".vscode/", Danger::Editor),
    ("*.code-workspace", Danger::Editor),
    (".idea/", Danger::Editor),
    (".devcontainer/", Danger::Editor),
    (".devcontainer.json", Danger::Editor),
    (".zed/", Danger::Editor),
    (".helix/", Danger::Editor),
    (".exrc", Danger::Editor),
    (".nvimrc", Danger::Editor),
    (".nvim.lua", Danger::Editor),
    (".lvimrc", Danger::Editor),
    (".dir-locals.el", Danger::Editor),
    (".dir-locals-2.el", Danger::Editor),
    // CI: runs with the repository's secrets when pushed.
    ("**/.github/workflows/", Danger::Ci),
    ("**/.github/actions/", Danger::Ci),
    ("**/.forgejo/workflows/", Danger::Ci),
    ("**/.gitea/workflows/", Danger::Ci),
    (".gitlab-ci.yml", Danger::Ci),
    (".circleci/", Danger::Ci),
    (".travis.yml", Danger::Ci),
    ("Jenkinsfile", Danger::Ci),
    (".buildkite/", Danger::Ci),
    ("azure-pipelines.yml", Danger::Ci),
    (".drone.yml", Danger::Ci),
    ("bitbucket-pipelines.yml", Danger::Ci),
    (".woodpecker.yml", Danger::Ci),
    (".woodpecker/", Danger::Ci),
    (".cirrus.yml", Danger::Ci),
    ("appveyor.yml", Danger::Ci),
    (".appveyor.yml", Danger::Ci),
    // Shell startup files.
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
    // Tool redirection: another program run in the tool's place.
    ("**/.cargo/config", Danger::ToolConfig),
    ("**/.cargo/config.toml", Danger::ToolConfig),
    ("rust-toolchain", Danger::ToolConfig),
    ("rust-toolchain.toml", Danger::ToolConfig),
    (".npmrc", Danger::ToolConfig),
    (".yarnrc", Danger::ToolConfig),
    (".yarnrc.yml", Danger::ToolConfig),
    (".pnpmfile.cjs", Danger::ToolConfig),
    (".pnpmfile.mjs", Danger::ToolConfig),
    (".bazelrc", Danger::ToolConfig),
    (".bazelversion", Danger::ToolConfig),
    (".bazeliskrc", Danger::ToolConfig),
    (".gdbinit", Danger::ToolConfig),
    (".lldbinit", Danger::ToolConfig),
    // Coding agents: hooks, status line, MCP servers.
    ("**/.claude/settings.json", Danger::AgentConfig),
    ("**/.claude/settings.local.json", Danger::AgentConfig),
    ("**/.claude/hooks/", Danger::AgentConfig),
    (".mcp.json", Danger::AgentConfig),
    ("**/.codex/config.toml", Danger::AgentConfig),
    ("**/.gemini/settings.json", Danger::AgentConfig),
    ("**/.cursor/mcp.json", Danger::AgentConfig),
    // Other agents' project settings of the same shape: hooks, plugins and
    // tools they load as code, MCP servers, commands they run by themselves
    // (install, lint, test). Their instructions, rules and slash commands
    // are project source, as `CLAUDE.md` and `.claude/commands/` are.
    ("**/.cursor/hooks.json", Danger::AgentConfig),
    ("**/.cursor/hooks/", Danger::AgentConfig),
    ("**/.cursor/environment.json", Danger::AgentConfig),
    ("opencode.json", Danger::AgentConfig),
    ("opencode.jsonc", Danger::AgentConfig),
    ("**/.opencode/opencode.json*", Danger::AgentConfig),
    ("**/.opencode/plugin/", Danger::AgentConfig),
    ("**/.opencode/plugins/", Danger::AgentConfig),
    ("**/.opencode/tool/", Danger::AgentConfig),
    ("**/.opencode/tools/", Danger::AgentConfig),
    ("**/.gemini/extensions/", Danger::AgentConfig),
    ("**/.windsurf/hooks.json", Danger::AgentConfig),
    ("**/.clinerules/hooks/", Danger::AgentConfig),
    ("**/.continue/mcpServers/", Danger::AgentConfig),
    ("**/.kiro/hooks/", Danger::AgentConfig),
    ("**/.kiro/settings/mcp.json", Danger::AgentConfig),
    ("**/.roo/mcp.json", Danger::AgentConfig),
    ("**/.amazonq/mcp.json", Danger::AgentConfig),
    (".aider.conf.yml", Danger::AgentConfig),
    // Loaded without being named: at every Python start (a `.pth` only
    // counts in a site directory; elsewhere it is PyTorch's weights),
    // on activating an environment, by npm on its lifecycle events.
    ("**/site-packages/*.pth", Danger::PythonStartup),
    ("**/dist-packages/*.pth", Danger::PythonStartup),
    // Any form Python imports them in: `.py`, sourceless `.pyc`, and
    // extension modules (`.so`, `.cpython-312-x86_64-linux-gnu.so`, `.pyd`).
    ("sitecustomize.*", Danger::PythonStartup),
    ("usercustomize.*", Danger::PythonStartup),
    ("sitecustomize/", Danger::PythonStartup),
    ("usercustomize/", Danger::PythonStartup),
    ("pyvenv.cfg", Danger::Virtualenv),
    ("**/etc/conda/activate.d/", Danger::Virtualenv),
    ("**/etc/conda/deactivate.d/", Danger::Virtualenv),
    ("**/node_modules/.hooks/", Danger::ToolConfig),
    // Environment files: direnv's `dotenv`, docker compose, pipenv, just,
    // mise and editors load them; they can set PATH, LD_PRELOAD,
    // NODE_OPTIONS, PYTHONSTARTUP.
    (".env", Danger::EnvFile),
    (".env.*", Danger::EnvFile),
];

/// Directory names a program is looked up in, flagged when the host's
/// `.envrc` may change `PATH` in a way it could not read.
const BIN_LIKE: &[&[u8]] = &[b"bin", b".bin", b"sbin", b"scripts", b"script", b"tools"];

/// Names in a git directory that are its own history, not behaviour.
const GIT_HARMLESS: &[&[u8]] = &[
    b"index",
    b"HEAD",
    b"packed-refs",
    b"ORIG_HEAD",
    b"FETCH_HEAD",
    b"MERGE_HEAD",
    b"CHERRY_PICK_HEAD",
    b"REVERT_HEAD",
    b"AUTO_MERGE",
    b"COMMIT_EDITMSG",
    b"MERGE_MSG",
    b"MERGE_MODE",
    b"SQUASH_MSG",
    b"description",
    b"shallow",
];

/// Top-level names of a git directory besides its history files
/// (`GIT_HARMLESS`), where a submodule's or worktree's own git directory
/// may start.
const GIT_TOP: &[&[u8]] = &[
    b"objects",
    b"refs",
    b"logs",
    b"hooks",
    b"info",
    b"config",
    b"config.worktree",
    b"commondir",
    b"gitdir",
    b"modules",
    b"worktrees",
    b"lfs",
];

/// Whether `name` is one git keeps at the top of a git directory.
fn git_top(name: &[u8]) -> bool {
    GIT_TOP.contains(&name) || GIT_HARMLESS.contains(&name)
}

/// Places below the root where the host's symlinks are looked for too.
const HOST_PROBES: &[&[u8]] = &[
    b".git/hooks",
    b".git/info",
    b".github/workflows",
    b".github/actions",
    b".forgejo/workflows",
    b".gitea/workflows",
    b".claude/hooks",
    b".config/mise",
];

/// Patterns compiled: the matcher, and each pattern's danger.
struct Patterns {
    matcher: Gitignore,
    dangers: HashMap<String, Danger>,
    /// Directory names the patterns look into (a symlink so named is flagged).
    dir_names: HashSet<Vec<u8>>,
    /// A pattern looks into directories of any name (`tools/*/run.sh`).
    any_dir: bool,
}

impl Patterns {
    fn build(patterns: &[(&str, Danger)]) -> Result<Patterns, String> {
        let mut builder = GitignoreBuilder::new("");
        let mut dangers = HashMap::new();
        let mut dir_names = HashSet::new();
        let mut any_dir = false;
        for &(pattern, danger) in patterns {
            check_pattern(pattern)?;
            builder.add_line(None, pattern).map_err(|e| format!("{pattern:?}: {e}"))?;
            dangers.insert(pattern.to_string(), danger);
            let trimmed = pattern.trim_start_matches('/');
            let mut parts: Vec<&str> = trimmed.split('/').collect();
            let dir_only = pattern.ends_with('/');
            if dir_only {
                parts.pop();
            }
            // A directory pattern's last name is a directory too.
            let dirs = if dir_only { &parts[..] } else { &parts[..parts.len().saturating_sub(1)] };
            for part in dirs.iter().filter(|p| !p.is_empty() && **p != "**") {
                if part.contains(['*', '?', '[', '\\']) {
                    any_dir = true;
                } else {
                    dir_names.insert(part.as_bytes().to_vec());
                }
            }
        }
        let matcher = builder.build().map_err(|e| e.to_string())?;
        Ok(Patterns { matcher, dangers, dir_names, any_dir })
    }

    fn matched(&self, path: &[u8], is_dir: bool) -> Option<Danger> {
        match self.matcher.matched(Path::new(OsStr::from_bytes(path)), is_dir) {
            Match::Ignore(glob) => Some(self.dangers.get(glob.original()).copied().unwrap_or(Danger::UserListed)),
            _ => None,
        }
    }
}

/// Why a `runs_code` pattern cannot be used, if it cannot.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.trim().is_empty() {
        return Err("an empty pattern would match nothing".into());
    }
    if pattern.starts_with('!') || pattern.starts_with('#') {
        return Err(format!("{pattern:?}: a pattern may not start with `!` or `#` (nothing can be un-flagged)"));
    }
    let mut builder = GitignoreBuilder::new("");
    builder.add_line(None, pattern).map_err(|e| format!("{pattern:?}: {e}"))?;
    builder.build().map(|_| ()).map_err(|e| format!("{pattern:?}: {e}"))
}

/// The last `BUILTIN_DEPTH` names of a path: all the built-in patterns can
/// see (each is a name, or `**/` and at most this many names), so a path
/// the guest made thousands of levels deep costs no more to match.
const BUILTIN_DEPTH: usize = 3;

fn tail(path: &[u8]) -> &[u8] {
    let mut start = 0;
    let mut names = 0;
    for (i, &b) in path.iter().enumerate().rev() {
        if b == b'/' {
            names += 1;
            if names == BUILTIN_DEPTH {
                start = i + 1;
                break;
            }
        }
    }
    &path[start..]
}

fn builtin() -> &'static Patterns {
    static BUILTIN: OnceLock<Patterns> = OnceLock::new();
    BUILTIN.get_or_init(|| Patterns::build(FLAGGED).expect("the built-in patterns are valid"))
}

/// A symlink that makes the files below `dir` reachable as `link/...`.
#[derive(Debug, Clone)]
struct Alias {
    /// The directory it resolves to (empty: the workspace root).
    dir: Vec<u8>,
    link: RelPath,
}

/// Classifies paths of one workspace.
pub struct Classifier<'h> {
    host: &'h Host,
    /// The host's `core.hooksPath` directories inside the workspace.
    hooks_paths: Vec<RelPath>,
    /// Files the host's git config includes.
    config_files: Vec<RelPath>,
    /// Files the host's git config runs as commands.
    config_programs: Vec<RelPath>,
    /// What the host's hooks that are symlinks point to, each with its hook.
    hook_targets: HashMap<Vec<u8>, RelPath>,
    user: Option<Patterns>,
    ignores: Ignores<'h>,
    /// Per directory: whether a name pattern flags it (and all below).
    dir_verdicts: HashMap<Vec<u8>, Option<Danger>>,
    /// Aliases by the directory they resolve to.
    aliases: HashMap<Vec<u8>, Vec<RelPath>>,
    /// Per directory: the aliases of it and its ancestors.
    alias_chains: HashMap<Vec<u8>, Rc<Vec<Alias>>>,
    /// Paths the change set leaves holding `HEAD`, `objects` or `refs`.
    repo_marks: HashSet<Vec<u8>>,
    /// Directories judged as embedded bare repositories or not.
    bare: HashMap<Vec<u8>, bool>,
    /// What the workspace's `.envrc` loads (the host's, and a staged one).
    envrc: Envrc,
    /// Paths of `pyvenv.cfg` files the change set leaves.
    venv_marks: HashSet<Vec<u8>>,
    /// Directories judged as virtualenvs or not.
    venvs: HashMap<Vec<u8>, bool>,
    /// Every file is an agent's settings for the home directory.
    agent_settings: bool,
    /// Per site directory: the modules its host `.pth` files import.
    pth_imports: HashMap<Vec<u8>, Rc<HashSet<Vec<u8>>>>,
    /// Another tree the change set lands on, judged with the host's.
    other: Option<&'h dyn OtherTree>,
}

impl<'h> Classifier<'h> {
    /// `global_excludes`: also use the user's global git excludes file
    /// (tests turn it off, so the machine's settings do not leak in).
    pub fn new(host: &'h Host, workspace: &Path, global_excludes: bool) -> Classifier<'h> {
        let runs = GitRuns::read(host, workspace);
        let hook_targets = hook_targets(host, workspace, &runs.hooks_paths);
        Classifier {
            host,
            hooks_paths: runs.hooks_paths,
            config_files: runs.includes,
            config_programs: runs.programs,
            hook_targets,
            user: None,
            ignores: Ignores::new(host, global_excludes),
            dir_verdicts: HashMap::new(),
            aliases: HashMap::new(),
            alias_chains: HashMap::new(),
            repo_marks: HashSet::new(),
            bare: HashMap::new(),
            envrc: host_envrc(host, workspace),
            venv_marks: HashSet::new(),
            venvs: HashMap::new(),
            agent_settings: false,
            pth_imports: HashMap::new(),
            other: None,
        }
    }

    /// Judges also with `tree`, the tree the change set lands on when it
    /// is not the working tree: what its `.envrc` loads, its virtualenvs,
    /// the modules its `.pth` files import.
    pub fn with_other(mut self, tree: &'h dyn OtherTree, workspace: &Path) -> Classifier<'h> {
        self.envrc.merge(envrc_of(workspace, |path| tree.read(path, ENVRC_BYTES)));
        for cfg in tree.files_named(b"pyvenv.cfg") {
            self.venv_marks.insert(cfg.as_bytes().to_vec());
        }
        self.other = Some(tree);
        self
    }

    /// Judges every file as an agent's settings (a session staged for the
    /// home directory from an agent's `review` paths): each steers the
    /// agent or runs code when it next starts on the host.
    pub fn agent_settings(mut self, yes: bool) -> Classifier<'h> {
        self.agent_settings = yes;
        self
    }

    /// Also reads a staged `.envrc` of the workspace root: what it would
    /// load once applied counts as well.
    /// `None`: it cannot be read (a symlink), so `PATH` is unknown.
    pub fn learn_envrc(&mut self, text: Option<&[u8]>, workspace: &Path) {
        self.envrc.merge(match text {
            Some(text) => Envrc::parse(&String::from_utf8_lossy(text), workspace),
            None => Envrc { unknown_path: true, ..Envrc::default() },
        });
    }

    /// The `.envrc` and the files it loads, as far as read so far.
    pub fn envrc_files(&self) -> Vec<Vec<u8>> {
        let mut files = vec![b".envrc".to_vec()];
        files.extend(self.envrc.loaded.iter().cloned());
        files
    }

    /// Also flag paths matching these patterns (the `runs_code` setting).
    /// Patterns that do not compile are left out with a warning: settings
    /// checked them when the file was read.
    pub fn with_patterns(mut self, patterns: &[String]) -> Classifier<'h> {
        if patterns.is_empty() {
            return self;
        }
        let rows: Vec<(&str, Danger)> = patterns.iter().map(|p| (p.as_str(), Danger::UserListed)).collect();
        match Patterns::build(&rows) {
            Ok(user) => self.user = Some(user),
            Err(e) => tracing::warn!("runs_code: {e}"),
        }
        self
    }

    /// Reads what the whole change set says about other paths: symlinks
    /// that make directories reachable under flagged names, and the marks
    /// of embedded repositories. Call before `danger`.
    pub fn learn<'e, I>(&mut self, entries: I)
    where
        I: IntoIterator<Item = &'e Entry> + Clone,
    {
        let mut seen_near_root: HashSet<Vec<u8>> = HashSet::new();
        for entry in entries.clone() {
            let path = &entry.path;
            if path.depth() <= 2 {
                seen_near_root.insert(path.as_bytes().to_vec());
            }
            if entry.kind != Kind::Delete && matches!(path.file_name(), b"HEAD" | b"objects" | b"refs") {
                self.repo_marks.insert(path.as_bytes().to_vec());
            }
            if entry.kind != Kind::Delete && path.file_name() == b"pyvenv.cfg" {
                self.venv_marks.insert(path.as_bytes().to_vec());
            }
        }
        for entry in entries {
            if let Kind::Symlink { target } = &entry.kind
                && self.is_location(&entry.path)
                && let Some(dir) = resolve(&entry.path, target.as_bytes())
            {
                self.aliases.entry(dir).or_default().push(entry.path.clone());
            }
        }
        // Symlinks already on the host where tools look: the workspace
        // root, the git directory, the hooks path.
        let mut probes: Vec<Vec<u8>> = self.location_names().map(<[u8]>::to_vec).collect();
        for extra in HOST_PROBES {
            probes.push(extra.to_vec());
        }
        probes.extend(self.hooks_paths.iter().map(|p| p.as_bytes().to_vec()));
        for probe in probes {
            if seen_near_root.contains(&probe) {
                continue;
            }
            let Ok(link) = RelPath::new(probe) else { continue };
            if let HostState::Symlink { target } = self.host.state(&link)
                && let Some(dir) = resolve(&link, &target)
            {
                self.aliases.entry(dir).or_default().push(link);
            }
        }
    }

    /// Directory names the rules look into.
    fn location_names(&self) -> impl Iterator<Item = &[u8]> {
        let user = self.user.iter().flat_map(|u| u.dir_names.iter());
        builtin().dir_names.iter().chain(user).map(Vec::as_slice).chain([&b".git"[..]])
    }

    /// Whether a symlink at `path` would stand where a rule looks.
    fn is_location(&mut self, path: &RelPath) -> bool {
        if git_dir_of(path).is_some() {
            return true;
        }
        let name = path.file_name();
        let user = self.user.as_ref();
        if builtin().dir_names.contains(name)
            || user.is_some_and(|u| u.any_dir || u.dir_names.contains(name))
            || builtin().matched(tail(path.as_bytes()), true).is_some()
            || user.is_some_and(|u| u.matched(path.as_bytes(), true).is_some())
        {
            return true;
        }
        let named = self.hooks_paths.iter().chain(&self.config_files).chain(&self.config_programs);
        if named.into_iter().any(|target| target.starts_with(path) || path.starts_with(target)) {
            return true;
        }
        // A directory of an embedded repository (`x/hooks`, `x/info`).
        let parent = path.parent().map(|p| p.as_bytes().to_vec()).unwrap_or_default();
        matches!(name, b"hooks" | b"info" | b"objects") && self.is_bare(&parent)
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

    pub fn danger(&mut self, entry: &Entry) -> Option<Danger> {
        self.judge(entry).map(|(danger, _)| danger)
    }

    /// Whether the entry runs code by itself, and why; for a file reached
    /// through a symlink, the path it is reached as.
    pub fn judge(&mut self, entry: &Entry) -> Option<(Danger, Option<RelPath>)> {
        // What runs is a file or a link to one; a directory or a deletion
        // runs nothing (its files, if any, are judged themselves).
        if entry.kind.holds_children() || entry.kind == Kind::Delete {
            return None;
        }
        let symlink = matches!(entry.kind, Kind::Symlink { .. });
        if let Some(danger) = self.direct(&entry.path, &entry.kind) {
            return Some((danger, None));
        }
        if symlink && self.is_location(&entry.path) {
            return Some((Danger::SymlinkedLocation, None));
        }
        if let Some(hook) = self.hook_targets.get(entry.path.as_bytes()) {
            return Some((Danger::Reached, Some(hook.clone())));
        }
        if let Some(reached) = self.reached(entry) {
            return Some(reached);
        }
        self.agent_settings.then_some((Danger::AgentSettings, None))
    }

    /// A file reached through a symlink as a path the rules flag.
    fn reached(&mut self, entry: &Entry) -> Option<(Danger, Option<RelPath>)> {
        if self.aliases.is_empty() {
            return None;
        }
        let parent = entry.path.parent().map(|p| p.as_bytes().to_vec()).unwrap_or_default();
        let chain = self.alias_chain(&parent);
        for alias in chain.iter() {
            let rest = if alias.dir.is_empty() {
                entry.path.as_bytes()
            } else {
                &entry.path.as_bytes()[alias.dir.len() + 1..]
            };
            let Ok(reached) = alias.link.join(rest) else { continue };
            if self.direct(&reached, &entry.kind).is_some() {
                return Some((Danger::Reached, Some(reached)));
            }
        }
        None
    }

    /// The rules that look at the path itself (1 to 3 and 5 of the module
    /// docs), for an entry of `kind` there.
    fn direct(&mut self, path: &RelPath, kind: &Kind) -> Option<Danger> {
        let symlink = matches!(kind, Kind::Symlink { .. });
        if let Some(git_dir) = git_dir_of(path) {
            if *path == git_dir {
                return Some(Danger::GitLink);
            }
            if symlink {
                return Some(Danger::GitSymlink);
            }
            return git_internal_danger(&path.as_bytes()[git_dir.as_bytes().len() + 1..]);
        }
        if self.hooks_paths.iter().any(|hooks| path.starts_with(hooks) && path != hooks) {
            return Some(Danger::GitHook);
        }
        if self.config_files.contains(path) {
            return Some(Danger::GitConfig);
        }
        if self.config_programs.contains(path) {
            return Some(Danger::GitProgram);
        }
        if let Some(danger) = self.in_bare_repo(path, symlink) {
            return Some(danger);
        }
        if let Some(danger) = self.by_name(path) {
            return Some(danger);
        }
        self.loaded_unnamed(path, kind)
    }

    /// Rule 5: files a host tool loads from where they are, unnamed.
    fn loaded_unnamed(&mut self, path: &RelPath, kind: &Kind) -> Option<Danger> {
        let bytes = path.as_bytes();
        let parent = parent_bytes(bytes);
        let parent_name = &parent[parent.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1)..];
        if matches!(parent_name, b"bin" | b"Scripts") && self.is_venv(parent_bytes(parent)) {
            return Some(Danger::Virtualenv);
        }
        if let Some(at) = path.components().position(|c| c == b".direnv") {
            // direnv's own directory: cached environments it sources
            // (nix-direnv), and the `bin/` of the layouts it activates.
            if at + 2 == path.depth() {
                return Some(Danger::Direnv);
            }
            if parent_name == b"bin" {
                return Some(Danger::OnPath);
            }
        }
        if self.envrc.loaded.iter().any(|l| l == bytes) {
            return Some(Danger::Direnv);
        }
        if self.imported_by_pth(path) {
            return Some(Danger::PythonStartup);
        }
        if self.envrc.path_dirs.iter().any(|d| d == parent) {
            return Some(Danger::OnPath);
        }
        let name = path.file_name();
        if self.envrc.nix
            && (name.ends_with(b".nix") || matches!(name, b"flake.lock" | b"devenv.yaml" | b"devenv.lock"))
        {
            return Some(Danger::Direnv);
        }
        let runnable = match kind {
            Kind::Symlink { .. } => true,
            Kind::File { mode, .. } | Kind::Mode { mode } => executable(*mode),
            _ => false,
        };
        // What the `.envrc` puts on `PATH` is not known: any program may be
        // on it.
        if self.envrc.unknown_path && runnable {
            return Some(if BIN_LIKE.contains(&parent_name) { Danger::OnPath } else { Danger::MaybeOnPath });
        }
        None
    }

    /// Whether `path` is (part of) a module that a `.pth` file on the host
    /// in its site directory imports, which Python then runs at every
    /// start: `name.py`, `name.pyc`, `name.*.so`, the package `name/` and
    /// all in it, and `__pycache__/name.*.pyc`. Staged `.pth` files are
    /// flagged themselves. Only the site directories of judged paths are
    /// read.
    fn imported_by_pth(&mut self, path: &RelPath) -> bool {
        let names: Vec<&[u8]> = path.components().collect();
        for (at, name) in names.iter().enumerate() {
            if !matches!(*name, b"site-packages" | b"dist-packages") || at + 1 >= names.len() {
                continue;
            }
            let rest = &names[at + 1..];
            let module = match rest {
                [file] => module_of(file),
                [b"__pycache__", file] => module_of(file),
                [package, ..] => package,
                [] => continue,
            };
            let site = names[..=at].join(&b'/');
            if self.site_imports(&site).contains(module) {
                return true;
            }
        }
        false
    }

    /// The top-level modules the `.pth` files of site directory `site` on
    /// the host import (read once per directory, bounded).
    fn site_imports(&mut self, site: &[u8]) -> Rc<HashSet<Vec<u8>>> {
        if let Some(known) = self.pth_imports.get(site) {
            return known.clone();
        }
        let mut modules = HashSet::new();
        if let Ok(dir) = RelPath::new(site.to_vec()) {
            let pths = self.host.names(&dir, MAX_SITE_NAMES).into_iter().filter(|n| n.ends_with(b".pth"));
            for name in pths.take(MAX_PTH_FILES) {
                let Ok(file) = dir.join(&name) else { continue };
                if let Ok(Some(text)) = self.host.read(&file, MAX_PTH_BYTES) {
                    modules.extend(pth_imports(&String::from_utf8_lossy(&text)));
                }
            }
            if let Some(other) = self.other {
                let pths = other.names(&dir).into_iter().filter(|n| n.ends_with(b".pth"));
                for name in pths.take(MAX_PTH_FILES) {
                    let Ok(file) = dir.join(&name) else { continue };
                    if let TreeFile::Text(text) = other.read(&file, MAX_PTH_BYTES) {
                        modules.extend(pth_imports(&String::from_utf8_lossy(&text)));
                    }
                }
            }
        }
        let modules = Rc::new(modules);
        self.pth_imports.insert(site.to_vec(), modules.clone());
        modules
    }

    /// Whether `dir` is a Python virtualenv: it holds `pyvenv.cfg` after
    /// the change (in the change set or on the host).
    fn is_venv(&mut self, dir: &[u8]) -> bool {
        if let Some(&known) = self.venvs.get(dir) {
            return known;
        }
        let mut cfg = dir.to_vec();
        if !cfg.is_empty() {
            cfg.push(b'/');
        }
        cfg.extend_from_slice(b"pyvenv.cfg");
        let verdict = self.venv_marks.contains(&cfg)
            || RelPath::new(cfg).is_ok_and(|p| matches!(self.host.state(&p), HostState::File { .. }));
        self.venvs.insert(dir.to_vec(), verdict);
        verdict
    }

    /// Rule 3: the path or one of its directories matches a pattern.
    fn by_name(&mut self, path: &RelPath) -> Option<Danger> {
        let own = builtin()
            .matched(tail(path.as_bytes()), false)
            .or_else(|| self.user.as_ref().and_then(|u| u.matched(path.as_bytes(), false)));
        if own.is_some() {
            return own;
        }
        let parent = path.parent()?;
        self.dir_verdict(parent.as_bytes())
    }

    /// Whether a pattern flags this directory or one above it, each
    /// directory judged once (in tree order the parent is nearly always
    /// known already, so a deep path costs no walk).
    fn dir_verdict(&mut self, dir: &[u8]) -> Option<Danger> {
        if let Some(&known) = self.dir_verdicts.get(dir) {
            return known;
        }
        let (pending, mut above) = unjudged(dir, &self.dir_verdicts);
        for &end in pending.iter().rev() {
            let d = &dir[..end];
            let own = builtin().matched(d, true).or_else(|| self.user.as_ref().and_then(|u| u.matched(d, true)));
            above = above.or(own);
            self.dir_verdicts.insert(d.to_vec(), above);
        }
        above
    }

    /// The aliases that reach into `dir` or a directory above it.
    fn alias_chain(&mut self, dir: &[u8]) -> Rc<Vec<Alias>> {
        if let Some(chain) = self.alias_chains.get(dir) {
            return chain.clone();
        }
        let mut pending = vec![dir.len()];
        let mut chain = Rc::new(self.root_aliases());
        let mut at = dir;
        while !at.is_empty() {
            match at.iter().rposition(|&b| b == b'/') {
                Some(slash) => {
                    at = &at[..slash];
                    if let Some(known) = self.alias_chains.get(at) {
                        chain = known.clone();
                        break;
                    }
                    pending.push(slash);
                }
                None => break,
            }
        }
        for &end in pending.iter().rev() {
            let d = &dir[..end];
            if d.is_empty() {
                continue;
            }
            if let Some(links) = self.aliases.get(d) {
                let mut longer = (*chain).clone();
                longer.extend(links.iter().map(|link| Alias { dir: d.to_vec(), link: link.clone() }));
                chain = Rc::new(longer);
            }
            self.alias_chains.insert(d.to_vec(), chain.clone());
        }
        chain
    }

    fn root_aliases(&self) -> Vec<Alias> {
        self.aliases
            .get(&b""[..])
            .map(|links| links.iter().map(|link| Alias { dir: Vec::new(), link: link.clone() }).collect())
            .unwrap_or_default()
    }

    /// Rule 1 for an embedded bare repository: `path` is its `config`, a
    /// hook or other internals.
    fn in_bare_repo(&mut self, path: &RelPath, symlink: bool) -> Option<Danger> {
        let parts: Vec<&[u8]> = path.components().collect();
        let n = parts.len();
        let bytes = path.as_bytes();
        // The repository is the parent (`x/config`) or the grandparent
        // (`x/hooks/pre-commit`, `x/info/exclude`, `x/objects/info`).
        let mut candidates: Vec<(usize, &[u8])> = Vec::new();
        if git_top(parts[n - 1]) {
            let end = bytes.len() - parts[n - 1].len();
            candidates.push((end, &bytes[end..]));
        }
        if n >= 2 && matches!(parts[n - 2], b"hooks" | b"info" | b"objects") {
            let end = bytes.len() - parts[n - 1].len() - 1 - parts[n - 2].len();
            candidates.push((end, &bytes[end..]));
        }
        for (end, rest) in candidates {
            let dir = if end == 0 { &bytes[..0] } else { &bytes[..end - 1] };
            if self.is_bare(dir) {
                return if symlink { Some(Danger::GitSymlink) } else { git_internal_danger(rest) };
            }
        }
        None
    }

    /// Whether `dir` holds `HEAD`, `objects` and `refs` after the change
    /// (in the change set or on the host).
    fn is_bare(&mut self, dir: &[u8]) -> bool {
        if let Some(&known) = self.bare.get(dir) {
            return known;
        }
        let has = |name: &[u8], this: &Self| {
            let mut full = dir.to_vec();
            if !full.is_empty() {
                full.push(b'/');
            }
            full.extend_from_slice(name);
            if this.repo_marks.contains(&full) {
                return true;
            }
            RelPath::new(full)
                .is_ok_and(|p| !matches!(this.host.state(&p), HostState::Absent | HostState::Unreachable(_)))
        };
        let verdict = has(b"HEAD", self) && has(b"objects", self) && has(b"refs", self);
        self.bare.insert(dir.to_vec(), verdict);
        verdict
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

/// Rule 1 inside a git directory; `rest` is the path below it.
fn git_internal_danger(rest: &[u8]) -> Option<Danger> {
    let parts: Vec<&[u8]> = rest.split(|&b| b == b'/').collect();
    if matches!(parts[0], b"modules" | b"worktrees") && parts.len() >= 3 {
        // A submodule's or worktree's own git directory: its name may hold
        // slashes (or be `objects`), so it ends before the last name that
        // starts a git directory's content; `objects/info` is not one.
        let start =
            (2..parts.len()).rev().find(|&k| git_top(parts[k]) && !(parts[k] == b"info" && parts[k - 1] == b"objects"));
        return match start {
            Some(k) => git_internal_danger(&rest[parts[..k].iter().map(|p| p.len() + 1).sum::<usize>()..]),
            None => Some(Danger::GitInternal),
        };
    }
    match parts[0] {
        b"objects" => match parts.get(1..) {
            Some([b"info", b"alternates" | b"http-alternates"]) => Some(Danger::GitInternal),
            _ => None,
        },
        b"refs" | b"logs" => None,
        b"lfs" if matches!(parts.get(1), Some(&(b"objects" | b"tmp"))) => None,
        b"hooks" if parts.len() == 2 && parts[1].ends_with(b".sample") => None,
        b"hooks" => Some(Danger::GitHook),
        b"config" | b"config.worktree" if parts.len() == 1 => Some(Danger::GitConfig),
        name if parts.len() == 1 && GIT_HARMLESS.contains(&name) => None,
        _ => Some(Danger::GitInternal),
    }
}

/// Where a symlink at `link` with `target` leads, as a workspace path
/// (empty for the root), resolving `.` and `..` by name; `None` when it
/// leaves the workspace.
fn resolve(link: &RelPath, target: &[u8]) -> Option<Vec<u8>> {
    if target.starts_with(b"/") {
        return None;
    }
    let mut parts: Vec<&[u8]> = link.components().collect();
    parts.pop();
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(parts.join(&b'/'))
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

/// Hooks (of `.git/hooks` and the hooks paths) that are symlinks on the
/// host: the workspace files they point to (through further symlinks
/// too), each with its hook. git runs the file a hook links to.
fn hook_targets(host: &Host, workspace: &Path, hooks_paths: &[RelPath]) -> HashMap<Vec<u8>, RelPath> {
    let mut targets = HashMap::new();
    let git_hooks = RelPath::new(&b".git/hooks"[..]).ok();
    for dir in git_hooks.iter().chain(hooks_paths) {
        for name in host.names(dir, MAX_HOOKS) {
            let Ok(hook) = dir.join(&name) else { continue };
            let mut at = hook.clone();
            for _ in 0..MAX_LINK_HOPS {
                let HostState::Symlink { target } = host.state(&at) else { break };
                let Some(next) = link_in_workspace(&at, &target, workspace) else { break };
                targets.insert(next.as_bytes().to_vec(), hook.clone());
                at = next;
            }
        }
    }
    targets
}

/// Hooks listed in one hooks directory at most.
const MAX_HOOKS: usize = 1024;
/// Symlinks followed from one hook.
const MAX_LINK_HOPS: usize = 8;

/// The workspace path a symlink at `link` leads to, an absolute target
/// inside the workspace included.
fn link_in_workspace(link: &RelPath, target: &[u8], workspace: &Path) -> Option<RelPath> {
    let relative = match Path::new(OsStr::from_bytes(target)).strip_prefix(workspace) {
        Ok(rest) => resolve(&RelPath::new(AT_ROOT).ok()?, rest.as_os_str().as_bytes())?,
        Err(_) => resolve(link, target)?,
    };
    RelPath::new(relative).ok()
}

/// Files of one environment read at most (the `.envrc` and what it loads).
pub const MAX_ENVRC_FILES: usize = 16;

/// How much of one file of an environment is read.
const ENVRC_BYTES: u64 = 1 << 20;

/// What the host's `.envrc` at the workspace root loads.
fn host_envrc(host: &Host, workspace: &Path) -> Envrc {
    envrc_of(workspace, |path| match host.state(path) {
        HostState::Absent => TreeFile::Absent,
        HostState::File { .. } => match host.read(path, ENVRC_BYTES) {
            Ok(Some(text)) => TreeFile::Text(text),
            _ => TreeFile::Unreadable,
        },
        // direnv follows a symlinked `.envrc` (or a file it loads), inside
        // the workspace or out of it: so does this read, and only this one.
        HostState::Symlink { .. } | HostState::Unreachable(_) => match host.read_following(path, ENVRC_BYTES) {
            Ok(Some(text)) => TreeFile::Text(text),
            _ => TreeFile::Unreadable,
        },
        _ => TreeFile::Unreadable,
    })
}

/// What the `.envrc` at the root of a tree (files read by `read`) loads,
/// with what the files it sources or loads put on `PATH`. A file that
/// cannot be read leaves `PATH` unknown.
fn envrc_of(workspace: &Path, read: impl Fn(&RelPath) -> TreeFile) -> Envrc {
    let mut envrc = Envrc::default();
    let mut queue = vec![b".envrc".to_vec()];
    let mut seen = HashSet::new();
    while let Some(file) = queue.pop() {
        if seen.len() >= MAX_ENVRC_FILES || !seen.insert(file.clone()) {
            continue;
        }
        let Ok(path) = RelPath::new(file) else { continue };
        let part = match read(&path) {
            TreeFile::Absent => continue,
            TreeFile::Text(text) => Envrc::parse(&String::from_utf8_lossy(&text), workspace),
            TreeFile::Unreadable => Envrc { unknown_path: true, ..Envrc::default() },
        };
        queue.extend(part.loaded.iter().cloned());
        envrc.merge(part);
    }
    envrc
}

/// Bounds on reading a site directory's `.pth` files.
const MAX_SITE_NAMES: usize = 100_000;
const MAX_PTH_FILES: usize = 256;
const MAX_PTH_BYTES: u64 = 64 << 10;

/// The module a file directly in a site directory is: its name up to the
/// first dot (`x.py`, `x.pyc`, `x.cpython-312-x86_64-linux-gnu.so`).
fn module_of(file: &[u8]) -> &[u8] {
    file.split(|&b| b == b'.').next().unwrap_or(file)
}

/// The top-level modules a `.pth` file's code lines import. Python runs a
/// line that starts with `import` followed by a space or tab; in one, each
/// `import a, b.c as d` and `from a import b` statement counts, and so does
/// every quoted name (`__import__('a')`, `importlib.import_module("a")`),
/// since what the code does with a string is not followed.
fn pth_imports(text: &str) -> HashSet<Vec<u8>> {
    let top = |name: &str| name.trim().split('.').next().unwrap_or("").as_bytes().to_vec();
    let is_name = |name: &str| {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    };
    let mut modules = HashSet::new();
    for line in text.lines().filter(|l| l.starts_with("import ") || l.starts_with("import\t")) {
        for statement in line.split(';').map(str::trim) {
            if let Some(names) = statement.strip_prefix("import").filter(|r| r.starts_with([' ', '\t'])) {
                for name in names.split(',') {
                    let name = name.split_whitespace().next().unwrap_or("");
                    if is_name(name) {
                        modules.insert(top(name));
                    }
                }
            } else if let Some(rest) = statement.strip_prefix("from").filter(|r| r.starts_with([' ', '\t'])) {
                let name = rest.split_whitespace().next().unwrap_or("");
                if is_name(name) {
                    modules.insert(top(name));
                }
            }
        }
        for quote in ['\'', '"'] {
            for literal in line.split(quote).skip(1).step_by(2) {
                if is_name(literal) {
                    modules.insert(top(literal));
                }
            }
        }
    }
    modules
}

/// A top-level name: `resolve` from it is relative to the workspace root.
const AT_ROOT: &[u8] = b"-";

/// Gitignore rules read from the host, per directory, on demand. Every
/// directory is judged once, from its parent's verdict, so a deep path
/// costs one lookup, not a walk of its ancestors.
struct Ignores<'h> {
    host: &'h Host,
    /// `.gitignore` of each directory looked at (key: the directory's path
    /// bytes, empty for the root).
    per_dir: HashMap<Vec<u8>, Option<Rc<Gitignore>>>,
    /// Per directory: the `.gitignore` rules of it and its ancestors,
    /// shallowest first, each with its directory's length.
    chains: HashMap<Vec<u8>, RuleChain>,
    /// `.git/info/exclude` and the global excludes, below any `.gitignore`.
    fallback: Vec<Gitignore>,
    /// Per directory: the length of the shallowest ignored path among it
    /// and its ancestors.
    dirs: HashMap<Vec<u8>, Option<usize>>,
}

/// The `.gitignore` rules that apply in a directory, shallowest first, each
/// with the length of its directory's path.
type RuleChain = Rc<Vec<(usize, Rc<Gitignore>)>>;

/// A `.gitignore` larger than this is not read (it is surely not one).
const MAX_IGNORE_FILE: u64 = 4 << 20;

/// The directory part of a path (empty for a top-level name).
fn parent_bytes(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(slash) => &path[..slash],
        None => &path[..0],
    }
}

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
        Ignores { host, per_dir: HashMap::new(), chains: HashMap::new(), fallback, dirs: HashMap::new() }
    }

    /// The shallowest ignored path among `path` and its directories.
    fn ignored_root(&mut self, path: &RelPath, is_dir: bool) -> Option<RelPath> {
        let bytes = path.as_bytes();
        let parent = parent_bytes(bytes);
        let above = if parent.is_empty() { None } else { self.dir_root(parent) };
        let end = match above {
            Some(end) => Some(end),
            None if is_dir => self.dir_root(bytes),
            None => self.judge(bytes, false).then_some(bytes.len()),
        };
        end.and_then(|end| RelPath::new(&bytes[..end]).ok())
    }

    /// The length of the shallowest ignored path among the directory `dir`
    /// and its ancestors. Below an ignored directory nothing is judged (and
    /// no `.gitignore` read): git does not look there either.
    fn dir_root(&mut self, dir: &[u8]) -> Option<usize> {
        if let Some(&known) = self.dirs.get(dir) {
            return known;
        }
        let (pending, mut above) = unjudged(dir, &self.dirs);
        for &end in pending.iter().rev() {
            let verdict = match above {
                Some(root) => Some(root),
                None => self.judge(&dir[..end], true).then_some(end),
            };
            self.dirs.insert(dir[..end].to_vec(), verdict);
            above = verdict;
        }
        above
    }

    /// One path's verdict, ignoring its parents: the deepest `.gitignore`
    /// with a matching rule decides, then the fallbacks.
    fn judge(&mut self, path: &[u8], is_dir: bool) -> bool {
        let chain = self.chain(parent_bytes(path));
        for (len, rules) in chain.iter().rev() {
            let rel = if *len == 0 { path } else { &path[len + 1..] };
            match rules.matched(Path::new(OsStr::from_bytes(rel)), is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
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

    /// The rules of `dir` and its ancestors, shallowest first.
    fn chain(&mut self, dir: &[u8]) -> RuleChain {
        if let Some(chain) = self.chains.get(dir) {
            return chain.clone();
        }
        let mut pending = vec![dir];
        let mut chain = Rc::new(Vec::new());
        let mut at = dir;
        while !at.is_empty() {
            let parent = parent_bytes(at);
            if let Some(known) = self.chains.get(parent) {
                chain = known.clone();
                break;
            }
            pending.push(parent);
            at = parent;
        }
        for &d in pending.iter().rev() {
            if let Some(rules) = self.rules(d) {
                let mut longer = (*chain).clone();
                longer.push((d.len(), rules));
                chain = Rc::new(longer);
            }
            self.chains.insert(d.to_vec(), chain.clone());
        }
        chain
    }

    fn rules(&mut self, dir: &[u8]) -> Option<Rc<Gitignore>> {
        if !self.per_dir.contains_key(dir) {
            let file = if dir.is_empty() {
                RelPath::new(&b".gitignore"[..]).ok()
            } else {
                RelPath::new(dir).ok().and_then(|d| d.join(b".gitignore").ok())
            };
            let rules = file.and_then(|f| load(self.host, &f)).map(Rc::new);
            self.per_dir.insert(dir.to_vec(), rules);
        }
        self.per_dir.get(dir).cloned().flatten()
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

/// For a directory not judged yet: the lengths of it and of its ancestors
/// not in `known`, nearest first, and the verdict of the nearest ancestor
/// that is (the default when none is). Judging them from the far end keeps
/// each directory judged once, so a deep path costs no walk.
fn unjudged<V: Copy + Default>(dir: &[u8], known: &HashMap<Vec<u8>, V>) -> (Vec<usize>, V) {
    let mut pending = vec![dir.len()];
    let mut at = dir;
    while let Some(slash) = at.iter().rposition(|&b| b == b'/') {
        at = &at[..slash];
        if let Some(&verdict) = known.get(at) {
            return (pending, verdict);
        }
        pending.push(slash);
    }
    (pending, V::default())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::protocol::change_set::entry::SymlinkTarget;
    use crate::util::digest::Sha256;

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

    fn link(path: &str, target: &str) -> Entry {
        Entry { path: p(path), kind: Kind::Symlink { target: SymlinkTarget::new(target).unwrap() }, base: Base::Absent }
    }

    fn dir(path: &str) -> Entry {
        Entry { path: p(path), kind: Kind::Dir { mode: Mode::from_raw(0o755) }, base: Base::Absent }
    }

    /// Each entry's judgement, the whole set learned first, against the
    /// host workspace `ws`.
    fn judge_all(ws: &Path, patterns: &[&str], entries: &[Entry]) -> Vec<Option<(Danger, Option<String>)>> {
        let host = Host::open(ws);
        let patterns: Vec<String> = patterns.iter().map(|s| s.to_string()).collect();
        let mut c = Classifier::new(&host, ws, false).with_patterns(&patterns);
        c.learn(entries.iter());
        entries.iter().map(|e| c.judge(e).map(|(d, via)| (d, via.map(|v| v.to_string())))).collect()
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
        let mut c = Classifier::new(&host, tmp.path(), false);
        assert_eq!(c.danger(&dir(".github/workflows")), None, "a new directory runs nothing by itself");
        let gone = Entry { path: p(".envrc"), kind: Kind::Delete, base: Base::Absent };
        assert_eq!(c.danger(&gone), None);
    }

    #[test]
    fn everything_in_git_but_its_history_is_flagged() {
        for path in [
            ".git/info/exclude",
            ".git/info/attributes",
            ".git/info/sparse-checkout",
            ".git/commondir",
            ".git/objects/info/alternates",
            ".git/rebase-merge/git-rebase-todo",
            ".git/sequencer/todo",
            ".git/fsmonitor--daemon.ipc",
            ".git/worktrees/wt/commondir",
            ".git/worktrees/wt/gitdir",
            ".git/modules/vendor/lib/info/exclude",
            ".git/modules/a/b/commondir",
            ".git/modules/x",
        ] {
            assert_eq!(danger_of(path), Some(Danger::GitInternal), "{path}");
        }
        assert_eq!(danger_of(".git/worktrees/wt/config.worktree"), Some(Danger::GitConfig));
        assert_eq!(danger_of(".git/modules/objects/config"), Some(Danger::GitConfig), "a module named objects");
        assert_eq!(danger_of(".git/modules/refs/hooks/pre-commit"), Some(Danger::GitHook), "a module named refs");
        assert_eq!(danger_of(".git/hooks/sub/pre-commit"), Some(Danger::GitHook));
        for path in [
            ".git/objects/ab/cdef0123",
            ".git/objects/pack/pack-1.pack",
            ".git/objects/info/commit-graph",
            ".git/refs/heads/main",
            ".git/refs/heads/info/exclude",
            ".git/logs/HEAD",
            ".git/logs/refs/heads/main",
            ".git/index",
            ".git/HEAD",
            ".git/packed-refs",
            ".git/ORIG_HEAD",
            ".git/FETCH_HEAD",
            ".git/COMMIT_EDITMSG",
            ".git/description",
            ".git/lfs/objects/ab/cd/abcd",
            ".git/modules/vendor/lib/objects/pack/pack-1.idx",
            ".git/modules/vendor/lib/objects/info/commit-graph",
            ".git/modules/vendor/lib/refs/heads/main",
            ".git/modules/vendor/lib/logs/refs/heads/main",
            ".git/modules/vendor/lib/HEAD",
            ".git/worktrees/wt/HEAD",
            ".git/worktrees/wt/index",
            ".git/worktrees/wt/logs/HEAD",
        ] {
            assert_eq!(danger_of(path), None, "{path}");
        }
    }

    #[test]
    fn any_symlink_in_git_is_flagged_and_what_it_makes_a_hook_too() {
        let tmp = tempfile::tempdir().unwrap();
        let set = [
            link(".git/COMMIT_EDITMSG", "/home/user/.bashrc"),
            link(".git/refs/heads/main", "../../../notes"),
            link(".git/hooks", "../tools/git"),
            dir("tools"),
            dir("tools/git"),
            file("tools/git/pre-commit", 0o755),
            file("tools/git/README", 0o644),
            file("tools/other", 0o755),
            link("sub/.git", "../elsewhere"),
        ];
        let judged = judge_all(tmp.path(), &[], &set);
        assert_eq!(judged[0], Some((Danger::GitSymlink, None)));
        assert_eq!(judged[1], Some((Danger::GitSymlink, None)));
        assert_eq!(judged[2], Some((Danger::GitSymlink, None)));
        assert_eq!(judged[3], None);
        assert_eq!(judged[5], Some((Danger::Reached, Some(".git/hooks/pre-commit".into()))));
        assert_eq!(judged[6], Some((Danger::Reached, Some(".git/hooks/README".into()))), "git runs any hook name");
        assert_eq!(judged[7], None);
        assert_eq!(judged[8], Some((Danger::GitLink, None)));
    }

    #[test]
    fn a_symlinked_parent_of_a_flagged_path_is_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        let set = [
            link(".cargo", "ci/cargo"),
            file("ci/cargo/config.toml", 0o644),
            file("ci/cargo/notes.md", 0o644),
            link(".vscode", "editor"),
            file("editor/tasks.json", 0o644),
            link("web/.github", "../gh"),
            file("gh/workflows/deploy.yml", 0o644),
            link("docs", "src"),
            file("src/.envrc-not", 0o644),
        ];
        let judged = judge_all(tmp.path(), &[], &set);
        assert_eq!(judged[0], Some((Danger::SymlinkedLocation, None)));
        assert_eq!(judged[1], Some((Danger::Reached, Some(".cargo/config.toml".into()))));
        assert_eq!(judged[2], None);
        assert_eq!(judged[3], Some((Danger::SymlinkedLocation, None)));
        assert_eq!(judged[4], Some((Danger::Reached, Some(".vscode/tasks.json".into()))));
        assert_eq!(judged[5], Some((Danger::SymlinkedLocation, None)));
        assert_eq!(judged[6], Some((Danger::Reached, Some("web/.github/workflows/deploy.yml".into()))));
        assert_eq!(judged[7], None, "an ordinary symlink is not flagged");
        assert_eq!(judged[8], None);

        // The symlink already on the host counts too.
        fs::create_dir_all(tmp.path().join("ci/cargo")).unwrap();
        std::os::unix::fs::symlink("ci/cargo", tmp.path().join(".cargo")).unwrap();
        let judged = judge_all(tmp.path(), &[], &[file("ci/cargo/config.toml", 0o644)]);
        assert_eq!(judged[0], Some((Danger::Reached, Some(".cargo/config.toml".into()))));
        // Unless the change set replaces it.
        let gone = Entry { path: p(".cargo"), kind: Kind::Delete, base: Base::Absent };
        let judged = judge_all(tmp.path(), &[], &[gone, file("ci/cargo/config.toml", 0o644)]);
        assert_eq!(judged[1], None);
    }

    #[test]
    fn an_embedded_bare_repository_is_judged_like_a_git_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let set = [
            dir("x"),
            file("x/HEAD", 0o644),
            file("x/config", 0o644),
            dir("x/objects"),
            file("x/objects/ab/cdef", 0o444),
            dir("x/refs"),
            file("x/refs/heads/main", 0o644),
            file("x/hooks/post-checkout", 0o755),
            file("x/hooks/update.sample", 0o755),
            file("x/info/exclude", 0o644),
            file("y/config", 0o644),
        ];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &[], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        assert_eq!(judged[2], Some(Danger::GitConfig));
        assert_eq!(judged[4], None);
        assert_eq!(judged[6], None);
        assert_eq!(judged[7], Some(Danger::GitHook));
        assert_eq!(judged[8], None);
        assert_eq!(judged[9], Some(Danger::GitInternal));
        assert_eq!(judged[10], None, "not a repository: no HEAD, objects, refs");

        // A bare repository already on the host.
        for d in ["fixtures/repo.git/objects", "fixtures/repo.git/refs"] {
            fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        fs::write(tmp.path().join("fixtures/repo.git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let judged = judge_all(
            tmp.path(),
            &[],
            &[file("fixtures/repo.git/hooks/pre-receive", 0o755), link("fixtures/repo.git/hooks", "/tmp/h")],
        );
        assert_eq!(judged[0], Some((Danger::GitHook, None)));
        assert_eq!(judged[1], Some((Danger::GitSymlink, None)));
    }

    #[test]
    fn the_host_configs_includes_and_fsmonitor_are_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join(".git")).unwrap();
        let config = format!(
            "[include]\n\tpath = ../shared.gitconfig\n[includeIf \"gitdir:~/w/\"]\n\tpath = {}/more.gitconfig\n\
             [core]\n\tfsmonitor = tools/fsmon --fast\n",
            tmp.path().display()
        );
        fs::write(tmp.path().join(".git/config"), config).unwrap();
        let set = [file("shared.gitconfig", 0o644), file("more.gitconfig", 0o644), file("tools/fsmon", 0o755)];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &[], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        assert_eq!(judged, [Some(Danger::GitConfig), Some(Danger::GitConfig), Some(Danger::GitProgram)]);
    }

    /// Programs named by settings git runs as commands, in `.git/config`
    /// and in the files it includes (whatever their condition), and the
    /// hooks path an included file sets.
    #[test]
    fn what_the_host_config_and_its_includes_run_is_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join(".git")).unwrap();
        fs::write(
            tmp.path().join(".git/config"),
            "[filter \"lfs2\"]\n\tclean = ./tools/clean.sh %f\n[includeIf \"onbranch:main\"]\n\tpath = ../.gitconfig\n\
             [alias]\n\tst = status\n\tfix = !sh scripts/fix.sh\n[diff \"nb\"]\n\ttextconv = python3 nbconv.py\n",
        )
        .unwrap();
        fs::write(
            tmp.path().join(".gitconfig"),
            "[core]\n\thooksPath = .githooks\n\teditor = ./dev/edit\n[credential]\n\thelper = !tools/cred\n",
        )
        .unwrap();
        let set = [
            file("tools/clean.sh", 0o755),
            file("scripts/fix.sh", 0o644),
            file("nbconv.py", 0o644),
            file("dev/edit", 0o755),
            file("tools/cred", 0o755),
            file(".githooks/pre-push", 0o755),
            file(".gitconfig", 0o644),
            file("status", 0o644),
            file("tools/other.sh", 0o755),
        ];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &[], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        let program = Some(Danger::GitProgram);
        assert_eq!(
            judged,
            [program, program, program, program, program, Some(Danger::GitHook), Some(Danger::GitConfig), None, None]
        );
    }

    /// A hook on the host that is a symlink into the project (`ln -s
    /// ../../scripts/pre-commit .git/hooks/pre-commit`), directly or
    /// through another symlink, or by an absolute path: git runs the file
    /// it points to.
    #[test]
    fn what_a_hook_symlink_points_to_is_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        fs::create_dir_all(ws.join("scripts")).unwrap();
        std::os::unix::fs::symlink("../../scripts/pre-commit", ws.join(".git/hooks/pre-commit")).unwrap();
        std::os::unix::fs::symlink("real-push", ws.join("scripts/pre-push")).unwrap();
        std::os::unix::fs::symlink("../../scripts/pre-push", ws.join(".git/hooks/pre-push")).unwrap();
        std::os::unix::fs::symlink(ws.join("scripts/merge"), ws.join(".git/hooks/post-merge")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/true", ws.join(".git/hooks/post-checkout")).unwrap();
        let set = [
            file("scripts/pre-commit", 0o755),
            file("scripts/real-push", 0o755),
            file("scripts/merge", 0o755),
            file("scripts/other", 0o755),
        ];
        let judged = judge_all(ws, &[], &set);
        let via = |hook: &str| Some((Danger::Reached, Some(hook.to_string())));
        assert_eq!(
            judged,
            [via(".git/hooks/pre-commit"), via(".git/hooks/pre-push"), via(".git/hooks/post-merge"), None]
        );
    }

    #[test]
    fn tool_files_and_the_users_own_patterns_are_flagged() {
        for (path, danger) in [
            (".bazelrc", Danger::ToolConfig),
            (".bazelversion", Danger::ToolConfig),
            ("sub/.bazelrc", Danger::ToolConfig),
            ("mise.toml", Danger::Direnv),
            ("mise.local.toml", Danger::Direnv),
            (".mise.local.toml", Danger::Direnv),
            ("mise.dev.toml", Danger::Direnv),
            (".config/mise.toml", Danger::Direnv),
            (".config/mise/config.toml", Danger::Direnv),
            (".mise/tasks/build", Danger::Direnv),
            (".tool-versions", Danger::Direnv),
            (".envrc.local", Danger::Direnv),
            ("lefthook.yml", Danger::PreCommit),
            ("app.code-workspace", Danger::Editor),
            (".cursor/mcp.json", Danger::AgentConfig),
        ] {
            assert_eq!(danger_of(path), Some(danger), "{path}");
        }
        assert_eq!(danger_of(".config/other.toml"), None);
        assert_eq!(danger_of("mise.rs"), None);

        let tmp = tempfile::tempdir().unwrap();
        let set = [file("tools/release.sh", 0o755), file("src/tools/x.sh", 0o755), file("Makefile.local", 0o644)];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &["tools/*.sh", "Makefile.*"], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        assert_eq!(judged, [Some(Danger::UserListed), None, Some(Danger::UserListed)]);
        assert!(check_pattern("!keep").is_err() && check_pattern("  ").is_err() && check_pattern("a/**").is_ok());
    }

    #[test]
    fn files_host_tools_load_unnamed_are_flagged() {
        for (path, danger) in [
            (".venv/lib/python3.12/site-packages/x.pth", Danger::PythonStartup),
            ("env/lib/python3/dist-packages/y.pth", Danger::PythonStartup),
            ("sitecustomize.py", Danger::PythonStartup),
            (".venv/lib/python3.12/site-packages/usercustomize.py", Danger::PythonStartup),
            ("lib/sitecustomize/__init__.py", Danger::PythonStartup),
            (".venv/pyvenv.cfg", Danger::Virtualenv),
            ("env/etc/conda/activate.d/x.sh", Danger::Virtualenv),
            ("node_modules/.hooks/preinstall", Danger::ToolConfig),
            (".env", Danger::EnvFile),
            (".env.local", Danger::EnvFile),
            ("web/.env.production", Danger::EnvFile),
            (".direnv/flake-profile-a1.rc", Danger::Direnv),
            ("sub/.direnv/ruby/bin/rake", Danger::OnPath),
        ] {
            assert_eq!(danger_of(path), Some(danger), "{path}");
        }
        for path in [
            "models/net.pth",
            "checkpoints/site-packages.pth",
            ".venv/lib/python3.12/site-packages/pkg/__init__.py",
            ".direnv/python-3.12/lib/python3.12/site-packages/pkg/mod.py",
            "src/env.rs",
            "bin/git",
            "node_modules/.bin/ls",
        ] {
            assert_eq!(danger_of(path), None, "{path}");
        }
        assert_eq!(danger_of(".envrc"), Some(Danger::Direnv));

        // A virtualenv is known by its pyvenv.cfg, staged or on the host.
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("py")).unwrap();
        fs::write(tmp.path().join("py/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        let set = [
            file("env/pyvenv.cfg", 0o644),
            file("env/bin/activate", 0o644),
            file("py/Scripts/python.exe", 0o755),
            link("py/bin/python", "/tmp/evil"),
            file("other/bin/tool", 0o755),
        ];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &[], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        assert_eq!(judged, [Some(Danger::Virtualenv); 4].into_iter().chain([None]).collect::<Vec<_>>());
    }

    #[test]
    fn what_the_hosts_envrc_puts_on_path_or_loads_is_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join(".envrc"), "PATH_add bin\nuse flake\nsource_env scripts/env.sh\ndotenv\n").unwrap();
        fs::create_dir_all(tmp.path().join("scripts")).unwrap();
        fs::write(tmp.path().join("scripts/env.sh"), "PATH_add .local/bin\n").unwrap();
        fs::write(tmp.path().join(".env"), "FOO=1\nPATH=./dev:$PATH\n").unwrap();
        let set = [
            file("bin/git", 0o755),
            file("bin/notes.txt", 0o644),
            link("bin/ls", "../x"),
            file("sub/bin/git", 0o755),
            file("flake.nix", 0o644),
            file("nix/shell.nix", 0o644),
            file("flake.lock", 0o644),
            file("scripts/env.sh", 0o644),
            file("scripts/other.sh", 0o644),
            file("src/main.rs", 0o644),
            file(".local/bin/cargo", 0o755),
            file("dev/make", 0o755),
        ];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &[], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        let on_path = Some(Danger::OnPath);
        let direnv = Some(Danger::Direnv);
        let expected = [on_path, on_path, on_path, None, direnv, direnv, direnv, direnv, None, None, on_path, on_path];
        assert_eq!(judged, expected, "what the files it loads put on PATH counts too");

        // One it cannot read: every new executable, wherever it is.
        fs::write(tmp.path().join(".envrc"), "eval \"$(tool env)\"\n").unwrap();
        let set = [file("scripts/x", 0o755), file("scripts/x.txt", 0o644), file("src/x", 0o755), file("bin/y", 0o700)];
        let judged: Vec<Option<Danger>> =
            judge_all(tmp.path(), &[], &set).into_iter().map(|j| j.map(|(d, _)| d)).collect();
        assert_eq!(judged, [on_path, None, Some(Danger::MaybeOnPath), on_path]);
        // Nor one that is a symlink.
        fs::remove_file(tmp.path().join(".envrc")).unwrap();
        std::os::unix::fs::symlink("elsewhere", tmp.path().join(".envrc")).unwrap();
        assert_eq!(judge_all(tmp.path(), &[], &[file("tools/z", 0o755)])[0], Some((Danger::OnPath, None)));
        // Without an .envrc, a bin/ is ordinary.
        fs::remove_file(tmp.path().join(".envrc")).unwrap();
        assert_eq!(judge_all(tmp.path(), &[], &[file("bin/git", 0o755)])[0], None);
    }

    #[test]
    fn every_file_of_an_agents_settings_runs_code() {
        let tmp = tempfile::tempdir().unwrap();
        let host = Host::open(tmp.path());
        let mut c = Classifier::new(&host, tmp.path(), false).agent_settings(true);
        assert_eq!(c.danger(&file(".claude/CLAUDE.md", 0o600)), Some(Danger::AgentSettings));
        assert_eq!(c.danger(&file(".codex/prompts/p.md", 0o600)), Some(Danger::AgentSettings));
        assert_eq!(c.danger(&file(".claude/settings.json", 0o600)), Some(Danger::AgentConfig), "the closer reason");
        assert_eq!(c.danger(&dir(".claude/skills")), None);
    }

    #[test]
    fn built_in_patterns_see_at_most_the_last_names() {
        for (pattern, _) in FLAGGED {
            let names = pattern.trim_end_matches('/').split('/').filter(|n| *n != "**").count();
            let floating = !pattern.trim_end_matches('/').contains('/') || pattern.starts_with("**/");
            assert!(floating && names <= BUILTIN_DEPTH, "{pattern} would need the whole path");
        }
        assert_eq!(tail(b"a/b/c/d/e"), b"c/d/e");
        assert_eq!(tail(b"d/e"), b"d/e");
        assert_eq!(danger_of(&format!("{}.github/workflows/ci.yml", "x/".repeat(1000))), Some(Danger::Ci));
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
        let mut c = Classifier::new(&host, tmp.path(), false);
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

    /// Attack: Python imports `sitecustomize` (and `usercustomize`) under
    /// any name its importers accept, not only `.py`: a sourceless
    /// `sitecustomize.pyc` or an extension module in a virtualenv's
    /// site-packages runs at every start of that environment's Python,
    /// as `sitecustomize.py` does, and lands under `--apply all`.
    #[test]
    fn sitecustomize_in_any_importable_form_is_flagged() {
        for path in [
            ".venv/lib/python3.12/site-packages/sitecustomize.pyc",
            ".venv/lib/python3.12/site-packages/sitecustomize.cpython-312-x86_64-linux-gnu.so",
            ".venv/lib/python3.12/site-packages/sitecustomize.abi3.so",
            ".venv/lib/python3.12/site-packages/usercustomize.pyc",
        ] {
            assert_eq!(danger_of(path), Some(Danger::PythonStartup), "{path}");
        }
    }

    /// Attack: a `.pth` line that imports a module runs that module at every
    /// Python start. Virtualenvs made by `virtualenv` (tox, hatch, poetry,
    /// pipenv) hold `_virtualenv.pth` = `import _virtualenv`, and any with
    /// setuptools holds `distutils-precedence.pth`, which imports
    /// `_distutils_hack`. The guest leaves the `.pth` alone and rewrites the
    /// module it imports: it runs at every start of that Python (an editor
    /// asks the interpreter for its environment when the folder opens), yet
    /// it is not flagged.
    #[test]
    fn a_module_an_unchanged_pth_imports_is_flagged() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        let site = ws.join(".venv/lib/python3.12/site-packages");
        fs::create_dir_all(site.join("_distutils_hack")).unwrap();
        fs::write(ws.join(".venv/pyvenv.cfg"), "home = /usr/bin\nversion = 3.12.1\n").unwrap();
        fs::write(site.join("_virtualenv.pth"), "import _virtualenv\n").unwrap();
        fs::write(site.join("_virtualenv.py"), "# patches distutils\n").unwrap();
        fs::write(
            site.join("distutils-precedence.pth"),
            "import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == 'local'; \
             enabled and __import__('_distutils_hack').add_shim(); \n",
        )
        .unwrap();
        fs::write(site.join("_distutils_hack/__init__.py"), "# shim\n").unwrap();
        let entries = [
            file(".venv/lib/python3.12/site-packages/_virtualenv.py", 0o644),
            file(".venv/lib/python3.12/site-packages/_distutils_hack/__init__.py", 0o644),
        ];
        let judged = judge_all(ws, &[], &entries);
        for (entry, verdict) in entries.iter().zip(&judged) {
            assert!(verdict.is_some(), "{} runs at every Python start, unflagged", entry.path);
        }
    }

    /// Attack: coding agents other than the listed ones run commands from
    /// the project too: Cursor's project hooks (`.cursor/hooks.json`, run
    /// on `sessionStart`, `beforeShellExecution`, ...), opencode's
    /// `opencode.json` (local MCP servers, formatters) and the plugins it
    /// loads from `.opencode/plugin/` at start. Same shape as
    /// `.claude/settings.json`, not flagged.
    #[test]
    fn other_coding_agents_settings_that_run_commands_are_flagged() {
        for path in [".cursor/hooks.json", "opencode.json", ".opencode/plugin/init.ts"] {
            assert_eq!(danger_of(path), Some(Danger::AgentConfig), "{path}");
        }
    }

    #[test]
    fn pth_code_lines_name_the_modules_they_import() {
        let text = "# comment\n../src\nimport a, b.c as d;from e.f import g\n\
                    import os; __import__('h').x(); importlib.import_module(\"i.j\")\n\
                    x = 'not-code'\nimportlib\n";
        let mut got: Vec<String> = pth_imports(text).iter().map(|m| String::from_utf8_lossy(m).into()).collect();
        got.sort();
        assert_eq!(got, ["a", "b", "e", "h", "i", "os"]);
        assert_eq!(module_of(b"x.cpython-312-x86_64-linux-gnu.so"), b"x");
    }

    #[test]
    fn other_agents_instructions_and_unimported_modules_stay_unflagged() {
        for path in
            ["AGENTS.md", ".cursor/rules/style.mdc", ".opencode/command/go.md", ".github/copilot-instructions.md"]
        {
            assert_eq!(danger_of(path), None, "{path}");
        }
        for path in [".kiro/hooks/x.kiro.hook", ".gemini/extensions/e/gemini-extension.json", ".aider.conf.yml"] {
            assert_eq!(danger_of(path), Some(Danger::AgentConfig), "{path}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("venv/lib/python3.12/site-packages");
        fs::create_dir_all(&site).unwrap();
        fs::write(site.join("a.pth"), "import hooked\n/plain/dir\n").unwrap();
        let entries = [
            file("venv/lib/python3.12/site-packages/hooked.cpython-312-x86_64-linux-gnu.so", 0o755),
            file("venv/lib/python3.12/site-packages/__pycache__/hooked.cpython-312.pyc", 0o644),
            file("venv/lib/python3.12/site-packages/other.py", 0o644),
            file("venv/lib/python3.12/site-packages/dir/hooked.py", 0o644),
        ];
        let judged: Vec<bool> = judge_all(tmp.path(), &[], &entries).iter().map(Option::is_some).collect();
        assert_eq!(judged, [true, true, false, false]);
    }
}
