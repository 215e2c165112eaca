//! `stockade recover`: stages the changes an interrupted session left on
//! its scratch disk. A VM boots on the kept disk with the workspace share
//! as its lower layer, as in the run; its init mounts only the workspace
//! overlay and exports it through the run's channel, so the changes reach
//! the store through the same validation and staging as after any run.
//!
//! Nothing of the run's world comes back: no network, no command, no
//! shares but the workspace, and the VM's logs go beside the run's
//! (`recover-kernel.log`, `recover-vmm.log`) rather than over them.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::channels::live;
use super::vm;
use crate::changes;
use crate::paths::Dirs;
use crate::protocol::auth::Token;
use crate::protocol::vm_config::VmConfig;
use crate::protocol::{ExitReport, RootEntry, RunSpec};
use crate::session;
use crate::supervisor::guest_view::{root, scratch};
use crate::supervisor::stages::boot::{Booted, Command};
use crate::supervisor::stages::conversation::{self, Conversation};
use crate::supervisor::stages::prepare::{self, Channels};
use crate::supervisor::stages::signals;

/// How the recovery VM is given to run.
#[derive(Debug, Clone)]
pub struct RecoverConfig {
    pub memory_bytes: u64,
    /// Jail the VMM (Landlock, seccomp); false with --no-jail.
    pub jail: bool,
    pub kernel: Option<PathBuf>,
}

/// The changes that were staged, and where.
pub struct Recovered {
    pub id: String,
    pub workspace: PathBuf,
    pub store: changes::Store,
}

/// How long a recovery may take before its VM is stopped: it runs nothing
/// but the export, so one this slow is stuck, and the disk stays for
/// another try rather than the user waiting without end.
const RECOVERY_BOUND: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Boots of the recovery VM before a failure is the user's to retry.
const RECOVERY_ATTEMPTS: u32 = 2;

/// How long a recovery waits for the run's VMM to be gone.
const VMM_EXIT_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// The outcome a recovered session's record gains.
const RECOVERED: &str = "its changes were recovered from the scratch disk";

/// Stages the changes on the scratch disk of the interrupted session `info`.
/// The disk goes once they are staged; on any failure it stays.
pub fn recover(info: &session::SessionInfo, config: &RecoverConfig) -> anyhow::Result<Recovered> {
    let id = &info.id;
    if session::is_running(&info.dir) {
        bail!(
            "session {id} is still running; its changes are staged when it ends (or, if it is stopped, recover it then)"
        );
    }
    let disk = info.dir.join(session::SCRATCH_DISK);
    if disk.is_file() && changes::Store::is_staged_in(&info.dir) {
        // Left by a run whose init exported, then went silent, before runs
        // removed the disk then: the staged set is whole, the disk spent.
        std::fs::remove_file(&disk)
            .with_context(|| format!("cannot remove the spent scratch disk {}", disk.display()))?;
        bail!(
            "session {id} has nothing to recover: its changes were staged whole before its guest stopped \
             (`stockade diff {id}` shows them); its spent scratch disk was removed"
        );
    }
    if !session::is_interrupted(&info.dir) {
        bail!(
            "session {id} has no scratch disk to recover ({} is absent): its changes were staged when it ended \
             (`stockade diff {id}` shows them) or it made none",
            disk.display()
        );
    }
    let workspace = info.workspace().with_context(|| {
        format!(
            "session {id} has no readable run record ({}), so its workspace is unknown",
            info.dir.join("run.json").display()
        )
    })?;
    if !workspace.is_dir() {
        bail!(
            "the workspace of session {id}, {}, is gone; the changes are the guest's over it, so recover them where it \
             was (`sudo mount -o loop,ro {}` shows them under upper/)",
            workspace.display(),
            disk.display()
        );
    }
    signals::block()?;
    let session = session::Session::resume(&info.dir, id, info.started().unwrap_or_else(std::time::SystemTime::now))?;
    let dirs = Dirs::resolve()?;
    let kernel = prepare::check_kvm(&dirs, config.kernel.as_deref())?;
    if config.jail {
        if let Err(why) = crate::jail::check_available() {
            bail!("the VMM cannot be jailed on this host: {why}. Fix that, or recover with --no-jail");
        }
    }
    let store = changes::Store::open(&session.dir)?;
    clear_stale_sockets(&session.dir);
    // A checkpoint the killed supervisor kept is as big as the changes,
    // and the recovery stages them whole on the same disk.
    live::remove_checkpoints(&session.dir);
    wait_for_the_runs_vmm(&session.dir);
    let vsock_base = session.dir.join("v.sock");
    let user = root::User::current();
    let log = session.dir.join("recover-vmm.log");
    let mut attempt = 1;
    let (vm_config, ended) = loop {
        let (channels, sockets) = Channels::open(&vsock_base, &store, None)?;
        let (vm_config, root) = vm_config(&session, &workspace, &user, &kernel, config)?;
        let paths = vm::Paths { session: &session.dir, log: &log, vsock_base: &vsock_base };
        let vmm = vm::VmProcess::start(&vm_config, paths, None, |_, _| {})?;
        let spec = run_spec(&workspace, &user, root, channels.token.clone())?;
        let booted = Booted { vmm, command: Command { spec, formatting: scratch::Formatting::kept(&disk) }, channels };
        let (vmm, ended) = conversation::hold_until(Some(RECOVERY_BOUND), &session, booted)?;
        if ended.expired.get() {
            bail!(
                "the recovery VM of session {id} did not export the changes within {} minutes and was stopped; \
                 its scratch disk stays in {}; the kernel log is {}",
                RECOVERY_BOUND.as_secs() / 60,
                disk.display(),
                vm_config.kernel_log.display()
            );
        }
        if matches!(ended.result, Ok(Conversation::Ended { .. })) {
            vmm.stop();
        } else {
            drop(vmm);
        }
        drop(sockets);
        // A VM that died on its way up (the rig's nested SVM has shown a
        // triple fault at the first instruction) left the disk as it was:
        // one more boot costs seconds and spares the user a second command.
        let died_early = matches!(ended.result, Ok(Conversation::VmEnded | Conversation::Unanswered));
        if died_early && !store.is_staged() && attempt < RECOVERY_ATTEMPTS {
            eprintln!(
                "stockade: the recovery VM of session {id} stopped before the changes were staged{}; trying again",
                stopped_because(&log)
            );
            keep_first_logs(&session.dir, &log, &vm_config.kernel_log);
            attempt += 1;
            clear_stale_sockets(&session.dir);
            continue;
        }
        break (vm_config, ended);
    };
    let kernel_log = vm_config.kernel_log.display().to_string();
    // Staged whole (the manifest is written last) is recovered, whatever
    // the VM did after.
    let staged = store.is_staged();
    match ended.result {
        Ok(Conversation::Ended { report: ExitReport::Exited { code: 0 }, staged: Some(Ok(_)) }) => {}
        _ if staged => {}
        Ok(Conversation::Ended { staged: Some(Err(e)), .. }) => {
            return Err(e.context(format!("cannot stage the changes of session {id}; its scratch disk stays")));
        }
        Ok(Conversation::Ended { report: ExitReport::SetupFailed { message }, .. }) => bail!(
            "the recovery VM cannot mount the scratch disk of session {id}: {message}; the disk stays in {} (the \
             kernel log is {kernel_log})",
            disk.display()
        ),
        Ok(Conversation::Ended { report, .. }) => {
            bail!("the recovery VM of session {id} ended unexpectedly ({report:?}); the kernel log is {kernel_log}")
        }
        Ok(Conversation::Stopped) => bail!(
            "recovery of session {id} stopped as asked; nothing was staged, its scratch disk stays in {} and the \
             session is still interrupted (`stockade recover {id}` tries again)",
            disk.display()
        ),
        Ok(Conversation::Stalled { bound, received, .. }) => bail!(
            "the recovery VM of session {id} stalled the export of the changes (nothing of it came for {}s, {received} \
             bytes in) and was stopped; nothing was staged, its scratch disk stays in {} and the session is still \
             interrupted (`stockade recover {id}` tries again); the kernel log is {kernel_log}",
            bound.as_secs(),
            disk.display()
        ),
        Ok(Conversation::VmEnded | Conversation::Unanswered) => bail!(
            "the recovery VM of session {id} stopped before it exported the changes{}; nothing was staged, its \
             scratch disk stays in {} and the session is still interrupted (`stockade recover {id}` tries again); \
             the kernel log is {kernel_log}",
            stopped_because(&log),
            disk.display()
        ),
        Err(e) => return Err(e.context(format!("cannot recover session {id}; its scratch disk stays"))),
    }
    // Staged: the disk is spent.
    std::fs::remove_file(&disk)
        .with_context(|| format!("cannot remove the recovered scratch disk {}", disk.display()))?;
    if let Some(mut record) = info.record.clone() {
        record.outcome = Some(match record.outcome.take() {
            Some(before) => format!("{before}; {RECOVERED}"),
            None => format!("interrupted; {RECOVERED}"),
        });
        if let Err(e) = session.write_record(&record) {
            tracing::warn!("cannot update the run record of session {id}: {e:#}");
        }
    }
    Ok(Recovered { id: id.clone(), workspace, store })
}

/// Why the VMM whose log is `log` stopped, from its last line (its own
/// error), as " (<why>)", or nothing when it said nothing.
fn stopped_because(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    match text.lines().rev().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) => format!(" ({})", line.trim_start_matches("stockade: error: ")),
        None => String::new(),
    }
}

/// Waits (bounded) until no VMM of the session's run is still exiting. A
/// supervisor killed with SIGKILL takes its VMM with it (the VMM's
/// parent-death signal), but the kernel tears a VM down as the process
/// exits, seconds for a big guest under nested virtualization, and the
/// recovery VM should not boot beside that.
fn wait_for_the_runs_vmm(session: &Path) {
    let config = session.join("vmm.json");
    let deadline = std::time::Instant::now() + VMM_EXIT_BOUND;
    let mut told = false;
    loop {
        let left = vmms_of(&config);
        if left.is_empty() {
            return;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!("the run's VMM (pid {left:?}) is still exiting after {VMM_EXIT_BOUND:?}; recovering anyway");
            return;
        }
        if !told {
            tracing::info!("waiting for the run's VMM (pid {left:?}) to exit");
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The live (not yet reaped, not zombie) processes running `stockade vmm
/// --config CONFIG`.
fn vmms_of(config: &Path) -> Vec<u32> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let runs_it =
            args.windows(3).any(|w| w[0] == b"vmm" && w[1] == b"--config" && w[2] == config.as_os_str().as_bytes());
        if runs_it && !is_zombie(&entry.path()) {
            found.push(pid);
        }
    }
    found
}

/// Whether the process at /proc/PID has finished exiting (state Z or X).
fn is_zombie(proc_dir: &Path) -> bool {
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else { return true };
    // The state follows the parenthesised name, which may hold spaces.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, Some("Z" | "X") | None)
}

/// Keeps the logs of a failed first boot beside the retry's, as
/// `recover-vmm-1.log` and `recover-kernel-1.log`.
fn keep_first_logs(dir: &Path, vmm_log: &Path, kernel_log: &Path) {
    for (log, kept) in [(vmm_log, "recover-vmm-1.log"), (kernel_log, "recover-kernel-1.log")] {
        if let Err(e) = std::fs::rename(log, dir.join(kept)) {
            tracing::debug!("cannot keep {}: {e}", log.display());
        }
    }
}

/// The run's listener sockets, left behind by a supervisor that died.
fn clear_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let socket = entry.file_type().is_ok_and(|t| {
            use std::os::unix::fs::FileTypeExt;
            t.is_socket()
        });
        if socket && (name == "broker.sock" || name.starts_with("v.sock")) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The recovery VM: the workspace share and the kept disk, nothing else;
/// and the guest root, the workspace overlay alone.
fn vm_config(
    session: &session::Session,
    workspace: &Path,
    user: &root::User,
    kernel: &Path,
    config: &RecoverConfig,
) -> anyhow::Result<(VmConfig, Vec<RootEntry>)> {
    let layout = root::layout(workspace, user, root::System::Host)?;
    let workspace_only = |entry: &RootEntry| matches!(entry, RootEntry::Overlay { .. });
    let root: Vec<RootEntry> = layout.root.into_iter().filter(workspace_only).collect();
    let sources: Vec<&str> = root
        .iter()
        .filter_map(|e| match e {
            RootEntry::Overlay { source, .. } => Some(source.as_str()),
            _ => None,
        })
        .collect();
    let shares = layout.shares.into_iter().filter(|s| sources.contains(&s.guest_path.as_str())).collect();
    let vm = VmConfig {
        kernel: kernel.to_path_buf(),
        init: std::env::current_exe().context("cannot find the stockade binary")?,
        vcpus: 1,
        memory_bytes: config.memory_bytes,
        kernel_log: session.dir.join("recover-kernel.log"),
        vsock_broker: session.dir.join("broker.sock"),
        shares,
        secrets: layout.secrets,
        network: false,
        disk: Some(session.scratch_disk()),
        image: None,
        jail: config.jail,
        verbose_kernel: false,
        kernel_args: Vec::new(),
        template: None,
    };
    Ok((vm, root))
}

/// The recovery "command": mount, export, nothing to run.
fn run_spec(workspace: &Path, user: &root::User, root: Vec<RootEntry>, token: Token) -> anyhow::Result<RunSpec> {
    Ok(RunSpec {
        argv: Vec::new(),
        env: Vec::new(),
        cwd: workspace.to_str().context("the workspace path is not valid UTF-8")?.to_string(),
        uid: user.uid,
        gid: user.gid,
        root,
        tty: None,
        network: false,
        pids: None,
        docker: false,
        ssh_agent: false,
        token,
        clock: None,
        seed: Vec::new(),
        recover: true,
    })
}

#[cfg(test)]
mod tests {
    use super::{stopped_because, vmms_of};
    use std::path::Path;

    /// The run's VMM is found by its session's config while it lives, and
    /// no longer once it has exited, reaped or not.
    #[test]
    fn the_runs_vmm_is_found_until_it_has_exited() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("vmm.json");
        // `read`, a builtin, waits without a child: a child between its fork
        // and exec would show the same command line.
        let mut vmm = std::process::Command::new("sh")
            .args(["-c", "read line", "vmm", "--config"])
            .arg(&config)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while vmms_of(&config).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(vmms_of(&config), [vmm.id()]);
        assert!(vmms_of(Path::new("/elsewhere/vmm.json")).is_empty(), "another session's is not this one's");
        vmm.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !vmms_of(&config).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(vmms_of(&config).is_empty(), "exited, not yet reaped: a zombie holds no VM");
        vmm.wait().unwrap();
        assert!(vmms_of(&config).is_empty());
    }

    /// The recovery's error says why its VM stopped, in the VMM's words.
    #[test]
    fn a_stopped_recovery_vm_is_explained_by_the_vmms_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("recover-vmm.log");
        assert_eq!(stopped_because(&log), "", "no log, no reason");
        std::fs::write(
            &log,
            "INFO booting\nstockade: error: the VM stopped: the guest kernel crashed (a triple fault)\n\n",
        )
        .unwrap();
        assert_eq!(stopped_because(&log), " (the VM stopped: the guest kernel crashed (a triple fault))");
    }
}
