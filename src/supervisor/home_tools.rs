//! The user's home toolchains in the guest: the directories on `PATH` that
//! lie under the home directory, and the install trees their programs
//! resolve into, shared read-only at their own paths. Nothing else of the
//! home directory is: caches and credentials beside those trees
//! (`~/.cargo/registry`, `~/.cargo/credentials.toml`, `~/.npmrc`) stay out,
//! and the credential files a tree itself may hold are hidden by the file
//! server.
//!
//! What counts as an install tree, by layout:
//! - a `bin` whose parent holds `lib/node_modules`: an npm prefix or an nvm
//!   version (`~/.nvm/versions/node/v22/bin`), shared whole;
//! - a version manager's `shims` or `bin` beside `versions/` (pyenv, rbenv,
//!   nodenv), shared whole;
//! - a `rustup` program on PATH: `$RUSTUP_HOME` (default `~/.rustup`);
//! - a symlinked program (`~/.local/bin/claude`): the nearest ancestor of
//!   its target that is a package (`node_modules/<pkg>`, a Python venv), or
//!   else the target's own directory when it is deep enough not to be a
//!   general one like `~/.local/share`.

use std::collections::{BTreeSet, HashMap};
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
];

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

/// The home toolchains of a `PATH`. `skip` are trees already in the guest
/// some other way (the workspace, policy mounts): nothing at or under them
/// is shared again. `getenv` reads RUSTUP_HOME and the like.
pub fn discover(path_var: &str, home: &Path, skip: &[PathBuf], getenv: impl Fn(&str) -> Option<String>) -> HomeTools {
    let Ok(home) = home.canonicalize() else { return HomeTools::default() };
    let mut found = Finder { home: &home, dirs: Vec::new() };
    for entry in std::env::split_paths(path_var) {
        let Ok(dir) = entry.canonicalize() else { continue };
        if !found.shareable(&dir) || !dir.is_dir() {
            continue;
        }
        let shown = display(&home, &dir);
        found.add(dir.clone(), format!("{shown} is on PATH"));
        if let Some(root) = package_prefix(&dir) {
            found.add(root, format!("the install tree of {shown}"));
        }
        if dir.join("rustup").is_file() {
            let rustup_home = getenv("RUSTUP_HOME").map(PathBuf::from).unwrap_or_else(|| home.join(".rustup"));
            if let Ok(rustup_home) = rustup_home.canonicalize() {
                found.add(rustup_home, format!("rustup's toolchains, for {shown}/rustup"));
            }
        }
        found.symlinked_programs(&dir, &shown);
    }
    let mut dirs = found.dirs;
    dirs.retain(|d| !skip.iter().any(|s| d.path.starts_with(s)));
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
    dirs: Vec<HomeDir>,
}

impl Finder<'_> {
    /// Under the home directory, not the home directory itself, and
    /// neither a credential directory nor a tree holding one.
    fn shareable(&self, dir: &Path) -> bool {
        let Ok(rel) = dir.strip_prefix(self.home) else { return false };
        if rel.as_os_str().is_empty() {
            return false;
        }
        !NEVER.iter().any(|n| rel.starts_with(n) || Path::new(n).starts_with(rel))
    }

    fn add(&mut self, path: PathBuf, why: String) {
        if self.shareable(&path) && !self.dirs.iter().any(|d| d.path == path) {
            self.dirs.push(HomeDir { path, why });
        }
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
            let target = resolved.entry(dir.join(link)).or_insert_with_key(|p| p.canonicalize().ok());
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
                self.add(tree, format!("the install tree of {shown}/{program}"));
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
/// host's PATH has it: the full path.
pub fn locate(program: &str, path_var: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return None;
    }
    std::env::split_paths(path_var).map(|d| d.join(program)).find(|p| {
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

    fn path_of(dirs: &[PathBuf]) -> String {
        std::env::join_paths(dirs).unwrap().into_string().unwrap()
    }

    #[test]
    fn shares_path_dirs_and_the_trees_their_programs_live_in() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        // Claude Code's native installer.
        let local_bin = mk(&home, ".local/bin");
        let claude = touch(&home, ".local/share/claude/versions/2.0.1");
        symlink(&claude, local_bin.join("claude")).unwrap();
        // An npm global in a home prefix.
        let codex_pkg = mk(&home, ".npm-global/lib/node_modules/@openai/codex");
        touch(&codex_pkg, "package.json");
        touch(&codex_pkg, "bin/codex.js");
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
        let black = touch(&venv, "bin/black");
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
        let tools = discover(&path, &home, &[], |_| None);
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
        symlink(touch(&home, "tool.sh"), local_bin.join("tool")).unwrap();
        symlink(touch(&home, ".local/share/x"), local_bin.join("x")).unwrap();
        let work_bin = mk(&home, "src/project/.venv/bin");
        let tools = discover(&path_of(&[ssh_bin, local_bin, work_bin]), &home, &[home.join("src/project")], |_| None);
        assert_eq!(rels(&home, &tools), ["~/.local/bin"]);
    }

    #[test]
    fn rustup_home_comes_from_the_variable() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        let bin = mk(&home, "tools/cargo/bin");
        touch(&bin, "rustup");
        let custom = mk(&home, "tools/rustup");
        let tools = discover(&path_of(&[bin]), &home, &[], |v| {
            (v == "RUSTUP_HOME").then(|| custom.to_string_lossy().into_owned())
        });
        assert_eq!(rels(&home, &tools), ["~/tools/cargo/bin", "~/tools/rustup"]);
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
        assert_eq!(locate("tool", &path_of(&[a, b])), Some(exe));
        assert_eq!(locate("./tool", "/usr/bin"), None);
    }
}
