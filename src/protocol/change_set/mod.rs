//! The guest's workspace changes as they cross to the host: validated
//! relative paths (`path`), what each entry says (`entry`), and the byte
//! stream the guest writes and the host stages (`stream`). The guest's
//! exporter writes it; `changes` validates, stores and applies it.

pub mod entry;
pub mod path;
pub mod stream;

pub use entry::{Base, Entry, EntryState, Mode, SpecialKind, SymlinkTarget};
pub use path::RelPath;
pub use stream::{Limits, WireError, Writer, skipped};
