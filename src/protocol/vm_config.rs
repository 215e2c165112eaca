//! What the supervisor tells the VMM process to build, as JSON in the
//! session (`vmm.json`). The VMM gets this plain description, never argv or
//! the user's policy.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A host directory exposed to the guest under `guest_path` in the virtio-fs
/// filesystem (tag `shares::FS_TAG`).
/// The scratch disk as the guest sees it: the first virtio-blk device (the
/// VMM adds `disk` before `image`, see `virtio::blk`).
pub const SCRATCH_DISK: &str = "/dev/vda";
/// The root image in image mode: the second.
pub const IMAGE_DISK: &str = "/dev/vdb";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShareConfig {
    pub guest_path: String,
    pub host_path: PathBuf,
    /// Served by the writable filesystem (tag `shares::FS_TAG_RW`): a policy mount
    /// the guest may change on the host.
    #[serde(default)]
    pub writable: bool,
    /// The sightings file (see `seen`) that records what the
    /// guest looks up in this share: set for the workspace. The supervisor
    /// creates it; the VMM opens it for appending before the jail closes.
    #[serde(default)]
    pub record: Option<PathBuf>,
    /// Bytes a writable share may come to hold (an agent's state); the VMM
    /// answers growth past it with ENOSPC. Every writable share also keeps
    /// the staging free-space margin on its filesystem.
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmConfig {
    /// The PVH vmlinux.
    pub kernel: PathBuf,
    /// The program the guest runs as /init (the stockade binary), served
    /// read-only in the guest's first root.
    pub init: PathBuf,
    pub vcpus: u8,
    pub memory_bytes: u64,
    /// Where the guest's serial console (its kernel log) is written.
    pub kernel_log: PathBuf,
    /// The supervisor's broker socket: guest connections to host port P
    /// get their host end from it (see `broker`).
    pub vsock_broker: PathBuf,
    pub shares: Vec<ShareConfig>,
    /// Host files under the shares that the guest may see listed but never
    /// open, even as root: the host's secrets (rootfs/host.toml's `hide`;
    /// a file name with `*` wildcards names the files it matches).
    #[serde(default)]
    pub secrets: Vec<PathBuf>,
    /// Give the guest a virtio-net device whose TCP and DNS go to the
    /// egress proxy (`TRANSPARENT_PORT`, `DNS_PORT`).
    #[serde(default)]
    pub network: bool,
    /// The scratch disk image (virtio-blk, [`SCRATCH_DISK`] in the guest).
    #[serde(default)]
    pub disk: Option<PathBuf>,
    /// A root filesystem image (image mode), read-only: [`IMAGE_DISK`].
    #[serde(default)]
    pub image: Option<PathBuf>,
    /// Close the jail (Landlock and seccomp, see `jail`) before the guest
    /// runs; false only with `--no-jail`.
    pub jail: bool,
    /// Print the whole kernel log instead of warnings and errors only.
    pub verbose_kernel: bool,
    /// Extra kernel command-line arguments (debugging).
    #[serde(default)]
    pub kernel_args: Vec<String>,
    /// Record a template at the template point, or start from one (see
    /// `vmm::template`); none boots without either.
    #[serde(default)]
    pub template: Option<TemplatePlan>,
}

/// What the VMM does about templates.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TemplatePlan {
    /// Boot, and save the VM into this new, empty directory at the
    /// template point.
    Record(PathBuf),
    /// Resume the template in this directory; boot if it cannot be used.
    Restore(PathBuf),
}
