//! `stockade run` orchestration: checks the host, creates the session, starts
//! the VMM process, talks to the guest init over vsock, streams the command's
//! output, and turns its end into our exit status.
#![forbid(unsafe_code)]

mod admission;
mod agent_state;
mod deadline;
mod home_tools;
mod identity;
mod network;
mod outcome;
pub mod retention;
mod root;
mod scratch;
pub mod session;
mod signals;
mod staging;
mod terminal;
mod vm;

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::changes;
use crate::host::kernel;
use crate::host::kvm::{self, DeviceAccess, KvmKind};
use crate::paths::Dirs;
use crate::protocol::auth::Token;
use crate::protocol::exit::EXIT_STOCKADE;
use crate::protocol::vm_config::VmConfig;
use crate::protocol::{
    CHANGES_PORT, CONTROL_PORT, ExitReport, ExportOutcome, GuestMsg, HostMsg, RunSpec, STDIN_PORT, WindowSize,
    read_frame, write_frame,
};

pub use home_tools::TOOL_VARS;
pub use root::find_workspace;

/// How long the guest may take to boot and call in. Seconds on real KVM;
/// the software-CPU test rig needs the margin.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// After the command ends, how long the VMM gets to power off by itself.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A validated `stockade run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cpus: u8,
    pub memory_bytes: u64,
    /// Size of the sparse scratch disk for the workspace's upper layer.
    pub disk_bytes: u64,
    /// What happens to the guest's workspace changes after the command.
    pub apply: changes::review::ApplyMode,
    /// `--include-code` and the user's `runs_code` patterns.
    pub code: changes::review::CodeChoice,
    /// Colour for the review on stderr.
    pub color: changes::review::ColorChoice,
    /// What the guest may reach on the network, and the credentials the
    /// proxy adds on its behalf.
    pub policy: crate::policy::Policy,
    /// Stop the command after this long (exit 124).
    pub timeout: Option<Duration>,
    /// The guest cgroup's pids.max for the command.
    pub pids: Option<u32>,
    /// Jail the VMM (Landlock, seccomp); false with --no-jail.
    pub jail: bool,
    /// The root image to run on (`--image`), or the host's own system.
    pub image: Option<String>,
    /// Start dockerd in the guest before the command (image mode).
    pub docker: bool,
    pub kernel: Option<PathBuf>,
    pub kernel_args: Vec<String>,
    pub verbose_kernel: bool,
    /// Run the command on a pseudo-terminal; `None` decides by whether
    /// stockade runs on one.
    pub tty: Option<bool>,
    /// Share the home toolchains on PATH read-only (host mode).
    pub home_tools: bool,
}

/// Stages the seed files an agent changed in its state (settings that can
/// run code on the host) as a session of their own for the home directory,
/// and reviews it like the workspace's changes; never applied without the
/// user saying so, whatever `--apply` says.
fn offer_agent_settings(
    state: &agent_state::Prepared,
    home: &Path,
    data: &Path,
    run_id: &str,
    config: &RunConfig,
) -> anyhow::Result<()> {
    let changed = state.changed_seeds(home);
    if changed.is_empty() {
        return Ok(());
    }
    let session = session::Session::create(data)?;
    session.write_record(&session::RunRecord {
        id: session.id.clone(),
        command: vec![format!("settings of agent {} changed in session {run_id}", state.name)],
        workspace: home.display().to_string(),
        started: session::timestamp(session.started),
        duration_ms: Some(0),
        status: Some(0),
        outcome: Some("staged from the agent's state".into()),
    })?;
    let store = changes::Store::open(&session.dir)?;
    state.stage_for_home(&changed, home, &store)?;
    let shown: Vec<String> = changed.iter().map(|p| format!("~/{}", p.display())).collect();
    eprintln!(
        "stockade: agent {} changed {} in the sandbox (kept in {}); your own copy is unchanged. \
         To bring the change to your home directory, review it:",
        state.name,
        shown.join(", "),
        state.home.display()
    );
    let mode = match config.apply {
        changes::review::ApplyMode::Ask => changes::review::ApplyMode::Ask,
        _ => changes::review::ApplyMode::None,
    };
    changes::review::after_run(&store, home, &session.id, mode, config.color, &config.code)?;
    Ok(())
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

/// Runs the command in a fresh VM and says how it ended.
pub fn run(config: RunConfig) -> anyhow::Result<Finished> {
    signals::block()?;
    let started = Instant::now();
    let dirs = Dirs::resolve()?;
    let kernel = check_host(&dirs, config.kernel.as_deref())?;
    tracing::debug!("host checked after {:?}", started.elapsed());
    if config.jail {
        if let Err(why) = crate::jail::check_available() {
            bail!(
                "the VMM cannot be jailed on this host: {why}. Fix that, or run with --no-jail \
                 (the VM boundary stays; a VMM bug would no longer be contained)"
            );
        }
    }

    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let user = root::User::current();
    let workspace = root::find_workspace(&cwd, &user.home)?;
    let image = config.image.as_deref().map(|name| crate::image::find(&dirs.cache, name)).transpose()?;
    let system = if image.is_some() { root::System::Image } else { root::System::Host };

    let session = session::Session::create(&dirs.data)?;
    let mut record = session::RunRecord {
        id: session.id.clone(),
        command: config.argv.clone(),
        workspace: workspace.display().to_string(),
        started: session::timestamp(session.started),
        duration_ms: None,
        status: None,
        outcome: None,
    };
    session.write_record(&record)?;

    let store = changes::Store::open(&session.dir)?;
    let seen = store.start_seen()?;
    let disk = session.scratch_disk();
    let formatting = scratch::create(&disk, config.disk_bytes)?;
    let vsock_base = session.dir.join("v.sock");
    let (control_listener, control_path) = vm::listen(&vsock_base, CONTROL_PORT)?;
    let (stdin_listener, stdin_path) = vm::listen(&vsock_base, STDIN_PORT)?;
    let (changes_listener, changes_path) = vm::listen(&vsock_base, CHANGES_PORT)?;
    let token = Token::generate().context("cannot draw this run's token from /dev/urandom")?;
    let tampering = admission::Tampering::default();
    let receiver = staging::receive(changes_listener, changes_path, &store, token.clone(), tampering.clone())?;
    let (network, guest_net) = network::start(&config.policy, &dirs.data, &session.dir, &vsock_base)?;
    let root::Layout { mut shares, root: mut root_layout, env: trust_env } =
        root::layout(&workspace, &user, system, &guest_net)?;
    for skipped in root::policy_mounts(&config.policy.mounts, &user.home, &mut shares, &mut root_layout) {
        eprintln!("stockade: warning: policy mount {skipped} was not mounted; the guest does not see it");
    }
    let guest_path = config.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or_default();
    let tools = if config.home_tools && system == root::System::Host {
        let mut skip = vec![workspace.clone()];
        skip.extend(config.policy.mounts.iter().map(|m| m.host_path(&user.home)));
        home_tools::discover(guest_path, &user.home, &skip, |name| std::env::var(name).ok())
    } else {
        home_tools::HomeTools::default()
    };
    for dir in &tools.dirs {
        tracing::info!("home toolchain shared read-only: {} ({})", dir.path.display(), dir.why);
    }
    root::home_tool_shares(&tools, &mut shares, &mut root_layout);
    root::record_sightings(&mut shares, seen);
    let mut agents = Vec::new();
    for agent in &config.policy.agents {
        let state = agent_state::prepare(agent, &user.home, &dirs.data)
            .with_context(|| format!("cannot ready the state of agent {}", agent.name))?;
        tracing::info!("agent {} keeps its state in {}", agent.name, state.home.display());
        state.attach(&user.home, user.uid, user.gid, &mut shares, &mut root_layout);
        agents.push(state);
    }
    for file in &guest_net.signin_files {
        let rel = Path::new(file.file.trim_start_matches("~/"));
        match agents.iter().find(|a| file.file.starts_with("~/") && a.holds(rel)) {
            Some(state) => state.place(rel, &file.content)?,
            None => root::place_signin_file(&file.file, &file.content, &user.home, &mut root_layout),
        }
    }
    let vm_config = VmConfig {
        kernel,
        init: std::env::current_exe().context("cannot find the stockade binary")?,
        vcpus: config.cpus,
        memory_bytes: config.memory_bytes,
        kernel_log: session.kernel_log(),
        vsock_broker: session.dir.join("broker.sock"),
        shares,
        network: true,
        disk: Some(disk.clone()),
        image: image.map(|i| i.path),
        jail: config.jail,
        verbose_kernel: config.verbose_kernel,
        kernel_args: config.kernel_args.clone(),
    };
    let refusals = tampering.clone();
    let mut vmm =
        vm::VmProcess::start(&vm_config, &session.dir, &session.vmm_log(), &vsock_base, move |host, guest| {
            refusals.report(admission::refused_by_the_vmm(host));
            tracing::debug!("the VMM refused host port {host} to guest port {guest}");
        })?;
    tracing::info!("session {} in {}", session.id, session.dir.display());
    tracing::debug!("VMM started after {:?}", started.elapsed());

    let mut env = config.env.clone();
    for (name, value) in guest_net.env.into_iter().chain(trust_env).chain(guest_net.placeholders) {
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    }
    let spec = RunSpec {
        argv: config.argv.clone(),
        env,
        cwd: cwd.to_str().context("the current directory is not valid UTF-8")?.to_string(),
        uid: user.uid,
        gid: user.gid,
        root: root_layout,
        tty: config
            .tty
            .unwrap_or_else(terminal::interactive)
            .then(|| terminal::size().unwrap_or(WindowSize { rows: 24, cols: 80 })),
        network: true,
        pids: config.pids,
        docker: config.docker,
        token: token.clone(),
    };
    let raw = if spec.tty.is_some() { terminal::RawMode::enter()? } else { None };
    let interrupts = Arc::new(signals::Interrupts::default());
    let expired = deadline::Expired::default();
    let limits = Limits { timeout: config.timeout, expired: expired.clone() };
    let channels = Channels { control: &control_listener, stdin: stdin_listener, token, tampering: tampering.clone() };
    let result = converse(&mut vmm, channels, spec, &session, formatting, receiver, interrupts.clone(), limits);
    drop(raw);
    terminal::sane_display();
    interrupts.vm_gone();
    // The guest has said all it will; its VMM powers off (or is killed after
    // the grace) while the network stops and the changes are reviewed. If
    // the thread cannot start, dropping the VMM kills it.
    let reaper = std::thread::Builder::new().name("vmm-reaper".into()).spawn(move || {
        vmm.finish(SHUTDOWN_GRACE);
        tracing::debug!("VMM exited after {:?}", started.elapsed());
    });
    network.stop();
    // The guest's changes were exported; the disk that held them is spent,
    // unless staging them failed (a full disk): then it is all that holds them.
    let unstaged = matches!(&result, Ok(Conversation::Ended { staged: Some(Err(_)), .. }));
    if !unstaged {
        let _ = std::fs::remove_file(&disk);
    }
    let _ = std::fs::remove_file(control_path);
    let _ = std::fs::remove_file(stdin_path);

    for state in &agents {
        if let Err(e) = offer_agent_settings(state, &user.home, &dirs.data, &session.id, &config) {
            eprintln!("stockade: warning: agent {}: {e:#}; its state stays in {}", state.name, state.home.display());
        }
    }
    tracing::debug!("network stopped after {:?}", started.elapsed());
    let tampered = tampering.lines();
    for what in &tampered {
        eprintln!("stockade: warning: the guest tampered with the init's channels: {what}");
    }
    let apply = match config.apply {
        changes::review::ApplyMode::All if !tampered.is_empty() => {
            eprintln!(
                "stockade: warning: not applying anything despite --apply all, since the guest tampered with \
                 the init's channels; review the staged changes with `stockade diff {}`",
                session.id
            );
            changes::review::ApplyMode::None
        }
        mode => mode,
    };
    let (status, outcome_text) = match &result {
        Ok(Conversation::Ended { report, staged }) => {
            let (status, message) = outcome::exit_status(report);
            if let Some(message) = message {
                eprintln!("stockade: {message}");
                if matches!(report, ExitReport::NotStarted { not_found: true, .. }) {
                    let host_path = std::env::var("PATH").unwrap_or_default();
                    if let Some(hint) =
                        home_tools::not_found_hint(&config.argv[0], &host_path, &user.home, config.home_tools)
                    {
                        eprintln!("stockade: {hint}");
                    }
                }
                if matches!(report, ExitReport::SetupFailed { .. }) && session.dockerd_log().exists() {
                    eprintln!("stockade: dockerd's log is {}", session.dockerd_log().display());
                }
            }
            match staged {
                Some(Ok(_)) => {
                    if let Err(e) =
                        changes::review::after_run(&store, &workspace, &session.id, apply, config.color, &config.code)
                    {
                        eprintln!(
                            "stockade: error: {e:#}; the changes stay staged: see `stockade diff {}`",
                            session.id
                        );
                    }
                }
                Some(Err(e)) => {
                    eprintln!("stockade: warning: {e:#}; the workspace was not changed");
                    eprintln!(
                        "stockade: the guest's changes are kept, unstaged, in the scratch disk {} (ext4: \
                         `sudo mount -o loop,ro` it to copy files out); `stockade sessions --prune \
                         --include-staged` removes it",
                        disk.display()
                    );
                }
                None => {}
            }
            (status, outcome::describe(report))
        }
        Ok(Conversation::Stopped) => (130, "stopped by the user".to_string()),
        Ok(Conversation::VmEnded) => {
            eprintln!("stockade: error: {}", vm_ended_message(&session));
            (EXIT_STOCKADE, "the VM stopped before the command finished".to_string())
        }
        Err(e) => {
            eprintln!("stockade: error: {e:#}");
            (EXIT_STOCKADE, format!("stockade failed: {e:#}"))
        }
    };
    let failure = match &result {
        _ if expired.get() => None,
        Ok(Conversation::Ended { report: ExitReport::SetupFailed { .. }, .. }) | Ok(Conversation::VmEnded) | Err(_) => {
            Some(outcome_text.clone())
        }
        _ => None,
    };
    let status = if expired.get() {
        let limit = config.timeout.map(deadline::describe).unwrap_or_default();
        eprintln!("stockade: stopped after --timeout {limit}; exit status 124");
        deadline::EXIT_TIMEOUT
    } else {
        status
    };
    if let Ok(reaper) = reaper {
        let _ = reaper.join();
    }
    record.duration_ms = Some(session.started.elapsed().map(|d| d.as_millis() as u64).unwrap_or(0));
    record.status = Some(i32::from(status));
    record.outcome = Some(if tampered.is_empty() {
        outcome_text
    } else {
        format!("{outcome_text}; the guest tampered with the init's channels")
    });
    if let Err(e) = session.write_record(&record) {
        tracing::warn!("cannot update the run record: {e:#}");
    }
    Ok(Finished {
        status,
        session_id: session.id.clone(),
        session_dir: session.dir.clone(),
        failure,
        tampering: tampered,
    })
}

/// Refuses early, with the fix, when this host cannot run the VM.
fn check_host(dirs: &Dirs, explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    match kvm::check_device() {
        DeviceAccess::Usable => {}
        DeviceAccess::Missing => bail!(
            "/dev/kvm does not exist: this host has no KVM. Enable virtualization (VT-x/AMD-V) and load kvm_intel or kvm_amd; `stockade doctor` checks the rest"
        ),
        DeviceAccess::PermissionDenied => {
            bail!("you cannot open /dev/kvm: {}; `stockade doctor` checks the rest", kvm::permission_fix())
        }
        DeviceAccess::Failed(e) => bail!("cannot open /dev/kvm: {e}; see `stockade doctor`"),
    }
    let kernel = kernel::locate(dirs, explicit)?;
    if kvm::detect_kind() == KvmKind::Pvm && kernel.pvm_guest != Some(true) {
        bail!(
            "this host's KVM is PVM (kvm_pvm), where a standard guest kernel cannot boot, and {} is not a PVM guest kernel. \
             Run stockade on a host with hardware virtualization, or use a guest kernel built with CONFIG_PVM_GUEST=y; \
             `stockade doctor` explains",
            kernel.path.display()
        );
    }
    Ok(kernel.path)
}

/// Limits the conversation enforces.
struct Limits {
    timeout: Option<Duration>,
    expired: deadline::Expired,
}

enum Conversation {
    /// The command ended; with an overlay, the guest also sent its changes.
    Ended { report: ExitReport, staged: Option<anyhow::Result<changes::StageReport>> },
    /// The user stopped the VM with a second interrupt.
    Stopped,
    /// The VM went away without reporting an end (kernel panic, VMM failure).
    VmEnded,
}

/// The listeners of the init's ports, and what connections on them need.
struct Channels<'a> {
    control: &'a std::os::unix::net::UnixListener,
    stdin: std::os::unix::net::UnixListener,
    token: Token,
    tampering: admission::Tampering,
}

fn converse(
    vmm: &mut vm::VmProcess,
    channels: Channels<'_>,
    spec: RunSpec,
    session: &session::Session,
    formatting: scratch::Formatting,
    receiver: staging::Receiver,
    interrupts: Arc<signals::Interrupts>,
    limits: Limits,
) -> anyhow::Result<Conversation> {
    let mut receiver = Some(receiver);
    let mut staged = None;
    let started = Instant::now();
    let Channels { control: control_listener, stdin: stdin_listener, token, tampering } = channels;
    let Some(control) = vm::accept(control_listener, vmm, BOOT_TIMEOUT)? else {
        if vmm.is_running() {
            vmm.kill();
            bail!(
                "the guest did not call in within {}s; the kernel log is {}",
                BOOT_TIMEOUT.as_secs(),
                session.kernel_log().display()
            );
        }
        return Ok(Conversation::VmEnded);
    };
    // The first control connection is PID 1's: no other guest process
    // existed to open one.
    let _further_control = admission::refuse_further_control(control_listener, tampering.clone())?;
    let mut reader = std::io::BufReader::new(control.try_clone()?);
    let writer = Arc::new(Mutex::new(control));
    match read_frame::<GuestMsg>(&mut reader) {
        Ok(GuestMsg::Ready { kernel }) => {
            tracing::info!("guest {kernel} ready after {:.0?}", started.elapsed());
        }
        Ok(other) => bail!("the guest said {other:?} before it was ready"),
        Err(_) => return Ok(Conversation::VmEnded),
    }
    formatting.wait()?;
    send(&writer, &HostMsg::Run(spec))?;

    let vmm_pid = nix::unistd::Pid::from_raw(i32::try_from(vmm.pid())?);
    let forward_writer = writer.clone();
    let resize_writer = writer.clone();
    signals::spawn(
        interrupts.clone(),
        move |sig| {
            let _ = send(&forward_writer, &HostMsg::Signal { signal: sig as i32 });
        },
        move || {
            if let Some(size) = terminal::size() {
                let _ = send(&resize_writer, &HostMsg::Resize(size));
            }
        },
        move || {
            let _ = nix::sys::signal::kill(vmm_pid, nix::sys::signal::Signal::SIGKILL);
        },
    )?;
    let _watch = match limits.timeout {
        Some(limit) => {
            let signal_writer = writer.clone();
            Some(deadline::watch(
                limit,
                limits.expired,
                move |signal| {
                    let _ = send(&signal_writer, &HostMsg::Signal { signal });
                },
                move || {
                    let _ = nix::sys::signal::kill(vmm_pid, nix::sys::signal::Signal::SIGKILL);
                },
            )?)
        }
        None => None,
    };
    let stdin_pump = StdinPump::spawn(stdin_listener, token, tampering.clone())?;
    let _stop_pump = StopOnDrop(stdin_pump);

    let mut stdout = std::io::stdout().lock();
    let mut stdout_open = true;
    let mut dockerd_log = DockerdLog::default();
    let mut stderr = std::io::stderr();
    loop {
        let msg = match read_frame::<GuestMsg>(&mut reader) {
            Ok(msg) => msg,
            Err(_) if interrupts.stopped() => return Ok(Conversation::Stopped),
            Err(_) => return Ok(Conversation::VmEnded),
        };
        match msg {
            GuestMsg::Stdout(data) if stdout_open => {
                if let Err(e) = stdout.write_all(&data).and_then(|()| stdout.flush()) {
                    if e.kind() == ErrorKind::BrokenPipe {
                        // Our reader went away: the command gets SIGPIPE, as
                        // it would writing to a closed pipe locally.
                        stdout_open = false;
                        let _ = send(&writer, &HostMsg::Signal { signal: libc::SIGPIPE });
                    } else {
                        return Err(e).context("cannot write the command's output");
                    }
                }
            }
            GuestMsg::Stdout(_) => {}
            GuestMsg::Stderr(data) => {
                let _ = stderr.write_all(&data);
            }
            GuestMsg::Changes(outcome) => {
                let Some(receiver) = receiver.take() else {
                    tampering.report("the guest init reported its changes twice; the second report was ignored");
                    continue;
                };
                staged = Some(match outcome {
                    ExportOutcome::Sent { stream, .. } => receiver.finish(stream),
                    ExportOutcome::Failed { message } => {
                        receiver.abandon();
                        Err(anyhow::anyhow!("the guest could not export its changes: {message}"))
                    }
                });
            }
            GuestMsg::Exit(report) => {
                let _ = send(&writer, &HostMsg::Finish);
                if let Some(receiver) = receiver.take() {
                    receiver.abandon();
                }
                return Ok(Conversation::Ended { report, staged });
            }
            GuestMsg::DockerdLog(data) => dockerd_log.write(session, &data),
            GuestMsg::Ready { .. } => tracing::warn!("the guest said ready twice"),
        }
    }
}

/// The session's dockerd.log, created with the first output of dockerd.
#[derive(Default)]
struct DockerdLog {
    file: Option<crate::logcap::Capped<std::fs::File>>,
    failed: bool,
}

impl DockerdLog {
    fn write(&mut self, session: &session::Session, data: &[u8]) {
        if self.file.is_none() && !self.failed {
            let path = session.dockerd_log();
            match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                Ok(file) => {
                    use crate::logcap::{Capped, DOCKERD_LOG_CAP, Style};
                    self.file = Some(Capped::new(file, "dockerd.log", Style::Text, DOCKERD_LOG_CAP));
                }
                Err(e) => {
                    // The run goes on; only the daemon's log is lost.
                    tracing::warn!("cannot create {}: {e}", path.display());
                    self.failed = true;
                }
            }
        }
        if let Some(file) = &mut self.file {
            let _ = file.write_all(data);
        }
    }
}

fn send(writer: &Mutex<UnixStream>, msg: &HostMsg) -> anyhow::Result<()> {
    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
    write_frame(&mut *w, msg).context("cannot write to the guest")?;
    Ok(())
}

/// Copies our stdin to the guest once the init connects for it (with the
/// token; any other connection is refused and reported, so no other guest
/// process reads what the user types); our EOF becomes the command's EOF.
/// The init connects only if the command starts. Stopped when the
/// conversation ends, so that it cannot swallow the first key of the review
/// that follows.
struct StdinPump {
    stop: std::os::fd::OwnedFd,
    _listening: admission::Listening,
}

impl StdinPump {
    fn spawn(
        listener: std::os::unix::net::UnixListener,
        token: Token,
        tampering: admission::Tampering,
    ) -> anyhow::Result<StdinPump> {
        let (stop_rx, stop) = nix::unistd::pipe().context("cannot create a pipe")?;
        let listening = admission::admit_first(listener, admission::Channel::Stdin, token, tampering, move |conn| {
            let pumping = std::thread::Builder::new().name("stdin".into()).spawn(move || pump_stdin(conn, stop_rx));
            if let Err(e) = pumping {
                tracing::warn!("cannot start the stdin thread: {e}");
            }
        })?;
        Ok(StdinPump { stop, _listening: listening })
    }
}

/// Copies our stdin into `conn` until our EOF or `stop_rx` is readable.
fn pump_stdin(mut conn: UnixStream, stop_rx: std::os::fd::OwnedFd) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN), PollFd::new(stop_rx.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        if fds[1].any().unwrap_or(false) {
            return;
        }
        let n = match nix::unistd::read(&stdin, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if conn.write_all(&buf[..n]).is_err() {
            return;
        }
    }
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

struct StopOnDrop(StdinPump);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = nix::unistd::write(&self.0.stop, &[1]);
    }
}

/// What to tell the user when the VM ended without a report.
fn vm_ended_message(session: &session::Session) -> String {
    let log = session.kernel_log();
    let kernel_log = std::fs::read_to_string(&log).unwrap_or_default();
    let vmm_log = std::fs::read_to_string(session.vmm_log()).unwrap_or_default();
    if let Some(line) = kernel_log.lines().find(|l| l.contains("Kernel panic")) {
        let what = line.split_once("] ").map_or(line, |(_, rest)| rest);
        format!("the guest kernel panicked ({}); the kernel log is {}", what.trim(), log.display())
    } else if let Some(line) = vmm_log.lines().rev().find(|l| !l.trim().is_empty()) {
        // The VMM's own error line repeats our prefix.
        let line = line.trim().trim_start_matches("stockade: error: ");
        format!("the VM stopped before the command finished: {line}; the kernel log is {}", log.display())
    } else {
        format!("the VM stopped before the command finished; the kernel log is {}", log.display())
    }
}

#[cfg(test)]
mod dockerd_log_tests {
    use super::*;

    /// A guest may send dockerd output without end (or without --docker at
    /// all): the session's dockerd.log stops at its cap with a note.
    #[test]
    fn dockerd_log_stops_at_its_cap_whatever_the_guest_sends() {
        let tmp = tempfile::tempdir().unwrap();
        let session = session::Session::create(tmp.path()).unwrap();
        let mut log = DockerdLog::default();
        let line = b"level=info msg=\"a guest flooding its daemon log\"\n".repeat(1000);
        for _ in 0..300 {
            log.write(&session, &line);
        }
        drop(log);
        let text = std::fs::read(session.dockerd_log()).unwrap();
        let cap = crate::logcap::DOCKERD_LOG_CAP;
        assert!(text.len() as u64 <= cap + 4096, "{} bytes for a cap of {cap}", text.len());
        let tail = String::from_utf8_lossy(&text[text.len() - 200..]);
        assert!(tail.contains("of dockerd.log dropped after the cap"), "{tail}");
    }
}
