//! A coding agent's own files (`~/.claude`, `~/.claude.json`, `~/.codex`),
//! kept in a state directory of stockade's per agent instead of the host's:
//! `<data>/agents/<name>/home/` mirrors the home-relative paths and is the
//! only thing of them the guest sees (shared writable within the
//! `agent_state` size, kept between runs).
//!
//! The host's copies are read, never written: the policy's `seed` paths
//! (settings, instructions, commands; never token files) are copied in when
//! the host's version changed since they were last copied, with the
//! policy's `drop_keys` removed from JSON files. A seed file the guest
//! changed is reported after the run, never applied to the host.
//!
//! The state directory is the guest's to write, so every host-side access
//! below it resolves one component at a time without following symlinks.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode as NixMode, mkdirat};
use sha2::{Digest, Sha256};

use crate::changes::Store;
use crate::policy::AgentState;
use crate::protocol::RootEntry;
use crate::protocol::change_set::{Base, Limits, Mode, RelPath, Writer};
use crate::protocol::vm_config::ShareConfig;
use crate::util::digest::Hasher;

/// Seeding stops after this many files of one agent: a settings tree, not a
/// project.
const MAX_SEED_FILES: usize = 2000;
const MAX_SEED_DEPTH: usize = 8;
/// Larger files are not seeded (state databases, logs).
const MAX_SEED_FILE: u64 = 4 << 20;

/// An agent's state, ready to be given to the guest.
#[derive(Debug)]
pub struct Prepared {
    pub name: String,
    /// `<data>/agents/<name>/home`: what the guest sees.
    pub home: PathBuf,
    /// `state` paths relative to the home directory, and whether each is a
    /// directory.
    entries: Vec<(PathBuf, bool)>,
    /// Seed paths relative to home.
    seeds: Vec<PathBuf>,
    /// Review paths relative to home.
    reviewed: Vec<PathBuf>,
    /// Seed files (relative to home) as last copied from the host.
    seeded: BTreeMap<String, String>,
    record: PathBuf,
    /// Seed files already offered for review, as offered: not offered again
    /// until the guest changes them again.
    offered: BTreeMap<String, String>,
    drop_keys: Vec<String>,
}

/// Readies the state directory of `agent`, seeding it from `home`.
pub fn prepare(agent: &AgentState, home: &Path, data: &Path) -> anyhow::Result<Prepared> {
    let base = data.join("agents").join(&agent.name);
    let state_home = base.join("home");
    fs::create_dir_all(&state_home).with_context(|| format!("cannot create {}", state_home.display()))?;
    let record = base.join("seeded.json");
    let seeded: BTreeMap<String, String> =
        fs::read(&record).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    let entries = agent.state.iter().map(|p| (relative(p), p.ends_with('/'))).collect();
    let seeds: Vec<PathBuf> = agent.seed.iter().map(|s| relative(s)).collect();
    let mut prepared = Prepared {
        name: agent.name.clone(),
        home: state_home,
        entries,
        seeds,
        reviewed: agent.review.iter().map(|s| relative(s)).collect(),
        seeded,
        offered: fs::read(base.join("offered.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default(),
        record,
        drop_keys: agent.drop_keys.clone(),
    };
    let mut files = Vec::new();
    for seed in &prepared.seeds {
        collect(home, seed, 0, &mut files);
    }
    for rel in files.into_iter().take(MAX_SEED_FILES) {
        if let Err(e) = prepared.seed(home, &rel) {
            tracing::warn!("agent {}: cannot seed ~/{}: {e}", agent.name, rel.display());
        }
    }
    for (rel, is_dir) in &prepared.entries {
        if *is_dir {
            let dir = prepared.open_dir(rel, true)?;
            drop(dir);
        }
    }
    let text = serde_json::to_vec_pretty(&prepared.seeded).context("cannot record the seeded files")?;
    crate::changes::write_atomically(&prepared.record, |f| f.write_all(&text))
        .with_context(|| format!("cannot write {}", prepared.record.display()))?;
    Ok(prepared)
}

/// `~/a/b/` as `a/b`.
fn relative(path: &str) -> PathBuf {
    PathBuf::from(path.trim_start_matches("~/").trim_end_matches('/'))
}

/// The regular files at or below `home/rel`, symlinks skipped.
fn collect(home: &Path, rel: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(meta) = fs::symlink_metadata(home.join(rel)) else { return };
    if meta.is_file() && meta.len() <= MAX_SEED_FILE {
        out.push(rel.to_path_buf());
    } else if meta.is_dir() && depth < MAX_SEED_DEPTH && out.len() < MAX_SEED_FILES {
        let Ok(entries) = fs::read_dir(home.join(rel)) else { return };
        let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            collect(home, &rel.join(name), depth + 1, out);
        }
    }
}

impl Prepared {
    /// Copies the host's `rel` into the state when the host's version is
    /// not the one copied last time (or the state lost it).
    fn seed(&mut self, home: &Path, rel: &Path) -> anyhow::Result<()> {
        let content = self.host_version(home, rel)?;
        let digest = hex(&Sha256::digest(&content));
        let key = rel.to_string_lossy().into_owned();
        if self.seeded.get(&key) == Some(&digest) && self.read(rel)?.is_some() {
            return Ok(());
        }
        self.write(rel, &content)?;
        self.seeded.insert(key, digest);
        Ok(())
    }

    /// The host's file as the guest may see it: JSON without `drop_keys`.
    fn host_version(&self, home: &Path, rel: &Path) -> anyhow::Result<Vec<u8>> {
        let content = fs::read(home.join(rel)).with_context(|| format!("cannot read ~/{}", rel.display()))?;
        if self.drop_keys.is_empty() || rel.extension().is_none_or(|e| e != "json") {
            return Ok(content);
        }
        // A JSON file that does not parse cannot have its secrets removed:
        // it is not seeded at all.
        let mut value: serde_json::Value =
            serde_json::from_slice(&content).with_context(|| format!("~/{} is not valid JSON", rel.display()))?;
        let Some(object) = value.as_object_mut() else { return Ok(content) };
        if !self.drop_keys.iter().any(|k| object.contains_key(k)) {
            return Ok(content);
        }
        for key in &self.drop_keys {
            object.remove(key);
        }
        let mut text = serde_json::to_vec_pretty(&value)?;
        text.push(b'\n');
        Ok(text)
    }

    /// Adds the state to the guest: one writable share holding at most
    /// `limit` bytes, each directory bound at its own path, each file
    /// copied in and out by the guest's init (as `owner`, uid and gid).
    pub fn attach(
        &self,
        home: &Path,
        (uid, gid): (u32, u32),
        limit: u64,
        shares: &mut Vec<ShareConfig>,
        root: &mut Vec<RootEntry>,
    ) {
        let source_root = format!("/agents/{}", self.name);
        shares.push(ShareConfig {
            guest_path: source_root.clone(),
            host_path: self.home.clone(),
            writable: true,
            record: None,
            limit: Some(limit),
        });
        for (rel, is_dir) in &self.entries {
            let source = format!("{source_root}/{}", rel.display());
            let target = home.join(rel).to_string_lossy().into_owned();
            let entry = if *is_dir {
                RootEntry::ShareWritable { source, target }
            } else {
                RootEntry::StateFile { source, target, uid, gid }
            };
            super::root::insert_before_workspace(root, entry);
        }
    }

    /// Whether `~/rel` is one of the agent's state paths or inside one.
    pub fn holds(&self, rel: &Path) -> bool {
        self.entries.iter().any(|(p, is_dir)| if *is_dir { rel.starts_with(p) && rel != p } else { rel == p })
    }

    /// Puts `content` at `~/rel` in the state (0600), e.g. a sign-in file
    /// holding placeholders.
    pub fn place(&self, rel: &Path, content: &[u8]) -> anyhow::Result<()> {
        self.write(rel, content).with_context(|| format!("cannot place ~/{} for agent {}", rel.display(), self.name))
    }

    /// Files at review paths the guest changed or created, which would
    /// matter on the host: each differs from what was seeded, from what was
    /// offered before and from the host's current version.
    pub fn changed_seeds(&self, home: &Path) -> Vec<PathBuf> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        for path in &self.reviewed {
            collect(&self.home, path, 0, &mut candidates);
        }
        candidates.sort();
        candidates.dedup();
        let mut changed = Vec::new();
        for rel in candidates {
            let Ok(Some(now)) = self.read(&rel) else { continue };
            let now = hex(&Sha256::digest(&now));
            let host = self.host_version(home, &rel).map(|c| hex(&Sha256::digest(&c))).ok();
            let key = rel.to_string_lossy();
            let (seeded, offered) = (self.seeded.get(&*key), self.offered.get(&*key));
            if Some(&now) != seeded && Some(&now) != host.as_ref() && Some(&now) != offered {
                changed.push(rel);
            }
        }
        changed
    }

    /// A change set for the host's home directory holding the state's
    /// version of each of `changed` (seed files the guest changed), with the
    /// host's current file as the base, so applying it later refuses to
    /// overwrite an edit made on the host meanwhile. Staged in `store`.
    pub fn stage_for_home(&self, changed: &[PathBuf], home: &Path, store: &Store) -> anyhow::Result<usize> {
        let mut writer = Writer::new(Vec::new())?;
        let mut dirs = std::collections::BTreeSet::new();
        let mut staged = 0;
        for rel in changed {
            let Some(content) = self.read(rel)? else { continue };
            // Directories the host lacks come with the file, private.
            for dir in
                rel.ancestors().skip(1).filter(|d| !d.as_os_str().is_empty()).collect::<Vec<_>>().into_iter().rev()
            {
                if !home.join(dir).exists() && dirs.insert(dir.to_path_buf()) {
                    writer.dir(&rel_path(dir)?, 0o700, &Base::Absent)?;
                }
            }
            let host = home.join(rel);
            let (mode, base) = match fs::symlink_metadata(&host) {
                Ok(meta) if meta.is_file() => {
                    let sha256 = Hasher::of_reader(fs::File::open(&host)?)?;
                    let mode = meta.permissions().mode() & 0o7777;
                    (mode, Base::File { mode: Mode::from_raw(mode), size: meta.len(), sha256 })
                }
                Ok(_) => continue,
                Err(_) => (0o600, Base::Absent),
            };
            writer.file(&rel_path(rel)?, mode, content.len() as u64, &mut content.as_slice(), &base)?;
            staged += 1;
        }
        let (stream, _) = writer.finish()?;
        store.stage(stream.as_slice(), Limits::default())?;
        let mut offered = self.offered.clone();
        for rel in changed {
            if let Ok(Some(content)) = self.read(rel) {
                offered.insert(rel.to_string_lossy().into_owned(), hex(&Sha256::digest(&content)));
            }
        }
        let path = self.record.with_file_name("offered.json");
        let text = serde_json::to_vec_pretty(&offered)?;
        crate::changes::write_atomically(&path, |f| f.write_all(&text))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(staged)
    }

    /// The directory `rel` of the state, created when `create`, never
    /// through a symlink.
    fn open_dir(&self, rel: &Path, create: bool) -> io::Result<OwnedFd> {
        let mut dir: OwnedFd =
            nix::fcntl::open(&self.home, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, NixMode::empty())?;
        for part in rel.components() {
            let Component::Normal(name) = part else { return Err(io::Error::other("not a plain relative path")) };
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            dir = match openat(dir.as_fd(), name, flags, NixMode::empty()) {
                Err(Errno::ENOENT) if create => {
                    mkdirat(dir.as_fd(), name, NixMode::from_bits_truncate(0o700))?;
                    openat(dir.as_fd(), name, flags, NixMode::empty())?
                }
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    return Err(io::Error::other(format!("{} is not a directory", name.to_string_lossy())));
                }
                other => other?,
            };
        }
        Ok(dir)
    }

    /// Writes `rel` in the state in one rename, never through a symlink.
    fn write(&self, rel: &Path, content: &[u8]) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.open_dir(parent, true)?;
        let temp = format!(".{}.stockade-seed", name.to_string_lossy());
        let _ = nix::unistd::unlinkat(dir.as_fd(), temp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut file = fs::File::from(openat(dir.as_fd(), temp.as_str(), flags, NixMode::from_bits_truncate(0o600))?);
        file.write_all(content)?;
        file.sync_all()?;
        nix::fcntl::renameat(dir.as_fd(), temp.as_str(), dir.as_fd(), name)?;
        Ok(())
    }

    /// The state's `rel`, when it is a regular file.
    fn read(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        let (parent, name) = split(rel)?;
        let dir = match self.open_dir(parent, false) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let file = match openat(dir.as_fd(), name, flags, NixMode::empty()) {
            Ok(fd) => fs::File::from(fd),
            Err(Errno::ENOENT | Errno::ELOOP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if !file.metadata()?.is_file() {
            return Ok(None);
        }
        let mut content = Vec::new();
        file.take(MAX_SEED_FILE + 1).read_to_end(&mut content)?;
        Ok(Some(content))
    }
}

fn split(rel: &Path) -> io::Result<(&Path, &std::ffi::OsStr)> {
    match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) if !name.as_bytes().is_empty() => Ok((parent, name)),
        _ => Err(io::Error::other(format!("{} names no file", rel.display()))),
    }
}

fn rel_path(path: &Path) -> anyhow::Result<RelPath> {
    RelPath::new(path.as_os_str().as_bytes()).with_context(|| format!("~/{} cannot be staged", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::sync::Arc;

    fn claude() -> AgentState {
        AgentState {
            name: "claude".into(),
            state: vec!["~/.claude/".into(), "~/.claude.json".into()],
            seed: vec!["~/.claude/settings.json".into(), "~/.claude/commands/".into(), "~/.claude.json".into()],
            review: vec!["~/.claude/settings.json".into(), "~/.claude/commands/".into()],
            drop_keys: vec!["primaryApiKey".into()],
            origin: Arc::from("test"),
        }
    }

    fn put(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn seeds_settings_without_secrets_and_keeps_guest_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let (home, data) = (tmp.path().join("home"), tmp.path().join("data"));
        put(&home.join(".claude/settings.json"), "{\"model\": \"opus\"}");
        put(&home.join(".claude/commands/review.md"), "review it");
        put(&home.join(".claude/.credentials.json"), "{\"claudeAiOauth\": {\"accessToken\": \"real\"}}");
        put(&home.join(".claude.json"), "{\"hasCompletedOnboarding\": true, \"primaryApiKey\": \"sk-real\"}");
        let state = prepare(&claude(), &home, &data).unwrap();
        let kept = |rel: &str| fs::read_to_string(state.home.join(rel)).ok();
        assert_eq!(kept(".claude/settings.json").unwrap(), "{\"model\": \"opus\"}");
        assert_eq!(kept(".claude/commands/review.md").unwrap(), "review it");
        assert_eq!(kept(".claude/.credentials.json"), None, "token files are never seeded");
        let json = kept(".claude.json").unwrap();
        assert!(json.contains("hasCompletedOnboarding") && !json.contains("sk-real"), "{json}");
        assert_eq!(fs::metadata(state.home.join(".claude.json")).unwrap().permissions().mode() & 0o777, 0o600);

        // The guest changes its settings and history: both kept, the
        // settings reported, the host untouched.
        put(&state.home.join(".claude/settings.json"), "{\"hooks\": {}}");
        put(&state.home.join(".claude/history.jsonl"), "x");
        let again = prepare(&claude(), &home, &data).unwrap();
        assert_eq!(kept(".claude/settings.json").unwrap(), "{\"hooks\": {}}");
        put(&state.home.join(".claude/commands/new.md"), "planted");
        assert_eq!(
            again.changed_seeds(&home),
            [PathBuf::from(".claude/commands/new.md"), PathBuf::from(".claude/settings.json")],
            "changed and created seed files; history is not a seed"
        );
        assert_eq!(fs::read_to_string(home.join(".claude/settings.json")).unwrap(), "{\"model\": \"opus\"}");

        // A change on the host flows in at the next run.
        put(&home.join(".claude/settings.json"), "{\"model\": \"sonnet\"}");
        let third = prepare(&claude(), &home, &data).unwrap();
        assert_eq!(kept(".claude/settings.json").unwrap(), "{\"model\": \"sonnet\"}");
        assert_eq!(third.changed_seeds(&home), [PathBuf::from(".claude/commands/new.md")]);
    }

    #[test]
    fn changed_settings_are_staged_for_the_home_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let (home, data) = (tmp.path().join("home"), tmp.path().join("data"));
        put(&home.join(".claude/settings.json"), "{}");
        let state = prepare(&claude(), &home, &data).unwrap();
        put(&state.home.join(".claude/settings.json"), "{\"hooks\": {\"Stop\": []}}");
        put(&state.home.join(".claude/commands/new.md"), "new");
        let changed = state.changed_seeds(&home);
        let session = tmp.path().join("session");
        fs::create_dir_all(&session).unwrap();
        let store = Store::open(&session).unwrap();
        assert_eq!(state.stage_for_home(&changed, &home, &store).unwrap(), 2);
        let options = crate::changes::ApplyOptions::all();
        let report = crate::changes::apply(&store, &home, &options).unwrap();
        assert!(report.conflicts.is_empty() && report.failed.is_empty() && report.refused.is_empty(), "{report:?}");
        assert_eq!(fs::read_to_string(home.join(".claude/settings.json")).unwrap(), "{\"hooks\": {\"Stop\": []}}");
        assert_eq!(fs::read_to_string(home.join(".claude/commands/new.md")).unwrap(), "new");

        // An edit on the host after staging is a conflict, never overwritten.
        put(&state.home.join(".claude/settings.json"), "{\"hooks\": 2}");
        let again = tmp.path().join("again");
        fs::create_dir_all(&again).unwrap();
        let store = Store::open(&again).unwrap();
        state.stage_for_home(&[PathBuf::from(".claude/settings.json")], &home, &store).unwrap();
        put(&home.join(".claude/settings.json"), "{\"mine\": 1}");
        let report = crate::changes::apply(&store, &home, &options).unwrap();
        assert_eq!(report.conflicts.len(), 1, "{report:?}");
        assert_eq!(fs::read_to_string(home.join(".claude/settings.json")).unwrap(), "{\"mine\": 1}");
    }

    #[test]
    fn a_symlink_planted_in_the_state_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (home, data) = (tmp.path().join("home"), tmp.path().join("data"));
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        put(&home.join(".claude/settings.json"), "{}");
        let state = prepare(&claude(), &home, &data).unwrap();
        // The guest replaces its .claude with a link to somewhere of the host's.
        fs::remove_dir_all(state.home.join(".claude")).unwrap();
        symlink(&outside, state.home.join(".claude")).unwrap();
        put(&home.join(".claude/settings.json"), "{\"new\": 1}");
        assert!(prepare(&claude(), &home, &data).is_err());
        assert!(state.place(Path::new(".claude/.credentials.json"), b"{}").is_err());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "nothing was written through the link");
    }

    #[test]
    fn attach_binds_directories_and_copies_files() {
        let tmp = tempfile::tempdir().unwrap();
        let state = prepare(&claude(), &tmp.path().join("home"), &tmp.path().join("data")).unwrap();
        let (mut shares, mut root) = (Vec::new(), Vec::new());
        state.attach(Path::new("/home/u"), (1000, 1000), 4 << 30, &mut shares, &mut root);
        assert!(shares[0].writable && shares[0].guest_path == "/agents/claude");
        assert_eq!(shares[0].limit, Some(4 << 30), "the state is bounded");
        assert_eq!(
            root,
            [
                RootEntry::ShareWritable { source: "/agents/claude/.claude".into(), target: "/home/u/.claude".into() },
                RootEntry::StateFile {
                    source: "/agents/claude/.claude.json".into(),
                    target: "/home/u/.claude.json".into(),
                    uid: 1000,
                    gid: 1000
                },
            ]
        );
        assert!(state.holds(Path::new(".claude/.credentials.json")) && state.holds(Path::new(".claude.json")));
        assert!(!state.holds(Path::new(".claude")) && !state.holds(Path::new(".codex/auth.json")));
    }
}
