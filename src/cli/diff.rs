//! `stockade diff`: show a session's staged changes.

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::changes::Host;
use crate::review::{Format, Pager, Painter, RenderOptions, Role, Summary, SummaryOptions, Target, View, plural};

use super::Global;
use super::sessions::{self, Here};

/// Show a session's staged changes
///
/// SESSION is an id or a unique prefix of one (`stockade sessions` lists
/// them); without it, the most recent session with staged changes of the
/// workspace you are in (of any, outside them), never one holding an
/// agent's settings for your home directory. PATHs
/// (files or directories; relative to the current directory inside the
/// workspace) limit the diff; a file whose name looks like a session id is
/// given as ./NAME.
///
/// By default: a summary, then a coloured diff of each change through the
/// pager ($STOCKADE_PAGER, $PAGER, or less). Paths git ignores and git's
/// own files are shown collapsed unless named. The old side is the host's
/// file now, the new side what `stockade apply` would write.
///
/// A running session (the default in its workspace) shows its changes so
/// far: the guest exports a checkpoint on request, and the command goes on.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Session id or unique prefix (default: the latest with staged changes
    /// of this workspace).
    #[arg(value_name = "SESSION")]
    session: Option<OsString>,

    /// Only changes at or below these paths.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,

    /// Only the summary: changes grouped by directory with line counts.
    #[arg(long, conflicts_with = "patch")]
    stat: bool,

    /// With --stat: the summary as JSON (paths escaped: non-UTF-8 bytes and
    /// `%` as %XX), for scripts and CI.
    #[arg(long, requires = "stat")]
    json: bool,

    /// A plain git-style patch (for `git apply`), without colour or pager.
    /// Changes inside .git/ are left out: git cannot apply them.
    #[arg(long)]
    patch: bool,

    /// The config file's `runs_code` patterns (read by `run`).
    #[arg(skip)]
    runs_code: Vec<String>,
}

pub fn run(mut args: DiffArgs, global: Global) -> anyhow::Result<ExitCode> {
    args.runs_code = super::settings::Settings::load()?.runs_code.value;
    Here::with_process(global, |here| execute(args, here))
}

pub(super) fn execute(mut args: DiffArgs, here: &mut Here<'_>) -> anyhow::Result<ExitCode> {
    let (session, paths) = sessions::split_positionals(args.session.take(), std::mem::take(&mut args.paths));
    let mut target = sessions::resolve(&here.data, session.as_deref(), &here.cwd)?;
    let live = sessions::checkpoint_if_running(&mut target)?;
    if live.is_some() {
        writeln!(here.err, "stockade: session {} is running; these are its changes so far", target.id)?;
    }
    let code = show(&args, paths, &target, here)?;
    // `apply` lands this checkpoint now, not a fresh one the user never saw.
    if let Some(reading) = &live {
        reading.mark_shown().with_context(|| format!("cannot mark what was shown of session {}", target.id))?;
    }
    Ok(code)
}

fn show(
    args: &DiffArgs,
    paths: Vec<PathBuf>,
    target: &sessions::Target,
    here: &mut Here<'_>,
) -> anyhow::Result<ExitCode> {
    let paths = sessions::workspace_paths(&paths, &here.cwd, &target.workspace, "PATH")?;
    let selection = sessions::selection_of(target, paths.clone(), "PATH")?;
    let expand = paths.is_some();
    let options = SummaryOptions {
        selection,
        count_lines: !args.patch,
        runs_code: args.runs_code.clone(),
        agent_settings: target.agent_settings.is_some(),
        ..SummaryOptions::default()
    };
    let summary = Summary::build(&target.store, &target.workspace, &options)
        .with_context(|| format!("cannot read the staged changes of session {}", target.id))?;
    if summary.is_empty() {
        let counts = &summary.counts;
        writeln!(
            here.err,
            "stockade: session {} has no staged changes ({} applied, {} discarded)",
            target.id, counts.applied, counts.discarded
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        serde_json::to_writer_pretty(&mut *here.out, &summary.to_json(&target.id, &target.workspace))?;
        writeln!(here.out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let host = Host::open(&target.workspace);

    if args.patch {
        let mut out = BufWriter::new(&mut *here.out);
        let view = View { summary: &summary, store: &target.store, host: &host, format: Format::Patch, session: None };
        let report = quiet_pipe(view.write_all(&mut out, true))?;
        quiet_pipe(out.flush())?;
        if report.git > 0 {
            writeln!(
                here.err,
                "stockade: the patch leaves out {} inside .git/ (commits, refs); `stockade apply {} .git` applies them",
                plural(report.git, "change", "changes"),
                target.id
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }

    let painter = Painter::new(here.color.enabled(here.terminal));
    let mut header = format!(
        "session {}: {} to {}",
        target.id,
        plural(summary.tally.total(), "staged change", "staged changes"),
        target.workspace.display()
    );
    if summary.counts.applied + summary.counts.discarded > 0 {
        header.push_str(&format!(" ({} applied, {} discarded)", summary.counts.applied, summary.counts.discarded));
    }
    let render = RenderOptions { painter, limit: if args.stat { None } else { Some(40) }, session: Some(&target.id) };
    let pager = if here.terminal && !args.stat { Pager::from_env(Target::Stdout) } else { Pager::Off };
    let format = Format::Terminal(painter);
    let view = View { summary: &summary, store: &target.store, host: &host, format, session: Some(&target.id) };
    let mut direct = BufWriter::new(&mut *here.out);
    pager.show(&mut direct, &mut |out| {
        writeln!(out, "{}", painter.paint(Role::Heading, &header))?;
        summary.render(out, &render)?;
        if !args.stat {
            writeln!(out)?;
            view.write_all(out, expand)?;
        }
        Ok(())
    })?;
    quiet_pipe(direct.flush())?;
    Ok(ExitCode::SUCCESS)
}

/// `stockade diff | head` is not an error.
fn quiet_pipe<T: Default>(result: io::Result<T>) -> io::Result<T> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(T::default()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::testutil::{Set, write};
    use crate::cli::sessions::fixture::*;
    use crate::util::color::ColorChoice;

    fn staged(f: &Fixture) {
        write(&f.ws.join("src/main.rs"), b"fn main() {}\n");
        session(f, "20250301-101500-aaaa", |ws, store| {
            Set::new(ws)
                .file("src/main.rs", b"fn main() { run() }\n", 0o644)
                .file("notes.txt", b"new\n", 0o644)
                .stage(store)
        });
    }

    #[test]
    fn shows_a_summary_then_the_diff() {
        let f = fixture();
        staged(&f);
        let (code, out, _) = run_in(&f, &f.ws, parse::<DiffArgs>(&[]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS);
        assert!(out.starts_with("session 20250301-101500-aaaa: 2 staged changes to "), "{out}");
        assert!(out.contains("M  src/main.rs") && out.contains("-fn main() {}\n+fn main() { run() }"), "{out}");
        assert!(!out.contains('\x1b'), "no colour when not a terminal: {out}");
    }

    #[test]
    fn stat_lists_and_paths_limit() {
        let f = fixture();
        staged(&f);
        let (_, out, _) = run_in(&f, &f.ws.join("src"), parse::<DiffArgs>(&["--stat", "main.rs"]), execute);
        assert!(out.contains("src/main.rs") && !out.contains("notes.txt") && !out.contains("@@"), "{out}");
        let (_, colored, _) = run_colored(&f, &f.ws, ColorChoice::Always, parse::<DiffArgs>(&["--stat"]), execute);
        assert!(colored.contains('\x1b'), "{colored}");
        let (_, json, _) = run_in(&f, &f.ws, parse::<DiffArgs>(&["--stat", "--json"]), execute);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["staged"], 2);
        assert_eq!(v["changes"][1]["path"], "src/main.rs");
        assert_eq!(v["changes"][1]["status"], "modified");
        assert_eq!(v["changes"][1]["lines"]["added"], 1);
    }

    #[test]
    fn patch_by_session_prefix_is_plain() {
        let f = fixture();
        staged(&f);
        let (code, out, err) =
            run_colored(&f, &f.ws, ColorChoice::Always, parse::<DiffArgs>(&["20250301", "--patch"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{err}");
        assert!(out.starts_with("diff --git a/notes.txt b/notes.txt\nnew file mode 100644\n"), "{out}");
        assert!(!out.contains('\x1b') && !out.contains("session"), "{out}");
    }

    #[test]
    fn an_unknown_session_is_an_error_naming_the_fix() {
        let f = fixture();
        staged(&f);
        let (code, _, _) = run_in(&f, &f.ws, parse::<DiffArgs>(&["1999"]), execute);
        let err = format!("{:#}", code.unwrap_err());
        assert!(err.contains("no session matches \"1999\"") && err.contains("stockade sessions"), "{err}");
    }
}
