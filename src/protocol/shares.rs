//! The virtio-fs tags: the VMM serves its shares under these names and the
//! guest init mounts them by the same names.

/// The read-only share, holding the workspace and the host directories the
/// guest sees.
pub const FS_TAG: &str = "host";
/// The writable share, when a policy mounts directories "rw".
pub const FS_TAG_RW: &str = "host-rw";
/// The guest's first root, which the kernel mounts itself
/// (`root=<tag> rootfstype=virtiofs`): a fixed read-only tree.
pub const BOOT_TAG: &str = "stockade-boot";
/// In the first root: the init (the stockade binary).
pub const BOOT_INIT: &str = "/init";
/// In the first root: where the kernel mounts devtmpfs before the init
/// runs.
pub const BOOT_DEV: &str = "/dev";
/// In the first root: where the init mounts the tmpfs that becomes its
/// writable root.
pub const BOOT_NEW_ROOT: &str = "/newroot";
