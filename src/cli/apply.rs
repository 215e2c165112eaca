//! `stockade apply`: write a session's staged changes to its workspace.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::changes::review::{
    Painter, Role, change_counts, implied_dirs, plural, sensitive_paths, write_apply_report, write_hint,
};
use crate::changes::{ApplyOptions, RelPath, Selection, apply_with_progress};
use crate::progress::Meter;

use super::Global;
use super::sessions::{self, Here};

/// Apply a session's staged changes to its workspace
///
/// SESSION is an id or a unique prefix of one; without it, the most recent
/// session with staged changes. Without PATHs everything staged is applied;
/// with them, the changes at or below those paths. A change whose path was
/// changed on the host after the guest first saw it is a conflict: it is
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
    /// changed after the guest saw it (the host's edit is lost).
    /// Repeatable. Symlinks on the host are never written through.
    #[arg(long, value_name = "PATH")]
    force: Vec<PathBuf>,
}

pub fn run(args: ApplyArgs, global: Global) -> anyhow::Result<ExitCode> {
    Here::with_process(global, |here| execute(args, here))
}

pub(super) fn execute(args: ApplyArgs, here: &mut Here<'_>) -> anyhow::Result<ExitCode> {
    let (session, paths) = sessions::split_positionals(args.session, args.paths);
    let target = sessions::resolve(&here.data, session.as_deref())?;
    let paths = sessions::workspace_paths(&paths, &here.cwd, &target.workspace, "PATH")?;
    let selection = sessions::selection_of(&target, paths, "PATH")?;
    let force = match sessions::workspace_paths(&args.force, &here.cwd, &target.workspace, "--force")? {
        Some(paths) => Selection::paths(paths),
        None if args.force.is_empty() => Selection::none(),
        None => Selection::all(),
    };
    let sensitive = sensitive_paths(&target.store, &target.workspace, &selection, &[]).unwrap_or_default();
    let implied = implied_dirs(&target.store)?;
    let mut meter = Meter::stderr("applying the changes", "writes");
    let options = ApplyOptions { selection, force };
    let report = apply_with_progress(&target.store, &target.workspace, &options, &mut meter).with_context(|| {
        format!("cannot apply the changes of session {} to {}", target.id, target.workspace.display())
    })?;

    let painter = Painter::new(here.color.enabled(here.terminal));
    let out = &mut *here.out;
    write_apply_report(out, painter, &report, &implied, &target.id, &target.workspace)?;
    let written: Vec<&(RelPath, &str)> = sensitive.iter().filter(|(path, _)| report.applied.contains(path)).collect();
    if !written.is_empty() {
        writeln!(out, "stockade: {}", painter.paint(Role::Danger, "applied files that run code by themselves:"))?;
        for (path, why) in written {
            writeln!(out, "  {path}: {why}")?;
        }
    }
    let left = change_counts(&target.store)?.staged;
    if left > 0 {
        writeln!(out, "stockade: {} still staged", plural(left, "change is", "changes are"))?;
        write_hint(out, painter, &target.id)?;
    }
    Ok(if report.skipped() > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::changes::review::testutil::{Set, write};
    use crate::cli::sessions::fixture::*;

    #[test]
    fn conflicts_exit_1_until_forced() {
        let f = fixture();
        write(&f.ws.join("a.txt"), b"base\n");
        session(&f, "20250301-101500-aaaa", |ws, store| {
            Set::new(ws)
                .file("a.txt", b"guest\n", 0o644)
                .file("b.txt", b"new\n", 0o644)
                .dir(".git", 0o755)
                .dir(".git/hooks", 0o755)
                .file(".git/hooks/pre-push", b"#!/bin/sh\n", 0o755)
                .stage(store)
        });
        write(&f.ws.join("a.txt"), b"host edit\n");

        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&[]), execute);
        assert_eq!(code.unwrap(), ExitCode::from(1), "{out}");
        assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"host edit\n");
        assert!(f.ws.join("b.txt").exists());
        assert!(out.contains("1 conflict not applied"), "{out}");
        assert!(out.contains("stockade apply 20250301-101500-aaaa --force a.txt"), "{out}");
        assert!(out.contains("applied files that run code by themselves:\n  .git/hooks/pre-push: git hook"), "{out}");
        assert!(out.contains("1 change is still staged"), "{out}");

        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--force", "a.txt"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"guest\n");
        assert!(!out.contains("still staged"), "{out}");
    }

    #[test]
    fn applies_only_the_named_paths() {
        let f = fixture();
        session(&f, "20250301-101500-aaaa", |ws, store| {
            Set::new(ws).dir("src", 0o755).file("src/a.rs", b"a\n", 0o644).file("b.txt", b"b\n", 0o644).stage(store)
        });
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["20250301-101500-aaaa", "src"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert!(f.ws.join("src/a.rs").exists() && !f.ws.join("b.txt").exists());
        let (code, _, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["./src"]), execute);
        let err = format!("{:#}", code.unwrap_err());
        assert!(err.contains("PATH src: session 20250301-101500-aaaa has no staged change"), "{err}");
    }
}
