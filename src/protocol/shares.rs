//! The virtio-fs tags: the VMM serves its shares under these names and the
//! guest init mounts them by the same names.

/// The read-only share, holding the workspace and the host directories the
/// guest sees.
pub const FS_TAG: &str = "host";
/// The writable share, when a policy mounts directories "rw".
pub const FS_TAG_RW: &str = "host-rw";
