//! What a workspace's `.envrc` makes direnv load when the user enters the
//! directory: the workspace directories it puts on `PATH` (their programs
//! then run in place of commands of the same name: a `bin/git`), the files
//! it sources or loads, and whether it builds a nix shell (whose `.nix`
//! files then run too).
//!
//! The file is shell, so it is read conservatively: a line that may change
//! `PATH` in a way not understood here (a variable, `eval`, a command's
//! output, a file it cannot name) sets `unknown_path`, and the caller then
//! flags every new or changed executable in the workspace instead. Files it sources or loads are read the same way by the caller.

use std::path::Path;

/// What one `.envrc` loads from the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envrc {
    /// Directories on `PATH`, relative to the workspace root (empty: the
    /// root itself).
    pub path_dirs: Vec<Vec<u8>>,
    /// Files it sources or loads (`source_env`, `dotenv`, `.`).
    pub loaded: Vec<Vec<u8>>,
    /// `use nix`, `use flake`, `use devenv`: the nix files run on entry.
    pub nix: bool,
    /// Some line may add to `PATH` in a way not understood.
    pub unknown_path: bool,
}

/// Shell words after which a command starts.
const KEYWORDS: &[&str] = &["then", "else", "do", "{", "(", "!", "if", "while", "until", "elif"];

/// A `layout` whose directories the other rules cover already: python
/// virtualenvs (by their `pyvenv.cfg`) and `.direnv/`.
const COVERED_LAYOUTS: &[&str] =
    &["python", "python2", "python3", "pipenv", "poetry", "pyenv", "anaconda", "uv", "ruby", "perl", "julia", "php"];

impl Envrc {
    /// Reads the `.envrc` at the root of `workspace`.
    pub fn parse(text: &str, workspace: &Path) -> Envrc {
        let mut envrc = Envrc::default();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            // A continued line is read with its continuation.
            let mut line = line.to_string();
            while line.ends_with('\\') {
                line.pop();
                match lines.next() {
                    Some(next) => line.push_str(next),
                    None => break,
                }
            }
            for command in commands(&line) {
                envrc.command(&command, workspace);
            }
        }
        envrc
    }

    /// Adds what another file of the same environment loads.
    pub fn merge(&mut self, other: Envrc) {
        self.path_dirs.extend(other.path_dirs);
        self.loaded.extend(other.loaded);
        self.nix |= other.nix;
        self.unknown_path |= other.unknown_path;
    }

    fn command(&mut self, words: &[Word], workspace: &Path) {
        // `then PATH_add bin`: the command after a keyword.
        let start = words.iter().position(|w| !KEYWORDS.contains(&w.text.as_str())).unwrap_or(words.len());
        let words = &words[start..];
        let Some(first) = words.first() else { return };
        let args = &words[1..];
        match first.text.as_str() {
            "PATH_add" => self.add_dirs(args, workspace),
            "MANPATH_add" => {}
            "path_add" => match args.first() {
                Some(var) if var.text == "PATH" => self.add_dirs(&args[1..], workspace),
                Some(var) if !var.dynamic => {}
                _ => self.unknown_path = true,
            },
            "layout" => match args.first().map(|a| a.text.as_str()) {
                Some("node") => self.path_dirs.push(b"node_modules/.bin".to_vec()),
                Some("go") => self.path_dirs.push(b"bin".to_vec()),
                Some(name) if COVERED_LAYOUTS.contains(&name) => {}
                _ => self.unknown_path = true,
            },
            "use" => {
                if args.first().is_some_and(|a| matches!(a.text.as_str(), "nix" | "flake" | "devenv")) {
                    self.nix = true;
                }
            }
            // What a loaded file puts on PATH is read from it by the caller.
            "dotenv" | "dotenv_if_exists" => match args.first() {
                Some(file) => self.load(file, workspace),
                None => self.loaded.push(b".env".to_vec()),
            },
            "source_env" | "source_env_if_exists" | "source" | "." => {
                if let Some(file) = args.first() {
                    self.load(file, workspace);
                }
            }
            "export" | "local" | "declare" | "typeset" | "readonly" => {
                for arg in args {
                    self.assignment(arg, workspace);
                }
            }
            _ if first.text.contains('=') => self.assignment(first, workspace),
            _ => {
                let adds = |w: &Word| w.dynamic || mentions_path(&w.text) || w.text.eq_ignore_ascii_case("path_add");
                if words.iter().any(adds) || first.text == "eval" {
                    self.unknown_path = true;
                }
            }
        }
    }

    fn add_dirs(&mut self, args: &[Word], workspace: &Path) {
        for arg in args {
            match inside(arg, workspace) {
                Place::Inside(dir) => self.path_dirs.push(dir),
                Place::Outside => {}
                Place::Unknown => self.unknown_path = true,
            }
        }
    }

    fn load(&mut self, file: &Word, workspace: &Path) {
        match inside(file, workspace) {
            Place::Inside(path) if !path.is_empty() => self.loaded.push(path),
            Place::Unknown => self.unknown_path = true,
            _ => {}
        }
    }

    /// `PATH=a:$PATH` and the like; other variables are left alone.
    fn assignment(&mut self, word: &Word, workspace: &Path) {
        let Some((name, value)) = word.text.split_once('=') else { return };
        let name = name.trim_end_matches('+');
        if name != "PATH" {
            if word.dynamic && mentions_path(value) {
                self.unknown_path = true;
            }
            return;
        }
        if word.text.contains("+=") {
            self.unknown_path = true;
            return;
        }
        for part in value.split(':') {
            if matches!(part, "$PATH" | "${PATH}" | "") {
                continue;
            }
            let piece = Word { text: part.to_string(), dynamic: false };
            match inside(&piece, workspace) {
                Place::Inside(dir) => self.path_dirs.push(dir),
                Place::Outside => {}
                Place::Unknown => self.unknown_path = true,
            }
        }
    }
}

/// Whether text names `PATH` (the variable, not `GOPATH` or `MANPATH`).
fn mentions_path(text: &str) -> bool {
    text.match_indices("PATH").any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + 4..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Where a path word of the `.envrc` points.
enum Place {
    /// Relative to the workspace root (empty: the root).
    Inside(Vec<u8>),
    Outside,
    Unknown,
}

/// The workspace path a word names: relative to the root (where direnv
/// runs the file), `$PWD/...`, `$(pwd)/...`, `$(expand_path X)`, or
/// absolute inside the workspace.
fn inside(word: &Word, workspace: &Path) -> Place {
    let mut text = word.text.as_str();
    for root in ["$PWD", "${PWD}", "$(pwd)", "`pwd`"] {
        if let Some(rest) = text.strip_prefix(root)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            text = rest.trim_start_matches('/');
            if text.is_empty() {
                return Place::Inside(Vec::new());
            }
        }
    }
    if let Some(rest) = text.strip_prefix("$(expand_path ").and_then(|r| r.strip_suffix(')')) {
        text = rest.trim().trim_matches(['"', '\'']);
    }
    if text.contains(['$', '`', '*', '?', '[']) {
        return Place::Unknown;
    }
    if text.starts_with('~') {
        return Place::Outside;
    }
    let relative = if let Some(abs) = text.strip_prefix('/') {
        let root = workspace.to_string_lossy();
        match Path::new(&format!("/{abs}")).strip_prefix(root.as_ref()) {
            Ok(rest) => rest.to_string_lossy().into_owned(),
            Err(_) => return Place::Outside,
        }
    } else {
        text.to_string()
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Place::Outside;
                }
            }
            name => parts.push(name),
        }
    }
    Place::Inside(parts.join("/").into_bytes())
}

/// One shell word, unquoted; `dynamic` when it holds an expansion.
#[derive(Debug)]
struct Word {
    text: String,
    dynamic: bool,
}

/// The simple commands of one line: words split at blanks outside quotes,
/// commands at `;`, `&&`, `||` and `|`, a comment dropped.
fn commands(line: &str) -> Vec<Vec<Word>> {
    let mut all = Vec::new();
    let mut words: Vec<Word> = Vec::new();
    let mut word: Option<Word> = None;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            } else {
                let w = word.get_or_insert(Word { text: String::new(), dynamic: false });
                w.dynamic |= q == '"' && matches!(c, '$' | '`');
                w.text.push(c);
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                word.get_or_insert(Word { text: String::new(), dynamic: false });
            }
            '#' if word.is_none() => break,
            ' ' | '\t' => words.extend(word.take()),
            ';' | '&' | '|' => {
                words.extend(word.take());
                if matches!(chars.peek(), Some('&' | '|')) {
                    chars.next();
                }
                all.push(std::mem::take(&mut words));
            }
            _ => {
                let w = word.get_or_insert(Word { text: String::new(), dynamic: false });
                w.dynamic |= matches!(c, '$' | '`');
                w.text.push(c);
                // `$(cmd arg)` is one word, blanks and all.
                if c == '$' && chars.peek() == Some(&'(') {
                    let mut depth = 0;
                    for c in chars.by_ref() {
                        w.text.push(c);
                        match c {
                            '(' => depth += 1,
                            ')' if depth == 1 => break,
                            ')' => depth -= 1,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    words.extend(word.take());
    all.push(words);
    all.retain(|w| !w.is_empty());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(envrc: &Envrc) -> Vec<String> {
        envrc.path_dirs.iter().map(|d| String::from_utf8_lossy(d).into_owned()).collect()
    }

    #[test]
    fn reads_the_directories_put_on_path() {
        let ws = Path::new("/home/u/proj");
        let text = "# tools\nPATH_add bin scripts/dev\npath_add PATH \"$PWD/tools\"\npath_add PYTHONPATH lib\n\
                    export PATH=\"${PWD}/.local/bin:$PATH\"\nPATH=/home/u/proj/x/../y:/usr/bin:$PATH\n\
                    PATH_add $(expand_path vendor/bin)\nlayout node; layout go\nif has x; then PATH_add more; fi\nlayout python3\n\
                    export GOPATH=$PWD\nwatch_file flake.nix\n";
        let envrc = Envrc::parse(text, ws);
        assert_eq!(
            dirs(&envrc),
            ["bin", "scripts/dev", "tools", ".local/bin", "y", "vendor/bin", "node_modules/.bin", "bin", "more"]
        );
        assert!(!envrc.unknown_path && !envrc.nix && envrc.loaded.is_empty(), "{envrc:?}");
        assert!(Envrc::parse("PATH_add $PWD\n", ws).path_dirs == [Vec::<u8>::new()], "the root itself");
        assert!(Envrc::parse("PATH_add ../elsewhere ~/bin /opt/bin\n", ws).path_dirs.is_empty());
    }

    #[test]
    fn files_it_loads_and_nix() {
        let ws = Path::new("/w");
        let envrc = Envrc::parse("use flake\ndotenv\ndotenv_if_exists .env.local\nsource_env scripts/env.sh\n", ws);
        assert!(envrc.nix);
        let loaded: Vec<&[u8]> = envrc.loaded.iter().map(Vec::as_slice).collect();
        assert_eq!(loaded, [&b".env"[..], b".env.local", b"scripts/env.sh"]);
        assert!(!envrc.unknown_path, "the caller reads what the loaded files put on PATH");
        assert!(Envrc::parse("source_env \"$X\"\n", ws).unknown_path);
    }

    #[test]
    fn what_it_cannot_read_makes_path_unknown() {
        let ws = Path::new("/w");
        for text in [
            "PATH_add \"$DIR/bin\"\n",
            "export PATH=$HOME/x:$TOOLS:$PATH\n",
            "eval \"$(tool env)\"\n",
            "PATH+=:bin\n",
            "layout mystery\n",
            "[ -d bin ] && export PATH=\"$(realpath bin):$PATH\"\n",
            "add_bins() { PATH_add \"$1\"; }\n",
            "for d in a b; do PATH_add $d; done\n",
        ] {
            assert!(Envrc::parse(text, ws).unknown_path, "{text}");
        }
        for text in ["export GOPATH=$PWD/go\n", "use node 20\n", "export FOO=\"$(date)\"\n", "strict_env\n"] {
            assert!(!Envrc::parse(text, ws).unknown_path, "{text}");
        }
    }
}
