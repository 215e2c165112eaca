//! The one definition of what stockade's processes say to each other: the
//! host and the guest init over vsock, the supervisor and the VMM, and
//! stockade and its caller. Each side uses this module, so no two ends can
//! drift, and none of them imports another's internals for a contract.
//!
//! - this module: the vsock ports and the messages on them (`HostMsg`,
//!   `GuestMsg`, `RunSpec`, ...), framed by `read_frame`/`write_frame`;
//! - `change_set`: the guest's workspace changes as the host receives them
//!   (paths, entries and the stream they travel in);
//! - `audit`: the proxy's audit log, read by `stockade log` and `policy learn`;
//! - `auth`: how the init's connections are told from other guest processes;
//! - `seen`: the workspace paths the guest looked up, which the VMM records
//!   for apply;
//! - `transparent`: the guest network's addresses and a transparent stream's
//!   header;
//! - `shares`: the virtio-fs tags the VMM serves and the guest mounts;
//! - `vm_config`: what the supervisor tells the VMM process to build;
//! - `broker`: how the jailed VMM asks the supervisor for host ports;
//! - `limits`: limits the CLI checks and the VMM builds to;
//! - `exit`: stockade's own exit statuses;
//! - `publish`: published ports (`run -p`) and how the init dials back;
//! - `stream`: how forwarded streams are copied across vsock.
//!
//! The guest opens two connections to the host (CID 2): `CONTROL_PORT`
//! carries framed messages both ways, `STDIN_PORT` carries the command's
//! standard input as a raw byte stream whose end is the input's end. Keeping
//! stdin apart means a command that never reads its input cannot stall the
//! control messages (signals, finish) behind it. After the command, the
//! change set goes out on `CHANGES_PORT`.
//!
//! For a published port the host asks on the control connection
//! (`HostMsg::Connect`) and the init dials back on `PUBLISH_PORT`, so every
//! vsock connection is opened by the guest and the VMM needs no listener.
//!
//! Only the init (PID 1) may use those four ports; `auth` says how the
//! VMM and the host tell it from any other guest process.
#![forbid(unsafe_code)]

pub mod audit;
pub mod auth;
pub mod broker;
pub mod change_set;
pub mod exit;
mod frame;
pub mod limits;
pub mod publish;
pub mod seen;
pub mod shares;
pub mod stream;
pub mod template;
pub mod transparent;
pub mod vm_config;

pub use frame::{FrameError, read_frame, write_frame};

use serde::{Deserialize, Serialize};

/// The host's vsock context id, as seen from the guest.
pub const HOST_CID: u32 = 2;
/// The guest's context id.
pub const GUEST_CID: u64 = 3;
/// Control messages in both directions.
pub const CONTROL_PORT: u32 = 1024;
/// The command's stdin, host to guest.
pub const STDIN_PORT: u32 = 1025;
/// The workspace change set, guest to host, once the command has ended.
pub const CHANGES_PORT: u32 = 1026;
/// One HTTP proxy connection per stream, guest to the host's egress proxy.
pub const PROXY_PORT: u32 = 1027;
/// DNS messages framed as over TCP (2-byte length), answered by the host.
pub const DNS_PORT: u32 = 1028;
/// One transparent TCP connection per stream, from the VMM's virtio-net
/// device to the host's egress proxy: a `transparent::Header` naming the
/// guest's original destination, then the guest's bytes.
pub const TRANSPARENT_PORT: u32 = 1029;
/// One connection per host client of a published port, guest to host: the
/// token, a `publish::Callback`, then the client's bytes both ways.
pub const PUBLISH_PORT: u32 = 1030;
/// One connection per guest ssh-agent client, guest to the host's agent
/// relay (which signs only for SSH connections the proxy checked).
pub const AGENT_PORT: u32 = 1031;
/// A checkpoint of the workspace changes while the command runs, guest to
/// host, one connection per `HostMsg::Checkpoint`: the token, then a change
/// set as on `CHANGES_PORT`.
pub const CHECKPOINT_PORT: u32 = 1032;
/// Where the init serves the ssh-agent relay (`SSH_AUTH_SOCK`).
pub const GUEST_AGENT_SOCKET: &str = "/run/stockade/ssh-agent.sock";

/// How the guest root is put together, entry by entry, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RootEntry {
    /// Image mode's system: the ext2/ext4 image on the read-only `disk`,
    /// under a throwaway tmpfs upper layer, with its top-level directories
    /// and links placed at the root. Comes first.
    Image { disk: String },
    /// Bind `source` (a path inside the virtio-fs share) read-only at `target`.
    Share { source: String, target: String },
    /// Bind `source`, a path inside the writable virtio-fs share, at
    /// `target`: the guest's writes reach the host (a policy's "rw" mount).
    ShareWritable { source: String, target: String },
    /// An agent's state file: copied from `source`, a path inside the
    /// writable share, to `target` (owned by `uid`:`gid`) before the command,
    /// and back after it.
    StateFile { source: String, target: String, uid: u32, gid: u32 },
    /// The read-only share `source` at `target` with a throwaway tmpfs upper
    /// layer: the guest may write, the host copy stays as it was (a
    /// policy's "overlay" mount).
    ShareScratch { source: String, target: String },
    /// A symbolic link at `link` pointing to `target` (merged-/usr hosts).
    Symlink { link: String, target: String },
    /// A fresh tmpfs at `target` owned by `uid`:`gid` with `mode`.
    Tmpfs { target: String, mode: u32, uid: u32, gid: u32 },
    /// The workspace, copy-on-write: the read-only share `source` as the
    /// lower layer and an upper layer on the scratch disk `disk`, merged at
    /// `target`. What the command changes stays in the upper layer, which
    /// the guest exports as a change set when the command ends.
    Overlay { source: String, target: String, disk: String },
    /// A file the host generated for the guest (resolv.conf, the proxy CA),
    /// placed read-only at `target`, over whatever the shared /etc has there.
    File { target: String, content: String, mode: u32 },
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSize {
    pub rows: u16,
    pub cols: u16,
}

/// The command the guest runs and the world it runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub root: Vec<RootEntry>,
    /// Run on a pseudo-terminal of this size (stdout and stderr merge, as
    /// on any terminal); `None` keeps separate pipes.
    #[serde(default)]
    pub tty: Option<WindowSize>,
    /// Configure the guest's network (eth0 and the proxy forwarder), both
    /// leading to the host's egress proxy.
    #[serde(default)]
    pub network: bool,
    /// The command's cgroup pids.max.
    #[serde(default)]
    pub pids: Option<u32>,
    /// Start dockerd (image mode, `--docker`) before the command and wait
    /// until it answers.
    #[serde(default)]
    pub docker: bool,
    /// Serve the host's ssh-agent relay at `GUEST_AGENT_SOCKET`.
    #[serde(default)]
    pub ssh_agent: bool,
    /// This boot's secret: stdin and change connections start with it
    /// (see `auth`). For the init only; never passed to the command.
    pub token: auth::Token,
    /// The host's clock and fresh entropy, taken as the spec is sent: a
    /// guest restored from a template has the clock and random state of the
    /// moment it was recorded until the init applies these.
    #[serde(default)]
    pub clock: Option<template::HostClock>,
    #[serde(default)]
    pub seed: Vec<u8>,
    /// Recover a kept scratch disk (`stockade recover`): mount the root
    /// (the workspace overlay on it), export the changes, run nothing.
    #[serde(default)]
    pub recover: bool,
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExitReport {
    /// It exited with this status.
    Exited { code: i32 },
    /// A signal killed it.
    Signaled { signal: i32 },
    /// It could not be started: `not_found` (127) or not executable (126).
    NotStarted { not_found: bool, message: String },
    /// The guest init could not prepare the command's environment.
    SetupFailed { message: String },
}

/// Host to guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HostMsg {
    Run(RunSpec),
    /// Deliver this signal to the command's process group (on a terminal,
    /// its foreground process group).
    Signal {
        signal: i32,
    },
    /// The host terminal changed size.
    Resize(WindowSize),
    /// The host has everything; the guest may power off.
    Finish,
    /// A host client connected to a published port: connect to `port` on
    /// the guest's loopback and dial back on `PUBLISH_PORT` with `id`.
    Connect {
        id: u64,
        port: u16,
    },
    /// Export the workspace changes made so far on `CHECKPOINT_PORT` and
    /// answer with `GuestMsg::Checkpoint` carrying the same `id`; the
    /// command goes on.
    Checkpoint {
        id: u64,
    },
}

/// How the export of the workspace changes went; sent after the change set
/// itself has gone out on `CHANGES_PORT`, before `Exit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExportOutcome {
    /// `stream` is what went over the change connection after the token:
    /// the host stages only a stream that matches it.
    Sent {
        entries: u64,
        files: u64,
        bytes: u64,
        skipped: u64,
        stream: auth::StreamDigest,
    },
    Failed {
        message: String,
    },
}

/// Guest to host. Output travels as raw frames (see `frame`), not JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestMsg {
    Ready {
        kernel: String,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Changes(ExportOutcome),
    Exit(ExitReport),
    /// Output of dockerd (with `--docker`), for the session's dockerd.log.
    DockerdLog(Vec<u8>),
    /// The init is alive: sent every [`HEARTBEAT_EVERY`] from a thread of
    /// its own, so that a guest that halts or hangs is noticed.
    Heartbeat,
    /// How the export asked for by `HostMsg::Checkpoint { id }` went.
    Checkpoint(CheckpointOutcome),
}

/// The init's answer to a checkpoint request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOutcome {
    pub id: u64,
    pub outcome: ExportOutcome,
}

/// How often the init says it is alive.
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
