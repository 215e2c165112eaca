//! The host workspace as review reads it: the "old" side of every diff.
//! Reads go through `dirfd` like apply's writes, so a symlink on the host is
//! shown as a symlink and never followed into a file outside the workspace.
//! A workspace that is gone (moved, deleted) reads as empty.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::changes::dirfd::{self, FileType, Root};
use crate::protocol::change_set::entry::Mode;
use crate::protocol::change_set::path::RelPath;

/// What the host holds at a path now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostState {
    Absent,
    File {
        mode: Mode,
        size: u64,
    },
    Dir {
        mode: Mode,
    },
    Symlink {
        target: Vec<u8>,
    },
    Special,
    /// A parent is a symlink or not a directory, or the path cannot be read.
    Unreachable(String),
}

pub struct Host {
    root: Option<Root>,
    workspace: PathBuf,
}

impl Host {
    pub fn open(workspace: &Path) -> Host {
        let root = match Root::open(workspace) {
            Ok(root) => Some(root),
            Err(e) => {
                tracing::warn!("cannot open the workspace {}: {e}; showing it as empty", workspace.display());
                None
            }
        };
        Host { root, workspace: workspace.to_path_buf() }
    }

    pub fn state(&self, path: &RelPath) -> HostState {
        let Some(root) = &self.root else { return HostState::Absent };
        let dir = match root.parent_of(path) {
            Ok(dir) => dir,
            Err(dirfd::ResolveError::Missing(_)) => return HostState::Absent,
            Err(dirfd::ResolveError::Symlink(c)) => return HostState::Unreachable(format!("{c} is a symlink")),
            Err(dirfd::ResolveError::NotDir(c)) => return HostState::Unreachable(format!("{c} is not a directory")),
            Err(dirfd::ResolveError::Io(e)) => return HostState::Unreachable(e.to_string()),
        };
        let name = path.file_name();
        let stat = match dirfd::stat_at(&dir, name) {
            Ok(Some(stat)) => stat,
            Ok(None) => return HostState::Absent,
            Err(e) => return HostState::Unreachable(e.to_string()),
        };
        let mode = Mode::from_raw(stat.st_mode);
        match FileType::of(&stat) {
            FileType::File => HostState::File { mode, size: u64::try_from(stat.st_size).unwrap_or(0) },
            FileType::Dir => HostState::Dir { mode },
            FileType::Symlink => match dirfd::read_link(&dir, name) {
                Ok(target) => HostState::Symlink { target },
                Err(e) => HostState::Unreachable(e.to_string()),
            },
            FileType::Special => HostState::Special,
        }
    }

    /// The content of the regular file at `path`, at most `limit` bytes
    /// (`None` when there is no regular file there).
    pub fn read(&self, path: &RelPath, limit: u64) -> io::Result<Option<Vec<u8>>> {
        let Some(root) = &self.root else { return Ok(None) };
        if !matches!(self.state(path), HostState::File { .. }) {
            return Ok(None);
        }
        let Ok(dir) = root.parent_of(path) else { return Ok(None) };
        // Refuses a symlink or special file swapped in since the stat.
        let file = dirfd::open_file(&dir, path.file_name())?;
        let mut content = Vec::new();
        file.take(limit).read_to_end(&mut content)?;
        Ok(Some(content))
    }

    /// The content of the regular file `path` names, at most `limit` bytes,
    /// following symlinks (inside or outside the workspace) the way a
    /// program reading it does: for files read only to judge what they make
    /// other programs do, like a symlinked `.envrc` that direnv follows.
    /// `None` when no regular file is there.
    pub fn read_following(&self, path: &RelPath, limit: u64) -> io::Result<Option<Vec<u8>>> {
        if self.root.is_none() {
            return Ok(None);
        }
        // Non-blocking, so that a FIFO at the end of the link cannot stall the review.
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(self.workspace.join(path.as_path()))
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if !file.metadata()?.is_file() {
            return Ok(None);
        }
        let mut content = Vec::new();
        file.take(limit).read_to_end(&mut content)?;
        Ok(Some(content))
    }

    /// The names in the directory `path` on the host (not below it), at
    /// most `limit` of them; none when it is not a directory.
    pub fn names(&self, path: &RelPath, limit: usize) -> Vec<Vec<u8>> {
        let Some(root) = &self.root else { return Vec::new() };
        let Ok(parent) = root.parent_of(path) else { return Vec::new() };
        let Ok(mut dir) = dirfd::open_dir(&parent, path.file_name()) else { return Vec::new() };
        let mut names = dirfd::list(&mut dir).unwrap_or_default();
        names.truncate(limit);
        names
    }

    /// Every path below the directory `path` on the host, in tree order,
    /// without following symlinks; at most `limit` of them.
    pub fn below(&self, path: &RelPath, limit: usize) -> Vec<(RelPath, HostState)> {
        let mut found = Vec::new();
        if let Some(root) = &self.root
            && let Ok(parent) = root.parent_of(path)
            && let Ok(mut dir) = dirfd::open_dir(&parent, path.file_name())
        {
            self.walk(&mut dir, path, limit, &mut found);
        }
        found
    }

    fn walk(&self, dir: &mut nix::dir::Dir, at: &RelPath, limit: usize, found: &mut Vec<(RelPath, HostState)>) {
        let Ok(names) = dirfd::list(dir) else { return };
        for name in names {
            if found.len() >= limit {
                return;
            }
            let Ok(path) = at.join(&name) else { continue };
            let state = self.state(&path);
            let is_dir = matches!(state, HostState::Dir { .. });
            found.push((path.clone(), state));
            if is_dir && let Ok(mut sub) = dirfd::open_dir(dir, &name) {
                self.walk(&mut sub, &path, limit, found);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn p(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn never_reads_through_a_symlinked_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        fs::create_dir_all(tmp.path().join("secret")).unwrap();
        fs::write(tmp.path().join("secret/key"), b"hunter2").unwrap();
        fs::create_dir(&ws).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), ws.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", ws.join("file-link")).unwrap();
        let host = Host::open(&ws);
        assert!(matches!(host.state(&p("link/key")), HostState::Unreachable(_)));
        assert_eq!(host.read(&p("link/key"), 100).unwrap(), None);
        assert_eq!(host.read(&p("file-link"), 100).unwrap(), None);
        assert_eq!(host.state(&p("file-link")), HostState::Symlink { target: b"/etc/hostname".to_vec() });
        assert_eq!(host.state(&p("missing/x")), HostState::Absent);
    }

    #[test]
    fn read_following_follows_links_out_of_the_workspace_but_never_blocks_on_a_fifo() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        fs::create_dir(&ws).unwrap();
        fs::write(tmp.path().join("shared-envrc"), b"PATH_add tools\n").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("shared-envrc"), ws.join(".envrc")).unwrap();
        nix::unistd::mkfifo(&tmp.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("fifo"), ws.join("pipe")).unwrap();
        std::os::unix::fs::symlink("missing", ws.join("dangling")).unwrap();
        let host = Host::open(&ws);
        assert_eq!(host.read_following(&p(".envrc"), 100).unwrap(), Some(b"PATH_add tools\n".to_vec()));
        assert_eq!(host.read_following(&p(".envrc"), 4).unwrap(), Some(b"PATH".to_vec()));
        assert_eq!(host.read_following(&p("pipe"), 100).unwrap(), None);
        assert_eq!(host.read_following(&p("dangling"), 100).unwrap(), None);
    }

    #[test]
    fn lists_a_tree_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("d/e")).unwrap();
        fs::write(tmp.path().join("d/e/f"), b"1").unwrap();
        fs::write(tmp.path().join("d/a"), b"22").unwrap();
        let host = Host::open(tmp.path());
        let below: Vec<String> = host.below(&p("d"), 100).into_iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(below, ["d/a", "d/e", "d/e/f"]);
        assert_eq!(host.below(&p("d"), 1).len(), 1);
    }
}
