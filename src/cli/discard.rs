//! `stockade discard`: drop a session's staged changes.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::changes::review::{change_counts, plural};

use super::Global;
use super::sessions::{self, Here};

/// Drop a session's staged changes without applying them
///
/// SESSION is an id or a unique prefix of one; without it, the most recent
/// session with staged changes of the workspace you are in (of any, outside
/// them), never one holding an agent's settings for your home directory.
/// Without PATHs every staged change is
/// dropped; with them, the changes at or below those paths. The workspace
/// is not touched. Changes already applied stay applied.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// Session id or unique prefix (default: the latest with staged changes
    /// of this workspace).
    #[arg(value_name = "SESSION")]
    session: Option<OsString>,

    /// Only changes at or below these paths.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
}

pub fn run(args: DiscardArgs, global: Global) -> anyhow::Result<ExitCode> {
    Here::with_process(global, |here| execute(args, here))
}

pub(super) fn execute(args: DiscardArgs, here: &mut Here<'_>) -> anyhow::Result<ExitCode> {
    let (session, paths) = sessions::split_positionals(args.session, args.paths);
    let target = sessions::resolve(&here.data, session.as_deref(), &here.cwd)?;
    let paths = sessions::workspace_paths(&paths, &here.cwd, &target.workspace, "PATH")?;
    let selection = sessions::selection_of(&target, paths, "PATH")?;
    let before = change_counts(&target.store)?.staged;
    target.store.discard(&selection).with_context(|| format!("cannot discard the changes of session {}", target.id))?;
    let left = change_counts(&target.store)?.staged;
    let dropped = before - left;
    if dropped == 0 {
        writeln!(here.out, "stockade: session {} has nothing staged to discard", target.id)?;
    } else {
        let what = plural(dropped, "staged change", "staged changes");
        writeln!(here.out, "stockade: discarded {what} of session {}", target.id)?;
    }
    if left > 0 {
        writeln!(here.out, "stockade: {} still staged", plural(left, "change is", "changes are"))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::review::testutil::Set;
    use crate::cli::sessions::fixture::*;

    #[test]
    fn discards_some_or_all_without_touching_the_workspace() {
        let f = fixture();
        session(&f, "20250301-101500-aaaa", |ws, store| {
            Set::new(ws).dir("src", 0o755).file("src/a.rs", b"a\n", 0o644).file("b.txt", b"b\n", 0o644).stage(store)
        });
        let (code, out, _) = run_in(&f, &f.ws, parse::<DiscardArgs>(&["b.txt"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS);
        assert_eq!(
            out,
            "stockade: discarded 1 staged change of session 20250301-101500-aaaa\nstockade: 1 change is still staged\n"
        );
        let (_, out, _) = run_in(&f, &f.ws, parse::<DiscardArgs>(&["20250301"]), execute);
        assert_eq!(out, "stockade: discarded 1 staged change of session 20250301-101500-aaaa\n");
        assert!(!f.ws.join("src").exists() && !f.ws.join("b.txt").exists());
    }
}
