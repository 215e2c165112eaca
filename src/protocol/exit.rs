//! stockade's own exit statuses, as `docker run` and `env` use them; any
//! other status is the command's (or 128+n when signal n killed it).

/// Stockade itself failed (or the VM stopped before the command finished).
pub const EXIT_STOCKADE: u8 = 125;
/// The command was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
