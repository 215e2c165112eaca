//! The summary of a staged change set: every staged entry with its status,
//! class and notes, grouped for review (by directory; git activity; paths
//! git ignores, collapsed; execution-sensitive files, each on its own).
//! This module builds and counts; `render` turns it into text.
//!
//! Line counts need both versions of a file, so they are the only costly
//! part: files over `COUNT_LIMIT` are not counted, and counting stops when
//! `LINE_BUDGET` is spent (the rest show no counts; the summary says so).
//! Ignored paths and git internals are never counted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::changes::ChangesError;
use crate::changes::Selection;
use crate::changes::{ApplyOptions, check};
use crate::changes::{Counts, StageReport, Store};
use crate::protocol::change_set::entry::{Base, Entry, EntryState, Kind};
use crate::protocol::change_set::path::RelPath;

use super::classify::{Danger, Place, became_executable, points_outside};
use super::content;
use super::diff::{LineStat, line_stat};
use super::git::GitActivity;
use super::style::Role;
use crate::changes::Host;

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
    /// The changes are an agent's settings for the home directory: every
    /// file runs code.
    pub agent_settings: bool,
}

impl Default for SummaryOptions {
    fn default() -> SummaryOptions {
        SummaryOptions {
            selection: Selection::all(),
            count_lines: true,
            line_budget: LINE_BUDGET,
            global_excludes: true,
            runs_code: Vec::new(),
            agent_settings: false,
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
        let mut classifier = super::classifier_for(
            &host,
            workspace,
            store,
            staged.iter(),
            options.global_excludes,
            &options.runs_code,
            None,
        )
        .agent_settings(options.agent_settings);
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

mod render;

pub use render::{RenderOptions, plural, thousands};

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
