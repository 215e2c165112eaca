//! The summary of a staged change set: every staged entry with its status,
//! class and notes, grouped for review (by directory; git activity; paths
//! git ignores, collapsed; execution-sensitive files, each on its own), and
//! rendered as text.
//!
//! Line counts need both versions of a file, so they are the only costly
//! part: files over `COUNT_LIMIT` are not counted, and counting stops when
//! `LINE_BUDGET` is spent (the rest show no counts; the summary says so).
//! Ignored paths and git internals are never counted.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::changes::apply::{ApplyOptions, check};
use crate::changes::model::{Base, Entry, EntryState, Kind, Mode};
use crate::changes::path::{RelPath, display_bytes};
use crate::changes::selection::Selection;
use crate::changes::store::{Counts, StageReport, Store};
use crate::changes::{ChangesError, SymlinkTarget};

use super::classify::{Classifier, Danger, Place, became_executable, points_outside};
use super::content::{self, human_size};
use super::diff::{LineStat, line_stat};
use super::git::{GitActivity, GitEvent, short_id, short_ref};
use super::host::Host;
use super::style::{Painter, Role};

/// Files larger than this are not line-counted in the summary.
const COUNT_LIMIT: u64 = 1 << 20;
/// Time the summary may spend counting lines.
pub const LINE_BUDGET: Duration = Duration::from_millis(300);
/// Time one file's count may take (a pathological diff settles early).
const FILE_DEADLINE: Duration = Duration::from_millis(20);

/// What a change does to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Added,
    Modified,
    Deleted,
    /// A file became a symlink, a directory a file, and so on.
    TypeChanged,
    /// Permission bits only.
    ModeChanged,
    /// A directory whose old contents are removed (then refilled by the set).
    Replaced,
}

impl Status {
    fn of(entry: &Entry) -> Status {
        match (&entry.kind, &entry.base) {
            (Kind::Delete, _) => Status::Deleted,
            (Kind::Mode { .. }, _) => Status::ModeChanged,
            (_, Base::Absent) => Status::Added,
            (Kind::File { .. }, Base::File { .. }) | (Kind::Symlink { .. }, Base::Symlink { .. }) => Status::Modified,
            (Kind::Dir { .. }, Base::Dir { .. }) => Status::ModeChanged,
            (Kind::OpaqueDir { .. }, Base::Dir { .. }) => Status::Replaced,
            _ => Status::TypeChanged,
        }
    }

    pub fn letter(self) -> char {
        match self {
            Status::Added => 'A',
            Status::Modified | Status::ModeChanged => 'M',
            Status::Deleted => 'D',
            Status::TypeChanged => 'T',
            Status::Replaced => 'R',
        }
    }

    fn role(self) -> Role {
        match self {
            Status::Added => Role::Added,
            Status::Modified | Status::ModeChanged => Role::Modified,
            Status::Deleted => Role::Deleted,
            Status::TypeChanged | Status::Replaced => Role::Other,
        }
    }
}

/// Line counts of an item, or why there are none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    Counted(LineStat),
    Binary,
    /// Over `COUNT_LIMIT`.
    Large,
    /// The time budget ran out.
    Uncounted,
    /// Not a text change (directories, symlinks, mode changes, ignored paths).
    None,
}

/// One staged entry as review sees it.
#[derive(Debug, Clone)]
pub struct Item {
    pub entry: Entry,
    pub status: Status,
    pub place: Place,
    pub danger: Option<Danger>,
    /// For a file flagged as reached through a symlink: the path it is
    /// reached as.
    pub via: Option<RelPath>,
    pub now_executable: bool,
    pub outside_link: bool,
    /// Why apply would not write it now (a conflict or a refusal).
    pub blocked: Option<String>,
    pub lines: Lines,
    /// A new directory that is shown through its contents.
    pub implied: bool,
}

impl Item {
    pub fn path(&self) -> &RelPath {
        &self.entry.path
    }

    fn is_file(&self) -> bool {
        matches!(self.entry.kind, Kind::File { .. }) || matches!(self.entry.base, Base::File { .. })
    }
}

/// How items are grouped for review.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKey {
    /// Entries directly in this directory (`None`: the workspace root).
    Dir(Option<RelPath>),
    /// A git directory's internals: all or nothing (refs need their objects).
    Git(RelPath),
    /// Everything below an ignored path.
    Ignored(RelPath),
    /// One execution-sensitive entry (its item index).
    Danger(usize),
}

#[derive(Debug, Clone)]
pub struct Group {
    pub key: GroupKey,
    /// Item indices, implied directories left out.
    pub items: Vec<usize>,
    pub tally: Tally,
}

/// Counts over a group or the whole set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    pub other: usize,
    pub lines: LineStat,
    pub bytes_added: u64,
    pub executables: usize,
    pub blocked: usize,
}

impl Tally {
    fn add(&mut self, item: &Item) {
        match item.status {
            Status::Added => self.added += 1,
            Status::Modified => self.modified += 1,
            Status::Deleted => self.deleted += 1,
            _ => self.other += 1,
        }
        if let Lines::Counted(stat) = item.lines {
            self.lines += stat;
        }
        if let (Status::Added, Kind::File { size, .. }) = (item.status, &item.entry.kind) {
            self.bytes_added += size;
        }
        self.executables += usize::from(item.now_executable);
        self.blocked += usize::from(item.blocked.is_some());
    }

    pub fn total(&self) -> usize {
        self.added + self.modified + self.deleted + self.other
    }

    /// "2 modified, 1 added".
    pub fn words(&self) -> String {
        let mut parts = Vec::new();
        for (n, word) in [(self.added, "added"), (self.modified, "modified"), (self.deleted, "deleted")] {
            if n > 0 {
                parts.push(format!("{} {word}", thousands(n)));
            }
        }
        if self.other > 0 {
            parts.push(format!("{} other", thousands(self.other)));
        }
        parts.join(", ")
    }
}

/// What to summarize and how much work to spend.
#[derive(Debug, Clone)]
pub struct SummaryOptions {
    /// Staged entries to include.
    pub selection: Selection,
    pub count_lines: bool,
    pub line_budget: Duration,
    /// Use the user's global git excludes file too.
    pub global_excludes: bool,
    /// The user's own patterns of files that run code (`runs_code`).
    pub runs_code: Vec<String>,
}

impl Default for SummaryOptions {
    fn default() -> SummaryOptions {
        SummaryOptions {
            selection: Selection::all(),
            count_lines: true,
            line_budget: LINE_BUDGET,
            global_excludes: true,
            runs_code: Vec::new(),
        }
    }
}

/// A reviewed change set.
#[derive(Debug, Clone)]
pub struct Summary {
    pub items: Vec<Item>,
    pub groups: Vec<Group>,
    pub git: BTreeMap<RelPath, GitActivity>,
    pub tally: Tally,
    pub report: StageReport,
    pub counts: Counts,
    /// Files whose lines were not counted for lack of time.
    pub uncounted: usize,
}

impl Summary {
    pub fn build(store: &Store, workspace: &Path, options: &SummaryOptions) -> Result<Summary, ChangesError> {
        let started = Instant::now();
        let stored = store.entries()?;
        let report = store.report()?;
        let counts = super::counts_of(&stored);
        let staged: Vec<Entry> =
            stored.into_iter().filter(|e| e.state == EntryState::Staged).map(|e| e.entry).collect();
        let entries: Vec<&Entry> = staged.iter().filter(|e| options.selection.matches(&e.path)).collect();
        if entries.is_empty() {
            // Nothing to classify: skip reading the workspace's git settings,
            // which is most of the time an unchanged workspace would cost.
            let groups = group(&[]);
            return Ok(Summary {
                items: Vec::new(),
                groups,
                git: BTreeMap::new(),
                tally: Tally::default(),
                report,
                counts,
                uncounted: 0,
            });
        }
        let host = Host::open(workspace);
        let blocked = blocked_paths(store, workspace);
        let mut classifier =
            Classifier::new(&host, workspace, options.global_excludes).with_patterns(&options.runs_code);
        // Everything staged informs the judgement (a symlink outside the
        // selection may make a selected file a hook).
        classifier.learn(staged.iter());
        let mut items: Vec<Item> = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let implied = matches!((&entry.kind, &entry.base), (Kind::Dir { .. }, Base::Absent))
                && entries.get(i + 1).is_some_and(|next| next.path.starts_with(&entry.path));
            let outside_link = match &entry.kind {
                Kind::Symlink { target } => points_outside(&entry.path, target.as_bytes()),
                _ => false,
            };
            let judged = classifier.judge(entry);
            let place = classifier.place(entry);
            items.push(Item {
                status: Status::of(entry),
                place,
                danger: judged.as_ref().map(|(d, _)| *d),
                via: judged.and_then(|(_, via)| via),
                now_executable: became_executable(entry),
                outside_link,
                blocked: blocked.get(&entry.path).cloned(),
                lines: Lines::None,
                implied,
                entry: (*entry).clone(),
            });
        }
        let classified = started.elapsed();

        let mut uncounted = 0;
        if options.count_lines {
            let deadline = Instant::now() + options.line_budget;
            for item in items.iter_mut() {
                let countable = (item.place == Place::Normal || item.danger.is_some())
                    && !item.implied
                    && item.is_file()
                    && item.status != Status::ModeChanged;
                if !countable {
                    continue;
                }
                let now = Instant::now();
                if now >= deadline {
                    item.lines = Lines::Uncounted;
                    uncounted += 1;
                    continue;
                }
                item.lines = count_lines(store, &host, &item.entry, (now + FILE_DEADLINE).min(deadline));
            }
        }

        let mut git = BTreeMap::new();
        let mut by_git_dir: BTreeMap<RelPath, Vec<&Entry>> = BTreeMap::new();
        // Flagged internals are shown on their own, not counted in the group.
        for item in items.iter().filter(|i| i.danger.is_none()) {
            if let Place::Git { git_dir } = &item.place {
                by_git_dir.entry(git_dir.clone()).or_default().push(&item.entry);
            }
        }
        for (git_dir, entries) in by_git_dir {
            let activity = GitActivity::read(&git_dir, &entries, store, &host);
            git.insert(git_dir, activity);
        }

        let groups = group(&items);
        let mut tally = Tally::default();
        for item in items.iter().filter(|i| !i.implied) {
            tally.add(item);
        }
        tracing::debug!(
            entries = items.len(),
            classify_ms = classified.as_millis(),
            total_ms = started.elapsed().as_millis(),
            uncounted,
            "summarized the staged changes"
        );
        Ok(Summary { items, groups, git, tally, report, counts, uncounted })
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Paths of a group's items (what choosing it applies).
    pub fn group_paths(&self, group: &Group) -> Vec<RelPath> {
        group.items.iter().map(|&i| self.items[i].entry.path.clone()).collect()
    }

    /// Blocked items (conflicts and refusals).
    pub fn blocked(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(|i| i.blocked.is_some())
    }
}

/// Paths apply would not write now, with the reason. An unreadable
/// workspace or a busy store leaves this empty: apply reports them itself.
fn blocked_paths(store: &Store, workspace: &Path) -> HashMap<RelPath, String> {
    match check(store, workspace, &ApplyOptions::all()) {
        Ok(report) => {
            let conflicts = report.conflicts.into_iter().map(|c| (c.path, c.reason.to_string()));
            let refused = report.refused.into_iter().map(|r| (r.path, r.reason.to_string()));
            conflicts.chain(refused).collect()
        }
        Err(e) => {
            tracing::warn!("cannot check the staged changes against the workspace: {e}");
            HashMap::new()
        }
    }
}

fn count_lines(store: &Store, host: &Host, entry: &Entry, deadline: Instant) -> Lines {
    let too_large = match (&entry.kind, &entry.base) {
        (Kind::File { size, .. }, _) if *size > COUNT_LIMIT => true,
        (_, Base::File { size, .. }) if *size > COUNT_LIMIT => true,
        _ => false,
    };
    if too_large {
        return Lines::Large;
    }
    let old = content::old_side(host, entry, COUNT_LIMIT);
    let new = content::new_side(store, entry, &old, COUNT_LIMIT);
    match line_stat(&old, &new, deadline) {
        Some(stat) => Lines::Counted(stat),
        None if [&old, &new].iter().any(|s| matches!(s, content::Side::File(d) if d.is_binary())) => Lines::Binary,
        None if [&old, &new].iter().any(|s| matches!(s, content::Side::File(d) if d.bytes.is_none())) => Lines::Large,
        None => Lines::None,
    }
}

fn group(items: &[Item]) -> Vec<Group> {
    let mut index: HashMap<GroupKey, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if item.implied {
            continue;
        }
        let key = match (&item.danger, &item.place) {
            (Some(_), _) => GroupKey::Danger(i),
            (None, Place::Git { git_dir }) => GroupKey::Git(git_dir.clone()),
            (None, Place::Ignored { root }) => GroupKey::Ignored(root.clone()),
            (None, Place::Normal) => GroupKey::Dir(item.entry.path.parent()),
        };
        let g = *index.entry(key.clone()).or_insert_with(|| {
            groups.push(Group { key, items: Vec::new(), tally: Tally::default() });
            groups.len() - 1
        });
        groups[g].items.push(i);
        groups[g].tally.add(item);
    }
    // Directories, then git, then ignored trees, then what runs by itself
    // (last, nearest the question).
    groups.sort_by(|a, b| a.key.cmp(&b.key));
    groups
}

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

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
