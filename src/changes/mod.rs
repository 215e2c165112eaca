//! Workspace changes made in the guest, from the guest's export to the host's
//! apply: the only code that writes the user's workspace.
//!
//! Flow: at session start the supervisor creates the sightings file
//! (`Store::start_seen`) where the VMM records what the guest looks up in
//! the workspace ([`Seen`]). At exit the guest's exporter
//! (`guest::export`) walks its overlay and writes a change set with
//! [`Writer`]; the supervisor stages it with [`Store::stage`], which
//! validates every record and keeps content as blobs named by hash. Review
//! reads [`Store::entries`] and [`Store::open_blob`]; [`check`] reports what
//! would apply and what conflicts; [`apply`] writes the chosen paths
//! atomically under a journal, and [`recover`] (run by `apply` itself)
//! completes an interrupted apply.
//!
//! The change set's vocabulary (paths, entries) and its stream format are
//! the guest's contract with the host, in `protocol::change_set`.
//!
//! The review of staged changes (`crate::review`) sits on top of this
//! module: it reads the store, the workspace (through [`Host`]) and the
//! base commit of a branch (an [`OtherTree`]), and lands what the user
//! chose through [`apply_with_progress`]; nothing here imports it.
//!
//! Modules: `validate` (set rules), `selection`, `store` (session
//! change store), `seen`, `tree` (directory digests), `dirfd`
//! (symlink-safe fd-relative operations), `host` (reading the workspace
//! through `dirfd`), `conflict`, `journal`, `apply`, `landed`, `git`
//! (staged changes as a commit: `apply --branch`, `--commit`),
//! `other_tree` (a commit's tree as the review reads it).
#![forbid(unsafe_code)]

mod apply;
#[cfg(test)]
mod attack_tests;
mod conflict;
mod dirfd;
pub mod git;
mod host;
mod journal;
pub mod landed;
mod other_tree;
mod seen;
mod selection;
mod store;
#[cfg(test)]
pub(crate) mod testutil;
/// What tests above the write path reach of its insides.
#[cfg(test)]
pub(crate) mod test_access {
    pub(crate) use super::apply::{apply, apply_with_hook};
    pub(crate) use super::journal::load as interrupted_journal;
}
mod tree;
mod validate;

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::protocol::change_set::WireError;

pub use apply::{ApplyOptions, ApplyReport, apply_with_progress, check, complete_interrupted};
pub use host::{Host, HostState};
pub use other_tree::{OtherTree, TreeFile};
pub use selection::Selection;
pub use store::{Counts, SetState, StageReport, Store, StoredEntry};
pub(crate) use store::{Space, write_atomically};
pub use tree::digest_at as tree_digest_at;
pub use validate::SetError;
// Used by tests elsewhere in the crate only.
#[cfg(test)]
pub use apply::apply;
#[cfg(test)]
pub(crate) use dirfd::work;

#[derive(Debug, Error)]
pub enum ChangesError {
    #[error("the change set from the guest was rejected")]
    Stream(#[from] WireError),
    #[error("the change set from the guest was rejected")]
    Set(#[from] SetError),
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the change store {} is damaged ({detail}); discard this session's changes", path.display())]
    Corrupt { path: PathBuf, detail: String },
    /// The disk filled while staging: nothing was staged, what was
    /// received is freed again, and the workspace was never touched.
    #[error(
        "the disk holding {} is full: the guest's changes could not be staged there and were not kept \
         (the workspace is unchanged). Free space on that filesystem, or remove old sessions with \
         `stockade sessions --prune` (`--include-staged` also drops unreviewed ones), then run the command again",
        dir.display()
    )]
    NoSpace {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Staging would have left less than the margin free: nothing was
    /// staged, what was received is freed, the workspace was never touched.
    #[error(
        "staging the guest's changes would leave less than {} free on the filesystem holding {} \
         (the data directory; {} left): nothing was staged and what was received is freed \
         (the workspace is unchanged). Free space there, or remove old sessions with \
         `stockade sessions --prune` (`--include-staged` also drops unreviewed ones), then run the command again",
        crate::util::text::human_bytes(*margin), dir.display(), crate::util::text::human_bytes(*available)
    )]
    LowSpace { dir: PathBuf, available: u64, margin: u64 },
    #[error("changes were already staged for this session in {}", .0.display())]
    AlreadyStaged(PathBuf),
    #[error("no changes are staged in {}", .0.display())]
    NothingStaged(PathBuf),
    #[error("another stockade process is staging or applying this session's changes ({}); wait for it to finish", .0.display())]
    Busy(PathBuf),
    #[error(
        "an interrupted apply in {} was for the workspace {theirs}, not {}; run apply again from that workspace",
        journal.display(), ours.display()
    )]
    OtherWorkspace { journal: PathBuf, theirs: String, ours: PathBuf },
}

impl ChangesError {
    /// Wraps an I/O error with the step and path it concerns.
    pub(crate) fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ChangesError + 'a {
        move |source| ChangesError::Io { what, path: path.to_path_buf(), source }
    }
}
