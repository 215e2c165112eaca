//! Limits the command line checks and the VMM relies on, so that a value
//! the CLI accepts is one the VMM can build.

/// The most vCPUs a VM can have: the MP table the VMM writes (at most
/// `vmm::layout::MPTABLE_MAX` bytes) fits this many processor entries.
pub const MAX_VCPUS: u8 = 32;
