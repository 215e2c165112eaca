//! Staged changes as git commits, made on the host: `stockade apply
//! --branch` writes them as one commit on a new branch, parented on the
//! commit the session started from; `--commit` commits what an apply just
//! wrote, on the current branch. Only plumbing on a temporary index
//! (`hash-object`, `read-tree`, `update-index --index-info`, `write-tree`,
//! `commit-tree`, `update-ref` with the old value given), so the working
//! tree and the user's index are never touched by a branch, and a ref is
//! never overwritten by a race.
//!
//! The repository may be hostile (its `.git/config` is not the user's
//! choice): git runs with the `GIT_*` environment dropped (the identity
//! variables kept) and with every setting through which these commands
//! could start a program overridden on its command line; see
//! [`Repo::command`]. Content is hashed as staged (`--no-filters`: no
//! clean filter, no line-ending conversion) and commits are not signed
//! (`commit-tree` signs only with `-S`). A file the repository names may be
//! a FIFO that git would wait on for ever: its `core.excludesFile` is
//! replaced by the user's own, and every git command is stopped after a
//! deadline (an include that is a FIFO blocks any command).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::ChangesError;
use super::other_tree::{OtherTree, TreeFile};
use super::store::Store;
use crate::protocol::change_set::entry::{Base, Entry, Kind, SymlinkTarget};
use crate::protocol::change_set::path::RelPath;
use crate::util::digest::Sha256;
use crate::util::text::display_bytes;

/// Settings a repository's own config could use to run a program or reach
/// the network during the plumbing run here, each overridden.
const SAFE_CONFIG: &[&str] = &[
    // Index reads may query a file-system monitor program.
    "core.fsmonitor=false",
    // `update-ref` runs the reference-transaction hook; gc runs pre-auto-gc.
    "core.hooksPath=/dev/null",
    // A partial clone fetches missing objects through a transport
    // (`core.sshCommand`, remote helpers): none is allowed.
    "protocol.allow=never",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "commit.gpgSign=false",
    "core.untrackedCache=false",
    // The index refuses names that some file systems read as `.git`
    // (`GIT~1`, `.git.`, `.g\u200cit`) only while these are on; a
    // repository must not switch them off.
    "core.protectNTFS=true",
    "core.protectHFS=true",
];

/// `GIT_*` variables kept from the user's environment: who commits.
const KEPT_ENV: &[&str] = &[
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
];

#[derive(Debug, Error)]
pub enum GitError {
    #[error("cannot run git: {0}; install git, or apply without --branch and --commit")]
    Spawn(#[source] io::Error),
    #[error(
        "{} is not in a git repository ({detail}); run `git init` there first, or apply without --branch and --commit",
        workspace.display()
    )]
    NotARepo { workspace: PathBuf, detail: String },
    #[error("{name:?} is not a valid branch name (`git check-ref-format --branch` refuses it); choose another NAME")]
    BadName { name: String },
    #[error(
        "branch {name} already exists (at {at}); nothing was written. Choose another NAME, or delete it first \
         with `git branch -D {name}`"
    )]
    Exists { name: String, at: String },
    #[error(
        "refs/heads/{name} already exists as a symbolic ref to {to}; nothing was written. Choose another NAME, \
         or remove it first with `git symbolic-ref --delete refs/heads/{name}`"
    )]
    ExistsSymbolic { name: String, to: String },
    #[error(
        "the session started from commit {0}, which is not in the repository any more; \
         apply without --branch, or make the branch with `git branch` and apply there"
    )]
    MissingBase(String),
    /// The chosen changes leave the tree as it was (everything chosen is
    /// left out, or a new empty directory): no commit is made.
    #[error("none of the chosen changes would change what the commit holds, so no commit was made")]
    NothingToCommit { left: Vec<(RelPath, LeftOut)> },
    #[error(
        "git's index could not be updated ({detail}); nothing was committed and HEAD did not move. If no other \
         git is running, remove .git/index.lock; then commit the applied paths with `git add` and `git commit`"
    )]
    IndexNotUpdated { detail: String },
    #[error(
        "HEAD could not be moved to the new commit ({detail}); nothing was committed, and git's index now stages \
         the applied paths: review them with `git diff --cached` and commit them with `git commit`"
    )]
    HeadNotMoved { detail: String },
    #[error("git {what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error(
        "git {what} did not finish within {} s and was stopped; the repository's config may name a FIFO or \
         device that git waits on (an include.path, core.excludesFile or core.attributesFile in {}/.git/config): \
         fix that setting, or apply without --branch and --commit",
        deadline.as_secs(), workspace.display()
    )]
    TimedOut { what: String, deadline: Duration, workspace: PathBuf },
    #[error(transparent)]
    Changes(#[from] ChangesError),
}

/// Why a chosen change is not in the commit; it stays staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftOut {
    /// A path inside a `.git` directory: git internals never come from the
    /// guest as content of a commit.
    GitDir,
    /// A new path the repository's ignore rules exclude (`git add` would
    /// refuse it too).
    Ignored,
    /// Below a submodule, whose content is another repository's.
    InSubmodule(String),
    /// A mode change of a file the base commit does not hold: its content
    /// is not in the session.
    ModeOfUntracked,
    /// A path git refuses in its index and so in a commit (a name some
    /// file systems read as `.git`, like `GIT~1` or `.git.`, or a
    /// `.gitmodules` symlink).
    Refused,
}

impl LeftOut {
    pub fn explain(&self) -> String {
        match self {
            LeftOut::GitDir => "inside .git: git internals are never committed from the guest".into(),
            LeftOut::Ignored => "ignored by git".into(),
            LeftOut::InSubmodule(sub) => format!("inside the submodule {sub}: commit it there"),
            LeftOut::ModeOfUntracked => "a mode change of a file the base commit does not hold".into(),
            LeftOut::Refused => "git refuses this path in a commit (it can stand for .git or .gitmodules on some \
                                 file systems); apply it without --branch/--commit, or rename it"
                .into(),
        }
    }
}

/// A commit made from staged changes.
#[derive(Debug, Clone)]
pub struct Landed {
    pub commit: String,
    /// Its parent (`None`: a root commit of an unborn branch).
    pub parent: Option<String>,
    /// Entries whose change the commit holds (or that git cannot hold,
    /// like a new empty directory): mark them applied.
    pub committed: Vec<RelPath>,
    pub left: Vec<(RelPath, LeftOut)>,
}

/// One index entry: git mode and object id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    mode: u32,
    oid: String,
}

const GITLINK: u32 = 0o160000;
const SYMLINK: u32 = 0o120000;

/// The git repository holding a workspace.
#[derive(Debug)]
pub struct Repo {
    workspace: PathBuf,
    /// Where the workspace is in the repository: empty, or `dir/sub/`.
    prefix: Vec<u8>,
    /// The filter drivers the repository's config defines (`filter.NAME.*`),
    /// each switched off: git runs a clean filter even in plumbing when it
    /// writes the user's index and checks an entry that may have changed
    /// within the same second.
    filters: Vec<String>,
    /// The user's own excludes file, which git is given in place of
    /// whatever the repository's config names (a FIFO there would block
    /// it).
    excludes: PathBuf,
    /// How long one git command may take before it is stopped.
    deadline: Duration,
}

/// How long one git command may take. Plumbing on a repository ends in
/// seconds; a command still running after this waits on something the
/// repository named (a FIFO as an include) and would wait for ever.
const GIT_DEADLINE: Duration = Duration::from_secs(600);

/// The commit the workspace's repository has checked out, for the run
/// record (`None` outside a repository, on an unborn branch, or when git
/// cannot be run).
pub fn head_of(workspace: &Path) -> Option<String> {
    Repo::open(workspace).ok()?.head().ok().flatten()
}

impl Repo {
    pub fn open(workspace: &Path) -> Result<Repo, GitError> {
        Repo::open_within(workspace, GIT_DEADLINE)
    }

    /// `open`, each git command stopped after `deadline`.
    fn open_within(workspace: &Path, deadline: Duration) -> Result<Repo, GitError> {
        let repo = Repo {
            workspace: workspace.to_path_buf(),
            prefix: Vec::new(),
            filters: Vec::new(),
            excludes: PathBuf::new(),
            deadline,
        };
        let out = repo.output(&["rev-parse", "--is-bare-repository", "--show-prefix"], None, None)?;
        if !out.status.success() {
            return Err(GitError::NotARepo { workspace: workspace.to_path_buf(), detail: stderr_line(&out) });
        }
        let mut lines = out.stdout.split(|&b| b == b'\n');
        if lines.next() != Some(b"false") {
            return Err(GitError::NotARepo {
                workspace: workspace.to_path_buf(),
                detail: "the repository is bare".into(),
            });
        }
        let prefix = lines.next().unwrap_or_default().to_vec();
        let out = repo.output(&["config", "--name-only", "-z", "--get-regexp", r"^filter\."], None, None)?;
        let mut filters: Vec<String> = out
            .stdout
            .split(|&b| b == 0)
            .filter_map(|key| {
                let key = std::str::from_utf8(key).ok()?;
                let rest = key.strip_prefix("filter.")?;
                Some(rest[..rest.rfind('.')?].to_string())
            })
            .collect();
        filters.sort();
        filters.dedup();
        let excludes = repo.users_excludes()?;
        Ok(Repo { prefix, filters, excludes, ..repo })
    }

    /// The excludes file of the user's own config (`--global`, read
    /// outside any repository), or git's default for it.
    fn users_excludes(&self) -> Result<PathBuf, GitError> {
        let mut cmd = self.command(None);
        cmd.current_dir("/").args(["config", "--global", "--path", "--get", "core.excludesFile"]);
        let out = self.output_of(cmd, None)?;
        let value = String::from_utf8_lossy(&out.stdout).trim_end_matches('\n').to_string();
        if out.status.success() && !value.is_empty() {
            return Ok(PathBuf::from(value));
        }
        let dir = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Ok(match (dir("XDG_CONFIG_HOME"), dir("HOME")) {
            (Some(config), _) => config.join("git/ignore"),
            (None, Some(home)) => home.join(".config/git/ignore"),
            // git has none then; a relative default would name a file of the
            // repository's.
            (None, None) => PathBuf::from("/dev/null"),
        })
    }

    /// git, safe in a hostile repository: in the workspace, with the
    /// user's `GIT_*` variables dropped (but the identity), with no
    /// replace refs, lazy fetches or prompts, and [`SAFE_CONFIG`].
    fn command(&self, index: Option<&Path>) -> Command {
        let mut cmd = Command::new("git");
        cmd.current_dir(&self.workspace);
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if text.starts_with("GIT_") && !KEPT_ENV.contains(&text.as_ref()) {
                cmd.env_remove(&name);
            }
        }
        // A guest's file name is never pathspec magic (`:!x`, `:(top)`).
        cmd.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_LITERAL_PATHSPECS", "1")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_NO_LAZY_FETCH", "1")
            .env("GIT_PAGER", "cat");
        if let Some(index) = index {
            cmd.env("GIT_INDEX_FILE", index);
        }
        for setting in SAFE_CONFIG {
            cmd.arg("-c").arg(setting);
        }
        // Through the environment, which takes a key verbatim (`-c` would
        // split a driver name holding `=`).
        let mut count = 0;
        for name in &self.filters {
            for (what, value) in [("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")] {
                cmd.env(format!("GIT_CONFIG_KEY_{count}"), format!("filter.{name}.{what}"));
                cmd.env(format!("GIT_CONFIG_VALUE_{count}"), value);
                count += 1;
            }
        }
        // The repository's own core.excludesFile may name a FIFO, on which
        // `check-ignore` and `read-tree` block: the user's own one counts.
        if !self.excludes.as_os_str().is_empty() {
            cmd.env(format!("GIT_CONFIG_KEY_{count}"), "core.excludesFile");
            cmd.env(format!("GIT_CONFIG_VALUE_{count}"), &self.excludes);
            count += 1;
        }
        cmd.env("GIT_CONFIG_COUNT", count.to_string());
        cmd
    }

    fn output(&self, args: &[&str], index: Option<&Path>, input: Option<&[u8]>) -> Result<Output, GitError> {
        let mut cmd = self.command(index);
        cmd.args(args);
        self.output_of(cmd, input)
    }

    fn output_of(&self, mut cmd: Command, input: Option<&[u8]>) -> Result<Output, GitError> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
        let what = subcommand(&cmd);
        let mut child = cmd.spawn().map_err(GitError::Spawn)?;
        // Written and read from threads: git may answer before it has read
        // it all, and the wait below must be able to give up.
        let writer = match (input, child.stdin.take()) {
            (Some(bytes), Some(mut stdin)) => {
                let bytes = bytes.to_vec();
                Some(std::thread::spawn(move || stdin.write_all(&bytes)))
            }
            _ => None,
        };
        let stdout = child.stdout.take().map(|out| std::thread::spawn(move || read_all(out, u64::MAX)));
        let stderr = child.stderr.take().map(|err| std::thread::spawn(move || read_all(err, u64::MAX)));
        let status = self.wait(&mut child, what);
        if let Some(writer) = writer {
            // A broken pipe shows as git's own failure below.
            let _ = writer.join();
        }
        let collect =
            |reader: Option<std::thread::JoinHandle<Vec<u8>>>| reader.and_then(|r| r.join().ok()).unwrap_or_default();
        let (stdout, stderr) = (collect(stdout), collect(stderr));
        Ok(Output { status: status?, stdout, stderr })
    }

    /// Waits for `child`, stopping it after the deadline.
    fn wait(&self, child: &mut Child, what: String) -> Result<ExitStatus, GitError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(status) = child.try_wait().map_err(GitError::Spawn)? {
                return Ok(status);
            }
            if start.elapsed() >= self.deadline {
                // Not reaped yet, so the id is still this child's.
                let _ = child.kill();
                let _ = child.wait();
                return Err(GitError::TimedOut { what, deadline: self.deadline, workspace: self.workspace.clone() });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// The first `limit` bytes of the blob `oid`. git's output is read
    /// only as far as that (git then stops on the closed pipe), so a small
    /// object that inflates to gigabytes costs no memory.
    fn blob_head(&self, oid: &str, limit: u64) -> Result<Vec<u8>, GitError> {
        let mut cmd = self.command(None);
        cmd.args(["cat-file", "blob", oid]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(GitError::Spawn)?;
        let reader = child.stdout.take().map(|out| std::thread::spawn(move || read_all(out, limit)));
        let status = self.wait(&mut child, "cat-file".into());
        let bytes = reader.and_then(|r| r.join().ok()).unwrap_or_default();
        let full = u64::try_from(bytes.len()).unwrap_or(u64::MAX) >= limit;
        match status? {
            status if status.success() || full => Ok(bytes),
            status => Err(GitError::Failed { what: "cat-file".into(), detail: format!("git {status}") }),
        }
    }

    /// Runs git; its stdout when it succeeds.
    fn run(&self, args: &[&str], index: Option<&Path>, input: Option<&[u8]>) -> Result<Vec<u8>, GitError> {
        let out = self.output(args, index, input)?;
        if !out.status.success() {
            return Err(GitError::Failed { what: args[0].to_string(), detail: stderr_line(&out) });
        }
        Ok(out.stdout)
    }

    fn run_line(&self, args: &[&str]) -> Result<String, GitError> {
        Ok(String::from_utf8_lossy(&self.run(args, None, None)?).trim().to_string())
    }

    /// The commit `HEAD` names; `None` on an unborn branch.
    pub fn head(&self) -> Result<Option<String>, GitError> {
        self.resolve("HEAD")
    }

    fn resolve(&self, name: &str) -> Result<Option<String>, GitError> {
        let spec = format!("{name}^{{commit}}");
        let out = self.output(&["rev-parse", "-q", "--verify", "--end-of-options", &spec], None, None)?;
        Ok(out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    /// `refs/heads/NAME` for a new branch: a valid name, not taken.
    pub fn new_branch(&self, name: &str) -> Result<String, GitError> {
        let bad = || GitError::BadName { name: name.to_string() };
        if name.is_empty() || name.starts_with('-') {
            return Err(bad());
        }
        let out = self.output(&["check-ref-format", "--branch", name], None, None)?;
        // `@{-1}` and the like expand to another name: only a plain one.
        if !out.status.success() || String::from_utf8_lossy(&out.stdout).trim() != name {
            return Err(bad());
        }
        let reference = format!("refs/heads/{name}");
        // A symbolic ref, even one pointing nowhere, is taken: the branch
        // would land on whatever it names.
        let out = self.output(&["symbolic-ref", "-q", &reference], None, None)?;
        if out.status.success() {
            let to = String::from_utf8_lossy(&out.stdout).trim().to_string();
            return Err(GitError::ExistsSymbolic { name: name.to_string(), to });
        }
        let out = self.output(&["rev-parse", "-q", "--verify", &reference], None, None)?;
        if out.status.success() {
            let at = String::from_utf8_lossy(&out.stdout).trim().to_string();
            return Err(GitError::Exists { name: name.to_string(), at });
        }
        Ok(reference)
    }

    /// The commit the session started from, checked to be here.
    pub fn base(&self, commit: &str) -> Result<String, GitError> {
        match self.resolve(commit)? {
            Some(id) if id == commit => Ok(id),
            _ => Err(GitError::MissingBase(commit.to_string())),
        }
    }

    /// Every entry of `commit`'s tree, by path in the repository.
    fn tree(&self, commit: Option<&str>) -> Result<BTreeMap<Vec<u8>, Item>, GitError> {
        let mut tree = BTreeMap::new();
        let Some(commit) = commit else { return Ok(tree) };
        let listing = self.run(&["ls-tree", "-r", "-z", "--full-tree", commit], None, None)?;
        for record in listing.split(|&b| b == 0).filter(|r| !r.is_empty()) {
            let parsed = (|| {
                let tab = record.iter().position(|&b| b == b'\t')?;
                let head = std::str::from_utf8(&record[..tab]).ok()?;
                let mut fields = head.split(' ');
                let mode = u32::from_str_radix(fields.next()?, 8).ok()?;
                let oid = fields.nth(1)?.to_string();
                Some((record[tab + 1..].to_vec(), Item { mode, oid }))
            })();
            let (path, item) = parsed.ok_or_else(|| GitError::Failed {
                what: "ls-tree".into(),
                detail: format!("unexpected output {:?}", display_bytes(record)),
            })?;
            tree.insert(path, item);
        }
        Ok(tree)
    }

    /// `commit`'s tree within the workspace, read for the review of what
    /// a branch built on it holds (see [`CommitTree`]).
    pub fn tree_at(&self, commit: &str) -> Result<CommitTree<'_>, GitError> {
        let files: BTreeMap<RelPath, Item> = self
            .tree(Some(commit))?
            .into_iter()
            .filter_map(|(path, item)| {
                let rel = RelPath::new(path.strip_prefix(&self.prefix[..])?.to_vec()).ok()?;
                Some((rel, item))
            })
            .collect();
        let links: Vec<(&RelPath, &Item)> = files.iter().filter(|(_, item)| item.mode == SYMLINK).collect();
        let mut entries = Vec::new();
        if !links.is_empty() {
            let input: Vec<u8> = links.iter().flat_map(|(_, item)| format!("{}\n", item.oid).into_bytes()).collect();
            let out = self.run(&["cat-file", "--batch"], None, Some(&input))?;
            let bad = || GitError::Failed { what: "cat-file".into(), detail: "unexpected output".into() };
            let mut rest = &out[..];
            for (path, _) in links {
                let newline = rest.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
                let header = std::str::from_utf8(&rest[..newline]).map_err(|_| bad())?;
                let size: usize = header.rsplit(' ').next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
                let body = rest.get(newline + 1..newline + 1 + size).ok_or_else(bad)?;
                rest = rest.get(newline + 2 + size..).unwrap_or_default();
                // git checks a link out with its blob up to the first NUL
                // as the target (`symlink(2)` reads a C string).
                let body = body.split(|&b| b == 0).next().unwrap_or_default();
                if let Ok(target) = SymlinkTarget::new(body.to_vec()) {
                    entries.push(Entry { path: path.clone(), kind: Kind::Symlink { target }, base: Base::Absent });
                }
            }
        }
        Ok(CommitTree { repo: self, files, links: entries })
    }

    /// Writes the staged blobs and symlink targets of `entries` as git
    /// objects; their ids by content hash and by symlink path.
    fn write_objects(&self, store: &Store, entries: &[&Entry]) -> Result<HashMap<Vec<u8>, String>, GitError> {
        let mut ids = HashMap::new();
        let mut blobs: Vec<Sha256> = Vec::new();
        let mut seen = HashSet::new();
        for e in entries {
            match &e.kind {
                Kind::File { sha256, .. } if seen.insert(*sha256) => blobs.push(*sha256),
                Kind::Symlink { target } => {
                    let id =
                        self.run(&["hash-object", "-w", "--no-filters", "--stdin"], None, Some(target.as_bytes()))?;
                    ids.insert(symlink_key(&e.path), String::from_utf8_lossy(&id).trim().to_string());
                }
                _ => {}
            }
        }
        if blobs.is_empty() {
            return Ok(ids);
        }
        let mut list = Vec::new();
        for sha in &blobs {
            let path = store.blob_path(sha);
            let bytes = path.as_os_str().as_bytes();
            if bytes.contains(&b'\n') {
                return Err(GitError::Failed {
                    what: "hash-object".into(),
                    detail: format!("the change store {} has a newline in its path", store.dir().display()),
                });
            }
            list.extend_from_slice(bytes);
            list.push(b'\n');
        }
        let out = self.run(&["hash-object", "-w", "--no-filters", "--stdin-paths"], None, Some(&list))?;
        let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
        if lines.len() != blobs.len() {
            return Err(GitError::Failed {
                what: "hash-object".into(),
                detail: format!("{} ids for {} files", lines.len(), blobs.len()),
            });
        }
        for (sha, line) in blobs.iter().zip(lines) {
            ids.insert(sha.0.to_vec(), String::from_utf8_lossy(line).to_string());
        }
        Ok(ids)
    }

    /// Which of these workspace paths the ignore rules exclude, as
    /// repository paths.
    fn ignored(&self, paths: &[&RelPath]) -> Result<HashSet<Vec<u8>>, GitError> {
        if paths.is_empty() {
            return Ok(HashSet::new());
        }
        // check-ignore takes pathspecs but refuses literal ones: each path
        // goes as `./path`, which no magic starts with. A path below a
        // symlink of the working tree makes it die ("beyond a symbolic
        // link"): those are not asked, and count as not ignored (their
        // directory's ignore rules are not the working tree's to give).
        let mut input = Vec::new();
        for p in paths.iter().filter(|p| !self.below_worktree_symlink(p)) {
            input.extend_from_slice(b"./");
            input.extend_from_slice(p.as_bytes());
            input.push(0);
        }
        if input.is_empty() {
            return Ok(HashSet::new());
        }
        let mut cmd = self.command(None);
        cmd.env_remove("GIT_LITERAL_PATHSPECS").args(["check-ignore", "-z", "--stdin", "--no-index"]);
        let out = self.output_of(cmd, Some(&input))?;
        // Exit 1: nothing is ignored.
        if !out.status.success() && out.status.code() != Some(1) {
            return Err(GitError::Failed { what: "check-ignore".into(), detail: stderr_line(&out) });
        }
        // check-ignore answers relative to the workspace, as asked.
        Ok(out
            .stdout
            .split(|&b| b == 0)
            .filter_map(|p| p.strip_prefix(b"./"))
            .map(|p| [&self.prefix[..], p].concat())
            .collect())
    }

    /// Whether a directory above `path` is a symlink (or not a directory)
    /// in the working tree.
    fn below_worktree_symlink(&self, path: &RelPath) -> bool {
        path.ancestors().any(|dir| {
            std::fs::symlink_metadata(self.workspace.join(dir.as_path())).is_ok_and(|m| !m.file_type().is_dir())
        })
    }

    /// Runs what a commit of `entries` on `parent` runs of git before its
    /// tree is written (objects, ignore rules), so that a failure there
    /// comes before `apply --commit` writes the workspace.
    pub fn check_commit(&self, store: &Store, parent: Option<&str>, entries: &[&Entry]) -> Result<(), GitError> {
        self.plan(store, parent, entries).map(|_| ())
    }

    /// The tree of `parent` with `entries` applied, as an index delta and
    /// what went in or stayed out.
    fn plan(&self, store: &Store, parent: Option<&str>, entries: &[&Entry]) -> Result<Plan, GitError> {
        let base = self.tree(parent)?;
        let ids = self.write_objects(store, entries)?;
        let new_paths: Vec<&RelPath> = entries
            .iter()
            .filter(|e| matches!(e.kind, Kind::File { .. } | Kind::Symlink { .. }))
            .filter(|e| !base.contains_key(&self.full(&e.path)))
            .map(|e| &e.path)
            .collect();
        let ignored = self.ignored(&new_paths)?;
        plan(base, &self.prefix, entries, &ids, &ignored)
    }

    fn full(&self, path: &RelPath) -> Vec<u8> {
        [&self.prefix[..], path.as_bytes()].concat()
    }

    /// Writes the tree of `parent` changed by `delta` through a temporary
    /// index at `index`; the tree's id.
    fn write_tree(&self, index: &Path, parent: Option<&str>, delta: &[u8]) -> Result<String, GitError> {
        let _ = std::fs::remove_file(index);
        let result = (|| {
            match parent {
                Some(commit) => self.run(&["read-tree", commit], Some(index), None)?,
                None => self.run(&["read-tree", "--empty"], Some(index), None)?,
            };
            self.run(&["update-index", "-z", "--index-info"], Some(index), Some(delta))?;
            Ok(String::from_utf8_lossy(&self.run(&["write-tree"], Some(index), None)?).trim().to_string())
        })();
        let _ = std::fs::remove_file(index);
        result
    }

    fn commit_tree(&self, tree: &str, parent: Option<&str>, message: &str) -> Result<String, GitError> {
        let mut args = vec!["commit-tree", "--no-gpg-sign", tree];
        if let Some(parent) = parent {
            args.extend(["-p", parent]);
        }
        args.extend(["-F", "-"]);
        Ok(String::from_utf8_lossy(&self.run(&args, None, Some(message.as_bytes()))?).trim().to_string())
    }

    /// Moves `reference` to `commit` only if it is still at `old` (`None`:
    /// only if it does not exist).
    fn update_ref(&self, reference: &str, commit: &str, old: Option<&str>, reason: &str) -> Result<(), GitError> {
        self.run(&["update-ref", "-m", reason, reference, commit, old.unwrap_or("")], None, None)?;
        Ok(())
    }

    /// Makes the new branch `reference` at `commit`, only if no ref of that
    /// name exists, and never through a symbolic ref planted there since
    /// [`Repo::new_branch`] looked.
    fn create_ref(&self, reference: &str, commit: &str, reason: &str) -> Result<(), GitError> {
        let zero = self.object_format_zero()?;
        let out = self.output(&["symbolic-ref", "-q", reference], None, None)?;
        if out.status.success() {
            let name = reference.strip_prefix("refs/heads/").unwrap_or(reference).to_string();
            let to = String::from_utf8_lossy(&out.stdout).trim().to_string();
            return Err(GitError::ExistsSymbolic { name, to });
        }
        self.run(&["update-ref", "--no-deref", "-m", reason, reference, commit, &zero], None, None)?;
        Ok(())
    }

    fn object_format_zero(&self) -> Result<String, GitError> {
        let format = self.run_line(&["rev-parse", "--show-object-format"])?;
        Ok("0".repeat(if format == "sha256" { 64 } else { 40 }))
    }

    /// One commit of `entries` on `parent`, in the scratch index `index`.
    fn commit(
        &self,
        store: &Store,
        index: &Path,
        parent: Option<&str>,
        entries: &[&Entry],
        message: &str,
    ) -> Result<(Landed, Vec<u8>), GitError> {
        let plan = self.plan(store, parent, entries)?;
        let delta = plan.delta(&self.object_format_zero()?);
        if delta.is_empty() {
            return Err(GitError::NothingToCommit { left: plan.left });
        }
        let tree = self.write_tree(index, parent, &delta)?;
        // git's index drops some paths it deems unsafe (`GIT~1/`, `.git./`,
        // a `.gitmodules` symlink) saying only "Ignoring path" and exiting
        // 0: what the tree holds is checked, not assumed.
        let written = self.tree(Some(&tree))?;
        let Plan { base, tree: planned, mut committed, mut left } = plan;
        let differs: Vec<&Vec<u8>> = planned
            .iter()
            .filter(|(p, item)| written.get(*p) != Some(*item))
            .map(|(p, _)| p)
            .chain(written.keys().filter(|p| !planned.contains_key(*p)))
            .collect();
        if !differs.is_empty() {
            committed.retain(|path| {
                let full = self.full(path);
                let touched =
                    differs.iter().any(|d| **d == full || (d.starts_with(&full) && d.get(full.len()) == Some(&b'/')));
                if touched {
                    left.push((path.clone(), LeftOut::Refused));
                }
                !touched
            });
        }
        if written == base || committed.is_empty() {
            return Err(GitError::NothingToCommit { left });
        }
        let commit = self.commit_tree(&tree, parent, message)?;
        let landed = Landed { commit, parent: parent.map(str::to_string), committed, left };
        Ok((landed, delta))
    }

    /// `apply --branch`: the chosen staged entries as one commit on
    /// `parent`, on the new branch `reference`. Neither the working tree
    /// nor the index is touched.
    pub fn branch(
        &self,
        store: &Store,
        reference: &str,
        parent: Option<&str>,
        entries: &[&Entry],
        message: &str,
    ) -> Result<Landed, GitError> {
        let index = store.dir().join("git-index.tmp");
        let (landed, _) = self.commit(store, &index, parent, entries, message)?;
        self.create_ref(reference, &landed.commit, "stockade apply --branch")?;
        Ok(landed)
    }

    /// `apply --commit`: entries just applied to the workspace as one
    /// commit on `HEAD` (which must still be `head`), and the user's index
    /// updated for exactly those paths: what else they staged stays staged
    /// and out of the commit.
    pub fn commit_on_head(
        &self,
        store: &Store,
        head: Option<&str>,
        entries: &[&Entry],
        message: &str,
    ) -> Result<Landed, GitError> {
        let index = store.dir().join("git-index.tmp");
        let (landed, delta) = self.commit(store, &index, head, entries, message)?;
        // The index first: it takes git's `index.lock` or fails with HEAD
        // untouched. HEAD moved first would leave the index, when it cannot
        // be written, staging the commit's reversal.
        let out = self.output(&["update-index", "-z", "--index-info"], None, Some(&delta))?;
        if !out.status.success() {
            return Err(GitError::IndexNotUpdated { detail: stderr_line(&out) });
        }
        if let Err(e) = self.update_ref("HEAD", &landed.commit, head, "stockade apply --commit") {
            let detail = match e {
                GitError::Failed { detail, .. } => detail,
                other => other.to_string(),
            };
            return Err(GitError::HeadNotMoved { detail });
        }
        Ok(landed)
    }
}

/// A commit's tree within the workspace, as the review of a branch built
/// on it reads it: its symlinks, and its files by path, read from git's
/// objects (never checked out).
pub struct CommitTree<'r> {
    repo: &'r Repo,
    files: BTreeMap<RelPath, Item>,
    links: Vec<Entry>,
}

impl OtherTree for CommitTree<'_> {
    fn symlinks(&self) -> &[Entry] {
        &self.links
    }

    fn files_named(&self, name: &[u8]) -> Vec<RelPath> {
        let regular = |item: &Item| item.mode & 0o170000 == 0o100000;
        self.files.iter().filter(|(p, item)| p.file_name() == name && regular(item)).map(|(p, _)| p.clone()).collect()
    }

    fn names(&self, dir: &RelPath) -> Vec<Vec<u8>> {
        self.files
            .keys()
            .filter(|p| p.parent().is_some_and(|parent| parent == *dir))
            .map(|p| p.file_name().to_vec())
            .collect()
    }

    fn read(&self, path: &RelPath, limit: u64) -> TreeFile {
        let Some(item) = self.files.get(path) else { return TreeFile::Absent };
        if item.mode & 0o170000 != 0o100000 {
            return TreeFile::Unreadable;
        }
        match self.repo.blob_head(&item.oid, limit) {
            Ok(bytes) => TreeFile::Text(bytes),
            Err(_) => TreeFile::Unreadable,
        }
    }
}

/// Whether an apply of this store was interrupted (its journal is there):
/// a plain apply completes it first, in the workspace.
pub fn apply_interrupted(store: &Store) -> bool {
    super::journal::journal_path(store.dir()).exists()
}

/// Where ids of symlink targets are kept in the id map (apart from
/// content hashes, which are 32 bytes).
fn symlink_key(path: &RelPath) -> Vec<u8> {
    [b"symlink:", path.as_bytes()].concat()
}

/// At most `limit` bytes of a pipe; the pipe is closed after.
fn read_all(pipe: impl Read, limit: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    // What was read before an error is what there is.
    let _ = pipe.take(limit).read_to_end(&mut bytes);
    bytes
}

/// The git subcommand a command runs (after its `-c` options), for messages.
fn subcommand(cmd: &Command) -> String {
    let mut args = cmd.get_args();
    while let Some(arg) = args.next() {
        if arg == "-c" {
            args.next();
            continue;
        }
        return arg.to_string_lossy().into_owned();
    }
    String::new()
}

fn stderr_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr);
    let text = text.trim();
    if text.is_empty() { format!("git {}", out.status) } else { text.lines().take(3).collect::<Vec<_>>().join("; ") }
}

/// Whether a path has a `.git` component (git itself refuses such paths in
/// a tree, in any case).
fn in_git_dir(path: &RelPath) -> bool {
    path.as_bytes().split(|&b| b == b'/').any(|c| c.eq_ignore_ascii_case(b".git"))
}

/// Whether a component of `path` is a name that NTFS or HFS+ reads as
/// `.git`: git refuses them in its index with `core.protectNTFS` and
/// `core.protectHFS`, which [`SAFE_CONFIG`] forces on; they are refused
/// here too, by name, whatever git does.
fn stands_for_git_dir(path: &RelPath) -> bool {
    path.as_bytes().split(|&b| b == b'/').any(|c| ntfs_dot_git(c) || hfs_dot_git(c))
}

/// `.git` with trailing dots or spaces, with an alternate data stream
/// (`.git::$INDEX_ALLOCATION`), or the short name `GIT~1`.
fn ntfs_dot_git(name: &[u8]) -> bool {
    let name = match name.iter().position(|&b| b == b':') {
        Some(colon) => &name[..colon],
        None => name,
    };
    let end = name.iter().rposition(|&b| b != b'.' && b != b' ').map_or(0, |i| i + 1);
    let name = &name[..end];
    name.eq_ignore_ascii_case(b".git") || name.eq_ignore_ascii_case(b"git~1")
}

/// `.git` with characters HFS+ ignores (zero-width joiners, direction
/// marks, the byte-order mark) spread in it.
fn hfs_dot_git(name: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(name) else { return false };
    let ignorable =
        |c: char| matches!(c, '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}');
    let folded: String = text.chars().filter(|c| !ignorable(*c)).collect();
    folded.len() != text.len() && folded.eq_ignore_ascii_case(".git")
}

struct Plan {
    base: BTreeMap<Vec<u8>, Item>,
    tree: BTreeMap<Vec<u8>, Item>,
    committed: Vec<RelPath>,
    left: Vec<(RelPath, LeftOut)>,
}

impl Plan {
    /// `update-index -z --index-info` lines turning the base into the tree.
    fn delta(&self, zero: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for path in self.base.keys().filter(|p| !self.tree.contains_key(*p)) {
            out.extend_from_slice(format!("0 {zero}\t").as_bytes());
            out.extend_from_slice(path);
            out.push(0);
        }
        for (path, item) in self.tree.iter().filter(|(p, item)| self.base.get(*p) != Some(item)) {
            out.extend_from_slice(format!("{:o} {}\t", item.mode, item.oid).as_bytes());
            out.extend_from_slice(path);
            out.push(0);
        }
        out
    }
}

/// The base tree with the entries applied (in tree order, as staged).
fn plan(
    base: BTreeMap<Vec<u8>, Item>,
    prefix: &[u8],
    entries: &[&Entry],
    ids: &HashMap<Vec<u8>, String>,
    ignored: &HashSet<Vec<u8>>,
) -> Result<Plan, GitError> {
    let mut tree = base.clone();
    let mut committed = Vec::new();
    let mut left = Vec::new();
    for e in entries {
        if in_git_dir(&e.path) {
            left.push((e.path.clone(), LeftOut::GitDir));
            continue;
        }
        if stands_for_git_dir(&e.path) {
            left.push((e.path.clone(), LeftOut::Refused));
            continue;
        }
        let full = [prefix, e.path.as_bytes()].concat();
        if let Some(sub) = gitlink_above(&tree, &full) {
            left.push((e.path.clone(), LeftOut::InSubmodule(display_bytes(&sub))));
            continue;
        }
        let item = match &e.kind {
            Kind::File { mode, sha256, .. } => ids
                .get(&sha256.0[..])
                .map(|oid| Item { mode: if mode.bits() & 0o100 != 0 { 0o100755 } else { 0o100644 }, oid: oid.clone() }),
            Kind::Symlink { .. } => ids.get(&symlink_key(&e.path)).map(|oid| Item { mode: SYMLINK, oid: oid.clone() }),
            _ => None,
        };
        match &e.kind {
            Kind::File { .. } | Kind::Symlink { .. } => {
                if ignored.contains(&full) && !base.contains_key(&full) {
                    left.push((e.path.clone(), LeftOut::Ignored));
                    continue;
                }
                let Some(item) = item else {
                    return Err(GitError::Failed {
                        what: "hash-object".into(),
                        detail: format!("no object was written for {}", e.path),
                    });
                };
                remove_below(&mut tree, &full);
                remove_files_above(&mut tree, &full);
                tree.insert(full, item);
            }
            Kind::Dir { .. } => {
                if tree.get(&full).is_some_and(|i| i.mode != GITLINK) {
                    tree.remove(&full);
                }
                remove_files_above(&mut tree, &full);
            }
            Kind::OpaqueDir { .. } | Kind::Delete => {
                tree.remove(&full);
                remove_below(&mut tree, &full);
            }
            Kind::Mode { mode } => match tree.get_mut(&full) {
                Some(item) if item.mode == 0o100644 || item.mode == 0o100755 => {
                    item.mode = if mode.bits() & 0o100 != 0 { 0o100755 } else { 0o100644 };
                }
                _ => {
                    left.push((e.path.clone(), LeftOut::ModeOfUntracked));
                    continue;
                }
            },
        }
        committed.push(e.path.clone());
    }
    Ok(Plan { base, tree, committed, left })
}

fn remove_below(tree: &mut BTreeMap<Vec<u8>, Item>, dir: &[u8]) {
    let start = [dir, b"/"].concat();
    let below: Vec<Vec<u8>> =
        tree.range(start.clone()..).take_while(|(p, _)| p.starts_with(&start)).map(|(p, _)| p.clone()).collect();
    for p in below {
        tree.remove(&p);
    }
}

/// A file or symlink where the path needs a directory goes (the guest
/// made one there).
fn remove_files_above(tree: &mut BTreeMap<Vec<u8>, Item>, path: &[u8]) {
    for (i, _) in path.iter().enumerate().filter(|(_, b)| **b == b'/') {
        if tree.get(&path[..i]).is_some_and(|item| item.mode != GITLINK) {
            tree.remove(&path[..i]);
        }
    }
}

fn gitlink_above(tree: &BTreeMap<Vec<u8>, Item>, path: &[u8]) -> Option<Vec<u8>> {
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .map(|(i, _)| &path[..i])
        .find(|dir| tree.get(*dir).is_some_and(|item| item.mode == GITLINK))
        .map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::testutil::{Set, git, have_git, write};

    fn repo(dir: &Path) {
        git(dir, &["init", "-q"]);
        git(dir, &["config", "user.name", "Test"]);
        git(dir, &["config", "user.email", "test@example.com"]);
    }

    #[test]
    fn names_that_stand_for_dot_git_are_refused() {
        let p = |s: &str| RelPath::new(s).unwrap();
        for name in
            ["GIT~1/config", "a/git~1", ".git./hooks/x", ".GIT ./x", ".git::$INDEX_ALLOCATION/x", ".g\u{200c}it/x"]
        {
            assert!(stands_for_git_dir(&p(name)), "{name}");
        }
        for name in ["git~2/x", ".github/x", ".gitignore", "git/x", "a.git/x", "...", ".g\u{200c}itx"] {
            assert!(!stands_for_git_dir(&p(name)), "{name}");
        }
    }

    #[test]
    fn head_is_recorded_only_in_a_repository_with_a_commit() {
        if !have_git() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(head_of(tmp.path()), None, "not a repository");
        repo(tmp.path());
        assert_eq!(head_of(tmp.path()), None, "unborn branch");
        write(&tmp.path().join("a"), b"a\n");
        git(tmp.path(), &["add", "a"]);
        git(tmp.path(), &["commit", "-q", "-m", "one"]);
        let head = git(tmp.path(), &["rev-parse", "HEAD"]).trim().to_string();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        assert_eq!(head_of(&tmp.path().join("sub")), Some(head));
    }

    /// A repository with a base commit, a staged new file, and a FIFO at
    /// `fifo` for its config to name.
    fn fifo_repo(tmp: &Path) -> (PathBuf, String, Store, PathBuf) {
        let ws = tmp.join("ws");
        std::fs::create_dir(&ws).unwrap();
        repo(&ws);
        write(&ws.join("a"), b"a\n");
        git(&ws, &["add", "a"]);
        git(&ws, &["commit", "-q", "-m", "base"]);
        let base = git(&ws, &["rev-parse", "HEAD"]).trim().to_string();
        let store = Store::open(&tmp.join("session")).unwrap();
        Set::new(&ws).file("new.txt", b"n\n", 0o644).stage(&store);
        let fifo = tmp.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        (ws, base, store, fifo)
    }

    /// Runs `f` on a thread; panics if it has not returned after a
    /// minute: it blocks for good (this is no speed limit).
    fn returns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(60)).expect("git blocked on a FIFO the repository names")
    }

    /// Attack: a hostile repository's `core.excludesFile` names a FIFO, on
    /// which `git check-ignore` (run by `apply --branch` for new paths)
    /// blocks forever. The user's own excludes file counts instead.
    #[test]
    fn an_excludes_file_the_repository_points_at_a_fifo_does_not_block_a_branch() {
        if !have_git() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (ws, base, store, fifo) = fifo_repo(tmp.path());
        git(&ws, &["config", "core.excludesFile", fifo.to_str().unwrap()]);
        let landed = returns(move || {
            let entries: Vec<Entry> = store.entries().unwrap().into_iter().map(|e| e.entry).collect();
            let chosen: Vec<&Entry> = entries.iter().collect();
            let repo = Repo::open(&ws).unwrap();
            repo.branch(&store, "refs/heads/b", Some(&base), &chosen, "m\n").map(|l| l.committed.len())
        });
        assert_eq!(landed.unwrap(), 1);
    }

    /// Attack: a config file the repository includes is a FIFO, which
    /// blocks every git command: each is given a deadline, and fails
    /// clearly after it.
    #[test]
    fn an_include_that_is_a_fifo_makes_git_fail_not_block() {
        if !have_git() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (ws, _, _, fifo) = fifo_repo(tmp.path());
        git(&ws, &["config", "include.path", fifo.to_str().unwrap()]);
        let opened = returns(move || Repo::open_within(&ws, std::time::Duration::from_secs(1)).map(|_| ()));
        let err = opened.unwrap_err().to_string();
        assert!(err.contains("did not finish") && err.contains("FIFO"), "{err}");
    }

    /// A base-commit file is read only as far as asked: a blob of a few
    /// kilobytes that inflates to many megabytes costs no more.
    #[test]
    fn a_base_commit_file_is_read_only_as_far_as_the_limit() {
        if !have_git() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path();
        repo(ws);
        write(&ws.join(".envrc"), &vec![b'#'; 64 << 20]);
        git(ws, &["add", ".envrc"]);
        git(ws, &["commit", "-q", "-m", "big"]);
        let head = git(ws, &["rev-parse", "HEAD"]).trim().to_string();
        let repo = Repo::open(ws).unwrap();
        let tree = repo.tree_at(&head).unwrap();
        let path = RelPath::new(&b".envrc"[..]).unwrap();
        let TreeFile::Text(bytes) = tree.read(&path, 1000) else { panic!("not read") };
        assert_eq!(bytes.len(), 1000);
        assert!(matches!(tree.read(&RelPath::new(&b"nothing"[..]).unwrap(), 10), TreeFile::Absent));
    }

    #[test]
    fn directories_replacing_files_opaque_directories_modes_and_submodules_become_the_right_tree() {
        if !have_git() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        repo(&ws);
        for (path, content) in
            [("a.sh", &b"echo\n"[..]), ("d", b"was a file\n"), ("old/x", b"x\n"), ("old/y", b"y\n"), ("keep", b"k\n")]
        {
            write(&ws.join(path), content);
        }
        git(&ws, &["add", "-A"]);
        // A submodule's commit need not be here: any id will do.
        let any = git(&ws, &["hash-object", "-w", "--stdin"]).trim().to_string();
        git(&ws, &["update-index", "--add", "--cacheinfo", &format!("160000,{any},sub")]);
        git(&ws, &["commit", "-q", "-m", "base"]);
        let base = git(&ws, &["rev-parse", "HEAD"]).trim().to_string();
        // The guest's view: `d` a directory, `old` replaced, modes changed.
        std::fs::remove_file(ws.join("d")).unwrap();
        std::fs::create_dir(ws.join("sub")).unwrap();
        write(&ws.join("untracked"), b"u\n");
        let store_dir = tmp.path().join("session");
        let store = Store::open(&store_dir).unwrap();
        Set::new(&ws)
            .mode("a.sh", 0o755)
            .dir("d", 0o755)
            .file("d/in", b"in\n", 0o644)
            .opaque("old", 0o755)
            .file("old/z", b"z\n", 0o644)
            .file("sub/inner", b"i\n", 0o644)
            .mode("untracked", 0o755)
            .stage(&store);
        let entries: Vec<Entry> = store.entries().unwrap().into_iter().map(|e| e.entry).collect();
        let chosen: Vec<&Entry> = entries.iter().collect();
        let repo = Repo::open(&ws).unwrap();
        let landed = repo.branch(&store, "refs/heads/b", Some(&base), &chosen, "m\n").unwrap();

        let listing = git(&ws, &["ls-tree", "-r", "b"]);
        let paths: Vec<(&str, &str)> =
            listing.lines().map(|l| (l.split(' ').next().unwrap(), l.split('\t').nth(1).unwrap())).collect();
        assert_eq!(
            paths,
            [("100755", "a.sh"), ("100644", "d/in"), ("100644", "keep"), ("100644", "old/z"), ("160000", "sub"),],
            "{listing}"
        );
        let left: Vec<(String, LeftOut)> = landed.left.iter().map(|(p, w)| (p.to_string(), w.clone())).collect();
        assert_eq!(
            left,
            [
                ("sub/inner".to_string(), LeftOut::InSubmodule("sub".into())),
                ("untracked".to_string(), LeftOut::ModeOfUntracked),
            ]
        );
        assert!(!store_dir.join("changes/git-index.tmp").exists(), "the temporary index is removed");
    }
}
