//! `stockade diff`: show a session's staged changes.

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::changes::review::{
    ColorChoice, Format, Host, Pager, Painter, RenderOptions, Summary, SummaryOptions, Target, View, plural,
};

use super::sessions::{self, stdout_is_terminal};

/// Show a session's staged changes
///
/// SESSION is an id or a unique prefix of one (`stockade sessions` lists
/// them); without it, the most recent session with staged changes. PATHs
/// (files or directories; relative to the current directory inside the
/// workspace) limit the diff; a file whose name looks like a session id is
/// given as ./NAME.
///
/// By default: a summary, then a coloured diff of each change through the
/// pager ($STOCKADE_PAGER, $PAGER, or less). Paths git ignores and git's
/// own files are shown collapsed unless named. The old side is the host's
/// file now, the new side what `stockade apply` would write.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Session id or unique prefix (default: the latest with staged changes).
    #[arg(value_name = "SESSION")]
    session: Option<OsString>,

    /// Only changes at or below these paths.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,

    /// Only the summary: changes grouped by directory with line counts.
    #[arg(long, conflicts_with = "patch")]
    stat: bool,

    /// A plain git-style patch (for `git apply`), without colour or pager.
    /// Changes inside .git/ are left out: git cannot apply them.
    #[arg(long)]
    patch: bool,

    /// When to colour the output.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    color: ColorChoice,
}

pub fn run(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let (session, paths) = sessions::split_positionals(args.session, args.paths);
    let target = sessions::resolve(session.as_deref())?;
    let paths = sessions::workspace_paths(&paths, &sessions::cwd()?, &target.workspace, "PATH")?;
    let selection = sessions::selection_of(&target, paths.clone(), "PATH")?;
    let expand = paths.is_some();
    let options = SummaryOptions { selection, count_lines: !args.patch, ..SummaryOptions::default() };
    let summary = Summary::build(&target.store, &target.workspace, &options)
        .with_context(|| format!("cannot read the staged changes of session {}", target.id))?;
    if summary.is_empty() {
        let state = target.store.state().map(|s| format!(" ({s:?})").to_lowercase()).unwrap_or_default();
        eprintln!("stockade: session {} has no staged changes{state}", target.id);
        return Ok(ExitCode::SUCCESS);
    }
    let host = Host::open(&target.workspace);
    let stdout = io::stdout();

    if args.patch {
        let mut out = BufWriter::new(stdout.lock());
        let view = View { summary: &summary, store: &target.store, host: &host, format: Format::Patch, session: None };
        let report = quiet_pipe(view.write_all(&mut out, true))?;
        quiet_pipe(out.flush())?;
        if report.git > 0 {
            eprintln!(
                "stockade: the patch leaves out {} inside .git/ (commits, refs); `stockade apply {} .git` applies them",
                plural(report.git, "change", "changes"),
                target.id
            );
        }
        return Ok(ExitCode::SUCCESS);
    }

    let painter = Painter::new(args.color.for_stdout());
    let header = format!(
        "session {}: {} to {}",
        target.id,
        plural(summary.tally.total(), "staged change", "staged changes"),
        target.workspace.display()
    );
    let render = RenderOptions { painter, limit: if args.stat { None } else { Some(40) }, session: Some(&target.id) };
    let pager = if stdout_is_terminal() && !args.stat { Pager::from_env(Target::Stdout) } else { Pager::Off };
    let view = View {
        summary: &summary,
        store: &target.store,
        host: &host,
        format: Format::Terminal(painter),
        session: Some(&target.id),
    };
    let mut direct = BufWriter::new(stdout.lock());
    pager.show(&mut direct, &mut |out| {
        writeln!(out, "{}", painter.paint(crate::changes::review::Role::Heading, &header))?;
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
