//! `stockade discard`: drop a session's staged changes.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::changes::review::plural;

use super::sessions;

/// Drop a session's staged changes without applying them
///
/// SESSION is an id or a unique prefix of one; without it, the most recent
/// session with staged changes. Without PATHs every staged change is
/// dropped; with them, the changes at or below those paths. The workspace
/// is not touched. Changes already applied stay applied.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// Session id or unique prefix (default: the latest with staged changes).
    #[arg(value_name = "SESSION")]
    session: Option<OsString>,

    /// Only changes at or below these paths.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
}

pub fn run(args: DiscardArgs) -> anyhow::Result<ExitCode> {
    let (session, paths) = sessions::split_positionals(args.session, args.paths);
    let target = sessions::resolve(session.as_deref())?;
    let paths = sessions::workspace_paths(&paths, &sessions::cwd()?, &target.workspace, "PATH")?;
    let selection = sessions::selection_of(&target, paths, "PATH")?;
    let dropped = target
        .store
        .discard(&selection)
        .with_context(|| format!("cannot discard the changes of session {}", target.id))?;
    let left = target.store.counts()?.staged;
    if dropped == 0 {
        println!("stockade: session {} has nothing staged to discard", target.id);
    } else {
        println!("stockade: discarded {} of session {}", plural(dropped, "staged change", "staged changes"), target.id);
    }
    if left > 0 {
        println!("stockade: {} still staged", plural(left, "change is", "changes are"));
    }
    Ok(ExitCode::SUCCESS)
}
