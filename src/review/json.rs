//! The summary as JSON, for scripts and CI (`stockade diff --stat --json`).
//! Paths are in the change set's escaped form: UTF-8 as is, `%` and bytes
//! that are not UTF-8 as `%XX`.

use serde_json::{Value, json};

use crate::protocol::change_set::entry::{Kind, SymlinkTarget};

use super::classify::Place;
use super::git::GitEvent;
use super::summary::{Item, Lines, Status, Summary};

impl Summary {
    pub fn to_json(&self, session: &str, workspace: &std::path::Path) -> Value {
        let changes: Vec<Value> = self.items.iter().filter(|i| !i.implied).map(item).collect();
        let git: Vec<Value> = self
            .git
            .iter()
            .map(|(git_dir, activity)| {
                json!({
                    "git_dir": git_dir.escaped(),
                    "events": activity.events.iter().map(event).collect::<Vec<_>>(),
                    "object_files": activity.objects,
                    "other_files": activity.other,
                })
            })
            .collect();
        json!({
            "session": session,
            "workspace": workspace.display().to_string(),
            "staged": self.tally.total(),
            "applied": self.counts.applied,
            "discarded": self.counts.discarded,
            "added": self.tally.added,
            "modified": self.tally.modified,
            "deleted": self.tally.deleted,
            "other": self.tally.other,
            "lines_added": self.tally.lines.added,
            "lines_removed": self.tally.lines.removed,
            "conflicts": self.blocked().count(),
            "runs_code": self.items.iter().filter(|i| i.danger.is_some()).count(),
            "changes": changes,
            "git": git,
            "skipped_special_files": self.report.summary.skipped,
            "stripped_setuid": self.report.stripped_count,
            "dropped_compiled_python": self.report.bytecode_count,
        })
    }
}

fn item(item: &Item) -> Value {
    let status = match item.status {
        Status::Added => "added",
        Status::Modified => "modified",
        Status::Deleted => "deleted",
        Status::TypeChanged => "type_changed",
        Status::ModeChanged => "mode_changed",
        Status::Replaced => "replaced",
    };
    let place = match &item.place {
        Place::Normal => json!(null),
        Place::Ignored { root } => json!({ "ignored_by_git": root.escaped() }),
        Place::Git { git_dir } => json!({ "git_dir": git_dir.escaped() }),
    };
    let (lines, binary) = match item.lines {
        Lines::Counted(stat) => (json!({ "added": stat.added, "removed": stat.removed }), false),
        Lines::Binary => (json!(null), true),
        _ => (json!(null), false),
    };
    let target = match &item.entry.kind {
        Kind::Symlink { target } => json!(escaped_target(target)),
        _ => json!(null),
    };
    json!({
        "path": item.path().escaped(),
        "status": status,
        "kind": item.entry.kind.word(),
        "place": place,
        "runs_code": item.danger.map(|d| d.explain()),
        "runs_code_as": item.via.as_ref().map(|v| v.escaped()),
        "now_executable": item.now_executable,
        "symlink_target": target,
        "symlink_outside_workspace": item.outside_link,
        "lines": lines,
        "binary": binary,
        "conflict": item.blocked,
    })
}

fn escaped_target(target: &SymlinkTarget) -> String {
    crate::protocol::change_set::path::escape(target.as_bytes())
}

fn event(event: &GitEvent) -> Value {
    match event {
        GitEvent::Head { from, to } => json!({ "type": "head", "from": from, "to": to }),
        GitEvent::Deleted { reference, old } => json!({ "type": "ref_deleted", "ref": reference, "old": old }),
        GitEvent::Moved { reference, old, new, commits, fast_forward, reflog } => json!({
            "type": if old.is_some() { "ref_moved" } else { "ref_created" },
            "ref": reference,
            "old": old,
            "new": new,
            "fast_forward": fast_forward,
            "commits": commits.iter().map(|c| json!({ "id": c.id, "subject": c.subject })).collect::<Vec<_>>(),
            "reflog": reflog,
        }),
    }
}
