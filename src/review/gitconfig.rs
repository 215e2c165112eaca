//! What the host's git configuration for the workspace's repository makes
//! git run from the workspace: its hooks directories (`core.hooksPath`),
//! the config files it includes, and the programs its settings name as
//! commands (filter and diff drivers, `!` aliases, editors, pagers,
//! credential helpers, ...).
//!
//! The files are read here, never through git: `git config` would itself
//! read whatever an include names (a FIFO blocks it). Reading is
//! conservative where git's answer depends on the moment: every
//! `includeIf` is followed whatever its condition, and every value a key
//! ever takes counts, not only the last.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use crate::protocol::change_set::path::RelPath;

use crate::changes::Host;

/// Config files read at most (git's own include depth is 10).
const MAX_FILES: usize = 32;
/// How much of one config file is read.
const MAX_BYTES: u64 = 1 << 20;

/// One `section.subsection.key = value` of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Lowercase.
    pub section: String,
    /// As written (git compares it case-sensitively).
    pub subsection: Option<String>,
    /// Lowercase.
    pub key: String,
    /// `None`: the key alone, a boolean true.
    pub value: Option<String>,
}

/// What the configuration points at inside the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitRuns {
    /// Every `core.hooksPath` inside the workspace.
    pub hooks_paths: Vec<RelPath>,
    /// Config files it includes that lie in the workspace.
    pub includes: Vec<RelPath>,
    /// Workspace files its settings run as commands.
    pub programs: Vec<RelPath>,
}

/// Where a config file is.
enum Place {
    Workspace(RelPath),
    Outside(PathBuf),
}

impl GitRuns {
    /// Reads the system's and the user's config files and `.git/config`
    /// of `workspace`, with what they include.
    pub fn read(host: &Host, workspace: &Path) -> GitRuns {
        let mut files = vec![PathBuf::from("/etc/gitconfig")];
        if let Some(home) = home() {
            let xdg = std::env::var_os("XDG_CONFIG_HOME").map_or_else(|| home.join(".config"), PathBuf::from);
            files.push(xdg.join("git/config"));
            files.push(home.join(".gitconfig"));
        }
        files.push(workspace.join(".git/config"));
        let mut runs = GitRuns::default();
        let mut queue: Vec<PathBuf> = files.into_iter().rev().collect();
        let mut read = 0;
        while let Some(file) = queue.pop() {
            if read >= MAX_FILES {
                break;
            }
            read += 1;
            let place = place_of(&file, workspace);
            let text = match &place {
                Place::Workspace(path) => host.read(path, MAX_BYTES).ok().flatten(),
                Place::Outside(path) => read_outside(path),
            };
            let Some(text) = text else { continue };
            let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
            let mut included = Vec::new();
            for setting in parse(&String::from_utf8_lossy(&text)) {
                let Some(value) = setting.value.as_deref() else { continue };
                if setting.key == "path" && matches!(setting.section.as_str(), "include" | "includeif") {
                    let Some(target) = expand(value, &dir) else { continue };
                    if let Place::Workspace(rel) = place_of(&target, workspace) {
                        runs.includes.push(rel);
                    }
                    included.push(target);
                } else if setting.section == "core" && setting.subsection.is_none() && setting.key == "hookspath" {
                    if let Some(Place::Workspace(rel)) = expand(value, workspace).map(|p| place_of(&p, workspace)) {
                        runs.hooks_paths.push(rel);
                    }
                } else if runs_a_command(&setting) {
                    runs.programs.extend(programs_named(value, workspace));
                }
            }
            // Included files are read where they are included, before the
            // rest of the queue.
            queue.extend(included.into_iter().rev());
        }
        runs
    }
}

/// Whether git runs the value of this setting as a command (through the
/// shell or by its path).
fn runs_a_command(s: &Setting) -> bool {
    let sub = s.subsection.is_some();
    let key = s.key.as_str();
    match s.section.as_str() {
        "filter" => sub && matches!(key, "clean" | "smudge" | "process"),
        "diff" => (sub && matches!(key, "textconv" | "command")) || (!sub && key == "external"),
        "merge" => sub && key == "driver",
        "alias" => s.value.as_deref().is_some_and(|v| v.trim_start().starts_with('!')),
        "core" => matches!(
            key,
            "sshcommand" | "pager" | "editor" | "askpass" | "fsmonitor" | "gitproxy" | "alternaterefscommand"
        ),
        "sequence" => key == "editor",
        "credential" => key == "helper",
        "gpg" => matches!(key, "program" | "defaultkeycommand"),
        "pager" | "difftool" | "mergetool" | "guitool" | "browser" | "man" | "trailer" => true,
        "interactive" => key == "difffilter",
        "remote" => matches!(key, "uploadpack" | "receivepack"),
        "sendemail" => matches!(key, "sendmailcmd" | "smtpserver"),
        "submodule" => key == "update",
        "uploadpack" => key == "packobjectshook",
        "lfs" => key == "path",
        "instaweb" => key == "httpd",
        _ => false,
    }
}

/// The workspace files a command value names: each word that is a path
/// (holds a `/`), and each later word that looks like a file name (holds
/// a `.`: `python3 strip.py`). The first bare word is looked up on `PATH`.
/// Relative paths are taken from the workspace root, where git runs them.
fn programs_named(value: &str, workspace: &Path) -> Vec<RelPath> {
    let value = value.trim_start().trim_start_matches('!');
    let separators = |c: char| c.is_whitespace() || "'\"`;&|()<>{}=".contains(c);
    let mut found = Vec::new();
    for (n, word) in value.split(separators).filter(|w| !w.is_empty()).enumerate() {
        if word.starts_with('-') || word.contains('$') || word.contains("://") {
            continue;
        }
        if !(word.contains('/') || (n > 0 && word.contains('.') && !word.trim_matches('.').is_empty())) {
            continue;
        }
        if let Some(Place::Workspace(rel)) = expand(word, workspace).map(|p| place_of(&p, workspace)) {
            found.push(rel);
        }
    }
    found
}

/// A path as git expands it: `~/` from the home directory, relative ones
/// from `base`.
fn expand(value: &str, base: &Path) -> Option<PathBuf> {
    if value.is_empty() {
        return None;
    }
    if let Some(rest) = value.strip_prefix("~/") {
        return Some(home()?.join(rest));
    }
    if value.starts_with('~') {
        // Another user's home is not the workspace.
        return None;
    }
    Some(base.join(value))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

/// Whether `path` (`.` and `..` resolved by name) is in the workspace.
fn place_of(path: &Path, workspace: &Path) -> Place {
    let normal = normalize(path);
    match normal.strip_prefix(normalize(workspace)) {
        Ok(rest) if !rest.as_os_str().is_empty() => match RelPath::new(rest.as_os_str().as_bytes()) {
            Ok(rel) => Place::Workspace(rel),
            Err(_) => Place::Outside(normal),
        },
        _ => Place::Outside(normal),
    }
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A regular file outside the workspace, bounded; opened without blocking
/// so that a FIFO or device named by an include is not waited on.
fn read_outside(path: &Path) -> Option<Vec<u8>> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The settings of git config text, in order: `[section]`,
/// `[section "sub"]` and `[section.sub]` headers, a setting after a header
/// on its line, quoted values with git's escapes, `\` continuing a line,
/// `#` and `;` comments.
pub fn parse(text: &str) -> Vec<Setting> {
    let mut settings = Vec::new();
    let mut section = String::new();
    let mut subsection: Option<String> = None;
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&c) = chars.peek() else { break };
        if c == '#' || c == ';' {
            while chars.next_if(|&c| c != '\n').is_some() {}
            continue;
        }
        if c == '[' {
            chars.next();
            let mut name = String::new();
            while let Some(c) = chars.next_if(|&c| !matches!(c, ']' | '"' | '\n') && !c.is_whitespace()) {
                name.push(c);
            }
            while chars.next_if(|&c| c == ' ' || c == '\t').is_some() {}
            subsection = None;
            if chars.next_if_eq(&'"').is_some() {
                let mut sub = String::new();
                while let Some(c) = chars.next_if(|&c| c != '"' && c != '\n') {
                    if c == '\\' {
                        sub.extend(chars.next_if(|&c| c != '\n'));
                    } else {
                        sub.push(c);
                    }
                }
                chars.next_if_eq(&'"');
                subsection = Some(sub);
            }
            while chars.next_if(|&c| c != ']' && c != '\n').is_some() {}
            chars.next_if_eq(&']');
            match name.split_once('.') {
                Some((sec, sub)) if subsection.is_none() => {
                    section = sec.to_ascii_lowercase();
                    subsection = Some(sub.to_ascii_lowercase());
                }
                _ => section = name.to_ascii_lowercase(),
            }
            continue;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|&c| c.is_ascii_alphanumeric() || c == '-') {
            key.push(c.to_ascii_lowercase());
        }
        while chars.next_if(|&c| c == ' ' || c == '\t').is_some() {}
        if key.is_empty() {
            // Not a setting: skip the line.
            while chars.next_if(|&c| c != '\n').is_some() {}
            continue;
        }
        let value = if chars.next_if_eq(&'=').is_some() { Some(value(&mut chars)) } else { None };
        settings.push(Setting { section: section.clone(), subsection: subsection.clone(), key, value });
    }
    settings
}

/// A value up to its line's end: quotes kept out, escapes read, blanks
/// outside quotes trimmed at the ends.
fn value(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut out = String::new();
    let mut quoted = false;
    // Length of `out` up to its last character that is not a trailing
    // blank outside quotes.
    let mut kept = 0;
    while chars.next_if(|&c| c == ' ' || c == '\t').is_some() {}
    while let Some(c) = chars.next_if(|&c| c != '\n') {
        match c {
            '"' => quoted = !quoted,
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('b') => out.push('\u{8}'),
                Some(other) => out.push(other),
            },
            '#' | ';' if !quoted => {
                while chars.next_if(|&c| c != '\n').is_some() {}
                break;
            }
            c if !quoted && (c == ' ' || c == '\t') => {
                out.push(c);
                continue;
            }
            c => out.push(c),
        }
        kept = out.len();
    }
    out.truncate(kept);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(section: &str, sub: Option<&str>, key: &str, value: Option<&str>) -> Setting {
        Setting {
            section: section.into(),
            subsection: sub.map(Into::into),
            key: key.into(),
            value: value.map(Into::into),
        }
    }

    #[test]
    fn parses_config_text_as_git_does() {
        let text = "# top\n[Core] HooksPath = \".git hooks\" ; why\n\tbare\n[filter \"Str\\\"ip\"]\n\
                    clean = ./tools/strip.sh %f  # trailing\n[alias]\n\tx = \"!sh -c 'a;b'\" \\\n  more\n\
                    [Branch.Main]\n\tremote = origin\n";
        assert_eq!(
            parse(text),
            [
                s("core", None, "hookspath", Some(".git hooks")),
                s("core", None, "bare", None),
                s("filter", Some("Str\"ip"), "clean", Some("./tools/strip.sh %f")),
                s("alias", None, "x", Some("!sh -c 'a;b'   more")),
                s("branch", Some("main"), "remote", Some("origin")),
            ]
        );
    }

    #[test]
    fn names_the_workspace_files_a_command_runs() {
        let ws = Path::new("/w");
        let named = |v: &str| -> Vec<String> { programs_named(v, ws).iter().map(ToString::to_string).collect() };
        assert_eq!(named("./tools/strip.sh %f"), ["tools/strip.sh"]);
        assert_eq!(named("!f() { bin/x \"$1\"; }; f"), ["bin/x"]);
        assert_eq!(named("python3 strip.py --in=%f"), ["strip.py"]);
        assert_eq!(named("/w/scripts/editor --wait"), ["scripts/editor"]);
        assert!(named("less -R").is_empty());
        assert!(named("/usr/bin/vim").is_empty());
        assert!(named("../outside/x").is_empty());
        assert!(named("store --file=$HOME/.creds").is_empty());
    }
}
