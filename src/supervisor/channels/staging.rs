//! The host's side of the workspace changes during a run: the change set the
//! guest init exports at the end, staged into the session's change store.
//! (What the guest saw of the workspace, for conflicts, the VMM records as it
//! serves the guest's lookups: see `changes::Seen`.)
//!
//! Only the init's change set is staged (see `protocol::auth`). Every change
//! connection must start with this boot's token; only the init and a guest
//! root that read PID 1's memory have it. The first such connection is
//! staged as it streams, through a [`DigestGate`] that withholds the
//! stream's last byte until the init has said on the control connection
//! what it sent: a stream that differs, or that the init never vouches for,
//! never completes, and the store commits nothing. Any later token-bearing
//! connection is reported and spooled to an unnamed file beside the store
//! (a forger may have got in first, with the init's stream second); if the
//! first does not match, the spooled one that does is staged. So a forged
//! stream is never staged and never makes the init's changes vanish; the
//! spooling costs only a run whose guest forged a connection.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

use super::admission::{self, Channel, Listening, Tampering};
use crate::changes::{Space, StageReport, Store};
use crate::progress::{Meter, Progress};
use crate::protocol::auth::{StreamDigest, StreamHasher, Token};
use crate::protocol::change_set::Limits;

/// After the init reports its export, how long its change connection may
/// take to show up (it was opened before the report was sent).
const ARRIVAL_WAIT: Duration = Duration::from_secs(60);
/// After the init reports its export, how long the rest of its stream may
/// go silent: it has sent everything, so only a forged stream stalls.
const STALL_WAIT: Duration = Duration::from_secs(60);
/// Once the first change connection proved not to be the init's, how long
/// another may take to show up. The init connects and presents its token
/// before it exports, and reports only after, so its connection is already
/// being checked when the verdict comes.
const LATE_WAIT: Duration = Duration::from_secs(5);
/// Token-bearing change connections spooled besides the first; further
/// ones are refused unread. Each is bounded by the disk margin.
const MAX_SPOOLED: usize = 4;
/// How long a change stream under way (or due) may bring nothing before
/// the guest counts as stalling it: the guest may be silent a while before
/// and between files (freezing flushes what was written, a changed big
/// file's base is hashed before its content goes), far longer on the
/// software-CPU test rig than on KVM. A checkpoint then fails; the final
/// export, or a recovery's, ends the run with the scratch disk kept.
pub const EXPORT_STALL: Duration = Duration::from_secs(300);

/// After the init reports a stream of `declared` bytes sent, how long the
/// rest of it may take in all: a minute, and a second per 8 MiB declared,
/// at most `cap`. The init reports once it has written everything, so what
/// is left is only what the connection holds (the VMM's credit window and
/// the socket's buffer, well under a MiB); the declared size is the
/// guest's word, so it buys no more than `cap`. A guest that trickles the
/// rest is cut off.
fn tail_wait(declared: u64, cap: Duration) -> Duration {
    Duration::from_secs(60 + declared / (8 << 20)).min(cap)
}

/// What the init said about its export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Sent(StreamDigest),
    Failed,
}

/// A token-bearing change connection, being staged or spooled.
enum Job {
    /// The first: staged as it streams; `vouched` is set once its digest
    /// matched the init's, `failed` once staging stopped on its own (the
    /// stream is then closed).
    Live {
        handle: JoinHandle<anyhow::Result<StageReport>>,
        stream: UnixStream,
        vouched: Arc<AtomicBool>,
        failed: Arc<AtomicBool>,
    },
    /// A later one: kept in an unnamed file until the verdict.
    Spooled { handle: JoinHandle<io::Result<(File, StreamDigest)>>, stream: UnixStream },
}

impl Job {
    fn stream(&self) -> &UnixStream {
        match self {
            Job::Live { stream, .. } | Job::Spooled { stream, .. } => stream,
        }
    }

    /// Ends the connection, so its thread stops at its next read.
    fn stop(&self) {
        let _ = self.stream().shutdown(std::net::Shutdown::Both);
    }
}

/// See `Receiver::taking`.
type Taking = Arc<Mutex<Option<mpsc::Sender<Job>>>>;

/// Receives the guest's change set in the background.
pub struct Receiver {
    started: mpsc::Receiver<Job>,
    /// Where connections taken on go; emptied once the export is decided,
    /// so that one taken on later is closed at once rather than read by a
    /// thread nothing stops.
    taking: Taking,
    /// A connection was taken on, or one of its threads ended.
    wake: mpsc::Receiver<()>,
    verdict: mpsc::Sender<Verdict>,
    path: PathBuf,
    store: Store,
    shown: Shown,
    /// Bytes of the token-bearing change connections received so far.
    received: Arc<AtomicU64>,
    /// Set while the host works on the first connection's stream rather
    /// than waiting for more of it (see [`Receiver::working`]).
    working: Arc<AtomicBool>,
    /// Set once a token-bearing change connection is being received.
    connected: Arc<AtomicBool>,
    _listening: Listening,
}

/// Watches a change stream for progress: how long it has brought nothing.
/// A slow stream that still moves is never stalled, however long it takes.
pub struct Stall {
    bound: Duration,
    received: u64,
    moved: Instant,
}

impl Stall {
    /// Starts the clock now, as if a byte had just come.
    pub fn watch(bound: Duration) -> Stall {
        Stall { bound, received: 0, moved: Instant::now() }
    }

    /// Notes `received`, the bytes in so far, and whether the host is
    /// `working` on what came (not waiting for the guest); true once none
    /// came for the bound while the host waited.
    pub fn stalled(&mut self, received: u64, working: bool) -> bool {
        let now = Instant::now();
        if received != self.received || working {
            (self.received, self.moved) = (received, now);
        }
        now.duration_since(self.moved) >= self.bound
    }

    /// The bytes in when last noted.
    pub fn received(&self) -> u64 {
        self.received
    }

    pub fn bound(&self) -> Duration {
        self.bound
    }
}

/// Accepts the init's change stream on `listener` and stages it; refuses
/// and reports any other.
pub fn receive(
    listener: UnixListener,
    path: PathBuf,
    store: &Store,
    token: Token,
    tampering: Tampering,
) -> anyhow::Result<Receiver> {
    receive_as(listener, path, store, token, tampering, Shown::Meter)
}

/// Whether staging shows a meter on stderr: never for a checkpoint, which
/// is staged while the command (maybe a full-screen one) owns the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    Meter,
    Quiet,
}

/// `receive`, for a checkpoint or the final export.
pub fn receive_as(
    listener: UnixListener,
    path: PathBuf,
    store: &Store,
    token: Token,
    tampering: Tampering,
    shown: Shown,
) -> anyhow::Result<Receiver> {
    let (verdict, verdict_rx) = mpsc::channel();
    let (started_tx, started) = mpsc::channel();
    let (wake_tx, wake) = mpsc::channel();
    let verdict_rx = Mutex::new(Some(verdict_rx));
    let taking: Taking = Arc::new(Mutex::new(Some(started_tx)));
    let handing = taking.clone();
    let reports = tampering.clone();
    let staging = store.clone();
    let received = Arc::new(AtomicU64::new(0));
    let counting = received.clone();
    let working = Arc::new(AtomicBool::new(false));
    let busy = working.clone();
    let connected = Arc::new(AtomicBool::new(false));
    let arrived = connected.clone();
    let listening = admission::admit_each(listener, Channel::Changes, token, tampering, move |stream, nth| {
        let Ok(watch) = stream.try_clone() else {
            return tracing::warn!("cannot duplicate a change connection; it was not received");
        };
        let job = if nth == 0 {
            let Some(verdict_rx) = verdict_rx.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
            let Ok(closer) = stream.try_clone() else {
                return tracing::warn!("cannot duplicate a change connection; it was not received");
            };
            let gate = DigestGate::new(stream, verdict_rx, reports.clone());
            let vouched = gate.vouched.clone();
            let failed = Arc::new(AtomicBool::new(false));
            let failing = failed.clone();
            let store = staging.clone();
            let done = wake_tx.clone();
            let (counting, busy) = (counting.clone(), busy.clone());
            std::thread::Builder::new()
                .name("changes".into())
                .spawn(move || {
                    let staged = stage(gate, &store, shown, &counting, &busy);
                    busy.store(false, Ordering::SeqCst);
                    if staged.is_err() {
                        // Staging stopped before the stream did (the disk
                        // margin, a bound, a bad stream): close it, so that
                        // the init's export fails and it says so, rather
                        // than the init blocking on a stream no one reads
                        // and the host waiting for its word.
                        failing.store(true, Ordering::SeqCst);
                        let _ = closer.shutdown(std::net::Shutdown::Both);
                    }
                    let _ = done.send(());
                    staged
                })
                .map(|handle| Job::Live { handle, stream: watch, vouched, failed })
        } else {
            reports.report(Channel::Changes.second());
            if nth > MAX_SPOOLED {
                reports.report(format!(
                    "more than {} change connections with this run's token arrived; the rest were refused unread",
                    MAX_SPOOLED + 1
                ));
                return;
            }
            let dir = staging.dir().to_path_buf();
            let done = wake_tx.clone();
            let counting = counting.clone();
            std::thread::Builder::new()
                .name("changes-spool".into())
                .spawn(move || {
                    let spooled = spool(stream, &dir, &counting);
                    let _ = done.send(());
                    spooled
                })
                .map(|handle| Job::Spooled { handle, stream: watch })
        };
        match job {
            Ok(job) => {
                match &*handing.lock().unwrap_or_else(|p| p.into_inner()) {
                    Some(started) => drop(started.send(job)),
                    None => return job.stop(),
                }
                // After the job is handed on, so that an `abandon` that
                // follows sees it and stops it.
                arrived.store(true, Ordering::SeqCst);
                let _ = wake_tx.send(());
            }
            Err(e) => tracing::warn!("cannot start receiving a change connection: {e}"),
        }
    })?;
    Ok(Receiver {
        started,
        taking,
        wake,
        verdict,
        path,
        store: store.clone(),
        shown,
        received,
        working,
        connected,
        _listening: listening,
    })
}

/// A file in `dir` that no name points to, so it goes with its last
/// descriptor: O_TMPFILE, or create and unlink where the filesystem lacks it.
fn unnamed_file(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).mode(0o600);
    match options.clone().custom_flags(libc::O_TMPFILE).open(dir) {
        Ok(file) => Ok(file),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::EISDIR) => {
            let path = dir.join(format!("spool.{}.{:?}", std::process::id(), std::thread::current().id()));
            let file = options.create_new(true).open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(file)
        }
        Err(e) => Err(e),
    }
}

fn join_live(handle: JoinHandle<anyhow::Result<StageReport>>) -> anyhow::Result<StageReport> {
    let staged = handle.join().map_err(|_| anyhow!("staging the workspace changes failed"))?;
    staged.context("the guest's workspace changes were not staged")
}

/// Copies a change connection into an unnamed file in `dir`, hashing it
/// and counting it into `received`, and stops before the disk margin,
/// watched as staging watches it.
fn spool(mut stream: UnixStream, dir: &Path, received: &AtomicU64) -> io::Result<(File, StreamDigest)> {
    let mut space = Space::new(dir, None).map_err(io::Error::other)?;
    let mut file = unnamed_file(dir)?;
    let mut hasher = StreamHasher::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        space.charge(n as u64)?;
        received.fetch_add(n as u64, Ordering::Relaxed);
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])?;
    }
    file.rewind()?;
    Ok((file, hasher.finish()))
}

fn stage(
    input: impl Read,
    store: &Store,
    shown: Shown,
    received: &AtomicU64,
    working: &AtomicBool,
) -> anyhow::Result<StageReport> {
    let started = Instant::now();
    let meter = (shown == Shown::Meter).then(|| {
        let mut meter = Meter::bytes("receiving the guest's changes");
        meter.start(None);
        meter
    });
    let counted = Counted { inner: input, read: 0, meter, received, working };
    let report = store.stage(std::io::BufReader::with_capacity(256 * 1024, counted), Limits::default())?;
    tracing::info!(
        "staged {} changes ({} bytes of content) in {:.0?}",
        report.summary.entries,
        report.summary.bytes,
        started.elapsed()
    );
    Ok(report)
}

/// The change stream, counted for the meter (which shows only when the
/// change set is large enough to take a while) and for whoever watches the
/// streams' progress (`Receiver::received`, shared with spooled ones).
struct Counted<'a, R> {
    inner: R,
    read: u64,
    meter: Option<Meter>,
    received: &'a AtomicU64,
    /// Cleared while waiting for the stream, set while working on it.
    working: &'a AtomicBool,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.working.store(false, Ordering::SeqCst);
        let read = self.inner.read(buf);
        self.working.store(true, Ordering::SeqCst);
        let n = read?;
        self.read += n as u64;
        self.received.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(meter) = &mut self.meter {
            meter.set(self.read);
        }
        Ok(n)
    }
}

impl Receiver {
    /// Bytes of the token-bearing change connections received so far (the
    /// init's may be a spooled one): a long export that still progresses
    /// is told from a stalled one by this (see [`Stall`]).
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Whether the host is working on the stream it received (hashing a
    /// long hole, writing content, committing) rather than waiting for the
    /// guest: that time is not the guest's stall.
    pub fn working(&self) -> bool {
        self.working.load(Ordering::SeqCst)
    }

    /// Whether a token-bearing change connection is being received: the
    /// export is under way.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// The init has sent `stream`: stages the change connection that is
    /// exactly that, and only it. The init has reported it sent, so the
    /// rest of it gets [`tail_wait`] with `cap`: a guest that trickles it
    /// a byte at a time (each read within `STALL_WAIT`) is not waited on
    /// for ever.
    pub fn finish(self, stream: StreamDigest, cap: Duration) -> anyhow::Result<StageReport> {
        let _ = self.verdict.send(Verdict::Sent(stream));
        let result = self.decide(stream, tail_wait(stream.bytes, cap));
        self.stop_all(&self.close());
        let _ = std::fs::remove_file(&self.path);
        result
    }

    /// Takes on no more connections (each is closed as it comes); returns
    /// those taken on and not yet looked at.
    fn close(&self) -> Vec<Job> {
        self.taking.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.started.try_iter().collect()
    }

    /// Watches the token-bearing connections until one is known to be the
    /// init's: the first, once its digest matched, or a spooled one whose
    /// digest matches (then the first is stopped). A forger that stalls its
    /// connection holds nothing up once the init's is in.
    fn decide(&self, sent: StreamDigest, limit: Duration) -> anyhow::Result<StageReport> {
        let mut deadline = Instant::now() + limit;
        let mut looked = Instant::now();
        let mut arrival = Instant::now() + ARRIVAL_WAIT;
        let mut live: Option<Job> = None;
        let mut spooled: Vec<Job> = Vec::new();
        let mut failed: Option<anyhow::Error> = None;
        loop {
            for job in self.started.try_iter() {
                let _ = job.stream().set_read_timeout(Some(STALL_WAIT));
                match job {
                    Job::Live { .. } => live = Some(job),
                    Job::Spooled { .. } => spooled.push(job),
                }
            }
            if let Some(Job::Live { handle, stream, vouched, failed: stopped }) = live.take() {
                if handle.is_finished() {
                    match join_live(handle) {
                        Ok(report) => return self.stopping(spooled, Ok(report)),
                        Err(e) if vouched.load(Ordering::SeqCst) => return self.stopping(spooled, Err(e)),
                        // Not the init's: a spooled one may be.
                        Err(e) => {
                            failed = Some(e);
                            arrival = Instant::now() + LATE_WAIT;
                        }
                    }
                } else {
                    live = Some(Job::Live { handle, stream, vouched, failed: stopped });
                }
            }
            let mut waiting = Vec::new();
            let mut pending = std::mem::take(&mut spooled).into_iter();
            while let Some(job) = pending.next() {
                let Job::Spooled { handle, stream } = job else { continue };
                if !handle.is_finished() {
                    waiting.push(Job::Spooled { handle, stream });
                    continue;
                }
                match handle.join() {
                    Ok(Ok((file, got))) if got == sent => {
                        let rest = waiting.into_iter().chain(pending).collect();
                        return self.stage_spooled(file, live, rest);
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("a spooled change connection could not be kept: {e}"),
                    Err(_) => tracing::warn!("spooling a change connection failed"),
                }
            }
            spooled = waiting;
            let now = Instant::now();
            // The host's own work on the stream does not count against the
            // guest; what it can take is bounded by the change set's limits.
            if self.working() {
                deadline += now - looked;
            }
            looked = now;
            if live.is_none() && spooled.is_empty() && now >= arrival.min(deadline) {
                return Err(failed.unwrap_or_else(|| {
                    anyhow!(
                        "the guest init reported sending its changes ({} bytes), but no change connection from it \
                         arrived",
                        sent.bytes
                    )
                }));
            }
            if now >= deadline {
                let jobs: Vec<Job> = spooled.into_iter().chain(live).collect();
                self.stop_all(&jobs);
                // Its thread ends at its next read; it writes the store no
                // more once joined, so the caller may remove it. A stream
                // that was vouched for meanwhile was staged whole.
                for job in jobs {
                    if let Job::Live { handle, .. } = job
                        && let Ok(report) = join_live(handle)
                    {
                        return Ok(report);
                    }
                }
                return Err(anyhow!(
                    "the guest's change stream ({} bytes declared) was not received within {}s of its export \
                     and was stopped; nothing was staged",
                    sent.bytes,
                    limit.as_secs()
                ));
            }
            // Woken when a job starts or ends; the timeout bounds how late
            // an arrival deadline is noticed.
            let _ = self.wake.recv_timeout(Duration::from_millis(10));
        }
    }

    /// Stages the spooled stream that matched, once the first connection
    /// (still streaming, and not the init's unless it is the same bytes)
    /// is stopped.
    fn stage_spooled(&self, file: File, live: Option<Job>, rest: Vec<Job>) -> anyhow::Result<StageReport> {
        self.stop_all(&rest);
        if let Some(Job::Live { handle, stream, .. }) = live {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            if let Ok(report) = join_live(handle) {
                return Ok(report);
            }
        }
        stage(file, &self.store, self.shown, &AtomicU64::new(0), &AtomicBool::new(false))
            .context("the guest's workspace changes were not staged")
    }

    /// Ends the connections still open and returns `result`.
    fn stopping(&self, jobs: Vec<Job>, result: anyhow::Result<StageReport>) -> anyhow::Result<StageReport> {
        self.stop_all(&jobs);
        result
    }

    fn stop_all(&self, jobs: &[Job]) {
        for job in jobs {
            job.stop();
        }
    }

    /// The init could not export, or never said: nothing is staged. A
    /// stream being received ends with an error, and stays unstaged.
    /// Returns why staging had stopped on the host's side, if it had: the
    /// init's export then failed because its stream was closed, and this
    /// is the cause to show (a full disk, say).
    pub fn abandon(self) -> Option<anyhow::Error> {
        let jobs = self.close();
        // Looked at before the verdict and the stop below, which fail it too.
        let stopped =
            jobs.iter().position(|job| matches!(job, Job::Live { failed, .. } if failed.load(Ordering::SeqCst)));
        let _ = self.verdict.send(Verdict::Failed);
        self.stop_all(&jobs);
        let _ = std::fs::remove_file(&self.path);
        let job = jobs.into_iter().nth(stopped?)?;
        match job {
            // Set just before its stream was closed: the thread is ending.
            Job::Live { handle, .. } => join_live(handle).err(),
            Job::Spooled { .. } => None,
        }
    }
}

/// Passes a change stream through, hashing it, but keeps its last byte back
/// until the init's [`Verdict`] says what the stream must be: so the
/// change-set reader cannot reach its end record, and the store cannot
/// commit, before the stream is known to be the init's.
pub struct DigestGate<R> {
    inner: R,
    hasher: StreamHasher,
    verdict: mpsc::Receiver<Verdict>,
    tampering: Tampering,
    buf: Vec<u8>,
    /// Bytes released to the reader, from `pos`.
    ready: Vec<u8>,
    pos: usize,
    /// The last byte read from `inner`, held back.
    held: Option<u8>,
    verified: bool,
    /// Set once the stream matched the init's verdict.
    vouched: Arc<AtomicBool>,
}

impl<R: Read> DigestGate<R> {
    pub fn new(inner: R, verdict: mpsc::Receiver<Verdict>, tampering: Tampering) -> DigestGate<R> {
        DigestGate {
            inner,
            hasher: StreamHasher::default(),
            verdict,
            tampering,
            buf: vec![0; 64 * 1024],
            ready: Vec::new(),
            pos: 0,
            held: None,
            verified: false,
            vouched: Arc::new(AtomicBool::new(false)),
        }
    }

    /// At the end of the stream: compares it with what the init sent.
    fn verify(&mut self) -> io::Result<()> {
        let got = std::mem::take(&mut self.hasher).finish();
        match self.verdict.recv() {
            Ok(Verdict::Sent(sent)) if sent == got => {
                self.verified = true;
                self.vouched.store(true, Ordering::SeqCst);
                self.ready.clear();
                self.ready.extend(self.held.take());
                self.pos = 0;
                Ok(())
            }
            Ok(Verdict::Sent(sent)) => {
                let what = format!(
                    "a change set that is not the one the guest init sent was refused and not staged \
                     ({} bytes, sha256 {}; the init sent {} bytes, sha256 {})",
                    got.bytes, got.sha256, sent.bytes, sent.sha256
                );
                self.tampering.report(what.clone());
                Err(io::Error::other(what))
            }
            Ok(Verdict::Failed) => Err(io::Error::other("the guest init reported that its export failed")),
            Err(_) => Err(io::Error::other("the run ended before the guest init said what it sent")),
        }
    }
}

impl<R: Read> Read for DigestGate<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.pos < self.ready.len() {
                let n = out.len().min(self.ready.len() - self.pos);
                out[..n].copy_from_slice(&self.ready[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.verified {
                return Ok(0);
            }
            let n = self.inner.read(&mut self.buf)?;
            let Some(last) = n.checked_sub(1) else {
                self.verify()?;
                continue;
            };
            self.hasher.update(&self.buf[..n]);
            self.ready.clear();
            self.pos = 0;
            self.ready.extend(self.held.take());
            self.ready.extend_from_slice(&self.buf[..last]);
            self.held = Some(self.buf[last]);
        }
    }
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
