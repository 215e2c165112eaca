//! Framing on the control connection: a one-byte kind, a little-endian u32
//! length, then the payload. Output frames carry raw bytes; the others JSON.

use std::io::{self, Read, Write};

use thiserror::Error;

use super::{CheckpointOutcome, ExitReport, ExportOutcome, GuestMsg, HostMsg};

/// No frame may be larger: the reader allocates the payload, and the guest
/// is not trusted to be reasonable.
pub const MAX_FRAME: usize = 1 << 20;

const KIND_HOST: u8 = 1;
const KIND_READY: u8 = 10;
const KIND_STDOUT: u8 = 11;
const KIND_STDERR: u8 = 12;
const KIND_EXIT: u8 = 13;
const KIND_CHANGES: u8 = 14;
const KIND_DOCKERD_LOG: u8 = 15;
const KIND_HEARTBEAT: u8 = 19;
const KIND_CHECKPOINT: u8 = 16;

#[derive(Debug, Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("i/o on the control connection")]
    Io(#[from] io::Error),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("malformed frame payload")]
    Payload(#[from] serde_json::Error),
}

fn write_raw(w: &mut impl Write, kind: u8, payload: &[u8]) -> Result<(), FrameError> {
    let len = u32::try_from(payload.len()).map_err(|_| FrameError::TooLarge(payload.len()))?;
    if payload.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(payload.len()));
    }
    let mut header = [0u8; 5];
    header[0] = kind;
    header[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&header)?;
    w.write_all(payload)?;
    Ok(())
}

fn read_raw(r: &mut impl Read) -> Result<(u8, Vec<u8>), FrameError> {
    let mut header = [0u8; 5];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((header[0], payload))
}

/// Something that travels in frames.
pub trait Frame: Sized {
    fn encode(&self, w: &mut impl Write) -> Result<(), FrameError>;
    fn decode(kind: u8, payload: Vec<u8>) -> Result<Self, FrameError>;
}

impl Frame for HostMsg {
    fn encode(&self, w: &mut impl Write) -> Result<(), FrameError> {
        write_raw(w, KIND_HOST, &serde_json::to_vec(self)?)
    }
    fn decode(kind: u8, payload: Vec<u8>) -> Result<Self, FrameError> {
        match kind {
            KIND_HOST => Ok(serde_json::from_slice(&payload)?),
            other => Err(FrameError::UnknownKind(other)),
        }
    }
}

impl Frame for GuestMsg {
    fn encode(&self, w: &mut impl Write) -> Result<(), FrameError> {
        match self {
            GuestMsg::Ready { kernel } => write_raw(w, KIND_READY, kernel.as_bytes()),
            GuestMsg::Stdout(data) => write_raw(w, KIND_STDOUT, data),
            GuestMsg::Stderr(data) => write_raw(w, KIND_STDERR, data),
            GuestMsg::Exit(report) => write_raw(w, KIND_EXIT, &serde_json::to_vec(report)?),
            GuestMsg::Changes(outcome) => write_raw(w, KIND_CHANGES, &serde_json::to_vec(outcome)?),
            GuestMsg::DockerdLog(data) => write_raw(w, KIND_DOCKERD_LOG, data),
            GuestMsg::Heartbeat => write_raw(w, KIND_HEARTBEAT, &[]),
            GuestMsg::Checkpoint(answer) => write_raw(w, KIND_CHECKPOINT, &serde_json::to_vec(answer)?),
        }
    }
    fn decode(kind: u8, payload: Vec<u8>) -> Result<Self, FrameError> {
        Ok(match kind {
            KIND_READY => GuestMsg::Ready { kernel: String::from_utf8_lossy(&payload).into_owned() },
            KIND_STDOUT => GuestMsg::Stdout(payload),
            KIND_STDERR => GuestMsg::Stderr(payload),
            KIND_DOCKERD_LOG => GuestMsg::DockerdLog(payload),
            KIND_HEARTBEAT => GuestMsg::Heartbeat,
            KIND_EXIT => GuestMsg::Exit(serde_json::from_slice::<ExitReport>(&payload)?),
            KIND_CHANGES => GuestMsg::Changes(serde_json::from_slice::<ExportOutcome>(&payload)?),
            KIND_CHECKPOINT => GuestMsg::Checkpoint(serde_json::from_slice::<CheckpointOutcome>(&payload)?),
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

pub fn write_frame<F: Frame>(w: &mut impl Write, msg: &F) -> Result<(), FrameError> {
    msg.encode(w)
}

pub fn read_frame<F: Frame>(r: &mut impl Read) -> Result<F, FrameError> {
    let (kind, payload) = read_raw(r)?;
    F::decode(kind, payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{RootEntry, RunSpec, WindowSize};

    #[test]
    fn round_trips_every_message() {
        let spec = RunSpec {
            argv: vec!["echo".into(), "hi".into()],
            env: vec![("TERM".into(), "xterm".into())],
            cwd: "/w".into(),
            uid: 1000,
            gid: 1000,
            root: vec![RootEntry::Tmpfs { target: "/tmp".into(), mode: 0o1777, uid: 0, gid: 0 }],
            tty: Some(WindowSize { rows: 24, cols: 80 }),
            network: true,
            pids: None,
            docker: true,
            ssh_agent: true,
            token: crate::protocol::auth::Token::from_bytes([7; 32]),
            clock: Some(crate::protocol::template::HostClock { secs: 1_800_000_000, nanos: 5 }),
            seed: vec![9; 64],
            recover: false,
        };
        let host = [
            HostMsg::Run(spec),
            HostMsg::Signal { signal: 2 },
            HostMsg::Resize(WindowSize { rows: 50, cols: 132 }),
            HostMsg::Finish,
            HostMsg::Checkpoint { id: 7 },
        ];
        let guest = [
            GuestMsg::Ready { kernel: "6.12".into() },
            GuestMsg::Heartbeat,
            GuestMsg::Stdout(b"out".to_vec()),
            GuestMsg::Stderr(vec![0, 255]),
            GuestMsg::DockerdLog(b"level=info".to_vec()),
            GuestMsg::Changes(ExportOutcome::Sent {
                entries: 1,
                files: 1,
                bytes: 3,
                skipped: 0,
                stream: crate::protocol::auth::StreamDigest {
                    bytes: 90,
                    sha256: crate::util::digest::Sha256::of(b"x"),
                },
            }),
            GuestMsg::Checkpoint(crate::protocol::CheckpointOutcome {
                id: 7,
                outcome: ExportOutcome::Failed { message: "busy".into() },
            }),
            GuestMsg::Exit(ExitReport::Signaled { signal: 9 }),
        ];
        let mut buf = Vec::new();
        for m in &host {
            write_frame(&mut buf, m).unwrap();
        }
        for m in &guest {
            write_frame(&mut buf, m).unwrap();
        }
        let mut r = &buf[..];
        for m in &host {
            assert_eq!(&read_frame::<HostMsg>(&mut r).unwrap(), m);
        }
        for m in &guest {
            assert_eq!(&read_frame::<GuestMsg>(&mut r).unwrap(), m);
        }
        assert!(matches!(read_frame::<GuestMsg>(&mut r), Err(FrameError::Closed)));
    }

    #[test]
    fn refuses_oversized_frames_before_allocating() {
        let mut buf = vec![KIND_STDOUT];
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_frame::<GuestMsg>(&mut &buf[..]), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn unknown_kind_is_an_error() {
        let buf = [99u8, 0, 0, 0, 0];
        assert!(matches!(read_frame::<GuestMsg>(&mut &buf[..]), Err(FrameError::UnknownKind(99))));
    }
}
