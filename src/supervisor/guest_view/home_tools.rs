//! The user's home toolchains in the guest: the directories on `PATH` that
//! lie under the home directory, and the install trees their programs
//! resolve into, shared read-only at their own paths. Nothing else of the
//! home directory is: caches and credentials beside those trees
//! (`~/.cargo/registry`, `~/.cargo/credentials.toml`, `~/.npmrc`) stay out,
//! and the credential files a tree itself may hold are hidden by the file
//! server.
//!
//! Only what the user installed is followed. A relative or empty `PATH`
//! entry means the guest's working directory, the workspace, and is never
//! followed on the host; a `PATH` entry or program link whose way, resolved
//! one name at a time, runs through a tree the repository or a guest writes
//! (the workspace, `rw` mounts, stockade's own data) is not followed
//! either, since there the repository decides where a name leads. And
//! whatever the way, settings and application data (`~/.config`,
//! `~/.local/share`, `~/.cache`, browser profiles) are never shared but for
//! the toolchain layouts known to live there.
//!
//! What counts as an install tree, by layout:
//! - a `bin` whose parent holds `lib/node_modules`: an npm prefix or an nvm
//!   version (`~/.nvm/versions/node/v22/bin`), shared whole, or its
//!   `lib/node_modules` when the prefix holds more (`~/.local`);
//! - a version manager's `shims` or `bin` beside `versions/` (pyenv, rbenv,
//!   nodenv), shared whole;
//! - a `rustup` program on PATH: `$RUSTUP_HOME` (default `~/.rustup`);
//! - a symlinked program (`~/.local/bin/claude`), when its target is an
//!   executable file: the nearest ancestor of the target that is a package
//!   (`node_modules/<pkg>`, a Python venv), or else the target's own
//!   directory when it is deep enough not to be a general one like
//!   `~/.local/share`.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

/// Variables home toolchains read to find themselves; passed when set.
pub const TOOL_VARS: &[&str] = &[
    "RUSTUP_HOME",
    "CARGO_HOME",
    "RUSTUP_TOOLCHAIN",
    "NVM_DIR",
    "NVM_BIN",
    "NVM_INC",
    "PYENV_ROOT",
    "PYENV_VERSION",
    "RBENV_ROOT",
    "NODENV_ROOT",
    "GOPATH",
    "GOROOT",
    "GOBIN",
    "PNPM_HOME",
    "BUN_INSTALL",
    "VOLTA_HOME",
    "DENO_INSTALL",
];

/// Directories of the home directory never shared by this, nor any tree
/// holding them: where credentials live.
const NEVER: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".password-store",
    ".config/gcloud",
    ".config/gh",
    ".local/share/keyrings",
    ".claude",
    ".codex",
    ".gemini",
    ".terraform.d",
    ".vault-token",
    ".git-credentials",
    ".netrc",
];

/// Where applications keep settings and data, not programs: nothing in
/// them is shared but the layouts of [`TOOLCHAIN_AREAS`], and no tree
/// holding one is.
const PRIVATE: &[&str] =
    &[".config", ".local/share", ".local/state", ".cache", ".mozilla", ".thunderbird", ".pki", ".var", "snap"];

/// Toolchain layouts inside [`PRIVATE`] areas: the installers that put
/// programs there.
const TOOLCHAIN_AREAS: &[&str] = &[
    ".local/share/claude/versions",
    ".local/share/pipx/venvs",
    ".local/share/uv/tools",
    ".local/share/uv/python",
    ".local/share/pnpm",
    ".local/share/fnm",
    ".local/share/mise",
    ".local/share/gem",
    ".config/nvm/versions",
    ".config/yarn/global",
    ".config/composer/vendor",
];

/// stockade's own directories at their usual places: the guest writes
/// some of them (an agent's state), so they are never shared nor walked
/// through, wherever `Bounds::untrusted` says the data lives this time.
const OWN: &[&str] = &[".local/share/stockade", ".cache/stockade", ".config/stockade"];

/// The most symlinks one path may pass, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// Files inside a shared tree that may hold registry tokens: the tree is
/// shared around them.
const SECRET_FILES: &[&str] = &["etc/npmrc", ".npmrc", "credentials", "credentials.toml", ".pypirc", ".netrc"];

/// The most entries of one PATH directory looked at for symlinks: a huge
/// `bin` costs a bounded amount.
const MAX_ENTRIES: usize = 4096;

/// One directory to share, and why, for `run -v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeDir {
    pub path: PathBuf,
    pub why: String,
}

/// What to share.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HomeTools {
    pub dirs: Vec<HomeDir>,
}

/// The trees discovery keeps clear of, besides the home directory's own
/// credential and data directories.
#[derive(Debug, Default, Clone)]
pub struct Bounds {
    /// Already in the guest some other way (the workspace, policy mounts):
    /// nothing at or under them is shared again.
    pub shared: Vec<PathBuf>,
    /// Written by the repository or a guest (the workspace, `rw` mounts,
    /// stockade's data and cache): no way through them is followed, and no
    /// tree at, under or holding one is shared.
    pub untrusted: Vec<PathBuf>,
}

/// The home toolchains of a `PATH`, within `bounds`. `getenv` reads
/// RUSTUP_HOME and the like.
pub fn discover(path_var: &str, home: &Path, bounds: &Bounds, getenv: impl Fn(&str) -> Option<String>) -> HomeTools {
    let Ok(home) = home.canonicalize() else { return HomeTools::default() };
    let own = OWN.iter().map(|o| home.join(o));
    let untrusted: Vec<PathBuf> =
        bounds.untrusted.iter().cloned().chain(own).filter_map(|u| u.canonicalize().ok()).collect();
    let mut found = Finder { home: &home, untrusted: &untrusted, dirs: Vec::new() };
    for entry in std::env::split_paths(path_var) {
        // A relative entry names a directory of wherever the guest stands.
        if !entry.is_absolute() {
            continue;
        }
        let Some(dir) = found.resolve(&entry) else { continue };
        if !found.shareable(&dir) || !dir.is_dir() {
            continue;
        }
        let shown = display(&home, &dir);
        found.add(&dir, format!("{shown} is on PATH"));
        if let Some(root) = package_prefix(&dir) {
            let why = format!("the install tree of {shown}");
            // A prefix that holds more than programs (`~/.local`) gives
            // its packages only.
            if !found.add(&root, why.clone()) && root.join("lib/node_modules").is_dir() {
                found.add(&root.join("lib/node_modules"), why);
            }
        }
        if dir.join("rustup").is_file() {
            let rustup_home = getenv("RUSTUP_HOME").map(PathBuf::from).unwrap_or_else(|| home.join(".rustup"));
            if rustup_home.is_absolute() {
                found.add(&rustup_home, format!("rustup's toolchains, for {shown}/rustup"));
            }
        }
        found.symlinked_programs(&dir, &shown);
    }
    let shared: Vec<PathBuf> = bounds.shared.iter().map(|s| s.canonicalize().unwrap_or_else(|_| s.clone())).collect();
    let mut dirs = found.dirs;
    dirs.retain(|d| !shared.iter().any(|s| d.path.starts_with(s)));
    // Sorted, a tree comes before what lies inside it.
    dirs.sort_by(|a, b| a.path.cmp(&b.path));
    let mut kept: Vec<HomeDir> = Vec::new();
    for dir in dirs {
        if !kept.iter().any(|k| dir.path.starts_with(&k.path)) {
            kept.push(dir);
        }
    }
    let mut dirs = Vec::new();
    for dir in kept {
        let secrets: Vec<PathBuf> = SECRET_FILES
            .iter()
            .map(|f| dir.path.join(f))
            .filter(|p| p.symlink_metadata().is_ok_and(|m| m.is_file()))
            .collect();
        if secrets.is_empty() {
            dirs.push(dir);
        } else {
            around(&dir, &secrets, &mut dirs);
        }
    }
    HomeTools { dirs }
}

/// Shares the subdirectories of `dir` that hold none of `secrets`, and
/// recurses into those that do: the file server can then never reach a
/// secret, whatever the guest asks. Plain files beside a secret stay out.
fn around(dir: &HomeDir, secrets: &[PathBuf], out: &mut Vec<HomeDir>) {
    let Ok(entries) = fs::read_dir(&dir.path) else { return };
    let mut children: Vec<PathBuf> =
        entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect();
    children.sort();
    for child in children {
        let sub = HomeDir { path: child.clone(), why: dir.why.clone() };
        if secrets.iter().any(|s| s.starts_with(&child)) {
            around(&sub, secrets, out);
        } else {
            out.push(sub);
        }
    }
}

struct Finder<'a> {
    home: &'a Path,
    /// Canonical.
    untrusted: &'a [PathBuf],
    dirs: Vec<HomeDir>,
}

impl Finder<'_> {
    /// Where the absolute `path` leads, resolved one name at a time as the
    /// kernel does: None when it does not exist, loops, or its way enters
    /// an untrusted tree, where the repository or a guest picks what the
    /// next name means. Canonical when Some.
    fn resolve(&self, path: &Path) -> Option<PathBuf> {
        let mut at = PathBuf::from("/");
        let mut todo: Vec<OsString> = Vec::new();
        let push = |todo: &mut Vec<OsString>, path: &Path| {
            todo.extend(path.components().rev().map(|c| c.as_os_str().to_owned()));
        };
        push(&mut todo, path);
        let mut links = 0;
        while let Some(name) = todo.pop() {
            match name.to_str() {
                Some("/") => at = PathBuf::from("/"),
                Some(".") => {}
                Some("..") => {
                    at.pop();
                }
                _ => {
                    let next = at.join(&name);
                    let meta = fs::symlink_metadata(&next).ok()?;
                    if meta.file_type().is_symlink() {
                        links += 1;
                        if links > MAX_LINKS {
                            return None;
                        }
                        push(&mut todo, &fs::read_link(&next).ok()?);
                    } else if meta.is_dir() || todo.is_empty() {
                        at = next;
                    } else {
                        return None;
                    }
                }
            }
            if self.untrusted.iter().any(|u| at.starts_with(u)) {
                return None;
            }
        }
        Some(at)
    }

    /// Canonical `dir` is under the home directory, not the home itself;
    /// neither a credential directory, nor stockade's or the repository's,
    /// nor a tree holding one; and in a settings or data area only as a
    /// known toolchain layout.
    fn shareable(&self, dir: &Path) -> bool {
        let Ok(rel) = dir.strip_prefix(self.home) else { return false };
        if rel.as_os_str().is_empty() {
            return false;
        }
        let at_in_or_holding = |n: &Path| rel.starts_with(n) || n.starts_with(rel);
        if NEVER.iter().any(|n| at_in_or_holding(Path::new(n)))
            || self.untrusted.iter().any(|u| dir.starts_with(u) || u.starts_with(dir))
            || PRIVATE.iter().any(|p| Path::new(p).starts_with(rel))
        {
            return false;
        }
        !PRIVATE.iter().any(|p| rel.starts_with(p)) || TOOLCHAIN_AREAS.iter().any(|t| rel.starts_with(t))
    }

    /// Shares `path` when it resolves to a shareable directory; whether it
    /// does.
    fn add(&mut self, path: &Path, why: String) -> bool {
        let Some(path) = self.resolve(path) else { return false };
        if !self.shareable(&path) || !path.is_dir() {
            return false;
        }
        if !self.dirs.iter().any(|d| d.path == path) {
            self.dirs.push(HomeDir { path, why });
        }
        true
    }

    /// Programs in `dir` that are links into another tree of the home
    /// directory bring that tree along.
    fn symlinked_programs(&mut self, dir: &Path, shown: &str) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        let mut trees = BTreeSet::new();
        // Many programs link to one file (rustup's proxies all to rustup):
        // each link target is resolved once. `dir` is canonical already.
        let mut resolved: HashMap<PathBuf, Option<PathBuf>> = HashMap::new();
        for entry in entries.flatten().take(MAX_ENTRIES) {
            if !entry.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            let Ok(link) = fs::read_link(entry.path()) else { continue };
            let target =
                resolved.entry(dir.join(link)).or_insert_with_key(|p| self.resolve(p).filter(|t| is_program(t)));
            let Some(target) = target.clone() else { continue };
            if target.starts_with(dir) || !target.starts_with(self.home) {
                continue;
            }
            if let Some(tree) = self.install_tree(&target) {
                trees.insert((tree, entry.file_name().to_string_lossy().into_owned()));
            }
        }
        let mut seen = BTreeSet::new();
        for (tree, program) in trees {
            if seen.insert(tree.clone()) {
                self.add(&tree, format!("the install tree of {shown}/{program}"));
            }
        }
    }

    /// The tree a program's real file needs: its package, or its directory.
    fn install_tree(&self, target: &Path) -> Option<PathBuf> {
        let parent = target.parent()?;
        for dir in parent.ancestors().take_while(|a| *a != self.home) {
            if dir.join("pyvenv.cfg").is_file() || is_node_package(dir) {
                return Some(dir.to_path_buf());
            }
        }
        // Two levels below home at least: ~/.local/share/claude/versions
        // is a program's own, ~/.local/share is everybody's.
        let depth = parent.strip_prefix(self.home).ok()?.components().count();
        (depth >= 3).then(|| parent.to_path_buf())
    }
}

/// An executable regular file: what an installed program is, and what a
/// cookie jar or a key is not.
fn is_program(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `<prefix>/bin` of an npm prefix or nvm version, or the root of a
/// version manager whose `shims` or `bin` this is.
fn package_prefix(dir: &Path) -> Option<PathBuf> {
    let name = dir.file_name()?.to_str()?;
    let parent = dir.parent()?;
    if name == "bin" && parent.join("lib/node_modules").is_dir() {
        return Some(parent.to_path_buf());
    }
    if matches!(name, "bin" | "shims") && parent.join("versions").is_dir() && parent.join("shims").is_dir() {
        return Some(parent.to_path_buf());
    }
    None
}

/// A directory right inside `node_modules` (or `node_modules/@scope`)
/// with a package.json.
fn is_node_package(dir: &Path) -> bool {
    if !dir.join("package.json").is_file() {
        return false;
    }
    let Some(parent) = dir.parent() else { return false };
    let named = |p: &Path, n: &str| p.file_name().is_some_and(|f| f == n);
    named(parent, "node_modules")
        || (parent.file_name().is_some_and(|f| f.to_string_lossy().starts_with('@'))
            && parent.parent().is_some_and(|g| named(g, "node_modules")))
}

/// `~/x` for people.
pub fn display(home: &Path, path: &Path) -> String {
    match path.strip_prefix(home) {
        Ok(rel) if rel.as_os_str().is_empty() => "~".into(),
        Ok(rel) => format!("~/{}", rel.display()),
        Err(_) => path.display().to_string(),
    }
}

/// Where a program the guest could not find lives on the host, when the
/// host's PATH has it: the full path. Relative entries, which name the
/// workspace's directories, are not looked in: a hint never suggests sharing
/// where the repository's links lead.
pub fn locate(program: &str, path_var: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return None;
    }
    std::env::split_paths(path_var).filter(|d| d.is_absolute()).map(|d| d.join(program)).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What to say when the guest did not find `program` but the host has it.
pub fn not_found_hint(program: &str, host_path: &str, home: &Path, home_tools: bool) -> Option<String> {
    let found = locate(program, host_path)?;
    let real = found.canonicalize().unwrap_or_else(|_| found.clone());
    let shown = display(home, &found);
    if real.starts_with(home) && !home_tools {
        return Some(format!(
            "{program} is {shown} on this host, in your home directory: the guest gets your home toolchains \
             unless --no-home-tools or `home_tools = false` in the config file turns them off"
        ));
    }
    let dir = real.parent().unwrap_or(&real);
    Some(format!(
        "{program} is {shown} on this host, which the guest does not see: share its install tree read-only with \
         a policy file holding [mounts] \"{}\" = \"ro\" (and --policy FILE)",
        display(home, dir)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mk(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }

    fn touch(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, "x").unwrap();
        p
    }

    fn rels(home: &Path, tools: &HomeTools) -> Vec<String> {
        tools.dirs.iter().map(|d| display(home, &d.path)).collect()
    }

    /// The bounds of a run in `workspace`.
    fn repository(workspace: &Path) -> Bounds {
        Bounds { shared: vec![workspace.to_path_buf()], untrusted: vec![workspace.to_path_buf()] }
    }

    fn path_of(dirs: &[PathBuf]) -> String {
        std::env::join_paths(dirs).unwrap().into_string().unwrap()
    }

    #[test]
    fn shares_path_dirs_and_the_trees_their_programs_live_in() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        // Claude Code's native installer.
        let local_bin = mk(&home, ".local/bin");
        let claude = program(&home, ".local/share/claude/versions/2.0.1");
        symlink(&claude, local_bin.join("claude")).unwrap();
        // An npm global in a home prefix.
        let codex_pkg = mk(&home, ".npm-global/lib/node_modules/@openai/codex");
        touch(&codex_pkg, "package.json");
        program(&codex_pkg, "bin/codex.js");
        symlink("../lib/node_modules/@openai/codex/bin/codex.js", mk(&home, ".npm-global/bin").join("codex")).unwrap();
        touch(&home, ".npm-global/etc/npmrc");
        // nvm.
        let nvm_bin = mk(&home, ".nvm/versions/node/v22.1.0/bin");
        mk(&home, ".nvm/versions/node/v22.1.0/lib/node_modules/npm");
        // rustup.
        let cargo_bin = mk(&home, ".cargo/bin");
        touch(&cargo_bin, "rustup");
        mk(&home, ".rustup/toolchains");
        touch(&home, ".cargo/credentials.toml");
        // A pipx venv.
        let venv = mk(&home, ".local/share/pipx/venvs/black");
        touch(&venv, "pyvenv.cfg");
        let black = program(&venv, "bin/black");
        symlink(&black, local_bin.join("black")).unwrap();
        // pyenv.
        let shims = mk(&home, ".pyenv/shims");
        mk(&home, ".pyenv/versions/3.12.1");
        let path = path_of(&[
            local_bin,
            home.join(".npm-global/bin"),
            nvm_bin,
            cargo_bin,
            shims,
            PathBuf::from("/usr/bin"),
            home.clone(),
            home.join("missing/bin"),
        ]);
        let tools = discover(&path, &home, &Bounds::default(), |_| None);
        // The prefix with an npmrc is shared around its etc/.
        assert_eq!(
            rels(&home, &tools),
            [
                "~/.cargo/bin",
                "~/.local/bin",
                "~/.local/share/claude/versions",
                "~/.local/share/pipx/venvs/black",
                "~/.npm-global/bin",
                "~/.npm-global/lib",
                "~/.nvm/versions/node/v22.1.0",
                "~/.pyenv",
                "~/.rustup",
            ]
        );
    }

    #[test]
    fn credential_dirs_the_home_itself_and_skipped_trees_are_never_shared() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let ssh_bin = mk(&home, ".ssh/bin");
        let local_bin = mk(&home, ".local/bin");
        // A link to a file right in the home directory or a shallow tree.
        symlink(program(&home, "tool.sh"), local_bin.join("tool")).unwrap();
        symlink(program(&home, "tools/x"), local_bin.join("x")).unwrap();
        let work_bin = mk(&home, "src/project/.venv/bin");
        let bounds = Bounds { shared: vec![home.join("src/project")], untrusted: Vec::new() };
        let tools = discover(&path_of(&[ssh_bin, local_bin, work_bin]), &home, &bounds, |_| None);
        assert_eq!(rels(&home, &tools), ["~/.local/bin"]);
    }

    #[test]
    fn rustup_home_comes_from_the_variable() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let bin = mk(&home, "tools/cargo/bin");
        touch(&bin, "rustup");
        let custom = mk(&home, "tools/rustup");
        let tools = discover(&path_of(&[bin]), &home, &Bounds::default(), |v| {
            (v == "RUSTUP_HOME").then(|| custom.to_string_lossy().into_owned())
        });
        assert_eq!(rels(&home, &tools), ["~/tools/cargo/bin", "~/tools/rustup"]);
    }

    /// An executable file, as an installed program is.
    fn program(root: &Path, rel: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = touch(root, rel);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// `target` as a PATH entry relative to this process's directory.
    fn relative_to_cwd(target: &Path) -> PathBuf {
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        let mut rel = PathBuf::new();
        for _ in cwd.components().skip(1) {
            rel.push("..");
        }
        rel.join(target.strip_prefix("/").unwrap())
    }

    /// A repository on PATH (direnv's PATH_add, a node_modules/.bin) links
    /// into a browser profile: nothing of the home comes along, whether the
    /// link is a program, the PATH directory itself, or a `..` walk out.
    #[test]
    fn a_workspace_dir_on_path_brings_nothing_of_the_home_along() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let profile = mk(&home, ".config/somebrowser/Default");
        let cookies = program(&profile, "Cookies");
        let elsewhere = mk(&home, "notes/private/deep");
        let notes = program(&elsewhere, "diary");
        let outside = tempfile::tempdir().unwrap();
        for workspace in [home.join("src/proj"), outside.path().canonicalize().unwrap()] {
            let bin = mk(&workspace, "bin");
            symlink(&cookies, bin.join("cookies")).unwrap();
            symlink(&notes, bin.join("notes")).unwrap();
            let modules = mk(&workspace, "node_modules/.bin");
            symlink(&profile, workspace.join("profile")).unwrap();
            symlink(&elsewhere, workspace.join("deep")).unwrap();
            touch(&bin, "rustup");
            mk(&home, ".rustup");
            let path = path_of(&[
                bin.clone(),
                modules,
                workspace.join("profile"),
                workspace.join("deep"),
                workspace.join("bin/../../../notes/private/deep"),
                workspace.join("node_modules/../profile"),
            ]);
            let tools = discover(&path, &home, &repository(&workspace), |_| None);
            assert_eq!(rels(&home, &tools), Vec::<String>::new(), "workspace {}", workspace.display());
        }
    }

    /// Relative and empty PATH entries mean the current directory, which in
    /// the guest is the workspace: they are never followed on the host.
    #[test]
    fn relative_and_empty_path_entries_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let tools_bin = mk(&home, "tools/x/bin");
        program(&tools_bin, "tool");
        let path = format!("::.:{}:bin", relative_to_cwd(&tools_bin).display());
        let tools = discover(&path, &home, &Bounds::default(), |_| None);
        assert_eq!(rels(&home, &tools), Vec::<String>::new());
    }

    /// The user's own PATH directory with links into settings, data,
    /// stockade's own files or credentials: the directory is shared, what
    /// the links reach is not.
    #[test]
    fn links_from_a_users_path_dir_into_settings_data_or_credentials_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let local_bin = mk(&home, ".local/bin");
        for (name, target) in [
            ("browser", ".config/somebrowser/Default/run"),
            ("x", ".config/x/bin/x"),
            ("agent", ".local/share/stockade/agents/claude/home/.local/bin/claude"),
            ("cache", ".cache/stockade/templates/abc/init"),
            ("mine", ".config/stockade/hooks/run"),
            ("app", ".local/share/someapp/data/run"),
            ("state", ".local/state/someapp/x/run"),
            ("firefox", ".mozilla/firefox/abc.default/run"),
            ("ssh", ".ssh/keys/dir/run"),
            ("aws", ".aws/cli/cache/run"),
        ] {
            symlink(program(&home, target), local_bin.join(name)).unwrap();
        }
        // A link to something that is no program.
        symlink(touch(&home, "notes/private/deep/diary"), local_bin.join("diary")).unwrap();
        // A PATH directory that is itself a link into settings.
        symlink(mk(&home, ".config/evil"), home.join("bin")).unwrap();
        let path = path_of(&[local_bin, home.join("bin"), home.join(".local/bin/../../.config/evil")]);
        let tools = discover(&path, &home, &Bounds::default(), |_| None);
        assert_eq!(rels(&home, &tools), ["~/.local/bin"]);
    }

    /// A `rw` mount is the guest's to write: a link whose way runs through
    /// it is not followed, even to a tree that would do.
    #[test]
    fn a_link_through_a_guest_writable_mount_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let local_bin = mk(&home, ".local/bin");
        let mount = mk(&home, "shared");
        symlink(program(&home, "tools/some/where/run"), mount.join("run")).unwrap();
        symlink(mount.join("run"), local_bin.join("run")).unwrap();
        let bounds = Bounds { shared: vec![mount.clone()], untrusted: vec![mount] };
        let tools = discover(&path_of(&[local_bin]), &home, &bounds, |_| None);
        assert_eq!(rels(&home, &tools), ["~/.local/bin"]);
    }

    /// `~/.local` as an npm prefix holds settings and data too: its
    /// packages are shared, not the prefix; uv's tools and Claude's native
    /// install beside them still are.
    #[test]
    fn a_home_local_prefix_shares_its_packages_and_the_known_layouts_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let local_bin = mk(&home, ".local/bin");
        let pkg = mk(&home, ".local/lib/node_modules/tsc");
        touch(&pkg, "package.json");
        program(&pkg, "bin/tsc");
        symlink("../lib/node_modules/tsc/bin/tsc", local_bin.join("tsc")).unwrap();
        let ruff = mk(&home, ".local/share/uv/tools/ruff");
        touch(&ruff, "pyvenv.cfg");
        symlink(program(&ruff, "bin/ruff"), local_bin.join("ruff")).unwrap();
        symlink(program(&home, ".local/share/claude/versions/2.1.0"), local_bin.join("claude")).unwrap();
        touch(&home, ".local/share/keyrings/login.keyring");
        let tools = discover(&path_of(&[local_bin]), &home, &Bounds::default(), |_| None);
        assert_eq!(
            rels(&home, &tools),
            [
                "~/.local/bin",
                "~/.local/lib/node_modules",
                "~/.local/share/claude/versions",
                "~/.local/share/uv/tools/ruff"
            ]
        );
    }

    /// A link the user made whose route runs through the workspace (`npm
    /// link` of the project) is the repository's to point: not followed.
    #[test]
    fn a_users_link_through_the_workspace_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let workspace = mk(&home, "src/proj");
        let npm_bin = mk(&home, ".npm-global/bin");
        mk(&home, ".npm-global/lib/node_modules");
        symlink(&workspace, home.join(".npm-global/lib/node_modules/proj")).unwrap();
        symlink("../lib/node_modules/proj/cli.js", npm_bin.join("proj")).unwrap();
        symlink(program(&home, "tools/private/deep/run"), workspace.join("cli.js")).unwrap();
        let tools = discover(&path_of(&[npm_bin]), &home, &repository(&workspace), |_| None);
        assert_eq!(rels(&home, &tools), ["~/.npm-global"]);
    }

    #[test]
    fn locate_finds_executables_only() {
        let tmp = tempfile::tempdir().unwrap();
        let a = mk(tmp.path(), "a");
        let b = mk(tmp.path(), "b");
        touch(&a, "tool");
        let exe = touch(&b, "tool");
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(locate("tool", &path_of(&[a, b.clone()])), Some(exe));
        assert_eq!(locate("./tool", "/usr/bin"), None);
        assert_eq!(locate("tool", &relative_to_cwd(&b).to_string_lossy()), None);
    }
}
