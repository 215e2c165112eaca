//! `stockade run` orchestration: checks the host, creates the session, starts
//! the VMM process, talks to the guest init over vsock, streams the command's
//! output, and turns its end into our exit status.
//!
//! A run goes through four stages, each a type that owns what it set up and
//! undoes it when dropped, so a run that fails part-way cleans up after
//! itself (in reverse order: the VMM is killed before the proxy stops):
//!
//! 1. [`prepare`]: the host check (KVM, kernel, jail, workspace) comes first
//!    because it creates nothing; then the session and its record, then the
//!    egress proxy starting on a thread of its own, and beside it the
//!    scratch disk (filled from a blank in the background), the init's
//!    listeners and the change receiver, the agents' state and the root
//!    layout's shares.
//! 2. [`boot`]: the VMM starts with those shares; while the guest boots the
//!    proxy is waited for, and the command is completed with what comes
//!    from it (the CA files, the proxy variables, the sign-in files).
//! 3. [`conversation`]: once the init calls in, the scratch disk must be
//!    filled before the command is sent (the guest mounts it on receipt);
//!    the listeners and the proxy are already up (the guest dials them only
//!    after that). The terminal is raw for this stage only, so the review
//!    that follows reads a sane one.
//! 4. [`finish`]: the VMM powers off in the background while the proxy
//!    stops, the scratch disk goes (unless it alone holds unstaged changes)
//!    and the changes are reviewed; then the exit status and the run record
//!    are decided in one place.
//!
//! Folders by job: `stages/` holds those four stages and what they use
//! while the command runs (terminal, signals, deadline, exit status);
//! `guest_view/` builds what the guest is given to see (root layout,
//! identity, home toolchains, agents' state, scratch disk); `channels/`
//! holds the host's ends of the run's other channels (admission, published
//! ports, the change port, network, `live.sock`). `vm` (the VMM child
//! process and its vsock listeners) serves all three, and `recover` is the
//! other flow: it boots a VM on an interrupted session's kept disk. The
//! session store itself is `crate::session`.
#![forbid(unsafe_code)]

pub mod channels;
pub mod guest_view;
pub mod recover;
mod stages;
mod vm;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::review;
use stages::{boot, conversation, finish, prepare, signals};

pub use guest_view::home_tools::TOOL_VARS;
pub use guest_view::root::find_workspace;

/// A validated `stockade run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cpus: u8,
    pub memory_bytes: u64,
    /// Size of the sparse scratch disk for the workspace's upper layer.
    pub disk_bytes: u64,
    /// How much the package cache may hold; 0 turns it off.
    pub package_cache_bytes: u64,
    /// What each agent's state directory may come to hold.
    pub agent_state_bytes: u64,
    /// What happens to the guest's workspace changes after the command.
    pub apply: review::ApplyMode,
    /// `--include-code` and the user's `runs_code` patterns.
    pub code: review::CodeChoice,
    /// Colour for the review on stderr.
    pub color: crate::util::color::ColorChoice,
    /// What the guest may reach on the network, and the credentials the
    /// proxy adds on its behalf.
    pub policy: crate::policy::Policy,
    /// Stop the command after this long (exit 124).
    pub timeout: Option<Duration>,
    /// The guest cgroup's pids.max for the command.
    pub pids: Option<u32>,
    /// Host ports forwarded to guest ports (`-p`).
    pub publish: Vec<crate::protocol::publish::Published>,
    /// Jail the VMM (Landlock, seccomp); false with --no-jail.
    pub jail: bool,
    /// The root image to run on (`--image`), or the host's own system.
    pub image: Option<String>,
    /// Start dockerd in the guest before the command (image mode).
    pub docker: bool,
    pub kernel: Option<PathBuf>,
    pub kernel_args: Vec<String>,
    /// Print the guest kernel's whole boot log (only a booting VM has one).
    pub verbose_kernel: bool,
    /// Resume a template instead of booting, or record one (`--no-snapshot`
    /// turns this off).
    pub snapshot: bool,
    /// Run the command on a pseudo-terminal; `None` decides by whether
    /// stockade runs on one.
    pub tty: Option<bool>,
    /// Share the home toolchains on PATH read-only (host mode).
    pub home_tools: bool,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// stockade's exit status: the command's own, or 125 and the like.
    pub status: u8,
    pub session_id: String,
    pub session_dir: PathBuf,
    /// What went wrong when stockade or the VM failed, rather than the
    /// command (whose own status may be 125 too).
    pub failure: Option<String>,
    /// What the guest did on the init's channels that the init never does
    /// (forged or second connections, a change set the init did not send).
    /// Reported as warnings; `--ci` fails the run.
    pub tampering: Vec<String>,
}

/// When this run started: the first step it reached.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Notes in the debug log (`-vv`) how long the run took to reach `step`, so
/// a slow start or end can be seen step by step.
pub fn reached(step: &str) {
    tracing::debug!("{step} after {:.1?}", STARTED.get_or_init(Instant::now).elapsed());
}

/// Runs the command in a fresh VM and says how it ended.
pub fn run(config: RunConfig) -> anyhow::Result<Finished> {
    reached("run configured");
    signals::block()?;
    let host = prepare::Host::check(&config)?;
    let prepare::Prepared { recorded, mut held, guest } = prepare::Prepared::new(&config, &host)?;
    let booted = boot::Booted::start(&config, &host, &recorded, &mut held, guest)?;
    let (vmm, ended) = conversation::hold(&config, &recorded.session, booted)?;
    Ok(finish::Finish { config: &config, host: &host, recorded, held }.conclude(vmm, ended))
}
