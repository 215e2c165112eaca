//! Sends the workspace changes to the host when the command has ended: the
//! overlay's upper layer, exported as a change set on its own vsock stream,
//! then a short report on the control connection: the counts, and the
//! digest of the stream, which the host checks before it stages anything.
//!
//! While the command runs, the host may ask for a checkpoint: the same
//! export on `CHECKPOINT_PORT`, answered with `GuestMsg::Checkpoint`. The
//! scratch filesystem that holds the upper layer is frozen for the walk, so
//! the checkpoint is one point in time: a writer blocks until the export is
//! sent, and no file is read half old, half new.

use std::fs::File;
use std::io::BufWriter;
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::Context;

// The control loop runs the checkpoints the host asks for; an export reports on its connection.
use super::channel::Control;
use super::export::{self, Overlayfs};
use super::mounts::Layers;
use crate::protocol::auth::{DigestWriter, StreamDigest, Token};
use crate::protocol::change_set::Writer;
use crate::protocol::{CHANGES_PORT, CHECKPOINT_PORT, CheckpointOutcome, ExportOutcome, GuestMsg};

/// Big writes: a change set can be hundreds of megabytes.
const BUFFER: usize = 256 * 1024;

/// Exports and reports; a failure is reported to the host, never fatal to
/// the exit report that follows.
pub fn send(layers: &Layers, control: &Control, token: &Token) -> anyhow::Result<()> {
    let outcome = outcome_of(export_to_host(layers, token, CHANGES_PORT));
    control.send(&GuestMsg::Changes(outcome))
}

/// Exports the changes made so far while the command runs, with the
/// upper layer's filesystem frozen for the walk; returns the answer for the
/// host.
pub fn checkpoint(layers: &Layers, token: &Token, id: u64) -> GuestMsg {
    let exported = Frozen::freeze(&layers.upper).and_then(|frozen| {
        let exported = export_to_host(layers, token, CHECKPOINT_PORT);
        frozen.thaw()?;
        exported
    });
    GuestMsg::Checkpoint(CheckpointOutcome { id, outcome: outcome_of(exported) })
}

fn outcome_of(exported: anyhow::Result<(export::ExportReport, StreamDigest)>) -> ExportOutcome {
    match exported {
        Ok((report, stream)) => ExportOutcome::Sent {
            entries: report.entries,
            files: report.files,
            bytes: report.bytes,
            skipped: report.skipped,
            stream,
        },
        Err(e) => ExportOutcome::Failed { message: format!("{e:#}") },
    }
}

nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);

/// A filesystem frozen (`FIFREEZE`): writes to it block until it is thawed,
/// here or when this is dropped.
struct Frozen {
    dir: Option<File>,
}

impl Frozen {
    fn freeze(inside: &Path) -> anyhow::Result<Frozen> {
        let dir = File::open(inside).with_context(|| format!("cannot open {}", inside.display()))?;
        let mut unused: libc::c_int = 0;
        // SAFETY: `dir` is an open descriptor for the whole call, and the
        // kernel neither reads nor writes the argument of FIFREEZE.
        unsafe { fifreeze(dir.as_raw_fd(), &mut unused) }.with_context(|| {
            format!("cannot freeze the filesystem of {} for a consistent checkpoint", inside.display())
        })?;
        Ok(Frozen { dir: Some(dir) })
    }

    fn thaw(mut self) -> anyhow::Result<()> {
        self.thaw_now().context("cannot thaw the scratch filesystem after a checkpoint")
    }

    fn thaw_now(&mut self) -> nix::Result<()> {
        let Some(dir) = self.dir.take() else { return Ok(()) };
        let mut unused: libc::c_int = 0;
        // SAFETY: as in `freeze`.
        unsafe { fithaw(dir.as_raw_fd(), &mut unused) }.map(drop)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = self.thaw_now() {
            eprintln!("stockade-init: cannot thaw the scratch filesystem: {e}");
        }
    }
}

fn export_to_host(layers: &Layers, token: &Token, port: u32) -> anyhow::Result<(export::ExportReport, StreamDigest)> {
    let stream = super::vsock::connect_with_token(port, token)?;
    let socket = stream.try_clone().context("cannot duplicate the change stream")?;
    let out = BufWriter::with_capacity(BUFFER, DigestWriter::new(stream));
    let mut writer = Writer::new(out).context("cannot start the change set")?;
    let report = export::export(&layers.upper, &layers.lower, &Overlayfs, &mut writer)?;
    let (out, _) = writer.finish().context("cannot finish the change set")?;
    let out = out.into_inner().map_err(|e| e.into_error()).context("cannot send the change set")?;
    let (stream, digest) = out.finish();
    drop(stream);
    // The end of the stream is how the host knows it has everything.
    let _ = nix::sys::socket::shutdown(socket.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    Ok((report, digest))
}
