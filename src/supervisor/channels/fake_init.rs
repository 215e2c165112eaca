//! For tests: a thread playing the init of a running session, answering
//! each checkpoint request with the change set a closure writes, through
//! the real socket, token and gate; and the pieces of an init that talks
//! to the conversation (a heartbeating control connection, the change
//! connection).

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use super::live;
use crate::protocol::auth::{DigestWriter, TOKEN_LEN, Token};
use crate::protocol::change_set::Writer;
use crate::protocol::{CHECKPOINT_PORT, CheckpointOutcome, ExportOutcome, GuestMsg, HostMsg, read_frame, write_frame};

/// What the fake init writes for its `n`-th checkpoint (from 0); `false`
/// ends the init instead of answering.
pub type Export = dyn FnMut(usize, &mut Writer<DigestWriter<UnixStream>>) -> bool + Send;

/// Serves checkpoints for the session directory `dir` (its store must
/// exist) with `export` answering each request; the server and the init's
/// thread.
pub fn serve(dir: &Path, mut export: Box<Export>) -> (live::Server, JoinHandle<()>) {
    let (host, guest) = UnixStream::pair().unwrap();
    let token = Token::from_bytes([7; TOKEN_LEN]);
    let (answered, relayed) = mpsc::sync_channel(4);
    let served = live::Guest {
        writer: Arc::new(Mutex::new(host)),
        token: token.clone(),
        tampering: Default::default(),
        answers: relayed,
        stall: super::staging::EXPORT_STALL,
    };
    let server = live::serve(dir, served).unwrap();
    let socket = crate::protocol::broker::socket_path(&dir.join("v.sock"), CHECKPOINT_PORT);
    let init = std::thread::spawn(move || {
        let mut requests = BufReader::new(guest);
        let mut n = 0;
        while let Ok(HostMsg::Checkpoint { id }) = read_frame(&mut requests) {
            let mut conn = UnixStream::connect(&socket).unwrap();
            token.present(&mut conn).unwrap();
            let mut w = Writer::new(DigestWriter::new(conn)).unwrap();
            if !export(n, &mut w) {
                return;
            }
            n += 1;
            let (out, summary) = w.finish().unwrap();
            let (conn, stream) = out.finish();
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            let outcome = ExportOutcome::Sent {
                entries: summary.entries,
                files: summary.files,
                bytes: summary.bytes,
                skipped: 0,
                stream,
            };
            let _ = answered.send(CheckpointOutcome { id, outcome });
        }
    });
    (server, init)
}

/// The init's control connection, heartbeating from a thread of its own
/// every `every` as the real init does, until the host's end closes.
pub struct Control {
    writer: Arc<Mutex<UnixStream>>,
}

/// A fake init's control connection and the host's end of it.
pub fn control(every: std::time::Duration) -> (Control, UnixStream) {
    let (host, guest) = UnixStream::pair().unwrap();
    let writer = Arc::new(Mutex::new(guest));
    let beating = writer.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(every);
            let mut w = beating.lock().unwrap_or_else(|p| p.into_inner());
            if write_frame(&mut *w, &GuestMsg::Heartbeat).is_err() {
                return;
            }
        }
    });
    (Control { writer }, host)
}

impl Control {
    /// Says `msg` to the host; false once the host's end is gone.
    pub fn send(&self, msg: &GuestMsg) -> bool {
        write_frame(&mut *self.writer.lock().unwrap_or_else(|p| p.into_inner()), msg).is_ok()
    }
}

/// Opens a change connection on `socket` as the init does: the token first.
pub fn connect_changes(socket: &Path, token: &Token) -> UnixStream {
    let mut conn = UnixStream::connect(socket).unwrap();
    token.present(&mut conn).unwrap();
    conn
}
