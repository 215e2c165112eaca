//! The host's side of the workspace changes during a run: a snapshot of the
//! workspace taken while the VM boots (so that host edits made during the
//! session show up as conflicts), and the change set the guest exports at
//! the end, staged into the session's change store.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

use crate::changes::{Limits, Snapshot, StageReport, Store};
use crate::progress::{Meter, Progress};

/// Takes the snapshot in the background; `wait` stores it.
pub struct SnapshotJob {
    job: JoinHandle<anyhow::Result<()>>,
    /// Paths seen so far, for the wait's progress.
    seen: Arc<AtomicU64>,
}

pub fn snapshot(workspace: &Path, store: &Store) -> anyhow::Result<SnapshotJob> {
    let workspace = workspace.to_path_buf();
    let store = store.clone();
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    let job = std::thread::Builder::new()
        .name("snapshot".into())
        .spawn(move || {
            let started = Instant::now();
            let snapshot = Snapshot::capture_counting(&workspace, &counter)
                .with_context(|| format!("cannot take a snapshot of the workspace {}", workspace.display()))?;
            tracing::info!("workspace snapshot: {} paths in {:.0?}", snapshot.len(), started.elapsed());
            store.save_snapshot(&snapshot)?;
            Ok(())
        })
        .context("cannot start the workspace snapshot")?;
    Ok(SnapshotJob { job, seen })
}

impl SnapshotJob {
    /// Without a snapshot, conflicts are still detected against what the
    /// guest saw; host edits during the session may then go unnoticed.
    pub fn wait(self) {
        // Usually done while the VM booted; in a huge workspace the command
        // may end first, and then the wait says what it is waiting for.
        if !self.job.is_finished() {
            let mut meter = Meter::stderr("finishing the workspace snapshot", "paths");
            meter.start(None);
            while !self.job.is_finished() {
                meter.set(self.seen.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(50));
            }
            meter.finish();
        }
        match self.job.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("stockade: warning: {e:#}; host edits made during this session will not count as conflicts")
            }
            Err(_) => eprintln!("stockade: warning: the workspace snapshot failed"),
        }
    }
}

/// Receives the guest's change set in the background.
pub struct Receiver {
    job: JoinHandle<anyhow::Result<StageReport>>,
    path: PathBuf,
}

/// Accepts the guest's change stream on `listener` and stages it.
pub fn receive(listener: UnixListener, path: PathBuf, store: &Store) -> anyhow::Result<Receiver> {
    let store = store.clone();
    let job = std::thread::Builder::new()
        .name("changes".into())
        .spawn(move || {
            listener.set_nonblocking(false).context("cannot wait for the change set")?;
            let (stream, _) = listener.accept().context("cannot accept the change set")?;
            let started = Instant::now();
            let mut meter = Meter::bytes("receiving the guest's changes");
            meter.start(None);
            let counted = Counted { inner: stream, read: 0, meter };
            let report = store.stage(std::io::BufReader::with_capacity(256 * 1024, counted), Limits::default())?;
            tracing::info!(
                "staged {} changes ({} bytes of content) in {:.0?}",
                report.summary.entries,
                report.summary.bytes,
                started.elapsed()
            );
            Ok(report)
        })
        .context("cannot start receiving the change set")?;
    Ok(Receiver { job, path })
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
    /// The guest has sent everything: waits for staging to finish.
    pub fn finish(self) -> anyhow::Result<StageReport> {
        let result = self.job.join().map_err(|_| anyhow!("staging the workspace changes failed"))?;
        let _ = std::fs::remove_file(&self.path);
        result.context("the guest's workspace changes were not staged")
    }

    /// The guest never sent changes: stop listening. The accepting thread
    /// ends with the process.
    pub fn abandon(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
