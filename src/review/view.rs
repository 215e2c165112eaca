//! Diffs of many changes at once: the whole set, one review group or one
//! item, on the terminal or as a patch. A removed or replaced directory is
//! expanded into the deletion of every file the host has below it, so the
//! diff shows what would be lost.
//!
//! On the terminal, groups that the summary collapses (ignored trees, git
//! internals) stay one line each unless asked for by name; a patch leaves
//! out git directories entirely (`git apply` refuses paths in `.git`).

use std::collections::HashSet;
use std::io::{self, Write};

use crate::changes::Store;
use crate::protocol::change_set::entry::Kind;
use crate::protocol::change_set::path::RelPath;

use super::classify::Place;
use super::content::{self, DISPLAY_LIMIT, FileData, Side};
use super::diff::{Change, Format, write_change};
use super::style::Role;
use super::summary::{GroupKey, Item, Summary, plural};
use crate::changes::{Host, HostState};

/// Largest file content put in a patch.
const PATCH_LIMIT: u64 = 1 << 30;
/// Host paths expanded below one removed directory.
const MAX_EXPANDED: usize = 100_000;

/// What a patch left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PatchReport {
    /// Changes inside git directories (commits, refs, hooks).
    pub git: usize,
}

pub struct View<'a> {
    pub summary: &'a Summary,
    pub store: &'a Store,
    pub host: &'a Host,
    pub format: Format,
    /// The session id, for hints on collapsed groups.
    pub session: Option<&'a str>,
}

impl View<'_> {
    /// Every change; collapsed groups as one line each on the terminal
    /// unless `expand` (the user named paths).
    pub fn write_all(&self, out: &mut dyn Write, expand: bool) -> io::Result<PatchReport> {
        let mut report = PatchReport::default();
        let mut collapsed_shown: HashSet<&GroupKey> = HashSet::new();
        for (i, item) in self.summary.items.iter().enumerate() {
            if item.implied {
                continue;
            }
            if self.format == Format::Patch {
                if matches!(item.place, Place::Git { .. }) {
                    report.git += 1;
                    continue;
                }
                self.write_item(out, i)?;
                continue;
            }
            if !expand
                && item.danger.is_none()
                && let Some(group) = self.collapsed_group(item)
            {
                if collapsed_shown.insert(&group.key) {
                    self.write_collapsed(out, group)?;
                }
                continue;
            }
            self.write_item(out, i)?;
        }
        Ok(report)
    }

    /// The items of one review group, all expanded.
    pub fn write_group(&self, out: &mut dyn Write, key: &GroupKey) -> io::Result<()> {
        let Some(group) = self.summary.groups.iter().find(|g| g.key == *key) else { return Ok(()) };
        if let GroupKey::Git(_) = key {
            // Object files are zlib data: show what they mean instead, then
            // the readable files (refs, HEAD, logs).
            self.summary.render_git_section(out, self.painter(), key)?;
            for &i in &group.items {
                let path = self.summary.items[i].path().as_bytes();
                if !path.windows(9).any(|w| w == b"/objects/") {
                    self.write_item(out, i)?;
                }
            }
            return Ok(());
        }
        for &i in &group.items {
            self.write_item(out, i)?;
        }
        Ok(())
    }

    /// One item's diff, with what lies below it when it removes a directory.
    pub fn write_item(&self, out: &mut dyn Write, index: usize) -> io::Result<()> {
        let item = &self.summary.items[index];
        let limit = if self.format == Format::Patch { PATCH_LIMIT } else { DISPLAY_LIMIT };
        let old = content::old_side(self.host, &item.entry, limit);
        let new = content::new_side(self.store, &item.entry, &old, limit);
        if matches!(old, Side::Dir(_)) && !matches!(item.entry.kind, Kind::Dir { .. }) {
            self.write_removed_below(out, item, limit)?;
        }
        let notes = self.notes(item);
        write_change(out, self.format, &Change { path: item.path(), old: &old, new: &new, notes: &notes })
    }

    fn painter(&self) -> super::style::Painter {
        match self.format {
            Format::Terminal(p) => p,
            Format::Patch => super::style::Painter::plain(),
        }
    }

    fn notes(&self, item: &Item) -> Vec<(Role, String)> {
        let mut notes = Vec::new();
        if let Some(danger) = item.danger {
            notes.push((Role::Danger, danger.explain().to_string()));
        }
        if let Some(why) = &item.blocked {
            notes.push((Role::Conflict, format!("conflict: {why}")));
        }
        if item.outside_link {
            notes.push((Role::Other, "the symlink points outside the workspace".to_string()));
        }
        notes
    }

    /// Deletions of the host's files below a directory the item removes or
    /// replaces, except paths the set itself writes.
    fn write_removed_below(&self, out: &mut dyn Write, item: &Item, limit: u64) -> io::Result<()> {
        let own: HashSet<&RelPath> = self.summary.items.iter().map(|i| i.path()).collect();
        for (path, state) in self.host.below(item.path(), MAX_EXPANDED) {
            if own.contains(&path) {
                continue;
            }
            let old = match state {
                HostState::File { mode, size } => match self.host.read(&path, limit) {
                    Ok(Some(bytes)) if size <= limit => Side::File(FileData { mode, size, bytes: Some(bytes) }),
                    _ => Side::File(FileData { mode, size, bytes: None }),
                },
                HostState::Symlink { target } => Side::Symlink(target),
                _ => continue,
            };
            write_change(out, self.format, &Change { path: &path, old: &old, new: &Side::Absent, notes: &[] })?;
        }
        Ok(())
    }

    /// The ignored tree or git directory an item is shown in, if collapsed.
    fn collapsed_group(&self, item: &Item) -> Option<&super::summary::Group> {
        let key = match &item.place {
            Place::Git { git_dir } => GroupKey::Git(git_dir.clone()),
            Place::Ignored { root } => GroupKey::Ignored(root.clone()),
            Place::Normal => return None,
        };
        self.summary.groups.iter().find(|g| g.key == key)
    }

    fn write_collapsed(&self, out: &mut dyn Write, group: &super::summary::Group) -> io::Result<()> {
        let p = self.painter();
        match &group.key {
            GroupKey::Git(_) => {
                self.summary.render_git_section(out, p, &group.key)?;
            }
            GroupKey::Ignored(root) => {
                let hint = match self.session {
                    Some(id) => format!("; `stockade diff {id} {root}` shows them"),
                    None => String::new(),
                };
                let line = format!(
                    "{root}: {} ({}, ignored by git, not shown{hint})",
                    plural(group.items.len(), "change", "changes"),
                    group.tally.words()
                );
                writeln!(out, "{}", p.paint(Role::Muted, line))?;
            }
            _ => {}
        }
        Ok(())
    }
}
