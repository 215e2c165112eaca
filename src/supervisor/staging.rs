//! The host's side of the workspace changes during a run: the change set the
//! guest exports at the end, staged into the session's change store. (What
//! the guest saw of the workspace, for conflicts, the VMM records as it
//! serves the guest's lookups: see `changes::Seen`.)

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, anyhow};

use crate::changes::{Limits, StageReport, Store};
use crate::progress::{Meter, Progress};

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
