//! Stage 3, converse: waits for the guest init to call in, sends it the
//! command, forwards signals, resizes and stdin, streams the command's
//! output, and collects its end and its change set. The terminal is raw
//! for exactly this stage.

use std::io::{ErrorKind, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::boot::{Booted, Command};
use super::deadline;
use super::prepare::Channels;
use super::{signals, terminal};
use crate::changes;
use crate::protocol::auth::Token;
use crate::protocol::template::{HostClock, SEED_LEN};
use crate::protocol::{
    CheckpointOutcome, ExitReport, ExportOutcome, FrameError, GuestMsg, HostMsg, read_frame, write_frame,
};
use crate::session;
use crate::supervisor::RunConfig;
use crate::supervisor::channels::{admission, live, staging};
use crate::supervisor::vm;

/// How long the guest may take to boot and call in. Seconds on real KVM;
/// the software-CPU test rig needs the margin.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// How long the init may say nothing, heartbeat included, before its guest
/// counts as halted or hung (powered off, a stopped kernel). The heartbeat
/// comes every two seconds from a thread of its own; the margin is for the
/// test rig's software CPU, where a busy guest can be that slow.
pub const GUEST_SILENCE: Duration = Duration::from_secs(60);

/// How the relay watches the guest's export: once it is under way (or
/// from the start when `due`: a recovery runs nothing else), a stream
/// that brings nothing for `stall` ends the run (see [`Conversation::Stalled`]).
#[derive(Debug, Clone, Copy)]
struct ExportWatch {
    stall: Duration,
    due: bool,
}

pub enum Conversation {
    /// The command ended; with an overlay, the guest also sent its changes.
    Ended { report: ExitReport, staged: Option<anyhow::Result<changes::StageReport>> },
    /// The user stopped the VM with a second interrupt.
    Stopped,
    /// The VM went away without reporting an end (kernel panic, VMM failure).
    VmEnded,
    /// The init said nothing for [`GUEST_SILENCE`]: the guest halted or
    /// hung, and its VM was killed.
    Unanswered,
    /// The init went on answering, but its export, under way or due,
    /// brought nothing for `bound` (`received` bytes in), or, once it was
    /// `exported`, the command's end never followed: the guest stalled,
    /// and its VM was killed.
    Stalled { bound: Duration, received: u64, exported: bool },
}

/// How the conversation went, for `finish` to turn into an exit status.
pub struct Ended {
    pub result: anyhow::Result<Conversation>,
    /// Whether `--timeout` stopped the command.
    pub expired: deadline::Expired,
}

impl Ended {
    /// Staging the guest's changes failed: the scratch disk holds them.
    pub fn unstaged(&self) -> bool {
        matches!(&self.result, Ok(Conversation::Ended { staged: Some(Err(_)), .. }))
    }

    /// The guest never reported an end, so it exported nothing: whatever it
    /// changed is only on the scratch disk.
    pub fn interrupted(&self) -> bool {
        !matches!(&self.result, Ok(Conversation::Ended { .. }))
    }
}

/// What ends the conversation early: the user's interrupts, `--timeout`.
struct Watch {
    interrupts: Arc<signals::Interrupts>,
    timeout: Option<Duration>,
    expired: deadline::Expired,
}

/// Holds the conversation, on a raw terminal when the command gets one,
/// and gives the terminal back before anything else is said.
pub fn hold(config: &RunConfig, session: &session::Session, booted: Booted) -> anyhow::Result<(vm::VmProcess, Ended)> {
    hold_until(config.timeout, session, booted)
}

/// As [`hold`], with `--timeout` alone of the run's settings.
pub fn hold_until(
    timeout: Option<Duration>,
    session: &session::Session,
    booted: Booted,
) -> anyhow::Result<(vm::VmProcess, Ended)> {
    let Booted { mut vmm, command, channels } = booted;
    let raw = if command.spec.tty.is_some() { terminal::RawMode::enter()? } else { None };
    let watch = Watch { interrupts: Arc::default(), timeout, expired: deadline::Expired::default() };
    let result = converse(&mut vmm, session, channels, command, &watch);
    drop(raw);
    terminal::sane_display();
    watch.interrupts.vm_gone();
    Ok((vmm, Ended { result, expired: watch.expired }))
}

fn converse(
    vmm: &mut vm::VmProcess,
    session: &session::Session,
    channels: Channels,
    command: Command,
    watch: &Watch,
) -> anyhow::Result<Conversation> {
    // The control listener closes with the conversation: a guest process
    // that dials it afterwards is refused rather than left queued.
    let Channels { control, stdin, receiver, token, tampering, publish } = channels;
    let Some(mut talk) = call_in(&control, vmm, session, &tampering)? else {
        return Ok(Conversation::VmEnded);
    };
    command.formatting.wait()?;
    crate::supervisor::reached("scratch disk ready");
    let mut spec = command.spec;
    let recovering = spec.recover;
    spec.clock = Some(HostClock::now());
    spec.seed = host_seed()?;
    send(&talk.writer, &HostMsg::Run(spec))?;
    crate::supervisor::reached("command sent");
    // Clients of published ports are asked for only once the init has the
    // command (and so the token it dials back with).
    let _published = match publish {
        Some((bound, callbacks)) => {
            Some(bound.serve(talk.writer.clone(), callbacks, token.clone(), tampering.clone())?)
        }
        None => None,
    };
    let vmm_pid = nix::unistd::Pid::from_raw(i32::try_from(vmm.pid())?);
    if recovering {
        watch.interrupts.first_stops();
    }
    forward_signals(&talk.writer, vmm_pid, watch.interrupts.clone())?;
    let _deadline = watch_deadline(&talk.writer, vmm_pid, watch)?;
    // Bounded: answers nobody asked for are dropped, not piled up.
    let (answers, answered) = mpsc::sync_channel(4);
    let guest = live::Guest {
        writer: talk.writer.clone(),
        token: token.clone(),
        tampering: tampering.clone(),
        answers: answered,
        stall: staging::EXPORT_STALL,
    };
    // Review while it runs is a convenience: without it the run goes on.
    let _live = live::serve(&session.dir, guest).inspect_err(|e| tracing::warn!("no review while it runs: {e:#}")).ok();
    let _stop_pump = StopOnDrop(StdinPump::spawn(stdin, token, tampering.clone())?);
    let export = ExportWatch { stall: staging::EXPORT_STALL, due: recovering };
    let ended = Relay::new(session, receiver, tampering, answers, export).run(
        &mut talk.reader,
        &talk.writer,
        &watch.interrupts,
    );
    if matches!(ended, Ok(Conversation::Unanswered | Conversation::Stalled { .. })) {
        vmm.kill();
    }
    ended
}

/// The init's control connection.
struct Talk {
    reader: std::io::BufReader<UnixStream>,
    /// Shared with the threads that forward signals and resizes.
    writer: Arc<Mutex<UnixStream>>,
    _further_control: admission::Listening,
}

/// Waits for the init to call in and say it is ready; `None` if the VM
/// went away first.
fn call_in(
    listener: &UnixListener,
    vmm: &mut vm::VmProcess,
    session: &session::Session,
    tampering: &admission::Tampering,
) -> anyhow::Result<Option<Talk>> {
    let started = Instant::now();
    let resumed = vmm.resumes_template();
    let timeout = if resumed { vm::RESUMED_CALL_IN } else { BOOT_TIMEOUT };
    let Some(control) = vm::accept(listener, vmm, timeout)? else {
        if resumed {
            let what = if vmm.is_running() {
                format!("did not call in within {}s", timeout.as_secs())
            } else {
                "stopped before it called in".to_string()
            };
            tracing::warn!(
                "the guest resumed from a template {what}; booting instead (the template was removed, so the next run \
                 records it again; the kernel log is {})",
                session.kernel_log().display()
            );
            vmm.boot_instead()?;
            // Whatever the stopped VM left queued is not the init's.
            while listener.accept().is_ok() {}
            return call_in(listener, vmm, session, tampering);
        }
        if vmm.is_running() {
            vmm.kill();
            bail!(
                "the guest did not call in within {}s; the kernel log is {}",
                BOOT_TIMEOUT.as_secs(),
                session.kernel_log().display()
            );
        }
        return Ok(None);
    };
    vmm.called_in();
    // The first control connection is PID 1's: no other guest process
    // existed to open one.
    let further = admission::refuse_further_control(listener, tampering.clone())?;
    let mut reader = std::io::BufReader::new(control.try_clone()?);
    match read_frame::<GuestMsg>(&mut reader) {
        Ok(GuestMsg::Ready { kernel }) => {
            tracing::info!("guest {kernel} ready after {:.0?}", started.elapsed());
            crate::supervisor::reached("guest ready");
        }
        Ok(other) => bail!("the guest said {other:?} before it was ready"),
        Err(_) => return Ok(None),
    }
    control.set_read_timeout(Some(GUEST_SILENCE)).context("cannot time the guest's control connection")?;
    // A guest that stops reading (guest root can stop the init's reader)
    // must not block the host's writers for good: the relay's `Finish`, a
    // checkpoint request, a dial-back.
    control.set_write_timeout(Some(GUEST_SILENCE)).context("cannot time the guest's control connection")?;
    Ok(Some(Talk { reader, writer: Arc::new(Mutex::new(control)), _further_control: further }))
}

/// Forwards our signals and terminal resizes to the command; a second
/// interrupt kills the VMM.
fn forward_signals(
    writer: &Arc<Mutex<UnixStream>>,
    vmm: nix::unistd::Pid,
    interrupts: Arc<signals::Interrupts>,
) -> anyhow::Result<()> {
    let (forward_writer, resize_writer) = (writer.clone(), writer.clone());
    signals::spawn(
        interrupts,
        move |sig| {
            let _ = send(&forward_writer, &HostMsg::Signal { signal: sig as i32 });
        },
        move || {
            if let Some(size) = terminal::size() {
                let _ = send(&resize_writer, &HostMsg::Resize(size));
            }
        },
        move || kill(vmm),
    )
}

/// Stops the command at `--timeout` (the watch ends when dropped).
fn watch_deadline(
    writer: &Arc<Mutex<UnixStream>>,
    vmm: nix::unistd::Pid,
    watch: &Watch,
) -> anyhow::Result<Option<deadline::Watch>> {
    let Some(limit) = watch.timeout else { return Ok(None) };
    let signal_writer = writer.clone();
    // Sent from a thread of its own: a guest that stopped reading its
    // control connection must not hold off the VM's stop that follows.
    let signal = move |signal| {
        let writer = signal_writer.clone();
        let sending = std::thread::Builder::new()
            .name("timeout-signal".into())
            .spawn(move || drop(send(&writer, &HostMsg::Signal { signal })));
        if let Err(e) = sending {
            tracing::warn!("cannot send the command signal {signal}: {e}");
        }
    };
    Ok(Some(deadline::watch(limit, watch.expired.clone(), signal, move || kill(vmm))?))
}

fn kill(vmm: nix::unistd::Pid) {
    let _ = nix::sys::signal::kill(vmm, nix::sys::signal::Signal::SIGKILL);
}

/// Relays what the guest says until the command ends or the VM goes away.
struct Relay<'a> {
    session: &'a session::Session,
    receiver: Option<staging::Receiver>,
    staged: Option<anyhow::Result<changes::StageReport>>,
    tampering: admission::Tampering,
    /// False once our reader went away.
    stdout_open: bool,
    dockerd_log: DockerdLog,
    /// Where the init's checkpoint answers go (`live`).
    checkpoints: mpsc::SyncSender<CheckpointOutcome>,
    watch: ExportWatch,
    /// The export's progress, once it is under way or due.
    export: Option<staging::Stall>,
}

impl<'a> Relay<'a> {
    fn new(
        session: &'a session::Session,
        receiver: staging::Receiver,
        tampering: admission::Tampering,
        checkpoints: mpsc::SyncSender<CheckpointOutcome>,
        watch: ExportWatch,
    ) -> Self {
        Relay {
            session,
            receiver: Some(receiver),
            staged: None,
            tampering,
            stdout_open: true,
            dockerd_log: DockerdLog::default(),
            checkpoints,
            watch,
            export: watch.due.then(|| staging::Stall::watch(watch.stall)),
        }
    }

    fn run(
        mut self,
        reader: &mut std::io::BufReader<UnixStream>,
        writer: &Mutex<UnixStream>,
        interrupts: &signals::Interrupts,
    ) -> anyhow::Result<Conversation> {
        loop {
            let msg = match read_frame::<GuestMsg>(reader) {
                Ok(msg) => msg,
                Err(_) if interrupts.stopped() => return Ok(Conversation::Stopped),
                Err(FrameError::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(Conversation::Unanswered);
                }
                Err(_) => return Ok(Conversation::VmEnded),
            };
            if let Some(end) = self.handle(msg, writer)? {
                return Ok(end);
            }
            // Looked at with every message: the heartbeat brings one every
            // two seconds, and a guest that sends none is `Unanswered`.
            if let Some(stalled) = self.stalled() {
                return Ok(stalled);
            }
        }
    }

    /// Whether the export, under way or due, stalled (then it is stopped);
    /// once the init reported it, the command's end is due.
    fn stalled(&mut self) -> Option<Conversation> {
        if self.export.is_none() && self.receiver.as_ref().is_some_and(staging::Receiver::connected) {
            self.export = Some(staging::Stall::watch(self.watch.stall));
        }
        let stall = self.export.as_mut()?;
        let received = self.receiver.as_ref().map_or(stall.received(), staging::Receiver::received);
        let working = self.receiver.as_ref().is_some_and(staging::Receiver::working);
        if !stall.stalled(received, working) {
            return None;
        }
        let exported = self.receiver.is_none();
        if let Some(receiver) = self.receiver.take() {
            let _ = receiver.abandon();
        }
        Some(Conversation::Stalled { bound: stall.bound(), received: stall.received(), exported })
    }

    fn handle(&mut self, msg: GuestMsg, writer: &Mutex<UnixStream>) -> anyhow::Result<Option<Conversation>> {
        match msg {
            GuestMsg::Stdout(data) => self.stdout(&data, writer)?,
            GuestMsg::Stderr(data) => {
                let _ = std::io::stderr().write_all(&data);
            }
            GuestMsg::Changes(outcome) => self.changes(outcome),
            GuestMsg::Exit(report) => {
                crate::supervisor::reached("command ended");
                let _ = send(writer, &HostMsg::Finish);
                if let Some(receiver) = self.receiver.take() {
                    let _ = receiver.abandon();
                }
                return Ok(Some(Conversation::Ended { report, staged: self.staged.take() }));
            }
            GuestMsg::DockerdLog(data) => self.dockerd_log.write(self.session, &data),
            GuestMsg::Ready { .. } => tracing::warn!("the guest said ready twice"),
            GuestMsg::Heartbeat => {}
            GuestMsg::Checkpoint(answer) => {
                let _ = self.checkpoints.try_send(answer);
            }
        }
        Ok(None)
    }

    fn stdout(&mut self, data: &[u8], writer: &Mutex<UnixStream>) -> anyhow::Result<()> {
        if !self.stdout_open {
            return Ok(());
        }
        // Locked for this chunk only: anything else in the process that
        // prints meanwhile (a meter, a warning) must not block for the run.
        let mut stdout = std::io::stdout().lock();
        match stdout.write_all(data).and_then(|()| stdout.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                // Our reader went away: the command gets SIGPIPE, as it
                // would writing to a closed pipe locally.
                self.stdout_open = false;
                let _ = send(writer, &HostMsg::Signal { signal: libc::SIGPIPE });
                Ok(())
            }
            Err(e) => Err(e).context("cannot write the command's output"),
        }
    }

    fn changes(&mut self, outcome: ExportOutcome) {
        let Some(receiver) = self.receiver.take() else {
            self.tampering.report("the guest init reported its changes twice; the second report was ignored");
            return;
        };
        self.staged = Some(match outcome {
            ExportOutcome::Sent { stream, .. } => {
                receiver.finish(stream, self.watch.stall).inspect(|_| self.settle_landed())
            }
            ExportOutcome::Failed { message } => match receiver.abandon() {
                Some(cause) => Err(cause.context(format!("the guest's export stopped ({message})"))),
                None => Err(anyhow::anyhow!("the guest could not export its changes: {message}")),
            },
        });
        // The init reports the command's end right after its export.
        self.export = Some(staging::Stall::watch(self.watch.stall));
    }
}

impl Relay<'_> {
    /// Marks applied what applies during the run landed already.
    fn settle_landed(&self) {
        let settled = changes::Store::open(&self.session.dir)
            .and_then(|store| changes::landed::Landed::load(&store)?.settle(&store));
        if let Err(e) = settled {
            tracing::warn!("cannot mark the changes applied during the run: {e}");
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

/// Fresh host entropy for the guest's random pool (see `RunSpec::seed`).
fn host_seed() -> anyhow::Result<Vec<u8>> {
    let mut seed = vec![0u8; SEED_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .context("cannot read host entropy for the guest from /dev/urandom")?;
    Ok(seed)
}

#[cfg(test)]
#[path = "conversation_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "../channels/stall_attack_tests.rs"]
mod stall_attack_tests;

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
