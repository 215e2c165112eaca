//! Stage 4, finish: lets the VMM power off while the proxy stops and the
//! changes are reviewed, tells the user how the run ended, and decides
//! stockade's exit status and the run record's words ([`Outcome`], the one
//! place that maps an end to a status).

use std::thread::JoinHandle;
use std::time::Duration;

use super::conversation::{Conversation, Ended};
use super::prepare::{Held, Host, Recorded};
use super::{deadline, outcome};
use crate::changes;
use crate::protocol::ExitReport;
use crate::protocol::exit::EXIT_STOCKADE;
use crate::review::{self, ApplyMode};
use crate::session;
use crate::supervisor::guest_view::{agent_state, home_tools};
use crate::supervisor::vm;
use crate::supervisor::{Finished, RunConfig};
use crate::util::text::display_bytes;

/// After the command ends, how long the VMM gets to power off by itself.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What `finish` takes down, and the session it records to.
pub struct Finish<'a> {
    pub config: &'a RunConfig,
    pub host: &'a Host,
    pub recorded: Recorded,
    pub held: Held,
}

/// What the messages after the run need to know.
struct Epilogue<'a> {
    config: &'a RunConfig,
    host: &'a Host,
    recorded: &'a Recorded,
    /// `--apply`, unless tampering overrode it.
    apply: ApplyMode,
}

impl Finish<'_> {
    pub fn conclude(self, vmm: vm::VmProcess, ended: Ended) -> Finished {
        let Finish { config, host, mut recorded, held } = self;
        // The guest has said all it will. After a reported end its VMM is
        // stopped at once; otherwise it may still be powering off, and gets
        // the grace while the network stops and the changes are reviewed.
        // If the thread cannot start, dropping the VMM kills it.
        let reaper = if matches!(ended.result, Ok(Conversation::Ended { .. })) {
            vmm.stop();
            crate::supervisor::reached("VMM stopped");
            None
        } else {
            Some(reap(vmm))
        };
        let Held { network, sockets, scratch, agents, tampering, published } = held;
        drop(network);
        // The guest's changes were exported; the disk that held them is
        // spent, unless staging them failed (a full disk) or the guest never
        // exported (it crashed, rebooted, halted or hung, or the user
        // stopped it) after mounting the disk: then it is all that holds them.
        // A guest that exported its changes and then went silent is not
        // interrupted: its change set is staged whole, and the disk spent.
        let kept = ended.unstaged()
            || (ended.interrupted()
                && crate::supervisor::guest_view::scratch::was_mounted(scratch.path())
                && !recorded.store.is_staged());
        if kept {
            scratch.keep();
        } else {
            drop(scratch);
        }
        drop(sockets);
        let mut epilogue = Epilogue { config, host, recorded: &recorded, apply: config.apply };
        for state in &agents {
            if let Err(e) = offer_agent_settings(state, &epilogue) {
                eprintln!(
                    "stockade: warning: agent {}: {e:#}; its state stays in {}",
                    state.name,
                    state.home.display()
                );
            }
        }
        crate::supervisor::reached("network stopped");
        for warning in published.warnings() {
            eprintln!("stockade: warning: {warning}");
        }
        let tampered = tampering.lines();
        epilogue.apply = apply_mode(&epilogue, &tampered);
        epilogue.announce(&ended);
        if kept && ended.interrupted() {
            let id = &recorded.session.id;
            eprintln!(
                "stockade: the guest's changes are kept on the session's scratch disk; `stockade recover {id}` \
                 stages them for review"
            );
        }
        let outcome = Outcome::of(&ended, config.timeout);
        if let Some(Ok(reaper)) = reaper {
            let _ = reaper.join();
        }
        outcome.record(&mut recorded, &tampered);
        crate::supervisor::reached("run recorded");
        Finished {
            status: outcome.status,
            session_id: recorded.session.id.clone(),
            session_dir: recorded.session.dir.clone(),
            failure: outcome.failure,
            tampering: tampered,
        }
    }
}

fn reap(mut vmm: vm::VmProcess) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("vmm-reaper".into()).spawn(move || {
        vmm.finish(SHUTDOWN_GRACE);
        crate::supervisor::reached("VMM exited");
    })
}

/// Warns of the guest's tampering, and applies nothing on its own when
/// there was any.
fn apply_mode(epilogue: &Epilogue<'_>, tampered: &[String]) -> ApplyMode {
    for what in tampered {
        eprintln!("stockade: warning: the guest tampered with the init's channels: {what}");
    }
    match epilogue.config.apply {
        ApplyMode::All if !tampered.is_empty() => {
            eprintln!(
                "stockade: warning: not applying anything despite --apply all, since the guest tampered with \
                 the init's channels; review the staged changes with `stockade diff {}`",
                epilogue.recorded.session.id
            );
            ApplyMode::None
        }
        mode => mode,
    }
}

/// How the run ended as stockade reports it: its exit status, the run
/// record's words, and what failed when stockade or the VM did.
struct Outcome {
    status: u8,
    text: String,
    failure: Option<String>,
}

impl Outcome {
    fn of(ended: &Ended, timeout: Option<Duration>) -> Outcome {
        let (status, text) = match &ended.result {
            Ok(Conversation::Ended { report, .. }) => (outcome::exit_status(report).0, outcome::describe(report)),
            Ok(Conversation::Stopped) => (130, "stopped by the user".to_string()),
            Ok(Conversation::VmEnded) => (EXIT_STOCKADE, "the VM stopped before the command finished".to_string()),
            Ok(Conversation::Unanswered) => (EXIT_STOCKADE, unanswered_message()),
            Ok(Conversation::Stalled { bound, received, exported }) => {
                (EXIT_STOCKADE, stalled_message(*bound, *received, *exported))
            }
            Err(e) => (EXIT_STOCKADE, format!("stockade failed: {e:#}")),
        };
        if ended.expired.get() {
            let limit = timeout.map(deadline::describe).unwrap_or_default();
            eprintln!("stockade: stopped after --timeout {limit}; exit status 124");
            return Outcome { status: deadline::EXIT_TIMEOUT, text, failure: None };
        }
        let failure = match &ended.result {
            Ok(Conversation::Ended { report: ExitReport::SetupFailed { .. }, .. })
            | Ok(Conversation::VmEnded)
            | Ok(Conversation::Unanswered)
            | Ok(Conversation::Stalled { .. })
            | Err(_) => Some(text.clone()),
            _ => None,
        };
        Outcome { status, text, failure }
    }

    fn record(&self, recorded: &mut Recorded, tampered: &[String]) {
        let Recorded { session, record, .. } = recorded;
        let elapsed = session.started.elapsed().unwrap_or_default();
        record.duration_ms = Some(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        record.status = Some(i32::from(self.status));
        record.outcome = Some(if tampered.is_empty() {
            self.text.clone()
        } else {
            format!("{}; the guest tampered with the init's channels", self.text)
        });
        if let Err(e) = session.write_record(record) {
            tracing::warn!("cannot update the run record: {e:#}");
        }
    }
}

impl Epilogue<'_> {
    /// Says how the run ended, and reviews the changes of a command that did.
    fn announce(&self, ended: &Ended) {
        match &ended.result {
            Ok(Conversation::Ended { report, staged }) => {
                self.explain(report);
                self.review(staged.as_ref());
            }
            Ok(Conversation::Stopped) => {}
            Ok(Conversation::VmEnded) => {
                eprintln!("stockade: error: {}", vm_ended_message(&self.recorded.session));
            }
            Ok(Conversation::Unanswered) => {
                let log = self.recorded.session.kernel_log();
                eprintln!("stockade: error: {}; the kernel log is {}", unanswered_message(), log.display());
            }
            Ok(Conversation::Stalled { bound, received, exported }) => {
                let log = self.recorded.session.kernel_log();
                let message = stalled_message(*bound, *received, *exported);
                eprintln!("stockade: error: {message}; the kernel log is {}", log.display());
                if self.recorded.store.is_staged() {
                    let id = &self.recorded.session.id;
                    eprintln!("stockade: its changes were staged before it stalled: `stockade diff {id}` shows them");
                }
            }
            Err(e) => eprintln!("stockade: error: {e:#}"),
        }
    }

    /// Why the command did not run or failed, with a hint where we have one.
    fn explain(&self, report: &ExitReport) {
        let Some(message) = outcome::exit_status(report).1 else { return };
        eprintln!("stockade: {message}");
        let session = &self.recorded.session;
        if matches!(report, ExitReport::NotStarted { not_found: true, .. }) {
            let host_path = std::env::var("PATH").unwrap_or_default();
            let (config, home) = (self.config, &self.host.user.home);
            if let Some(hint) = home_tools::not_found_hint(&config.argv[0], &host_path, home, config.home_tools) {
                eprintln!("stockade: {hint}");
            }
        }
        if matches!(report, ExitReport::SetupFailed { .. }) && session.dockerd_log().exists() {
            eprintln!("stockade: dockerd's log is {}", session.dockerd_log().display());
        }
    }

    fn review(&self, staged: Option<&anyhow::Result<changes::StageReport>>) {
        let (config, id) = (self.config, &self.recorded.session.id);
        match staged {
            Some(Ok(_)) => {
                let (store, workspace) = (&self.recorded.store, &self.host.workspace);
                if let Err(e) = review::after_run(store, workspace, id, self.apply, config.color, &config.code) {
                    eprintln!("stockade: error: {e:#}; the changes stay staged: see `stockade diff {id}`");
                }
            }
            Some(Err(e)) => {
                eprintln!("stockade: warning: {e:#}; the workspace was not changed");
                eprintln!(
                    "stockade: the guest's changes are kept, unstaged, in the scratch disk {}; `stockade recover \
                     {id}` stages them once the cause is fixed (or `sudo mount -o loop,ro` the ext4 image to copy \
                     files out); `stockade sessions --prune --include-staged` removes it",
                    self.recorded.session.scratch_disk().display()
                );
            }
            None => {}
        }
    }
}

/// Stages the seed files an agent changed in its state (settings that can
/// run code on the host) as a session of their own for the home directory,
/// and reviews it like the workspace's changes; never applied without the
/// user saying so, whatever `--apply` says.
fn offer_agent_settings(state: &agent_state::Prepared, epilogue: &Epilogue<'_>) -> anyhow::Result<()> {
    let home = &epilogue.host.user.home;
    let changed = state.changed_seeds(home);
    if changed.is_empty() {
        return Ok(());
    }
    let session = session::Session::create(&epilogue.host.dirs.data)?;
    session.write_record(&session::RunRecord {
        id: session.id.clone(),
        command: vec![format!("settings of agent {} changed in session {}", state.name, epilogue.recorded.session.id)],
        workspace: home.display().to_string(),
        started: session::timestamp(session.started),
        duration_ms: Some(0),
        status: Some(0),
        outcome: Some(session::AGENT_SETTINGS_OUTCOME.into()),
        agent_settings: Some(state.name.clone()),
        git_head: None,
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
    let mode = match epilogue.config.apply {
        ApplyMode::Ask => ApplyMode::Ask,
        _ => ApplyMode::None,
    };
    let config = epilogue.config;
    let code = review::CodeChoice { agent_settings: true, ..config.code.clone() };
    review::after_run(&store, home, &session.id, mode, config.color, &code)?;
    Ok(())
}

/// What a guest that stopped answering is told as.
fn unanswered_message() -> String {
    format!(
        "the guest stopped answering (nothing from its init for {}s: it halted, powered off or hung), so its VM \
         was stopped",
        super::conversation::GUEST_SILENCE.as_secs()
    )
}

/// What a guest that stalled its export (see `Conversation::Stalled`) is
/// told as.
fn stalled_message(bound: Duration, received: u64, exported: bool) -> String {
    let waited = deadline::describe(bound);
    if exported {
        format!(
            "the guest exported its changes but did not report its command's end within {waited} while its init \
             still answered, so its VM was stopped"
        )
    } else {
        format!(
            "the guest stalled the export of its changes (nothing of it came for {waited}, {received} bytes in, while \
             its init still answered), so its VM was stopped"
        )
    }
}

/// What to tell the user when the VM ended without a report. Both logs
/// hold what the guest chose (its console; names and messages the VMM
/// quotes), so a line is escaped (`display_bytes`) before it reaches the
/// terminal, and bytes that are not UTF-8 do not hide the line.
fn vm_ended_message(session: &session::Session) -> String {
    let log = session.kernel_log();
    let read = |path: &std::path::Path| String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
    let (kernel_log, vmm_log) = (read(&log), read(&session.vmm_log()));
    if let Some(line) = kernel_log.lines().find(|l| l.contains("Kernel panic")) {
        let what = line.split_once("] ").map_or(line, |(_, rest)| rest);
        let what = display_bytes(what.trim().as_bytes());
        format!("the guest kernel panicked ({what}); the kernel log is {}", log.display())
    } else if let Some(line) = vmm_log.lines().rev().find(|l| !l.trim().is_empty()) {
        // The VMM's own error line repeats our prefix.
        let line = display_bytes(line.trim().trim_start_matches("stockade: error: ").as_bytes());
        format!("the VM stopped before the command finished: {line}; the kernel log is {}", log.display())
    } else {
        format!("the VM stopped before the command finished; the kernel log is {}", log.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(result: anyhow::Result<Conversation>) -> Ended {
        Ended { result, expired: deadline::Expired::default() }
    }

    #[test]
    fn the_command_status_passes_through_and_only_stockade_failures_are_failures() {
        let exited =
            Outcome::of(&ended(Ok(Conversation::Ended { report: ExitReport::Exited { code: 3 }, staged: None })), None);
        assert_eq!((exited.status, exited.failure), (3, None));
        let signaled = Outcome::of(
            &ended(Ok(Conversation::Ended { report: ExitReport::Signaled { signal: 9 }, staged: None })),
            None,
        );
        assert_eq!((signaled.status, signaled.failure), (137, None));
        let stopped = Outcome::of(&ended(Ok(Conversation::Stopped)), None);
        assert_eq!((stopped.status, stopped.failure), (130, None));
        let gone = Outcome::of(&ended(Ok(Conversation::VmEnded)), None);
        assert_eq!((gone.status, gone.failure.is_some()), (EXIT_STOCKADE, true));
        let stalled = Conversation::Stalled { bound: Duration::from_secs(300), received: 7, exported: false };
        let stalled = Outcome::of(&ended(Ok(stalled)), None);
        assert_eq!((stalled.status, stalled.failure.is_some()), (EXIT_STOCKADE, true));
        assert!(stalled.text.contains("nothing of it came for 300s"), "{}", stalled.text);
        let failed = Outcome::of(&ended(Err(anyhow::anyhow!("boom"))), None);
        assert_eq!((failed.status, failed.text.as_str()), (EXIT_STOCKADE, "stockade failed: boom"));
        assert!(failed.failure.is_some());
        let setup = ExitReport::SetupFailed { message: "no overlay".into() };
        let setup = Outcome::of(&ended(Ok(Conversation::Ended { report: setup, staged: None })), None);
        assert_eq!(setup.failure.as_deref(), Some(setup.text.as_str()));
    }

    /// A VM that ends without a report gets the kernel log's first
    /// "Kernel panic" line, or the VMM log's last line, quoted to the
    /// user's terminal. The guest writes the kernel log (its console,
    /// `/dev/ttyS0` for root): a line it printed, then a reset, must not
    /// drive the terminal (set its title, write the clipboard with OSC 52,
    /// clear the screen, hide text with bidi marks), as nothing else the
    /// guest chose is shown unescaped (`util::text::display_bytes`).
    #[test]
    fn a_vm_that_ended_is_explained_without_the_guests_control_characters() {
        let data = tempfile::tempdir().unwrap();
        let session = session::Session::create(data.path()).unwrap();
        let hostile =
            "Kernel panic - not syncing: \x1b]52;c;ZWNobyBvd25lZA==\x07\x1b]0;stockade: ok\x07\x1b[2J\u{202e}";
        std::fs::write(session.kernel_log(), format!("[    1.0] {hostile}\n")).unwrap();
        let message = vm_ended_message(&session);
        assert!(
            !message.chars().any(|c| c.is_control() || crate::util::text::is_invisible(c)),
            "the message quotes the guest's control characters: {message:?}"
        );
        std::fs::remove_file(session.kernel_log()).unwrap();
        std::fs::write(session.vmm_log(), format!("stockade: error: {hostile}\n")).unwrap();
        let message = vm_ended_message(&session);
        assert!(
            !message.chars().any(|c| c.is_control() || crate::util::text::is_invisible(c)),
            "the message quotes the VMM log's control characters: {message:?}"
        );
    }
}
