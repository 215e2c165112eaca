//! Messages after an apply, and the hint that tells how to act on staged
//! changes later. Shared by the review after a run and `stockade apply`.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;

use crate::changes::ApplyReport;
use crate::protocol::change_set::path::RelPath;

use super::style::{Painter, Role};
use super::summary::{plural, thousands};

/// Conflicts, refusals and failures listed by path at most.
const MAX_LISTED: usize = 50;

/// What to run to see, apply or drop staged changes.
pub fn write_hint(out: &mut dyn Write, p: Painter, session: &str) -> io::Result<()> {
    writeln!(out, "stockade: review them later with:")?;
    for (cmd, what) in
        [("diff", "show the changes"), ("apply", "apply them (add paths to apply some)"), ("discard", "drop them")]
    {
        let line = format!("stockade {cmd} {session}");
        writeln!(out, "  {}  {}", p.paint(Role::Heading, format!("{line:<40}")), p.paint(Role::Muted, what))?;
    }
    Ok(())
}

/// What an apply did: applied counts, then each path left out and why, with
/// the command that would compare or force it.
pub fn write_apply_report(
    out: &mut dyn Write,
    p: Painter,
    report: &ApplyReport,
    implied: &HashSet<RelPath>,
    session: &str,
    workspace: &Path,
) -> io::Result<()> {
    // New directories were chosen through their contents; count those.
    let count = |paths: &[RelPath]| paths.iter().filter(|p| !implied.contains(*p)).count();
    if let Some(recovered) = &report.recovered {
        writeln!(
            out,
            "stockade: first completed an interrupted apply ({} written)",
            plural(count(&recovered.applied), "change", "changes")
        )?;
    }
    let (applied, already) = (count(&report.applied), count(&report.already));
    if applied > 0 || already > 0 {
        let extra = if already > 0 { format!(" ({} already in place)", thousands(already)) } else { String::new() };
        writeln!(
            out,
            "stockade: {} {}{extra}",
            p.paint(Role::Added, format!("applied {}", plural(applied, "change", "changes"))),
            format_args!("to {}", workspace.display())
        )?;
    } else if report.skipped() == 0 {
        writeln!(out, "stockade: nothing to apply")?;
    }
    if !report.conflicts.is_empty() {
        let heading = format!(
            "{} not applied: changed on the host during the session",
            plural(report.conflicts.len(), "conflict", "conflicts")
        );
        writeln!(out, "stockade: {}", p.paint(Role::Conflict, heading))?;
        for c in report.conflicts.iter().take(MAX_LISTED) {
            writeln!(out, "  {}: {}", p.paint(Role::Conflict, &c.path), c.reason)?;
        }
        more(out, report.conflicts.len())?;
        if let Some(first) = report.conflicts.first() {
            writeln!(
                out,
                "  compare with `stockade diff {session} {path}`; overwrite the host's version with `stockade apply {session} --force {path}`",
                path = first.path
            )?;
        }
    }
    if !report.refused.is_empty() {
        let heading = format!("{} refused:", plural(report.refused.len(), "change", "changes"));
        writeln!(out, "stockade: {}", p.paint(Role::Conflict, heading))?;
        for r in report.refused.iter().take(MAX_LISTED) {
            writeln!(out, "  {}: {}", p.paint(Role::Conflict, &r.path), r.reason)?;
        }
        more(out, report.refused.len())?;
    }
    if !report.failed.is_empty() {
        let heading =
            format!("{} failed (still staged; run apply again):", plural(report.failed.len(), "change", "changes"));
        writeln!(out, "stockade: {}", p.paint(Role::Conflict, heading))?;
        for f in report.failed.iter().take(MAX_LISTED) {
            writeln!(out, "  {}: {}", p.paint(Role::Conflict, &f.path), f.error)?;
        }
        more(out, report.failed.len())?;
    }
    Ok(())
}

fn more(out: &mut dyn Write, total: usize) -> io::Result<()> {
    if total > MAX_LISTED {
        writeln!(out, "  … and {} more", thousands(total - MAX_LISTED))?;
    }
    Ok(())
}
