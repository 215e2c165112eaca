//! A tree the change set lands on other than the working tree, as the
//! review reads it. `git` offers the base commit of `apply --branch` this
//! way; the review (`review::classify`) judges which of its files run code.

use crate::protocol::change_set::entry::Entry;
use crate::protocol::change_set::path::RelPath;

/// A file of another tree, as far as the review reads it.
pub enum TreeFile {
    Absent,
    /// Its bytes, up to the limit asked.
    Text(Vec<u8>),
    /// Not a plain file (a symlink), or it cannot be read.
    Unreadable,
}

/// A tree the change set lands on other than the working tree (the base
/// commit of `apply --branch`). What decides there which files run code
/// (its `.envrc` and what that loads, its `pyvenv.cfg` files, the `.pth`
/// files of its site directories, its symlinks) is judged with the
/// working tree's.
pub trait OtherTree {
    /// Its symlinks, as entries making them (for the review's
    /// `Classifier::learn`).
    fn symlinks(&self) -> &[Entry];
    /// Its regular files named `name`, anywhere.
    fn files_named(&self, name: &[u8]) -> Vec<RelPath>;
    /// The names directly in its directory `dir`.
    fn names(&self, dir: &RelPath) -> Vec<Vec<u8>>;
    /// The file at `path`, up to `limit` bytes.
    fn read(&self, path: &RelPath, limit: u64) -> TreeFile;
}
