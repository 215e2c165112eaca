//! Sends the workspace changes to the host when the command has ended: the
//! overlay's upper layer, exported as a change set on its own vsock stream,
//! then a short report on the control connection: the counts, and the
//! digest of the stream, which the host checks before it stages anything.

use std::io::BufWriter;
use std::os::fd::AsRawFd;

use anyhow::Context;

use super::channel::{self, Control};
use super::export::{self, Overlayfs};
use super::mounts::Layers;
use crate::changes::Writer;
use crate::protocol::auth::{DigestWriter, StreamDigest, Token};
use crate::protocol::{CHANGES_PORT, ExportOutcome, GuestMsg};

/// Big writes: a change set can be hundreds of megabytes.
const BUFFER: usize = 256 * 1024;

/// Exports and reports; a failure is reported to the host, never fatal to
/// the exit report that follows.
pub fn send(layers: &Layers, control: &Control, token: &Token) -> anyhow::Result<()> {
    let outcome = match export_to_host(layers, token) {
        Ok((report, stream)) => ExportOutcome::Sent {
            entries: report.entries,
            files: report.files,
            bytes: report.bytes,
            skipped: report.skipped,
            stream,
        },
        Err(e) => ExportOutcome::Failed { message: format!("{e:#}") },
    };
    control.send(&GuestMsg::Changes(outcome))
}

fn export_to_host(layers: &Layers, token: &Token) -> anyhow::Result<(export::ExportReport, StreamDigest)> {
    let stream = channel::connect_with_token(CHANGES_PORT, token)?;
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
