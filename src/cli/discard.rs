//! `stockade discard`: drop a session's staged changes.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use crate::review::{change_counts, plural};
use crate::session;

use super::Global;
use super::sessions::{self, Here};

/// Drop a session's staged changes without applying them
///
/// SESSION is an id or a unique prefix of one; without it, the most recent
/// session with staged changes of the workspace you are in (of any, outside
/// them), never one holding an agent's settings for your home directory.
/// Without PATHs every staged change is
/// dropped; with them, the changes at or below those paths. The workspace
/// is not touched. Changes already applied stay applied. A running
/// session's changes are discarded once its command ends: until then they
/// are the guest's.
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
    refuse_if_running(&target)?;
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

/// A running session's changes are the guest's: dropping them from a
/// checkpoint would not take them out of the guest, whose final export
/// would offer them again (and the guest may still build on them).
fn refuse_if_running(target: &sessions::Target) -> anyhow::Result<()> {
    let dir = target.store.dir().parent().unwrap_or(target.store.dir());
    if session::is_running(dir) {
        bail!(
            "session {id} is running: its changes are still in the guest, which goes on with them and would stage \
             them again when the command ends, so none is discarded now. Discard them once the command ends \
             (`stockade discard {id} [PATH...]`); meanwhile `stockade diff {id}` shows them and `stockade apply {id} \
             PATH` takes only those you want",
            id = target.id
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::testutil::Set;
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

    /// A running session's changes live in its guest: dropping them from a
    /// checkpoint would not take them from the guest, and its final export
    /// would offer them again. `discard` refuses and says what to do, and
    /// drops nothing, named or by default.
    #[test]
    fn a_running_session_is_refused_with_what_to_do() {
        let f = fixture();
        let id = "20250301-101500-aaaa";
        session(&f, id, |ws, store| Set::new(ws).file("b.txt", b"b\n", 0o644).stage(store));
        let dir = crate::session::sessions_dir(&f.data).join(id);
        let running = crate::session::Session::resume(&dir, id, std::time::SystemTime::now()).unwrap();
        for argv in [&[][..], &[id, "b.txt"][..]] {
            let (code, out, _) = run_in(&f, &f.ws, parse::<DiscardArgs>(argv), execute);
            let err = format!("{:#}", code.unwrap_err());
            assert!(err.contains(&format!("session {id} is running")), "{err}");
            assert!(err.contains("once the command ends"), "{err}");
            assert!(err.contains(&format!("`stockade discard {id}")), "{err}");
            assert!(out.is_empty(), "{out}");
        }
        assert_eq!(change_counts(&crate::changes::Store::open(&dir).unwrap()).unwrap().staged, 1);
        drop(running);
        let (code, out, _) = run_in(&f, &f.ws, parse::<DiscardArgs>(&[]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS);
        assert!(out.contains("discarded 1 staged change"), "{out}");
    }
}
