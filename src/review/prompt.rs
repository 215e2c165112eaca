//! The questions after a run: apply all, none, or choose group by group
//! (a directory's files, a git repository's activity, an ignored tree, each
//! execution-sensitive file on its own) and file by file, with diffs on
//! request. Answers come from an `Answers`: single key presses on the
//! terminal, or lines (tests, and a terminal that cannot do single keys).
//!
//! End of input and `q` keep everything staged; an answer that is not one
//! of the choices is asked again.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;

use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

use crate::protocol::change_set::path::RelPath;

use super::git::{GitEvent, short_ref};
use super::style::{Painter, Role};
use super::summary::{Group, GroupKey, Lines, Summary, plural};

/// Where answers come from.
pub trait Answers {
    /// Shows `prompt` and returns the key answered (lowercase), `None` at
    /// end of input.
    fn ask(&mut self, out: &mut dyn Write, prompt: &str) -> io::Result<Option<char>>;
}

/// Answers read line by line; the first character of a line is the answer.
#[cfg(test)]
pub struct LineAnswers<R: std::io::BufRead>(pub R);

#[cfg(test)]
impl<R: std::io::BufRead> Answers for LineAnswers<R> {
    fn ask(&mut self, out: &mut dyn Write, prompt: &str) -> io::Result<Option<char>> {
        write!(out, "{prompt} ")?;
        out.flush()?;
        let mut line = String::new();
        if self.0.read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(None);
        }
        Ok(Some(line.trim().chars().next().map_or(' ', |c| c.to_ascii_lowercase())))
    }
}

/// Single key presses on the controlling terminal (`/dev/tty`), without
/// Enter. The terminal is in non-canonical mode only while a question
/// waits, so the pager and Ctrl-C elsewhere behave as usual.
pub struct KeyAnswers {
    tty: File,
    normal: Termios,
    flushed: bool,
}

impl KeyAnswers {
    pub fn open() -> io::Result<KeyAnswers> {
        let tty = File::options().read(true).write(true).open("/dev/tty")?;
        let normal = termios::tcgetattr(tty.as_fd())?;
        Ok(KeyAnswers { tty, normal, flushed: false })
    }

    fn read_key(&mut self) -> io::Result<Option<char>> {
        let mut keys = self.normal.clone();
        // No line editing, no echo (we echo the answer), no signals: Ctrl-C
        // arrives as a byte and means quit.
        keys.local_flags.remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        if !self.flushed {
            // Keys typed while the command ran must not answer the first question.
            let _ = termios::tcflush(self.tty.as_fd(), termios::FlushArg::TCIFLUSH);
            self.flushed = true;
        }
        termios::tcsetattr(self.tty.as_fd(), SetArg::TCSANOW, &keys)?;
        let mut buf = [0u8; 16];
        let read = loop {
            match self.tty.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let _ = termios::tcsetattr(self.tty.as_fd(), SetArg::TCSANOW, &self.normal);
        Ok(match read? {
            0 => None,
            // A paste or an escape sequence (arrow keys) is not an answer.
            n if n > 1 => Some('\0'),
            _ => match buf[0] {
                0x03 => Some('q'),
                0x04 => None,
                b => Some((b as char).to_ascii_lowercase()),
            },
        })
    }
}

impl Answers for KeyAnswers {
    fn ask(&mut self, out: &mut dyn Write, prompt: &str) -> io::Result<Option<char>> {
        write!(out, "{prompt} ")?;
        out.flush()?;
        let key = self.read_key()?;
        match key {
            Some(c) if c.is_ascii_graphic() => writeln!(out, "{c}")?,
            _ => writeln!(out)?,
        }
        Ok(key)
    }
}

impl Drop for KeyAnswers {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.tty.as_fd(), SetArg::TCSANOW, &self.normal);
    }
}

/// What the reviewer decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    All,
    /// Everything but the files that run code by themselves.
    AllButCode,
    /// Nothing now; everything stays staged.
    Keep,
    /// Exactly these entries.
    Paths(Vec<RelPath>),
}

/// A diff the reviewer asked to see.
#[derive(Debug, Clone, Copy)]
pub enum Show<'a> {
    All,
    Group(&'a GroupKey),
    Item(usize),
}

pub struct Prompt<'a> {
    pub summary: &'a Summary,
    pub workspace: &'a Path,
    pub painter: Painter,
}

/// How a group question ends.
enum Step {
    Next,
    /// No to this and every later group.
    Stop,
    Quit,
}

impl Prompt<'_> {
    pub fn run(
        &self,
        out: &mut dyn Write,
        answers: &mut dyn Answers,
        show: &mut dyn FnMut(Show<'_>, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<Choice> {
        let question = format!(
            "{} [a]ll, [n]one (keep staged), [c]hoose, [d]iff, [q]uit, [?]",
            self.painter.paint(Role::Heading, format!("Apply to {}?", self.workspace.display()))
        );
        loop {
            match answers.ask(out, &question)? {
                None => return Ok(self.keep(out, "end of input")),
                Some('a') => return self.all(out, answers),
                Some('n') | Some('q') => return Ok(Choice::Keep),
                Some('c') => return self.choose(out, answers, show),
                Some('d') => show(Show::All, out)?,
                Some('?') => writeln!(
                    out,
                    "  a: apply every change (conflicting ones are kept staged and listed;\n     \
                     files that run code by themselves are asked about once more)\n  \
                     n, q: apply nothing now; the changes stay staged for `stockade apply`\n  \
                     c: choose directory by directory, or file by file\n  \
                     d: show the whole diff in the pager"
                )?,
                Some(_) => writeln!(out, "  please answer a, n, c, d or q (? explains)")?,
            }
        }
    }

    /// "All", with the files that run code confirmed on their own: an
    /// answer typed ahead must not apply a hook by the way.
    fn all(&self, out: &mut dyn Write, answers: &mut dyn Answers) -> io::Result<Choice> {
        let flagged = self.summary.items.iter().filter(|i| !i.implied && i.danger.is_some()).count();
        if flagged == 0 {
            return Ok(Choice::All);
        }
        let question = format!(
            "  {} [y]es, [n]o (keep {} staged), [q]uit",
            self.painter.paint(
                Role::Danger,
                format!(
                    "Also apply the {} listed above that {} code by {}?",
                    plural(flagged, "file", "files"),
                    if flagged == 1 { "runs" } else { "run" },
                    if flagged == 1 { "itself" } else { "themselves" }
                )
            ),
            if flagged == 1 { "it" } else { "them" }
        );
        loop {
            match answers.ask(out, &question)? {
                Some('y') => return Ok(Choice::All),
                Some('n') => return Ok(Choice::AllButCode),
                None | Some('q') => return Ok(self.keep(out, "quit")),
                Some(_) => writeln!(out, "  please answer y, n or q")?,
            }
        }
    }

    fn keep(&self, out: &mut dyn Write, why: &str) -> Choice {
        let _ = writeln!(out, "  ({why}: keeping the changes staged)");
        Choice::Keep
    }

    fn choose(
        &self,
        out: &mut dyn Write,
        answers: &mut dyn Answers,
        show: &mut dyn FnMut(Show<'_>, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<Choice> {
        let mut chosen: Vec<RelPath> = Vec::new();
        let total = self.summary.groups.len();
        for (n, group) in self.summary.groups.iter().enumerate() {
            writeln!(
                out,
                "{} {}",
                self.painter.paint(Role::Muted, format!("[{}/{total}]", n + 1)),
                self.describe(group)
            )?;
            match self.ask_group(out, answers, show, group, &mut chosen)? {
                Step::Next => {}
                Step::Stop => break,
                Step::Quit => return Ok(self.keep(out, "quit")),
            }
        }
        if chosen.is_empty() {
            return Ok(self.keep(out, "nothing chosen"));
        }
        Ok(Choice::Paths(chosen))
    }

    fn ask_group(
        &self,
        out: &mut dyn Write,
        answers: &mut dyn Answers,
        show: &mut dyn FnMut(Show<'_>, &mut dyn Write) -> io::Result<()>,
        group: &Group,
        chosen: &mut Vec<RelPath>,
    ) -> io::Result<Step> {
        // Git changes go together: refs without their objects break the repository.
        let by_file = group.items.len() > 1 && !matches!(group.key, GroupKey::Git(_));
        let question = if by_file {
            "  apply? [y]es, [n]o, [f]ile by file, [d]iff, [s]kip the rest, [q]uit, [?]"
        } else {
            "  apply? [y]es, [n]o, [d]iff, [s]kip the rest, [q]uit, [?]"
        };
        loop {
            match answers.ask(out, question)? {
                None => return Ok(Step::Quit),
                Some('y') => {
                    chosen.extend(self.summary.group_paths(group));
                    return Ok(Step::Next);
                }
                Some('n') => return Ok(Step::Next),
                Some('f') if by_file => return self.ask_items(out, answers, show, group, chosen),
                Some('d') => show(Show::Group(&group.key), out)?,
                Some('s') => return Ok(Step::Stop),
                Some('q') => return Ok(Step::Quit),
                Some('?') => writeln!(
                    out,
                    "  y: apply this group   n: keep it staged   {}d: show its diff\n  \
                     s: keep this and every later group staged, apply what was chosen\n  \
                     q: quit, apply nothing",
                    if by_file { "f: ask for each file   " } else { "" }
                )?,
                Some(_) => writeln!(
                    out,
                    "  please answer {} (? explains)",
                    if by_file { "y, n, f, d, s or q" } else { "y, n, d, s or q" }
                )?,
            }
        }
    }

    fn ask_items(
        &self,
        out: &mut dyn Write,
        answers: &mut dyn Answers,
        show: &mut dyn FnMut(Show<'_>, &mut dyn Write) -> io::Result<()>,
        group: &Group,
        chosen: &mut Vec<RelPath>,
    ) -> io::Result<Step> {
        for &i in &group.items {
            let item = &self.summary.items[i];
            let mut line = format!(
                "    {} {}",
                self.painter.paint(status_role(item.status.letter()), item.status.letter()),
                item.path()
            );
            if let Lines::Counted(stat) = item.lines {
                line.push_str(&format!(" (+{} -{})", stat.added, stat.removed));
            }
            if let Some(why) = &item.blocked {
                line.push_str(&format!(" {}", self.painter.paint(Role::Conflict, format!("conflict: {why}"))));
            }
            writeln!(out, "{line}")?;
            loop {
                match answers.ask(out, "    apply? [y]es, [n]o, [d]iff, [s]kip the rest of this group, [q]uit")? {
                    None => return Ok(Step::Quit),
                    Some('y') => {
                        chosen.push(item.path().clone());
                        break;
                    }
                    Some('n') => break,
                    Some('d') => show(Show::Item(i), out)?,
                    Some('s') => return Ok(Step::Next),
                    Some('q') => return Ok(Step::Quit),
                    Some(_) => writeln!(out, "    please answer y, n, d, s or q")?,
                }
            }
        }
        Ok(Step::Next)
    }

    /// One line saying what a group holds.
    fn describe(&self, group: &Group) -> String {
        let p = self.painter;
        let conflicts = if group.tally.blocked > 0 {
            format!(
                " {}",
                p.paint(
                    Role::Conflict,
                    format!("({} kept unless forced)", plural(group.tally.blocked, "conflict", "conflicts"))
                )
            )
        } else {
            String::new()
        };
        let lines = match (group.tally.lines.added, group.tally.lines.removed) {
            (0, 0) => String::new(),
            (a, 0) => format!(" +{a}"),
            (0, r) => format!(" -{r}"),
            (a, r) => format!(" +{a} -{r}"),
        };
        match &group.key {
            GroupKey::Dir(dir) => {
                let name = dir.as_ref().map_or_else(|| "./ (top level)".to_string(), |d| format!("{d}/"));
                format!("{}  {}{lines}{conflicts}", p.paint(Role::Dir, name), group.tally.words())
            }
            GroupKey::Ignored(root) => {
                format!("{} (ignored by git)  {}{conflicts}", p.paint(Role::Dir, root), group.tally.words())
            }
            GroupKey::Git(git_dir) => {
                let events = self.summary.git.get(git_dir).map(|a| a.events.as_slice()).unwrap_or_default();
                let what: Vec<String> = events.iter().map(describe_event).collect();
                let what = if what.is_empty() { "repository files changed".to_string() } else { what.join("; ") };
                let label =
                    if git_dir.as_bytes() == b".git" { "git:".to_string() } else { format!("git ({git_dir}):") };
                format!(
                    "{} {what} ({}, applied together){conflicts}",
                    p.paint(Role::Git, label),
                    plural(group.items.len(), "file", "files")
                )
            }
            GroupKey::Danger(i) => {
                let item = &self.summary.items[*i];
                let mut why = item.danger.map(|d| d.explain()).unwrap_or_default().to_string();
                if let Some(via) = &item.via {
                    why.push_str(&format!(", as {via}"));
                }
                format!(
                    "{} {} {}  {}{lines}{conflicts}",
                    p.paint(Role::Danger, "!"),
                    p.paint(status_role(item.status.letter()), item.status.letter()),
                    item.path(),
                    p.paint(Role::Danger, why)
                )
            }
        }
    }
}

fn status_role(letter: char) -> Role {
    match letter {
        'A' => Role::Added,
        'M' => Role::Modified,
        'D' => Role::Deleted,
        _ => Role::Other,
    }
}

fn describe_event(event: &GitEvent) -> String {
    let clean = |s: &str| crate::util::text::display_bytes(s.as_bytes());
    match event {
        GitEvent::Head { from, to } => format!("HEAD switched from {} to {}", clean(from), clean(to)),
        GitEvent::Deleted { reference, .. } => format!("{} deleted", clean(&short_ref(reference))),
        GitEvent::Moved { reference, old, commits, .. } => {
            let name = clean(&short_ref(reference));
            let subject = commits.first().map(|c| format!(": {}", c.subject)).unwrap_or_default();
            match old {
                None => format!("{name} created{subject}"),
                Some(_) if commits.is_empty() => format!("{name} moved"),
                Some(_) => format!("{} on {name}{subject}", plural(commits.len(), "new commit", "new commits")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_answers_take_the_first_character_and_end_at_eof() {
        let mut answers = LineAnswers(&b"  Yes\n\nx\n"[..]);
        let mut out = Vec::new();
        assert_eq!(answers.ask(&mut out, "?").unwrap(), Some('y'));
        assert_eq!(answers.ask(&mut out, "?").unwrap(), Some(' '));
        assert_eq!(answers.ask(&mut out, "?").unwrap(), Some('x'));
        assert_eq!(answers.ask(&mut out, "?").unwrap(), None);
    }
}
