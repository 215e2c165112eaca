//! The summary as text: directory groups with their items and tallies,
//! git activity, collapsed ignored trees, and what needs attention last,
//! nearest the question; limited to what a terminal can take in.

use std::io::{self, Write};

use super::{Group, GroupKey, Item, Lines, Status, Summary};
use crate::protocol::change_set::SymlinkTarget;
use crate::protocol::change_set::entry::{Base, Kind, Mode};
use crate::protocol::change_set::path::RelPath;
use crate::review::content::human_size;
use crate::review::diff::LineStat;
use crate::review::git::{GitActivity, GitEvent, short_id, short_ref};
use crate::review::style::{Painter, Role};
use crate::util::text::display_bytes;

/// How much of the summary to show.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions<'a> {
    pub painter: Painter,
    /// Most item lines listed under directories before only directory
    /// lines are shown; `None` lists everything.
    pub limit: Option<usize>,
    /// The session, for hints (`stockade diff <id>`).
    pub session: Option<&'a str>,
}

/// Items listed when a directory is shown file by file.
const MAX_LISTED_DIRS: usize = 40;
/// Blocked paths listed at most. (Execution-sensitive entries are all
/// listed, however many: decoys must not push a real hook out of sight.)
const MAX_ATTENTION: usize = 50;
/// Ref changes listed per repository.
const MAX_GIT_EVENTS: usize = 20;
/// Widest path column before paths stop being aligned.
const MAX_PATH_COLUMN: usize = 56;

impl Summary {
    pub fn render(&self, out: &mut dyn Write, options: &RenderOptions<'_>) -> io::Result<()> {
        let p = options.painter;
        let dir_groups: Vec<&Group> = self.groups.iter().filter(|g| matches!(g.key, GroupKey::Dir(_))).collect();
        let listed_items: usize = dir_groups.iter().map(|g| g.items.len()).sum();
        let list_items = options.limit.is_none_or(|limit| listed_items <= limit);
        let width = self.path_column(list_items);

        for (shown, group) in dir_groups.iter().enumerate() {
            if options.limit.is_some() && shown == MAX_LISTED_DIRS {
                let rest = dir_groups.len() - shown;
                writeln!(out, "  {}", p.paint(Role::Muted, format!("… and {rest} more directories")))?;
                break;
            }
            let GroupKey::Dir(dir) = &group.key else { continue };
            let name = match dir {
                Some(d) => format!("{d}/"),
                None => "./".to_string(),
            };
            let stat = stat_text(group.tally.lines);
            let line = format!(
                "  {}  {}  {}",
                p.paint(Role::Dir, pad(&name, width + 3)),
                paint_stat(p, &stat, group.tally.lines),
                p.paint(Role::Muted, group.tally.words())
            );
            writeln!(out, "{}", line.trim_end())?;
            if list_items {
                for &i in &group.items {
                    self.render_item(out, p, &self.items[i], width)?;
                }
            }
        }
        if !list_items {
            if let Some(id) = options.session {
                let hint = format!("{} paths in all; `stockade diff --stat {id}` lists each", thousands(listed_items));
                writeln!(out, "  {}", p.paint(Role::Muted, hint))?;
            }
        }

        for (git_dir, activity) in &self.git {
            if activity.is_empty() {
                continue;
            }
            writeln!(out)?;
            self.render_git(out, p, git_dir, activity)?;
        }

        let ignored: Vec<&Group> = self.groups.iter().filter(|g| matches!(g.key, GroupKey::Ignored(_))).collect();
        if !ignored.is_empty() {
            writeln!(out)?;
            writeln!(out, "  {}", p.paint(Role::Heading, "ignored by git (collapsed):"))?;
            for group in ignored {
                let GroupKey::Ignored(root) = &group.key else { continue };
                let is_dir = group.items.len() > 1 || self.items[group.items[0]].entry.path != *root;
                let name = if is_dir { format!("{root}/") } else { root.to_string() };
                let mut words = group.tally.words();
                if group.tally.executables > 0 {
                    words.push_str(&format!(", {} executable", thousands(group.tally.executables)));
                }
                if group.tally.bytes_added > 0 {
                    words.push_str(&format!(" ({} new)", human_size(group.tally.bytes_added)));
                }
                if group.tally.blocked > 0 {
                    words.push_str(&format!(", {} conflicting", group.tally.blocked));
                }
                writeln!(out, "    {}  {}", p.paint(Role::Muted, pad(&name, width + 1)), p.paint(Role::Muted, words))?;
            }
        }

        let dangers: Vec<&Group> = self.groups.iter().filter(|g| matches!(g.key, GroupKey::Danger(_))).collect();
        if !dangers.is_empty() {
            writeln!(out)?;
            writeln!(out, "  {}", p.paint(Role::Danger, "runs code by itself, review before applying:"))?;
            for group in &dangers {
                self.render_item(out, p, &self.items[group.items[0]], width)?;
            }
        }

        let blocked: Vec<&Item> = self.blocked().collect();
        if !blocked.is_empty() {
            writeln!(out)?;
            let heading = format!(
                "{} not applicable as staged (changed on the host during the session, or blocked):",
                plural(blocked.len(), "path", "paths")
            );
            writeln!(out, "  {}", p.paint(Role::Conflict, heading))?;
            for item in blocked.iter().take(MAX_ATTENTION) {
                let why = item.blocked.as_deref().unwrap_or_default();
                writeln!(out, "    {}: {why}", p.paint(Role::Conflict, item.path()))?;
            }
            if blocked.len() > MAX_ATTENTION {
                writeln!(out, "    … and {} more", blocked.len() - MAX_ATTENTION)?;
            }
        }
        self.render_stage_report(out, p)?;
        if self.uncounted > 0 {
            let note = format!("line counts skipped for {} files (time limit)", thousands(self.uncounted));
            writeln!(out, "  {}", p.paint(Role::Muted, note))?;
        }
        Ok(())
    }

    /// The width of the path column: the widest path or directory name
    /// that is shown (collapsed groups show only their root).
    fn path_column(&self, list_items: bool) -> usize {
        let width = |text: String| text.chars().count();
        let widest = self
            .groups
            .iter()
            .flat_map(|g| -> Vec<usize> {
                match &g.key {
                    GroupKey::Dir(dir) => {
                        let own = dir.as_ref().map_or(0, |d| width(d.to_string()));
                        let items = g.items.iter().filter(|_| list_items);
                        items.map(|&i| width(self.items[i].path().to_string())).chain([own]).collect()
                    }
                    GroupKey::Danger(i) => vec![width(self.items[*i].path().to_string())],
                    GroupKey::Ignored(root) => vec![width(root.to_string())],
                    GroupKey::Git(_) => vec![],
                }
            })
            .max()
            .unwrap_or(0);
        widest.min(MAX_PATH_COLUMN)
    }

    fn render_item(&self, out: &mut dyn Write, p: Painter, item: &Item, width: usize) -> io::Result<()> {
        let stat = match item.lines {
            Lines::Counted(s) => stat_text(s),
            _ => String::new(),
        };
        let counted = match item.lines {
            Lines::Counted(s) => s,
            _ => LineStat::default(),
        };
        let mut notes: Vec<(Role, String)> = Vec::new();
        if let Some(danger) = item.danger {
            notes.push((Role::Danger, danger.explain().to_string()));
        }
        if let Some(via) = &item.via {
            notes.push((Role::Danger, format!("as {via}")));
        }
        match (&item.entry.kind, &item.entry.base) {
            (Kind::Symlink { target }, _) => {
                notes.push((Role::Muted, format!("symlink → {}", link(target))));
                if item.outside_link {
                    notes.push((Role::Other, "points outside the workspace".into()));
                }
            }
            (Kind::Mode { mode }, Base::File { mode: old, .. }) => notes.push((Role::Muted, mode_change(*old, *mode))),
            (Kind::File { mode, .. }, Base::File { mode: old, .. }) if mode != old => {
                notes.push((Role::Muted, mode_change(*old, *mode)))
            }
            (Kind::Dir { mode }, Base::Dir { mode: old, .. }) => notes.push((Role::Muted, mode_change(*old, *mode))),
            (Kind::Dir { .. }, Base::Absent) => notes.push((Role::Muted, "new empty directory".into())),
            (Kind::Delete, Base::Dir { tree, .. }) => {
                let what = match tree {
                    Some(t) => format!(
                        "directory and {} entries below",
                        thousands(usize::try_from(t.entries).unwrap_or(usize::MAX))
                    ),
                    None => "directory".into(),
                };
                notes.push((Role::Muted, what));
            }
            (Kind::OpaqueDir { .. }, Base::Dir { .. }) => {
                notes.push((Role::Muted, "directory replaced: its old contents are removed".into()))
            }
            _ => {}
        }
        if item.status == Status::TypeChanged {
            notes.push((Role::Muted, format!("{} → {}", base_word(&item.entry.base), item.entry.kind.word())));
        }
        match (item.lines, &item.entry.kind) {
            (Lines::Binary, Kind::File { size, sha256, .. }) => {
                notes.push((Role::Muted, format!("binary, {}, sha256 {}", human_size(*size), &sha256.hex()[..12])))
            }
            (Lines::Binary, _) => notes.push((Role::Muted, "binary".into())),
            (Lines::Large, Kind::File { size, sha256, .. }) => {
                notes.push((Role::Muted, format!("{}, sha256 {}", human_size(*size), &sha256.hex()[..12])))
            }
            _ => {}
        }
        if item.now_executable {
            notes.push((Role::Other, "now executable".into()));
        }
        if item.blocked.is_some() {
            notes.push((Role::Conflict, "conflict".into()));
        }
        let notes: Vec<String> = notes.into_iter().map(|(role, text)| p.paint(role, text).to_string()).collect();
        let marker = if item.danger.is_some() { p.paint(Role::Danger, "!").to_string() } else { " ".to_string() };
        let line = format!(
            "  {marker} {}  {}  {}  {}",
            p.paint(item.status.role(), item.status.letter()),
            pad(&item.path().to_string(), width),
            paint_stat(p, &stat, counted),
            notes.join(", ")
        );
        writeln!(out, "{}", line.trim_end())
    }

    /// The git activity of a `GroupKey::Git` group.
    pub fn render_git_section(&self, out: &mut dyn Write, p: Painter, key: &GroupKey) -> io::Result<()> {
        match key {
            GroupKey::Git(git_dir) => match self.git.get(git_dir) {
                Some(activity) => self.render_git(out, p, git_dir, activity),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    fn render_git(&self, out: &mut dyn Write, p: Painter, git_dir: &RelPath, activity: &GitActivity) -> io::Result<()> {
        let tag = p.paint(Role::Git, "git:");
        let repo = if git_dir.as_bytes() == b".git" { String::new() } else { format!(" (in {git_dir})") };
        for event in activity.events.iter().take(MAX_GIT_EVENTS) {
            match event {
                GitEvent::Head { from, to } => {
                    writeln!(out, "  {tag} HEAD switched from {} to {}{repo}", clean(from), clean(to))?
                }
                GitEvent::Deleted { reference, old } => {
                    let was = old.as_deref().map(|o| format!(" (was {})", short_id(o))).unwrap_or_default();
                    writeln!(out, "  {tag} {} deleted{was}{repo}", clean(&short_ref(reference)))?
                }
                GitEvent::Moved { reference, old, new, commits, fast_forward, reflog } => {
                    let name = clean(&short_ref(reference));
                    let n = commits.len();
                    let commits_word = plural(n, "new commit", "new commits");
                    match (old, fast_forward) {
                        (None, _) => writeln!(
                            out,
                            "  {tag} {} created at {}{}{repo}",
                            name,
                            short_id(new),
                            if n > 0 { format!(" with {commits_word}") } else { String::new() }
                        )?,
                        (Some(old), true) => writeln!(
                            out,
                            "  {tag} {commits_word} on {name} ({}..{}){repo}",
                            short_id(old),
                            short_id(new)
                        )?,
                        (Some(old), false) => {
                            let how = reflog.as_deref().map(|r| format!(": {}", clean(r))).unwrap_or_default();
                            writeln!(
                                out,
                                "  {tag} {name} moved from {} to {}{how}{repo}",
                                short_id(old),
                                short_id(new)
                            )?
                        }
                    }
                    for commit in commits.iter().take(5) {
                        writeln!(out, "         {} {}", p.paint(Role::Git, short_id(&commit.id)), commit.subject)?;
                    }
                    if n > 5 {
                        writeln!(out, "         … and {} more", n - 5)?;
                    }
                    if n == 0
                        && let Some(r) = reflog
                    {
                        writeln!(out, "         {}", p.paint(Role::Muted, clean(r)))?;
                    }
                }
            }
        }
        if activity.events.len() > MAX_GIT_EVENTS {
            writeln!(out, "  {tag} … and {} more ref changes", thousands(activity.events.len() - MAX_GIT_EVENTS))?;
        }
        let internals = format!(
            "{git_dir}/: {}, {} (applied together)",
            plural(activity.objects, "object file", "object files"),
            plural(activity.other, "other file", "other files")
        );
        writeln!(out, "  {tag} {}", p.paint(Role::Muted, internals))
    }

    fn render_stage_report(&self, out: &mut dyn Write, p: Painter) -> io::Result<()> {
        let report = &self.report;
        if report.summary.skipped > 0 {
            let listed: Vec<String> = report
                .skipped
                .iter()
                .take(5)
                .map(|s| format!("{} {}", s.what, display_bytes(s.path.as_bytes())))
                .collect();
            let more = if report.summary.skipped > listed.len() as u64 { ", …" } else { "" };
            let line =
                format!("not carried over (special files): {} ({}{more})", report.summary.skipped, listed.join(", "));
            writeln!(out, "  {}", p.paint(Role::Muted, line))?;
        }
        if report.stripped_count > 0 {
            let listed: Vec<String> = report.stripped.iter().take(5).map(|s| s.to_string()).collect();
            let more = if report.stripped_count > listed.len() as u64 { ", …" } else { "" };
            let line =
                format!("setuid/setgid/sticky bits dropped: {} ({}{more})", report.stripped_count, listed.join(", "));
            writeln!(out, "  {}", p.paint(Role::Other, line))?;
        }
        if report.bytecode_count > 0 {
            let listed: Vec<String> = report.bytecode.iter().take(3).map(|s| s.to_string()).collect();
            let more = if report.bytecode_count > listed.len() as u64 { ", …" } else { "" };
            let line = format!(
                "compiled Python not carried over (the host's Python rebuilds it from the reviewed source): {} ({}{more})",
                report.bytecode_count,
                listed.join(", ")
            );
            writeln!(out, "  {}", p.paint(Role::Muted, line))?;
        }
        Ok(())
    }
}

fn stat_text(stat: LineStat) -> String {
    match (stat.added, stat.removed) {
        (0, 0) => String::new(),
        (a, 0) => format!("+{a}"),
        (0, r) => format!("-{r}"),
        (a, r) => format!("+{a} -{r}"),
    }
}

/// The `+a -r` column, padded to a fixed width, coloured by part.
fn paint_stat(p: Painter, text: &str, stat: LineStat) -> String {
    let padded = format!("{text:>13}");
    if !p.color() || text.is_empty() {
        return padded;
    }
    let lead = &padded[..padded.len() - text.len()];
    let mut out = lead.to_string();
    if stat.added > 0 {
        out.push_str(&p.paint(Role::Plus, format!("+{}", stat.added)).to_string());
    }
    if stat.removed > 0 {
        if stat.added > 0 {
            out.push(' ');
        }
        out.push_str(&p.paint(Role::Minus, format!("-{}", stat.removed)).to_string());
    }
    out
}

fn pad(text: &str, width: usize) -> String {
    let len = text.chars().count();
    if len >= width { text.to_string() } else { format!("{text}{}", " ".repeat(width - len)) }
}

fn mode_change(old: Mode, new: Mode) -> String {
    format!("mode {old} → {new}")
}

fn link(target: &SymlinkTarget) -> String {
    target.to_string()
}

fn base_word(base: &Base) -> &'static str {
    match base {
        Base::Absent => "nothing",
        Base::File { .. } => "file",
        Base::Symlink { .. } => "symlink",
        Base::Dir { .. } => "dir",
        Base::Special => "special file",
    }
}

/// Guest-written text (ref names, reflog messages) made safe to print.
fn clean(text: &str) -> String {
    display_bytes(text.as_bytes())
}

pub fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 { format!("1 {one}") } else { format!("{} {many}", thousands(n)) }
}

/// 1234567 as "1,234,567".
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
