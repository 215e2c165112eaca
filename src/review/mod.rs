//! Review of a session's staged changes: the summary and questions after a
//! run, and the pieces `stockade diff`, `apply`, `discard` and `sessions`
//! are built from.
//!
//! It sits on top of `changes`, the write path: it reads the staged store
//! and the workspace (`changes::Host`) and lands what the user chose only
//! through `changes::apply_with_progress`; it writes nothing of the
//! workspace itself.
//!
//! Modules: `classify` (git internals, ignored trees, execution-sensitive
//! paths), `git` (commits and refs from a staged `.git/`), `content` (the
//! two sides of a change), `diff` (one change as a terminal diff or a git patch), `view`
//! (many changes), `summary` (groups, counts, the summary text), `json`
//! (the summary for scripts), `prompt`
//! (the questions), `pager`, `report` (after an apply), `style` (colour).
//!
//! All output goes to the `Console` given (stderr after a run: stdout
//! belongs to the command).

mod classify;
mod content;
mod diff;
mod direnv;
mod git;
mod gitconfig;
mod json;
mod pager;
mod prompt;
mod report;
mod style;
mod summary;
mod view;

#[cfg(test)]
pub(crate) mod testutil;

use std::collections::HashSet;
use std::io::{self, IsTerminal, Write};
use std::path::Path;

use thiserror::Error;

use crate::changes::{
    ApplyOptions, ApplyReport, ChangesError, Counts, Host, OtherTree, Selection, Store, StoredEntry,
    apply_with_progress,
};
use crate::progress::{Meter, Progress};
use crate::protocol::change_set::RelPath;
use crate::protocol::change_set::entry::{Base, Entry, EntryState, Kind};
use crate::util::color::ColorChoice;

pub use classify::check_pattern;
pub use diff::Format;
pub use pager::{Pager, Target};
#[cfg(test)]
pub use prompt::LineAnswers;
pub use prompt::{Answers, Choice, KeyAnswers};
pub use report::{write_apply_report, write_hint};
pub use style::{Painter, Role};
pub use summary::{RenderOptions, Summary, SummaryOptions, plural};
pub use view::View;

/// What the user said about files that run code by themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeChoice {
    /// `--include-code`: "apply all" applies them too. Without it they are
    /// held back, staged, and the review says how to apply them.
    pub include_code: bool,
    /// The user's own patterns of such files (`runs_code` in the config).
    pub runs_code: Vec<String>,
    /// The changes are an agent's settings for the home directory: every
    /// file runs code.
    pub agent_settings: bool,
}

/// `--apply` on `stockade run`: what to do with the guest's changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ApplyMode {
    /// Show a summary and ask (only on a terminal; otherwise keep them staged).
    #[default]
    Ask,
    /// Apply every change that does not conflict with the host, except
    /// files that run code by themselves (unless `--include-code`).
    All,
    /// Apply nothing; keep the changes staged for `stockade apply`.
    None,
}

#[derive(Debug, Error)]
pub enum ReviewError {
    #[error(transparent)]
    Changes(#[from] ChangesError),
    #[error("cannot write the review of the changes")]
    Output(#[from] io::Error),
}

/// How the review ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The command changed nothing (or nothing is left to review).
    NoChanges,
    /// Everything was applied; nothing is left staged.
    AppliedAll,
    /// Some changes were applied, others are still staged.
    AppliedSome,
    /// Nothing was applied; everything is still staged.
    KeptStaged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewOutcome {
    pub decision: Decision,
    /// Entries written to the workspace (or found already in place).
    pub applied: usize,
    /// Entries still staged.
    pub staged: usize,
    /// Chosen entries not applied: conflicts, refusals, failures.
    pub not_applied: usize,
    /// Files that run code, held back from "apply all" (still staged).
    pub held_back: usize,
}

/// Where the review talks: output, answers (none: never ask), colour,
/// pager, and the progress of a long apply.
pub struct Console<'a> {
    pub out: &'a mut dyn Write,
    pub answers: Option<&'a mut dyn Answers>,
    pub painter: Painter,
    pub pager: Pager,
    pub progress: &'a mut dyn Progress,
}

/// Summary lines listed after a run before only directories are shown.
const AFTER_RUN_LIMIT: usize = 40;

/// The review after `stockade run`: prints the summary of the staged
/// changes on stderr and, per `mode`, asks, applies all, or keeps them
/// staged with a hint. It asks only when stdin and stderr are terminals
/// (answers are read from /dev/tty); otherwise `Ask` keeps the changes
/// staged. Never changes the command's exit status: the caller decides.
pub fn after_run(
    store: &Store,
    workspace: &Path,
    session_id: &str,
    mode: ApplyMode,
    color: ColorChoice,
    code: &CodeChoice,
) -> Result<ReviewOutcome, ReviewError> {
    let interactive = io::stdin().is_terminal() && io::stderr().is_terminal();
    let mut keys = match (interactive, mode) {
        (true, ApplyMode::Ask) => match KeyAnswers::open() {
            Ok(keys) => Some(keys),
            Err(e) => {
                tracing::warn!("cannot read answers from /dev/tty: {e}");
                None
            }
        },
        _ => None,
    };
    let mut meter = Meter::stderr("applying the changes", "writes");
    let mut stderr = io::stderr().lock();
    let mut console = Console {
        out: &mut stderr,
        answers: keys.as_mut().map(|k| k as &mut dyn Answers),
        painter: Painter::new(color.for_stderr()),
        pager: if interactive { Pager::from_env(Target::Stderr) } else { Pager::Off },
        progress: &mut meter,
    };
    let options = SummaryOptions {
        runs_code: code.runs_code.clone(),
        agent_settings: code.agent_settings,
        ..SummaryOptions::default()
    };
    review(store, workspace, session_id, mode, code.include_code, &mut console, &options)
}

/// `after_run` with its console and summary options given (tests script
/// the answers here). `include_code`: "apply all" includes the files that
/// run code by themselves.
pub fn review(
    store: &Store,
    workspace: &Path,
    session_id: &str,
    mode: ApplyMode,
    include_code: bool,
    console: &mut Console<'_>,
    options: &SummaryOptions,
) -> Result<ReviewOutcome, ReviewError> {
    let none = ReviewOutcome { decision: Decision::NoChanges, applied: 0, staged: 0, not_applied: 0, held_back: 0 };
    if !store.is_staged() {
        return Ok(none);
    }
    let summary = Summary::build(store, workspace, options)?;
    let p = console.painter;
    if summary.is_empty() {
        if console.answers.is_some() {
            writeln!(console.out, "stockade: the command left the workspace unchanged")?;
        }
        return Ok(none);
    }
    let staged = summary.tally.total();
    writeln!(
        console.out,
        "\nstockade: {} to {} staged by session {session_id}:",
        p.paint(style::Role::Heading, plural(staged, "change", "changes")),
        workspace.display()
    )?;
    let render = RenderOptions { painter: p, limit: Some(AFTER_RUN_LIMIT), session: Some(session_id) };
    summary.render(console.out, &render)?;
    writeln!(console.out)?;

    let choice = match (mode, console.answers.as_deref_mut()) {
        (ApplyMode::None, _) => Choice::Keep,
        (ApplyMode::All, _) => Choice::All,
        (ApplyMode::Ask, None) => {
            writeln!(console.out, "stockade: no terminal to ask on, so nothing was applied")?;
            Choice::Keep
        }
        (ApplyMode::Ask, Some(answers)) => {
            let host = Host::open(workspace);
            let view =
                View { summary: &summary, store, host: &host, format: Format::Terminal(p), session: Some(session_id) };
            let pager = console.pager.clone();
            let prompt = prompt::Prompt { summary: &summary, workspace, painter: p };
            prompt.run(console.out, answers, &mut |what, out| {
                pager.show(out, &mut |w| match what {
                    prompt::Show::All => view.write_all(w, false).map(|_| ()),
                    prompt::Show::Group(key) => view.write_group(w, key),
                    prompt::Show::Item(i) => view.write_item(w, i),
                })
            })?
        }
    };

    let hold = match &choice {
        Choice::AllButCode => true,
        Choice::All => mode == ApplyMode::All && !include_code,
        _ => false,
    };
    let selection = match choice {
        Choice::Keep => {
            write_hint(console.out, p, session_id)?;
            return Ok(ReviewOutcome {
                decision: Decision::KeptStaged,
                applied: 0,
                staged,
                not_applied: 0,
                held_back: 0,
            });
        }
        Choice::All => Selection::all(),
        Choice::AllButCode => Selection::all(),
        Choice::Paths(paths) => Selection::exact(paths),
    };
    // Files that run code go only where the user said so: by name, by
    // `--include-code`, or by answering yes to them.
    let held: Vec<(RelPath, &'static str)> = if hold {
        summary
            .items
            .iter()
            .filter(|i| !i.implied)
            .filter_map(|i| i.danger.map(|d| (i.path().clone(), d.explain())))
            .collect()
    } else {
        Vec::new()
    };
    let selection = selection.except(held.iter().map(|(path, _)| path.clone()));
    let implied = implied_dirs(store)?;
    let options = ApplyOptions { selection, force: Selection::none() };
    let report = apply_with_progress(store, workspace, &options, console.progress)?;
    write_apply_report(console.out, p, &report, &implied, session_id, workspace)?;
    write_held_back(console.out, p, &held, session_id)?;
    let left = change_counts(store)?.staged;
    if left > 0 {
        writeln!(console.out, "stockade: {} still staged", plural(left, "change is", "changes are"))?;
        write_hint(console.out, p, session_id)?;
    }
    Ok(ReviewOutcome { held_back: held.len(), ..outcome(&report, &implied, left) })
}

/// The files that run code held back from an "apply all", each with what
/// it does, and the commands that apply them.
pub fn write_held_back(
    out: &mut dyn Write,
    p: Painter,
    held: &[(RelPath, &'static str)],
    session_id: &str,
) -> io::Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    let heading = format!(
        "held back {} that {} code by {} (still staged):",
        plural(held.len(), "file", "files"),
        if held.len() == 1 { "runs" } else { "run" },
        if held.len() == 1 { "itself" } else { "themselves" }
    );
    writeln!(out, "stockade: {}", p.paint(style::Role::Danger, heading))?;
    for (path, why) in held {
        writeln!(out, "  {path}: {why}")?;
    }
    writeln!(
        out,
        "stockade: review them with `stockade diff {session_id} PATH`, then apply them all with \
         `{}` or one by one with `stockade apply {session_id} PATH`",
        p.paint(style::Role::Heading, include_code_command(session_id))
    )
}

/// The command that applies everything staged, held-back files included.
pub fn include_code_command(session_id: &str) -> String {
    format!("stockade apply {session_id} --include-code")
}

/// Staged entries in `selection` that run code by themselves, each with
/// what it does (for a warning after `stockade apply`).
pub fn sensitive_paths(
    store: &Store,
    workspace: &Path,
    selection: &Selection,
    code: &CodeChoice,
) -> Result<Vec<(RelPath, &'static str)>, ChangesError> {
    sensitive_paths_among(store, workspace, selection, code, None)
}

/// As [`sensitive_paths`], judged also with `other`: the tree the changes
/// land on when it is not the working tree (the base commit of `apply
/// --branch`). Its symlinks count where no staged change is.
pub fn sensitive_paths_among(
    store: &Store,
    workspace: &Path,
    selection: &Selection,
    code: &CodeChoice,
    other: Option<&dyn OtherTree>,
) -> Result<Vec<(RelPath, &'static str)>, ChangesError> {
    let host = Host::open(workspace);
    let staged: Vec<StoredEntry> = store.entries()?.into_iter().filter(|e| e.state == EntryState::Staged).collect();
    let paths: HashSet<&RelPath> = staged.iter().map(|e| &e.entry.path).collect();
    let links = other.map(|o| o.symlinks()).unwrap_or_default();
    let around = links.iter().filter(|l| !paths.contains(&l.path));
    let all = staged.iter().map(|e| &e.entry).chain(around);
    let mut classifier = classifier_for(&host, workspace, store, all, false, &code.runs_code, other);
    classifier = classifier.agent_settings(code.agent_settings);
    Ok(staged
        .into_iter()
        .filter(|e| selection.matches(&e.entry.path))
        .filter_map(|e| classifier.danger(&e.entry).map(|d| (e.entry.path, d.explain())))
        .collect())
}

/// The classifier of a staged change set, with the user's `runs_code`
/// patterns. The whole staged set informs the judgement: a symlink
/// elsewhere may make a file a hook, a `pyvenv.cfg` makes a `bin/` a
/// virtualenv's, a staged `.envrc` puts directories on `PATH`.
fn classifier_for<'h, 'e, I>(
    host: &'h Host,
    workspace: &Path,
    store: &Store,
    staged: I,
    global_excludes: bool,
    runs_code: &[String],
    other: Option<&'h dyn OtherTree>,
) -> classify::Classifier<'h>
where
    I: IntoIterator<Item = &'e Entry> + Clone,
{
    let mut classifier = classify::Classifier::new(host, workspace, global_excludes).with_patterns(runs_code);
    if let Some(other) = other {
        classifier = classifier.with_other(other, workspace);
    }
    classifier.learn(staged.clone());
    // A staged `.envrc` and the staged files it loads, as they would be.
    let mut read = HashSet::new();
    while read.len() < classify::MAX_ENVRC_FILES {
        let files = classifier.envrc_files();
        let next = staged
            .clone()
            .into_iter()
            .find(|e| !read.contains(e.path.as_bytes()) && files.iter().any(|f| f.as_slice() == e.path.as_bytes()));
        let Some(entry) = next else { break };
        read.insert(entry.path.as_bytes().to_vec());
        match content::new_side(store, entry, &content::Side::Absent, ENVRC_LIMIT) {
            content::Side::File(content::FileData { bytes: Some(text), .. }) => {
                classifier.learn_envrc(Some(&text), workspace)
            }
            content::Side::Absent => {}
            _ => classifier.learn_envrc(None, workspace),
        }
    }
    classifier
}

/// A staged `.envrc` larger than this is read as far as this.
const ENVRC_LIMIT: u64 = 1 << 20;

/// New directories that hold other entries: shown and counted through
/// their contents, so that the numbers people see agree everywhere.
pub fn implied_dirs(store: &Store) -> Result<HashSet<RelPath>, ChangesError> {
    if !store.is_staged() {
        return Ok(HashSet::new());
    }
    Ok(implied_in(&store.entries()?))
}

fn implied_in(entries: &[StoredEntry]) -> HashSet<RelPath> {
    entries
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            matches!((&e.entry.kind, &e.entry.base), (Kind::Dir { .. }, Base::Absent))
                && entries.get(i + 1).is_some_and(|next| next.entry.path.starts_with(&e.entry.path))
        })
        .map(|(_, e)| e.entry.path.clone())
        .collect()
}

/// Entries per review state, implied directories left out.
pub fn change_counts(store: &Store) -> Result<Counts, ChangesError> {
    if !store.is_staged() {
        return Ok(Counts::default());
    }
    Ok(counts_of(&store.entries()?))
}

fn counts_of(entries: &[StoredEntry]) -> Counts {
    let implied = implied_in(entries);
    let mut counts = Counts::default();
    for e in entries.iter().filter(|e| !implied.contains(&e.entry.path)) {
        match e.state {
            EntryState::Staged => counts.staged += 1,
            EntryState::Applied => counts.applied += 1,
            EntryState::Discarded => counts.discarded += 1,
        }
    }
    counts
}

fn outcome(report: &ApplyReport, implied: &HashSet<RelPath>, staged: usize) -> ReviewOutcome {
    let applied = report.applied.iter().chain(&report.already).filter(|p| !implied.contains(*p)).count();
    let decision = match (applied, staged) {
        (0, _) => Decision::KeptStaged,
        (_, 0) => Decision::AppliedAll,
        _ => Decision::AppliedSome,
    };
    ReviewOutcome { decision, applied, staged, not_applied: report.skipped(), held_back: 0 }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
