//! The guest's end of the control connection: heartbeats, and the host's
//! requests (signals, window sizes, checkpoints, published ports' dials).

use std::fs::File;
use std::io::{BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;

use crate::protocol::auth::Token;
use crate::protocol::{CONTROL_PORT, GuestMsg, HEARTBEAT_EVERY, HostMsg, WindowSize, read_frame, write_frame};

/// How long init waits for the host's "finish" before resetting anyway.
const FINISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Says the init is alive every `HEARTBEAT_EVERY`, from a thread of its own
/// (the kernel schedules it however busy the command keeps the guest),
/// until the host goes away.
pub fn start_heartbeat(control: &Control) -> anyhow::Result<()> {
    let writer = control.writer();
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || {
            loop {
                std::thread::sleep(HEARTBEAT_EVERY);
                let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                if write_frame(&mut *w, &GuestMsg::Heartbeat).and_then(|()| Ok(w.flush()?)).is_err() {
                    return;
                }
            }
        })
        .context("cannot start the heartbeat thread")?;
    Ok(())
}

/// Exports checkpoints on their own thread, one at a time, so that the
/// control connection keeps carrying signals meanwhile.
struct Checkpoints {
    layers: Arc<OnceLock<super::mounts::Layers>>,
    writer: Arc<Mutex<File>>,
    busy: Arc<AtomicBool>,
}

impl Checkpoints {
    fn start(&self, id: u64, token: &Token) {
        let answer = |message: &str| {
            let outcome = crate::protocol::ExportOutcome::Failed { message: message.to_string() };
            GuestMsg::Checkpoint(crate::protocol::CheckpointOutcome { id, outcome })
        };
        let Some(layers) = self.layers.get().cloned() else {
            return send_on(&self.writer, &answer("this run has no workspace overlay to checkpoint"));
        };
        if self.busy.swap(true, Ordering::SeqCst) {
            return send_on(&self.writer, &answer("a checkpoint is already being exported"));
        }
        let (writer, busy, token) = (self.writer.clone(), self.busy.clone(), token.clone());
        let spawned = std::thread::Builder::new().name("checkpoint".into()).spawn(move || {
            let msg = super::changes::checkpoint(&layers, &token, id);
            busy.store(false, Ordering::SeqCst);
            send_on(&writer, &msg);
        });
        if spawned.is_err() {
            self.busy.store(false, Ordering::SeqCst);
            send_on(&self.writer, &answer("cannot start the checkpoint thread"));
        }
    }
}

fn send_on(writer: &Mutex<File>, msg: &GuestMsg) {
    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
    let _ = write_frame(&mut *w, msg).map_err(std::io::Error::other).and_then(|()| w.flush());
}

/// What the host asks of the running command.
pub enum Event {
    Signal(i32),
    Resize(WindowSize),
}

/// The control connection: frames out from any thread, frames in on a
/// reader thread once the command runs.
pub struct Control {
    writer: Arc<Mutex<File>>,
    reader: Mutex<Option<BufReader<File>>>,
    finish: Mutex<Option<Receiver<()>>>,
    /// The workspace overlay, once the command may be asked for checkpoints.
    layers: Arc<OnceLock<super::mounts::Layers>>,
}

pub fn connect_control() -> anyhow::Result<Control> {
    let stream = super::vsock::connect_as_init(CONTROL_PORT)?;
    let reader = stream.try_clone().context("cannot clone the control socket")?;
    Ok(Control {
        writer: Arc::new(Mutex::new(stream)),
        reader: Mutex::new(Some(BufReader::new(reader))),
        finish: Mutex::new(None),
        layers: Arc::default(),
    })
}

impl Control {
    pub fn send(&self, msg: &GuestMsg) -> anyhow::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *w, msg).context("cannot write to the host")?;
        w.flush().context("cannot write to the host")?;
        Ok(())
    }

    /// Lets the host ask for checkpoints of the workspace overlay.
    pub fn offer_checkpoints(&self, layers: super::mounts::Layers) {
        let _ = self.layers.set(layers);
    }

    /// Reads one message (before the reader thread takes over).
    pub fn recv(&self) -> anyhow::Result<HostMsg> {
        let mut guard = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let reader = guard.as_mut().context("the control reader is already running")?;
        read_frame(reader).context("cannot read from the host")
    }

    /// Hands signals and resizes to `on_event` on a reader thread, and
    /// serves published ports' clients (dialing back with `token`); a Finish
    /// message is kept for `wait_finish`.
    pub fn start_reader(&self, token: Token, on_event: impl Fn(Event) + Send + 'static) -> anyhow::Result<()> {
        let mut reader = self
            .reader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .context("the control reader is already running")?;
        let (tx, rx) = channel();
        *self.finish.lock().unwrap_or_else(|p| p.into_inner()) = Some(rx);
        let checkpoints =
            Checkpoints { layers: self.layers.clone(), writer: self.writer.clone(), busy: Arc::default() };
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                loop {
                    match read_frame::<HostMsg>(&mut reader) {
                        Ok(HostMsg::Signal { signal }) => on_event(Event::Signal(signal)),
                        Ok(HostMsg::Resize(size)) => on_event(Event::Resize(size)),
                        Ok(HostMsg::Finish) => {
                            let _ = tx.send(());
                        }
                        Ok(HostMsg::Connect { id, port }) => super::publish::connect(id, port, token.clone()),
                        Ok(HostMsg::Run(_)) => eprintln!("stockade-init: ignoring a second command"),
                        Ok(HostMsg::Checkpoint { id }) => checkpoints.start(id, &token),
                        Err(_) => {
                            // The host went away: nothing left to wait for.
                            let _ = tx.send(());
                            return;
                        }
                    }
                }
            })
            .context("cannot start the control reader")?;
        Ok(())
    }

    /// A shared writer for the output pumps.
    pub fn writer(&self) -> Arc<Mutex<File>> {
        self.writer.clone()
    }

    /// Waits until the host says it has everything (or a timeout).
    pub fn wait_finish(&self) {
        let rx = self.finish.lock().unwrap_or_else(|p| p.into_inner()).take();
        match rx {
            Some(rx) => {
                let _ = rx.recv_timeout(FINISH_TIMEOUT);
            }
            None => {
                // The reader never started (setup failed): read directly.
                let _ = self.recv();
            }
        }
    }
}
