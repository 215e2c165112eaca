//! The run's four stages (`prepare`, `boot`, `conversation`, `finish`; see
//! the supervisor's own documentation for their order) and what they use
//! while the command runs: the host terminal, signals, the `--timeout`
//! deadline, and the exit status an ending maps to.

pub(super) mod boot;
pub(super) mod conversation;
pub(super) mod deadline;
pub(super) mod finish;
pub(super) mod outcome;
pub(super) mod prepare;
pub(super) mod signals;
pub(super) mod terminal;
