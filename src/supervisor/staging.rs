//! The host's side of the workspace changes during a run: the change set the
//! guest init exports at the end, staged into the session's change store.
//! (What the guest saw of the workspace, for conflicts, the VMM records as it
//! serves the guest's lookups: see `changes::Seen`.)
//!
//! Only the init's change set is staged (see `protocol::auth`): the first
//! change connection that starts with this boot's token is staged as it
//! streams, but through a [`DigestGate`] that withholds the stream's last
//! byte until the init has said on the control connection what it sent. A
//! stream that differs from that, or that the init never vouches for, never
//! completes: the store commits nothing, and the run reports it.

use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

use super::admission::{self, Channel, Listening, Tampering};
use crate::changes::{Limits, StageReport, Store};
use crate::progress::{Meter, Progress};
use crate::protocol::auth::{StreamDigest, StreamHasher, Token};

/// After the init reports its export, how long its change connection may
/// take to show up (it was opened before the report was sent).
const ARRIVAL_WAIT: Duration = Duration::from_secs(60);
/// After the init reports its export, how long the rest of its stream may
/// go silent: it has sent everything, so only a forged stream stalls.
const STALL_WAIT: Duration = Duration::from_secs(60);

/// What the init said about its export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Sent(StreamDigest),
    Failed,
}

/// The staging of the admitted change connection.
struct Job {
    handle: JoinHandle<anyhow::Result<StageReport>>,
    stream: UnixStream,
}

/// Receives the guest's change set in the background.
pub struct Receiver {
    started: mpsc::Receiver<Job>,
    verdict: mpsc::Sender<Verdict>,
    path: PathBuf,
    _listening: Listening,
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
    let store = store.clone();
    let (verdict, verdict_rx) = mpsc::channel();
    let (started_tx, started) = mpsc::channel();
    let gate_tampering = tampering.clone();
    let listening = admission::admit_first(listener, Channel::Changes, token, tampering, move |stream| {
        let Ok(watch) = stream.try_clone() else {
            return tracing::warn!("cannot duplicate the change stream; it was not staged");
        };
        let gate = DigestGate::new(stream, verdict_rx, gate_tampering);
        let handle = std::thread::Builder::new().name("changes".into()).spawn(move || stage(gate, &store));
        match handle {
            Ok(handle) => {
                let _ = started_tx.send(Job { handle, stream: watch });
            }
            Err(e) => tracing::warn!("cannot start staging the change set: {e}"),
        }
    })?;
    Ok(Receiver { started, verdict, path, _listening: listening })
}

fn stage(input: impl Read, store: &Store) -> anyhow::Result<StageReport> {
    let started = Instant::now();
    let mut meter = Meter::bytes("receiving the guest's changes");
    meter.start(None);
    let counted = Counted { inner: input, read: 0, meter };
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
/// change set is large enough to take a while).
struct Counted<R> {
    inner: R,
    read: u64,
    meter: Meter,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        self.meter.set(self.read);
        Ok(n)
    }
}

impl Receiver {
    /// The init has sent `stream`: waits for staging to finish, which
    /// commits only if what arrived is exactly that.
    pub fn finish(self, stream: StreamDigest) -> anyhow::Result<StageReport> {
        let _ = self.verdict.send(Verdict::Sent(stream));
        let job = self.started.recv_timeout(ARRIVAL_WAIT).map_err(|_| {
            anyhow!(
                "the guest init reported sending its changes ({} bytes), but no change connection from it \
                 arrived",
                stream.bytes
            )
        });
        let _ = std::fs::remove_file(&self.path);
        let job = job?;
        let _ = job.stream.set_read_timeout(Some(STALL_WAIT));
        let result = job.handle.join().map_err(|_| anyhow!("staging the workspace changes failed"))?;
        result.context("the guest's workspace changes were not staged")
    }

    /// The init could not export, or never said: nothing is staged. A
    /// stream being received ends with an error, and stays unstaged.
    pub fn abandon(self) {
        let _ = self.verdict.send(Verdict::Failed);
        let _ = std::fs::remove_file(&self.path);
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
        }
    }

    /// At the end of the stream: compares it with what the init sent.
    fn verify(&mut self) -> io::Result<()> {
        let got = std::mem::take(&mut self.hasher).finish();
        match self.verdict.recv() {
            Ok(Verdict::Sent(sent)) if sent == got => {
                self.verified = true;
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
