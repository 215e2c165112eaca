//! Export of the guest's workspace changes: walks the overlayfs upper layer
//! beside the read-only lower layer (the host workspace) and writes what
//! differs as a change set (`crate::protocol::change_set::Writer`).
//!
//! What the upper layer holds and what it becomes:
//! - a whiteout (a 0:0 character device, or a zero-size file with the
//!   `overlay.whiteout` xattr): `Delete`, when the lower has the path;
//! - a directory marked `overlay.opaque=y` over a lower directory:
//!   `OpaqueDir`, then its whole contents (nothing below it merges with the
//!   lower);
//! - a directory copied up only because something below changed (same mode
//!   as in the lower): nothing; a chmod: `Dir`;
//! - a file whose content equals the lower's (a chmod, chown or touch copied
//!   it up): `Mode` when the mode differs, else nothing;
//! - other regular files: `File`, content streamed by data extents (a
//!   sparse file's holes go as lengths); hard links inside the upper become
//!   copies, their content sent once;
//! - symlinks: `Symlink` unless identical to the lower's;
//! - fifos, sockets and device nodes: not exported, listed as skipped.
//!
//! Every entry carries its base: what the lower held at that path. Lower
//! paths are only looked up while every lower ancestor is a real directory,
//! so a lower symlink is never followed into something else.
//!
//! The overlay must be mounted with `redirect_dir=off` and `metacopy=off`:
//! a redirected (renamed) directory's contents live elsewhere in the lower,
//! and a metacopy file has no content in the upper. Both are detected; a
//! redirect is an error, a metacopy file is treated as unchanged content.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::protocol::change_set::{Base, Mode, RelPath, SpecialKind, SymlinkTarget, WireError, Writer, skipped};
use crate::util::digest::{Hasher, Sha256};
use crate::util::text::display_bytes;

/// Mount options the workspace overlay needs for `export` to be exact:
/// renamed directories copied rather than redirected, no metadata-only
/// copy-ups, no index, no inode-number mixing.
pub const OVERLAY_OPTIONS: &str = "redirect_dir=off,index=off,metacopy=off,xino=off";

/// How overlayfs marks whiteouts and opaque directories: by a device node,
/// or by extended attributes that need CAP_SYS_ADMIN to read (`trusted.*`)
/// or the `userxattr` mount option (`user.*`). Tests fake them.
pub trait Markers {
    /// Whether the upper entry at `path` is a whiteout.
    fn is_whiteout(&self, path: &Path, meta: &Metadata) -> bool;
    /// Whether the upper directory at `path` hides the lower one entirely.
    fn is_opaque(&self, path: &Path) -> bool;
    /// Whether the upper file at `path` has metadata only (content in the lower).
    fn is_metacopy(&self, path: &Path) -> bool;
    /// Whether the upper directory at `path` was renamed from elsewhere in the lower.
    fn is_redirect(&self, path: &Path) -> bool;
}

/// The markers of a real overlayfs upper layer.
pub struct Overlayfs;

const XATTR_NAMESPACES: [&str; 2] = ["trusted.overlay.", "user.overlay."];

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    for namespace in XATTR_NAMESPACES {
        let mut buf = [0u8; 256];
        if let Ok(len) = rustix::fs::lgetxattr(path, format!("{namespace}{name}"), &mut buf[..]) {
            return Some(buf[..len.min(buf.len())].to_vec());
        }
    }
    None
}

impl Markers for Overlayfs {
    fn is_whiteout(&self, path: &Path, meta: &Metadata) -> bool {
        let ft = meta.file_type();
        (ft.is_char_device() && meta.rdev() == 0)
            || (ft.is_file() && meta.len() == 0 && xattr(path, "whiteout").is_some())
    }

    fn is_opaque(&self, path: &Path) -> bool {
        xattr(path, "opaque").is_some_and(|v| v == b"y")
    }

    fn is_metacopy(&self, path: &Path) -> bool {
        xattr(path, "metacopy").is_some()
    }

    fn is_redirect(&self, path: &Path) -> bool {
        xattr(path, "redirect").is_some()
    }
}

#[derive(Debug, Error)]
pub enum ExportError {
    #[error("cannot read {} in the overlay's upper layer", path.display())]
    Upper {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {} in the workspace's lower layer", path.display())]
    Lower {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is a renamed directory (an overlayfs redirect); mount the overlay with redirect_dir=off", path.display())]
    Redirect { path: PathBuf },
    #[error("cannot send the change set")]
    Wire(#[from] WireError),
}

/// What an export found, besides what it sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Entries written (all kinds).
    pub entries: u64,
    /// Files whose content was sent, and its bytes.
    pub files: u64,
    pub bytes: u64,
    /// Fifos, sockets, device nodes and unacceptable names, not exported.
    pub skipped: u64,
    /// Upper files whose content equals the lower's (copied up for metadata).
    pub unchanged_copies: u64,
    /// Extra names of hard-linked files, sent as copies without resending content.
    pub hard_links: u64,
    /// Paths looked up in the lower layer: one per upper entry below a lower
    /// directory, never the lower's other paths.
    pub lower_lookups: u64,
    /// Lower entries walked to digest the directories a change removes or
    /// replaces: the size of what is removed, the only lower walk.
    pub lower_tree_entries: u64,
}

/// Writes the changes of `upper` over `lower` to `out`; the caller finishes
/// the stream (`Writer::finish`) afterwards.
pub fn export<W: Write>(
    upper: &Path,
    lower: &Path,
    markers: &dyn Markers,
    out: &mut Writer<W>,
) -> Result<ExportReport, ExportError> {
    let mut walk = Walk { upper, lower, markers, out, report: ExportReport::default(), links: HashMap::new() };
    walk.dir(None, false, true)?;
    let summary = walk.out.summary();
    walk.report.entries = summary.entries;
    walk.report.files = summary.files;
    walk.report.bytes = summary.bytes;
    walk.report.skipped = summary.skipped;
    Ok(walk.report)
}

struct Walk<'a, W: Write> {
    upper: &'a Path,
    lower: &'a Path,
    markers: &'a dyn Markers,
    out: &'a mut Writer<W>,
    report: ExportReport,
    /// Hard-linked upper files already sent: (device, inode) to content.
    links: HashMap<(u64, u64), Sha256>,
}

fn upper_err(path: &Path) -> impl FnOnce(io::Error) -> ExportError + '_ {
    move |source| ExportError::Upper { path: path.to_path_buf(), source }
}

fn lower_err(path: &Path) -> impl FnOnce(io::Error) -> ExportError + '_ {
    move |source| ExportError::Lower { path: path.to_path_buf(), source }
}

fn open_nofollow(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
}

impl<W: Write> Walk<'_, W> {
    /// Exports the children of the upper directory `rel` (`None`: the root).
    /// `in_opaque`: an ancestor hides the lower; `lower_dir`: the lower has
    /// a real directory at `rel`.
    fn dir(&mut self, rel: Option<&RelPath>, in_opaque: bool, lower_dir: bool) -> Result<(), ExportError> {
        let here = rel.map_or(self.upper.to_path_buf(), |r| self.upper.join(r.as_path()));
        let mut names: Vec<OsString> = fs::read_dir(&here)
            .and_then(|rd| rd.map(|e| e.map(|e| e.file_name())).collect())
            .map_err(upper_err(&here))?;
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let Ok(path) = RelPath::child(rel, name.as_bytes()) else {
                let shown = rel.map_or(PathBuf::new(), |r| r.as_path().to_path_buf()).join(&name);
                self.skip(shown.as_os_str().as_bytes(), SpecialKind::BadName)?;
                continue;
            };
            let up = self.upper.join(path.as_path());
            let meta = fs::symlink_metadata(&up).map_err(upper_err(&up))?;
            let low = if lower_dir { self.lower_meta(&path)? } else { None };
            self.entry(&path, &up, &meta, low.as_ref(), in_opaque)?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        path: &RelPath,
        up: &Path,
        meta: &Metadata,
        low: Option<&Metadata>,
        in_opaque: bool,
    ) -> Result<(), ExportError> {
        let ft = meta.file_type();
        if self.markers.is_whiteout(up, meta) {
            // Below an opaque directory the lower is hidden already; without a
            // lower entry there is nothing to delete.
            if !in_opaque && let Some(low) = low {
                let base = self.base(path, low, true)?;
                self.out.delete(path, &base)?;
            }
            return Ok(());
        }
        if ft.is_dir() {
            if self.markers.is_redirect(up) {
                return Err(ExportError::Redirect { path: up.to_path_buf() });
            }
            let mode = meta.mode();
            let lower_is_dir = low.is_some_and(Metadata::is_dir);
            let opaque = !in_opaque && lower_is_dir && self.markers.is_opaque(up);
            if opaque {
                let base = self.base(path, low.expect("lower_is_dir implies a lower entry"), true)?;
                self.out.opaque_dir(path, mode, &base)?;
            } else if in_opaque || !lower_is_dir {
                // No tree digest: an opaque ancestor empties this directory
                // before its own operation runs.
                let base = self.base_of(path, low, false)?;
                self.out.dir(path, mode, &base)?;
            } else if let Some(low) = low
                && Mode::from_raw(mode) != Mode::from_raw(low.mode())
            {
                let base = self.base(path, low, false)?;
                self.out.dir(path, mode, &base)?;
            }
            return self.dir(Some(path), in_opaque || opaque, lower_is_dir);
        }
        if ft.is_file() {
            return self.file(path, up, meta, low, in_opaque);
        }
        if ft.is_symlink() {
            let target = fs::read_link(up).map_err(upper_err(up))?;
            let Ok(target) = SymlinkTarget::new(target.as_os_str().as_bytes()) else {
                return self.skip(path.as_bytes(), SpecialKind::BadName);
            };
            if !in_opaque && low.is_some_and(|l| l.file_type().is_symlink()) {
                let lower_path = self.lower.join(path.as_path());
                let lower_target = fs::read_link(&lower_path).map_err(lower_err(&lower_path))?;
                if lower_target.as_os_str().as_bytes() == target.as_bytes() {
                    return Ok(());
                }
            }
            let base = self.base_of(path, low, true)?;
            self.out.symlink(path, &target, &base)?;
            return Ok(());
        }
        let what = if ft.is_fifo() {
            SpecialKind::Fifo
        } else if ft.is_socket() {
            SpecialKind::Socket
        } else if ft.is_block_device() {
            SpecialKind::BlockDevice
        } else {
            SpecialKind::CharDevice
        };
        self.skip(path.as_bytes(), what)
    }

    fn file(
        &mut self,
        path: &RelPath,
        up: &Path,
        meta: &Metadata,
        low: Option<&Metadata>,
        in_opaque: bool,
    ) -> Result<(), ExportError> {
        let mode = meta.mode();
        let lower_file = low.filter(|l| l.is_file() && !in_opaque);
        if let Some(low) = lower_file {
            let lower_path = self.lower.join(path.as_path());
            let same_content = if self.markers.is_metacopy(up) {
                Some(hash_file(&lower_path).map_err(lower_err(&lower_path))?)
            } else if low.len() == meta.len() {
                compare(up, &lower_path)?
            } else {
                None
            };
            if let Some(sha256) = same_content {
                self.report.unchanged_copies += 1;
                let base = Base::File { mode: Mode::from_raw(low.mode()), size: low.len(), sha256 };
                if Mode::from_raw(mode) != Mode::from_raw(low.mode()) {
                    self.out.mode(path, mode, &base)?;
                }
                return Ok(());
            }
        }
        let base = self.base_of(path, low, true)?;
        let key = (meta.dev(), meta.ino());
        if meta.nlink() > 1
            && let Some(sha256) = self.links.get(&key)
        {
            self.report.hard_links += 1;
            self.out.file_again(path, mode, sha256, &base)?;
            return Ok(());
        }
        let content = open_nofollow(up).map_err(upper_err(up))?;
        // By extents: a sparse file's holes are sent as lengths, not read.
        let sha256 = self.out.sparse_file(path, mode, meta.len(), &content, &base)?;
        if meta.nlink() > 1 {
            self.links.insert(key, sha256);
        }
        Ok(())
    }

    fn skip(&mut self, path: &[u8], what: SpecialKind) -> Result<(), ExportError> {
        tracing::info!("not exporting {} ({what})", display_bytes(path));
        self.out.skipped(&skipped(path, what))?;
        Ok(())
    }

    fn lower_meta(&mut self, path: &RelPath) -> Result<Option<Metadata>, ExportError> {
        self.report.lower_lookups += 1;
        let lower_path = self.lower.join(path.as_path());
        match fs::symlink_metadata(&lower_path) {
            Ok(m) => Ok(Some(m)),
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => Ok(None),
            Err(e) => Err(lower_err(&lower_path)(e)),
        }
    }

    fn base_of(&mut self, path: &RelPath, low: Option<&Metadata>, tree: bool) -> Result<Base, ExportError> {
        match low {
            Some(low) => self.base(path, low, tree),
            None => Ok(Base::Absent),
        }
    }

    /// What the lower holds at `path`; `tree`: digest a directory's contents
    /// (for changes that remove them).
    fn base(&mut self, path: &RelPath, low: &Metadata, tree: bool) -> Result<Base, ExportError> {
        let lower_path = self.lower.join(path.as_path());
        let ft = low.file_type();
        let mode = Mode::from_raw(low.mode());
        Ok(if ft.is_file() {
            let sha256 = hash_file(&lower_path).map_err(lower_err(&lower_path))?;
            Base::File { mode, size: low.len(), sha256 }
        } else if ft.is_dir() {
            let tree = if tree {
                let parent = lower_path.parent().unwrap_or(self.lower);
                let parent = File::open(parent).map_err(lower_err(parent))?;
                let digest =
                    crate::changes::tree_digest_at(&parent, path.file_name()).map_err(lower_err(&lower_path))?;
                self.report.lower_tree_entries += digest.entries;
                Some(digest)
            } else {
                None
            };
            Base::Dir { mode, tree }
        } else if ft.is_symlink() {
            let target = fs::read_link(&lower_path).map_err(lower_err(&lower_path))?;
            match SymlinkTarget::new(target.as_os_str().as_bytes()) {
                Ok(target) => Base::Symlink { target },
                Err(_) => Base::Special,
            }
        } else {
            Base::Special
        })
    }
}

fn hash_file(path: &Path) -> io::Result<Sha256> {
    Hasher::of_reader(open_nofollow(path)?)
}

/// Compares two files of equal size; returns the lower's hash if their
/// contents are equal.
fn compare(up: &Path, lower: &Path) -> Result<Option<Sha256>, ExportError> {
    let mut a = open_nofollow(up).map_err(upper_err(up))?;
    let mut b = open_nofollow(lower).map_err(lower_err(lower))?;
    let mut hasher = Hasher::default();
    let (mut abuf, mut bbuf) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = read_full(&mut a, &mut abuf).map_err(upper_err(up))?;
        let m = read_full(&mut b, &mut bbuf).map_err(lower_err(lower))?;
        if n != m || abuf[..n] != bbuf[..m] {
            return Ok(None);
        }
        if n == 0 {
            return Ok(Some(hasher.finish()));
        }
        hasher.update(&bbuf[..m]);
    }
}

fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
