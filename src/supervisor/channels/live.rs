//! Review while the command runs. The supervisor listens on the session's
//! `live.sock` (in the 0700 session directory, itself 0600); `stockade
//! diff`, `apply` and `sessions` connect and ask for a checkpoint. The init
//! exports the overlay's changes made so far on `CHECKPOINT_PORT`, through
//! the same token check, digest gate, bounds and validation as the final
//! export, into `<session>/checkpoint.next`, which then replaces
//! `<session>/checkpoint` (the store `diff` and `apply` read), once an
//! interrupted apply of the one it replaces is completed. What earlier
//! applies landed is settled in it (see `changes::landed`).
//!
//! Nothing here writes to the terminal, which the command may own. A guest
//! that refuses or stalls a checkpoint costs the asker a bounded wait and an
//! error; the run goes on.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{admission, staging};
use crate::changes::Store;
use crate::changes::landed::{CHECKPOINT_DIR, Landed};
use crate::protocol::auth::Token;
use crate::protocol::{CHECKPOINT_PORT, CheckpointOutcome, ExportOutcome, HostMsg, write_frame};
use crate::supervisor::vm;

/// The socket in the session directory.
pub const SOCKET: &str = "live.sock";
/// Held shared by whoever reads the checkpoint store, exclusively while a
/// new checkpoint replaces it.
const LOCK: &str = "checkpoint.lock";
const NEXT: &str = "checkpoint.next";
/// The most a checkpoint may take however its stream progresses (a 1 GiB
/// file took 209 s on the test rig): a guest trickling bytes cannot hold
/// the checkpoints, or the asker, for longer.
pub const GUEST_WAIT: Duration = Duration::from_secs(30 * 60);
/// In the checkpoint directory once `stockade diff` showed it: `apply`
/// then lands it rather than a fresh checkpoint the user never saw. A new
/// checkpoint replaces the directory, and the mark with it.
const SHOWN: &str = "shown";
/// How long the asker waits in all: the guest's export, then the staging of
/// the rest of its stream.
pub const ASK_WAIT: Duration = Duration::from_secs(GUEST_WAIT.as_secs() + 120);
/// How often a checkpoint in progress is looked at for progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// A connected client must say what it wants within this.
const REQUEST_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
pub enum Request {
    Checkpoint,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// `<session>/checkpoint` holds the changes made so far.
    Staged {
        entries: u64,
    },
    Failed {
        message: String,
    },
}

/// Where a session's checkpoint store is.
pub fn checkpoint_store(session_dir: &Path) -> anyhow::Result<Store> {
    Store::open(&session_dir.join(CHECKPOINT_DIR))
        .with_context(|| format!("cannot open the checkpoint store in {}", session_dir.display()))
}

/// The checkpoint store, held against replacement while it is read.
pub struct Reading {
    pub store: Store,
    _lock: Flock<File>,
}

impl Reading {
    /// Marks this checkpoint as shown to the user (see [`shown`]).
    pub fn mark_shown(&self) -> anyhow::Result<()> {
        let dir = self.store.dir().parent().context("the checkpoint store has no directory")?;
        let path = dir.join(SHOWN);
        fs::write(&path, b"").with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The checkpoint of the session in `session_dir` that `stockade diff`
/// showed, held, while no newer one replaced it; `None` otherwise.
pub fn shown(session_dir: &Path) -> anyhow::Result<Option<Reading>> {
    let lock = lock(session_dir, FlockArg::LockShared)?;
    if !session_dir.join(CHECKPOINT_DIR).join(SHOWN).exists() {
        return Ok(None);
    }
    Ok(Some(Reading { store: checkpoint_store(session_dir)?, _lock: lock }))
}

/// Asks the supervisor running the session in `session_dir` for a
/// checkpoint and returns its store, held. `None`: the session is not
/// running (no one listens).
pub fn ask(session_dir: &Path) -> anyhow::Result<Option<Reading>> {
    let path = session_dir.join(SOCKET);
    let mut stream = match UnixStream::connect(&path) {
        Ok(stream) => stream,
        Err(_) => return Ok(None),
    };
    stream.set_read_timeout(Some(ASK_WAIT))?;
    let mut line = serde_json::to_vec(&Request::Checkpoint)?;
    line.push(b'\n');
    stream.write_all(&line).with_context(|| format!("cannot ask the running session at {}", path.display()))?;
    let mut answer = String::new();
    let read = BufReader::new(&stream).read_line(&mut answer);
    match read {
        Ok(0) => bail!("the running session closed {} without a checkpoint; it may just have ended", path.display()),
        Ok(_) => {}
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => bail!(
            "the running session did not make a checkpoint within {}s (the guest may be stalling the export); \
             the run goes on: try again, or review once the command ends",
            ASK_WAIT.as_secs()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read the answer on {}", path.display())),
    }
    match serde_json::from_str::<Answer>(&answer).context("the running session answered something unreadable")? {
        Answer::Staged { .. } => {}
        Answer::Failed { message } => bail!("no checkpoint of the running session: {message}"),
    }
    let lock = lock(session_dir, FlockArg::LockShared)?;
    Ok(Some(Reading { store: checkpoint_store(session_dir)?, _lock: lock }))
}

fn lock(session_dir: &Path, how: FlockArg) -> anyhow::Result<Flock<File>> {
    let path = session_dir.join(LOCK);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Flock::lock(file, how).map_err(|(_, errno)| match errno {
        nix::errno::Errno::EWOULDBLOCK => {
            anyhow!("another stockade diff or apply is reading the last checkpoint; try again when it ends")
        }
        other => anyhow!("cannot lock {}: {other}", path.display()),
    })
}

/// What a checkpoint needs of the running conversation.
pub struct Guest {
    pub writer: Arc<Mutex<UnixStream>>,
    pub token: Token,
    pub tampering: admission::Tampering,
    /// The init's `GuestMsg::Checkpoint` answers, relayed.
    pub answers: mpsc::Receiver<CheckpointOutcome>,
    /// How long a checkpoint's stream may bring nothing, as the run's
    /// export ([`staging::EXPORT_STALL`]; shorter in tests).
    pub stall: Duration,
}

/// Serves `live.sock` until dropped. The thread is not waited for: a
/// checkpoint in progress ends by itself once the conversation is over
/// (its answers channel closes), and must not delay the run's end.
pub struct Server {
    stop: Arc<AtomicBool>,
    session_dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = fs::remove_file(self.session_dir.join(SOCKET));
        remove_checkpoints(&self.session_dir);
    }
}

/// Removes the session's checkpoint stores, unless someone still reads
/// them: the final export, or a recovery, supersedes them. A supervisor
/// that was killed left them behind, as big as the change set, on the disk
/// the recovery stages to.
pub fn remove_checkpoints(session_dir: &Path) {
    if let Ok(_lock) = lock(session_dir, FlockArg::LockExclusiveNonblock) {
        // An apply of the checkpoint cut short is finished first: its
        // journal lives in the store about to go.
        if let Err(e) = complete_pending_apply(session_dir) {
            tracing::warn!("keeping the last checkpoint: {e:#}");
            return;
        }
        let _ = fs::remove_dir_all(session_dir.join(CHECKPOINT_DIR));
        let _ = fs::remove_dir_all(session_dir.join(NEXT));
    }
}

pub fn serve(session_dir: &Path, guest: Guest) -> anyhow::Result<Server> {
    let path = session_dir.join(SOCKET);
    let _ = fs::remove_file(&path);
    let listener = UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} private", path.display()))?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut checkpoints = Checkpoints { session_dir: session_dir.to_path_buf(), guest, next_id: 0 };
    let stopping = stop.clone();
    std::thread::Builder::new()
        .name("live".into())
        .spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => checkpoints.answer(stream),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => {
                        tracing::warn!("live.sock: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            // The run ended during a checkpoint, whose lock kept the
            // server's drop from removing what it leaves.
            if let Ok(_lock) = lock(&checkpoints.session_dir, FlockArg::LockExclusiveNonblock) {
                let _ = fs::remove_dir_all(checkpoints.session_dir.join(CHECKPOINT_DIR));
                let _ = fs::remove_dir_all(checkpoints.session_dir.join(NEXT));
            }
        })
        .context("cannot start the live review thread")?;
    Ok(Server { stop, session_dir: session_dir.to_path_buf() })
}

/// Completes an apply of the current checkpoint that was interrupted, and
/// records what it landed, before the store is replaced or removed: its
/// journal lives there, and only it can finish the apply (and remove its
/// temp files from the workspace). The checkpoint lock is held.
fn complete_pending_apply(session_dir: &Path) -> anyhow::Result<()> {
    if !session_dir.join(CHECKPOINT_DIR).is_dir() {
        return Ok(());
    }
    let store = checkpoint_store(session_dir)?;
    let Some((workspace, report)) = crate::changes::complete_interrupted(&store)
        .context("an interrupted apply of the last checkpoint cannot be completed")?
    else {
        return Ok(());
    };
    tracing::info!(applied = report.applied.len(), "completed an interrupted apply of the last checkpoint");
    Landed::record(&store, &workspace, &report.landings())
        .context("cannot record what the interrupted apply of the last checkpoint landed")?;
    Ok(())
}

struct Checkpoints {
    session_dir: PathBuf,
    guest: Guest,
    next_id: u64,
}

impl Checkpoints {
    fn answer(&mut self, stream: UnixStream) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(REQUEST_WAIT));
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            return;
        }
        let answer = match serde_json::from_str::<Request>(&line) {
            Ok(Request::Checkpoint) => match self.checkpoint() {
                Ok(entries) => Answer::Staged { entries },
                Err(e) => Answer::Failed { message: format!("{e:#}") },
            },
            Err(_) => Answer::Failed { message: "unknown request".into() },
        };
        let mut text = serde_json::to_vec(&answer).unwrap_or_default();
        text.push(b'\n');
        let _ = (&stream).write_all(&text);
    }

    /// Makes a checkpoint; returns its entries.
    fn checkpoint(&mut self) -> anyhow::Result<u64> {
        let _replacing = lock(&self.session_dir, FlockArg::LockExclusiveNonblock)?;
        complete_pending_apply(&self.session_dir)?;
        let next_dir = self.session_dir.join(NEXT);
        if next_dir.exists() {
            fs::remove_dir_all(&next_dir).with_context(|| format!("cannot remove {}", next_dir.display()))?;
        }
        let next = Store::open(&next_dir)?;
        let _unfinished = Unfinished(&next_dir);
        // What the guest saw so far judges conflicts, as at the end. The
        // VMM appends to the run's record; a copy ending in a cut record
        // reads up to it.
        let seen = Store::open(&self.session_dir)?.dir().join("seen");
        if seen.exists() {
            fs::copy(&seen, next.dir().join("seen")).context("cannot copy what the guest saw")?;
        }
        let base = self.session_dir.join("v.sock");
        // Left by a round that failed before its receiver took it over.
        let _ = fs::remove_file(crate::protocol::broker::socket_path(&base, CHECKPOINT_PORT));
        let (listener, socket) = vm::listen(&base, CHECKPOINT_PORT)?;
        let receiver = staging::receive_as(
            listener,
            socket,
            &next,
            self.guest.token.clone(),
            self.guest.tampering.clone(),
            staging::Shown::Quiet,
        )?;
        // Answers no one waits for any more (or that no one asked for).
        while self.guest.answers.try_recv().is_ok() {}
        self.next_id += 1;
        let id = self.next_id;
        {
            let mut w = self.guest.writer.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = write_frame(&mut *w, &HostMsg::Checkpoint { id }) {
                let _ = receiver.abandon();
                return Err(anyhow!("cannot ask the guest for a checkpoint: {e}"));
            }
        }
        let report = match self.wait_for(id, &receiver) {
            Ok(ExportOutcome::Sent { stream, .. }) => receiver.finish(stream, self.guest.stall)?,
            Ok(ExportOutcome::Failed { message }) => match receiver.abandon() {
                Some(cause) => return Err(cause.context(format!("the guest's checkpoint stopped ({message})"))),
                None => bail!("the guest could not export a checkpoint: {message}"),
            },
            Err(e) => {
                let _ = receiver.abandon();
                return Err(e);
            }
        };
        let current = self.session_dir.join(CHECKPOINT_DIR);
        if current.exists() {
            fs::remove_dir_all(&current).with_context(|| format!("cannot remove {}", current.display()))?;
        }
        fs::rename(&next_dir, &current).with_context(|| format!("cannot rename {}", next_dir.display()))?;
        let store = checkpoint_store(&self.session_dir)?;
        Landed::load(&store)?.settle(&store)?;
        if let Ok(dir) = File::open(&self.session_dir) {
            let _ = nix::unistd::fsync(dir.as_fd());
        }
        Ok(report.summary.entries)
    }

    /// Waits for the init's answer while its stream progresses: at most
    /// the stall bound without a byte, [`GUEST_WAIT`] in all.
    fn wait_for(&self, id: u64, receiver: &staging::Receiver) -> anyhow::Result<ExportOutcome> {
        let started = Instant::now();
        let mut stall = staging::Stall::watch(self.guest.stall);
        loop {
            match self.guest.answers.recv_timeout(PROGRESS_EVERY) {
                Ok(answer) if answer.id == id => return Ok(answer.outcome),
                // An answer to a request that timed out earlier.
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!(
                    "the run ended during the checkpoint (its command ended, or its VM stopped: then its scratch \
                     disk is kept, and `stockade recover` stages its changes)"
                ),
            }
            if stall.stalled(receiver.received(), receiver.working()) {
                bail!(
                    "the guest's checkpoint brought nothing for {}s ({} bytes in); the run goes on",
                    stall.bound().as_secs(),
                    stall.received()
                );
            }
            if started.elapsed() >= GUEST_WAIT {
                bail!(
                    "the guest did not export a checkpoint within {} minutes ({} bytes in); the run goes on",
                    GUEST_WAIT.as_secs() / 60,
                    stall.received()
                );
            }
        }
    }
}

/// `checkpoint.next` of a checkpoint that stopped before it replaced the
/// last one (a refused, failed or cut-off export): removed when dropped.
struct Unfinished<'a>(&'a Path);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = fs::remove_dir_all(self.0);
        }
    }
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
