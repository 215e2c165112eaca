//! `stockade apply`: write a session's staged changes to its workspace.

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::changes::review::{ColorChoice, Painter, Role, sensitive_paths, write_apply_report, write_hint};
use crate::changes::{ApplyOptions, Selection, apply};

use super::sessions;

/// Apply a session's staged changes to its workspace
///
/// SESSION is an id or a unique prefix of one; without it, the most recent
/// session with staged changes. Without PATHs everything staged is applied;
/// with them, the changes at or below those paths. A change whose path was
/// changed on the host since the session started is a conflict: it is
/// listed and left staged unless named with --force. An apply that was
/// interrupted is completed first.
///
/// Exits 0 when everything chosen was applied, 1 when conflicts or refused
/// changes were left staged, 125 on errors.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Session id or unique prefix (default: the latest with staged changes).
    #[arg(value_name = "SESSION")]
    session: Option<OsString>,

    /// Only changes at or below these paths.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,

    /// Apply the changes at or below PATH even where the host's version
    /// changed since the session started (the host's edit is lost).
    /// Repeatable. Symlinks on the host are never written through.
    #[arg(long, value_name = "PATH")]
    force: Vec<PathBuf>,

    /// When to colour the output.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    color: ColorChoice,
}

pub fn run(args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let (session, paths) = sessions::split_positionals(args.session, args.paths);
    let target = sessions::resolve(session.as_deref())?;
    let cwd = sessions::cwd()?;
    let paths = sessions::workspace_paths(&paths, &cwd, &target.workspace, "PATH")?;
    let selection = sessions::selection_of(&target, paths, "PATH")?;
    let force = match sessions::workspace_paths(&args.force, &cwd, &target.workspace, "--force")? {
        Some(paths) => Selection::paths(paths),
        None if args.force.is_empty() => Selection::none(),
        None => Selection::all(),
    };
    let sensitive = sensitive_paths(&target.store, &target.workspace, &selection).unwrap_or_default();
    let report = apply(&target.store, &target.workspace, &ApplyOptions { selection, force }).with_context(|| {
        format!("cannot apply the changes of session {} to {}", target.id, target.workspace.display())
    })?;

    let painter = Painter::new(args.color.for_stdout());
    let mut out = io::stdout().lock();
    write_apply_report(&mut out, painter, &report, &target.id, &target.workspace)?;
    let written: Vec<&(crate::changes::RelPath, &str)> =
        sensitive.iter().filter(|(path, _)| report.applied.contains(path)).collect();
    if !written.is_empty() {
        writeln!(out, "stockade: {}", painter.paint(Role::Danger, "applied files that run code by themselves:"))?;
        for (path, why) in written {
            writeln!(out, "  {path}: {why}")?;
        }
    }
    let left = target.store.counts()?.staged;
    if left > 0 {
        writeln!(out, "stockade: {} still staged", crate::changes::review::plural(left, "change is", "changes are"))?;
        write_hint(&mut out, painter, &target.id)?;
    }
    Ok(if report.skipped() > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
